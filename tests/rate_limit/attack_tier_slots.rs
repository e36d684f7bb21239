//! Attacks on a `ConcurrencyLimiter` serving inside `Tiers` (a limit of streams per plan), and
//! in a `BoxLimiter`, behind a `RateLimitLayer` that carries the body: the headers must
//! advertise the tier's slots as a concurrent policy's do (`qu="concurrent-requests"`, no `w`,
//! no `t`), on admissions and refusals, beside rate policies (tiered too, which keep their
//! window) in either order, in shadow, for keys that move between plans; and every slot goes
//! back exactly once whatever ends the request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use http::{HeaderValue, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::limiter::BoxLimiter;
use tower_bulwark::rate_limit::{ConcurrencyLimiter, HeaderKey, Policy, RateLimitBody};
use tower_bulwark::tiers::Tiers;
use tower_bulwark::{KeyedRateLimiter, Limiter, Quota};

use crate::common::held_stream::{limited, plain_answer, Limited};

type Response = http::Response<RateLimitBody<Body>>;
const SLOTS: &str = "qu=\"concurrent-requests\"";

fn key() -> HeaderKey {
    HeaderKey::new("x-tenant").unwrap()
}

/// The limiter of a concurrent policy of `n` slots per tenant (a clone shares its slots).
fn slots(n: u32) -> ConcurrencyLimiter<HeaderValue> {
    Policy::concurrent("streams", key(), n)
        .unwrap()
        .limiter()
        .clone()
}

/// `n` requests a minute per tenant, on `clock`.
fn per_minute(
    n: u32,
    clock: &ManualClock,
) -> KeyedRateLimiter<HeaderValue, tower_bulwark::algorithm::Gcra, ManualClock> {
    crate::common::keyed_on(Quota::per_minute(n).unwrap(), clock)
}

/// A tenant whose key starts with `pro` is on the pro plan, any other on the free one.
fn plan(key: &HeaderValue) -> &'static str {
    if key.as_bytes().starts_with(b"pro") {
        "pro"
    } else {
        "free"
    }
}

/// Free and pro tenants of `free` and `pro` slots, as `Tiers` of concurrency limiters.
fn plans(free: u32, pro: u32) -> Tiers<HeaderValue, &'static str, ConcurrencyLimiter<HeaderValue>> {
    Tiers::new(plan, "free", slots(free)).tier("pro", slots(pro))
}

type Tiered<L> = Policy<HeaderKey, Tiers<HeaderValue, &'static str, L>>;

/// The policy `streams` of `tiers`.
fn streams<L: Limiter<HeaderValue>>(tiers: Tiers<HeaderValue, &'static str, L>) -> Tiered<L> {
    Policy::new("streams", key(), tiers).unwrap()
}

/// A request of `tenant` that the handler answers as `how` says (see `held_stream::handler`).
fn from(tenant: &str, how: &str) -> Request<Body> {
    Request::get("/stream")
        .header("x-tenant", tenant)
        .header("x-how", how)
        .body(Body::empty())
        .unwrap()
}

/// What a response said: its status, `RateLimit-Policy`, `RateLimit` and `Retry-After`.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Said {
    status: StatusCode,
    policy: String,
    limit: String,
    retry_after: String,
}

fn said(response: &Response) -> Said {
    let header = |name: &str| {
        let value = response.headers().get(name);
        value.map_or(String::new(), |v| v.to_str().unwrap().to_owned())
    };
    Said {
        status: response.status(),
        policy: header("ratelimit-policy"),
        limit: header("ratelimit"),
        retry_after: header("retry-after"),
    }
}

/// The item of policy `name` in a List field, if any.
fn item<'a>(field: &'a str, name: &str) -> Option<&'a str> {
    let quoted = format!("\"{name}\";");
    field.split(", ").find(|i| i.starts_with(&quoted))
}

