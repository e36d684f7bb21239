//! The response future of [`ClientQuotaService`](super::ClientQuotaService).

use std::fmt;
use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::counting::{QuotaCost, QuotaKey, QuotaSettle, Unsettled};
use super::error::QuotaExhausted;
use super::layer::{ClientQuotaLayer, Shared};
use crate::outbound::metrics::Outcome;
use crate::outbound::never_sent;
use crate::usage::read_cost;
use crate::{decision::Decision, BoxError, Limiter};

pin_project! {
    #[project = StateProj]
    enum State<S, Req, F>
    where
        S: Service<Req>,
    {
        // The limiter is deciding (a Redis round trip).
        Reserving {
            #[pin]
            reserve: F,
            call: Option<(S, Req)>,
        },
        // Admitted; the permits fall due when the sleep ends.
        Waiting {
            sleep: Pin<Box<Sleep>>,
            since: Instant,
            call: Option<(S, Req)>,
        },
        Refused { error: Option<BoxError> },
        Running {
            #[pin]
            future: S::Future,
        },
    }
}

pin_project! {
    /// Response future of [`ClientQuotaService`](super::ClientQuotaService): takes the
    /// permits, waits for them if it must, then runs the call. Dropped while it waits, it gives
    /// the permits back.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, L, K, Req, U = ()>
    where
        S: Service<Req>,
        L: Limiter<K>,
    {
        shared: Arc<Shared<L>>,
        // Taken out only by a settle left for later, once nothing else needs it.
        key: Option<K>,
        cost: u32,
        // What the response says the call cost.
        settle: U,
        // The call's permits: given back if it is dropped before it runs (while it waits for
        // them, or in a panic of the inner service's `call` or `clone`), or if the inner
        // service refuses it itself, before anything reached the dependency.
        held: Option<Decision>,
        #[pin]
        state: State<S, Req, L::Future>,
    }

    impl<S, L, K, Req, U> PinnedDrop for ResponseFuture<S, L, K, Req, U>
    where
        S: Service<Req>,
        L: Limiter<K>,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            let (Some(decision), Some(key)) = (this.held.take(), &this.key) else {
                return;
            };
            if matches!(*this.state, State::Running { .. }) {
                // Dropped with the call under way: the estimate stands.
                settle(&this.shared.limiter, key, *this.cost, decision, None);
            } else {
                // Not started: nothing was sent.
                this.shared.limiter.refund(key, *this.cost, decision);
            }
        }
    }
}

/// What a decision leads to. The readied service is taken out of `service` (a clone left in its
/// place) only when the call cannot start at once.
fn state_after<S, Req, L, F>(
    shared: &Shared<L>,
    held: &mut Option<Decision>,
    decision: Result<Decision, BoxError>,
    service: &mut S,
    request: Req,
) -> State<S, Req, F>
where
    S: Service<Req> + Clone,
{
    match decision {
        Err(error) => {
            shared.metrics.count(&shared.name, Outcome::Failed);
            State::Refused { error: Some(error) }
        }
        Ok(decision) if !decision.allowed => {
            shared.metrics.count(&shared.name, Outcome::Refused);
            let error = QuotaExhausted::new(shared.name.clone(), decision.retry_after);
            State::Refused {
                error: Some(error.into()),
            }
        }
        Ok(decision) if decision.wait.is_zero() => {
            shared.metrics.count(&shared.name, Outcome::Admitted);
            *held = Some(decision);
            State::Running {
                future: service.call(request),
            }
        }
        Ok(decision) => {
            // Counted when the wait ends, and not at all if the call is dropped first. Held
            // first, so that a panic below (no timer, a clone) gives it back.
            let wait = decision.wait;
            *held = Some(decision);
            let sleep = Box::pin(tokio::time::sleep(wait));
            let call = Some((mem::replace(service, service.clone()), request));
            State::Waiting {
                sleep,
                since: Instant::now(),
                call,
            }
        }
    }
}

