//! Pushbacks and client quotas from a TOML file: what parses, what is refused (always naming the
//! path of the bad value), what the registry builds from them, and what a reload does to them.

#[cfg(feature = "redis")]
use crate::common::redis_server;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Response, StatusCode};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_bulwark::config::{Registry, Reloaded};
/// The pushback's default `max_hold`, as `PushbackBuilder::max_hold`'s docs say: ten minutes.
const DEFAULT_MAX_HOLD: std::time::Duration = std::time::Duration::from_secs(600);
use tower_bulwark::outbound::{self, PushedBack, QuotaExhausted};
use tower_bulwark::{BoxError, Quota};

/// A partner allowing 3 calls per hour to the whole service, a pushback that waits up to 2 s
/// for a hold, and the client quota that applies the first to the calls.
const PARTNER: &str = r#"
[rate_limiters.partner-quota]
limit_for_period = 3
limit_refresh_period = "1h"
key = "global"

[pushbacks.partner]
max_wait = "2s"
max_hold = "5m"
pacing = "spread"

[pushbacks.defaults]

[client_quotas.partner]
limiter = "partner-quota"

[client_quotas.partner-bulk]
limiter = "partner-quota"
cost = 2
"#;

/// The outbound instances the file names, each with its name; their settings are checked where
/// they are parsed (`config::tests` in the library) and by what the layers do below.
#[test]
fn the_sections_parse_with_their_defaults() {
    let registry = Registry::from_toml_str(PARTNER).unwrap();
    for name in ["partner", "defaults"] {
        let pushback = registry.pushback(name).unwrap();
        assert_eq!(
            (pushback.name(), pushback.held_for()),
            (name, Duration::ZERO)
        );
    }
    for name in ["partner", "partner-bulk"] {
        assert!(registry.client_quota_layer(name).is_ok(), "{name}");
    }
    let until_spent = "[pushbacks.p]\npacing = \"until_spent\"\n";
    assert!(Registry::from_toml_str(until_spent)
        .unwrap()
        .pushback("p")
        .is_ok());
}

/// The limiter the client quotas below name.
const LIMITER: &str =
    "[rate_limiters.lim]\nlimit_for_period = 4\nlimit_refresh_period = \"1s\"\nkey = \"global\"\n";