/// `tenant`'s request through `service`: what it said, and the response (its stream held).
async fn open(service: &Limited, tenant: &str) -> (Said, Response) {
    let response = service
        .clone()
        .oneshot(from(tenant, "stream"))
        .await
        .unwrap();
    (said(&response), response)
}

/// Reads `response`'s held stream to its end.
async fn end(ends: &Semaphore, response: Response) {
    ends.add_permits(1);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "ab"
    );
}

/// Asserts that `said` is an admission advertising `q` slots with `r` left, as a concurrent
/// policy's: `"streams";q=Q;qu="concurrent-requests"` and `"streams";r=R`, no window.
fn assert_admitted(said: &Said, q: u32, r: u32, what: &str) {
    assert_eq!(said.status, StatusCode::OK, "{what}: {said:?}");
    let policy = item(&said.policy, "streams").unwrap_or_else(|| panic!("{what}: {said:?}"));
    assert_eq!(
        policy,
        format!("\"streams\";q={q};{SLOTS}"),
        "{what}: {said:?}"
    );
    let limit = item(&said.limit, "streams").unwrap_or_else(|| panic!("{what}: {said:?}"));
    assert_eq!(limit, format!("\"streams\";r={r}"), "{what}: {said:?}");
}

/// Asserts that `said` is a refusal for want of one of `q` slots, as a concurrent policy's.
fn assert_refused(said: &Said, q: u32, what: &str) {
    assert_eq!(
        said.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{what}: {said:?}"
    );
    assert_eq!(said.retry_after, "1", "{what}: {said:?}");
    assert_eq!(said.limit, "\"streams\";r=0", "{what}: {said:?}");
    let policy = item(&said.policy, "streams").unwrap_or_else(|| panic!("{what}: {said:?}"));
    assert_eq!(
        policy,
        format!("\"streams\";q={q};{SLOTS}"),
        "{what}: {said:?}"
    );
}

/// `src/rate_limit/concurrent.rs` (`ConcurrencyLimiter`): "inside a `Tiers` (a limit per plan)
/// [...] the headers advertise the tier's slots as a concurrent policy's,
/// `qu="concurrent-requests"` with no window"; `Policy::concurrent`: "`"name";q=4;qu=
/// "concurrent-requests"` and `"name";r=2`", a refusal "with `Retry-After: 1`"; `src/tiers.rs`:
/// "the rate-limit headers of a response advertise that tier's quota"; CHANGELOG: "a refusal of
/// slots says it is one". Free (1) and pro (3) tenants side by side: each admission tells its
/// tier's `q` and the slots left, each refusal `r=0`, and an ended stream's slot is back once.
#[tokio::test]
async fn each_plan_advertises_its_own_slots_on_admissions_and_refusals() {
    let ends = Arc::new(Semaphore::new(0));
    let service = limited(streams(plans(1, 3)), &ends, plain_answer);
    let held = plans_say_their_own_slots(&service, &ends).await;
    let (s, other) = open(&service, "pro-2").await;
    assert_admitted(&s, 3, 2, "another pro tenant has its own slots");
    drop((held, other));
    let mut all = Vec::new();
    for left in [2, 1, 0] {
        let (s, response) = open(&service, "pro-1").await;
        assert_admitted(&s, 3, left, "all back");
        all.push(response);
    }
}

/// The scenario of [`each_plan_advertises_its_own_slots_on_admissions_and_refusals`], through
/// `service` (free tenants 1 slot, pro 3): three pro streams, then a refusal; a free stream
/// beside them, then a refusal; one pro stream ended, its slot back once (as soon as the
/// give-back lands). The responses still held.
async fn plans_say_their_own_slots(service: &Limited, ends: &Semaphore) -> Vec<Response> {
    let mut pro = Vec::new();
    for left in [2, 1, 0] {
        let (s, response) = open(service, "pro-1").await;
        assert_admitted(&s, 3, left, "pro");
        pro.push(response);
    }
    assert_refused(&open(service, "pro-1").await.0, 3, "pro, all three held");
    let (s, free) = open(service, "free-1").await;
    assert_admitted(&s, 1, 0, "free beside a full pro tenant");
    assert_refused(&open(service, "free-1").await.0, 1, "free, its one held");
    end(ends, pro.remove(0)).await;
    let (s, again) = admitted_once_back(service, "pro-1").await;
    assert_admitted(&s, 3, 0, "the ended stream's slot, back once");
    assert_refused(&open(service, "pro-1").await.0, 3, "no more than once");
    pro.extend([free, again]);
    pro
}

