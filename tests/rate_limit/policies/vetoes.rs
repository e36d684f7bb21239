//! All-or-nothing decisions: a key error, a failing limiter or a refusal by any policy spends
//! nothing under the others, in every position and every order of a mixed set of policies, and
//! the 429 names exactly the policies that refused, with the longest `Retry-After`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use tower::ServiceExt;
use tower_bulwark::rate_limit::{FailMode, Policy, RateLimitLayer};
use tower_bulwark::{clock::ManualClock, Limiter, Quota};

use super::accounting::{
    body_json, call, log, policy, req, sliding_log, svc, two_logs, waiting_log, Acct, Inner, Mode,
    K,
};
use crate::common::listener::{sf_entries, sf_names};
use crate::support::{param, retry_after, violated};

/// Promise: a refusal by any policy spends nothing anywhere, and a key error of the second of
/// three policies under `FailMode::Closed` gives back the first's permit and never asks the
/// third; under `Open` the second sits the request out and stays out of `RateLimit`.
#[test]
fn a_key_error_of_the_second_of_three_policies_gives_back_the_first_or_sits_out() {
    for shape in ["chain", "vec"] {
        for mode in [FailMode::Closed, FailMode::Open] {
            for first_mode in [Mode::Now, Mode::Later(1)] {
                let clock = ManualClock::new();
                let accts = [
                    log(3, &clock, first_mode),
                    log(3, &clock, Mode::Now),
                    log(3, &clock, Mode::Later(2)),
                ];
                let inner = Inner::default();
                let request = || req(&[("x-nokey", "1")]);
                let what = format!("{shape} {mode:?} {first_mode:?}");
                let response = if shape == "chain" {
                    let layer = RateLimitLayer::new(
                        policy(0, &accts[0])
                            .and(policy(1, &accts[1]))
                            .and(policy(2, &accts[2])),
                    )
                    .key_error_mode(mode);
                    call(&svc(layer, &inner), request()).unwrap()
                } else {
                    let layer = RateLimitLayer::new(
                        accts
                            .iter()
                            .enumerate()
                            .map(|(i, a)| policy(i, a))
                            .collect::<Vec<_>>(),
                    )
                    .key_error_mode(mode);
                    call(&svc(layer, &inner), request()).unwrap()
                };
                match mode {
                    FailMode::Closed => {
                        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{what}");
                        assert!(response.headers().get("ratelimit").is_none(), "{what}");
                        assert_eq!(inner.calls(), 0);
                        assert_eq!(accts[0].net("k"), 0, "{what}: the first kept its permit");
                        assert_eq!(accts[0].refunds(), 1, "{what}");
                        assert_eq!(accts[2].asked(), 0, "{what}: the third was asked");
                    }
                    _ => {
                        assert_eq!(response.status(), StatusCode::OK, "{what}");
                        assert_eq!(
                            sf_names(response.headers(), "ratelimit"),
                            ["p0", "p2"],
                            "{what}"
                        );
                        assert_eq!(accts[0].net("k"), 1, "{what}");
                        assert_eq!(accts[2].net("k"), 1, "{what}");
                    }
                }
                assert_eq!(accts[1].asked(), 0, "{what}: the keyless policy was asked");
            }
        }
    }
}

/// Promise: "a request refused by any policy spends nothing anywhere" and the 503 of a failing
/// enforced policy gives back what the others granted; a failing shadow never answers 503,
/// whichever position the failing policy is in, deciding at once or later.
#[test]
fn a_failing_policy_in_any_position_is_a_503_that_spends_nothing_unless_a_shadow() {
    for position in 0..3 {
        for fail in [Mode::Fail, Mode::LaterFail(1)] {
            for shadow in [false, true] {
                let clock = ManualClock::new();
                let accts: Vec<Acct> = (0..3)
                    .map(|i| {
                        let mode = if i == position {
                            fail
                        } else if i == 1 {
                            Mode::Later(1)
                        } else {
                            Mode::Now
                        };
                        log(3, &clock, mode)
                    })
                    .collect();
                let policies = accts
                    .iter()
                    .enumerate()
                    .map(|(i, a)| {
                        let p = policy(i, a).count_if(|r| r.status == StatusCode::OK);
                        if i == position && shadow {
                            p.shadow_advertised()
                        } else {
                            p
                        }
                    })
                    .collect::<Vec<_>>();
                let inner = Inner::default();
                let service = svc(RateLimitLayer::new(policies), &inner);
                let response = call(&service, req(&[])).unwrap();
                let what = format!("position {position} {fail:?} shadow {shadow}");
                if shadow {
                    assert_eq!(response.status(), StatusCode::OK, "{what}");
                    let expect: Vec<String> = (0..3)
                        .filter(|&i| i != position)
                        .map(|i| format!("p{i}"))
                        .collect();
                    assert_eq!(sf_names(response.headers(), "ratelimit"), expect, "{what}");
                } else {
                    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{what}");
                    assert_eq!(inner.calls(), 0, "{what}");
                    for (i, a) in accts.iter().enumerate() {
                        assert_eq!(a.net("k"), 0, "{what}: policy {i} spent");
                        if i > position {
                            assert_eq!(a.asked(), 0, "{what}: policy {i} asked after the 503");
                        }
                    }
                }
                for a in &accts {
                    assert_eq!(a.bad_refunds(), 0);
                }
            }
        }
    }
}

