//! Closures that panic (a cost function, a key extractor, an `on_refusal` hook, a `count_if`
//! predicate), in `call` and while the response future decides: whatever panics, every permit
//! another policy granted comes back, exactly once.

use std::panic::{catch_unwind, AssertUnwindSafe};

use http::{Response, StatusCode};
use tower::Service;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::head::RequestHead;
use tower_bulwark::rate_limit::{PolicySet, RateLimitLayer, RateLimitService};

use super::accounting::{call, log, policy, req, svc, two_logs, Acct, Inner, Mode};
use crate::common::poll_once;

/// A cost of 1 that panics for a request with an `x-boom` field.
fn cost_panicking_on_x_boom(parts: &RequestHead<'_>) -> u32 {
    assert!(!parts.headers.contains_key("x-boom"), "cost_by panics");
    1
}

/// Two policies of 5 an hour, the first deciding as `first_mode`, the second (deciding at once)
/// with a cost that panics on `x-boom` and a key that panics on `x-panic-key`: the first
/// policy's limiter, the service over both, and the inner service.
fn first_and_a_panicking_second(
    first_mode: Mode,
) -> (Acct, RateLimitService<Inner, impl PolicySet + Clone>, Inner) {
    let clock = ManualClock::new();
    let first = log(5, &clock, first_mode);
    let second = log(5, &clock, Mode::Now);
    let inner = Inner::default();
    let policies = policy(0, &first).and(policy(1, &second).cost_by(cost_panicking_on_x_boom));
    let service = svc(RateLimitLayer::new(policies), &inner);
    (first, service, inner)
}

/// Whether calling `service` with a request of the header fields `fields` panics (what the
/// call returns, if anything, dropped at once).
fn call_panics<S: Service<http::Request<axum::body::Body>> + Clone>(
    service: &S,
    fields: &[(&str, &str)],
) -> bool {
    catch_unwind(AssertUnwindSafe(|| {
        let mut s = service.clone();
        drop(s.call(req(fields)));
    }))
    .is_err()
}

/// Promise: "permits are released/refunded exactly once whatever happens". A `cost_by` that
/// panics for the second policy, after the first admitted the request, while the layer decides
/// in `call` (in-memory limiters): the first policy's permit must not stay spent by a request
/// that never got anywhere.
#[test]
fn a_cost_by_panic_in_call_gives_back_what_earlier_policies_granted() {
    let (first, service, inner) = first_and_a_panicking_second(Mode::Now);
    assert!(
        call_panics(&service, &[("x-boom", "1")]),
        "the cost function panicked"
    );
    assert_eq!(inner.calls(), 0);
    assert_eq!(
        first.net("k"),
        0,
        "the first policy keeps the permit of a request that panicked before any decision"
    );
    assert_eq!(first.probe("k"), 5);
}

/// Same promise, with the panic in the second policy's key extractor.
#[test]
fn a_key_extractor_panic_in_call_gives_back_what_earlier_policies_granted() {
    let (first, service, _) = first_and_a_panicking_second(Mode::Now);
    assert!(call_panics(&service, &[("x-panic-key", "1")]));
    assert_eq!(first.net("k"), 0, "the first policy's permit leaked");
}

/// Same promise, with the panic in an `on_refusal` hook: the 429 is built before the other
/// policies' permits are given back.
#[test]
fn an_on_refusal_hook_panic_gives_back_what_the_other_policies_granted() {
    let (admits, refuses) = two_logs((5, Mode::Now), (1, Mode::Now));
    let service = svc(
        RateLimitLayer::new(policy(0, &admits).and(policy(1, &refuses).cost(1))).on_refusal(
            |_: &tower_bulwark::rate_limit::Refusal<'_>| -> Response<bytes::Bytes> {
                panic!("the hook panics")
            },
        ),
        &Inner::default(),
    );
    // Use the refusing policy's only permit under another key of the first policy.
    assert_eq!(
        call(&service, req(&[])).unwrap().status(),
        StatusCode::OK,
        "the first request is admitted"
    );
    let before = admits.net("k");
    assert!(call_panics(&service, &[]));
    assert_eq!(
        admits.net("k"),
        before,
        "the refused request's permit of the admitting policy leaked"
    );
}

