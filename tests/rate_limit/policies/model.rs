//! Random policy sets and request sequences checked against a model of the permits each key has
//! spent: every decision, every limiter's books and state, the 429's names, the `RateLimit`
//! entries and `Retry-After`, after every request.

use std::collections::HashMap;
use std::task::Poll;

use http::StatusCode;
use proptest::prelude::*;
use tower::Service;
use tower_bulwark::rate_limit::{FailMode, Policy, PolicySet, RateLimitLayer};
use tower_bulwark::{algorithm::FixedWindow, clock::ManualClock, KeyedRateLimiter, Quota};

use super::accounting::{body_json, log, policy, req, svc, Acct, Inner, Mode, K};
use crate::common::listener::{sf_entries, sf_names};
use crate::common::poll_once;
use crate::support::{param, violated};

#[derive(Clone, Copy, Debug)]
enum Count {
    All,
    If500,
    Never,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sh {
    Off,
    Silent,
    Advertised,
}

#[derive(Clone, Copy, Debug)]
enum Algo {
    Log,
    Gcra,
    Window,
}

#[derive(Clone, Debug)]
struct PCfg {
    algo: Algo,
    limit: u32,
    cost: u32,
    count: Count,
    shadow: Sh,
    mode: Mode,
}

#[derive(Clone, Debug)]
struct RCfg {
    key: u8,
    nokey: u8,
    status: u16,
    handler_yields: u8,
    inner_fails: bool,
    drop_after: Option<u8>,
}

fn pcfg() -> impl Strategy<Value = PCfg> {
    (
        prop_oneof![Just(Algo::Log), Just(Algo::Gcra), Just(Algo::Window)],
        1u32..=3,
        prop_oneof![4 => 1u32..=2, 2 => 0u32..=4, 1 => Just(u32::MAX)],
        prop_oneof![Just(Count::All), Just(Count::If500), Just(Count::Never)],
        prop_oneof![3 => Just(Sh::Off), 1 => Just(Sh::Silent), 1 => Just(Sh::Advertised)],
        prop_oneof![
            4 => Just(Mode::Now),
            3 => (0u8..3).prop_map(Mode::Later),
            1 => Just(Mode::Fail),
            1 => (0u8..2).prop_map(Mode::LaterFail),
        ],
    )
        .prop_map(|(algo, limit, cost, count, shadow, mode)| PCfg {
            algo,
            limit,
            cost,
            count,
            shadow,
            mode,
        })
}

fn rcfg() -> impl Strategy<Value = RCfg> {
    (
        0u8..2,
        prop_oneof![4 => Just(0u8), 1 => 0u8..16],
        prop_oneof![Just(200u16), Just(500u16)],
        0u8..3,
        prop::bool::weighted(0.1),
        prop_oneof![3 => Just(None), 2 => (0u8..8).prop_map(Some)],
    )
        .prop_map(
            |(key, nokey, status, handler_yields, inner_fails, drop_after)| RCfg {
                key,
                nokey,
                status,
                handler_yields,
                inner_fails,
                drop_after,
            },
        )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mo {
    Admitted,
    Refused,
    Unadmittable,
    Failed,
    Skipped,
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    KeyError,
    Unavailable,
    TooMany,
    Admit,
}

/// What the layer should decide, from the permits spent per (policy, key).
fn model(
    cfgs: &[PCfg],
    spent: &HashMap<(usize, String), u32>,
    r: &RCfg,
    key_mode: FailMode,
    limiter_mode: FailMode,
) -> (Verdict, Vec<Mo>) {
    let key = key_name(r.key);
    let mut outcomes = Vec::new();
    for (i, c) in cfgs.iter().enumerate() {
        let enforced = c.shadow == Sh::Off;
        if c.cost == 0 {
            outcomes.push(Mo::Skipped);
            continue;
        }
        if r.nokey & (1 << i) != 0 {
            if key_mode == FailMode::Closed {
                return (Verdict::KeyError, outcomes);
            }
            outcomes.push(Mo::Skipped);
            continue;
        }
        if c.mode.fails() {
            if enforced && limiter_mode == FailMode::Closed {
                return (Verdict::Unavailable, outcomes);
            }
            outcomes.push(Mo::Failed);
            continue;
        }
        if c.cost > c.limit {
            outcomes.push(Mo::Unadmittable);
            continue;
        }
        let used = spent.get(&(i, key.clone())).copied().unwrap_or(0);
        outcomes.push(if used + c.cost <= c.limit {
            Mo::Admitted
        } else {
            Mo::Refused
        });
    }
    let refused = cfgs
        .iter()
        .zip(&outcomes)
        .any(|(c, o)| c.shadow == Sh::Off && matches!(o, Mo::Refused | Mo::Unadmittable));
    (
        if refused {
            Verdict::TooMany
        } else {
            Verdict::Admit
        },
        outcomes,
    )
}

fn key_name(k: u8) -> String {
    format!("key{k}")
}

fn build(cfgs: &[PCfg], clock: &ManualClock) -> (Vec<Acct>, Vec<Policy<K, Acct>>) {
    let accts: Vec<Acct> = cfgs
        .iter()
        .map(|c| {
            let builder = KeyedRateLimiter::<String>::builder(Quota::per_hour(c.limit).unwrap())
                .clock(clock.clone());
            match c.algo {
                Algo::Log => log(c.limit, clock, c.mode),
                Algo::Gcra => Acct::new(builder.build(), c.mode),
                Algo::Window => Acct::new(builder.algorithm::<FixedWindow>().build(), c.mode),
            }
        })
        .collect();
    let policies = cfgs
        .iter()
        .zip(&accts)
        .enumerate()
        .map(|(i, (c, a))| {
            let mut p = policy(i, a).cost(c.cost);
            p = match c.count {
                Count::All => p,
                Count::If500 => p.count_if(|r| r.status == StatusCode::INTERNAL_SERVER_ERROR),
                Count::Never => p.count_if(|_| false),
            };
            match c.shadow {
                Sh::Off => p,
                Sh::Silent => p.shadow(),
                Sh::Advertised => p.shadow_advertised(),
            }
        })
        .collect();
    (accts, policies)
}

fn run_sequence<P: PolicySet>(
    cfgs: &[PCfg],
    accts: &[Acct],
    layer: RateLimitLayer<P>,
    requests: &[RCfg],
    key_mode: FailMode,
    limiter_mode: FailMode,
) -> Result<(), TestCaseError> {
    let inner = Inner::default();
    let service = svc(
        layer
            .key_error_mode(key_mode)
            .limiter_error_mode(limiter_mode)
            .with_legacy_headers(),
        &inner,
    );
    let mut spent: HashMap<(usize, String), u32> = HashMap::new();
    for (n, r) in requests.iter().enumerate() {
        let key = key_name(r.key);
        let (verdict, outcomes) = model(cfgs, &spent, r, key_mode, limiter_mode);
        let spent_before = spent.clone();
        let nokey: Vec<String> = (0..cfgs.len())
            .filter(|i| r.nokey & (1 << i) != 0)
            .map(|i| i.to_string())
            .collect();
        let status = r.status.to_string();
        let handler_yields = r.handler_yields.to_string();
        let mut headers = vec![
            ("x-key", key.as_str()),
            ("x-status", status.as_str()),
            ("x-yield", handler_yields.as_str()),
        ];
        let nokey = nokey.join(",");
        if !nokey.is_empty() {
            headers.push(("x-nokey", &nokey));
        }
        if r.inner_fails {
            headers.push(("x-fail", "1"));
        }
        let calls_before = inner.calls();
        let mut s = service.clone();
        let mut future = Box::pin(s.call(req(&headers)));
        let limit = r.drop_after.map_or(10_000, usize::from);
        let mut output = None;
        for _ in 0..limit {
            if let Poll::Ready(out) = poll_once(future.as_mut()) {
                output = Some(out);
                break;
            }
        }
        drop(future);
        let called = inner.calls() - calls_before;
        let what = format!("request {n} {r:?}: verdict {verdict:?} {outcomes:?}");
        prop_assert!(called <= 1);
        if called == 1 {
            prop_assert_eq!(&verdict, &Verdict::Admit, "{}: called", what);
        }
        if r.drop_after.is_none() {
            prop_assert!(output.is_some(), "{}: never resolved", what);
        }
        // What the model keeps.
        let response_status = match &output {
            Some(Ok(response)) => Some(response.status()),
            _ => None,
        };
        if verdict == Verdict::Admit && called == 1 {
            for (i, (c, o)) in cfgs.iter().zip(&outcomes).enumerate() {
                if *o != Mo::Admitted {
                    continue;
                }
                let counts = match (c.count, response_status) {
                    (_, None) | (Count::All, _) => true,
                    (Count::If500, Some(s)) => s == StatusCode::INTERNAL_SERVER_ERROR,
                    (Count::Never, Some(_)) => false,
                };
                if counts {
                    *spent.entry((i, key.clone())).or_default() += c.cost;
                }
            }
        }
        // The books and the limiters agree with the model.
        for (i, (a, c)) in accts.iter().zip(cfgs).enumerate() {
            prop_assert_eq!(
                a.bad_refunds(),
                0,
                "{}: policy {} refunded a refusal",
                what,
                i
            );
            for k in 0..2 {
                let key = key_name(k);
                let expect = spent.get(&(i, key.clone())).copied().unwrap_or(0);
                prop_assert_eq!(
                    a.net(&key),
                    i64::from(expect),
                    "{}: policy {} key {} books",
                    what,
                    i,
                    key
                );
                prop_assert_eq!(
                    a.probe(&key),
                    c.limit - expect,
                    "{}: policy {} key {} state",
                    what,
                    i,
                    key
                );
            }
        }
        // The answer.
        let Some(Ok(response)) = output else {
            continue;
        };
        let headers = response.headers().clone();
        match verdict {
            Verdict::KeyError => {
                prop_assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{}", what);
                prop_assert!(headers.get("ratelimit").is_none());
            }
            Verdict::Unavailable => {
                prop_assert_eq!(
                    response.status(),
                    StatusCode::SERVICE_UNAVAILABLE,
                    "{}",
                    what
                );
                prop_assert!(headers.get("ratelimit").is_none());
            }
            Verdict::TooMany => {
                let enforced = |o: &[Mo]| -> Vec<String> {
                    cfgs.iter()
                        .zip(&outcomes)
                        .enumerate()
                        .filter(|(_, (c, out))| c.shadow == Sh::Off && o.contains(out))
                        .map(|(i, _)| format!("p{i}"))
                        .collect()
                };
                // A 413 when a violated policy can never admit the request, a 429 otherwise.
                let status = match enforced(&[Mo::Unadmittable]).is_empty() {
                    true => StatusCode::TOO_MANY_REQUESTS,
                    false => StatusCode::PAYLOAD_TOO_LARGE,
                };
                prop_assert_eq!(response.status(), status, "{}", what);
                let json = body_json(response);
                prop_assert_eq!(
                    violated(&json),
                    enforced(&[Mo::Refused, Mo::Unadmittable]),
                    "{}",
                    what
                );
                let entries = sf_entries(&headers, "ratelimit");
                let names: Vec<String> = entries.iter().map(|e| e.0.clone()).collect();
                prop_assert_eq!(&names, &enforced(&[Mo::Refused]), "{}", what);
                let unadmittable = !enforced(&[Mo::Unadmittable]).is_empty();
                let retry = headers
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().parse::<i64>().unwrap());
                if unadmittable {
                    prop_assert_eq!(retry, None, "{}", what);
                } else {
                    let longest = entries.iter().map(|e| param(e, "t")).max();
                    prop_assert_eq!(retry, longest, "{}", what);
                    prop_assert!(retry.unwrap() >= 1);
                }
                // A refusing policy tells what it has left, fewer than the request's cost.
                for e in &entries {
                    let i: usize = e.0[1..].parse().unwrap();
                    let before = spent_before.get(&(i, key.clone())).copied().unwrap_or(0);
                    prop_assert_eq!(param(e, "r"), i64::from(cfgs[i].limit - before), "{}", what);
                }
            }
            Verdict::Admit => {
                let expect_status = StatusCode::from_u16(r.status).unwrap();
                prop_assert_eq!(response.status(), expect_status, "{}", what);
                let entries = sf_entries(&headers, "ratelimit");
                let expect: Vec<(String, i64)> = cfgs
                    .iter()
                    .zip(&outcomes)
                    .enumerate()
                    .filter(|(_, (c, _))| c.shadow != Sh::Silent)
                    .filter_map(|(i, (c, o))| match o {
                        Mo::Admitted => {
                            let before = spent_before.get(&(i, key.clone())).copied().unwrap_or(0);
                            // A response the policy does not count gave its permits back
                            // before the header was written.
                            let counts = match c.count {
                                Count::All => true,
                                Count::If500 => r.status == 500,
                                Count::Never => false,
                            };
                            let spent = if counts { c.cost } else { 0 };
                            Some((format!("p{i}"), i64::from(c.limit - before - spent)))
                        }
                        Mo::Refused => {
                            let before = spent_before.get(&(i, key.clone())).copied().unwrap_or(0);
                            Some((format!("p{i}"), i64::from(c.limit - before)))
                        }
                        _ => None,
                    })
                    .collect();
                let got: Vec<(String, i64)> = entries
                    .iter()
                    .map(|e| (e.0.clone(), param(e, "r")))
                    .collect();
                prop_assert_eq!(&got, &expect, "{}", what);
                // RateLimit-Policy: the advertised policies, in order, at least those in
                // RateLimit and every one the request cost something (whether a policy it cost
                // nothing is listed is `a_zero_cost_policy_is_left_out...`'s business).
                let must: Vec<String> = cfgs
                    .iter()
                    .zip(&outcomes)
                    .enumerate()
                    .filter(|(_, (c, o))| c.shadow != Sh::Silent && !matches!(o, Mo::Skipped))
                    .map(|(i, _)| format!("p{i}"))
                    .collect();
                let may: Vec<String> = cfgs
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.shadow != Sh::Silent)
                    .map(|(i, _)| format!("p{i}"))
                    .collect();
                let mut policy_names = sf_names(&headers, "ratelimit-policy");
                if entries.is_empty() {
                    prop_assert!(policy_names.is_empty(), "{}", what);
                } else {
                    prop_assert!(
                        policy_names.iter().all(|n| may.contains(n)),
                        "{}: {:?}",
                        what,
                        policy_names
                    );
                    policy_names.retain(|n| must.contains(n));
                    prop_assert_eq!(policy_names, must, "{}", what);
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    /// Promise: all-or-nothing decisions, count_if refunds exactly when the response does not
    /// count, shadows never refuse nor answer 503, costs above the burst spend nothing, key
    /// errors give back what earlier policies granted, drops give back exactly once before the
    /// call and keep everything after: random policies and requests against a model of the
    /// permits each key has spent (sliding logs, GCRA and fixed windows on a frozen clock, one
    /// limiter per policy, refund exactly), with the
    /// 429's names, `RateLimit` entries and `Retry-After` checked against the model.
    #[test]
    fn random_sequences_match_the_model(
        cfgs in prop::collection::vec(pcfg(), 1..=4),
        requests in prop::collection::vec(rcfg(), 1..24),
        key_open in any::<bool>(),
        limiter_open in any::<bool>(),
        nested in any::<bool>(),
    ) {
        let clock = ManualClock::new();
        let (accts, mut policies) = build(&cfgs, &clock);
        let key_mode = if key_open { FailMode::Open } else { FailMode::Closed };
        let limiter_mode = if limiter_open { FailMode::Open } else { FailMode::Closed };
        if nested && policies.len() >= 2 {
            // A policy chained with a Vec of the others.
            let rest = policies.split_off(1);
            let first = policies.pop().unwrap();
            let layer = RateLimitLayer::new(first.and(rest));
            run_sequence(&cfgs, &accts, layer, &requests, key_mode, limiter_mode)?;
        } else {
            let layer = RateLimitLayer::new(policies);
            run_sequence(&cfgs, &accts, layer, &requests, key_mode, limiter_mode)?;
        }
    }
}
