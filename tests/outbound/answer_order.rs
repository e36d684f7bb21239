//! Pushback under answers delivered in any order (tokio's paused time): calls start, their
//! answers (one or several `RateLimit` quotas with or without a policy, 429s with
//! `Retry-After`) come back in a
//! random order at random times, and probe calls keep knocking. Every quota bounds the probes
//! from its arrival until a newer answer arrives (one to a call sent after every answer before
//! it had arrived): any other answer may only tighten, so its bound holds too. And four workers
//! call a dependency that counts their calls in an order of its own. A refused probe is told when a call can really go: a call made then,
//! with nothing new heard in between, reaches the dependency.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use http::Response;
use proptest::prelude::*;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::clock::TokioClock;
use tower_bulwark::outbound::pushback::Pacing;
use tower_bulwark::outbound::{self, Pushback, PushedBack};
use tower_bulwark::BoxError;

use crate::common::{paused_runtime, poll_once, response, tokio_direct};

/// One `RateLimit` quota of a scripted answer: `r` and `t`, and its policy's `q` and `w`.
#[derive(Clone, Debug)]
struct Quota {
    left: u64,
    window: u64,
    policy: Option<(u64, u64)>,
}

/// What one scripted call's answer says.
#[derive(Clone, Debug)]
enum Answer {
    /// `200` with a `RateLimit` item `"pN";r=R;t=T` for the N-th quota, and a
    /// `RateLimit-Policy` item `"pN";q=Q;w=W` for each that has a policy.
    Quotas(Vec<Quota>),
    /// `429` with `Retry-After: S`.
    Hold { seconds: u64 },
}

impl Answer {
    fn response(&self) -> Response<()> {
        match self {
            Answer::Quotas(quotas) => {
                let items = |item: &dyn Fn(&Quota) -> Option<String>| {
                    let items = quotas
                        .iter()
                        .enumerate()
                        .filter_map(|(n, quota)| Some(format!("\"p{n}\";{}", item(quota)?)));
                    items.collect::<Vec<_>>().join(", ")
                };
                let ratelimit =
                    items(&|quota| Some(format!("r={};t={}", quota.left, quota.window)));
                let policies = items(&|quota| {
                    let (q, w) = quota.policy?;
                    Some(format!("q={q};w={w}"))
                });
                let mut fields = vec![("ratelimit", ratelimit.as_str())];
                if !policies.is_empty() {
                    fields.push(("ratelimit-policy", policies.as_str()));
                }
                response(200, &fields)
            }
            Answer::Hold { seconds } => response(429, &[("retry-after", &seconds.to_string())]),
        }
    }

    /// From its arrival: for each quota or hold, how long it bounds the calls, and how many
    /// it lets start then.
    fn bounds(&self) -> Vec<(Duration, u64)> {
        match self {
            Answer::Quotas(quotas) => (quotas.iter())
                .map(|quota| (Duration::from_secs(quota.window), quota.left))
                .collect(),
            Answer::Hold { seconds } => vec![(Duration::from_secs(*seconds), 0)],
        }
    }
}

fn answer() -> impl Strategy<Value = Answer> {
    // A policy may grant nothing, or no more than the calls in flight (up to three), so that
    // its next windows have nothing to give.
    let quota = (0u64..4, 1u64..20, proptest::option::of((0u64..9, 1u64..20))).prop_map(
        |(left, window, policy)| Quota {
            left,
            window,
            policy,
        },
    );
    prop_oneof![
        3 => quota.clone().prop_map(|quota| Answer::Quotas(vec![quota])),
        // Several quotas in one answer each bound the calls.
        2 => proptest::collection::vec(quota, 2..4).prop_map(Answer::Quotas),
        1 => (1u64..15).prop_map(|seconds| Answer::Hold { seconds }),
    ]
}

type Call = Pin<Box<dyn Future<Output = Result<Response<()>, BoxError>> + Send>>;

struct Run {
    /// When each scripted call started.
    started: Vec<Instant>,
    /// When each probe reached the dependency.
    reached: Vec<Instant>,
    /// Each answer: its call's start order, when it arrived, and what it said.
    delivered: Vec<(usize, Instant, Answer)>,
}