/// `tenant`'s first admission through `service` once a slot given back has landed (at once in
/// memory; in Redis when the give-back has reached it, within ten seconds).
async fn admitted_once_back(service: &Limited, tenant: &str) -> (Said, Response) {
    crate::common::first_within_ten_seconds("no slot came back", || async {
        let (s, response) = open(service, tenant).await;
        (s.status == StatusCode::OK).then_some((s, response))
    })
    .await
}

/// The script of [`compare`]: open three streams of one tenant, end the first, open two more,
/// drop the second, open two more; what each request was told.
async fn script(service: &Limited, ends: &Semaphore) -> Vec<Said> {
    let mut told = Vec::new();
    let mut held = Vec::new();
    for step in [
        "open", "open", "open", "end", "open", "open", "drop", "open", "open",
    ] {
        match step {
            "end" => end(ends, held.remove(0)).await,
            "drop" => drop(held.remove(0)),
            _ => {
                let (s, response) = open(service, "t").await;
                if s.status == StatusCode::OK {
                    held.push(response);
                }
                told.push(s);
            }
        }
    }
    told
}

/// How both policies of [`compare`] are placed on their layer.
#[derive(Clone, Copy, Debug)]
enum Placed {
    Alone,
    Shadow,
    Advertised,
    CostTwo,
    /// With a `count_if` that never counts, or a settle to zero: a concurrent hold ignores both.
    NeverCounts,
    SettledToZero,
    RateBefore,
    RateAfter,
    /// After or before a rate policy of three a minute, which refuses some of the script.
    TightRateBefore,
    TightRateAfter,
}

fn placed<L: Limiter<HeaderValue> + Clone>(
    policy: Policy<HeaderKey, L>,
    how: Placed,
    ends: &Arc<Semaphore>,
) -> Limited {
    let tight = matches!(how, Placed::TightRateBefore | Placed::TightRateAfter);
    let per = if tight { 3 } else { 100 };
    let rate = || Policy::new("rate", key(), per_minute(per, &ManualClock::new())).unwrap();
    match how {
        Placed::Alone => limited(policy, ends, plain_answer),
        Placed::Shadow => limited(policy.shadow(), ends, plain_answer),
        Placed::Advertised => limited(policy.shadow_advertised(), ends, plain_answer),
        Placed::CostTwo => limited(policy.cost(2), ends, plain_answer),
        Placed::NeverCounts => limited(policy.count_if(|_| false), ends, plain_answer),
        Placed::SettledToZero => limited(policy.settle_by(|_| Some(0)), ends, plain_answer),
        Placed::RateBefore | Placed::TightRateBefore => {
            limited(rate().and(policy), ends, plain_answer)
        }
        Placed::RateAfter | Placed::TightRateAfter => {
            limited(policy.and(rate()), ends, plain_answer)
        }
    }
}

/// Runs [`script`] through `policy` placed as `how`, and through the concurrent policy of the
/// same slots placed alike: what each request is told, in both.
async fn compare<L: Limiter<HeaderValue> + Clone>(
    policy: Policy<HeaderKey, L>,
    how: Placed,
) -> (Vec<Said>, Vec<Said>) {
    let ends = Arc::new(Semaphore::new(0));
    let got = script(&placed(policy, how, &ends), &ends).await;
    let reference = Policy::concurrent("streams", key(), 2).unwrap();
    let want = script(&placed(reference, how, &ends), &ends).await;
    (got, want)
}

