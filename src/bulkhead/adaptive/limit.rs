//! Limit algorithms: how finished calls become a new limit.

use std::time::Duration;

use crate::setting::{ensure, SettingError};

/// What the settings of this module build, in their errors.
const OF: &str = "adaptive bulkhead";

use crate::bulkhead::permits::MAX_CONCURRENT_CALLS;
use crate::clock::{saturating_nanos, Clock};

/// The longest round trip an algorithm takes at face value, 2^40 ns (about 18 minutes). A longer
/// one (a broken clock, `Duration::MAX`) is taken as this, so that no window lasts for ages.
pub(crate) const MAX_RTT: Duration = Duration::from_nanos(1 << 40);

/// The bounds of an adaptive limit and where it starts: `1 <= min <= initial <= max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    min: usize,
    initial: usize,
    max: usize,
}

impl Limits {
    /// Checks and keeps the bounds; `min` must be at least 1, `initial` between `min` and `max`,
    /// and `max` at most 2^31 - 1, the largest limit a bulkhead takes.
    pub fn new(min: usize, initial: usize, max: usize) -> Result<Self, SettingError> {
        let zero = "at least 1: a limit of zero would refuse every call and never learn again";
        ensure(OF, min > 0, "min_limit", min, zero)?;
        let over = "at most 2^31 - 1";
        ensure(OF, max <= MAX_CONCURRENT_CALLS, "max_limit", max, over)?;
        let with_max = format!("{min} (with max_limit {max})");
        ensure(OF, min <= max, "min_limit", with_max, "at most max_limit")?;
        let between = (min..=max).contains(&initial);
        let with_both = format!("{initial} (with min_limit {min} and max_limit {max})");
        let expected = "between min_limit and max_limit";
        ensure(OF, between, "initial_limit", with_both, expected)?;
        Ok(Self { min, initial, max })
    }

    /// The lowest the limit goes.
    pub fn min(&self) -> usize {
        self.min
    }

    /// The limit before the first sample.
    pub fn initial(&self) -> usize {
        self.initial
    }

    /// The highest the limit goes.
    pub fn max(&self) -> usize {
        self.max
    }

    /// `limit` brought within `min..=max`.
    pub fn clamp(&self, limit: usize) -> usize {
        limit.clamp(self.min, self.max)
    }

    /// `limit` brought within `min..=max`; NaN is `min` (`f64::max` ignores it).
    fn clamp_f64(&self, limit: f64) -> f64 {
        limit.max(self.min as f64).min(self.max as f64)
    }
}

/// The adaptive bulkhead's limits by default (minimum, initial, maximum), the builder's and the
/// config file's.
pub(crate) const DEFAULT_LIMITS: [u32; 3] = [1, 8, 256];

impl Default for Limits {
    /// From 1 to 256, starting at 8.
    fn default() -> Self {
        let [min, initial, max] = DEFAULT_LIMITS.map(|n| n as usize);
        Self { min, initial, max }
    }
}

/// What one finished call tells a [`LimitAlgorithm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sample {
    /// When the call ended, as clock time since the clock's origin.
    pub at: Duration,
    /// How long the call held its permit, less its waits in this crate's layers below (a
    /// bulkhead's queue, a hold, a quota's wait): the dependency's time. A call cancelled
    /// while it still waits below counts that wait. The algorithms take at most 2^40 ns (about 18
    /// minutes) at face value: a longer one (a broken clock, `Duration::MAX`) counts as that
    /// long, so that no window lasts for ages.
    pub rtt: Duration,
    /// Calls holding a permit when this one was admitted, itself included.
    pub in_flight: usize,
    /// The limit in force when the sample arrived.
    pub limit: usize,
    /// The limit in force when the call was admitted (the limit may have moved while the call
    /// ran).
    pub admission_limit: usize,
    /// Whether the call said the dependency is overloaded (429, 503, a timeout...).
    pub overloaded: bool,
}

impl Sample {
    /// A call that ended at `at` (clock time since the clock's origin) after `rtt`, admitted when
    /// `in_flight` calls held a permit (itself included), while the limit is `limit`; a healthy
    /// answer unless marked with [`overloaded`](Self::overloaded). It was admitted under the
    /// same limit unless told otherwise with [`admitted_under`](Self::admitted_under).
    pub fn new(at: Duration, rtt: Duration, in_flight: usize, limit: usize) -> Self {
        Self {
            at,
            rtt,
            in_flight,
            limit,
            admission_limit: limit,
            overloaded: false,
        }
    }

