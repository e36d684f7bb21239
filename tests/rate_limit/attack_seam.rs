//! A blind attack on how the HTTP layer gives back and settles admissions: settle rules on a
//! concurrent policy, vetoes across every kind of policy, clients that go away at each await
//! point, panicking settle rules and handlers, bodies dropped midway, absurd settled costs and
//! racing tasks. Figures come from the quota and the rustdoc of `Policy` and `Limiter::settle`.

use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures::FutureExt;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_bulwark::algorithm::{Gcra, Metered};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::rate_limit::{ConcurrencyLimiter, KeyExtractor, Policy, RateLimitLayer};
use tower_bulwark::usage::BodyUsage;
use tower_bulwark::{KeyedRateLimiter, Limiter, Quota};

use crate::common::poll_once;
use crate::settle_hostile::{request, tokens, Tokens, Q, TOTAL};
use crate::support::{header_key, Slow};

const T: &str = "t";

/// What `l` has left for tenant `t` now (see [`crate::common::probe`]).
fn probe<L: Limiter<String>>(l: &L) -> u64 {
    crate::common::probe(l, &T.to_string())
}

/// Asserts that `spent` of `l`'s `Q` are spent now and none a minute later: the hold of the
/// estimate ended, and nothing was charged past `Q`.
fn spent_then_whole<L: Limiter<String>>(clock: &ManualClock, l: &L, spent: u64) {
    assert_eq!(probe(l), Q - spent, "spent now");
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        probe(l),
        Q,
        "whole a minute later: no hold left, no charge past Q"
    );
}

fn slots(n: u32) -> Policy<impl KeyExtractor<Key = String>, ConcurrencyLimiter<String>> {
    Policy::concurrent("slots", header_key("x-tenant"), n).unwrap()
}

/// [`slots`] and its limiter, to probe.
fn slots_and_limiter(
    n: u32,
) -> (
    Policy<impl KeyExtractor<Key = String>, ConcurrencyLimiter<String>>,
    ConcurrencyLimiter<String>,
) {
    let slots = slots(n);
    let held = slots.limiter().clone();
    (slots, held)
}

/// A clock, a `Metered` limiter of `Q` tokens a minute on it, and [`slots_and_limiter`]`(1)`.
#[expect(
    clippy::type_complexity,
    reason = "the policy's key extractor is opaque, so no alias can name it"
)]
fn one_slot_rig() -> (
    ManualClock,
    Tokens<Metered>,
    (
        Policy<impl KeyExtractor<Key = String>, ConcurrencyLimiter<String>>,
        ConcurrencyLimiter<String>,
    ),
) {
    let clock = ManualClock::new();
    let toks = tokens::<Metered>(&clock);
    (clock, toks, slots_and_limiter(1))
}

/// Asserts that the one slot is free, and [`spent_then_whole`].
fn slot_free_and_spent(
    clock: &ManualClock,
    toks: &Tokens<Metered>,
    held: &ConcurrencyLimiter<String>,
    spent: u64,
) {
    assert_eq!(probe(held), 1, "the slot is free");
    spent_then_whole(clock, toks, spent);
}

/// A `Metered` policy of `Q` tokens a minute reserving `estimate` per request.
fn metered(
    l: &Tokens<Metered>,
    estimate: u32,
) -> Policy<impl KeyExtractor<Key = String>, Tokens<Metered>> {
    Policy::new("tokens", header_key("x-tenant"), l.clone())
        .unwrap()
        .cost(estimate)
}

/// A 200 whose JSON body reports `used` tokens.
fn json_answer(used: u32) -> Response<Body> {
    Response::builder()
        .header("content-type", "application/json")
        .header("x-used", used.to_string())
        .body(Body::from(format!(
            r#"{{"usage":{{"total_tokens":{used}}}}}"#
        )))
        .unwrap()
}