/// `src/rate_limit/concurrent.rs` (`ConcurrencyLimiter`): in `Tiers` "its admissions say they
/// hold slots, so the layer gives them back whole when the request ends [...] and the headers
/// advertise the tier's slots as a concurrent policy's"; CHANGELOG (2026-12-06, later): "its
/// responses now advertise slots [...] as a concurrent policy's do". A one-tier `Tiers` of two
/// slots against `Policy::concurrent` of two, alone, in shadow, advertised in shadow, at a cost
/// of two, with a `count_if` or settle ("A concurrent policy keeps its hold"), and after or
/// before a rate policy: every request of one script is told the same, and admitted alike.
#[tokio::test]
async fn tiers_of_slots_say_what_a_concurrent_policy_says_wherever_placed() {
    use Placed::*;
    let all = [
        Alone,
        Shadow,
        Advertised,
        CostTwo,
        NeverCounts,
        SettledToZero,
    ];
    for how in all.into_iter().chain([RateBefore, RateAfter]) {
        let tiers = Tiers::new(|_: &HeaderValue| "only", "only", slots(2));
        let (got, want) = compare(streams(tiers), how).await;
        assert_eq!(got, want, "{how:?}");
    }
}

/// The same for a `BoxLimiter` of a concurrency limiter (`BoxLimiter`: "Any `Limiter` behind
/// one type"), in `Policy::new` (`Policy::new`: "A `ConcurrencyLimiter` [...] makes a
/// concurrent policy: its requests hold their slots until the response body ends, and the
/// headers say so") and in `Tiers`.
#[tokio::test]
async fn a_boxed_concurrency_limiter_says_what_a_concurrent_policy_says() {
    use Placed::*;
    for how in [Alone, Advertised, RateAfter] {
        let boxed = BoxLimiter::new(slots(2));
        let (got, want) = compare(Policy::new("streams", key(), boxed).unwrap(), how).await;
        assert_eq!(got, want, "Policy::new, {how:?}");
        let tiers = Tiers::new(|_: &HeaderValue| "only", "only", BoxLimiter::new(slots(2)));
        let (got, want) = compare(streams(tiers), how).await;
        assert_eq!(got, want, "Tiers, {how:?}");
    }
}

/// `src/tiers.rs`: "the rate-limit headers of a response advertise that tier's quota"; guide:
/// `t` "always sent for a rate [...] not for slots of requests in flight (a concurrent policy,
/// or a concurrency limiter in `Tiers`)". `Tiers` of boxed limiters mixing kinds: the free
/// plan a rate (three a minute), the pro plan slots (two). Each plan is advertised as what it
/// is, on admissions and on refusals.
#[tokio::test]
async fn tiers_mixing_a_rate_and_slots_advertise_each_as_what_it_is() {
    let clock = ManualClock::new();
    let free = BoxLimiter::new(per_minute(3, &clock));
    let tiers = Tiers::new(plan, "free", free).tier("pro", BoxLimiter::new(slots(2)));
    let ends = Arc::new(Semaphore::new(0));
    let service = limited(streams(tiers), &ends, plain_answer);
    let mut held = Vec::new();
    for left in [2, 1, 0] {
        let (s, response) = open(&service, "free-1").await;
        assert_eq!(s.status, StatusCode::OK, "{s:?}");
        assert_eq!(s.policy, "\"streams\";q=3;w=60", "{s:?}");
        assert!(
            s.limit.starts_with(&format!("\"streams\";r={left};t=")),
            "{s:?}"
        );
        held.push(response);
    }
    let (s, _) = open(&service, "free-1").await;
    assert_eq!(s.status, StatusCode::TOO_MANY_REQUESTS, "{s:?}");
    assert_eq!(s.policy, "\"streams\";q=3;w=60", "{s:?}");
    assert!(s.limit.starts_with("\"streams\";r=0;t="), "{s:?}");
    for left in [1, 0] {
        let (s, response) = open(&service, "pro-1").await;
        assert_admitted(&s, 2, left, "pro, beside a free rate");
        held.push(response);
    }
    assert_refused(&open(&service, "pro-1").await.0, 2, "pro, both held");
    end(&ends, held.pop().unwrap()).await;
    let (s, _last) = open(&service, "pro-1").await;
    assert_admitted(&s, 2, 0, "a pro slot back once");
}

