//! The HTTP layer's ledger: every layer shape (1, 2, 4, 5, 8 policies, shadows, `count_if`,
//! limiters that decide later, missing keys, exempt paths) decides all-or-nothing exactly as a
//! twin model does, with the exact remainings in its headers.

use crate::common::manual_clock_at;
use crate::common::{in_bursts_of, paused_runtime, waits_up_to, Rng};
use crate::support::{header_cost, keyed, Slow};
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{HeaderValue, Request, StatusCode};
use tower::ServiceExt;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::head::RequestHead;
use tower_bulwark::limiter::BoxLimiter;
use tower_bulwark::limiter::Decision;
use tower_bulwark::rate_limit::{FailMode, HeaderKey, Policy, RateLimitLayer};
use tower_bulwark::{Limiter, Quota};

use super::response_states_support::*;

// ---------------------------------------------------------------------------------------------
// The ledger: 1, 2, 4, 5 and 8 policies, against a twin model
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Shadowing {
    Off,
    Silent,
    Advertised,
}

/// One policy of a layer under test.
#[derive(Clone, Debug)]
struct Spec {
    quota: Quota,
    /// The `q` its `RateLimit-Policy` advertises.
    q: u64,
    shadow: Shadowing,
    count_if: bool,
    /// Decided through a limiter that needs "I/O" (the response future's deferred way).
    slow: bool,
}

fn random_spec(rng: &mut Rng, plain: bool) -> Spec {
    let (quota, q) = match rng.below(3) {
        0 => {
            let permits = 2 + rng.below(4) as u32;
            (Quota::per_minute(permits).unwrap(), u64::from(permits))
        }
        // Waits: a burst of two, then reservations up to two seconds ahead.
        1 => (
            waits_up_to(
                in_bursts_of(Quota::per_second(1).unwrap(), 2),
                Duration::from_secs(2),
            ),
            1,
        ),
        _ => (Quota::per_minute(3).unwrap().with_burst(5).unwrap(), 3),
    };
    let shadow = match rng.below(5) {
        0 => Shadowing::Silent,
        1 => Shadowing::Advertised,
        _ => Shadowing::Off,
    };
    Spec {
        quota,
        q,
        shadow,
        count_if: !plain && rng.below(4) == 0,
        slow: !plain && rng.below(4) == 0,
    }
}

/// What the twin model says one policy made of a request.
enum Modeled {
    Skipped,
    Admitted {
        decision: Decision,
        key: HeaderValue,
        cost: u32,
    },
    /// Refused, with what the policy has left (as its `r`).
    Refused(u64),
    Unadmittable,
    /// Admitted, then given back (vetoed, or not counted): took part, decides nothing.
    GivenBack,
}

impl Modeled {
    /// Gives an admission back to its twin limiter `twin`, leaving it `GivenBack`.
    fn give_back_to(&mut self, twin: &Keyed) {
        let Modeled::Admitted {
            decision,
            key,
            cost,
        } = std::mem::replace(self, Modeled::GivenBack)
        else {
            unreachable!("only an admission is given back")
        };
        twin.refund(&key, cost, decision);
    }
}