#[test]
fn every_bad_value_is_an_error_naming_its_path() {
    let cases: &[(&str, &str, &str)] = &[
        // Pushbacks.
        ("[pushbacks.p]\nmax_wait = 5\n", "pushbacks.p.max_wait", "no unit"),
        ("[pushbacks.p]\nmax_wait = \"5\"\n", "pushbacks.p.max_wait", "no unit"),
        ("[pushbacks.p]\nmax_wait = \"-1s\"\n", "pushbacks.p.max_wait", "not a duration"),
        ("[pushbacks.p]\nmax_wait = \"0.5ns\"\n", "pushbacks.p.max_wait", "nanoseconds"),
        ("[pushbacks.p]\nmax_wait = \"100000d\"\n", "pushbacks.p.max_wait", "too long"),
        ("[pushbacks.p]\nmax_wait = \"99999999999999999999999d\"\n", "pushbacks.p.max_wait", "too long"),
        ("[pushbacks.p]\nmax_wait = true\n", "pushbacks.p.max_wait", "duration string"),
        ("[pushbacks.p]\nmax_hold = \"0s\"\n", "pushbacks.p.max_hold", "more than zero"),
        ("[pushbacks.p]\nmax_hold = \"50000d\"\n", "pushbacks.p.max_hold", "too long"),
        ("[pushbacks.p]\nmax_hold = 600\n", "pushbacks.p.max_hold", "no unit"),
        ("[pushbacks.p]\npacing = \"fast\"\n", "pushbacks.p.pacing", "expected `until_spent` or `spread`"),
        ("[pushbacks.p]\npacing = 1\n", "pushbacks.p.pacing", "integer `1`, expected a string"),
        ("[pushbacks.p]\nretry = true\n", "pushbacks.p.retry", "`max_wait`, `max_hold`, `pacing`"),
        ("[pushbacks]\np = 3\n", "pushbacks.p", "table of settings"),
        ("pushbacks = 3\n", "pushbacks", "table of named instances"),
        // Client quotas.
        ("[client_quotas.q]\ncost = 1\n", "client_quotas.q.limiter", "is required"),
        ("[client_quotas.q]\nlimiter = 5\n", "client_quotas.q.limiter", "integer `5`, expected a string"),
        ("[client_quotas.q]\nlimiter = \"nope\"\n", "client_quotas.q.limiter", "`nope`, which is not under `rate_limiters`"),
        ("[client_quotas.q]\nlimiter = \"lim\"\ncost = 0\n", "client_quotas.q.cost", "at least 1"),
        ("[client_quotas.q]\nlimiter = \"lim\"\ncost = -3\n", "client_quotas.q.cost", "at least 1"),
        ("[client_quotas.q]\nlimiter = \"lim\"\ncost = 4294967296\n", "client_quotas.q.cost", "at most 4294967295"),
        ("[client_quotas.q]\nlimiter = \"lim\"\ncost = \"1\"\n", "client_quotas.q.cost", "string \"1\", expected an integer"),
        ("[client_quotas.q]\nlimiter = \"lim\"\ncost = 5\n", "client_quotas.q.cost", "more than the burst of rate limiter `lim` (4)"),
        // One name per idea: a route's policy names its rate limiter `limiter`, so does this.
        ("[client_quotas.q]\nrate_limiter = \"lim\"\n", "client_quotas.q.rate_limiter", "expected `limiter` or `cost`"),
        ("[client_quotas]\nq = \"lim\"\n", "client_quotas.q", "table of settings"),
        // Outbound calls have no peer to key by.
        (
            "[rate_limiters.ip]\nlimit_for_period = 4\nlimit_refresh_period = \"1s\"\n[client_quotas.q]\nlimiter = \"ip\"\n",
            "client_quotas.q.limiter",
            "key = \"global\"",
        ),
        (
            "[rate_limiters.hdr]\nlimit_for_period = 4\nlimit_refresh_period = \"1s\"\nkey = \"header:x-api-key\"\n[client_quotas.q]\nlimiter = \"hdr\"\n",
            "client_quotas.q.limiter",
            "whose key is not \"global\"",
        ),
        ("[outbound.q]\nlimiter = \"lim\"\n", "outbound", "unknown field `outbound`"),
    ];
    for (body, path, fragment) in cases {
        // Top-level keys come before the first table.
        let text = if body.starts_with('[') {
            format!("{LIMITER}{body}")
        } else {
            format!("{body}{LIMITER}")
        };
        let err = Registry::from_toml_str(&text).expect_err(&text);
        assert_eq!(err.path(), *path, "{text}\n{err}");
        assert!(err.message().contains(fragment), "{text}\n{err}");
        assert!(err.to_string().contains(path), "{err}");
    }
}

#[test]
fn durations_at_the_bound_are_accepted() {
    // 2^60 ns, `Quota::MAX_SPAN`, is the longest; one nanosecond more is refused.
    let max = Quota::MAX_SPAN.as_nanos();
    let ok = format!("[pushbacks.p]\nmax_wait = \"{max}ns\"\nmax_hold = \"{max}ns\"\n");
    // An unbounded setting builds and serves (no overflow in a deadline or a timer).
    let registry = Registry::from_toml_str(&ok).unwrap();
    assert_eq!(registry.pushback("p").unwrap().held_for(), Duration::ZERO);
    let over = format!("[pushbacks.p]\nmax_hold = \"{}ns\"\n", max + 1);
    let err = Registry::from_toml_str(&over).unwrap_err();
    assert_eq!(err.path(), "pushbacks.p.max_hold");
}

/// `s` as a TOML basic string, any character escaped as TOML requires.
fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

mod hostile {
    use proptest::prelude::*;
    use tower_bulwark::limiter::Limiter;

    use super::*;

