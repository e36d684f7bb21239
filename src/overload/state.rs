//! The state every clone of one [`Overload`](super::Overload) shares: the requests in flight, the
//! limit and its algorithm, the queue; and the permit an admitted request holds.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::builder::OverloadBuilder;
use super::Priority;
use crate::bulkhead::adaptive::{LimitAlgorithm, Limits, Sample};
use crate::clock::Clock;
use crate::decision::retry_after_secs;
use crate::head::RequestHead;
use crate::sync::{lock, Mutex};

/// Picks a request's class.
pub(super) type PriorityBy = Box<dyn Fn(&RequestHead<'_>) -> Priority + Send + Sync>;

/// The opt-in queue: how many requests may wait, and for how long at most.
#[derive(Clone, Copy, Debug)]
pub(super) struct QueueSettings {
    pub(super) capacity: usize,
    pub(super) max_wait: Duration,
}

/// Where a waiter stands: its class first (highest first), then its arrival.
type QueueKey = (Reverse<Priority>, u64);

/// A waiter's way in, and the instant (on tokio's clock) its wait ends: counted from when it
/// joined the queue, not from when its future is first polled.
type Waiter = (tokio::time::Instant, oneshot::Sender<Permit>);

/// What changes under the lock.
struct State {
    in_flight: usize,
    limit: usize,
    algorithm: Box<dyn LimitAlgorithm>,
    waiters: BTreeMap<QueueKey, Waiter>,
    arrivals: u64,
    /// A slow average of the admitted requests' latency, in nanoseconds: what `Retry-After` says.
    latency: Option<f64>,
}

/// The settings and state of one overload protection, shared by its clones, layers and services.
pub(super) struct Shared {
    pub(super) name: Arc<str>,
    pub(super) clock: Box<dyn Clock>,
    pub(super) limits: Limits,
    /// For each class (by [`Priority::index`]), the share of the limit it may not take: the sum
    /// of the guarantees of the classes above it (none for `Critical`).
    pub(super) reserved: [f64; 3],
    /// `Critical`'s ceiling, in times the limit.
    borrowing: f64,
    pub(super) priority_by: PriorityBy,
    pub(super) queue: Option<QueueSettings>,
    /// Taken by [`lock`]: nothing under it panics midway through a change, and a panicking
    /// algorithm leaves the limit as it was.
    state: Mutex<State>,
    /// Mirrors of the state's figures, read without the lock.
    pub(super) limit: AtomicUsize,
    pub(super) in_flight: AtomicUsize,
    #[cfg(feature = "metrics")]
    pub(super) metrics: super::metrics::Metrics,
}

/// How a request entered: admitted at once, waiting in the queue, or shed.
pub(super) enum Entry {
    Admitted(Permit),
    Queued(Waiting),
    Shed,
}

impl Shared {
    pub(super) fn new(builder: OverloadBuilder) -> Self {
        let limits = builder.limits;
        let [critical, default, _] = builder.guarantees;
        let state = State {
            in_flight: 0,
            limit: limits.initial(),
            algorithm: builder.algorithm,
            waiters: BTreeMap::new(),
            arrivals: 0,
            latency: None,
        };
        Self {
            #[cfg(feature = "metrics")]
            metrics: super::metrics::Metrics::new(&builder.name),
            name: builder.name,
            clock: builder.clock,
            limits,
            // By class, in the order of `Priority::ALL`.
            reserved: [0.0, critical, critical + default],
            borrowing: builder.borrowing,
            priority_by: builder.priority_by,
            queue: builder.queue,
            state: Mutex::new(state),
            limit: AtomicUsize::new(limits.initial()),
            in_flight: AtomicUsize::new(0),
        }
    }

    /// The most requests in flight, all classes together, under which `class` is admitted at
    /// `limit`: the limit less the guarantees of the classes above, rounded to the nearest, or
    /// for `Critical` the limit times its borrowing; at least one, so that no class is shed for
    /// good (the limit learns only from the requests it admits).
    pub(super) fn ceiling(&self, class: Priority, limit: usize) -> usize {
        let limit = limit as f64;
        let ceiling = match class {
            // Times the limit, rounded: as the limit less `1 - borrowing` times it, a tie could
            // round the other way (`1 - 2.3` is not exact in binary).
            Priority::Critical => (limit * self.borrowing).round(),
            _ => limit - (limit * self.reserved[class.index()]).round(),
        };
        (ceiling as usize).max(1)
    }

    /// Admits a request of `class` at once, queues it, or sheds it.
    pub(super) fn enter(self: &Arc<Self>, class: Priority) -> Entry {
        let mut state = lock(&self.state);
        if state.in_flight < self.ceiling(class, state.limit) {
            #[cfg(feature = "metrics")]
            self.metrics.count(true, class);
            return Entry::Admitted(self.admit(&mut state, class));
        }
        let Some(queue) = self.queue.filter(|q| q.capacity > 0) else {
            return Entry::Shed;
        };
        let now = tokio::time::Instant::now();
        if state.waiters.len() >= queue.capacity {
            // Waiters whose wait has ended (their timers, not fired yet, had not taken them
            // out) wait no more: shed by dropping their senders.
            state
                .waiters
                .retain(|_, (ends, _)| !crate::waited::ended(*ends, now));
        }
        if state.waiters.len() >= queue.capacity {
            // The last waiter is the lowest class's latest arrival: it makes room for a
            // newcomer of a higher class (dropping its sender sheds it), or the newcomer is shed.
            match state.waiters.last_key_value() {
                Some((&(Reverse(last), _), _)) if last < class => state.waiters.pop_last(),
                _ => return Entry::Shed,
            };
        }
        let key = (Reverse(class), state.arrivals);
        state.arrivals += 1;
        let (sender, receiver) = oneshot::channel();
        let ends = now + queue.max_wait;
        state.waiters.insert(key, (ends, sender));
        self.publish(&state);
        Entry::Queued(Waiting {
            shared: Arc::clone(self),
            key,
            ends,
            receiver,
        })
    }

    /// Counts one more request in flight and hands it its permit.
    fn admit(self: &Arc<Self>, state: &mut State, class: Priority) -> Permit {
        state.in_flight += 1;
        self.publish(state);
        Permit {
            shared: Some(Arc::clone(self)),
            started: self.clock.now(),
            in_flight: state.in_flight,
            ceiling: self.ceiling(class, state.limit).min(state.limit),
        }
    }

    /// Admits the waiters at the head of the queue while their class's ceiling lets them in.
    /// A class ranks above every class whose ceiling is lower, so the first waiter that does not
    /// fit ends the round. A waiter whose wait has ended is shed, not admitted (its timer, not
    /// fired yet, had not taken it out).
    fn admit_waiters(self: &Arc<Self>, state: &mut State) {
        let mut now = None;
        while let Some(entry) = state.waiters.first_entry() {
            let Reverse(class) = entry.key().0;
            if state.in_flight >= self.ceiling(class, state.limit) {
                break;
            }
            let (ends, sender) = entry.remove();
            if crate::waited::ended(ends, *now.get_or_insert_with(tokio::time::Instant::now)) {
                // Dropping its sender sheds it.
                continue;
            }
            let permit = self.admit(state, class);
            match sender.send(permit) {
                #[cfg(feature = "metrics")]
                Ok(()) => self.metrics.count(true, class),
                #[cfg(not(feature = "metrics"))]
                Ok(()) => {}
                Err(mut permit) => {
                    // The waiter went away: its slot is taken back here, under the lock.
                    permit.shared = None;
                    state.in_flight -= 1;
                }
            }
        }
        self.publish(state);
    }

    /// Gives one slot back and admits whom it lets in.
    fn release(self: &Arc<Self>) {
        let mut state = lock(&self.state);
        state.in_flight -= 1;
        self.admit_waiters(&mut state);
    }

    /// Feeds the sample of a request whose response head is ready to the algorithm, and applies
    /// the limit it returns.
    fn record(self: &Arc<Self>, permit: &Permit) {
        let mut state = lock(&self.state);
        let from = state.limit;
        let sample = Sample::ended(&*self.clock, permit.started, permit.in_flight, from)
            .admitted_under(permit.ceiling);
        let rtt = sample.rtt.as_nanos() as f64;
        state.latency = Some(state.latency.map_or(rtt, |l| l + (rtt - l) / 16.0));
        let limits = &self.limits;
        let to = limits.clamp(state.algorithm.update(&sample, limits));
        if to != from {
            state.limit = to;
            tracing::debug!(overload = %self.name, from, to, "overload limit changed");
            self.admit_waiters(&mut state);
        }
    }

    /// How long a shed request should wait before it tries again: the slow average of the
    /// admitted requests' latency, as a `Retry-After` says it (whole seconds, rounded up, at
    /// least one).
    pub(super) fn retry_after(&self) -> Duration {
        // Nanoseconds; `as` saturates (and reads no number as zero).
        let latency = lock(&self.state).latency.unwrap_or(0.0) as u64;
        Duration::from_secs(retry_after_secs(Duration::from_nanos(latency)))
    }

    /// Sets the mirrors (and the gauges) from the state.
    fn publish(&self, state: &State) {
        self.limit.store(state.limit, Ordering::Relaxed);
        self.in_flight.store(state.in_flight, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.metrics
            .gauges([state.limit, state.in_flight, state.waiters.len()]);
    }
}

/// One admitted request's slot, given back exactly once when dropped (at the body's end, or
/// whatever ends the request before). `pub` in a private module: [`OverloadBody`] names it,
/// users cannot.
///
/// [`OverloadBody`]: super::OverloadBody
pub struct Permit {
    /// `None` once the slot was taken back under the lock.
    shared: Option<Arc<Shared>>,
    started: u64,
    /// Requests in flight at admission, this one included.
    in_flight: usize,
    /// Its class's ceiling at admission, at most the limit then: a critical request admitted
    /// above the limit found it reached.
    ceiling: usize,
}

impl Permit {
    /// Gives the algorithm this request's sample: its response head is ready.
    pub(super) fn record(&self) {
        if let Some(shared) = &self.shared {
            shared.record(self);
        }
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("held", &self.shared.is_some())
            .finish_non_exhaustive()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.release();
        }
    }
}

/// A request waiting in the queue; dropped, it leaves the queue (and a permit granted meanwhile
/// is given back by the channel dropping it).
pub(super) struct Waiting {
    shared: Arc<Shared>,
    key: QueueKey,
    /// When its wait ends: `max_wait` after it joined the queue.
    ends: tokio::time::Instant,
    receiver: oneshot::Receiver<Permit>,
}

impl Waiting {
    /// Waits until admitted (`Some`), or shed: pushed out by a higher class, or `max_wait`
    /// after it joined the queue.
    pub(super) async fn admitted(mut self) -> Option<Permit> {
        match tokio::time::timeout_at(self.ends, &mut self.receiver).await {
            Ok(permit) => permit.ok(),
            Err(_) => {
                self.leave();
                // Admitted in the instant the wait ended: it goes in.
                self.receiver.try_recv().ok()
            }
        }
    }

    fn leave(&self) {
        let mut state = lock(&self.shared.state);
        if state.waiters.remove(&self.key).is_some() {
            self.shared.publish(&state);
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.leave();
    }
}