/// Promise: the 429 carries the longest `Retry-After` of the violated policies and its
/// `RateLimit` lists exactly the refusing ones (not the admitting ones, not an advertised
/// shadow that would have refused, not a policy the request cost nothing), each with its own
/// wait; the legacy headers name the policy with the longest wait.
#[test]
fn the_429_names_every_violated_policy_with_the_longest_retry_after() {
    let clock = ManualClock::new();
    let keyed = |quota: Quota| sliding_log(quota, clock.clone(), Mode::Later(1));
    let second = keyed(Quota::per_second(1).unwrap());
    let hour = keyed(Quota::per_hour(1).unwrap());
    let minute = keyed(Quota::per_minute(1).unwrap());
    let roomy = keyed(Quota::per_hour(100).unwrap());
    let shadow = keyed(Quota::per_day(1).unwrap());
    let free = keyed(Quota::per_day(1).unwrap());
    let service = svc(
        RateLimitLayer::new(vec![
            policy(0, &second),
            policy(1, &roomy),
            policy(2, &hour),
            policy(3, &shadow).shadow_advertised(),
            policy(4, &minute),
            policy(5, &free).cost_by(|p| u32::from(!p.headers.contains_key("x-free"))),
        ])
        .with_legacy_headers(),
        &Inner::default(),
    );
    assert_eq!(call(&service, req(&[])).unwrap().status(), StatusCode::OK);
    let refused = call(&service, req(&[("x-free", "1")])).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&refused), Some(3600));
    assert_eq!(refused.headers()["x-ratelimit-reset"], "3600");
    assert_eq!(refused.headers()["x-ratelimit-limit"], "1");
    assert_eq!(refused.headers()["x-ratelimit-remaining"], "0");
    let entries = sf_entries(refused.headers(), "ratelimit");
    let summary: Vec<(String, i64, i64)> = entries
        .iter()
        .map(|e| (e.0.clone(), param(e, "r"), param(e, "t")))
        .collect();
    assert_eq!(
        summary,
        [
            ("p0".to_owned(), 0, 1),
            ("p2".to_owned(), 0, 3600),
            ("p4".to_owned(), 0, 60)
        ]
    );
    assert_eq!(violated(&body_json(refused)), ["p0", "p2", "p4"]);
    assert_eq!(roomy.net("k"), 1, "the refused request spent nothing");
    assert_eq!(roomy.probe("k"), 99);
    assert_eq!(shadow.net("k"), 1);
    assert_eq!(free.net("k"), 1);
}

/// Promise (`Refusal::decisions`): "Admissions listed here have been given back." An
/// `on_refusal` hook sees the admitting policy's decision listed, and that policy's limiter
/// already holds only the first request's permit: the refused request's permit came back before
/// the hook ran (so a hook that panics leaks nothing).
#[test]
fn the_refusal_hook_sees_the_admissions_it_lists_given_back() {
    let (admits, refuses) = two_logs((5, Mode::Now), (1, Mode::Now));
    let seen = Arc::new(Mutex::new(None));
    let (watch, record) = (admits.clone(), seen.clone());
    let service = svc(
        RateLimitLayer::new(policy(0, &admits).and(policy(1, &refuses))).on_refusal(
            move |refusal: &tower_bulwark::rate_limit::Refusal<'_>| {
                let admitted = refusal
                    .decisions()
                    .filter(|(_, d)| d.is_some_and(|d| d.allowed))
                    .count();
                *record.lock().unwrap() = Some((admitted, watch.net("k"), watch.probe("k")));
                refusal.default_response()
            },
        ),
        &Inner::default(),
    );
    assert_eq!(call(&service, req(&[])).unwrap().status(), StatusCode::OK);
    let refused = call(&service, req(&[])).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        admits.net("k"),
        1,
        "only the first request's permit is held"
    );
    let (admitted, net, left) = seen.lock().unwrap().unwrap();
    assert_eq!(admitted, 1, "the hook sees the admitting policy's decision");
    assert_eq!(
        (net, left),
        (1, 4),
        "inside the hook, the listed admission has already been given back"
    );
}

fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for p in permutations(n - 1) {
        for at in 0..=p.len() {
            let mut q = p.clone();
            q.insert(at, n - 1);
            out.push(q);
        }
    }
    out
}

/// Promise: all-or-nothing, in every order: a count_if policy that decides later, a shadow that
/// would refuse, a policy the request costs nothing, a waiting policy (`max_wait`), a failing
/// policy (the layer fails open), and, in half the runs, a policy the request costs more than it
/// can ever admit. With the unadmittable policy: a 429 without `Retry-After` naming only it, at
/// once (no wait), and nothing spent anywhere (the waiting policy's reservation comes back).
/// Without it: the request waits exactly for the waiting policy's permit, the count_if permit
/// comes back after a response that does not count, the shadow and the failing policy stay out
/// of the headers.
#[tokio::test(start_paused = true)]
async fn a_mixed_chain_in_every_order_is_all_or_nothing() {
    const NAMES: [&str; 6] = ["counted", "shadow", "free", "waiting", "failing", "huge"];
    for with_huge in [false, true] {
        let kinds = if with_huge { 6 } else { 5 };
        for order in permutations(kinds) {
            let clock = ManualClock::new();
            let accts: Vec<Acct> = (0..6)
                .map(|kind| match NAMES[kind] {
                    "counted" => log(5, &clock, Mode::Later(1)),
                    "waiting" => waiting_log(Quota::per_second(1).unwrap(), Duration::from_secs(2)),
                    "failing" => log(5, &clock, Mode::LaterFail(1)),
                    _ => log(1, &clock, Mode::Now),
                })
                .collect();
            let key = "k".to_owned();
            for kind in [1, 3] {
                // The shadow would refuse; the waiting policy waits for its next permit.
                let d = accts[kind].inner.reserve_now(&key, 1).unwrap().unwrap();
                assert!(d.allowed && d.wait.is_zero());
            }
            let policies: Vec<Policy<K, Acct>> = order
                .iter()
                .enumerate()
                .map(|(i, &kind)| {
                    let p = Policy::new(NAMES[kind], K(i), accts[kind].clone()).unwrap();
                    match NAMES[kind] {
                        "counted" => p.count_if(|r| r.status == StatusCode::UNAUTHORIZED),
                        "shadow" => p.shadow(),
                        "free" => p.cost(0),
                        "huge" => p.cost(u32::MAX),
                        _ => p,
                    }
                })
                .collect();
            let inner = Inner::default();
            let service = svc(
                RateLimitLayer::new(policies)
                    .limiter_error_mode(FailMode::Open)
                    .with_legacy_headers(),
                &inner,
            );
            let start = tokio::time::Instant::now();
            let response = service.oneshot(req(&[])).await.unwrap();
            let waited = start.elapsed();
            let what = format!(
                "order {:?}",
                order.iter().map(|&k| NAMES[k]).collect::<Vec<_>>()
            );
            let in_order = |kinds: &[&str]| -> Vec<String> {
                order
                    .iter()
                    .map(|&k| NAMES[k])
                    .filter(|n| kinds.contains(n))
                    .map(str::to_owned)
                    .collect()
            };
            let nets: Vec<i64> = accts.iter().map(|a| a.net("k")).collect();
            assert_eq!(accts[2].asked(), 0, "{what}: the free policy was asked");
            assert_eq!(accts[4].asked(), 1, "{what}: the failing policy");
            for a in &accts {
                assert_eq!(a.bad_refunds(), 0, "{what}");
            }
            if with_huge {
                assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE, "{what}");
                assert_eq!(waited, Duration::ZERO, "{what}: a refused request waited");
                assert_eq!(retry_after(&response), None, "{what}");
                assert!(response.headers().get("x-ratelimit-limit").is_none());
                // (Whether the free policy is listed is `a_zero_cost_policy_is_left_out...`'s
                // business.)
                let mut listed = sf_names(response.headers(), "ratelimit-policy");
                listed.retain(|n| n != "free");
                assert_eq!(
                    listed,
                    in_order(&["counted", "waiting", "failing", "huge"]),
                    "{what}"
                );
                assert!(sf_names(response.headers(), "ratelimit").is_empty());
                assert_eq!(violated(&body_json(response)), ["huge"], "{what}");
                assert_eq!(nets, [0; 6], "{what}: spent by a refused request");
                assert_eq!(inner.calls(), 0);
            } else {
                assert_eq!(response.status(), StatusCode::OK, "{what}");
                assert_eq!(waited, Duration::from_secs(1), "{what}");
                assert_eq!(
                    sf_names(response.headers(), "ratelimit"),
                    in_order(&["counted", "waiting"]),
                    "{what}"
                );
                assert_eq!(nets, [0, 0, 0, 1, 0, 0], "{what}: what the request kept");
            }
        }
    }
}
