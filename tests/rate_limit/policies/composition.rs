//! Sets of policies: a `Vec` of none, one or ten, an empty `Vec` chained between policies,
//! nested chains, and one policy alone, as a `Vec` of one and after a skipped policy answering
//! exactly alike.

use std::time::Duration;

use axum::body::Body;
use http::{Response, StatusCode};
use proptest::prelude::*;
use tower_bulwark::head::RequestHead;
use tower_bulwark::limiter::BoxLimiter;
use tower_bulwark::rate_limit::{FailMode, GlobalKey, KeyError, Policy, RateLimitLayer};
use tower_bulwark::{
    algorithm::{FixedWindow, Gcra, SlidingLog},
    clock::ManualClock,
    DirectRateLimiter, KeyedRateLimiter, Quota,
};

use super::accounting::{body_json, call, log, policy, req, svc, Acct, Inner, Mode, K};
use crate::common::block_on;
use crate::common::listener::{sf_entries, sf_names};
use crate::support::{header_cost, param, violated, with_admitted_headers};

/// Held: a `Vec` of 0, 1 and 10 policies. None: everything passes without headers. One and
/// ten: the refusal by one of them (the 8th) spends nothing under the nine others, names only
/// it, and every header is an RFC 9651 list, with names that need escaping and long enough for
/// the header to outgrow its inline buffer.
#[test]
fn a_vec_of_zero_one_or_ten_policies_spends_only_what_it_admits() {
    let clock = ManualClock::new();
    let inner = Inner::default();
    let none: Vec<Policy<K, Acct>> = Vec::new();
    let service = svc(RateLimitLayer::new(none), &inner);
    for _ in 0..5 {
        let response = call(&service, req(&[])).unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().get("ratelimit").is_none());
        assert!(response.headers().get("ratelimit-policy").is_none());
    }

    let one = log(2, &clock, Mode::Later(1));
    let service = svc(RateLimitLayer::new(vec![policy(0, &one)]), &inner);
    assert_eq!(call(&service, req(&[])).unwrap().status(), StatusCode::OK);
    assert_eq!(call(&service, req(&[])).unwrap().status(), StatusCode::OK);
    let refused = call(&service, req(&[])).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(sf_names(refused.headers(), "ratelimit"), ["p0"]);
    assert_eq!(one.net("k"), 2);

    let name = |i: usize| format!("{i}\"quoted\\back{}", "x".repeat(64 - 17));
    let accts: Vec<Acct> = (0..10)
        .map(|i| {
            let mode = if i % 2 == 0 {
                Mode::Now
            } else {
                Mode::Later(1)
            };
            log(if i == 7 { 1 } else { 5 }, &clock, mode)
        })
        .collect();
    let policies: Vec<Policy<K, Acct>> = accts
        .iter()
        .enumerate()
        .map(|(i, a)| Policy::new(name(i), K(i), a.clone()).unwrap())
        .collect();
    let service = svc(RateLimitLayer::new(policies), &inner);
    let admitted = call(&service, req(&[])).unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    let all: Vec<String> = (0..10).map(name).collect();
    assert_eq!(sf_names(admitted.headers(), "ratelimit-policy"), all);
    let entries = sf_entries(admitted.headers(), "ratelimit");
    assert_eq!(entries.iter().map(|e| e.0.clone()).collect::<Vec<_>>(), all);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(param(e, "r"), if i == 7 { 0 } else { 4 }, "{e:?}");
    }
    let refused = call(&service, req(&[])).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(sf_names(refused.headers(), "ratelimit"), [name(7)]);
    assert_eq!(sf_names(refused.headers(), "ratelimit-policy"), all);
    assert_eq!(violated(&body_json(refused)), [name(7)]);
    for (i, a) in accts.iter().enumerate() {
        assert_eq!(a.net("k"), 1, "policy {i}: only the admitted request spent");
        assert_eq!(a.bad_refunds(), 0);
    }
}

