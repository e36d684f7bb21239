//! What a request costs: a cost above what a policy can ever admit (its burst) is a 429 without
//! `Retry-After` that spends nothing anywhere; a cost of zero leaves a policy out of the decision
//! and its headers; `cost_by` runs once per request.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use http::StatusCode;
use tower_bulwark::rate_limit::{FailMode, RateLimitLayer};
use tower_bulwark::{clock::ManualClock, Quota};

use super::accounting::{body_json, call, gcra, log, policy, req, svc, two_logs, Inner, Mode};
use crate::common::listener::sf_names;
use crate::support::{header_cost, retry_after, violated};

/// Promise: a cost above a policy's burst is a 413 "never admitted" without `Retry-After` that
/// spends nothing, anywhere: `u32::MAX`, exactly the capacity, and one above, with the policy
/// deciding at once or later, among other policies that admit.
#[test]
fn huge_costs_are_never_admitted_and_spend_nothing() {
    for mode in [Mode::Now, Mode::Later(1)] {
        for (cost, admitted) in [
            (u32::MAX, false),
            (4, true),
            (5, false),
            (u32::MAX - 1, false),
        ] {
            let clock = ManualClock::new();
            let before = log(9, &clock, Mode::Now);
            let costly = log(4, &clock, mode);
            let after = log(9, &clock, Mode::Later(1));
            let shadow = log(1, &clock, Mode::Now);
            let inner = Inner::default();
            let service = svc(
                RateLimitLayer::new(
                    policy(0, &before)
                        .and(policy(1, &costly).cost(cost))
                        .and(policy(2, &after))
                        .and(policy(3, &shadow).cost(u32::MAX).shadow_advertised()),
                ),
                &inner,
            );
            let response = call(&service, req(&[])).unwrap();
            let what = format!("{mode:?} cost {cost}");
            if admitted {
                assert_eq!(response.status(), StatusCode::OK, "{what}");
                assert_eq!(costly.net("k"), 4, "{what}");
                assert_eq!(
                    sf_names(response.headers(), "ratelimit"),
                    ["p0", "p1", "p2"],
                    "{what}: an unadmittable shadow is not described as deciding"
                );
                continue;
            }
            assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE, "{what}");
            assert_eq!(retry_after(&response), None, "{what}: no Retry-After");
            assert!(
                sf_names(response.headers(), "ratelimit").is_empty(),
                "{what}: no policy refused with a wait"
            );
            assert_eq!(
                sf_names(response.headers(), "ratelimit-policy"),
                ["p0", "p1", "p2", "p3"],
                "{what}"
            );
            let json = body_json(response);
            assert_eq!(violated(&json), ["p1"], "{what}");
            let detail = json["detail"].as_str().unwrap();
            assert!(detail.contains("never"), "{what}: {detail}");
            assert!(
                detail.contains(&format!("{cost} permits asked")),
                "{detail}"
            );
            assert_eq!(inner.calls(), 0);
            for (name, acct, limit) in [
                ("before", &before, 9),
                ("costly", &costly, 4),
                ("after", &after, 9),
                ("shadow", &shadow, 1),
            ] {
                assert_eq!(acct.net("k"), 0, "{what}: {name} spent");
                assert_eq!(acct.probe("k"), limit, "{what}: {name}");
                assert_eq!(acct.bad_refunds(), 0);
            }
        }
    }
}

/// Promise: "A cost of zero leaves the policy out of the request's decision and its headers":
/// the policy is never asked, and is in neither `RateLimit` nor `RateLimit-Policy`.
#[test]
fn a_zero_cost_policy_is_left_out_of_the_requests_headers() {
    let (paid, free) = two_logs((5, Mode::Now), (5, Mode::Now));
    let service = svc(
        RateLimitLayer::new(policy(0, &paid).and(policy(1, &free).cost(0))),
        &Inner::default(),
    );
    let response = call(&service, req(&[])).unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(sf_names(response.headers(), "ratelimit"), ["p0"]);
    assert_eq!(free.asked(), 0);
    assert_eq!(
        sf_names(response.headers(), "ratelimit-policy"),
        ["p0"],
        "the free policy is in the headers of a request it was left out of"
    );
}

/// Held: a request that costs every policy nothing is admitted uncounted and without headers.
#[test]
fn a_request_that_costs_nothing_anywhere_is_uncounted_and_headerless() {
    let (a, b) = two_logs((1, Mode::Now), (1, Mode::Later(1)));
    let inner = Inner::default();
    let service = svc(
        RateLimitLayer::new(policy(0, &a).cost(0).and(policy(1, &b).cost_by(|_| 0))),
        &inner,
    );
    for _ in 0..3 {
        let response = call(&service, req(&[])).unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().get("ratelimit").is_none());
        assert!(response.headers().get("ratelimit-policy").is_none());
    }
    assert_eq!(a.asked() + b.asked(), 0);
    assert_eq!(inner.calls(), 3);
}

/// Held: with one policy, `cost_by` runs exactly once per request, also when the cost is zero,
/// when the limiter decides later and when the key is missing, so a cost function with side
/// effects, or one that is not deterministic, sees each request once.
#[test]
fn cost_by_runs_once_per_request() {
    let mut runs = Vec::new();
    for (mode, cost, nokey) in [
        (Mode::Now, 1, false),
        (Mode::Now, 0, false),
        (Mode::Later(1), 1, false),
        (Mode::Now, 1, true),
    ] {
        let clock = ManualClock::new();
        let acct = log(5, &clock, mode);
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let service = svc(
            RateLimitLayer::new(policy(0, &acct).cost_by(move |_| {
                counter.fetch_add(1, Ordering::SeqCst);
                cost
            }))
            .key_error_mode(FailMode::Open),
            &Inner::default(),
        );
        let headers: &[(&str, &str)] = if nokey { &[("x-nokey", "0")] } else { &[] };
        assert_eq!(
            call(&service, req(headers)).unwrap().status(),
            StatusCode::OK
        );
        runs.push((
            format!("{mode:?} cost {cost} nokey {nokey}"),
            calls.load(Ordering::SeqCst),
        ));
    }
    assert!(
        runs.iter().all(|(_, n)| *n == 1),
        "cost_by calls for one request: {runs:?}"
    );
}

/// Promise: "A cost above what the limiter can ever hold at once (its burst)" is never
/// admitted: a GCRA quota of 10 per second with a burst of 2 admits a cost of 2 and answers a
/// cost of 3 with a 413 without `Retry-After` that spends nothing.
#[test]
fn a_cost_above_a_gcra_burst_below_its_permits_is_never_admitted() {
    let clock = ManualClock::new();
    let gcra = gcra(
        Quota::per_second(10).unwrap().with_burst(2).unwrap(),
        clock.clone(),
        Mode::Now,
    );
    let other = log(5, &clock, Mode::Later(1));
    let service = svc(
        RateLimitLayer::new(policy(0, &other).and(policy(1, &gcra).cost_by(header_cost("x-cost")))),
        &Inner::default(),
    );
    let refused = call(&service, req(&[("x-cost", "3")])).unwrap();
    assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(retry_after(&refused), None);
    assert_eq!(violated(&body_json(refused)), ["p1"]);
    assert_eq!((other.net("k"), gcra.net("k")), (0, 0));
    assert_eq!(gcra.probe("k"), 2);
    let admitted = call(&service, req(&[("x-cost", "2")])).unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    assert_eq!(gcra.net("k"), 2);
}
