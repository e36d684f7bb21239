//! Leases of a key's permits (GCRA, the fixed window and the sliding counter,
//! [`RedisRateLimiterBuilder::lease`](super::RedisRateLimiterBuilder::lease)):
//! an instance takes a share of a key's burst from Redis in one script call and admits from it
//! without asking, until the share is spent or its time is up.
//!
//! Redis counts a lease's permits as taken at every instant until the lease comes back or ends
//! (see `gcra.lua`), so what Redis can still hand out and what the leases hold are never more
//! than the burst together: the admissions of every instance together keep to the quota, as one
//! GCRA would. The instance stops admitting from a lease before Redis's end of it can have come
//! (its own clock, from before the call was sent, less 100 ppm of drift), and gives the unused
//! permits back when it next asks, or when the lease's time is up.
//!
//! A limiter built with leases holds its [`Leases`], and its decisions take the lease route
//! ([`Inner::lease_decide`]): admit from the share held, or take one in one script call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::key_table::KeyTable;
use super::limiter::Inner;
use super::reply::Reply;
use super::script::{LimiterScript, Operation, ScriptQuota, MAX_TICKS};
use super::{BuildError, RedisCounts, RedisFailure};
use crate::clock::saturating_nanos;
use crate::decision::{Decision, Taken};
use crate::sync::{lock, Mutex, MutexGuard};
use crate::{BoxError, Quota};

/// How a [`RedisRateLimiter`](super::RedisRateLimiter) leases shares of a key's permits; see
/// [`RedisRateLimiterBuilder::lease`](super::RedisRateLimiterBuilder::lease).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lease {
    max_share: Option<u32>,
    length: Option<Duration>,
}

impl Lease {
    /// Leases of at most a quarter of the burst, for a tenth of the quota's period (between a
    /// millisecond and a second): four instances at full demand can hold the whole burst. Both
    /// follow the quota in force: after a `set_quota`, the new one's.
    pub fn new() -> Self {
        Self::default()
    }

    /// The most permits one lease holds (at least 1, at most the burst). Each instance's share
    /// follows its demand up to this: it doubles when a lease is spent before its end, and
    /// halves when one ends with more than half unused.
    pub fn max_share(mut self, permits: u32) -> Self {
        self.max_share = Some(permits);
        self
    }

    /// How long an instance admits from one lease. Permits that an instance which died holding
    /// a lease took out come back to the others when it ends.
    pub fn length(mut self, length: Duration) -> Self {
        self.length = Some(length);
        self
    }

    /// The leases of a limiter of `quota`, checked.
    pub(crate) fn leases(self, quota: &ScriptQuota) -> Result<Leases, BuildError> {
        self.check(quota)?;
        Ok(Leases::new(self))
    }

    /// Whether these leases can be exact under `quota`: at build, and for the quota a config
    /// reload brings (`set_quota` takes any quota the scripts can run, clamping each share).
    pub(crate) fn check(&self, quota: &ScriptQuota) -> Result<(), BuildError> {
        if quota.script == LimiterScript::SlidingLog {
            return Err(BuildError::new(
                "leases cannot be exact with the sliding log: it counts each permit at the \
                 instant it was admitted, and a share is spent over a lease's length",
            ));
        }
        if quota.script == LimiterScript::Metered {
            return Err(BuildError::new(
                "leases cannot be exact with Metered: an admission from a share holds no \
                 estimate in Redis, so its settle could not be charged as of the admission",
            ));
        }
        if quota.script == LimiterScript::Concurrency {
            return Err(BuildError::new(
                "a concurrent policy holds slots, it leases no permits",
            ));
        }
        if self
            .max_share
            .is_some_and(|share| share == 0 || share > quota.capacity)
        {
            return Err(BuildError::at(
                "max_share",
                "a lease's max_share must be at least 1 and at most the burst",
            ));
        }
        let nanos = self.length_nanos(&quota.quota);
        if nanos.div_ceil(quota.tick_nanos) == 0
            || nanos.saturating_mul(2) / quota.tick_nanos > MAX_TICKS
        {
            return Err(BuildError::at(
                "length",
                "a lease's length must be longer than zero and, twice over, within the scripts' exact arithmetic",
            ));
        }
        Ok(())
    }