/// `src/tiers.rs`: "a key that moves to another tier (an upgrade) starts there afresh, and
/// finds its old state if it moves back"; "A decision remembers the tier that made it, so a
/// refund goes back to that tier even if the key has moved since"; and the headers advertise
/// "that tier's quota". A tenant holding its one free slot is upgraded: the pro tier admits
/// it, telling 3 and 2 left; back on the free plan it is refused until the free stream ends,
/// whose slot goes back to the free tier, not to the pro tier where the key now is.
#[tokio::test]
async fn a_key_moving_between_plans_is_told_each_plans_slots() {
    let (upgraded, select) = switched_plan();
    let tiers = Tiers::new(select, "free", slots(1)).tier("pro", slots(3));
    let ends = Arc::new(Semaphore::new(0));
    let service = limited(streams(tiers), &ends, plain_answer);
    let set = |pro: bool| upgraded.store(pro, Ordering::SeqCst);
    let (s, free_a) = open(&service, "t").await;
    assert_admitted(&s, 1, 0, "free");
    set(true);
    let (s, pro_b) = open(&service, "t").await;
    assert_admitted(&s, 3, 2, "upgraded: the pro tier, afresh");
    set(false);
    assert_refused(
        &open(&service, "t").await.0,
        1,
        "back on free, its slot held",
    );
    set(true);
    end(&ends, free_a).await; // ends while the key is on the pro plan
    let (s, pro_c) = open(&service, "t").await;
    assert_admitted(&s, 3, 1, "the free stream's end freed no pro slot");
    set(false);
    let (s, free_d) = open(&service, "t").await;
    assert_admitted(&s, 1, 0, "the free slot went back to the free tier");
    set(true);
    drop((pro_b, pro_c));
    let (s, _pro_e) = open(&service, "t").await;
    assert_admitted(&s, 3, 2, "both pro streams dropped: their slots back, once");
    set(false);
    drop(free_d);
    assert_admitted(&open(&service, "t").await.0, 1, 0, "free again");
}