/// Held: the same panics while the response future decides (a first policy that decides later)
/// give every permit back exactly once, when the future is dropped.
#[test]
fn a_panic_while_the_future_decides_gives_back_once_on_drop() {
    for panic_in in ["cost", "key"] {
        let (first, service, inner) = first_and_a_panicking_second(Mode::Later(2));
        let header = if panic_in == "cost" {
            ("x-boom", "1")
        } else {
            ("x-panic-key", "1")
        };
        let mut s = service.clone();
        let mut future = Box::pin(s.call(req(&[header])));
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            for _ in 0..10 {
                let _ = poll_once(future.as_mut());
            }
        }));
        assert!(panicked.is_err(), "{panic_in}: the closure panicked");
        assert_eq!(first.net("k"), 1, "{panic_in}: granted, held by the future");
        drop(future);
        assert_eq!(first.net("k"), 0, "{panic_in}: given back on drop");
        assert_eq!(first.refunds(), 1, "{panic_in}: exactly once");
        assert_eq!(first.probe("k"), 5);
        assert_eq!(inner.calls(), 0);
    }
}

/// Promise: "count_if refunds exactly when the response does not count". A response that the
/// first count_if policy does not count, while a second policy's predicate panics: the first
/// policy's permit must come back whatever order they are in, and nothing is given back twice.
/// (A predicate that panics is taken to count the response, and the response goes out.)
#[test]
fn a_panicking_count_if_predicate_never_keeps_another_policys_permit() {
    for panicking_first in [false, true] {
        let (never, boom) = two_logs((5, Mode::Now), (5, Mode::Now));
        let never_counts = policy(0, &never).count_if(|_| false);
        let panics = policy(1, &boom).count_if(|_| panic!("the predicate panics"));
        let layer = if panicking_first {
            RateLimitLayer::new(vec![panics, never_counts])
        } else {
            RateLimitLayer::new(vec![never_counts, panics])
        };
        let service = svc(layer, &Inner::default());
        let response = call(&service, req(&[])).unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            (0..=1).contains(&boom.net("k")),
            "panicking first = {panicking_first}: the panicking policy gave back twice or more"
        );
        assert_eq!(never.bad_refunds() + boom.bad_refunds(), 0);
        assert_eq!(
            never.net("k"),
            0,
            "panicking first = {panicking_first}: a response the policy does not count kept its \
             permit"
        );
    }
}

/// Held: a panicking predicate never gives anything back twice, and the policies before it are
/// settled.
#[test]
fn a_panicking_count_if_predicate_gives_nothing_back_twice() {
    let clock = ManualClock::new();
    let never = log(5, &clock, Mode::Now);
    let boom = log(5, &clock, Mode::Now);
    let plain = log(5, &clock, Mode::Now);
    let service = svc(
        RateLimitLayer::new(vec![
            policy(0, &never).count_if(|_| false),
            policy(1, &boom).count_if(|_| panic!("the predicate panics")),
            policy(2, &plain),
        ]),
        &Inner::default(),
    );
    for round in 1..=3 {
        let response = call(&service, req(&[])).unwrap();
        assert_eq!(response.status(), StatusCode::OK, "the response goes out");
        assert_eq!(never.net("k"), 0, "round {round}");
        assert_eq!(
            boom.net("k"),
            round,
            "round {round}: kept, as for a failed call"
        );
        assert_eq!(plain.net("k"), round, "round {round}");
        assert_eq!(never.refunds(), round as usize);
        assert_eq!(boom.refunds() + plain.refunds(), 0);
    }
    assert_eq!(boom.probe("k"), 2);
}