    /// The most permits of one lease under `quota` (the quota in force, which a `set_quota`
    /// changes): as set, or a quarter of the burst; never more than the burst.
    fn max_share_under(&self, quota: &ScriptQuota) -> u32 {
        let burst = quota.capacity.max(1);
        self.max_share.unwrap_or(burst / 4).clamp(1, burst)
    }

    /// How long an instance admits from one lease under `quota`, in nanoseconds: as set, or a
    /// tenth of the period, from a millisecond to a second (which the scripts always take).
    fn length_nanos(&self, quota: &Quota) -> u64 {
        let period = quota.period() / 10;
        saturating_nanos(
            (self.length)
                .unwrap_or_else(|| period.clamp(Duration::from_millis(1), Duration::from_secs(1))),
        )
    }
}

/// The most keys whose shares one limiter keeps; a key beyond it is decided in Redis each time.
const MAX_KEYS: usize = 10_000;

/// One limiter's leases: the settings in force and the share of each key.
pub(crate) struct Leases {
    /// The most permits of one lease and how long an instance admits from one, as set, or
    /// worked out from the quota in force.
    settings: Lease,
    /// Each key's share; a full table is swept for shares that hold nothing.
    shares: KeyTable<Arc<Share>>,
    counts: Counters,
}

#[derive(Debug, Default)]
struct Counters {
    local: AtomicU64,
    waiting: AtomicU64,
    taken: AtomicU64,
    ended: AtomicU64,
    unused: AtomicU64,
}

/// One key's share: what it holds, and the lock that lets one call at a time ask Redis for the
/// next (the others wait for it, then admit from what it brought).
#[derive(Default)]
pub(crate) struct Share {
    held: Mutex<Held>,
    pub(crate) refill: tokio::sync::Mutex<()>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Held {
    /// The lease's id, 0 for none.
    id: u64,
    /// Its permits, and those left.
    permits: u32,
    left: u32,
    /// The instants of the limiter's clock from which it is admitted from, and from which it
    /// is not any more.
    from: u64,
    until: u64,
    /// The permits the next lease asks for.
    size: u32,
    /// The quota in force when it was granted: under another, its permits may lie in windows
    /// that do not count them (a changed period), so it is given back, not spent.
    quota: Option<Quota>,
}

impl Leases {
    /// Whether these leases can be exact under `quota` (see [`Lease::check`]).
    #[cfg_attr(not(feature = "config"), allow(dead_code))]
    pub(crate) fn check(&self, quota: &ScriptQuota) -> Result<(), BuildError> {
        self.settings.check(quota)
    }

    pub(crate) fn new(settings: Lease) -> Self {
        Self {
            settings,
            shares: KeyTable::new(MAX_KEYS),
            counts: Counters::default(),
        }
    }

    /// `key`'s share, made for it if there is room.
    pub(crate) fn share(&self, key: &str) -> Option<Arc<Share>> {
        let mut shares = self.shares.lock();
        // Shares whose leases are over, and that no call holds, hold nothing.
        let live = |share: &Arc<Share>| Arc::strong_count(share) > 1 || share.held().id != 0;
        self.shares
            .entry(&mut shares, key, Arc::default, live)
            .map(|share| Arc::clone(share))
    }

    /// `key`'s share if it has one already.
    pub(crate) fn existing(&self, key: &str) -> Option<Arc<Share>> {
        self.shares.lock().get(key).cloned()
    }