    /// The sample of a call admitted at `started` (a reading of `clock`) that ends now, with
    /// `in_flight` and the limit `limit` as in [`new`](Self::new).
    pub(crate) fn ended(clock: &dyn Clock, started: u64, in_flight: usize, limit: usize) -> Self {
        let now = clock.now();
        let rtt = Duration::from_nanos(now.saturating_sub(started));
        Self::new(Duration::from_nanos(now), rtt, in_flight, limit)
    }

    /// Sets the limit that was in force when the call was admitted.
    pub fn admitted_under(mut self, limit: usize) -> Self {
        self.admission_limit = limit;
        self
    }

    /// Marks the sample as an overload signal (or not).
    pub fn overloaded(mut self, overloaded: bool) -> Self {
        self.overloaded = overloaded;
        self
    }

    /// Whether the call was admitted with the limit reached: `in_flight` at least the limit in
    /// force then. A call admitted under a higher limit that ends after it came down was not.
    pub fn found_limit_reached(&self) -> bool {
        self.in_flight >= self.admission_limit
    }
}

/// A way to move an adaptive limit, one finished call at a time.
///
/// The bulkhead calls [`update`](Self::update) under its own lock, once per call that gave a
/// sample, in the order the calls ended; the limit it returns is brought within the bounds and
/// takes effect at once. Implement it to plug in an algorithm of your own.
pub trait LimitAlgorithm: Send + 'static {
    /// Takes in one sample and returns the new limit (the bulkhead clamps it to `limits`).
    fn update(&mut self, sample: &Sample, limits: &Limits) -> usize;
}

impl<A: LimitAlgorithm + ?Sized> LimitAlgorithm for Box<A> {
    fn update(&mut self, sample: &Sample, limits: &Limits) -> usize {
        (**self).update(sample, limits)
    }
}

/// What one round trip's worth of samples showed.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Round {
    /// Mean round trip of the healthy samples, in nanoseconds; `None` if there were none.
    mean_rtt: Option<f64>,
    /// Whether any sample was an overload signal.
    overloaded: bool,
    /// Whether some call of the round was admitted with the limit in force then reached.
    in_use: bool,
    /// Whether some call of the round was admitted with more calls in flight than the minimum
    /// limit.
    crowded: bool,
}

/// Groups samples into rounds of one round trip each, so that an algorithm decides at most once
/// per round trip.
///
/// The first sample opens a round that lasts its own round trip; each later round lasts the mean
/// round trip of the round before, or the baseline if that is shorter (so that queueing at the
/// dependency, which lengthens round trips, does not slow the way down); a round without a
/// healthy sample is followed by one as long as itself. A round closes with the first sample
/// that ends at or after its end; a sample that ends before the round began (a clock that went
/// back) starts the round again from its own instant.
#[derive(Clone, Debug, Default)]
struct Rounds {
    end: Option<u64>,
    length: u64,
    rtt_sum: f64,
    healthy: u64,
    overloaded: bool,
    in_use: bool,
    crowded: bool,
}

impl Rounds {
    fn add(&mut self, sample: &Sample, baseline: Option<f64>, min: usize) -> Option<Round> {
        let at = saturating_nanos(sample.at);
        // A zero round trip (a coarse clock) still counts, as one nanosecond.
        let rtt = saturating_nanos(sample.rtt.min(MAX_RTT)).max(1);
        if sample.overloaded {
            self.overloaded = true;
        } else {
            self.rtt_sum += rtt as f64;
            self.healthy += 1;
        }
        self.in_use |= sample.found_limit_reached();
        self.crowded |= sample.in_flight > min;
        let Some(end) = self.end else {
            self.length = rtt;
            self.end = Some(at.saturating_add(rtt));
            return None;
        };
        if at < end.saturating_sub(self.length) {
            // Before the round began: the clock went back, or one reading was absurd (the end of
            // time). The round starts again from here, so that it still lasts its length and no
            // more, instead of waiting for the clock to catch up.
            self.end = Some(at.saturating_add(self.length));
            return None;
        }
        if at < end {
            return None;
        }
        let round = Round {
            mean_rtt: (self.healthy > 0).then(|| self.rtt_sum / self.healthy as f64),
            overloaded: self.overloaded,
            in_use: self.in_use,
            crowded: self.crowded,
        };
        if let Some(mean) = round.mean_rtt {
            // Within 1..=MAX_RTT, as every sample and so the baseline was.
            self.length = baseline.map_or(mean, |base| base.min(mean)) as u64;
        }
        *self = Self {
            end: Some(at.saturating_add(self.length.max(1))),
            length: self.length,
            ..Self::default()
        };
        Some(round)
    }
}