/// Layers of 1, 2, 4, 5 and 8 policies (inside and past the ledger's four inline slots), each
/// policy with a random quota (some that make requests wait), shadow mode (silent or advertised), `count_if`, a limiter that decides
/// later or at once; requests with random costs (0 skips, 9 can never be admitted), missing
/// keys (fail open or closed), exempt paths, and a clock that moves. After every request, every
/// policy's limiter state equals a twin's that saw only what the model says was spent: a
/// request refused by any policy spends nothing anywhere, the 429 names exactly the violated
/// policies, and the headers list exactly the policies that took part, with exact remainings.
#[test]
fn every_layer_shape_decides_all_or_nothing_as_the_model_does() {
    for n in [1usize, 2, 4, 5, 8] {
        for seed in 0..6u64 {
            let mut rng = Rng(0x5eed_0000 + 977 * n as u64 + seed);
            let mode = if seed % 2 == 0 {
                FailMode::Closed
            } else {
                FailMode::Open
            };
            let headers_on = seed % 3 != 2;
            // With one policy, half the seeds have neither `count_if` nor a limiter that decides
            // later.
            let specs: Vec<Spec> = (0..n)
                .map(|_| random_spec(&mut rng, n == 1 && seed < 3))
                .collect();
            let clock = manual_clock_at(Duration::from_secs(1));
            let reals: Vec<Keyed> = specs.iter().map(|s| keyed(s.quota, &clock)).collect();
            let twins: Vec<Keyed> = specs.iter().map(|s| keyed(s.quota, &clock)).collect();
            let policies: Vec<Policy<HeaderKey, BoxLimiter<HeaderValue>>> = specs
                .iter()
                .zip(&reals)
                .enumerate()
                .map(|(i, (spec, real))| {
                    let limiter = if spec.slow {
                        BoxLimiter::new(Slow::new(real.clone(), 1, false))
                    } else {
                        BoxLimiter::new(real.clone())
                    };
                    let key = HeaderKey::new(format!("x-k{i}")).unwrap();
                    let mut policy = Policy::new(format!("p{i}"), key, limiter)
                        .unwrap()
                        .cost_by(header_cost(format!("x-c{i}")));
                    if spec.count_if {
                        policy = policy.count_if(|parts| parts.status.is_server_error());
                    }
                    match spec.shadow {
                        Shadowing::Off => policy,
                        Shadowing::Silent => policy.shadow(),
                        Shadowing::Advertised => policy.shadow_advertised(),
                    }
                })
                .collect();
            let layer = RateLimitLayer::new(policies)
                .key_error_mode(mode)
                .exempt(|head: &RequestHead<'_>| head.uri.path() == "/health");
            let layer = if headers_on {
                layer
            } else {
                layer.without_admitted_headers()
            };
            let app = Router::new()
                .route("/r", get(answer))
                .route("/health", get(answer))
                .layer(layer);
            let context =
                format!("{n} policies, seed {seed}, {mode:?}, headers {headers_on}, {specs:?}");
            paused_runtime().block_on(run_model(
                &mut rng, &app, &specs, &reals, &twins, &clock, mode, headers_on, &context,
            ));
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_model(
    rng: &mut Rng,
    app: &Router,
    specs: &[Spec],
    reals: &[Keyed],
    twins: &[Keyed],
    clock: &ManualClock,
    mode: FailMode,
    headers_on: bool,
    context: &str,
) {
    let n = specs.len();
    let (mut refusals, mut admissions) = (0, 0);
    for step in 0..250 {
        if rng.below(12) == 0 {
            clock.advance(Duration::from_millis(rng.below(20_000)));
        }
        let exempt = rng.below(20) == 0;
        let answer = if rng.below(3) == 0 { 500u16 } else { 200 };
        let mut request = Request::get(if exempt { "/health" } else { "/r" })
            .header("x-answer", answer.to_string());
        // Per policy: its cost and its key (`None`: the header is missing).
        let mut asks = Vec::new();
        for i in 0..n {
            let cost: u32 = match rng.below(16) {
                0 | 1 => 0,
                2 | 3 => 2,
                4 => 9,
                _ => 1,
            };
            let key = (rng.below(25) != 0).then(|| ["a", "b"][rng.below(2) as usize]);
            request = request.header(format!("x-c{i}"), cost.to_string());
            if let Some(key) = key {
                request = request.header(format!("x-k{i}"), key);
            }
            asks.push((cost, key));
        }
        let request = request.body(Body::empty()).unwrap();
        let ctx =
            format!("{context}, step {step}, asks {asks:?}, answer {answer}, exempt {exempt}");

        // The model.
        let mut modeled: Vec<Modeled> = Vec::new();
        let mut key_error = false;
        if !exempt {
            for (i, &(cost, key)) in asks.iter().enumerate() {
                if cost == 0 {
                    modeled.push(Modeled::Skipped);
                    continue;
                }
                let Some(key) = key else {
                    if mode == FailMode::Closed {
                        key_error = true;
                        break;
                    }
                    modeled.push(Modeled::Skipped);
                    continue;
                };
                let key = HeaderValue::from_static(key);
                modeled.push(match twins[i].reserve_now(&key, cost).unwrap() {
                    Ok(decision) if decision.allowed => Modeled::Admitted {
                        decision,
                        key,
                        cost,
                    },
                    Ok(decision) => Modeled::Refused(decision.remaining.min(specs[i].q)),
                    Err(error) => {
                        assert!(error
                            .downcast_ref::<tower_bulwark::limiter::InsufficientCapacity>()
                            .is_some());
                        Modeled::Unadmittable
                    }
                });
            }
        }
        let enforced = |i: usize| specs[i].shadow == Shadowing::Off;
        let violated: Vec<usize> = (0..modeled.len())
            .filter(|&i| {
                enforced(i) && matches!(modeled[i], Modeled::Refused(_) | Modeled::Unadmittable)
            })
            .collect();
        let refused = !key_error && !violated.is_empty();
        // What each admission reports, once settled; and the wait.
        let mut reported: Vec<Option<u64>> = vec![None; n];
        let mut wait = Duration::ZERO;
        if key_error || refused {
            for i in (0..modeled.len()).rev() {
                if let Modeled::Admitted { .. } = modeled[i] {
                    modeled[i].give_back_to(&twins[i]);
                }
            }
        } else {
            for i in (0..modeled.len()).rev() {
                let (remaining, limit, cost) = match &modeled[i] {
                    Modeled::Admitted { decision, cost, .. } => {
                        if enforced(i) {
                            wait = wait.max(decision.wait);
                        }
                        (decision.remaining, decision.limit, *cost)
                    }
                    _ => continue,
                };
                let mut remaining = remaining;
                if specs[i].count_if && answer != 500 {
                    remaining = (remaining + u64::from(cost)).min(limit);
                    modeled[i].give_back_to(&twins[i]);
                }
                reported[i] = Some(remaining.min(specs[i].q));
            }
        }

        // The layer.
        let started = tokio::time::Instant::now();
        let response = app.clone().oneshot(request).await.unwrap();
        let took = started.elapsed();
        let headers = response.headers().clone();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();

        let advertised = |i: usize| specs[i].shadow != Shadowing::Silent;
        let took_part = |i: usize| i < modeled.len() && !matches!(modeled[i], Modeled::Skipped);
        let policy_names: Vec<String> = (0..n)
            .filter(|&i| advertised(i) && took_part(i))
            .map(|i| format!("p{i}"))
            .collect();
        let got_policy = header_text(&headers, "ratelimit-policy").map(|v| {
            items(&v)
                .into_iter()
                .map(|(name, _)| name)
                .collect::<Vec<_>>()
        });
        let got_ratelimit = header_text(&headers, "ratelimit").map(|v| items(&v));
        if exempt {
            assert_eq!(status.as_u16(), answer, "{ctx}");
            assert_eq!(got_policy, None, "{ctx}");
            assert_eq!(got_ratelimit, None, "{ctx}");
        } else if key_error {
            assert_eq!(status, StatusCode::BAD_REQUEST, "{ctx}");
            assert_eq!(got_ratelimit, None, "{ctx}");
        } else if refused {
            refusals += 1;
            let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let names: Vec<String> = violated.iter().map(|i| format!("p{i}")).collect();
            assert_eq!(json["violated-policies"], serde_json::json!(names), "{ctx}");
            // A 413 without `Retry-After` exactly when a violated policy can never admit the
            // request; a 429 with one otherwise.
            let never = violated
                .iter()
                .any(|&i| matches!(modeled[i], Modeled::Unadmittable));
            let expected = match never {
                true => StatusCode::PAYLOAD_TOO_LARGE,
                false => StatusCode::TOO_MANY_REQUESTS,
            };
            assert_eq!(status, expected, "{ctx}");
            assert_eq!(headers.contains_key("retry-after"), !never, "{ctx}");
            let listed: Vec<(String, u64)> = violated
                .iter()
                .filter_map(|&i| match modeled[i] {
                    // What the refusing policy has left, fewer than the request's cost.
                    Modeled::Refused(left) => Some((format!("p{i}"), left)),
                    _ => None,
                })
                .collect();
            assert_eq!(got_ratelimit.unwrap_or_default(), listed, "{ctx}");
            assert_eq!(
                got_policy.unwrap_or_default(),
                policy_names,
                "RateLimit-Policy of a refusal; {ctx}"
            );
        } else {
            admissions += 1;
            assert_eq!(status.as_u16(), answer, "{ctx}");
            assert_eq!(took, wait, "the request waits for its last permit; {ctx}");
            let listed: Vec<(String, u64)> = (0..modeled.len())
                .filter(|&i| advertised(i))
                .filter_map(|i| match (&modeled[i], reported[i]) {
                    (_, Some(r)) => Some((format!("p{i}"), r)),
                    (Modeled::Refused(left), None) => Some((format!("p{i}"), *left)),
                    _ => None,
                })
                .collect();
            if !headers_on || listed.is_empty() {
                assert_eq!(got_ratelimit, None, "{ctx}");
                assert_eq!(got_policy, None, "{ctx}");
            } else {
                assert_eq!(got_ratelimit, Some(listed), "{ctx}");
                assert_eq!(got_policy, Some(policy_names), "{ctx}");
            }
        }
        // Every limiter is where its twin is.
        for i in 0..n {
            for key in ["a", "b"] {
                assert_eq!(
                    peek(&reals[i], key),
                    peek(&twins[i], key),
                    "policy p{i}, key {key}; {ctx}"
                );
            }
        }
    }
    // The run exercised both ways (a layer of shadow policies alone never refuses).
    let any_enforced = specs.iter().any(|s| s.shadow == Shadowing::Off);
    assert!(
        admissions > 10 && (refusals > 10 || !any_enforced && refusals == 0),
        "{context}: {refusals} refusals, {admissions} admissions"
    );
}
