//! The response future of [`PushbackService`](super::PushbackService).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::mem;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tokio::sync::futures::OwnedNotified;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::dependency::{span, Dependency};
use super::error::PushedBack;
use super::trailers::TrailerReader;
use crate::clock::{saturating_nanos, Clock};
use crate::head::{ResponseHead, Until, UntilHead};
use crate::outbound::metrics::Outcome;
use crate::outbound::never_sent;
use crate::BoxError;

/// A call counted in flight until it is answered, fails or is dropped.
struct InFlight<C: Clock> {
    dependency: Arc<Dependency<C>>,
    /// The call's place in the order of starts.
    place: u64,
    /// The quotas whose budget it took a call of, one bit each by their places.
    counted: u32,
    /// The tokens it may use.
    tokens: u64,
}

impl<C: Clock> Drop for InFlight<C> {
    fn drop(&mut self) {
        self.dependency.finish(self.tokens);
    }
}

/// A call waiting for a hold to end, with what it needs to start then.
struct Waiting<S, Req> {
    sleep: Pin<Box<Sleep>>,
    /// Tokio's time when the call began to wait, so that no clock can make it wait longer than
    /// `max_wait` by tokio's timer.
    since: Instant,
    /// The clock's instant after which the call may not start.
    deadline: u64,
    /// The readied service, and the request it is to be called with.
    call: (S, Req),
    /// Ready when a newer answer lets calls start sooner than the sleep's end.
    sooner: Pin<Box<OwnedNotified>>,
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, C>
    where
        S: Service<Req>,
        C: Clock,
    {
        Refused { error: Option<PushedBack> },
        Waiting { waiting: Option<Waiting<S, Req>> },
        // Fields drop in order: the inner future is gone before the call stops counting.
        Running {
            #[pin]
            future: S::Future,
            in_flight: Option<InFlight<C>>,
        },
    }
}

pin_project! {
    /// Response future of [`PushbackService`](super::PushbackService): refused, waiting for a
    /// hold to end, or the inner call, whose response is read when it arrives.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, C, Req, M = UntilHead>
    where
        S: Service<Req>,
        C: Clock,
    {
        dependency: Arc<Dependency<C>>,
        mode: PhantomData<fn() -> M>,
        // The tokens the call may use.
        tokens: u64,
        #[pin]
        state: State<S, Req, C>,
    }
}

fn run<S: Service<Req>, Req, C: Clock>(
    dependency: &Arc<Dependency<C>>,
    (place, counted): (u64, u32),
    tokens: u64,
    service: &mut S,
    request: Req,
) -> State<S, Req, C> {
    // Counted before the call, so that a panicking `call` stops counting as it unwinds.
    let in_flight = InFlight {
        dependency: Arc::clone(dependency),
        place,
        counted,
        tokens,
    };
    State::Running {
        future: service.call(request),
        in_flight: Some(in_flight),
    }
}

impl<S, C, Req, M> ResponseFuture<S, C, Req, M>
where
    S: Service<Req> + Clone,
    C: Clock,
{
    /// The call of `request`, which may use `tokens` tokens of the dependency's.
    pub(crate) fn start(
        dependency: &Arc<Dependency<C>>,
        service: &mut S,
        request: Req,
        tokens: u64,
    ) -> Self {
        let mut sooner = None;
        let started = dependency.try_start(tokens).or_else(|_| {
            // Listen for an answer that lets calls start sooner, then look again: an answer
            // that came between the first look and the listening is not missed.
            sooner = Some(dependency.listen());
            dependency.try_start(tokens)
        });
        // The clock's instant after which a call held at `now` may not start.
        let deadline = |now: u64| now.saturating_add(saturating_nanos(dependency.max_wait));
        let state = match started {
            Ok(place) => {
                dependency
                    .metrics
                    .count(&dependency.name, Outcome::Admitted);
                run(dependency, place, tokens, service, request)
            }
            Err((now, at)) if at > deadline(now) => State::Refused {
                error: Some(dependency.refuse(now, at)),
            },
            Err((now, at)) => {
                // The readied service goes with the call; this handle keeps a clone.
                let service = mem::replace(service, service.clone());
                State::Waiting {
                    waiting: Some(Waiting {
                        sleep: Box::pin(tokio::time::sleep(span(now, at))),
                        since: Instant::now(),
                        deadline: deadline(now),
                        call: (service, request),
                        sooner: sooner.unwrap_or_else(|| dependency.listen()),
                    }),
                }
            }
        };
        Self {
            dependency: Arc::clone(dependency),
            mode: PhantomData,
            tokens,
            state,
        }
    }
}

impl<S, C, Req, M> Future for ResponseFuture<S, C, Req, M>
where
    S: Service<Req>,
    S::Response: ResponseHead,
    S::Error: Into<BoxError>,
    C: Clock,
    M: Until<S::Response, TrailerReader>,
{
    type Output = Result<M::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Refused { error } => {
                    let error = error.take().expect("polled after completion");
                    return Poll::Ready(Err(error.into()));
                }
                StateProj::Waiting { waiting } => {
                    let entry = waiting.as_mut().expect("polled after completion");
                    if entry.sooner.as_mut().poll(cx).is_ready() {
                        // A newer answer moved the time closer: try again now.
                        entry.sooner = this.dependency.listen();
                    } else {
                        ready!(entry.sleep.as_mut().poll(cx));
                    }
                    match this.dependency.try_start(*this.tokens) {
                        Ok(place) => {
                            crate::waited::record(entry.since);
                            this.dependency
                                .metrics
                                .count(&this.dependency.name, Outcome::Waited);
                            let (mut service, request) =
                                waiting.take().expect("checked above").call;
                            let tokens = *this.tokens;
                            let next = run(this.dependency, place, tokens, &mut service, request);
                            this.state.set(next);
                        }
                        Err((now, at)) => {
                            let waited = entry.since.elapsed();
                            if at > entry.deadline || waited >= this.dependency.max_wait {
                                *waiting = None;
                                return Poll::Ready(Err(this.dependency.refuse(now, at).into()));
                            }
                            // Held again (a newer answer moved the time): sleep until then.
                            let until = span(now, at).min(this.dependency.max_wait - waited);
                            entry.sleep = Box::pin(tokio::time::sleep(until));
                        }
                    }
                }
                StateProj::Running { future, in_flight } => {
                    let result = ready!(future.poll(cx)).map_err(Into::into);
                    match (&result, in_flight.as_ref()) {
                        (Ok(response), call) => {
                            let own = call.map(|call| (call.place, call.tokens));
                            (this.dependency).observe(response.status(), response.headers(), own);
                        }
                        // Refused below before anything was sent: its share of the budget
                        // goes back.
                        (Err(error), Some(call)) if never_sent(&**error) => {
                            (this.dependency).give_back(call.place, call.counted, call.tokens);
                        }
                        (Err(_), _) => {}
                    }
                    *in_flight = None;
                    let dependency = &*this.dependency;
                    return Poll::Ready(result.map(|response| {
                        M::respond(response, || -> TrailerReader { dependency.clone() })
                    }));
                }
            }
        }
    }
}

impl<S, C, Req, M> fmt::Debug for ResponseFuture<S, C, Req, M>
where
    S: Service<Req>,
    C: Clock,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Refused { .. } => "refused",
            State::Waiting { .. } => "waiting",
            State::Running { .. } => "running",
        };
        f.debug_struct("ResponseFuture")
            .field("dependency", &self.dependency.name)
            .field("state", &state)
            .finish()
    }
}