/// The no-load round trip, learnt from rounds. For the first [`WARM_UP`] rounds it is their
/// plain mean (one round of a few samples is too noisy to judge the next by); after that a slow
/// average of the rounds within the latency tolerance of it. Rounds above the tolerance are
/// queueing at the dependency and are not learnt, except when the limit is already at its
/// minimum: latency that stays high with nothing left to shed is the dependency's new normal.
#[derive(Clone, Copy, Debug, Default)]
struct Baseline {
    nanos: Option<f64>,
    rounds: u32,
}

/// Rounds over which the baseline is a plain mean.
const WARM_UP: u32 = 16;

impl Baseline {
    fn learn(&mut self, mean: f64, tolerance: f64, at_min: bool) {
        let base = self.nanos.unwrap_or(mean);
        self.nanos = Some(if self.rounds < WARM_UP {
            self.rounds += 1;
            base + (mean - base) / f64::from(self.rounds)
        } else if mean <= base * tolerance || at_min {
            base + (mean - base) / 16.0
        } else {
            base
        });
    }
}

/// Additive increase, multiplicative decrease: the default [`LimitAlgorithm`].
///
/// Samples are taken one round trip at a time (see the [guide](crate::guide#adaptive-bulkheads)).
/// At the end of each round trip the limit
///
/// * is multiplied by `backoff` (default 0.8) if any call in it was an overload signal, or if
///   the round trip's mean latency rose above `latency_tolerance` (default 1.3) times its
///   baseline, the slowly learnt no-load latency;
/// * otherwise grows by one if it was in use — some call in that round trip was admitted with
///   the limit reached —, and stays as it is if not.
///
/// So it grows by at most one per round trip, and only while callers are held back by it.
#[derive(Clone, Debug)]
pub struct Aimd {
    backoff: f64,
    tolerance: f64,
    learnt: Learnt,
}

impl Default for Aimd {
    /// AIMD with a backoff of 0.8 and a latency tolerance of 1.3.
    fn default() -> Self {
        Self {
            backoff: 0.8,
            tolerance: 1.3,
            learnt: Learnt::default(),
        }
    }
}

impl Aimd {
    /// The factor the limit is multiplied by on overload; strictly between 0 and 1.
    pub fn backoff(mut self, backoff: f64) -> Result<Self, SettingError> {
        let ok = backoff > 0.0 && backoff < 1.0;
        ensure(OF, ok, "backoff", backoff, "strictly between 0 and 1")?;
        self.backoff = backoff;
        Ok(self)
    }

    /// How many times its baseline a round trip's mean latency may reach before it counts as
    /// overload; at least 1, and finite (`f64::INFINITY` is refused: use a large value to turn
    /// the latency signal off).
    pub fn latency_tolerance(mut self, tolerance: f64) -> Result<Self, SettingError> {
        self.tolerance = check_tolerance(tolerance)?;
        Ok(self)
    }

    /// Takes the baseline from the least loaded round trips and probes for it, as
    /// [`Gradient::probe_every`] does, instead of learning it slowly from the round trips within
    /// the tolerance of it (off by default; `rounds` at least 1). Without it, a flood from the
    /// start passes its own queueing off as the baseline, and the limit settles with the
    /// latency at `latency_tolerance` times that.
    pub fn probe_every(mut self, rounds: u32) -> Result<Self, SettingError> {
        self.learnt.probe_every(rounds)?;
        Ok(self)
    }
}

fn check_tolerance(tolerance: f64) -> Result<f64, SettingError> {
    let ok = tolerance >= 1.0 && tolerance.is_finite();
    let expected = "a finite number of at least 1";
    ensure(OF, ok, "latency_tolerance", tolerance, expected)?;
    Ok(tolerance)
}

/// The baseline of [`Gradient::probe_every`]: the lowest mean latency of the uncrowded rounds
/// (every call admitted with at most the minimum limit in flight) over the last two periods of
/// `every` rounds, and the limit to go back to after a probe.
#[derive(Clone, Copy, Debug, Default)]
struct Lowest {
    every: u32,
    /// Rounds closed in the current period.
    rounds: u32,
    current: Option<f64>,
    previous: Option<f64>,
    /// While probing: the estimate the limit had when the probe began.
    resume: Option<f64>,
    /// While probing: the round trips probed, and the lowest mean latency among them.
    probed: (u32, Option<f64>),
}