    /// Decides on `cost` permits from `share` at `now`: admitted if its lease is live and holds
    /// them, refused until it starts if it has not yet; `None` when a lease must be asked for.
    pub(crate) fn take(
        &self,
        share: &Share,
        cost: u32,
        now: u64,
        quota: &ScriptQuota,
    ) -> Option<Decision> {
        let mut held = share.held();
        let other_quota = held.quota != Some(quota.quota);
        if held.id == 0 || now >= held.until || held.left < cost || other_quota {
            return None;
        }
        if now < held.from {
            // Refused without a round trip, as a cached refusal is.
            self.counts.waiting.fetch_add(1, Ordering::Relaxed);
            let wait = Duration::from_nanos(held.from - now);
            let reset = wait + quota.refill(held.permits);
            return Some(Decision::refused(quota.limit, 0, wait, reset));
        }
        self.counts.local.fetch_add(1, Ordering::Relaxed);
        held.left -= cost;
        Some(quota.leased(held.left, held.id))
    }

    /// The next lease call for `cost` permits at `now` with `quota` (the quota in force), and
    /// the id of the lease it asks for: it gives back the share held, which is given up at once
    /// (nothing more is admitted from it). No share is asked beyond the quota's burst, which a
    /// `set_quota` may have brought below the `max_share` set.
    pub(crate) fn ask(
        &self,
        share: &Share,
        cost: u32,
        now: u64,
        quota: &ScriptQuota,
    ) -> (Operation, u64) {
        let mut held = share.held();
        let (back, unused) = held.end(now);
        if back != 0 {
            self.count_ended(unused);
        }
        let wanted = held
            .size
            .clamp(1, self.settings.max_share_under(quota))
            .max(cost);
        held.size = wanted;
        let id = super::next_id();
        // Redis keeps a lease twice as long as the instance admits from it, so that a share
        // given back soon after its end still comes back.
        let length = (self.settings.length_nanos(&quota.quota))
            .saturating_mul(2)
            .div_ceil(quota.tick_nanos);
        let operation = Operation::Lease {
            length,
            wanted,
            id,
            back,
            unused,
            // Set by the caller, once the deadline is known.
            deadline: 0,
        };
        (operation, id)
    }

    /// The lease `id` that `ask` asked for was granted, `permits` of them from `from` until
    /// `until` (the limiter's clock); the asking call takes `cost` of them at `now` if it has
    /// begun, and is refused until then otherwise.
    pub(crate) fn granted(
        &self,
        share: &Share,
        id: u64,
        (permits, from, until): (u64, u64, u64),
        (cost, now): (u32, u64),
        quota: &ScriptQuota,
    ) -> Decision {
        let permits = u32::try_from(permits).unwrap_or(u32::MAX);
        let mut held = share.held();
        *held = Held {
            id,
            permits,
            left: permits,
            from,
            until,
            size: held.size,
            quota: Some(quota.quota),
        };
        self.counts.taken.fetch_add(1, Ordering::Relaxed);
        drop(held);
        let decision = self.take(share, cost, now, quota);
        if decision.as_ref().is_some_and(|d| d.allowed) {
            // Admitted by the call that took the lease: not without a round trip.
            self.counts.local.fetch_sub(1, Ordering::Relaxed);
        }
        decision.unwrap_or_else(|| {
            // A lease over before this call could use it (a clock far off): nothing admitted.
            Decision::refused(quota.limit, 0, Duration::ZERO, Duration::ZERO)
        })
    }

