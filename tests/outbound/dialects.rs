//! The rate-limit fields of public APIs, as their owners document them, served by wiremock to a
//! real `reqwest::Client` behind `Pushback`: after one answer, the pushback holds calls for as
//! long as the answer says, and lets them go when it says nothing is spent.
//!
//! Each case names the page its fields are quoted from. Times that the pages write as instants
//! (Unix times, RFC 3339) are made from now, as a server answering now would write them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::dependency::mount;
use tower::{Layer, ServiceExt};
use tower_bulwark::outbound::Pushback;
use wiremock::matchers::method;
use wiremock::{MockServer, ResponseTemplate};

/// How long the pushback holds calls after one answer of `status` with `headers`.
async fn held_after<N: AsRef<str>>(status: u16, headers: &[(N, String)]) -> Duration {
    let server = MockServer::start().await;
    let mut answer = ResponseTemplate::new(status);
    for (name, value) in headers {
        answer = answer.append_header(name.as_ref(), value.as_str());
    }
    mount(&server, method("GET"), answer).await;
    let pushback = Pushback::new("api");
    let client = pushback.layer().layer(reqwest::Client::new());
    let url = server.uri().parse().unwrap();
    let response = client
        .oneshot(reqwest::Request::new(reqwest::Method::GET, url))
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), status);
    pushback.held_for()
}