    fn hostile_text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            proptest::collection::vec(
                prop_oneof![
                    Just("."),
                    Just("0"),
                    Just("1"),
                    Just("9"),
                    Just("ms"),
                    Just("s"),
                    Just("d"),
                    Just(" "),
                    Just("-"),
                    Just("\u{0}"),
                    Just("\""),
                    Just("."),
                    Just("99999999999999999999"),
                ],
                0..10,
            )
            .prop_map(|parts| parts.concat()),
        ]
    }

    /// What a rate limiter's `max_wait` reads `text` as, or `None` where it refuses it: the
    /// oracle of the pushback's durations, which the file reads and bounds the same way.
    fn as_max_wait(text: &str) -> Option<Duration> {
        let file = format!(
            "[rate_limiters.l]\nlimit_for_period = 1\nlimit_refresh_period = \"1s\"\n\
             max_wait = {}\n",
            toml_str(text)
        );
        let registry = Registry::from_toml_str(&file).ok()?;
        Some(registry.rate_limiter("l").ok()?.quota().max_wait())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1_000))]

        /// A pushback with any name and any text for its durations and pacing is built, or
        /// refused with an error naming exactly the field at fault: never a panic. A duration
        /// is accepted exactly when it parses and fits the bound.
        #[test]
        fn any_pushback_is_built_or_refused_by_path(
            name in any::<String>(),
            field in 0..3usize,
            value in hostile_text(),
        ) {
            let field = ["max_wait", "max_hold", "pacing"][field];
            let text = format!("[pushbacks.{}]\n{field} = {}\n", toml_str(&name), toml_str(&value));
            match Registry::from_toml_str(&text) {
                Ok(registry) => {
                    prop_assert!(registry.pushback(&name).is_ok());
                    prop_assert_eq!(registry.health().pushbacks[0].holding, false);
                }
                Err(err) => {
                    prop_assert_eq!(err.path(), format!("pushbacks.{name}.{field}"));
                    prop_assert!(!err.message().is_empty());
                    // The field's line, at its value (after `field = `).
                    prop_assert_eq!(err.position(), Some((2, field.len() + 4)));
                }
            }
            if field != "pacing" {
                let fits = as_max_wait(&value)
                    .is_some_and(|d| !(field == "max_hold" && d.is_zero()));
                prop_assert_eq!(Registry::from_toml_str(&text).is_ok(), fits, "{}", text);
            }
        }

        /// A client quota with any name naming any limiter: built when it names the one
        /// configured, otherwise refused at its `limiter` field.
        #[test]
        fn any_client_quota_is_built_or_refused_by_path(
            name in any::<String>(),
            limiter in prop_oneof![Just("lim".to_owned()), any::<String>()],
            cost in any::<i64>(),
        ) {
            let text = format!(
                "{LIMITER}[client_quotas.{}]\nlimiter = {}\ncost = {cost}\n",
                toml_str(&name),
                toml_str(&limiter),
            );
            match Registry::from_toml_str(&text) {
                Ok(registry) => {
                    prop_assert_eq!(limiter.as_str(), "lim");
                    prop_assert!((1..=4).contains(&cost));
                    prop_assert!(registry.client_quota_layer(&name).is_ok());
                }
                Err(err) => {
                    let path = if (1..=4).contains(&cost) || limiter != "lim" {
                        format!("client_quotas.{name}.limiter")
                    } else {
                        format!("client_quotas.{name}.cost")
                    };
                    // A bad cost is found while the section is read, before the limiter is
                    // looked up.
                    let path = if !(1..=i64::from(u32::MAX)).contains(&cost) {
                        format!("client_quotas.{name}.cost")
                    } else {
                        path
                    };
                    prop_assert_eq!(err.path(), path);
                }
            }
        }
    }
}

/// A service counting its calls and answering `200`.
fn counted(
    calls: &Arc<AtomicUsize>,
) -> impl Service<(), Response = Response<()>, Error = BoxError, Future: Send> + Clone {
    let calls = Arc::clone(calls);
    service_fn(move |()| {
        calls.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, BoxError>(Response::new(())) }
    })
}

#[tokio::test]
async fn a_configured_client_quota_is_one_quota_for_every_layer_and_clone() {
    let registry = Registry::from_toml_str(PARTNER).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    // Two layers taken separately, one of them cloned: all draw on `partner-quota`.
    let a = registry
        .client_quota_layer("partner")
        .unwrap()
        .layer(counted(&calls));
    let b = registry
        .client_quota_layer("partner")
        .unwrap()
        .layer(counted(&calls));
    let a2 = a.clone();
    a.oneshot(()).await.unwrap();
    b.clone().oneshot(()).await.unwrap();
    a2.clone().oneshot(()).await.unwrap();
    let err = b.oneshot(()).await.unwrap_err();
    let exhausted = err
        .downcast_ref::<QuotaExhausted>()
        .expect("QuotaExhausted");
    assert_eq!(exhausted.quota(), "partner");
    // The next permit of 3 per hour comes in 20 minutes.
    let wait = outbound::retry_after(&*err).unwrap();
    assert!(
        wait > Duration::from_secs(19 * 60) && wait <= Duration::from_secs(20 * 60),
        "{wait:?}"
    );
    assert!(a2.oneshot(()).await.unwrap_err().is::<QuotaExhausted>());
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // The rate limiter counted the decisions under its own name.
    let snapshot = registry.rate_limiter("partner-quota").unwrap().snapshot();
    assert_eq!((snapshot.allowed, snapshot.limited), (3, 2));
}