    /// When a lease that the script of `quota` granted from `start` until `end`, at the server's
    /// `time` (its ticks), may be admitted from, the call sent at `sent` and answered at
    /// `received` (the limiter's clock): from the first instant Redis's start has surely come,
    /// for the length of a lease, and never past what Redis's end surely has not.
    pub(crate) fn window(
        &self,
        quota: &ScriptQuota,
        (start, end, time): (u64, u64, u64),
        sent: u64,
        received: u64,
    ) -> (u64, u64) {
        let length = self.settings.length_nanos(&quota.quota);
        if quota.client_clock() {
            // The script ran at this clock's reading: its instants are this clock's.
            return (start, start.saturating_add(length).min(end));
        }
        // The server read its TIME between `sent` and `received`; clocks drift up to 100 ppm.
        let nanos = |ticks: u64| ticks.saturating_mul(quota.tick_nanos);
        let ahead = nanos(start.saturating_sub(time));
        let from = received.saturating_add(ahead.saturating_add(ahead / 10_000));
        let to_end = nanos(end.saturating_sub(time));
        let until = sent.saturating_add(to_end.saturating_sub(to_end / 10_000 + 1));
        (from, until.min(from.saturating_add(length)))
    }

    /// Applies `change` to what `key`'s share holds if it still holds the lease `id`.
    fn with_lease<R>(&self, key: &str, id: u64, change: impl FnOnce(&mut Held) -> R) -> Option<R> {
        let share = self.existing(key)?;
        let mut held = share.held();
        (held.id == id).then(|| change(&mut held))
    }

    /// Ends the lease `id` of `key` after its time, if the share still holds it: what the call
    /// that gives its unused permits back to Redis sends (`None` when there is nothing to send).
    pub(crate) fn end(&self, key: &str, id: u64) -> Option<(u64, u32)> {
        let ended = self.with_lease(key, id, |held| held.end(u64::MAX))?;
        self.count_ended(ended.1);
        Some(ended)
    }

    /// Gives `cost` permits of an admission from the lease `id` back to `key`'s share, if that
    /// lease is still the one held; otherwise they stay spent (Redis counts them as used).
    pub(crate) fn refund(&self, key: &str, id: u64, cost: u32) {
        self.with_lease(key, id, |held| {
            held.left = held.left.saturating_add(cost).min(held.permits);
        });
    }

    /// Takes what it can of a `debt` of more permits from `key`'s share, for an admission from
    /// the lease `id` at `now` (all of it if the share still holds it): the permits taken. The
    /// rest is charged in Redis, and the share is spent first, so that it admits nothing the
    /// debt should have waited for. `None` when the share's lease is over: it pays nothing, and
    /// should be ended and given back before the debt is charged, since behind the debt GCRA
    /// and the fixed window could no longer tell its unused permits from it, and would keep them.
    pub(crate) fn charge(&self, key: &str, id: u64, debt: u32, now: u64) -> Option<u32> {
        let charge = |held: &mut Held| {
            (now < held.until).then(|| {
                let taken = held.left.min(debt);
                held.left -= taken;
                taken
            })
        };
        self.with_lease(key, id, charge).unwrap_or(Some(0))
    }

    /// What these leases have done since they were made: the lease counts of
    /// [`RedisRateLimiter::counts`](super::RedisRateLimiter::counts), the others zero.
    pub(crate) fn counts(&self) -> RedisCounts {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        RedisCounts {
            lease_decisions: read(&self.counts.local),
            refused_before_lease: read(&self.counts.waiting),
            leases_taken: read(&self.counts.taken),
            leases_ended: read(&self.counts.ended),
            lease_unused_permits: read(&self.counts.unused),
            ..RedisCounts::default()
        }
    }

    fn count_ended(&self, unused: u32) {
        self.counts.ended.fetch_add(1, Ordering::Relaxed);
        (self.counts.unused).fetch_add(u64::from(unused), Ordering::Relaxed);
    }
}

impl Held {
    /// Ends the lease held at `now`: its id (0 for none) and unused permits. The next
    /// share follows the demand this one saw: twice as large if it was spent before its end,
    /// half as large if it ended with more than half unused.
    fn end(&mut self, now: u64) -> (u64, u32) {
        let (id, unused) = (self.id, self.left);
        let mut size = self.size.max(1);
        if id != 0 {
            if now < self.until {
                size = size.saturating_mul(2);
            } else if unused > self.permits / 2 {
                size /= 2;
            }
        }
        *self = Held {
            size,
            ..Held::default()
        };
        (id, unused)
    }
}

impl Share {
    fn held(&self) -> MutexGuard<'_, Held> {
        // Every change to a share is a few assignments that cannot panic half-way.
        lock(&self.held)
    }
}

