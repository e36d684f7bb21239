//! The future of a decision, which gives back what it admitted when its caller goes away.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use super::limiter::{spawn_refund, Inner};
use crate::decision::Decision;
use crate::BoxError;

/// The future of a [`RedisRateLimiter`](super::RedisRateLimiter) decision: ready at once for a
/// cached refusal, otherwise one script call bounded by the limiter's timeout.
///
/// Dropped once its script may have been sent (it was polled and has not finished), it does not
/// take the decision with it: a task on the runtime waits for the answer and gives back what it
/// admitted, so a caller that goes away at any await point (a client that hangs up, a timeout
/// layer above) spends nothing.
pub struct ReserveFuture(pub(super) ReserveState);

type DecisionCall = Pin<Box<dyn Future<Output = Result<Decision, BoxError>> + Send + 'static>>;

pub(super) enum ReserveState {
    /// Decided without a round trip (a cached refusal, an impossible cost), until it is taken.
    Ready(Option<Result<Decision, BoxError>>),
    /// A decision in Redis, and what giving back its `cost` permits for `key` needs if the
    /// caller goes away.
    InFlight {
        call: DecisionCall,
        inner: Arc<Inner>,
        key: String,
        cost: u32,
        polled: bool,
    },
}

impl Future for ReserveFuture {
    type Output = Result<Decision, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let result = match &mut self.0 {
            ReserveState::Ready(result) => result.take(),
            ReserveState::InFlight { call, polled, .. } => {
                *polled = true;
                Some(ready!(call.as_mut().poll(cx)))
            }
        };
        self.0 = ReserveState::Ready(None);
        Poll::Ready(result.expect("ReserveFuture polled after it completed"))
    }
}

impl Drop for ReserveFuture {
    fn drop(&mut self) {
        let ReserveState::InFlight {
            call,
            inner,
            key,
            cost,
            polled: true,
        } = std::mem::replace(&mut self.0, ReserveState::Ready(None))
        else {
            // Never polled: nothing was sent. Finished: the caller has the decision.
            return;
        };
        spawn_refund(&inner.keys.prefix.clone(), async move {
            if let Ok(decision) = call.await {
                if let Some(call) = inner.change(key, decision, cost, 0) {
                    // Failures are counted and logged inside.
                    let _ = call.await;
                }
            }
        });
    }
}

impl fmt::Debug for ReserveFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReserveFuture").finish_non_exhaustive()
    }
}