impl<S, L, K, Req, U> ResponseFuture<S, L, K, Req, U>
where
    S: Service<Req> + Clone,
    L: Limiter<K>,
{
    /// Takes the permits `quota` says `request` costs, under the key it chooses, for the call.
    pub(super) fn start<Q, C>(
        quota: &ClientQuotaLayer<L, Q, C, U>,
        service: &mut S,
        request: Req,
    ) -> Self
    where
        Q: QuotaKey<Req, Key = K>,
        C: QuotaCost<Req>,
        U: Clone,
    {
        let (key, cost) = (quota.key.key(&request), quota.cost.cost(&request));
        let (shared, settle) = (&quota.shared, quota.settle.clone());
        // Decided now, or the limiter's future that decides.
        let decided = match shared.limiter.reserve_now(&key, cost) {
            Some(decision) => Ok(decision),
            None => Err(shared.limiter.reserve(&key, cost)),
        };
        // The future holds the decision before the inner service is called or cloned: should
        // either panic, its drop settles the decision as unwinding drops it.
        let mut future = Self {
            shared: Arc::clone(shared),
            key: Some(key),
            cost,
            settle,
            held: None,
            state: State::Refused { error: None },
        };
        future.state = match decided {
            Ok(decision) => state_after(shared, &mut future.held, decision, service, request),
            Err(reserve) => State::Reserving {
                reserve,
                call: Some((mem::replace(service, service.clone()), request)),
            },
        };
        future
    }
}

impl<S, L, K, Req, U> Future for ResponseFuture<S, L, K, Req, U>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    L: Limiter<K>,
    K: Send + 'static,
    U: QuotaSettle<S::Response>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Reserving { reserve, call } => {
                    let decision = ready!(reserve.poll(cx));
                    let (mut service, request) = call.take().expect("polled after completion");
                    // A call that must wait takes the readied service; the clone `state_after`
                    // leaves behind is dropped with this scope.
                    state_after(this.shared, this.held, decision, &mut service, request)
                }
                StateProj::Waiting { sleep, since, call } => {
                    ready!(sleep.as_mut().poll(cx));
                    crate::waited::record(*since);
                    let (mut service, request) = call.take().expect("polled after completion");
                    this.shared
                        .metrics
                        .count(&this.shared.name, Outcome::Waited);
                    // The permits are due now: the call keeps them, unless it is refused below.
                    State::Running {
                        future: service.call(request),
                    }
                }
                StateProj::Refused { error } => {
                    return Poll::Ready(Err(error.take().expect("polled after completion")));
                }
                StateProj::Running { future } => {
                    let mut result = ready!(future.poll(cx)).map_err(Into::into);
                    let (Some(decision), Some(key)) = (this.held.take(), this.key.take()) else {
                        return Poll::Ready(result);
                    };
                    let (shared, estimate) = (this.shared, *this.cost);
                    match &mut result {
                        Err(error) if never_sent(&**error) => {
                            shared.limiter.refund(&key, estimate, decision);
                        }
                        Err(_) => settle(&shared.limiter, &key, estimate, decision, None),
                        Ok(response) => {
                            match read_cost(&shared.name, || this.settle.settled(response)) {
                                None if U::LATER => {
                                    let shared = Arc::clone(shared);
                                    let unsettled = Unsettled::new(move |cost| {
                                        settle(&shared.limiter, &key, estimate, decision, cost);
                                    });
                                    this.settle.leave(response, unsettled);
                                }
                                cost => settle(&shared.limiter, &key, estimate, decision, cost),
                            }
                        }
                    }
                    return Poll::Ready(result);
                }
            };
            this.state.set(next);
        }
    }
}

/// Settles `decision`, a call's admission of `estimate` permits, to `cost`; with no cost, the
/// estimate stands, which only an admission that holds it until its settle needs to be told.
fn settle<K, L: Limiter<K>>(
    limiter: &L,
    key: &K,
    estimate: u32,
    decision: Decision,
    cost: Option<u32>,
) {
    match cost {
        // Slots of calls in flight go back whole once the answer is here.
        _ if decision.holds_slots() => limiter.settle(key, estimate, decision, 0),
        Some(cost) => limiter.settle(key, estimate, decision, cost),
        None if decision.holds_estimate() => limiter.settle(key, estimate, decision, estimate),
        None => false,
    };
}

impl<S, L, K, Req, U> fmt::Debug for ResponseFuture<S, L, K, Req, U>
where
    S: Service<Req>,
    L: Limiter<K>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Reserving { .. } => "reserving",
            State::Waiting { .. } => "waiting",
            State::Refused { .. } => "refused",
            State::Running { .. } => "running",
        };
        f.debug_struct("ResponseFuture")
            .field("quota", &self.shared.name)
            .field("cost", &self.cost)
            .field("state", &state)
            .finish()
    }
}
