//! Client-side quotas: exact admission under races, refusals that spend nothing, waiters that
//! give their reservation back when dropped, keys and costs, and a `reqwest::Client` wrapped
//! directly.

use crate::common::dependency::mount;
use crate::common::{admitted_until_refused, direct_on, keyed_on};
use crate::common::{tokio_direct, waits_up_to};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower::{service_fn, Layer, Service, ServiceExt};
use tower_bulwark::outbound::quota::{ClientQuotaService, QuotaExhausted};
use tower_bulwark::outbound::{self, ClientQuotaLayer};
use tower_bulwark::{
    algorithm::Gcra,
    clock::{ManualClock, TokioClock},
    limiter::InsufficientCapacity,
    BoxError, DirectRateLimiter, KeyedRateLimiter, Quota,
};
use wiremock::matchers::method;
use wiremock::{MockServer, ResponseTemplate};

fn counting(
    calls: Arc<AtomicUsize>,
) -> impl Service<u32, Response = u32, Error = BoxError, Future: Send> + Clone {
    service_fn(move |n: u32| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, BoxError>(n) }
    })
}

/// A client of "partner" through a client quota on `limiter`, over a [`counting`] dependency
/// that counts the calls reaching it in `calls`.
fn partner_client<L>(
    limiter: L,
    calls: &Arc<AtomicUsize>,
) -> ClientQuotaService<
    impl Service<u32, Response = u32, Error = BoxError, Future: Send> + Clone,
    L,
    (),
    u32,
    (),
