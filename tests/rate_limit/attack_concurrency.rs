//! Attacks on `Policy::concurrent` (slots in flight per key, in memory) as a user builds it:
//! alone and composed with rate policies on one `RateLimitLayer`, with the settles, costs and
//! shadow modes a policy can be given, with bodies that panic, with requests dropped while a
//! waiting admission waits, and over a real listener with `reqwest` clients that race and
//! disconnect.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tower::{Layer, ServiceExt};
use tower_bulwark::clock::{ManualClock, TokioClock};
use tower_bulwark::rate_limit::{
    ConcurrencyLimiter, HeaderKey, Policy, RateLimitBody, RateLimitLayer,
};
use tower_bulwark::usage::BodyUsage;
use tower_bulwark::{KeyedRateLimiter, Quota};

use crate::common::held_stream::{
    admitted_in_a_row, limited, racing_clients, request, Answer, Limited,
};
use crate::common::{poll_once, waits_up_to};

type Streams = Policy<HeaderKey, ConcurrencyLimiter<HeaderValue>>;

/// `in_flight` streams of each tenant (`x-tenant`) at once.
fn streams(in_flight: u32) -> Streams {
    Policy::concurrent("streams", HeaderKey::new("x-tenant").unwrap(), in_flight).unwrap()
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get(name).map(|v| v.to_str().unwrap().to_owned())
}