/// Seconds since the Unix epoch, `ahead` seconds from now.
fn unix_in(ahead: u64) -> u64 {
    (SystemTime::now() + Duration::from_secs(ahead))
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `held` is `expected`, give or take what whole seconds of `Date` and of an instant lose.
fn assert_about(held: Duration, expected: Duration, case: &str) {
    let (low, high) = (
        expected.saturating_sub(Duration::from_secs(2)),
        expected + Duration::from_secs(1),
    );
    assert!(
        (low..=high).contains(&held),
        "{case}: held for {held:?}, expected about {expected:?}"
    );
}

/// An RFC 3339 time `ahead` seconds from now, in UTC.
fn rfc3339_in(ahead: u64) -> String {
    let unix = i64::try_from(unix_in(ahead)).unwrap();
    crate::dialects_support::rfc3339(unix, "", 0)
}

const S: fn(u64) -> Duration = Duration::from_secs;

/// docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api: the primary limit
/// in `x-ratelimit-remaining` and `x-ratelimit-reset` (a Unix time in seconds); a secondary
/// limit as a 403 or a 429 with `retry-after`, whatever `x-ratelimit-remaining` says.
#[tokio::test]
async fn github_primary_and_secondary_limits() {
    let reset = unix_in(120).to_string();
    let spent = [
        ("x-ratelimit-limit", "5000".to_string()),
        ("x-ratelimit-remaining", "0".to_string()),
        ("x-ratelimit-used", "5000".to_string()),
        ("x-ratelimit-reset", reset.clone()),
    ];
    assert_about(held_after(403, &spent).await, S(120), "primary, 403");
    assert_about(held_after(200, &spent).await, S(120), "primary, 200");
    let secondary = [
        ("retry-after", "60".to_string()),
        ("x-ratelimit-remaining", "4999".to_string()),
        ("x-ratelimit-reset", reset),
    ];
    assert_about(held_after(403, &secondary).await, S(60), "secondary, 403");
    assert_about(held_after(429, &secondary).await, S(60), "secondary, 429");
    // A 403 without rate-limit fields is a refusal of another kind: no hold.
    let forbidden = [("retry-after", "60".to_string())];
    assert_eq!(held_after(403, &forbidden).await, Duration::ZERO);
}

/// platform.openai.com/docs/guides/rate-limits ("Rate limits in headers"): requests and tokens
/// each with `x-ratelimit-remaining-*` and `x-ratelimit-reset-*` (Go durations such as `1s`
/// and `6m0s`), and `retry-after-ms` beside `retry-after` on a 429.
#[tokio::test]
async fn openai_requests_tokens_and_retry_after_ms() {
    let requests_spent = [
        ("x-ratelimit-limit-requests", "60".to_string()),
        ("x-ratelimit-remaining-requests", "0".to_string()),
        ("x-ratelimit-reset-requests", "1s".to_string()),
        ("x-ratelimit-limit-tokens", "150000".to_string()),
        ("x-ratelimit-remaining-tokens", "149984".to_string()),
        ("x-ratelimit-reset-tokens", "6m0s".to_string()),
    ];
    let held = held_after(200, &requests_spent).await;
    assert!(
        held > Duration::from_millis(900) && held <= S(1),
        "{held:?}"
    );
    let tokens_spent = [
        ("x-ratelimit-remaining-requests", "59".to_string()),
        ("x-ratelimit-reset-requests", "1s".to_string()),
        ("x-ratelimit-remaining-tokens", "0".to_string()),
        ("x-ratelimit-reset-tokens", "6m0s".to_string()),
    ];
    assert_about(held_after(429, &tokens_spent).await, S(360), "tokens spent");
    // Tokens left say nothing about calls: 59 requests left, no hold.
    let tokens_left = [
        ("x-ratelimit-remaining-requests", "59".to_string()),
        ("x-ratelimit-reset-requests", "1s".to_string()),
        ("x-ratelimit-remaining-tokens", "149984".to_string()),
        ("x-ratelimit-reset-tokens", "6m0s".to_string()),
    ];
    assert_eq!(held_after(200, &tokens_left).await, Duration::ZERO);
    let precise = [
        ("retry-after", "1".to_string()),
        ("retry-after-ms", "20".to_string()),
    ];
    let held = held_after(429, &precise).await;
    assert!(
        held > Duration::ZERO && held <= Duration::from_millis(20),
        "{held:?}"
    );
}

/// docs.anthropic.com/en/api/rate-limits ("Response headers"): `anthropic-ratelimit-*` for
/// requests, tokens, input tokens and output tokens, each reset an RFC 3339 time.
#[tokio::test]
async fn anthropic_requests_and_each_family_of_tokens() {
    for family in ["requests", "tokens", "input-tokens", "output-tokens"] {
        let mut fields = vec![
            (
                "anthropic-ratelimit-requests-remaining".to_string(),
                "999".to_string(),
            ),
            (
                "anthropic-ratelimit-requests-reset".to_string(),
                rfc3339_in(30),
            ),
        ];
        if family == "requests" {
            fields[0].1 = "0".to_string();
        } else {
            fields.push((
                format!("anthropic-ratelimit-{family}-remaining"),
                "0".to_string(),
            ));
            fields.push((
                format!("anthropic-ratelimit-{family}-reset"),
                rfc3339_in(30),
            ));
        }
        assert_about(held_after(200, &fields).await, S(30), family);
    }
    let left = [
        ("anthropic-ratelimit-requests-remaining", "999".to_string()),
        ("anthropic-ratelimit-requests-reset", rfc3339_in(30)),
        ("anthropic-ratelimit-tokens-remaining", "96000".to_string()),
        ("anthropic-ratelimit-tokens-reset", rfc3339_in(30)),
    ];
    assert_eq!(held_after(200, &left).await, Duration::ZERO);
}

/// discord.com/developers/docs/topics/rate-limits ("Header Format"): `X-RateLimit-Reset` a
/// Unix time with a fraction, `X-RateLimit-Reset-After` decimal seconds from now, which counts.
#[tokio::test]
async fn discord_fractional_resets() {
    let fields = [
        ("x-ratelimit-limit", "5".to_string()),
        ("x-ratelimit-remaining", "0".to_string()),
        ("x-ratelimit-reset", format!("{}.123", unix_in(64))),
        ("x-ratelimit-reset-after", "64.57".to_string()),
        ("x-ratelimit-bucket", "abcd1234".to_string()),
    ];
    let held = held_after(200, &fields).await;
    assert!(
        held > Duration::from_millis(64_000) && held <= Duration::from_millis(64_570),
        "{held:?}"
    );
    let reset_only = [
        ("x-ratelimit-remaining", "0".to_string()),
        ("x-ratelimit-reset", format!("{}.123", unix_in(64))),
    ];
    assert_about(held_after(200, &reset_only).await, S(65), "reset only");
}

/// shopify.dev/docs/api/usage/rate-limits: a 429 with `Retry-After: 2.0`.
#[tokio::test]
async fn shopify_decimal_retry_after() {
    let held = held_after(429, &[("retry-after", "2.0".to_string())]).await;
    assert!(
        held > Duration::from_millis(1_900) && held <= S(2),
        "{held:?}"
    );
}

/// Resets written as durations, and as Unix times in milliseconds, told apart from seconds by
/// their magnitude.
#[tokio::test]
async fn x_ratelimit_resets_as_durations_and_milliseconds() {
    let duration = [
        ("x-ratelimit-remaining", "0".to_string()),
        ("x-ratelimit-reset", "1s".to_string()),
    ];
    let held = held_after(200, &duration).await;
    assert!(
        held > Duration::from_millis(900) && held <= S(1),
        "{held:?}"
    );
    let millis = [
        ("x-ratelimit-remaining", "0".to_string()),
        ("x-ratelimit-reset", format!("{}000", unix_in(90))),
    ];
    assert_about(held_after(200, &millis).await, S(90), "milliseconds");
}

/// docs.gitlab.com/ee/administration/settings/user_and_ip_rate_limits.html ("Response
/// headers"): `RateLimit-Remaining` and `RateLimit-Reset`, a Unix time, as drafts before -07
/// named them.
#[tokio::test]
async fn gitlab_ratelimit_fields() {
    let fields = [
        ("ratelimit-limit", "60".to_string()),
        ("ratelimit-observed", "67".to_string()),
        ("ratelimit-remaining", "0".to_string()),
        ("ratelimit-reset", unix_in(45).to_string()),
        ("retry-after", "45".to_string()),
    ];
    assert_about(held_after(429, &fields).await, S(45), "429");
    assert_about(
        held_after(200, &fields[..4]).await,
        S(45),
        "200 with the quota spent",
    );
}

/// A dialect of the user's (`PushbackBuilder::dialect`) counts beside the built-in ones: its
/// spent quota holds calls, its span is capped at `max_hold`, and of its quota and a built-in
/// one the more restrictive counts.
#[test]
fn a_dialect_of_the_users_own_counts_beside_the_built_in_ones() {
    use tower_bulwark::clock::ManualClock;

    let partner = |max_hold: Duration| {
        Pushback::builder("partner")
            .clock(ManualClock::new())
            .max_hold(max_hold)
            .dialect(|headers| {
                let value = headers.get("x-partner-quota")?.to_str().ok()?;
                let (left, seconds) = value.split_once('/')?;
                Some((left.parse().ok()?, S(seconds.parse().ok()?)))
            })
            .build()
    };
    let answer = |fields: &[(&str, &str)]| {
        let mut response = http::Response::builder();
        for (name, value) in fields {
            response = response.header(*name, *value);
        }
        response.body(()).unwrap()
    };
    let pushback = partner(S(600));
    pushback.observe(&answer(&[("x-partner-quota", "0/30")]));
    assert_eq!(pushback.held_for(), S(30));
    let pushback = partner(S(60));
    pushback.observe(&answer(&[("x-partner-quota", "0/86400")]));
    assert_eq!(pushback.held_for(), S(60), "capped at max_hold");
    let pushback = partner(S(600));
    pushback.observe(&answer(&[
        ("x-partner-quota", "5/30"),
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-reset", "40"),
    ]));
    assert_eq!(pushback.held_for(), S(40), "the built-in quota binds");
    let pushback = partner(S(600));
    pushback.observe(&answer(&[("x-partner-quota", "not/ours")]));
    assert_eq!(
        pushback.held_for(),
        Duration::ZERO,
        "the reader found nothing"
    );
}

/// A 429 with `Retry-After: 5` beside a quota that is spent for a minute, in each family: where
/// the family's owner gives Retry-After precedence (draft-11's "Client Behavior": it "MUST take
/// precedence and the reset keyword MAY be ignored"; OpenAI and Anthropic, whose resets say when
/// a limit is whole again), calls wait 5 s; for `X-RateLimit-*` (GitHub: a spent primary limit
/// outlasts a secondary limit's Retry-After) the later of the two, 60 s, also beside a family
/// that yields and whose own reset is later still. In each case the refusal of a call says the
/// same time as `held_for`, and a call then goes.
#[tokio::test]
async fn retry_after_takes_precedence_where_the_family_says_so() {
    use tower_bulwark::clock::ManualClock;
    use tower_bulwark::outbound::{self, PushedBack};

    // A family's name, its fields, and the seconds calls wait.
    type Case = (&'static str, Vec<(&'static str, String)>, u64);
    let in_60s = rfc3339_in(60);
    let in_120s = rfc3339_in(120);
    let cases: [Case; 7] = [
        (
            "draft-11",
            vec![("ratelimit", r#""default";r=0;t=60"#.into())],
            5,
        ),
        (
            "GitHub",
            vec![
                ("x-ratelimit-remaining", "0".into()),
                ("x-ratelimit-reset", unix_in(60).to_string()),
            ],
            60,
        ),
        (
            "OpenAI",
            vec![
                ("x-ratelimit-remaining-requests", "0".into()),
                ("x-ratelimit-reset-requests", "1m0s".into()),
            ],
            5,
        ),
        (
            "Anthropic",
            vec![
                ("anthropic-ratelimit-requests-remaining", "0".into()),
                ("anthropic-ratelimit-requests-reset", in_60s.clone()),
            ],
            5,
        ),
        // Two families in one answer: the one that does not yield keeps its later reset,
        // whatever the one that yields says beyond it.
        (
            "draft-11 and X-RateLimit",
            vec![
                ("ratelimit", r#""p";r=0;t=120"#.into()),
                ("x-ratelimit-remaining", "0".into()),
                ("x-ratelimit-reset-after", "60".into()),
            ],
            60,
        ),
        (
            "OpenAI and GitHub",
            vec![
                ("x-ratelimit-remaining-requests", "0".into()),
                ("x-ratelimit-reset-requests", "2m0s".into()),
                ("x-ratelimit-remaining", "0".into()),
                ("x-ratelimit-reset", unix_in(60).to_string()),
            ],
            60,
        ),
        (
            "Anthropic and GitLab",
            vec![
                ("anthropic-ratelimit-requests-remaining", "0".into()),
                ("anthropic-ratelimit-requests-reset", in_120s.clone()),
                ("ratelimit-remaining", "0".into()),
                ("ratelimit-reset", unix_in(60).to_string()),
            ],
            60,
        ),
    ];
    for (family, fields, wait) in cases {
        let clock = ManualClock::new();
        let pushback = Pushback::builder("api").clock(clock.clone()).build();
        let mut answer = http::Response::builder()
            .status(429)
            .header("retry-after", "5");
        for (name, value) in &fields {
            answer = answer.header(*name, value.as_str());
        }
        pushback.observe(&answer.body(()).unwrap());
        let held = pushback.held_for();
        let client = pushback.layer().layer(tower::service_fn(|()| async {
            Ok::<_, tower_bulwark::BoxError>(http::Response::new(()))
        }));
        let refused = client.clone().oneshot(()).await.unwrap_err();
        assert!(refused.is::<PushedBack>(), "{family}");
        assert_eq!(
            outbound::retry_after(&*refused),
            Some(held),
            "{family}: the refusal says held_for"
        );
        // Instants written to the second may lose up to a second.
        assert_about(held, S(wait), family);
        clock.advance(held);
        client.oneshot(()).await.unwrap();
    }
}
