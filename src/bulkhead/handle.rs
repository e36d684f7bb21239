//! The handle of one named bulkhead, and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::events::{BulkheadSnapshot, CallFinished, CallPermitted, CallRejected, Hooks};
use super::layer::BulkheadLayer;
use super::permits::Permits;
use crate::head::UntilBodyEnd;

/// A named bulkhead, shared by every clone and every service made from it.
///
/// Build one per downstream dependency with [`Bulkhead::semaphore`] or [`Bulkhead::queue`], keep
/// a clone to read [`snapshot`](Bulkhead::snapshot) or change the limit, and wrap the client with
/// [`layer`](Bulkhead::layer).
///
/// # Errors
///
/// The services it makes fail with [`BoxError`](crate::BoxError): a call refused by the
/// bulkhead holds a [`BulkheadFull`](super::BulkheadFull) (no permit free and no room, or no
/// time left, to wait for one); any other error is the inner service's, unchanged.
///
/// # Examples
///
/// A queue bulkhead of two calls at once and four waiting, whose limit is then lowered:
///
/// ```
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_bulwark::bulkhead::Bulkhead;
/// use tower_bulwark::BoxError;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let search = Bulkhead::queue("search", 2, 4).build();
/// let client = ServiceBuilder::new()
///     .layer(search.layer())
///     .service(service_fn(|query: &'static str| async move {
///         Ok::<_, BoxError>(query.len())
///     }));
/// assert_eq!(client.clone().oneshot("tower").await?, 5);
///
/// search.set_max_concurrent_calls(1);
/// assert_eq!(client.oneshot("bulwark").await?, 7);
/// let snapshot = search.snapshot();
/// assert_eq!(snapshot.max_allowed_concurrent_calls, 1);
/// assert_eq!(snapshot.total_permitted, 2);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Bulkhead {
    pub(crate) permits: Arc<Permits>,
}

impl Bulkhead {
    /// A semaphore bulkhead: at most `max_concurrent_calls` calls at once, and a call that finds
    /// no free permit is refused at once unless [`max_wait`](BulkheadBuilder::max_wait) lets it
    /// wait.
    ///
    /// A limit of zero refuses every call until it is raised with
    /// [`set_max_concurrent_calls`](Bulkhead::set_max_concurrent_calls); one above 2^31 - 1 is
    /// lowered to it.
    pub fn semaphore(name: impl Into<Arc<str>>, max_concurrent_calls: usize) -> BulkheadBuilder {
        BulkheadBuilder {
            name: name.into(),
            max_concurrent_calls,
            max_wait: Some(Duration::ZERO),
            queue_capacity: None,
            hooks: Hooks::default(),
        }
    }

    /// A queue bulkhead, the async counterpart of Resilience4j's `ThreadPoolBulkhead`: at most
    /// `max_concurrent_calls` calls at once and at most `queue_capacity` more waiting their turn,
    /// started in arrival order (see the [module docs](super#two-kinds) for a lowered limit); a
    /// call beyond both is refused at once.
    ///
    /// Queued calls wait as long as it takes unless [`max_wait`](BulkheadBuilder::max_wait)
    /// bounds the wait; a queued call that is dropped leaves the queue. A capacity of zero queues
    /// nothing.
    ///
    /// A queued call handed the permit of a call that ended leaves the queue then, before its
    /// task runs, so a call made right after finds its place free. A lowered limit puts back
    /// the waiters whose permits it takes back: the queue may then hold more than its capacity
    /// until they start or leave, and new calls are refused meanwhile.
    pub fn queue(
        name: impl Into<Arc<str>>,
        max_concurrent_calls: usize,
        queue_capacity: usize,
    ) -> BulkheadBuilder {
        BulkheadBuilder {
            max_wait: None,
            queue_capacity: Some(queue_capacity),
            ..Self::semaphore(name, max_concurrent_calls)
        }
    }

    /// The bulkhead's name, as given to its constructor.
    pub fn name(&self) -> &str {
        &self.permits.name
    }

    /// The current figures: free permits, limit, queue depth and running totals.
    pub fn snapshot(&self) -> BulkheadSnapshot {
        self.permits.snapshot()
    }