/// A JSON answer that reports zero tokens used, split across the held body's two chunks.
fn zero_usage(_: &HeaderMap) -> Answer {
    Answer {
        content_type: Some("application/json"),
        first: Bytes::from(r#"{"usage":{"total_tokens":"#),
        last: Bytes::from("0}}"),
    }
}

/// Sends `request("stream")` and returns its status and the `streams` entry of `RateLimit`
/// (`r=N`), if any.
async fn open(service: &Limited) -> (StatusCode, Option<String>, Response<RateLimitBody<Body>>) {
    let response = service.clone().oneshot(request("stream")).await.unwrap();
    let remaining = header(response.headers(), "ratelimit").and_then(|field| {
        field
            .split(", ")
            .find(|entry| entry.starts_with("\"streams\""))
            .map(str::to_owned)
    });
    (response.status(), remaining, response)
}

/// src/rate_limit/concurrent.rs:107-109 ("A concurrent policy keeps its hold:
/// [`count_if`](Self::count_if), [`settle_by`](Self::settle_by) and
/// [`settle_from_body`](Self::settle_from_body) leave it as it is.") and src/guide.rs:208
/// ("a concurrent policy holds each admitted request's slots until its body ends, fails or is
/// dropped ... and gives them back exactly once"). A concurrent policy given a `count_if` that
/// never counts, a settle to zero or above the limit, or a settle from a body that reports zero
/// tokens: each stream still holds its slot until its body ends, and gives it back once.
#[tokio::test]
async fn count_if_and_settles_leave_a_concurrent_hold_as_it_is() {
    let usage = || BodyUsage::json(["usage", "total_tokens"]).unwrap();
    let variants: Vec<(&str, Streams)> = vec![
        ("count_if never", streams(2).count_if(|_| false)),
        ("settle_by 0", streams(2).settle_by(|_| Some(0))),
        ("settle_by 9", streams(2).settle_by(|_| Some(9))),
        ("settle_from_body 0", streams(2).settle_from_body(usage())),
    ];
    for (what, policy) in variants {
        let ends = Arc::new(Semaphore::new(0));
        let service = limited(policy, &ends, zero_usage);
        let (a, a_left, a_response) = open(&service).await;
        let (b, b_left, b_response) = open(&service).await;
        assert_eq!((a, b), (StatusCode::OK, StatusCode::OK), "{what}");
        assert_eq!(
            (a_left.as_deref(), b_left.as_deref()),
            (Some("\"streams\";r=1"), Some("\"streams\";r=0")),
            "{what}"
        );
        let (c, _, _) = open(&service).await;
        assert_eq!(c, StatusCode::TOO_MANY_REQUESTS, "{what}: both slots held");
        // One stream read to its end (reporting zero tokens): its slot back, once.
        ends.add_permits(1);
        let body = a_response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, r#"{"usage":{"total_tokens":0}}"#, "{what}");
        let (d, _, d_response) = open(&service).await;
        assert_eq!(d, StatusCode::OK, "{what}: the ended stream's slot is back");
        let (e, _, _) = open(&service).await;
        assert_eq!(e, StatusCode::TOO_MANY_REQUESTS, "{what}: back once only");
        // Both remaining streams dropped half-way: both slots back, no more.
        drop((b_response, d_response));
        let (f, _, f_response) = open(&service).await;
        let (g, _, g_response) = open(&service).await;
        let (h, _, _) = open(&service).await;
        assert_eq!(
            (f, g, h),
            (
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS
            ),
            "{what}"
        );
        drop((f_response, g_response));
    }
}

/// A request of tenant `t` that takes `slots` slots (`x-slots`), answered with a held stream.
fn slots_request(slots: u32) -> Request<Body> {
    let mut request = request("stream");
    let value = HeaderValue::from_str(&slots.to_string()).unwrap();
    request.headers_mut().insert("x-slots", value);
    request
}

/// src/rate_limit/concurrent.rs:109-110 ("[`cost`](Self::cost) and [`cost_by`](Self::cost_by)
/// choose how many slots a request takes."), src/rate_limit/policy.rs:128-133 ("A cost of zero
/// leaves the policy out of the request's decision and its headers. A cost above what the
/// limiter can ever hold at once (its burst) is refused with a `413 Content Too Large` ...
/// without a `Retry-After`") and src/guide.rs:208 ("a cost a policy can never admit is a 413
/// (`largest-cost` in its body) without `Retry-After` that spends nothing"). Requests of several
/// slots on four: each takes and gives back exactly its slots; five is a 413 that spends
/// nothing; zero is left out.
#[tokio::test]
async fn a_request_takes_and_gives_back_exactly_the_slots_it_costs() {
    let policy = streams(4).cost_by(|request| {
        let slots = request.headers.get("x-slots").unwrap().to_str().unwrap();
        slots.parse().unwrap()
    });
    let ends = Arc::new(Semaphore::new(0));
    let service = limited(policy, &ends, crate::common::held_stream::plain_answer);
    let send = |slots| service.clone().oneshot(slots_request(slots));
    let too_large = send(5).await.unwrap();
    assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(header(too_large.headers(), "retry-after"), None);
    let body = too_large.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains("largest-cost"),
        "{body:?}"
    );
    let three = send(3).await.unwrap();
    assert_eq!(three.status(), StatusCode::OK);
    assert_eq!(
        header(three.headers(), "ratelimit").as_deref(),
        Some("\"streams\";r=1"),
        "the 413 spent nothing"
    );
    let free = send(0).await.unwrap();
    assert_eq!(free.status(), StatusCode::OK);
    assert_eq!(header(free.headers(), "ratelimit"), None, "left out");
    assert_eq!(header(free.headers(), "ratelimit-policy"), None, "left out");
    assert_eq!(
        send(2).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let one = send(1).await.unwrap();
    assert_eq!(
        header(one.headers(), "ratelimit").as_deref(),
        Some("\"streams\";r=0")
    );
    // The free stream ends: it took nothing, so it gives nothing back.
    drop(free);
    assert_eq!(
        send(1).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // The stream of three dropped: exactly three come back.
    drop(three);
    let again = send(3).await.unwrap();
    assert_eq!(
        header(again.headers(), "ratelimit").as_deref(),
        Some("\"streams\";r=0")
    );
    assert_eq!(
        send(1).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    drop((one, again));
}

/// src/rate_limit/policy.rs:265-266 ("Shadow mode: the policy decides and counts as usual, but
/// never refuses a request") and :277-278 (`shadow_advertised`: "with the policy in the
/// rate-limit headers as if it were enforced"), with src/guide.rs:208 (slots given back
/// "exactly once"). A shadow concurrent policy of three: a fourth stream, refused in shadow,
/// goes on; when it ends it must give back no slot (it took none), so the count stays exact.
#[tokio::test]
async fn a_shadow_refusal_gives_back_no_slot_it_never_took() {
    let ends = Arc::new(Semaphore::new(0));
    let service = limited(
        streams(3).shadow_advertised(),
        &ends,
        crate::common::held_stream::plain_answer,
    );
    let mut held = Vec::new();
    for left in ["r=2", "r=1", "r=0"] {
        let (status, remaining, response) = open(&service).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(remaining, Some(format!("\"streams\";{left}")));
        held.push(response);
    }
    let (status, remaining, over) = open(&service).await;
    assert_eq!(status, StatusCode::OK, "a shadow never refuses");
    assert_eq!(remaining.as_deref(), Some("\"streams\";r=0"));
    drop(over);
    // One real stream ends: two are in flight, so the next takes the last slot.
    drop(held.remove(0));
    let (_, remaining, next) = open(&service).await;
    assert_eq!(
        remaining.as_deref(),
        Some("\"streams\";r=0"),
        "the shadow-refused stream gave back a slot it never took"
    );
    drop((held, next));
}

/// A rate policy of one request a minute per tenant on `clock`, then waiting up to `max_wait`.
fn per_minute(
    clock: ManualClock,
) -> Policy<HeaderKey, KeyedRateLimiter<HeaderValue, tower_bulwark::algorithm::Gcra, ManualClock>> {
    let limiter = KeyedRateLimiter::<HeaderValue>::builder(Quota::per_minute(1).unwrap())
        .clock(clock)
        .build();
    Policy::new("rate", HeaderKey::new("x-tenant").unwrap(), limiter).unwrap()
}

/// src/guide.rs:207 ("a request refused by one policy, or dropped at any await point
/// (reserving, waiting), gives back every permit the others granted, once") and
/// src/rate_limit/concurrent.rs:96-97 ("the same all-or-nothing decision: the other policies
/// keep nothing"). The concurrent policy first, then a rate policy that vetoes: each vetoed
/// request's slot comes back, so once the rate allows again the last slot is still free.
#[tokio::test]
async fn a_veto_after_the_concurrent_policy_gives_its_slot_back() {
    let clock = ManualClock::new();
    let ends = Arc::new(Semaphore::new(0));
    let service = limited(
        streams(2).and(per_minute(clock.clone())),
        &ends,
        crate::common::held_stream::plain_answer,
    );
    let (first, _, held) = open(&service).await;
    assert_eq!(first, StatusCode::OK);
    for _ in 0..5 {
        let (vetoed, _, refused) = open(&service).await;
        assert_eq!(vetoed, StatusCode::TOO_MANY_REQUESTS);
        let field = header(refused.headers(), "ratelimit").unwrap();
        assert!(field.contains("\"rate\";r=0"), "{field}");
    }
    clock.advance(Duration::from_secs(60));
    let (second, remaining, second_held) = open(&service).await;
    assert_eq!(second, StatusCode::OK, "a veto kept a slot");
    assert_eq!(remaining.as_deref(), Some("\"streams\";r=0"));
    drop((held, second_held));
}

/// A rate policy of one request a second per tenant on tokio's clock, waiting up to ten seconds.
fn waiting(
) -> Policy<HeaderKey, KeyedRateLimiter<HeaderValue, tower_bulwark::algorithm::Gcra, TokioClock>> {
    let quota = waits_up_to(Quota::per_second(1).unwrap(), Duration::from_secs(10));
    let limiter = KeyedRateLimiter::<HeaderValue>::builder(quota)
        .clock(TokioClock::new())
        .build();
    Policy::new("rate", HeaderKey::new("x-tenant").unwrap(), limiter).unwrap()
}

/// src/guide.rs:207 ("dropped at any await point (reserving, waiting), gives back every permit
/// the others granted, once") and :208 ("... or the request ends without one (an error, a
/// panic, a request dropped), and gives them back exactly once"). One stream holds a slot of
/// two; requests that must wait for the rate policy are dropped after 1 to 6 polls (waiting),
/// in either order of the two policies: once the rate allows, the second slot is still free,
/// and only it.
#[tokio::test(start_paused = true)]
async fn requests_dropped_while_a_waiting_admission_waits_give_their_slot_back() {
    for concurrent_first in [true, false] {
        let ends = Arc::new(Semaphore::new(0));
        let answer = crate::common::held_stream::plain_answer;
        let service = if concurrent_first {
            limited(streams(2).and(waiting()), &ends, answer)
        } else {
            limited(waiting().and(streams(2)), &ends, answer)
        };
        let (first, _, held) = open(&service).await;
        assert_eq!(first, StatusCode::OK);
        for polls in 1..=6 {
            let mut call = std::pin::pin!(service.clone().oneshot(request("stream")));
            for _ in 0..polls {
                assert!(poll_once(call.as_mut()).is_pending(), "waits for the rate");
                tokio::task::yield_now().await;
            }
        }
        // Waits out the rate (time is paused: the wait passes at once).
        let (second, remaining, second_held) = open(&service).await;
        assert_eq!(
            second,
            StatusCode::OK,
            "concurrent first: {concurrent_first}"
        );
        assert_eq!(
            remaining.as_deref(),
            Some("\"streams\";r=0"),
            "concurrent first: {concurrent_first}"
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        let (third, _, _) = open(&service).await;
        assert_eq!(third, StatusCode::TOO_MANY_REQUESTS);
        drop((held, second_held));
    }
}

/// A handler whose body sends one chunk, then panics when polled again.
fn panicking_body_handler() -> impl tower::Service<
    Request<Body>,
    Response = Response<Body>,
    Error = std::io::Error,
    Future: Send,
> + Clone {
    tower::service_fn(|_request: Request<Body>| async {
        let chunks = futures::stream::iter([0, 1]).map(|i| {
            assert!(i == 0, "a body that panics");
            Ok::<_, std::io::Error>(Bytes::from("a"))
        });
        Ok(Response::new(Body::from_stream(chunks)))
    })
}

use futures::{FutureExt, StreamExt};

/// src/rate_limit/concurrent.rs:93-96 ("an admitted request holds its slot until its response
/// body ends, fails or is dropped ...; every slot goes back exactly once"). A body that panics
/// while the client reads it: the panic unwinds through the read, the body is dropped, and its
/// slot comes back once.
#[tokio::test]
async fn a_body_that_panics_gives_its_slot_back_once() {
    crate::common::process::quiet_panics_starting_with("a body that panics");
    let service = RateLimitLayer::new(streams(2))
        .wrap_body()
        .layer(panicking_body_handler());
    let send = || service.clone().oneshot(request("stream"));
    let held = send().await.unwrap();
    for _ in 0..3 {
        let body = send().await.unwrap().into_body();
        let read = std::panic::AssertUnwindSafe(body.collect()).catch_unwind();
        assert!(read.await.is_err(), "the body panicked");
    }
    let last = send().await.unwrap();
    assert_eq!(
        last.status(),
        StatusCode::OK,
        "the panicked bodies' slots came back"
    );
    assert_eq!(
        header(last.headers(), "ratelimit").as_deref(),
        Some("\"streams\";r=0"),
        "back once each"
    );
    assert_eq!(
        send().await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    drop((held, last));
}

/// An app on a real listener: `/stream` answers with a held body (`a`, then `b` once `ends`
/// lets it), or panics for `x-how: panic`, behind `policy`.
async fn serve_streams<P>(policy: P, ends: &Arc<Semaphore>) -> String
where
    P: tower_bulwark::rate_limit::PolicySet + Send + Sync + 'static,
{
    use axum::routing::get;
    let ends = Arc::clone(ends);
    let app = axum::Router::new()
        .route(
            "/stream",
            get(move |headers: HeaderMap| {
                let ends = Arc::clone(&ends);
                async move {
                    if headers.get("x-how").is_some_and(|how| how == "panic") {
                        panic!("a handler that panics");
                    }
                    let (first, last) = (Bytes::from("a"), Bytes::from("b"));
                    crate::common::held_stream::held_body(ends, first, last, false)
                }
            }),
        )
        .layer(RateLimitLayer::new(policy).wrap_body());
    format!(
        "http://{}/stream",
        crate::common::listener::serve(app).await
    )
}

/// The first `200` of `send()`, retried every 10 ms for at most ten seconds (a slot freed by a
/// client that went away comes back once the server notices).
async fn admitted_eventually<F>(send: impl Fn() -> F) -> reqwest::Response
where
    F: std::future::Future<Output = reqwest::Result<reqwest::Response>>,
{
    crate::common::first_within_ten_seconds("no slot came back", || {
        let sent = send();
        async move {
            let response = sent.await.ok()?;
            (response.status() == StatusCode::OK).then_some(response)
        }
    })
    .await
}

/// src/guide.rs:208 ("N tasks racing for L slots get exactly L"; "holds each admitted request's
/// slots until its body ends, fails or is dropped, or the request ends without one (an error, a
/// panic, a request dropped), and gives them back exactly once") and
/// src/rate_limit/concurrent.rs:96-100 (a refusal is a `429` with `Retry-After: 1`,
/// `qu="concurrent-requests"` and no window). Over a real listener on 127.0.0.1: sixteen
/// `reqwest` clients race for four slots and exactly four stream; the twelve refused are told
/// so; a client that disconnects mid-stream frees its slot once; a handler that panics frees
/// its slot once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_real_listener_racing_clients_get_exactly_the_slots_and_disconnects_free_them() {
    crate::common::process::quiet_panics_starting_with("a handler that panics");
    let ends = Arc::new(Semaphore::new(0));
    let url = serve_streams(streams(4), &ends).await;
    let client = reqwest::Client::new();
    let get = |how: &'static str| {
        client
            .get(&url)
            .header("x-tenant", "t")
            .header("x-how", how)
            .send()
    };
    let (mut open, refused) = racing_clients(&client, std::slice::from_ref(&url), 16).await;
    for response in &refused {
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        let headers = response.headers();
        assert_eq!(header(headers, "retry-after").as_deref(), Some("1"));
        assert_eq!(
            header(headers, "ratelimit").as_deref(),
            Some("\"streams\";r=0")
        );
        assert_eq!(
            header(headers, "ratelimit-policy").as_deref(),
            Some("\"streams\";q=4;qu=\"concurrent-requests\"")
        );
    }
    assert_eq!(open.len(), 4, "exactly the slots");
    // A client goes away mid-stream: its slot comes back, once.
    drop(open.pop());
    open.push(admitted_eventually(|| get("stream")).await);
    assert_eq!(
        get("stream").await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another goes away; a handler that panics takes the freed slot, then gives it back.
    drop(open.pop());
    crate::common::first_within_ten_seconds("no slot came back", || {
        let sent = get("panic");
        async move {
            match sent.await {
                Err(_) => Some(()), // admitted, and the handler panicked
                Ok(response) => {
                    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
                    None
                }
            }
        }
    })
    .await;
    open.push(admitted_eventually(|| get("stream")).await);
    assert_eq!(
        get("stream").await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // The four read to their ends: all four slots back, no more.
    ends.add_permits(4);
    for mut response in open {
        let mut read = Vec::new();
        while let Some(chunk) = response.chunk().await.unwrap() {
            read.extend_from_slice(&chunk);
        }
        assert!(read.ends_with(b"b"), "{read:?}");
    }
    let mut again = Vec::new();
    for _ in 0..4 {
        again.push(admitted_eventually(|| get("stream")).await);
    }
    assert_eq!(
        get("stream").await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// src/rate_limit/concurrent.rs:93, 100-101 ("At most a million keys are held, those with nothing in
/// flight dropped first") with "At most `in_flight` requests of each key at once". A client
/// holding both slots of its key floods the limiter with a million and more other keys, each
/// taken and given back at once: its key, the one key with something in flight, is never the
/// one dropped, so it stays at its limit.
#[test]
fn a_key_flood_never_forgets_a_key_with_slots_in_flight() {
    use tower_bulwark::Limiter;
    let policy = streams(2);
    let limiter = policy.limiter();
    let held_key = HeaderValue::from_static("t");
    let mut held = Vec::new();
    for _ in 0..2 {
        let decision = limiter.reserve_now(&held_key, 1).unwrap().unwrap();
        assert!(decision.allowed);
        held.push(decision);
    }
    // Two threads, half of the flood each.
    std::thread::scope(|scope| {
        for half in 0..2u32 {
            scope.spawn(move || {
                for i in (half..1_000_100u32).step_by(2) {
                    let key = HeaderValue::from(i);
                    let decision = limiter.reserve_now(&key, 1).unwrap().unwrap();
                    assert!(decision.allowed, "a fresh key");
                    assert!(limiter.refund(&key, 1, decision));
                }
            });
        }
    });
    let over = limiter.reserve_now(&held_key, 1).unwrap().unwrap();
    assert!(
        !over.allowed,
        "the flood made the limiter forget the key's slots"
    );
    for decision in held {
        assert!(limiter.refund(&held_key, 1, decision), "still known");
    }
    assert!(limiter.reserve_now(&held_key, 1).unwrap().unwrap().allowed);
}

/// Free and pro tenants (`x-tenant` starting with `pro`) of one and three streams at once, as
/// `Tiers` of the limiters of two concurrent policies, in a `Policy::new`.
fn per_plan_streams() -> Policy<
    HeaderKey,
    tower_bulwark::tiers::Tiers<HeaderValue, &'static str, ConcurrencyLimiter<HeaderValue>>,
> {
    use tower_bulwark::tiers::Tiers;
    let plan = |key: &HeaderValue| {
        if key.as_bytes().starts_with(b"pro") {
            "pro"
        } else {
            "free"
        }
    };
    let plans = Tiers::new(plan, "free", streams(1).limiter().clone())
        .tier("pro", streams(3).limiter().clone());
    Policy::new("streams", HeaderKey::new("x-tenant").unwrap(), plans).unwrap()
}

/// src/rate_limit/concurrent.rs:17-19 (`ConcurrencyLimiter`: "at most a number of requests in
/// flight per key, each holding its slot until its response body ends or is dropped. Built
/// only by those policies, which give every slot back exactly once"), src/tiers.rs:9-11
/// (`Tiers`: "each key is decided by the limiter of its tier ... the rate-limit headers of a
/// response advertise that tier's quota") and src/rate_limit/layer.rs:194-198 (the layer panics
/// when a concurrent policy's hold could never end). A `ConcurrencyLimiter` is `Clone` and a
/// `Limiter`, so a per-plan limit of streams (`Tiers` of two concurrent policies' limiters) or a
/// pool shared by two policies compiles in a `Policy::new`, and the layer applies without a
/// word. (Found by this attack: no slot ever came back; after one stream, read to its end, the
/// free tenant was refused for good. A concurrency limiter's admissions now say they hold
/// slots, and the layer gives them back whatever policy they serve.)
#[tokio::test]
async fn a_concurrent_limiter_in_a_plain_policy_gives_its_slots_back_or_is_refused() {
    for (what, advertised) in streams_through_other_policies().await {
        for policy in advertised {
            assert!(policy.contains("\"streams\";q="), "{what}: {policy}");
            // In a `Policy::new` it makes a concurrent policy, headers and all.
            if what.contains("Policy::new") {
                assert!(
                    policy.contains("qu=\"concurrent-requests\"") && !policy.contains(";w="),
                    "{what}: {policy}"
                );
            }
        }
    }
}

/// The same, for the headers of `Tiers` of concurrency limiters: advertised as slots
/// (`qu="concurrent-requests"`, no window).
#[tokio::test]
async fn a_concurrent_limiter_in_tiers_is_advertised_as_slots() {
    for (what, advertised) in streams_through_other_policies().await {
        for policy in advertised {
            assert!(
                !policy.contains(";w="),
                "{what}: advertised as a rate: {policy}"
            );
        }
    }
}

/// Three streams one after the other, each read to its end, through a pool of one slot shared
/// through `Policy::new` and through `Tiers` of plans: each must be admitted. What each
/// response advertised in `RateLimit-Policy`, by case.
async fn streams_through_other_policies() -> Vec<(&'static str, Vec<String>)> {
    let ends = Arc::new(Semaphore::new(0));
    let answer = crate::common::held_stream::plain_answer;
    type Build<'a> = Box<dyn Fn() -> Limited + 'a>;
    let builds: [(&str, Build); 2] = [
        (
            "a pool shared through Policy::new",
            Box::new(|| {
                let pool = streams(1).limiter().clone();
                let key = HeaderKey::new("x-tenant").unwrap();
                limited(Policy::new("streams", key, pool).unwrap(), &ends, answer)
            }),
        ),
        (
            "Tiers of plans",
            Box::new(|| limited(per_plan_streams(), &ends, answer)),
        ),
    ];
    let mut cases = Vec::new();
    for (what, build) in builds {
        let service = build();
        let mut advertised = Vec::new();
        for round in 0..3 {
            let (status, _, response) = open(&service).await;
            assert_eq!(
                status,
                StatusCode::OK,
                "{what}, round {round}: the tenant's one slot never came back"
            );
            advertised.push(header(response.headers(), "ratelimit-policy").unwrap());
            ends.add_permits(1);
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, "ab");
        }
        cases.push((what, advertised));
    }
    cases
}

type Metered = KeyedRateLimiter<HeaderValue, tower_bulwark::algorithm::Metered, ManualClock>;

/// A `Metered` limiter of `per_minute` tokens a minute on `clock`.
fn metered(per_minute: u32, clock: &ManualClock) -> Metered {
    KeyedRateLimiter::<HeaderValue>::builder(Quota::per_minute(per_minute).unwrap())
        .algorithm::<tower_bulwark::algorithm::Metered>()
        .clock(clock.clone())
        .build()
}

/// README.md:337-347 ("each holds its slot until its body ends or is dropped"; "A body dropped
/// half-way settles to what was read, if the cost went by"), src/rate_limit/policy.rs:249-251
/// (`settle_from_body`: "A body dropped before its end (the client went away) settles to the
/// cost read so far, if it was read"), src/guide.rs:208 ("a request refused for want of a slot
/// costs the other policies nothing"), :210 ("a request another policy refused settles
/// nothing") and :209 (`Tiers`: "a key is decided and advertised by its own tier"). An LLM
/// gateway over a real listener: tokens per plan (`Tiers` of `Metered` limiters, 100 tokens
/// estimated, settled from the event stream) and one stream at once per tenant. A pro
/// tenant's client reads the event that reports 7 tokens and goes away: its slot comes back
/// and it is charged 7; its next stream holds its estimate; requests refused meanwhile for
/// want of the slot cost nothing; the free tier is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_cut_by_its_client_frees_its_slot_and_settles_to_what_was_read() {
    use tower_bulwark::tiers::Tiers;
    use tower_bulwark::Limiter;
    let clock = ManualClock::new();
    let plan = |key: &HeaderValue| {
        if key.as_bytes().starts_with(b"pro") {
            "pro"
        } else {
            "free"
        }
    };
    let plans =
        Tiers::new(plan, "free", metered(1_000, &clock)).tier("pro", metered(10_000, &clock));
    let tokens = Policy::new("tokens", HeaderKey::new("x-tenant").unwrap(), plans.clone())
        .unwrap()
        .cost(100)
        .settle_from_body(BodyUsage::json(["usage", "total_tokens"]).unwrap());
    let ends = Arc::new(Semaphore::new(0));
    let handler_ends = Arc::clone(&ends);
    let app = axum::Router::new()
        .route(
            "/stream",
            axum::routing::get(move || {
                let ends = Arc::clone(&handler_ends);
                async move {
                    let first = Bytes::from("data: {\"usage\":{\"total_tokens\":7}}\n\n");
                    let last = Bytes::from("data: [DONE]\n\n");
                    let body = crate::common::held_stream::held_body(ends, first, last, false);
                    ([(http::header::CONTENT_TYPE, "text/event-stream")], body)
                }
            }),
        )
        .layer(RateLimitLayer::new(tokens.and(streams(1))).wrap_body());
    let url = format!(
        "http://{}/stream",
        crate::common::listener::serve(app).await
    );
    let client = reqwest::Client::new();
    let get = || client.get(&url).header("x-tenant", "pro-1").send();
    let mut cut = get().await.unwrap();
    assert_eq!(cut.status(), StatusCode::OK);
    let event = cut.chunk().await.unwrap().unwrap();
    assert!(event.starts_with(b"data: {\"usage\""), "{event:?}");
    drop(cut); // the client goes away after the event that reports the usage
    let held = admitted_eventually(get).await;
    for _ in 0..5 {
        let refused = get().await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        let field = header(refused.headers(), "ratelimit").unwrap();
        assert!(field.contains("\"streams\";r=0"), "{field}");
    }
    let pro = HeaderValue::from_static("pro-1");
    let probe = plans.reserve_now(&pro, 1).unwrap().unwrap();
    assert_eq!(
        probe.remaining,
        10_000 - 7 - 100 - 1,
        "7 read, 100 held by the open stream, nothing for the refusals"
    );
    let free = HeaderValue::from_static("free-1");
    let free_probe = plans.reserve_now(&free, 1).unwrap().unwrap();
    assert_eq!(free_probe.remaining, 1_000 - 1, "the free tier untouched");
    drop(held);
}

/// src/limiter/mod.rs:62-63 (`Limiter::set_quota`: "Replaces the quota at run time, for every
/// clone of this limiter, keeping what each key has used"), src/guide.rs:212 ("quota changes |
/// every key keeps what it used") and src/rate_limit/concurrent.rs:164-165 ("as a
/// [`set_quota`](Limiter::set_quota) must reach them all"). Four streams in flight when the
/// limit drops to two: nothing is admitted until fewer than two are in flight, then exactly
/// the new limit; raised back to four, the streams still in flight count, and once every one
/// ended exactly four are admitted (no slot taken under the old limit is lost or freed twice).
#[tokio::test]
async fn a_limit_changed_under_streams_in_flight_keeps_them_counted() {
    use tower_bulwark::Limiter;
    let policy = streams(4);
    let limiter = policy.limiter().clone();
    let ends = Arc::new(Semaphore::new(0));
    let service = limited(policy, &ends, crate::common::held_stream::plain_answer);
    let mut held = Vec::new();
    for _ in 0..4 {
        let (status, _, response) = open(&service).await;
        assert_eq!(status, StatusCode::OK);
        held.push(response);
    }
    limiter.set_quota(Quota::per_second(2).unwrap()).unwrap();
    for in_flight in [4, 3, 2] {
        let (status, _, _) = open(&service).await;
        assert_eq!(
            status,
            StatusCode::TOO_MANY_REQUESTS,
            "{in_flight} in flight over a limit of two"
        );
        held.pop();
    }
    let (status, remaining, next) = open(&service).await;
    assert_eq!(status, StatusCode::OK, "one in flight under a limit of two");
    assert_eq!(remaining.as_deref(), Some("\"streams\";r=0"));
    held.push(next);
    assert_eq!(open(&service).await.0, StatusCode::TOO_MANY_REQUESTS);
    limiter.set_quota(Quota::per_second(4).unwrap()).unwrap();
    for _ in 0..2 {
        let (status, _, response) = open(&service).await;
        assert_eq!(status, StatusCode::OK);
        held.push(response);
    }
    assert_eq!(
        open(&service).await.0,
        StatusCode::TOO_MANY_REQUESTS,
        "four"
    );
    drop(held);
    let mut again = Vec::new();
    for _ in 0..4 {
        let (status, _, response) = open(&service).await;
        assert_eq!(status, StatusCode::OK, "every slot back");
        again.push(response);
    }
    assert_eq!(
        open(&service).await.0,
        StatusCode::TOO_MANY_REQUESTS,
        "none twice"
    );
}

/// src/guide.rs:208 ("N tasks racing for L slots get exactly L"; slots given back "exactly
/// once") and src/guide.rs:191-193 ("N threads racing for a limit of L get exactly L admissions"). Eight tasks on
/// four threads take and end streams of one to three slots of a limit of five, 300 times each,
/// every fourth one vetoed by a rate policy after the slots were taken, ends read to the end
/// or dropped half-way: the slots the admitted requests hold together never exceed five, and
/// once all ended exactly five single slots are admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_tasks_taking_and_ending_streams_never_hold_more_than_the_limit() {
    use std::sync::atomic::{AtomicU32, Ordering};
    // Every fourth request of a task (`x-veto: yes`) is vetoed by a rate policy whose key
    // `yes` is spent; the others cost it nothing (a cost of zero leaves it out).
    let vetoes = KeyedRateLimiter::<HeaderValue>::builder(Quota::per_minute(1).unwrap())
        .clock(ManualClock::new())
        .build();
    let veto_key = HeaderKey::new("x-veto").unwrap();
    let veto = Policy::new("veto", veto_key, vetoes.clone())
        .unwrap()
        .cost_by(|request| u32::from(request.headers["x-veto"] == "yes"));
    let _ = vetoes.check(&HeaderValue::from_static("yes"));
    let policy = streams(5).cost_by(|request| {
        let slots = request.headers.get("x-slots").unwrap().to_str().unwrap();
        slots.parse().unwrap()
    });
    let ends = Arc::new(Semaphore::new(0));
    let service = limited(
        policy.and(veto),
        &ends,
        crate::common::held_stream::plain_answer,
    );
    let holding = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let vetoed = Arc::new(AtomicU32::new(0));
    let tasks: Vec<_> = (0..8u64)
        .map(|task| {
            let (service, holding, most) = (service.clone(), holding.clone(), most.clone());
            let vetoed = Arc::clone(&vetoed);
            let ends = Arc::clone(&ends);
            tokio::spawn(async move {
                let mut rng = crate::common::Rng(0x9E37_79B9 + task);
                for i in 0..300 {
                    let slots = 1 + rng.below(3) as u32;
                    let mut request = slots_request(slots);
                    let veto = if i % 4 == 3 { "yes" } else { "no" };
                    request
                        .headers_mut()
                        .insert("x-veto", HeaderValue::from_static(veto));
                    let response = service.clone().oneshot(request).await.unwrap();
                    if response.status() != StatusCode::OK {
                        let field = header(response.headers(), "ratelimit").unwrap();
                        if field.contains("\"veto\";r=0") {
                            vetoed.fetch_add(1, Ordering::SeqCst);
                        }
                        continue;
                    }
                    assert_eq!(veto, "no", "a vetoed request went on");
                    let now = holding.fetch_add(slots, Ordering::SeqCst) + slots;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    holding.fetch_sub(slots, Ordering::SeqCst);
                    if rng.below(2) == 0 {
                        ends.add_permits(1);
                        let _ = response.into_body().collect().await;
                    } else {
                        drop(response);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 5, "{most} slots held at once");
    assert!(
        vetoed.load(Ordering::SeqCst) > 0,
        "some requests were vetoed"
    );
    let call = || service.clone().oneshot(slots_request_no_veto(1));
    let _again = admitted_in_a_row(call, 5, "every slot back").await;
    let over = call().await.unwrap();
    assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS, "none twice");
}

/// [`slots_request`] that the veto policy admits.
fn slots_request_no_veto(slots: u32) -> Request<Body> {
    let mut request = slots_request(slots);
    request
        .headers_mut()
        .insert("x-veto", HeaderValue::from_static("no"));
    request
}

/// src/guide.rs:208 ("a cost a policy can never admit is a 413 (`largest-cost` in its body)
/// without `Retry-After` that spends nothing") and :207 ("a request refused by one policy ...
/// gives back every permit the others granted, once"). The concurrent policy takes its slot,
/// then a token policy finds the request's cost beyond anything it can admit: a `413`, and the
/// slot goes back each time, so the one slot is free for the next request that fits.
#[tokio::test]
async fn a_413_from_a_later_policy_gives_the_slot_back() {
    let tokens = KeyedRateLimiter::<HeaderValue>::builder(Quota::per_minute(1_000).unwrap())
        .clock(ManualClock::new())
        .build();
    let tokens = Policy::new("tokens", HeaderKey::new("x-tenant").unwrap(), tokens)
        .unwrap()
        .cost_by(|request| {
            let slots = request.headers.get("x-slots").unwrap().to_str().unwrap();
            slots.parse::<u32>().unwrap() * 1_000
        });
    let ends = Arc::new(Semaphore::new(0));
    let service = limited(
        streams(1).and(tokens),
        &ends,
        crate::common::held_stream::plain_answer,
    );
    for _ in 0..3 {
        let too_large = service.clone().oneshot(slots_request(2)).await.unwrap();
        assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(header(too_large.headers(), "retry-after"), None);
    }
    let fits = service.clone().oneshot(slots_request(1)).await.unwrap();
    assert_eq!(fits.status(), StatusCode::OK, "a 413 kept the slot");
    let field = header(fits.headers(), "ratelimit").unwrap();
    assert!(field.starts_with("\"streams\";r=0"), "{field}");
    let over = service.clone().oneshot(slots_request(0)).await.unwrap();
    assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS);
}