fn answering(
    used: u32,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static {
    service_fn(move |_: Request<Body>| async move { Ok::<_, Infallible>(json_answer(used)) })
}

/// `Policy::concurrent`: "A concurrent policy keeps its hold: `count_if`, `settle_by` and
/// `settle_from_body` leave it as it is." A policy of one slot given each settle rule (each
/// saying the request cost nothing, or 3) still refuses a second request while the first
/// one's body is unread, and frees exactly its one slot when that body ends.
#[tokio::test]
async fn settle_rules_never_release_or_charge_a_concurrent_slot() {
    for name in ["settle_by 0", "settle_by 3", "count_if", "settle_from_body"] {
        let policy = match name {
            "settle_by 0" => slots(2).settle_by(|_| Some(0)),
            "settle_by 3" => slots(2).settle_by(|_| Some(3)),
            "count_if" => slots(2).count_if(|_| false),
            _ => slots(2).settle_from_body(BodyUsage::json(TOTAL).unwrap()),
        };
        let slots = policy.limiter().clone();
        let svc = RateLimitLayer::new(policy).wrap_body().layer(answering(3));
        let first = svc.clone().oneshot(request(&[])).await.unwrap();
        let second = svc.clone().oneshot(request(&[])).await.unwrap();
        assert_eq!(second.status(), StatusCode::OK, "{name}");
        let third = svc.clone().oneshot(request(&[])).await.unwrap();
        assert_eq!(
            third.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{name}: held"
        );
        first.into_body().collect().await.unwrap();
        assert_eq!(
            probe(&slots),
            1,
            "{name}: the one slot back, no more, none charged"
        );
        drop(second);
        assert_eq!(probe(&slots), 2, "{name}");
    }
}

/// Guide, the HTTP layer: "a request refused by one policy ... gives back every permit the
/// others granted, once". A chain of a concurrent policy, a `Metered` token policy settled by
/// the head, a `count_if` policy and, in the middle, a policy with nothing left: the request is
/// refused, and every other key is whole, the `Metered` hold ended (whole a minute later too).
#[tokio::test]
async fn a_veto_in_the_middle_gives_every_kind_of_policy_its_permits_back() {
    let clock = ManualClock::new();
    let toks = tokens::<Metered>(&clock);
    let logins = tokens::<Gcra>(&clock);
    let spent = KeyedRateLimiter::<String>::builder(Quota::per_minute(1).unwrap())
        .clock(clock.clone())
        .build();
    assert!(spent.check(&T.to_string()).allowed);
    let (slots, held) = slots_and_limiter(1);
    let chain = slots
        .and(metered(&toks, 700).settle_by(|_| Some(1)))
        .and(Policy::new("spent", header_key("x-tenant"), spent.clone()).unwrap())
        .and(
            Policy::new("logins", header_key("x-tenant"), logins.clone())
                .unwrap()
                .count_if(|_| true),
        );
    let svc = RateLimitLayer::new(chain).wrap_body().layer(answering(1));
    let refused = svc.oneshot(request(&[])).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(refused);
    assert_eq!(probe(&held), 1);
    assert_eq!(probe(&toks), Q);
    assert_eq!(probe(&logins), Q);
    clock.advance(Duration::from_secs(60));
    assert_eq!(probe(&toks), Q, "no hold left");
}

/// README: "if its client goes away meanwhile, the permit goes back"; guide: "dropped at any
/// await point (reserving, waiting), gives back every permit the others granted, once". A
/// concurrent policy and a `Metered` policy, then a limiter that answers after `pendings`
/// polls: the request dropped after each of its polls leaves one free slot and the whole
/// quota, and no hold (a minute later the key is whole).
#[test]
fn a_client_gone_at_each_await_point_leaves_no_slot_and_no_hold() {
    let mut dropped = 0;
    for pendings in 1..5 {
        for polls in 1..=pendings {
            let clock = ManualClock::new();
            let toks = tokens::<Metered>(&clock);
            let slow = Slow::new(tokens::<Gcra>(&clock), pendings, false);
            let (slots, held) = slots_and_limiter(1);
            let chain = slots
                .and(metered(&toks, 900))
                .and(Policy::new("slow", header_key("x-tenant"), slow.clone()).unwrap());
            let svc = RateLimitLayer::new(chain).wrap_body().layer(answering(5));
            let mut future = Box::pin(svc.oneshot(request(&[])));
            if (0..polls).any(|_| poll_once(future.as_mut()).is_ready()) {
                continue; // answered before this many polls: no await point left there
            }
            dropped += 1;
            drop(future);
            let at = format!("{pendings} pendings, dropped after {polls} polls");
            assert_eq!(probe(&held), 1, "{at}");
            assert_eq!(probe(&toks), Q, "{at}");
            assert_eq!(probe(&slow.inner), Q, "{at}");
            clock.advance(Duration::from_secs(60));
            assert_eq!(probe(&toks), Q, "{at}: no hold left");
        }
    }
    assert!(dropped >= 4, "requests dropped while pending: {dropped}");
}

/// `Policy::settle_by`: "the estimate stands ... so it does when ... `settled` panics"; guide:
/// "its estimate is settled exactly once" whatever ends a request. A `Metered` policy of
/// estimate 400 whose settle rule panics, beside a concurrent policy: the answer gets through
/// (`usage`: "a panic in it reaches no caller"), 400 are spent, the slot comes back, and the
/// hold is ended: a minute later the key is whole.
#[tokio::test]
async fn a_panicking_settle_rule_keeps_the_estimate_and_ends_the_hold() {
    let (clock, toks, (slots, held)) = one_slot_rig();
    let chain = slots.and(metered(&toks, 400).settle_by(|_| panic!("a settle rule that panics")));
    let svc = RateLimitLayer::new(chain).wrap_body().layer(answering(5));
    let response = svc.oneshot(request(&[])).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
    slot_free_and_spent(&clock, &toks, &held, 400);
}

/// Guide: "whatever ends a request or a call (... the inner service failing or panicking ...)
/// its estimate is settled exactly once", and a concurrent policy's slot "goes back exactly
/// once" when the request ends without a body. A handler that panics in its future, caught
/// above the layer: 900 spent, the hold ended, the slot free.
#[tokio::test]
async fn a_handler_that_panics_settles_the_estimate_once_and_frees_the_slot() {
    let (clock, toks, (slots, held)) = one_slot_rig();
    let chain = slots.and(metered(&toks, 900).settle_by(|_| Some(1)));
    let handler = service_fn(|_: Request<Body>| async {
        panic!("the handler panics");
        #[allow(unreachable_code)]
        Ok::<Response<Body>, Infallible>(Response::new(Body::empty()))
    });
    let svc = RateLimitLayer::new(chain).wrap_body().layer(handler);
    let caught = AssertUnwindSafe(svc.oneshot(request(&[])))
        .catch_unwind()
        .await;
    assert!(caught.is_err());
    slot_free_and_spent(&clock, &toks, &held, 900);
}

/// `Policy::settle_from_body`: "A body dropped before its end ... settles to the cost read so
/// far, if it was read". An event stream whose usage event (250 tokens) came before the body
/// was dropped, through a layer that also holds a slot: 250 spent of an estimate of 2 000, the
/// slot free, and no hold a minute later.
#[tokio::test]
async fn a_stream_dropped_after_its_usage_settles_to_it_and_frees_the_slot() {
    let (clock, toks, (slots, held)) = one_slot_rig();
    let usage = BodyUsage::sse(TOTAL).unwrap();
    let chain = slots.and(metered(&toks, 2000).settle_from_body(usage));
    let handler = service_fn(|_: Request<Body>| async {
        let first = Bytes::from("data: {\"usage\":{\"total_tokens\":250}}\n\n");
        let (tx, rx) =
            futures::channel::mpsc::unbounded::<Result<http_body::Frame<Bytes>, Infallible>>();
        tx.unbounded_send(Ok(http_body::Frame::data(first)))
            .unwrap();
        std::mem::forget(tx);
        let body = Body::new(http_body_util::StreamBody::new(rx));
        Ok::<_, Infallible>(
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(body)
                .unwrap(),
        )
    });
    let svc = RateLimitLayer::new(chain).wrap_body().layer(handler);
    let mut body = svc.oneshot(request(&[])).await.unwrap().into_body();
    assert!(body.frame().await.unwrap().unwrap().is_data());
    assert_eq!(probe(&held), 0, "the stream holds its slot");
    drop(body);
    slot_free_and_spent(&clock, &toks, &held, 250);
}

/// `Limiter::settle`: "A cost above the most one request can take ... is charged as that
/// most"; README: "a cost above the quota's capacity is charged as that capacity". A settle
/// rule reporting `u32::MAX` on a `Metered` policy spends the key's `Q`, no more: whole again
/// a minute later.
#[tokio::test]
async fn a_settled_cost_of_u32_max_is_charged_as_the_capacity() {
    let clock = ManualClock::new();
    let toks = tokens::<Metered>(&clock);
    let policy = metered(&toks, 10).settle_by(|_| Some(u32::MAX));
    let svc = RateLimitLayer::new(policy).wrap_body().layer(answering(5));
    let response = svc.oneshot(request(&[])).await.unwrap();
    response.into_body().collect().await.unwrap();
    spent_then_whole(&clock, &toks, Q);
}

/// Guide: "tasks ... racing with estimates and settles on one key get exactly the quota in
/// what they used"; a concurrent policy's slots go back exactly once. 64 tasks on several
/// threads through a chain of 4 slots and a `Metered` policy (estimate 100, settled from the
/// body to 37): the key has `Q` less 37 for each admitted request, and all 4 slots are free.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn racing_tasks_settle_exactly_and_give_every_slot_back() {
    let clock = ManualClock::new();
    let toks = tokens::<Metered>(&clock);
    let (slots, held) = slots_and_limiter(4);
    let usage = BodyUsage::json(TOTAL).unwrap();
    let chain = slots.and(metered(&toks, 100).settle_from_body(usage));
    let svc = RateLimitLayer::new(chain).wrap_body().layer(answering(37));
    let admitted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (svc, admitted) = (svc.clone(), Arc::clone(&admitted));
            tokio::spawn(async move {
                let response = svc.oneshot(request(&[])).await.unwrap();
                if response.status() == StatusCode::OK {
                    admitted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                response.into_body().collect().await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let admitted = admitted.load(std::sync::atomic::Ordering::SeqCst);
    assert!(admitted >= 4);
    assert_eq!(probe(&toks), Q - 37 * admitted);
    let all: Vec<_> = (0..5)
        .map(|_| held.reserve_now(&T.to_string(), 1).unwrap().unwrap())
        .collect();
    assert_eq!(all.iter().filter(|d| d.allowed).count(), 4);
    for d in all {
        held.refund(&T.to_string(), 1, d);
    }
}