/// What a lease's decisions report on: the quota's limit, and the time its permits take to come
/// back.
impl ScriptQuota {
    /// How long `permits` take to come back: each an emission interval (for the window
    /// algorithms the period's share of one, rounded up as the quota's is).
    fn refill(&self, permits: u32) -> Duration {
        let interval = match self.script {
            LimiterScript::Gcra => self.per_permit().saturating_mul(self.tick_nanos),
            _ => self.quota.emission_interval_nanos(),
        };
        Duration::from_nanos(u64::from(permits).saturating_mul(interval))
    }

    /// An admission from the lease `id`, with `left` permits left in it: what an in-memory GCRA
    /// with that many left would say (the bucket full again after the others come back).
    fn leased(&self, left: u32, id: u64) -> Decision {
        let missing = u32::try_from(self.limit.saturating_sub(u64::from(left)));
        let reset = self.refill(missing.unwrap_or(u32::MAX));
        let mut decision = Decision::allowed(self.limit, u64::from(left), reset);
        decision.admission.taken = Taken::RedisLease { lease: id };
        decision
    }
}

/// The lease route of a decision: admitting from the share of a key this instance holds, or
/// taking a new one in one script call, and giving a share back when its time is up.
impl Inner {
    /// The decision on `cost` permits for `key` from the share of it this instance holds, if
    /// leases are on and the share can decide without a round trip.
    pub(super) fn share_decision(
        &self,
        quota: &ScriptQuota,
        key: &str,
        cost: u32,
    ) -> Option<Decision> {
        let leases = self.leases.as_ref()?;
        let share = leases.existing(key)?;
        let decision = leases.take(&share, cost, quota.reading(&*self.clock), quota)?;
        Some(self.stamp(decision, key, cost))
    }

    /// Decides on `cost` permits for `key` from a lease: the share this instance holds, or a
    /// new one that one script call takes (giving the spent one back), while the key's other
    /// calls wait for it and then admit from it. Without leases, a key without room for a
    /// share, or a call that may wait and finds no lease to be had, is decided as without
    /// leases ([`decide`](Self::decide)).
    pub(super) async fn lease_decide(
        self: &Arc<Self>,
        quota: &ScriptQuota,
        key: String,
        cost: u32,
        max_wait: u64,
    ) -> Result<Decision, BoxError> {
        let leases = self.leases.as_ref();
        let Some((leases, share)) = leases.and_then(|l| Some((l, l.share(&key)?))) else {
            return self.decide(quota, key, cost, max_wait).await;
        };
        // A caller waits for the key's turn at most as long as for a call (the calls ahead of
        // it in a stall would each add their timeout), then is decided without leases: Redis
        // decides it on a healthy server (a fail mode's answer to a long queue could admit what
        // Redis refuses), and its own call is bounded as every call is.
        let longest_wait = self.store.longest_wait(self.timeout);
        let Ok(one_at_a_time) = tokio::time::timeout(longest_wait, share.refill.lock()).await
        else {
            return self.decide(quota, key, cost, max_wait).await;
        };
        // The call before this one's turn may have brought a share, or a refusal.
        if let Some(decision) = leases.take(&share, cost, quota.reading(&*self.clock), quota) {
            return Ok(self.stamp(decision, &key, cost));
        }
        if let Some(refusal) = self.cached_refusal(quota, &key, cost, max_wait) {
            return Ok(refusal);
        }
        let sent = quota.reading(&*self.clock);
        let answered_by = (self.clock.now()).saturating_add(saturating_nanos(longest_wait));
        let call = async {
            // As a decision's: a lease call that Redis runs after its caller was answered
            // changes nothing, and a first "late" answer (which corrected the offset) goes once
            // more, the same lease: the late one changed nothing.
            let (mut operation, id) = leases.ask(&share, cost, sent, quota);
            for _ in 0..2 {
                if let Operation::Lease { deadline, .. } = &mut operation {
                    *deadline = self.offset.server_deadline(answered_by).unwrap_or(0);
                }
                match self.run_script(quota, &key, operation, cost).await? {
                    Reply::Late(_) => {}
                    reply => return Ok((reply, id)),
                }
            }
            Err(RedisFailure::Late)
        };
        let decision = match self.bounded(quota, call, false).await {
            Ok((
                Reply::Leased {
                    permits,
                    start,
                    end,
                    time,
                    ..
                },
                id,
            )) => {
                let now = quota.reading(&*self.clock);
                let (from, until) = leases.window(quota, (start, end, time), sent, now);
                let grant = (permits, from, until);
                let decision = leases.granted(&share, id, grant, (cost, now), quota);
                drop(one_at_a_time);
                let over_in = Duration::from_nanos(until.saturating_sub(now));
                self.give_back_at_end(key.clone(), id, over_in);
                decision
            }
            Ok((Reply::Decision(refused, _), _)) if !refused.allowed => {
                drop(one_at_a_time);
                if max_wait > 0 {
                    return self.decide(quota, key, cost, max_wait).await;
                }
                self.cache_refusal(&key, cost, &refused);
                refused
            }
            reply => {
                let failure =
                    reply.map_or_else(|failure| failure, |(r, _)| r.unexpected("a lease"));
                return (self.fail_mode).decide(self.store.id, quota.limit, key, cost, failure);
            }
        };
        Ok(self.stamp(decision, &key, cost))
    }