    /// Sets this bulkhead's gauges in the `metrics` facade from its current state; call it
    /// before rendering a scrape. Its counters and call-duration histogram are recorded as calls
    /// happen.
    #[cfg(feature = "metrics")]
    pub fn publish_gauges(&self) {
        super::metrics::publish_gauges(self.name(), &self.snapshot());
    }

    /// Changes the limit of concurrent calls, without waiting and while calls are in flight.
    ///
    /// Raising it lets waiting calls in at once. Lowering it below the calls in flight lets no new
    /// call in until enough of them have ended; their permits are retired as they come back, so
    /// the new limit is never exceeded by a call admitted after this returns. Values above
    /// 2^31 - 1 are lowered to it.
    pub fn set_max_concurrent_calls(&self, max_concurrent_calls: usize) {
        self.permits.resize(max_concurrent_calls);
    }

    /// A layer that holds each permit until the response future completes or is dropped.
    pub fn layer(&self) -> BulkheadLayer {
        BulkheadLayer::with_mode(self.clone())
    }

    /// A layer, in front of a service answering `http::Response<B>`, that holds each permit
    /// until the response body has been read to its end, has failed, or is dropped.
    pub fn body_layer(&self) -> BulkheadLayer<UntilBodyEnd> {
        BulkheadLayer::with_mode(self.clone())
    }
}

impl fmt::Debug for Bulkhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.permits.fmt(f)
    }
}

/// Settings of a [`Bulkhead`] not built yet; every method consumes and returns the builder.
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct BulkheadBuilder {
    pub(super) name: Arc<str>,
    pub(super) max_concurrent_calls: usize,
    pub(super) max_wait: Option<Duration>,
    pub(super) queue_capacity: Option<usize>,
    pub(super) hooks: Hooks,
}

impl BulkheadBuilder {
    /// How long a call may wait for a permit before it is refused.
    ///
    /// Semaphore bulkheads default to zero (refuse at once); a positive value lets callers wait in
    /// arrival order. Queue bulkheads default to no bound; a value bounds the time in the queue,
    /// and zero turns the queue off.
    ///
    /// A bounded wait runs on tokio's timer, so such a call must be polled inside a tokio runtime
    /// with time enabled; under `tokio::time::pause` it follows the paused clock. The timer ends
    /// a wait at its next millisecond (it rounds a deadline up to one). A waiter still in the
    /// queue once its wait and that millisecond have passed (its task not run since, or a timer
    /// driver running late) is shed when its place in a full queue, or a permit that comes
    /// back, is wanted: a permit passes it for the next waiter.
    /// That is read on tokio's clock where the permit comes back: one given back on a thread
    /// outside the runtime reads the system's, ahead of a paused runtime's. A wait too long
    /// for the timer to represent (`Duration::MAX`, say) is no bound: the call waits its turn.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// Runs `hook` each time a call gets a permit. Hooks added earlier keep running, before it.
    pub fn on_call_permitted(
        mut self,
        hook: impl Fn(&CallPermitted<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.hooks.permitted.push(Box::new(hook));
        self
    }

    /// Runs `hook` each time a call is refused. Hooks added earlier keep running, before it.
    pub fn on_call_rejected(
        mut self,
        hook: impl Fn(&CallRejected<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.hooks.rejected.push(Box::new(hook));
        self
    }

    /// Runs `hook` each time a permitted call ends, with the time the permit was held. Hooks
    /// added earlier keep running, before it.
    pub fn on_call_finished(
        mut self,
        hook: impl Fn(&CallFinished<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.hooks.finished.push(Box::new(hook));
        self
    }

    /// Builds the bulkhead. With the `metrics` feature it counts its calls and their durations
    /// through the `metrics` facade (see [the metric names](crate::observe#metric-names)).
    pub fn build(self) -> Bulkhead {
        let builder = self;
        #[cfg(feature = "metrics")]
        let builder = super::metrics::record_calls(builder);
        Bulkhead {
            permits: Arc::new(Permits::new(builder)),
        }
    }
}