/// The most round trips a probe waits for an uncrowded one; then the lowest of its round trips
/// stands in for the baseline.
const PROBE_ROUNDS: u32 = 10;

impl Lowest {
    /// The baseline: the lower of the two periods' lowest, if either has one.
    fn nanos(&self) -> Option<f64> {
        (self.current.into_iter().chain(self.previous)).reduce(f64::min)
    }

    /// Learns `round` and returns the estimate after it: `next` as the algorithm decided, or the
    /// minimum while no baseline is known (a probe), or after a probe the estimate it began at.
    fn after(&mut self, round: &Round, current: f64, next: f64, min: f64) -> f64 {
        let healthy = round.mean_rtt.filter(|_| !round.overloaded);
        let lowest = |low: Option<f64>, mean: f64| Some(low.map_or(mean, |low| low.min(mean)));
        if let (Some(mean), false) = (healthy, round.crowded) {
            self.current = lowest(self.current, mean);
        }
        if self.resume.is_some() {
            // Calls that may go above the limit (an overload's critical requests) can keep
            // every round trip of a probe crowded: after PROBE_ROUNDS, its lowest stands in.
            let (rounds, low) = self.probed;
            let low = healthy.map_or(low, |mean| lowest(low, mean));
            self.probed = (rounds + 1, low);
            if rounds + 1 >= PROBE_ROUNDS && self.nanos().is_none() {
                self.current = low;
            }
        }
        self.rounds += 1;
        if self.rounds >= self.every {
            self.rounds = 0;
            self.previous = self.current.take();
        }
        match (self.nanos(), self.resume) {
            (None, resume) => {
                self.resume = Some(resume.unwrap_or(current));
                min
            }
            (Some(_), Some(resume)) => {
                self.resume = None;
                self.probed = (0, None);
                resume
            }
            (Some(_), None) => next,
        }
    }
}

/// What an algorithm has learnt so far: its fractional estimate of the limit, the round in
/// progress and the baseline (the slow one, or the lowest with [`Gradient::probe_every`]).
#[derive(Clone, Debug, Default)]
struct Learnt {
    estimate: Option<f64>,
    rounds: Rounds,
    baseline: Baseline,
    lowest: Option<Lowest>,
}

impl Learnt {
    /// Takes the baseline from the lowest uncrowded round trips, probing for it
    /// ([`Gradient::probe_every`]).
    fn probe_every(&mut self, rounds: u32) -> Result<(), SettingError> {
        let expected = "at least 1 round trip";
        ensure(OF, rounds > 0, "probe_every", rounds, expected)?;
        self.lowest = Some(Lowest {
            every: rounds,
            ..Lowest::default()
        });
        Ok(())
    }

    /// Adds `sample`; when it closes a round, `decide` turns the round, the current estimate and
    /// the baseline before the round into the next estimate, and the baseline learns the round.
    /// Returns the limit: the estimate rounded down, within the bounds.
    fn update(
        &mut self,
        sample: &Sample,
        limits: &Limits,
        tolerance: f64,
        decide: impl FnOnce(Round, f64, Option<f64>) -> f64,
    ) -> usize {
        // The estimate carried over, unless the bulkhead's limit is no longer the one it came
        // from (the bounds cut it, or it is the first sample).
        let current = match self.estimate {
            Some(estimate) if estimate.floor() as usize == sample.limit => estimate,
            _ => limits.clamp(sample.limit) as f64,
        };
        let baseline = match &self.lowest {
            Some(lowest) => lowest.nanos(),
            None => self.baseline.nanos,
        };
        let next = match self.rounds.add(sample, baseline, limits.min()) {
            Some(round) => {
                let next = limits.clamp_f64(decide(round, current, baseline));
                let min = limits.min() as f64;
                match &mut self.lowest {
                    Some(lowest) => limits.clamp_f64(lowest.after(&round, current, next, min)),
                    None => {
                        if let (Some(mean), false) = (round.mean_rtt, round.overloaded) {
                            self.baseline.learn(mean, tolerance, current <= min);
                        }
                        next
                    }
                }
            }
            None => current,
        };
        self.estimate = Some(next);
        limits.clamp(next.floor() as usize)
    }
}

impl LimitAlgorithm for Aimd {
    fn update(&mut self, sample: &Sample, limits: &Limits) -> usize {
        let decide = |round: Round, current, baseline: Option<f64>| {
            let slow = match (round.mean_rtt, baseline) {
                (Some(mean), Some(base)) => mean > base * self.tolerance,
                _ => false,
            };
            if round.overloaded || slow {
                current * self.backoff
            } else if round.in_use {
                current + 1.0
            } else {
                current
            }
        };
        self.learnt.update(sample, limits, self.tolerance, decide)
    }
}

