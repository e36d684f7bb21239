//! The response future of [`ClientQuotaService`](super::ClientQuotaService).

use std::fmt;
use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use super::cost::QuotaCost;
use super::error::QuotaExhausted;
use super::key::QuotaKey;
use super::layer::ClientQuotaLayer;
use super::metrics::{ClientQuotaMetrics, Outcome};
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
            // Taken when it is given back, which happens at most once.
            decision: Option<Decision>,
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
    pub struct ResponseFuture<S, L, K, Req>
    where
        S: Service<Req>,
        L: Limiter<K>,
    {
        name: Arc<str>,
        metrics: ClientQuotaMetrics,
        limiter: Arc<L>,
        key: K,
        cost: u32,
        #[pin]
        state: State<S, Req, L::Future>,
    }

    impl<S, L, K, Req> PinnedDrop for ResponseFuture<S, L, K, Req>
    where
        S: Service<Req>,
        L: Limiter<K>,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let StateProj::Waiting { decision, .. } = this.state.project() {
                if let Some(decision) = decision.take() {
                    this.limiter.refund(this.key, *this.cost, decision);
                }
            }
        }
    }
}

/// What a decision leads to. The readied service is taken out of `service` (a clone left in its
/// place) only when the call cannot start at once.
fn state_after<S, Req, F>(
    name: &Arc<str>,
    metrics: &ClientQuotaMetrics,
    decision: Result<Decision, BoxError>,
    service: &mut S,
    request: Req,
) -> State<S, Req, F>
where
    S: Service<Req> + Clone,
{
    match decision {
        Err(error) => {
            metrics.count(Outcome::Failed);
            State::Refused { error: Some(error) }
        }
        Ok(decision) if !decision.allowed => {
            metrics.count(Outcome::Refused);
            State::Refused {
                error: Some(QuotaExhausted::new(name.clone(), decision.retry_after).into()),
            }
        }
        Ok(decision) if decision.wait.is_zero() => {
            metrics.count(Outcome::Admitted);
            State::Running {
                future: service.call(request),
            }
        }
        Ok(decision) => State::Waiting {
            sleep: Box::pin(tokio::time::sleep(decision.wait)),
            decision: Some(decision),
            call: Some((mem::replace(service, service.clone()), request)),
        },
    }
}

impl<S, L, K, Req> ResponseFuture<S, L, K, Req>
where
    S: Service<Req> + Clone,
    L: Limiter<K>,
{
    /// Takes the permits `quota` asks for the call, under its key and at its cost.
    pub(crate) fn start<Q, C>(
        quota: &ClientQuotaLayer<L, Q, C>,
        service: &mut S,
        request: Req,
    ) -> Self
    where
        Q: QuotaKey<Req, Key = K>,
        C: QuotaCost<Req>,
    {
        let (key, cost) = (quota.key.key(&request), quota.cost.cost(&request));
        let (name, metrics) = (&quota.name, &quota.metrics);
        let state = match quota.limiter.reserve_now(&key, cost) {
            Some(decision) => state_after(name, metrics, decision, service, request),
            None => State::Reserving {
                reserve: quota.limiter.reserve(&key, cost),
                call: Some((mem::replace(service, service.clone()), request)),
            },
        };
        Self {
            name: name.clone(),
            metrics: metrics.clone(),
            limiter: Arc::clone(&quota.limiter),
            key,
            cost,
            state,
        }
    }
}

impl<S, L, K, Req> Future for ResponseFuture<S, L, K, Req>
where
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    L: Limiter<K>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Reserving { reserve, call } => {
                    let decision = ready!(reserve.poll(cx));
                    let (mut service, request) = call.take().expect("polled after completion");
                    // A call that must wait takes the readied service; the clone `state_after`
                    // leaves behind is dropped with this scope.
                    let next =
                        state_after(this.name, this.metrics, decision, &mut service, request);
                    this.state.set(next);
                }
                StateProj::Waiting { sleep, call, .. } => {
                    ready!(sleep.as_mut().poll(cx));
                    let (mut service, request) = call.take().expect("polled after completion");
                    // Leaving `Waiting` keeps the permits: they are due now.
                    this.metrics.count(Outcome::Waited);
                    this.state.set(State::Running {
                        future: service.call(request),
                    });
                }
                StateProj::Refused { error } => {
                    let error = error.take().expect("polled after completion");
                    return Poll::Ready(Err(error));
                }
                StateProj::Running { future } => {
                    return future.poll(cx).map_err(Into::into);
                }
            }
        }
    }
}

impl<S, L, K, Req> fmt::Debug for ResponseFuture<S, L, K, Req>
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
            .field("quota", &self.name)
            .field("cost", &self.cost)
            .field("state", &state)
            .finish()
    }
}
