//! Limiters: a quota, an algorithm, a store and a clock tied together.
//!
//! [`DirectRateLimiter`] is one limit for everything that shares it (a process-wide cap);
//! [`KeyedRateLimiter`] keeps one limit per key (client IP, API key, tenant). Both are cheap to
//! clone, and every clone shares one state. Both are built by a [`RateLimiterBuilder`], which
//! chooses the algorithm, the clock and, for keys, the bound, the overflow rule and the hasher.
//!
//! ```
//! use std::time::Duration;
//! use tower_bulwark::{KeyedRateLimiter, clock::ManualClock, Quota};
//!
//! let clock = ManualClock::new();
//! let limiter = KeyedRateLimiter::<&str>::builder(Quota::per_second(2)?)
//!     .clock(clock.clone())
//!     .build();
//! assert!(limiter.check(&"alice").allowed);
//! assert!(limiter.check(&"alice").allowed);
//! let refused = limiter.check(&"alice");
//! assert!(!refused.allowed);
//! assert_eq!(refused.retry_after, Duration::from_millis(500));
//! assert!(limiter.check(&"bob").allowed, "every key has its own budget");
//! clock.advance(Duration::from_millis(500));
//! assert!(limiter.check(&"alice").allowed);
//! # Ok::<(), tower_bulwark::QuotaError>(())
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Sleep;

use crate::algorithm::Algorithm;
use crate::{BoxError, Quota};

mod boxed;
mod builder;
mod direct;
mod keyed;

pub use crate::decision::{Decision, InsufficientCapacity};
pub use crate::store::memory::Overflow;
pub use boxed::{BoxLimiter, BoxReserve};
pub use builder::RateLimiterBuilder;
#[cfg(feature = "config")]
pub(crate) use builder::DEFAULT_MAX_KEYS;
pub use direct::DirectRateLimiter;
pub use keyed::KeyedRateLimiter;