> {
    ClientQuotaLayer::new("partner", limiter).layer(counting(calls.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn n_tasks_racing_for_l_permits_get_exactly_l() {
    for (tasks, limit) in [(400u32, 50u32), (64, 1), (100, 99)] {
        let limiter = DirectRateLimiter::builder(Quota::per_hour(limit).unwrap())
            .clock(ManualClock::new())
            .build();
        let calls = Arc::new(AtomicUsize::new(0));
        let client = partner_client(limiter, &calls);
        let barrier = Arc::new(tokio::sync::Barrier::new(tasks as usize));
        let handles: Vec<_> = (0..tasks)
            .map(|i| {
                let client = client.clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    client.oneshot(i).await
                })
            })
            .collect();
        let mut admitted = 0;
        for handle in handles {
            match handle.await.unwrap() {
                Ok(_) => admitted += 1,
                Err(err) => assert!(err.is::<QuotaExhausted>(), "{err}"),
            }
        }
        assert_eq!(admitted, limit, "{tasks} tasks for {limit} permits");
        assert_eq!(calls.load(Ordering::SeqCst), limit as usize);
    }
}

#[tokio::test]
async fn a_refusal_spends_nothing_and_names_the_quota_and_the_time() {
    let clock = ManualClock::new();
    let limiter = direct_on(Quota::per_second(2).unwrap(), &clock);
    let calls = Arc::new(AtomicUsize::new(0));
    let client = partner_client(limiter, &calls);
    client.clone().oneshot(1).await.unwrap();
    client.clone().oneshot(2).await.unwrap();
    // Refused a hundred times: if any of them spent a permit, the next would come later.
    for _ in 0..100 {
        let err = client.clone().oneshot(3).await.unwrap_err();
        let exhausted = err.downcast_ref::<QuotaExhausted>().unwrap();
        assert_eq!(exhausted.quota(), "partner");
        assert_eq!(exhausted.retry_after(), Duration::from_millis(500));
        assert_eq!(
            err.to_string(),
            "client quota `partner` is spent; next permit in 500ms"
        );
        assert!(!err.is::<tower_bulwark::BulkheadFull>());
        assert!(!err.is::<tower::timeout::error::Elapsed>());
    }
    clock.advance(Duration::from_millis(500));
    client.clone().oneshot(4).await.unwrap();
    assert!(client.clone().oneshot(5).await.is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// A limiter of one permit a second on tokio's clock, a call waiting up to 1.5 s for its permit.
fn one_a_second_waiting_up_to_1500ms() -> DirectRateLimiter<Gcra, TokioClock> {
    tokio_direct(waits_up_to(
        Quota::per_second(1).unwrap(),
        Duration::from_millis(1500),
    ))
}

#[tokio::test(start_paused = true)]
async fn a_call_waits_up_to_max_wait_and_later_ones_fail_at_once() {
    let calls = Arc::new(AtomicUsize::new(0));
    let client = partner_client(one_a_second_waiting_up_to_1500ms(), &calls);
    let start = tokio::time::Instant::now();
    client.clone().oneshot(1).await.unwrap();
    client.clone().oneshot(2).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    // The next permit is 1 s away: within max_wait. The one after that, 2 s: refused at once.
    let waiting = tokio::spawn(client.clone().oneshot(3));
    tokio::task::yield_now().await;
    let refused_at = tokio::time::Instant::now();
    let err = client.clone().oneshot(4).await.unwrap_err();
    assert_eq!(refused_at.elapsed(), Duration::ZERO);
    assert_eq!(outbound::retry_after(&*err), Some(Duration::from_secs(2)));
    waiting.await.unwrap().unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_gives_its_reservation_back() {
    let calls = Arc::new(AtomicUsize::new(0));
    let client = partner_client(one_a_second_waiting_up_to_1500ms(), &calls);
    client.clone().oneshot(1).await.unwrap();
    // Reserves the permit due in 1 s, then is cut by a timeout after 300 ms.
    let cut = tokio::time::timeout(Duration::from_millis(300), client.clone().oneshot(2)).await;
    assert!(cut.is_err());
    // Had the reservation stayed, the next permit would be 1.7 s away, past max_wait.
    let start = tokio::time::Instant::now();
    client.clone().oneshot(3).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(700));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn keys_and_costs_come_from_the_request() {
    let clock = ManualClock::new();
    let limiter = keyed_on::<&'static str, _>(Quota::per_minute(10).unwrap(), &clock);
    let calls = Arc::new(AtomicUsize::new(0));
    let client = ClientQuotaLayer::new("per-tenant", limiter)
        .key(|n: &u32| if n % 2 == 0 { "even" } else { "odd" })
        .cost_by(|n: &u32| n / 10)
        .layer(counting(calls.clone()));
    // "even" spends its ten permits in one call of cost 10 ...
    client.clone().oneshot(100).await.unwrap();
    assert!(crate::common::refusal(&client, 20)
        .await
        .is::<QuotaExhausted>());
    // ... and "odd" still has all of its own.
    client.clone().oneshot(51).await.unwrap();
    client.clone().oneshot(51).await.unwrap();
    assert!(client.clone().oneshot(11).await.is_err());
    // A cost the quota can never grant says so.
    let err = client.clone().oneshot(110).await.unwrap_err();
    assert!(err.is::<InsufficientCapacity>(), "{err}");
    assert_eq!(outbound::retry_after(&*err), None);
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    let fixed = ClientQuotaLayer::new(
        "fixed",
        DirectRateLimiter::builder(Quota::per_minute(10).unwrap())
            .clock(clock)
            .build(),
    )
    .cost(4)
    .layer(counting(calls.clone()));
    fixed.clone().oneshot(0).await.unwrap();
    fixed.clone().oneshot(0).await.unwrap();
    assert!(fixed.oneshot(0).await.is_err(), "12 > 10");
}

#[tokio::test]
async fn it_wraps_a_reqwest_client_directly() {
    let server = MockServer::start().await;
    mount(&server, method("GET"), ResponseTemplate::new(200)).await;
    let limiter = KeyedRateLimiter::<String>::builder(Quota::per_hour(3).unwrap())
        .clock(ManualClock::new())
        .build();
    let client = ClientQuotaLayer::new("partner", limiter)
        .key(|request: &reqwest::Request| request.url().path().to_owned())
        .layer(reqwest::Client::new());
    let get = |path: &str| {
        reqwest::Request::new(
            reqwest::Method::GET,
            format!("{}{path}", server.uri()).parse().unwrap(),
        )
    };
    for _ in 0..3 {
        let response = client.clone().oneshot(get("/a")).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    let err = client.clone().oneshot(get("/a")).await.unwrap_err();
    assert!(err.is::<QuotaExhausted>());
    assert_eq!(client.oneshot(get("/b")).await.unwrap().status(), 200);
    assert_eq!(server.received_requests().await.unwrap().len(), 4);
}

/// A quota of 10 above a layer that refuses calls itself: each of the crate's refusals below
/// the quota (a full bulkhead, a pushback hold, a nested quota spent) sent nothing, so the
/// permit goes back, and the quota still admits exactly 10 calls that reach the dependency.
/// The dependency's own error keeps the permit: the call reached it.
#[tokio::test]
async fn calls_refused_below_the_quota_give_their_permits_back() {
    use tower_bulwark::bulkhead::Bulkhead;
    use tower_bulwark::outbound::Pushback;

    let quota = || {
        DirectRateLimiter::builder(Quota::per_hour(10).unwrap())
            .clock(ManualClock::new())
            .build()
    };
    let dependency = |calls: Arc<AtomicUsize>| {
        service_fn(move |fail: bool| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if fail {
                    Err::<http::Response<()>, BoxError>("the dependency failed".into())
                } else {
                    Ok(http::Response::new(()))
                }
            }
        })
    };

    // A full bulkhead: one slot, taken by a call that waits at the dependency.
    let limiter = quota();
    let bulkhead = Bulkhead::semaphore("one", 1).build();
    let (release, held) = tokio::sync::oneshot::channel::<()>();
    let held = Arc::new(std::sync::Mutex::new(Some(held)));
    let client = ClientQuotaLayer::new("partner", limiter.clone()).layer(bulkhead.layer().layer(
        service_fn(move |hold: bool| {
            let held = held.clone();
            async move {
                if hold {
                    let held = held.lock().unwrap().take().unwrap();
                    held.await.ok();
                }
                Ok::<_, BoxError>(())
            }
        }),
    ));
    let mut first = Box::pin(client.clone().oneshot(true));
    assert!(crate::common::poll_once(first.as_mut()).is_pending());
    crate::common::assert_bulkhead_full(&client, || false, 20).await;
    release.send(()).unwrap();
    first.await.unwrap();
    let admitted = (0..20).filter(|_| limiter.check().allowed).count();
    assert_eq!(admitted, 9, "a quota of 10, one call sent");

    // A pushback hold below the quota: a 429 with `Retry-After: 60`, then refusals.
    let limiter = quota();
    let calls = Arc::new(AtomicUsize::new(0));
    let pushback = Pushback::new("partner");
    let client = ClientQuotaLayer::new("partner", limiter.clone()).layer(pushback.layer().layer(
        service_fn({
            let calls = calls.clone();
            move |_: bool| {
                calls.fetch_add(1, Ordering::SeqCst);
                async {
                    Ok::<_, BoxError>(
                        http::Response::builder()
                            .status(429)
                            .header("retry-after", "60")
                            .body(())
                            .unwrap(),
                    )
                }
            }
        }),
    ));
    assert_eq!(client.clone().oneshot(false).await.unwrap().status(), 429);
    for _ in 0..20 {
        let err = client.clone().oneshot(false).await.unwrap_err();
        assert!(err.is::<outbound::PushedBack>(), "{err}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!((0..20).filter(|_| limiter.check().allowed).count(), 9);

    // A nested quota of 2 below the quota of 10, and the dependency's own failures.
    let (outer, inner) = (
        quota(),
        DirectRateLimiter::builder(Quota::per_hour(2).unwrap())
            .clock(ManualClock::new())
            .build(),
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let client = ClientQuotaLayer::new("outer", outer.clone())
        .layer(ClientQuotaLayer::new("inner", inner).layer(dependency(calls.clone())));
    assert!(
        client.clone().oneshot(true).await.is_err(),
        "the dependency's failure"
    );
    client.clone().oneshot(false).await.unwrap();
    for _ in 0..20 {
        let err = client.clone().oneshot(false).await.unwrap_err();
        assert!(err.is::<QuotaExhausted>(), "{err}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!((0..20).filter(|_| outer.check().allowed).count(), 8);
}

/// A budget of 1 000 tokens an hour on a clock that stands still.
fn thousand_tokens_an_hour() -> DirectRateLimiter<tower_bulwark::algorithm::Gcra, ManualClock> {
    direct_on(Quota::per_hour(1000).unwrap(), &ManualClock::new())
}

/// A `reqwest` client whose calls are estimated at 100 tokens of [`thousand_tokens_an_hour`] and
/// settled to what the response's `x-usage-total-tokens` says; and the budget.
fn settled_by_usage_header() -> (
    DirectRateLimiter<tower_bulwark::algorithm::Gcra, ManualClock>,
    impl Service<reqwest::Request, Response = reqwest::Response, Error = BoxError, Future: Send>
        + Clone
        + Send
        + 'static,
) {
    let tokens = thousand_tokens_an_hour();
    let client = ClientQuotaLayer::new("llm", tokens.clone())
        .cost(100)
        .settle_by(|response: &reqwest::Response| {
            response
                .headers()
                .get("x-usage-total-tokens")?
                .to_str()
                .ok()?
                .parse()
                .ok()
        })
        .layer(reqwest::Client::new());
    (tokens, client)
}

/// Calls to an LLM API through a real `reqwest::Client`, each reserving its request's
/// `max_tokens` (100) and settled to the `x-usage-total-tokens` the dependency reports (40), 24
/// of them racing on 1 000 tokens an hour: however many went, the tokens the dependency
/// reports plus what the quota still grants are exactly the quota. A response without a usage
/// keeps its estimate, and so does one whose settle function panics, which still reaches its
/// caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_calls_settled_from_the_dependencys_usage_add_up_to_the_quota() {
    let server = MockServer::start().await;
    let used_40 = ResponseTemplate::new(200).insert_header("x-usage-total-tokens", "40");
    mount(&server, method("POST"), used_40).await;
    mount(&server, method("GET"), ResponseTemplate::new(200)).await;
    let (tokens, client) = settled_by_usage_header();
    let url = server.uri();
    let handles: Vec<_> = (0..24)
        .map(|_| {
            let (mut client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let request = reqwest::Request::new(reqwest::Method::POST, url.parse().unwrap());
                client.ready().await.unwrap().call(request).await.is_ok()
            })
        })
        .collect();
    let mut sent = 0u64;
    for handle in handles {
        sent += u64::from(handle.await.unwrap());
    }
    // At least the ten that fit at 100 each went; refused ones spent nothing.
    assert!(sent >= 10, "{sent} sent");
    let left = admitted_until_refused(|| tokens.check().allowed);
    assert_eq!(sent * 40 + left, 1000);

    // No usage in the answer: the 100 reserved stay spent.
    let (tokens, client) = settled_by_usage_header();
    let request = reqwest::Request::new(reqwest::Method::GET, url.parse().unwrap());
    client.oneshot(request).await.unwrap();
    assert_eq!(tokens.check_n(900).unwrap().remaining, 0);
    assert!(!tokens.check().allowed);

    // A settle function that panics: the caller gets its response all the same, and the 100
    // reserved stay spent, as inbound.
    let tokens = thousand_tokens_an_hour();
    let client = ClientQuotaLayer::new("llm", tokens.clone())
        .cost(100)
        .settle_by(|_: &reqwest::Response| -> Option<u32> { panic!("a settle that panics") })
        .layer(reqwest::Client::new());
    for _ in 0..3 {
        let request = reqwest::Request::new(reqwest::Method::POST, url.parse().unwrap());
        let response = client.clone().oneshot(request).await.unwrap();
        assert!(response.status().is_success());
    }
    assert_eq!(tokens.check_n(700).unwrap().remaining, 0);
    assert!(!tokens.check().allowed);
}

/// A cost only the body tells (an LLM API's `usage.total_tokens`): with `SettleLater`, each
/// `reqwest::Response` carries an `Unsettled`, which the caller settles once it has read the
/// body (here with the crate's `UsageScan`). Settled calls give back what they did not use,
/// exactly; a second settle of one call counts for nothing; a call whose `Unsettled` is dropped
/// keeps its estimate.
#[cfg(feature = "reqwest")]
#[tokio::test]
async fn a_call_settled_later_from_its_body_gives_back_exactly_what_it_did_not_use() {
    use tower_bulwark::outbound::quota::{SettleLater, Unsettled};
    use tower_bulwark::usage::BodyUsage;
    use wiremock::Mock;

    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_string(r#"{"choices":[{"text":"hi"}],"usage":{"total_tokens":30}}"#),
        )
        .mount(&server)
        .await;
    let tokens = thousand_tokens_an_hour();
    let client = ClientQuotaLayer::new("llm", tokens.clone())
        .cost(100)
        .settle_by(SettleLater)
        .layer(reqwest::Client::new());
    let usage = BodyUsage::json(["usage", "total_tokens"]).unwrap();
    let url: reqwest::Url = server.uri().parse().unwrap();
    for call in 0..5 {
        let request = reqwest::Request::new(reqwest::Method::POST, url.clone());
        let mut response = client.clone().oneshot(request).await.unwrap();
        let unsettled = response
            .extensions_mut()
            .remove::<Unsettled>()
            .expect("left with the response");
        if call == 4 {
            // Dropped unsettled: this call keeps its 100.
            drop(unsettled);
            continue;
        }
        let mut scan = usage.scan();
        while let Some(chunk) = response.chunk().await.unwrap() {
            scan.feed(&chunk);
        }
        let used = u32::try_from(scan.found().unwrap()).unwrap();
        assert!(unsettled.clone().settle(used));
        assert!(!unsettled.settle(0), "a call settles once");
    }
    // 4 · 30 + 100 = 220 used of 1 000.
    let left = admitted_until_refused(|| tokens.check().allowed);
    assert_eq!(left, 780);
}