#[tokio::test]
async fn a_configured_cost_takes_that_many_permits() {
    let registry = Registry::from_toml_str(PARTNER).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let bulk = registry
        .client_quota_layer("partner-bulk")
        .unwrap()
        .layer(counted(&calls));
    let single = registry
        .client_quota_layer("partner")
        .unwrap()
        .layer(counted(&calls));
    bulk.clone().oneshot(()).await.unwrap();
    // 2 of 3 are spent: a bulk call is refused, a single call fits.
    assert!(bulk.oneshot(()).await.unwrap_err().is::<QuotaExhausted>());
    single.clone().oneshot(()).await.unwrap();
    assert!(single.oneshot(()).await.unwrap_err().is::<QuotaExhausted>());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn unknown_names_are_errors_naming_the_kind() {
    let registry = Registry::from_toml_str(PARTNER).unwrap();
    let err = registry.pushback("nope").unwrap_err();
    assert_eq!(err.to_string(), "no pushback named `nope` is configured");
    assert!(registry.pushback("partner-quota").is_err());
    let err = registry.client_quota_layer("partner-quota").unwrap_err();
    assert_eq!(
        err.to_string(),
        "no client quota named `partner-quota` is configured"
    );
    assert_eq!(err.name(), "partner-quota");
    assert_eq!(registry.pushback("partner").unwrap().name(), "partner");
}

/// Every client quota names a rate limiter the file has: without it, the first to name it is
/// refused, where it names it.
#[test]
fn a_file_without_the_client_quota_s_limiter_is_refused() {
    let without = PARTNER.replace(
        "[rate_limiters.partner-quota]\nlimit_for_period = 3\nlimit_refresh_period = \"1h\"\nkey = \"global\"\n",
        "",
    );
    let err = Registry::from_toml_str(&without).unwrap_err();
    assert_eq!(err.path(), "client_quotas.partner.limiter");
    assert_eq!(err.position(), Some((11, 11)), "{err}");
}

/// The whole outbound stack from the file, around a `reqwest::Client` and a partner on
/// 127.0.0.1 that answers `429` with `Retry-After: 30`.
#[cfg(feature = "reqwest")]
#[tokio::test]
async fn a_registry_stack_around_reqwest_obeys_the_partner_and_keeps_its_quota() {
    use crate::common::dependency::{answering, configured_client};
    use wiremock::ResponseTemplate;

    let server = answering([(
        "/",
        ResponseTemplate::new(429).insert_header("retry-after", "30"),
    )])
    .await;
    let registry = Registry::from_toml_str(PARTNER).unwrap();
    let client = configured_client(&registry, "partner");
    let get = || reqwest::Request::new(reqwest::Method::GET, server.uri().parse().unwrap());

    let response = client.clone().oneshot(get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);

    // Held for 30 s, beyond `max_wait = "2s"`: refused at once, by the pushback, before the
    // quota, so no permit is spent and the partner sees nothing.
    let err = client.clone().oneshot(get()).await.unwrap_err();
    assert!(err.is::<PushedBack>(), "{err}");
    let wait = outbound::retry_after(&*err).unwrap();
    assert!(wait > Duration::from_secs(28) && wait <= Duration::from_secs(30));
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
    let snapshot = registry.rate_limiter("partner-quota").unwrap().snapshot();
    assert_eq!(snapshot.allowed, 1);

    // The health report shows the hold, still `UP`.
    let health = registry.health();
    let partner = health
        .pushbacks
        .iter()
        .find(|p| p.name == "partner")
        .unwrap();
    assert!(partner.holding);
    let json: serde_json::Value = serde_json::from_str(&health.to_json()).unwrap();
    assert_eq!(json["status"], "UP");
    assert_eq!(json["pushbacks"]["partner"]["status"], "UP");
    assert_eq!(json["pushbacks"]["partner"]["holding"], true);
    let millis = json["pushbacks"]["partner"]["heldForMillis"]
        .as_u64()
        .unwrap();
    assert!((28_000..=30_000).contains(&millis), "{millis}");
    assert_eq!(json["pushbacks"]["defaults"]["holding"], false);
    assert_eq!(json["pushbacks"]["defaults"]["heldForMillis"], 0);
}

/// `max_wait` and `max_hold` from the file reach the pushback: a hold within `max_wait` is
/// waited out, and a `Retry-After` longer than `max_hold` is cut to it.
#[tokio::test]
async fn configured_max_wait_and_max_hold_apply() {
    let registry = Registry::from_toml_str(
        "[pushbacks.short]\nmax_wait = \"3s\"\nmax_hold = \"1s\"\n[pushbacks.long]\n",
    )
    .unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let dependency = {
        let answered = Arc::clone(&answered);
        service_fn(move |()| {
            let n = answered.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut response = Response::builder();
                if n == 0 {
                    // An hour, cut to `max_hold`.
                    response = response.status(429).header("retry-after", "3600");
                }
                Ok::<_, BoxError>(response.body(())?)
            }
        })
    };
    let client = registry
        .pushback("short")
        .unwrap()
        .layer()
        .layer(dependency.clone());
    client.clone().oneshot(()).await.unwrap();
    let held = registry.pushback("short").unwrap().held_for();
    assert!(
        held <= Duration::from_secs(1) && held > Duration::ZERO,
        "{held:?}"
    );
    let start = Instant::now();
    let response = client.oneshot(()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(start.elapsed() <= Duration::from_millis(1500));
    assert_eq!(answered.load(Ordering::SeqCst), 2);

    // The default `max_hold` (ten minutes) keeps the hour at ten minutes; `max_wait` zero
    // refuses at once.
    answered.store(0, Ordering::SeqCst);
    let long = registry.pushback("long").unwrap().layer().layer(dependency);
    long.clone().oneshot(()).await.unwrap();
    let held = registry.pushback("long").unwrap().held_for();
    assert!(held > Duration::from_secs(599) && held <= DEFAULT_MAX_HOLD);
    assert!(long.oneshot(()).await.unwrap_err().is::<PushedBack>());
}

/// Two instances of a service, each with its registry, draw on one partner quota kept in Redis;
/// a reload of one changes the quota it sends with its calls.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_client_quota_on_a_redis_limiter_is_one_quota_across_instances() {
    let Some(server) = redis_server::RedisServer::start("client_quota_on_redis") else {
        return;
    };
    let config = format!(
        r#"
        [rate_limiters.partner-quota]
        limit_for_period = 3
        limit_refresh_period = "1h"
        algorithm = "fixed_window"
        key = "global"
        store = "redis"
        redis_url = "{}"
        redis_fail_mode = "closed"

        [client_quotas.partner]
        limiter = "partner-quota"
        "#,
        server.url()
    );
    let one = Registry::from_toml_str(&config).unwrap();
    let two = Registry::from_toml_str(&config).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let a = one
        .client_quota_layer("partner")
        .unwrap()
        .layer(counted(&calls));
    let b = two
        .client_quota_layer("partner")
        .unwrap()
        .layer(counted(&calls));
    let mut refused = 0;
    for i in 0..6 {
        let client = if i % 2 == 0 { a.clone() } else { b.clone() };
        match client.oneshot(()).await {
            Ok(_) => {}
            Err(err) if err.is::<QuotaExhausted>() => refused += 1,
            Err(err) => panic!("{err}"),
        }
    }
    assert_eq!((calls.load(Ordering::SeqCst), refused), (3, 3));
    // Instance one reloads a quota of 5: its calls carry it, and find 3 of 5 used.
    one.reload_toml_str(&config.replace("limit_for_period = 3", "limit_for_period = 5"))
        .unwrap();
    a.clone().oneshot(()).await.unwrap();
    a.clone().oneshot(()).await.unwrap();
    assert!(a.oneshot(()).await.unwrap_err().is::<QuotaExhausted>());
    assert_eq!(calls.load(Ordering::SeqCst), 5);
}