/// Anything that decides on requests per key: the in-memory limiters, the Redis limiter, or a
/// limiter of your own. The HTTP layer is written against this trait.
pub trait Limiter<K>: Send + Sync + 'static {
    /// The future of a decision.
    type Future: Future<Output = Result<Decision, BoxError>> + Send + 'static;

    /// The quota this limiter enforces now (for the `RateLimit-Policy` header). It can change
    /// at run time (see [`set_quota`](Self::set_quota)), so it is returned by value.
    fn quota(&self) -> Quota;

    /// Replaces the quota at run time, for every clone of this limiter, keeping what each key
    /// has used: see [`KeyedRateLimiter::set_quota`] for what a change does to decisions. The
    /// default refuses with an error: a limiter of your own changes its quota only if it says
    /// how.
    fn set_quota(&self, quota: Quota) -> Result<(), BoxError> {
        let _ = quota;
        Err("this limiter cannot change its quota at run time".into())
    }

    /// The quota this limiter enforces for `key`, which the `RateLimit-Policy` header of a
    /// response to `key` advertises: [`quota`](Self::quota) unless the quota depends on the key
    /// (see [`Tiers`](crate::tiers::Tiers)).
    fn quota_for(&self, key: &K) -> Quota {
        let _ = key;
        self.quota()
    }

    /// Decides on `cost` permits for `key`, reserving a permit that arrives within the quota's
    /// `max_wait` (the decision's [`wait`](Decision::wait) says how long to wait before going on).
    /// A cost of zero takes nothing. It is admitted at once while the key is within its limit,
    /// even with nothing left; behind reservations that hold permits beyond the limit (GCRA, the
    /// fixed window, `Metered`; the sliding windows count a reservation in the window it falls
    /// due in) or a settle's debt, it waits as a request would, until the key is back within
    /// its limit (for reservations, no later than the last falls due), and is refused beyond
    /// `max_wait`.
    ///
    /// # Errors
    ///
    /// The future fails when no decision can be made: a cost above what the quota can ever
    /// admit at once ([`InsufficientCapacity`] for the crate's limiters), a store that did not
    /// answer (the Redis limiter, depending on its fail mode), a key that names no tier.
    fn reserve(&self, key: &K, cost: u32) -> Self::Future;

    /// The same decision as [`reserve`](Self::reserve), made at once when this limiter can make
    /// it without waiting for I/O; `None` means "use `reserve`". The in-memory limiters always
    /// answer here, which lets the HTTP layer decide without allocating a future. The default
    /// answers `None`.
    fn reserve_now(&self, key: &K, cost: u32) -> Option<Result<Decision, BoxError>> {
        let _ = (key, cost);
        None
    }

    /// Gives back an admitted decision whose caller went away (a dropped waiter) or that another
    /// policy vetoed. Where the algorithm cannot give it back, this does nothing.
    ///
    /// The decision is consumed: [`Decision`] is neither `Copy` nor `Clone`, so one admission is
    /// given back at most once, and the compiler says so:
    ///
    /// ```compile_fail,E0382
    /// use tower_bulwark::{KeyedRateLimiter, Limiter, Quota};
    ///
    /// let limiter = KeyedRateLimiter::<u64>::new(Quota::per_second(1).unwrap());
    /// let decision = limiter.check(&7);
    /// limiter.refund(&7, 1, decision);
    /// limiter.refund(&7, 1, decision); // error: use of moved value
    /// ```
    ///
    /// The crate's limiters also remember which limiter and which key a decision was made for:
    /// given to another limiter (even one of the same quota, or another tier of a
    /// [`Tiers`](crate::tiers::Tiers)), or back under another key, it gives nothing back, and
    /// neither does a decision built by hand. Clones of a limiter share its state, so they take
    /// back each other's decisions. No more than the decision took is ever given back, whatever
    /// `cost` says, and whatever [`set_quota`](Limiter::set_quota) changed since: GCRA gives
    /// back each permit at the shorter of the interval it was charged at and the one in force.
    ///
    /// A keyed limiter tells a decision's key from another by the key's entry in its store
    /// (which also tells a key made anew from the one the decision was made on): given back
    /// under another key, a decision is not taken back, even where the two keys' hashes under
    /// its [`BuildHasher`](std::hash::BuildHasher) are the same. (A settle's debt, charged to a
    /// key made anew since, goes by the hash: under a hasher of your own, see
    /// [`hasher`](crate::limiter::RateLimiterBuilder::hasher), keys whose hashes agree but for
    /// their 24 lowest bits are one key to it.) The crate itself gives a decision back only
    /// under the key it was made for.
    ///
    /// Returns whether the decision was taken back: an admission this limiter (or a clone)
    /// made for `key`, even where the algorithm could give none of its permits back. `false`
    /// for a refusal, another limiter's or another key's decision, or one built by hand, which
    /// change nothing, and for an admission whose key a keyed limiter has dropped since (the
    /// key forgot it). [`Observed`](crate::observe::Observed) counts only what was taken back.
    /// A `cost` of zero gives nothing back, yet takes the admission back (`true`).
    fn refund(&self, key: &K, cost: u32, decision: Decision) -> bool;

    /// Settles an admission of `estimate` permits to `cost`, what the request turned out to
    /// cost once its answer came (the tokens an LLM API reports): the difference is given back
    /// when it cost less, by the rules of [`refund`](Self::refund) (never more than the
    /// admission took), or charged when it cost more. Under
    /// [`Metered`](crate::algorithm::Metered) the settle is exact: the estimate held since the
    /// admission is released and the cost charged as of the admission.
    ///
    /// A charge is never refused: beyond what the key has left it is debt, which its next
    /// requests wait for as they would for permits it used. It counts from the instant of the
    /// settle, and no admission made meanwhile is undone (the quota can be exceeded by the
    /// requests that were in flight, as with any cost known only afterwards; with an estimate
    /// that bounds the cost, such as a request's `max_tokens`, it never is). A cost above the
    /// most one request can take ([`InsufficientCapacity`]'s capacity) is charged as that most.
    /// The crate's limiters take the estimate from the decision where it is smaller than
    /// `estimate`, so that a settle never gives back what was not taken; for an admission that
    /// holds its estimate ([`Metered`](crate::algorithm::Metered)), the decision's whole
    /// estimate, whatever `estimate` says: a hold ends once, and a part left held would never
    /// drain. A settle to zero gives back all the admission took.
    ///
    /// No default: a limiter of your own, or a wrapper of one, says what a settle does, and
    /// cannot leave a charge out by forgetting to forward it. (The crate's limiters give back
    /// a refund as a settle to zero: one rule for both.)
    ///
    /// Returns whether the decision was this limiter's for `key`: an admission this limiter (or
    /// a clone) made for `key`, even where the algorithm could give none of its permits back.
    /// `false` for a refusal, another limiter's or another key's decision, or one built by
    /// hand, which change nothing, and for a settle to less of an admission whose key a keyed
    /// limiter has dropped since (the key forgot it; a settle to more charges its debt to the
    /// key made afresh, as the dropped key would have had it).
    fn settle(&self, key: &K, estimate: u32, decision: Decision, cost: u32) -> bool;
}

pin_project! {
    /// The future of [`acquire`]: reserves, waits for the reservation to fall due, and gives it
    /// back if dropped while waiting.
    #[must_use = "futures do nothing unless polled"]
    pub struct Acquire<'a, K, L: Limiter<K>> {
        limiter: &'a L,
        key: &'a K,
        cost: u32,
        #[pin]
        state: AcquireState<L::Future>,
    }

    impl<'a, K, L: Limiter<K>> PinnedDrop for Acquire<'a, K, L> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let AcquireProj::Waiting { decision, .. } = this.state.project() {
                if let Some(decision) = decision.take() {
                    this.limiter.refund(this.key, *this.cost, decision);
                }
            }
        }
    }
}