/// A delay-based [`LimitAlgorithm`] after Netflix's Gradient2: the limit follows the ratio of
/// the no-load latency to the latency now.
///
/// At the end of each round trip, with `long` the baseline (slowly learnt from the round trips
/// within the tolerance of it, or the lowest latency found by probing with
/// [`probe_every`](Self::probe_every)) and `short` the round trip's mean latency:
///
/// * `gradient = clamp(tolerance × long / short, 0.5, 1)` (0.5 when a call in it was an
///   overload signal, `tolerance` 1.1 by default);
/// * `target = limit × gradient + headroom`, where the headroom is `sqrt(limit)` while the
///   limit is in use and no call signalled overload, and zero otherwise, so it never grows
///   while callers do not need it;
/// * `limit = limit × (1 - smoothing) + target × smoothing`, `smoothing` 0.3 by default.
///
/// Below `tolerance` times its baseline latency the limit grows by up to
/// `smoothing × sqrt(limit)` per round trip while in use. Above it the limit shrinks when not in
/// use; in use, the headroom still counts, so the limit settles where
/// `limit × (1 - gradient) = sqrt(limit)`, at `1 / (1 - gradient)²`: about 14 at 1.5 times the
/// baseline latency, 5 at twice it (a smaller limit still grows towards that, a larger one
/// shrinks). An overload signal always shrinks it.
#[derive(Clone, Debug)]
pub struct Gradient {
    tolerance: f64,
    smoothing: f64,
    learnt: Learnt,
}

impl Default for Gradient {
    /// Gradient with a tolerance of 1.1 and a smoothing of 0.3.
    fn default() -> Self {
        Self {
            tolerance: 1.1,
            smoothing: 0.3,
            learnt: Learnt::default(),
        }
    }
}

impl Gradient {
    /// How many times its baseline the latency may reach before the limit shrinks; at least 1
    /// and finite.
    pub fn latency_tolerance(mut self, tolerance: f64) -> Result<Self, SettingError> {
        self.tolerance = check_tolerance(tolerance)?;
        Ok(self)
    }

    /// How far the limit moves towards each round trip's target; above 0 and at most 1.
    pub fn smoothing(mut self, smoothing: f64) -> Result<Self, SettingError> {
        let ok = smoothing > 0.0 && smoothing <= 1.0;
        ensure(OF, ok, "smoothing", smoothing, "above 0 and at most 1")?;
        self.smoothing = smoothing;
        Ok(self)
    }

    /// Takes the baseline from the least loaded round trips and probes for it, instead of
    /// learning it slowly from every round trip (off by default; `rounds` at least 1).
    ///
    /// A round trip is uncrowded when every call in it was admitted with at most the minimum
    /// limit in flight. The baseline is the lowest mean latency of the uncrowded round trips
    /// over the last two periods of `rounds` round trips, so it follows a service that became
    /// slower within two periods. When there was none for that long (at the start, or under a
    /// flood that keeps the limit above its minimum), the limit drops to its minimum until a
    /// round trip is uncrowded, then goes back to where it was. So a flood from the start, which
    /// never lets a round trip run at the no-load latency by itself, still finds it. A probe
    /// lasts at most 10 round trips: then the lowest mean latency among them stands in, as when
    /// calls that may go above the limit (an [`Overload`](crate::overload::Overload)'s critical
    /// requests) keep more than the minimum in flight on their own.
    pub fn probe_every(mut self, rounds: u32) -> Result<Self, SettingError> {
        self.learnt.probe_every(rounds)?;
        Ok(self)
    }
}

impl LimitAlgorithm for Gradient {
    fn update(&mut self, sample: &Sample, limits: &Limits) -> usize {
        let decide = |round: Round, current: f64, baseline: Option<f64>| {
            let gradient = match (round.mean_rtt, round.overloaded) {
                (Some(short), false) => {
                    let long = baseline.unwrap_or(short);
                    (self.tolerance * long / short).clamp(0.5, 1.0)
                }
                _ => 0.5,
            };
            let headroom = if round.in_use && !round.overloaded {
                current.sqrt()
            } else {
                0.0
            };
            let target = current * gradient + headroom;
            current * (1.0 - self.smoothing) + target * self.smoothing
        };
        self.learnt.update(sample, limits, self.tolerance, decide)
    }
}
