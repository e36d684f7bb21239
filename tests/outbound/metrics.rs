//! The metrics of the outbound layers, from real calls: a pushback's calls by outcome, the
//! answers that asked it to hold and why, and the time it holds for; a client quota's calls by
//! outcome. Layers built by hand and from a config file record the same series.

use crate::common::recorded::{counter, gauge, on_own_recorder, runtime, series, Series};
use crate::common::{tokio_direct, waits_up_to};
use crate::counting;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Response, StatusCode};

use tower::{service_fn, Layer, Service, ServiceExt};
use tower_bulwark::clock::{ManualClock, TokioClock};
use tower_bulwark::outbound::{ClientQuotaLayer, Pushback, PushedBack, QuotaExhausted};
use tower_bulwark::{limiter::InsufficientCapacity, BoxError, DirectRateLimiter, Quota};

/// A pushback's calls with `outcome`.
fn pushback_calls(all: &Series, name: &str, outcome: &str) -> u64 {
    counter(
        all,
        "bulwark_pushback_calls_total",
        &[("name", name), ("outcome", outcome)],
    )
}

fn pushback_holds(all: &Series, name: &str, reason: &str) -> u64 {
    counter(
        all,
        "bulwark_pushback_holds_total",
        &[("name", name), ("reason", reason)],
    )
}