pin_project! {
    #[project = AcquireProj]
    enum AcquireState<F> {
        // Not polled yet: the limiter is asked on the first poll, so that a future dropped
        // unpolled (a `select!` branch never reached) takes no permit.
        Start,
        Reserving { #[pin] reserve: F },
        Waiting { #[pin] sleep: Sleep, decision: Option<Decision> },
        Done,
    }
}

impl<K, L: Limiter<K>> fmt::Debug for Acquire<'_, K, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            AcquireState::Start => "not polled",
            AcquireState::Reserving { .. } => "reserving",
            AcquireState::Waiting { .. } => "waiting",
            AcquireState::Done => "done",
        };
        f.debug_struct("Acquire")
            .field("cost", &self.cost)
            .field("state", &state)
            .finish()
    }
}

impl<K, L: Limiter<K>> Future for Acquire<'_, K, L> {
    type Output = Result<Decision, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                AcquireProj::Start => {
                    let reserve = this.limiter.reserve(this.key, *this.cost);
                    this.state.set(AcquireState::Reserving { reserve });
                }
                AcquireProj::Reserving { reserve } => match ready!(reserve.poll(cx)) {
                    Ok(decision) if decision.allowed && !decision.wait.is_zero() => {
                        let sleep = tokio::time::sleep(decision.wait);
                        this.state.set(AcquireState::Waiting {
                            sleep,
                            decision: Some(decision),
                        });
                    }
                    // A refusal, an admission due now, or the limiter's error.
                    answer => {
                        this.state.set(AcquireState::Done);
                        return Poll::Ready(answer);
                    }
                },
                AcquireProj::Waiting { sleep, decision } => {
                    ready!(sleep.poll(cx));
                    let decision = decision.take();
                    this.state.set(AcquireState::Done);
                    if let Some(decision) = decision {
                        return Poll::Ready(Ok(decision));
                    }
                    panic!("`Acquire` polled after completion");
                }
                AcquireProj::Done => panic!("`Acquire` polled after completion"),
            }
        }
    }
}

/// Reserves `cost` permits of `limiter` for `key` and waits until they fall due.
///
/// Resolves to the decision: admitted (after waiting, if it had to) or refused at once. The
/// limiter is asked on the first poll: a future dropped before it takes nothing, and one dropped
/// while it waits gives its reservation back.
///
/// # Errors
///
/// What [`Limiter::reserve`] fails with.
pub fn acquire<'a, K, L: Limiter<K>>(limiter: &'a L, key: &'a K, cost: u32) -> Acquire<'a, K, L> {
    Acquire {
        limiter,
        key,
        cost,
        state: AcquireState::Start,
    }
}

/// A quota and the algorithm built for it: the rule a limiter decides by, replaced as one so
/// that no decision ever pairs one quota with another's algorithm.
#[derive(Clone, Copy, Debug)]
struct Rule<A> {
    quota: Quota,
    algorithm: A,
}

impl<A: Algorithm> Rule<A> {
    fn new(quota: Quota, epoch: u64) -> Self {
        Self {
            quota,
            algorithm: A::new(&quota, epoch),
        }
    }

    /// The rule for `quota` that carries on from this one at `now` (see
    /// [`Transitions::with_quota`](crate::algorithm::Transitions::with_quota)).
    fn changed_to(&self, quota: Quota, now: u64) -> Self {
        Self {
            quota,
            algorithm: self.algorithm.with_quota(&quota, now),
        }
    }

    /// Whether a request of `cost` permits can ever be admitted under this rule.
    fn check_cost(&self, cost: u32) -> Result<(), InsufficientCapacity> {
        let capacity = self.algorithm.capacity();
        if cost > capacity {
            Err(InsufficientCapacity::new(cost, capacity))
        } else {
            Ok(())
        }
    }
}

/// What settling an admission changes in a Redis script, by the rule of
/// [`Transitions::settle`](crate::algorithm::Transitions::settle)'s default: never more given
/// back than the admission took, and a charge beyond it no more than one request may take.
#[cfg(feature = "redis")]
#[derive(Clone, Copy, Debug)]
pub(crate) enum Change {
    /// `cost` of its permits go back (a refund, or a settle to less than the estimate).
    Refund(u32),
    /// It cost `cost`, more than (or as much as) its `estimate`: the difference is charged.
    Charge { estimate: u32, cost: u32 },
}

#[cfg(feature = "redis")]
impl Change {
    /// What settling `decision`, admitted for `estimate`, to `cost` changes.
    pub(crate) fn settle(estimate: u32, decision: &Decision, cost: u32) -> Self {
        let estimate = decision.refundable(estimate);
        if cost < estimate {
            Self::Refund(estimate - cost)
        } else {
            Self::Charge { estimate, cost }
        }
    }
}