/// Guide (headers): "**`RateLimit-Policy`** states each quota as a rate [...] `w` is the period
/// rounded up", "`t` [...] always sent for a rate [...] not for slots of requests in flight (a
/// concurrent policy, or a concurrency limiter in `Tiers`)"; "On a refusal `RateLimit` lists
/// only the violated policies"; guide (policies): "a request refused for want of a slot costs
/// the other policies nothing", "a request refused by one policy [...] gives back every permit
/// the others granted, once". Tiered rates (3 and 30 a minute) beside tiered slots (1 and 3),
/// in both orders: the rates keep `w=60` and `t`, the slots have neither; a refusal of slots
/// costs no rate permit, and a refusal of the rate keeps no slot.
#[tokio::test]
async fn tiered_rates_beside_tiered_slots_keep_their_window_in_either_order() {
    for rate_first in [false, true] {
        let clock = ManualClock::new();
        let rates =
            Tiers::new(plan, "free", per_minute(3, &clock)).tier("pro", per_minute(30, &clock));
        let rate = Policy::new("rate", key(), rates).unwrap();
        let ends = Arc::new(Semaphore::new(0));
        let service = if rate_first {
            limited(rate.and(streams(plans(1, 3))), &ends, plain_answer)
        } else {
            limited(streams(plans(1, 3)).and(rate), &ends, plain_answer)
        };
        let what = |w: &str| format!("{w}, rate first: {rate_first}");
        let assert_rate = |s: &Said, q: u32, r: u32, w: &str| {
            let policy = item(&s.policy, "rate").unwrap_or_else(|| panic!("{}: {s:?}", what(w)));
            assert_eq!(policy, format!("\"rate\";q={q};w=60"), "{}", what(w));
            let limit = item(&s.limit, "rate").unwrap_or_else(|| panic!("{}: {s:?}", what(w)));
            assert!(
                limit.starts_with(&format!("\"rate\";r={r};t=")),
                "{}: {s:?}",
                what(w)
            );
        };
        let (s, first) = open(&service, "free-1").await;
        assert_admitted(&s, 1, 0, &what("free"));
        assert_rate(&s, 3, 2, "free");
        for _ in 0..3 {
            let (s, _) = open(&service, "free-1").await;
            assert_refused(&s, 1, &what("free, slot held"));
            assert!(item(&s.policy, "rate").is_some(), "{}", what("listed"));
        }
        let (s, pro) = open(&service, "pro-1").await;
        assert_admitted(&s, 3, 2, &what("pro"));
        assert_rate(&s, 30, 29, "pro");
        end(&ends, first).await;
        let (s, second) = open(&service, "free-1").await;
        assert_admitted(&s, 1, 0, &what("free, second"));
        assert_rate(&s, 3, 1, "the slot refusals cost no rate permit");
        end(&ends, second).await;
        let (s, third) = open(&service, "free-1").await;
        assert_rate(&s, 3, 0, "free, third");
        end(&ends, third).await;
        for _ in 0..3 {
            let (s, _) = open(&service, "free-1").await;
            assert_eq!(
                s.status,
                StatusCode::TOO_MANY_REQUESTS,
                "{}",
                what("rate spent")
            );
            assert!(
                s.limit.starts_with("\"rate\";r=0;t="),
                "{}: {s:?}",
                what("rate")
            );
            assert_eq!(
                item(&s.limit, "streams"),
                None,
                "{}: {s:?}",
                what("not violated")
            );
        }
        clock.advance(std::time::Duration::from_secs(20));
        let (s, _) = open(&service, "free-1").await;
        assert_admitted(&s, 1, 0, &what("the rate's refusals kept no slot"));
        drop(pro);
    }
}

/// `Policy::shadow`: "the policy decides and counts as usual, but never refuses a request, and
/// is left out of the rate-limit headers"; guide: slots are given back "exactly once". Tiered
/// slots (free: 2) in shadow on one layer, the same tiers enforced on another: the shadow
/// layer's third stream goes on, holding no slot, and its end frees none of the others'.
#[tokio::test]
async fn tiered_slots_in_shadow_are_not_advertised_and_free_only_what_they_took() {
    let tiers = plans(2, 3);
    let ends = Arc::new(Semaphore::new(0));
    let shadow = limited(streams(tiers.clone()).shadow(), &ends, plain_answer);
    let enforced = limited(streams(tiers), &ends, plain_answer);
    let mut held = Vec::new();
    for _ in 0..3 {
        let (s, response) = open(&shadow, "t").await;
        assert_eq!(s.status, StatusCode::OK, "{s:?}");
        assert_eq!((s.policy.as_str(), s.limit.as_str()), ("", ""), "left out");
        held.push(response);
    }
    assert_refused(&open(&enforced, "t").await.0, 2, "the shadow took two");
    end(&ends, held.pop().unwrap()).await; // the one shadow would have refused
    assert_refused(&open(&enforced, "t").await.0, 2, "it freed nothing");
    end(&ends, held.pop().unwrap()).await;
    let (s, one) = open(&enforced, "t").await;
    assert_admitted(&s, 2, 0, "one shadow stream ended");
    assert_refused(&open(&enforced, "t").await.0, 2, "one only");
    drop((held, one));
    let (s, _two) = open(&enforced, "t").await;
    assert_admitted(&s, 2, 1, "all back");
}