fn quota_calls(all: &Series, name: &str, outcome: &str) -> u64 {
    counter(
        all,
        "bulwark_client_quota_calls_total",
        &[("name", name), ("outcome", outcome)],
    )
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

/// A dependency that answers each call with the next of `answers` (then `200`), built from
/// (status, headers).
fn scripted(
    answers: Vec<(u16, Vec<(&'static str, &'static str)>)>,
) -> impl Service<(), Response = Response<()>, Error = BoxError, Future: Send> + Clone {
    let answers = Arc::new(Mutex::new(answers.into_iter()));
    service_fn(move |()| {
        let next = answers.lock().unwrap().next();
        async move {
            let (status, headers) = next.unwrap_or((200, Vec::new()));
            let mut response = Response::builder().status(status);
            for (name, value) in headers {
                response = response.header(name, value);
            }
            Ok::<_, BoxError>(response.body(())?)
        }
    })
}

/// A spent quota counts under the fields that advertised it, not under whichever field the
/// answer happens to carry: calls left in `RateLimit` and none in `X-RateLimit-Remaining` is an
/// `x_ratelimit` hold; nothing left in both, one hold under each (each quota holds calls).
#[test]
fn a_spent_quota_counts_under_the_fields_that_advertised_it() {
    on_own_recorder(&runtime(), |snapshotter| async move {
        let partner = Pushback::builder("partner")
            .clock(ManualClock::new())
            .build();
        let answer = |ratelimit: &str| {
            Response::builder()
                .header("ratelimit", ratelimit)
                .header("x-ratelimit-remaining", "0")
                .header("x-ratelimit-reset", "10")
                .body(())
                .unwrap()
        };
        partner.observe(&answer(r#""default";r=5;t=10"#));
        let all = series(&snapshotter);
        assert_eq!(pushback_holds(&all, "partner", "x_ratelimit"), 1);
        assert_eq!(pushback_holds(&all, "partner", "openai"), 0);
        assert_eq!(pushback_holds(&all, "partner", "anthropic"), 0);
        assert_eq!(pushback_holds(&all, "partner", "custom"), 0);
        assert_eq!(pushback_holds(&all, "partner", "ratelimit"), 0);
        partner.observe(&answer(r#""default";r=0;t=10"#));
        let all = series(&snapshotter);
        assert_eq!(pushback_holds(&all, "partner", "x_ratelimit"), 1);
        assert_eq!(pushback_holds(&all, "partner", "ratelimit"), 1);
        assert_eq!(pushback_holds(&all, "partner", "openai"), 0);
    });
}

/// Each reason a dependency gives, and each outcome of a call, counted once per event.
#[test]
fn a_hand_built_pushback_counts_calls_and_holds_by_reason() {
    let ((), all) = on_own_recorder(&current_thread(), |snapshotter| async move {
        let clock = ManualClock::new();
        let partner = Pushback::builder("partner").clock(clock.clone()).build();
        let client = partner.layer().layer(scripted(vec![
            (429, vec![("retry-after", "5")]),
            (200, vec![("ratelimit", "\"default\";r=0;t=10")]),
            (
                200,
                vec![("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "7")],
            ),
            // A 503 without Retry-After asks for nothing; a 200 with calls left neither.
            (503, vec![]),
            (200, vec![("ratelimit", "\"default\";r=5;t=10")]),
        ]));
        let call = || client.clone().oneshot(());

        assert_eq!(
            call().await.unwrap().status(),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert!(call().await.unwrap_err().is::<PushedBack>());
        // The hold is the gauge's value when it is published. (A debugging snapshot takes
        // the counters' values and sets them back to zero: later ones count from here.)
        partner.publish_gauges();
        let all = series(&snapshotter);
        assert_eq!(
            gauge(
                &all,
                "bulwark_pushback_held_seconds",
                &[("name", "partner")]
            ),
            5.0
        );
        assert_eq!(pushback_calls(&all, "partner", "admitted"), 1);
        assert_eq!(pushback_calls(&all, "partner", "refused"), 1);
        assert_eq!(pushback_holds(&all, "partner", "retry_after"), 1);
        clock.advance(Duration::from_secs(5));
        call().await.unwrap(); // r=0;t=10
        assert!(call().await.unwrap_err().is::<PushedBack>());
        assert!(call().await.unwrap_err().is::<PushedBack>());
        clock.advance(Duration::from_secs(10));
        call().await.unwrap(); // x-ratelimit 0, 7 s
        assert!(call().await.unwrap_err().is::<PushedBack>());
        clock.advance(Duration::from_secs(7));
        assert_eq!(
            call().await.unwrap().status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        call().await.unwrap(); // r=5
        partner.publish_gauges();
    });
    // Since the snapshot above.
    assert_eq!(pushback_calls(&all, "partner", "admitted"), 4);
    assert_eq!(pushback_calls(&all, "partner", "refused"), 3);
    assert_eq!(pushback_calls(&all, "partner", "waited"), 0);
    assert_eq!(pushback_holds(&all, "partner", "retry_after"), 0);
    assert_eq!(pushback_holds(&all, "partner", "ratelimit"), 1);
    assert_eq!(pushback_holds(&all, "partner", "x_ratelimit"), 1);
    assert_eq!(pushback_holds(&all, "partner", "openai"), 0);
    assert_eq!(pushback_holds(&all, "partner", "anthropic"), 0);
    assert_eq!(
        gauge(
            &all,
            "bulwark_pushback_held_seconds",
            &[("name", "partner")]
        ),
        0.0
    );
    // Nothing else is recorded: no other series and no other labels.
    assert!(
        all.iter()
            .all(|(_, name, _, _)| name.starts_with("bulwark_pushback_")),
        "{all:?}"
    );
    assert_eq!(all.len(), 3 + 6 + 1, "{all:?}");
}

/// A call held within `max_wait` and then sent is `waited`; one whose hold is longer than
/// `max_wait` is `refused`.
#[test]
fn a_pushback_that_waits_counts_the_wait() {
    let ((), all) = on_own_recorder(&current_thread(), |_| async {
        let partner = Pushback::builder("waiting")
            .clock(TokioClock::new())
            .max_wait(Duration::from_secs(2))
            .build();
        let client = partner.layer().layer(scripted(vec![
            (429, vec![("retry-after", "1")]),
            (429, vec![("retry-after", "2")]),
            (429, vec![("retry-after", "5")]),
        ]));
        // The 429, then a call that waits out its second and meets the next 429.
        client.clone().oneshot(()).await.unwrap();
        let start = tokio::time::Instant::now();
        let second = client.clone().oneshot(()).await.unwrap();
        assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        // Held two seconds now: within max_wait, so this one waits and is sent.
        client.clone().oneshot(()).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        // Held five seconds, beyond max_wait: refused at once.
        assert!(client.oneshot(()).await.unwrap_err().is::<PushedBack>());
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    });
    assert_eq!(pushback_calls(&all, "waiting", "admitted"), 1);
    assert_eq!(pushback_calls(&all, "waiting", "waited"), 2);
    assert_eq!(pushback_calls(&all, "waiting", "refused"), 1);
    assert_eq!(pushback_holds(&all, "waiting", "retry_after"), 3);
}

/// Each outcome of a hand-built client quota: sent at once, sent after waiting for its permit,
/// refused, failed by the limiter (a cost it can never grant).
#[test]
fn a_hand_built_client_quota_counts_each_outcome() {
    let sent = Arc::new(AtomicUsize::new(0));
    let ((), all) = on_own_recorder(&current_thread(), |_| async {
        // One per second, waiting up to one second for it.
        let limiter = tokio_direct(waits_up_to(
            Quota::per_second(1).unwrap(),
            Duration::from_secs(1),
        ));
        let layer = ClientQuotaLayer::new("partner", limiter);
        let dependency = {
            let sent = Arc::clone(&sent);
            service_fn(move |()| {
                sent.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, BoxError>(()) }
            })
        };
        let client = layer.layer(dependency.clone());

        client.clone().oneshot(()).await.unwrap(); // admitted
                                                   // Two calls at once: the first waits a second for its permit, the second's would
                                                   // come in two, beyond max_wait.
        let (waited, refused) =
            tokio::join!(client.clone().oneshot(()), client.clone().oneshot(()));
        waited.unwrap();
        assert!(refused.unwrap_err().is::<QuotaExhausted>());
        // A layer of five permits a call on the same quota (and the same name) fails:
        // the quota can never grant it.
        let costly = layer.clone().cost(5).layer(dependency);
        assert!(costly
            .oneshot(())
            .await
            .unwrap_err()
            .is::<InsufficientCapacity>());
        // A waiting call dropped before its permit falls due is not counted.
        let mut dropped = Box::pin(client.clone().oneshot(()));
        assert!(futures::poll!(&mut dropped).is_pending());
        drop(dropped);
    });
    assert_eq!(sent.load(Ordering::SeqCst), 2);
    assert_eq!(quota_calls(&all, "partner", "admitted"), 1);
    assert_eq!(quota_calls(&all, "partner", "waited"), 1);
    assert_eq!(quota_calls(&all, "partner", "refused"), 1);
    assert_eq!(quota_calls(&all, "partner", "failed"), 1);
    assert_eq!(all.len(), 4, "{all:?}");
}

/// From a config file: the same series under the instance names, around a `reqwest::Client`
/// and a partner on 127.0.0.1 answering `429`; the client quota's rate limiter records its own
/// decisions under its own name.
#[cfg(all(feature = "config", feature = "reqwest"))]
#[test]
fn configured_layers_record_under_their_names() {
    use crate::common::dependency::{configured_client, mount};
    use tower_bulwark::config::Registry;
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, ResponseTemplate};

    const CONFIG: &str = r#"
[rate_limiters.partner-quota]
limit_for_period = 2
limit_refresh_period = "1h"
key = "global"

[pushbacks.partner]

[client_quotas.partner]
limiter = "partner-quota"
"#;
    let ((), all) = on_own_recorder(&runtime(), |_| async {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(200).insert_header("x-ratelimit-remaining", "9"))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        let limited = ResponseTemplate::new(429).insert_header("retry-after", "30");
        mount(&server, method("GET"), limited).await;
        let registry = Registry::from_toml_str(CONFIG).unwrap();
        let client = configured_client(&registry, "partner");
        let get = || reqwest::Request::new(reqwest::Method::GET, server.uri().parse().unwrap());
        assert_eq!(client.clone().oneshot(get()).await.unwrap().status(), 200);
        assert_eq!(client.clone().oneshot(get()).await.unwrap().status(), 429);
        // Held by the pushback: refused there, the quota untouched.
        assert!(crate::common::refusal(&client, get())
            .await
            .is::<PushedBack>());
        // Without the pushback, the quota of two is spent.
        let bare = registry
            .client_quota_layer("partner")
            .unwrap()
            .layer(reqwest::Client::new());
        assert!(bare
            .oneshot(get())
            .await
            .unwrap_err()
            .is::<QuotaExhausted>());
        registry.publish_gauges();
    });
    assert_eq!(pushback_calls(&all, "partner", "admitted"), 2);
    assert_eq!(pushback_calls(&all, "partner", "refused"), 1);
    assert_eq!(pushback_holds(&all, "partner", "retry_after"), 1);
    // Remaining 9 of an unknown window holds nothing.
    assert_eq!(pushback_holds(&all, "partner", "x_ratelimit"), 0);
    let held = gauge(
        &all,
        "bulwark_pushback_held_seconds",
        &[("name", "partner")],
    );
    assert!(held > 28.0 && held <= 30.0, "{held}");
    assert_eq!(quota_calls(&all, "partner", "admitted"), 2);
    assert_eq!(quota_calls(&all, "partner", "refused"), 1);
    let limiter = |outcome| {
        counter(
            &all,
            "bulwark_ratelimiter_calls_total",
            &[("name", "partner-quota"), ("outcome", outcome)],
        )
    };
    assert_eq!((limiter("allowed"), limiter("limited")), (2, 1));
}

/// The admitted path of both layers, metrics on, allocates nothing per call: the handles are
/// registered at the first call and used as they are after that.
#[test]
fn admitted_calls_record_without_allocating() {
    const CALLS: u64 = 1_000;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let ((), all) = on_own_recorder(&runtime, |_| async {
        let partner = Pushback::builder("partner")
            .clock(ManualClock::new())
            .build();
        let limiter = DirectRateLimiter::builder(Quota::per_second(1_000_000).unwrap())
            .clock(ManualClock::new())
            .build();
        let mut client = tower::ServiceBuilder::new()
            .layer(partner.layer())
            .layer(ClientQuotaLayer::new("partner", limiter))
            .service(service_fn(|()| async {
                Ok::<_, BoxError>(Response::new(()))
            }));
        // The first call registers the handles.
        client.ready().await.unwrap().call(()).await.unwrap();
        let before = counting::allocations();
        for _ in 0..CALLS {
            client.ready().await.unwrap().call(()).await.unwrap();
        }
        let spent = counting::allocations() - before;
        assert_eq!(spent, 0, "{spent} allocations for {CALLS} calls");
    });
    assert_eq!(pushback_calls(&all, "partner", "admitted"), CALLS + 1);
    assert_eq!(quota_calls(&all, "partner", "admitted"), CALLS + 1);
}