/// Held: an empty `Vec` chained between two policies counts for nothing, and the indices of
/// the policies after it stay right.
#[test]
fn an_empty_vec_in_a_chain_counts_for_nothing_and_later_policies_keep_their_place() {
    let clock = ManualClock::new();
    let a = log(2, &clock, Mode::Now);
    let c = log(1, &clock, Mode::Later(1));
    let service = svc(
        RateLimitLayer::new(
            policy(0, &a)
                .and(Vec::<Policy<K, Acct>>::new())
                .and(Policy::new("p2", K(2), c.clone()).unwrap().cost(1)),
        ),
        &Inner::default(),
    );
    let ok = call(&service, req(&[("x-nokey", "1")])).unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(sf_names(ok.headers(), "ratelimit"), ["p0", "p2"]);
    let refused = call(&service, req(&[])).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(sf_names(refused.headers(), "ratelimit"), ["p2"]);
    assert_eq!((a.net("k"), c.net("k")), (1, 1));
    let keyless = call(&service, req(&[("x-nokey", "2")])).unwrap();
    assert_eq!(keyless.status(), StatusCode::BAD_REQUEST);
    assert_eq!(a.net("k"), 1);

    // Nested to the right: p0 and (p1 and (p2 and p3)); the third refuses, the fourth has no key.
    let accts: Vec<Acct> = [4, 4, 1, 4]
        .iter()
        .map(|&limit| log(limit, &clock, Mode::Later(1)))
        .collect();
    let service = svc(
        RateLimitLayer::new(
            policy(0, &accts[0])
                .and(policy(1, &accts[1]).and(policy(2, &accts[2]).and(policy(3, &accts[3])))),
        )
        .key_error_mode(FailMode::Open),
        &Inner::default(),
    );
    let ok = call(&service, req(&[("x-nokey", "3")])).unwrap();
    assert_eq!(sf_names(ok.headers(), "ratelimit"), ["p0", "p1", "p2"]);
    // p3 found no key and sat the request out: it is not advertised for it.
    assert_eq!(
        sf_names(ok.headers(), "ratelimit-policy"),
        ["p0", "p1", "p2"]
    );
    let refused = call(&service, req(&[])).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(sf_names(refused.headers(), "ratelimit"), ["p2"]);
    let nets: Vec<i64> = accts.iter().map(|a| a.net("k")).collect();
    assert_eq!(nets, [1, 1, 1, 0]);
}

/// Everything a client sees of an answer: status, every header, the body.
fn seen(response: Response<Body>) -> (StatusCode, Vec<(String, String)>, Vec<u8>) {
    let status = response.status();
    let mut headers: Vec<_> = response
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    headers.sort();
    let body = block_on(axum::body::to_bytes(response.into_body(), usize::MAX)).unwrap();
    (status, headers, body.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// One policy alone, the same policy as a `Vec` of one, and the same policy chained after a
    /// policy that every request skips (a cost of zero) go through one decision path, so a client
    /// sees exactly the same answers from the three, request after request: admissions with their
    /// headers, refusals with their `Retry-After` and body, costs the policy can never admit,
    /// responses that `count_if` gives back, with headers on and off, with any algorithm.
    #[test]
    fn one_policy_a_vec_of_one_and_a_chain_answer_alike(
        algorithm in 0usize..3,
        headers_on in any::<bool>(),
        steps in proptest::collection::vec((0u8..5, 0u32..8, any::<bool>(), 0u64..400), 1..40),
    ) {
        let clock = ManualClock::new();
        let limiter = || {
            let quota = Quota::per_second(3).unwrap().with_burst(4).unwrap();
            let builder = KeyedRateLimiter::<String>::builder(quota);
            match algorithm {
                0 => BoxLimiter::new(builder.algorithm::<Gcra>().clock(clock.clone()).build()),
                1 => BoxLimiter::new(
                    builder.algorithm::<FixedWindow>().clock(clock.clone()).build(),
                ),
                _ => BoxLimiter::new(
                    builder.algorithm::<SlidingLog>().clock(clock.clone()).build(),
                ),
            }
        };
        let key = |head: &RequestHead<'_>| -> Result<String, KeyError> {
            let key = head.headers.get("x-key").ok_or_else(|| KeyError::bad_request("no key"))?;
            Ok(key.to_str().unwrap().to_owned())
        };
        let counted = |p: &http::response::Parts| p.status != StatusCode::NOT_FOUND;
        let one = || {
            Policy::new("api", key, limiter()).unwrap().cost_by(header_cost("x-cost")).count_if(counted)
        };
        let never = DirectRateLimiter::new(Quota::per_second(1).unwrap());
        let skipped = Policy::new("never", GlobalKey, never).unwrap().cost(0);
        let inner = Inner::default();
        let alone = svc(with_admitted_headers(RateLimitLayer::new(one()), headers_on), &inner);
        let vec = svc(with_admitted_headers(RateLimitLayer::new(vec![one()]), headers_on), &inner);
        let chained = RateLimitLayer::new(skipped.and(one()));
        let chained = svc(with_admitted_headers(chained, headers_on), &inner);
        for (key, cost, not_found, advance_ms) in steps {
            clock.advance(Duration::from_millis(advance_ms));
            let key = ["a", "a", "a", "b", ""][usize::from(key)];
            let cost = [0, 1, 1, 1, 2, 2, 3, 9][cost as usize];
            let status = if not_found { "404" } else { "200" };
            let request = || {
                let mut headers = vec![("x-cost", cost.to_string()), ("x-status", status.into())];
                if !key.is_empty() {
                    headers.push(("x-key", key.into()));
                }
                let headers: Vec<(&str, &str)> =
                    headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                req(&headers)
            };
            let a = seen(call(&alone, request()).unwrap());
            let b = seen(call(&vec, request()).unwrap());
            let c = seen(call(&chained, request()).unwrap());
            prop_assert_eq!(&a, &b, "a Vec of one answers as the policy alone");
            prop_assert_eq!(&a, &c, "a chain with a skipped policy answers as the policy alone");
        }
    }
}