/// `src/rate_limit/concurrent.rs`: "every slot goes back exactly once", the layer gives a
/// tier's slots back "whole when the request ends"; guide: "until its body ends, fails or is
/// dropped, or the request ends without one (an error, a panic, a request dropped), and gives
/// them back exactly once". Pro tenants of three slots, two held: each way of ending a third
/// request frees its slot and no other, so exactly one more fits, telling `r=0`.
#[tokio::test]
async fn every_way_a_tiered_request_ends_gives_its_slot_back_once() {
    crate::common::process::quiet_panics_starting_with("a handler that panics");
    let ends = Arc::new(Semaphore::new(0));
    let service = limited(streams(plans(1, 3)), &ends, plain_answer);
    let call = |how: &str| service.clone().oneshot(from("pro-1", how));
    for how in [
        "read",
        "fail",
        "cut",
        "panic",
        "hang",
        "dropped-body",
        "dropped-at-once",
    ] {
        let mut held = Vec::new();
        for left in [2, 1] {
            let (s, response) = open(&service, "pro-1").await;
            assert_admitted(&s, 3, left, how);
            held.push(response);
        }
        match how {
            "read" => end(&ends, call("stream").await.unwrap()).await,
            "fail" => assert!(call(how).await.is_err()),
            "cut" => assert!(call(how)
                .await
                .unwrap()
                .into_body()
                .collect()
                .await
                .is_err()),
            "panic" => assert!(tokio::spawn(call(how)).await.unwrap_err().is_panic()),
            "hang" => {
                let mut future = Box::pin(call(how));
                for _ in 0..5 {
                    let _ = crate::common::poll_once(future.as_mut());
                }
            }
            "dropped-body" => drop(call("stream").await.unwrap()),
            _ => drop(call("stream")),
        }
        let (s, last) = open(&service, "pro-1").await;
        assert_admitted(&s, 3, 0, how);
        assert_refused(&open(&service, "pro-1").await.0, 3, how);
        drop((held, last));
    }
}

/// As [`tiers_of_slots_say_what_a_concurrent_policy_says_wherever_placed`], beside a rate
/// policy that refuses part of the script (three a minute), before or after: guide, section 3
/// of the draft, "the same on admissions and refusals"; `ConcurrencyLimiter`: in `Tiers` "the
/// headers advertise the tier's slots as a concurrent policy's, `qu="concurrent-requests"` with
/// no window". (Found by attack: a request the rate refused advertised the tier's slots as a
/// rate, `"streams";q=2;w=1`, where the concurrent policy says
/// `"streams";q=2;qu="concurrent-requests"`; the same for `Tiers` of a `BoxLimiter` of slots
/// and for a `BoxLimiter` of slots in `Policy::new`.)
#[tokio::test]
async fn a_refusal_by_another_policy_still_advertises_tiered_slots() {
    for how in [Placed::TightRateBefore, Placed::TightRateAfter] {
        let tiers = Tiers::new(|_: &HeaderValue| "only", "only", slots(2));
        let (got, want) = compare(streams(tiers), how).await;
        assert_eq!(got, want, "Tiers, {how:?}");
        let tiers = Tiers::new(|_: &HeaderValue| "only", "only", BoxLimiter::new(slots(2)));
        let (got, want) = compare(streams(tiers), how).await;
        assert_eq!(got, want, "Tiers of a BoxLimiter, {how:?}");
        let boxed = Policy::new("streams", key(), BoxLimiter::new(slots(2))).unwrap();
        let (got, want) = compare(boxed, how).await;
        assert_eq!(got, want, "a BoxLimiter in Policy::new, {how:?}");
    }
}

/// The same tiers of slots kept in Redis.
#[cfg(feature = "redis")]
mod in_redis;

/// A plan for every key, `"pro"` while the switch is on, else `"free"`: the switch, and the
/// function a `Tiers` selects with.
pub(crate) fn switched_plan() -> (Arc<AtomicBool>, impl Fn(&HeaderValue) -> &'static str) {
    let pro = Arc::new(AtomicBool::new(false));
    let on = Arc::clone(&pro);
    let plan = move |_: &HeaderValue| {
        if on.load(Ordering::SeqCst) {
            "pro"
        } else {
            "free"
        }
    };
    (pro, plan)
}