mod reload {
    use super::*;

    /// A fixed window, whose state is a count: what was used stays used under a new quota.
    const BEFORE: &str = r#"
[rate_limiters.partner-quota]
limit_for_period = 2
limit_refresh_period = "1h"
algorithm = "fixed_window"
key = "global"

[pushbacks.partner]
max_wait = "0s"

[client_quotas.partner]
limiter = "partner-quota"
"#;

    #[tokio::test]
    async fn the_quota_under_a_client_quota_changes_in_place() {
        let registry = Registry::from_toml_str(BEFORE).unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let client = registry
            .client_quota_layer("partner")
            .unwrap()
            .layer(counted(&calls));
        client.clone().oneshot(()).await.unwrap();
        client.clone().oneshot(()).await.unwrap();
        assert!(crate::common::refusal(&client, ())
            .await
            .is::<QuotaExhausted>());

        let reloaded = registry
            .reload_toml_str(&BEFORE.replace("limit_for_period = 2", "limit_for_period = 4"))
            .unwrap();
        assert_eq!(reloaded.rate_limiters, vec!["partner-quota".to_owned()]);
        // The layer built before the reload sees the new quota, and its key kept its state:
        // 2 of 4 used, 2 left.
        client.clone().oneshot(()).await.unwrap();
        client.clone().oneshot(()).await.unwrap();
        assert!(client.oneshot(()).await.unwrap_err().is::<QuotaExhausted>());
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn an_unchanged_file_changes_nothing() {
        let registry = Registry::from_toml_str(BEFORE).unwrap();
        assert_eq!(
            registry.reload_toml_str(BEFORE).unwrap(),
            Reloaded::default()
        );
    }

    #[tokio::test]
    async fn a_changed_pushback_or_client_quota_is_refused_whole() {
        let cases = [
            (
                BEFORE.replace("max_wait = \"0s\"", "max_wait = \"1s\""),
                "pushbacks.partner.max_wait",
            ),
            (
                BEFORE.replace("max_wait = \"0s\"", "max_wait = \"0s\"\nmax_hold = \"1m\""),
                "pushbacks.partner.max_hold",
            ),
            (
                BEFORE.replace("max_wait = \"0s\"", "max_wait = \"0s\"\npacing = \"spread\""),
                "pushbacks.partner.pacing",
            ),
            (
                BEFORE.replace("limiter = \"partner-quota\"", "limiter = \"partner-quota\"\ncost = 2"),
                "client_quotas.partner.cost",
            ),
            (
                format!(
                    "{BEFORE}[rate_limiters.other]\nlimit_for_period = 2\nlimit_refresh_period = \"1h\"\nkey = \"global\"\n"
                )
                .replace("limiter = \"partner-quota\"", "limiter = \"other\""),
                // The new limiter is refused first: instances cannot be added.
                "rate_limiters.other",
            ),
            (
                BEFORE.replace("[pushbacks.partner]", "[pushbacks.partner2]"),
                "pushbacks.partner2",
            ),
            (
                BEFORE.replace("[pushbacks.partner]\nmax_wait = \"0s\"\n", ""),
                "pushbacks.partner",
            ),
            (
                BEFORE.replace("[client_quotas.partner]\nlimiter = \"partner-quota\"\n", ""),
                "client_quotas.partner",
            ),
            (
                format!("{BEFORE}[client_quotas.second]\nlimiter = \"partner-quota\"\n"),
                "client_quotas.second",
            ),
        ];
        for (text, path) in cases {
            let registry = Registry::from_toml_str(BEFORE).unwrap();
            // Each refused file also changes the quota: refused whole, it changes nothing.
            let text = text.replace("limit_for_period = 2", "limit_for_period = 3");
            let err = registry.reload_toml_str(&text).unwrap_err();
            assert_eq!(err.path(), path, "{text}\n{err}");
            let calls = Arc::new(AtomicUsize::new(0));
            let client = registry
                .client_quota_layer("partner")
                .unwrap()
                .layer(counted(&calls));
            for _ in 0..2 {
                client.clone().oneshot(()).await.unwrap();
            }
            assert!(client.oneshot(()).await.unwrap_err().is::<QuotaExhausted>());
        }
    }

    #[test]
    fn a_limiter_under_a_client_quota_cannot_change_its_key() {
        let registry = Registry::from_toml_str(BEFORE).unwrap();
        // Not "global" any more: refused when the file is read, before any reload logic.
        let err = registry
            .reload_toml_str(&BEFORE.replace("key = \"global\"", "key = \"header:x-k\""))
            .unwrap_err();
        assert_eq!(err.path(), "client_quotas.partner.limiter");
    }
}