    /// When the lease `id` of `key` is over (`over_in` from now), gives its unused permits
    /// back to Redis, unless a later call has given it back already.
    ///
    /// The task holds the limiter weakly: a limiter dropped meanwhile gives nothing back, and
    /// Redis ends the lease by itself.
    fn give_back_at_end(self: &Arc<Self>, key: String, id: u64, over_in: Duration) {
        let inner = Arc::downgrade(self);
        super::spawn(async move {
            tokio::time::sleep(over_in).await;
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let ended = (inner.leases.as_ref()).and_then(|leases| leases.end(&key, id));
            if let Some(ended) = ended {
                inner.give_back_share(&key, ended).await;
            }
        });
    }

    /// Gives the unused permits of a share just ended (`ended`: its lease's id and those
    /// permits, from [`Leases::end`]) back to Redis.
    pub(super) async fn give_back_share(&self, key: &str, (id, unused): (u64, u32)) {
        let quota = self.quota.load_full();
        let operation = Operation::EndLease { id, unused };
        let call = self.run_script(&quota, key, operation, 0);
        // Failures are counted and logged inside; the lease ends in Redis anyway.
        let _ = self.bounded(&quota, call, true).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table full of shares in use turns new keys away (they are decided in Redis). It is
    /// swept for shares that hold nothing at the first key turned away and then once for each
    /// quarter of the table turned away, never for every key: room freed meanwhile is found at
    /// the next sweep.
    #[test]
    fn a_full_table_is_swept_once_for_a_quarter_of_its_keys_turned_away() {
        let leases = Leases::new(Lease::new());
        let in_use: Vec<_> = (0..MAX_KEYS)
            .map(|i| leases.share(&i.to_string()).unwrap())
            .collect();
        assert!(leases.share("new").is_none(), "swept, but all are in use");
        drop(in_use);
        for i in 1..MAX_KEYS / 4 {
            assert!(
                leases.share(&format!("new {i}")).is_none(),
                "{i}: not swept"
            );
        }
        assert!(leases.share("last").is_some(), "swept: room for it");
        assert!(leases.share("one more").is_some());
    }
}