fn run(answers: &[Answer], order: &[usize], gaps: &[u64], step: u64, spread: bool) -> Run {
    paused_runtime().block_on(async {
        let pushback = Pushback::builder("partner")
            .clock(TokioClock::new())
            .pacing(if spread {
                Pacing::Spread
            } else {
                Pacing::UntilSpent
            })
            .build();
        let start = Instant::now();
        let reached = Arc::new(Mutex::new(Vec::new()));
        // A call's request is the channel its answer comes on; a probe's sender is dropped, so
        // the dependency fails it at once: it reached the dependency and says nothing.
        let dependency = {
            let reached = reached.clone();
            service_fn(move |answer: oneshot::Receiver<Response<()>>| {
                reached.lock().unwrap().push(Instant::now());
                async move { Ok::<_, BoxError>(answer.await?) }
            })
        };
        let client = pushback.layer().layer(dependency);
        // The scripted calls start in order, 10 ms apart, and wait at the dependency.
        let mut calls: Vec<Option<(oneshot::Sender<Response<()>>, Call)>> = Vec::new();
        let mut started = Vec::new();
        for _ in answers {
            started.push(Instant::now());
            let (tx, rx) = oneshot::channel();
            let mut call: Call = Box::pin(client.clone().oneshot(rx));
            assert!(
                poll_once(call.as_mut()).is_pending(),
                "a scripted call was held"
            );
            calls.push(Some((tx, call)));
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        reached.lock().unwrap().clear();
        // Answers arrive in `order`, `gaps` apart; probes every `step` ms in between, and one
        // more exactly when a refused probe was told it could go.
        let mut deliveries = Vec::new();
        let mut at = Instant::now();
        for (i, &call) in order.iter().enumerate() {
            at += Duration::from_millis(gaps[i % gaps.len()]);
            deliveries.push((at, call));
        }
        let horizon = at + Duration::from_secs(25);
        let mut delivered = Vec::new();
        let mut next_probe = Instant::now();
        let mut promised: Option<(Instant, Duration)> = None;
        let mut next_delivery = 0;
        loop {
            let delivery_at = deliveries.get(next_delivery).map(|(at, _)| *at);
            let now = [Some(next_probe), delivery_at, promised.map(|(at, _)| at)]
                .into_iter()
                .flatten()
                .min()
                .unwrap();
            if now > horizon {
                break;
            }
            // To the nanosecond: a sleep would wake on the timer's next millisecond, after the
            // instant a refusal names (a slot can end a fraction of a millisecond after it).
            tokio::time::advance(now.saturating_duration_since(Instant::now())).await;
            if delivery_at == Some(now) {
                let (_, call) = deliveries[next_delivery];
                next_delivery += 1;
                let (tx, mut future) = calls[call].take().unwrap();
                tx.send(answers[call].response()).unwrap();
                assert!(matches!(poll_once(future.as_mut()), Poll::Ready(Ok(_))));
                delivered.push((call, now, answers[call].clone()));
                // What was promised before this answer no longer has to hold.
                promised = None;
                continue;
            }
            let is_promised = promised.is_some_and(|(at, _)| at == now);
            if !is_promised {
                next_probe = now + Duration::from_millis(step);
            }
            let (tx, rx) = oneshot::channel::<Response<()>>();
            drop(tx);
            let mut probe = Box::pin(client.clone().oneshot(rx));
            let Poll::Ready(result) = poll_once(probe.as_mut()) else {
                panic!("a probe neither went nor was refused at once");
            };
            let refusal = result.err().filter(|err| err.is::<PushedBack>());
            if let Some((_, told)) = promised.filter(|_| is_promised) {
                assert!(
                    refusal.is_none(),
                    "told at {:?} to come back in {told:?}; refused again at {:?}: {}",
                    now - told - start,
                    now - start,
                    refusal.unwrap()
                );
                promised = None;
            }
            if let Some(err) = refusal {
                let wait = outbound::retry_after(&*err).expect("a refusal says how long");
                assert!(!wait.is_zero(), "refused with a wait of zero");
                let until = now + wait;
                let quiet = delivery_at.is_none_or(|at| at > until);
                // Nothing new was heard since an earlier refusal: this one may not push the
                // time it promised further out.
                if let Some((earlier, told)) = promised {
                    assert!(
                        until <= earlier,
                        "told at {:?} to come back in {told:?}, then at {:?} to wait {wait:?}",
                        earlier - told - start,
                        now - start
                    );
                }
                if quiet && until <= horizon {
                    promised = Some((until, wait));
                }
            }
        }
        let reached = reached.lock().unwrap().clone();
        Run {
            started,
            reached,
            delivered,
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn answers_out_of_order_never_let_more_calls_through_than_any_allows(
        answers in proptest::collection::vec(answer(), 2..5),
        shuffle in any::<u64>(),
        gaps in proptest::collection::vec(0u64..4_000, 1..5),
        step in 50u64..900,
        spread in any::<bool>(),
    ) {
        let mut order: Vec<usize> = (0..answers.len()).collect();
        let mut rng = crate::common::Rng(shuffle | 1);
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let run = run(&answers, &order, &gaps, step, spread);
        // Each quota (or hold) of an answer bounds the calls from its arrival until its window
        // ends or a newer answer arrives, whichever comes first: one to a call sent after every
        // answer before it had arrived.
        let each_bound = run.delivered.iter().enumerate().flat_map(|(k, delivered)| {
            delivered.2.bounds().into_iter().map(move |bound| (k, delivered, bound))
        });
        for (k, (call, arrived, answer), (span, most)) in each_bound {
            let superseded = (k + 1..run.delivered.len())
                .find(|&j| run.started[run.delivered[j].0] > run.delivered[j - 1].1)
                .map(|j| run.delivered[j].1);
            let end = superseded.map_or(*arrived + span, |at| at.min(*arrived + span));
            let within = run
                .reached
                .iter()
                .filter(|at| **at >= *arrived && **at < end)
                .count() as u64;
            prop_assert!(
                within <= most,
                "{within} calls within {:?} of answer {answer:?} (call {call}, order {order:?}, \
                 all {:?}) that allows {most}",
                end - *arrived,
                run.delivered,
            );
        }
    }
}

/// The time a refused call is told to wait covers the policy's next window when that window
/// has nothing to give: its `q` is zero, or no more than the calls still in flight, which the
/// docs subtract from it. Told to come back when the spent window ends, a call is refused there
/// again, for the policy's whole `w`, with nothing new heard in between.
#[test]
fn a_policy_window_with_nothing_to_give_is_part_of_the_wait() {
    for (q, in_flight) in [(0u64, 0usize), (1, 1), (2, 2)] {
        let told = paused_runtime().block_on(async {
            let pushback = crate::hostile_support::on_tokio_clock();
            let dependency = service_fn(|answer: oneshot::Receiver<Response<()>>| async move {
                Ok::<_, BoxError>(answer.await?)
            });
            let client = pushback.layer().layer(dependency);
            let mut pending = Vec::new();
            for _ in 0..in_flight {
                let (tx, rx) = oneshot::channel();
                let mut call: Call = Box::pin(client.clone().oneshot(rx));
                assert!(poll_once(call.as_mut()).is_pending());
                pending.push((tx, call));
            }
            let (tx, rx) = oneshot::channel();
            let mut answered: Call = Box::pin(client.clone().oneshot(rx));
            assert!(poll_once(answered.as_mut()).is_pending());
            tx.send(response(
                200,
                &[
                    ("ratelimit", r#""p";r=0;t=1"#),
                    ("ratelimit-policy", &format!("\"p\";q={q};w=10")),
                ],
            ))
            .unwrap();
            assert!(matches!(poll_once(answered.as_mut()), Poll::Ready(Ok(_))));
            let probe = || {
                let (tx, rx) = oneshot::channel::<Response<()>>();
                drop(tx);
                let mut call = Box::pin(client.clone().oneshot(rx));
                match poll_once(call.as_mut()) {
                    Poll::Ready(Err(err)) if err.is::<PushedBack>() => outbound::retry_after(&*err),
                    Poll::Ready(_) => None,
                    Poll::Pending => panic!("a probe neither went nor was refused at once"),
                }
            };
            let told = probe().expect("refused while the window is spent");
            tokio::time::advance(told).await;
            (told, probe())
        });
        assert_eq!(
            told.1, None,
            "q={q} with {in_flight} in flight: told to wait {:?}, then refused again",
            told.0
        );
    }
}

/// What four workers saw of a dependency that counts calls in an order of its own.
#[derive(Debug)]
struct Busy {
    admitted: u64,
    refused: u64,
}

/// Four workers call, through the pushback, a dependency that limits them by `quotas` (this
/// crate's own `RateLimitLayer`, one policy each, whose `RateLimit` fields the pushback reads), over a
/// path that delays each request and each answer by 0–15 ms at random: the dependency counts
/// concurrent calls in an order of its own, and their answers come back in yet another. A
/// worker told to wait sleeps that long and calls again. For `seconds` of tokio's paused time.
fn four_workers_through_a_reordering_path(
    seed: u64,
    seconds: u64,
    quotas: &[(&str, tower_bulwark::Quota)],
) -> Busy {
    use std::sync::atomic::{AtomicU64, Ordering};
    use tower_bulwark::{GlobalKey, Policy, RateLimitLayer};

    let policies: Vec<_> = (quotas.iter())
        .map(|(name, quota)| Policy::new(*name, GlobalKey, tokio_direct(*quota)).unwrap())
        .collect();
    paused_runtime().block_on(async move {
        let server =
            RateLimitLayer::new(policies).layer(service_fn(|_: http::Request<()>| async {
                Ok::<_, BoxError>(Response::new(bytes::Bytes::new()))
            }));
        let rng = Arc::new(Mutex::new(crate::common::Rng(seed | 1)));
        let (admitted, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let path = {
            let (admitted, refused) = (admitted.clone(), refused.clone());
            service_fn(move |request: http::Request<()>| {
                let (server, rng) = (server.clone(), rng.clone());
                let (admitted, refused) = (admitted.clone(), refused.clone());
                async move {
                    let (there, back) = {
                        let mut rng = rng.lock().unwrap();
                        (rng.below(15_001), rng.below(15_001))
                    };
                    tokio::time::sleep(Duration::from_micros(there)).await;
                    let response = server.oneshot(request).await?;
                    match response.status().as_u16() {
                        200 => admitted.fetch_add(1, Ordering::Relaxed),
                        _ => refused.fetch_add(1, Ordering::Relaxed),
                    };
                    tokio::time::sleep(Duration::from_micros(back)).await;
                    Ok::<_, BoxError>(response)
                }
            })
        };
        let pushback = crate::hostile_support::on_tokio_clock();
        let client = pushback.layer().layer(path);
        let end = Instant::now() + Duration::from_secs(seconds);
        // The workers run on the test's own task: the runtime has one thread anyway.
        let worker = |client: tower_bulwark::outbound::pushback::PushbackService<_, _>| async move {
            while Instant::now() < end {
                if let Err(err) = client.clone().oneshot(http::Request::new(())).await {
                    let wait = outbound::retry_after(&*err).expect("only held back");
                    tokio::time::sleep(wait).await;
                }
            }
        };
        futures::future::join_all((0..4).map(|_| worker(client.clone()))).await;
        Busy {
            admitted: admitted.load(Ordering::Relaxed),
            refused: refused.load(Ordering::Relaxed),
        }
    })
}

/// An answer replaces the quota in force only if its call was sent after that quota's answer
/// was received: with calls counted and answered out of order, no call goes out into a `429`,
/// and the quota is still used (at least two thirds of the 5 a second).
#[test]
fn calls_counted_in_the_dependencys_own_order_never_go_out_into_a_refusal() {
    const SECONDS: u64 = 10;
    let quotas = [("per-client", tower_bulwark::Quota::per_second(5).unwrap())];
    for seed in 0..200 {
        let busy = four_workers_through_a_reordering_path(seed, SECONDS, &quotas);
        assert_eq!(busy.refused, 0, "seed {seed}: {busy:?}");
        assert!(
            busy.admitted * 3 >= 5 * SECONDS * 2,
            "seed {seed}: the quota went unused: {busy:?}"
        );
    }
}

/// The same with two policies at the dependency, 5 calls a second and 20 in 10 s (then one
/// every half second): no call goes out into a `429` though each answer advertises both, and
/// the slower quota is still used (at least half of its 20 + 2 a second: 25 to 34 of 40 in
/// 10 s over these seeds).
#[test]
fn two_quotas_counted_in_the_dependencys_own_order_never_go_out_into_a_refusal() {
    const SECONDS: u64 = 10;
    let quotas = [
        ("per-second", tower_bulwark::Quota::per_second(5).unwrap()),
        (
            "per-ten-seconds",
            tower_bulwark::Quota::with_period(20, Duration::from_secs(10)).unwrap(),
        ),
    ];
    for seed in 0..100 {
        let busy = four_workers_through_a_reordering_path(seed, SECONDS, &quotas);
        assert_eq!(busy.refused, 0, "seed {seed}: {busy:?}");
        assert!(
            busy.admitted * 2 >= 20 + 2 * SECONDS,
            "seed {seed}: the quota went unused: {busy:?}"
        );
    }
}

/// The same over a real listener, as the user who found it ran it: four workers with one
/// `reqwest::Client` (its pool sends a later call on a warm connection while earlier ones
/// still connect) call an axum server that allows 5 calls a second in all (`RateLimitLayer`,
/// whose answers the pushback reads), each request and answer delayed by 0–15 ms there. Over
/// 3 s, no call goes out into a 429, and at least two thirds of the quota (5 a second after the
/// burst of 5) is used.
#[cfg(all(feature = "axum", feature = "reqwest"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_with_one_pooled_client_never_call_into_a_refusal() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use tower_bulwark::{DirectRateLimiter, GlobalKey, Policy, Quota, RateLimitLayer};

    let rng = Arc::new(Mutex::new(crate::common::Rng(0x5EED)));
    let delay = move || {
        let micros = rng.lock().unwrap().below(15_001);
        tokio::time::sleep(Duration::from_micros(micros))
    };
    let app = axum::Router::new()
        .route("/items", axum::routing::get(|| async { "items" }))
        .route_layer(RateLimitLayer::new(
            Policy::new(
                "all",
                GlobalKey,
                DirectRateLimiter::new(Quota::per_second(5).unwrap()),
            )
            .unwrap(),
        ))
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let delay = delay.clone();
                async move {
                    delay().await;
                    let response = next.run(request).await;
                    delay().await;
                    response
                }
            },
        ));
    let addr = crate::common::listener::serve(app).await;
    let pushback = Pushback::new("partner");
    let client = pushback.layer().layer(reqwest::Client::new());
    let url: reqwest::Url = format!("http://{addr}/items").parse().unwrap();
    let (ok, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let end = Instant::now() + Duration::from_secs(3);
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            let (ok, refused) = (ok.clone(), refused.clone());
            tokio::spawn(async move {
                while Instant::now() < end {
                    let request = reqwest::Request::new(reqwest::Method::GET, url.clone());
                    match client.clone().oneshot(request).await {
                        Ok(response) if response.status() == 200 => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(response) => {
                            assert_eq!(response.status(), 429);
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(err) => {
                            let wait = outbound::retry_after(&*err).expect("held back");
                            tokio::time::sleep(
                                wait.min(end.saturating_duration_since(Instant::now())),
                            )
                            .await;
                        }
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    let (ok, refused) = (ok.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));
    assert_eq!(refused, 0, "{ok} admitted, {refused} refused");
    assert!(
        ok * 3 >= 2 * (5 + 5 * 2),
        "the quota went unused: {ok} admitted"
    );
}
