//! The retry budget: retries a bounded fraction of first attempts, in exact integers.
//!
//! Amounts are counted in millionths of a retry, so that a ratio given to the millionth is
//! exact: five deposits of 0.2 make one retry, never a little more (tower's budget rounds a
//! fractional percentage up and grants more than asked, tower#857).
//!
//! The window is cut into [`SLOTS`] slots. A first attempt deposits `ratio` into the slot of
//! its time. A retry granted is pending until it is sent (it may wait up to `max_wait`, longer
//! than the window), then withdrawn into the slot of the time it is sent. A slot's deposits
//! count until the slot is a window old (so for the window, less at most a tenth of it), its
//! withdrawals a tenth longer (so for at least the window). A retry is granted when the reserve
//! (`min_per_second` for each second of the window) plus the live deposits, less the live
//! withdrawals and the pending retries, is at least one retry. A retry counts from when it is
//! granted until at least a window after it is sent, and the deposits it spends count no
//! longer than a window (to 10 ns, as the tenths are rounded up): the retries sent in any stretch of time are at most `ratio` times the
//! first attempts made in it or before it (in the window before the earliest grant of one of
//! them, at most the longest wait before the stretch), plus the reserve once for each window
//! the stretch spans.

use crate::clock::Clock;
use crate::sync::{lock, Mutex};

/// One retry, in the budget's units.
pub(super) const ONE: u64 = 1_000_000;

/// The slots a window is cut into.
const SLOTS: u64 = 10;

/// The slots kept: a window's, and one more whose withdrawals still count.
const KEPT: usize = SLOTS as usize + 1;

/// What the slot of one tenth of the window holds.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    /// The slot's number: the clock's reading divided by the slot's length.
    epoch: u64,
    deposited: u64,
    withdrawn: u64,
}

/// The budget every clone of one [`Retry`](super::Retry) shares.
pub(super) struct Budget {
    /// What a first attempt deposits, in units: the ratio.
    deposit: u64,
    /// What the window holds with no deposit, in units: `min_per_second` per second.
    reserve: u64,
    slot_nanos: u64,
    clock: Box<dyn Clock>,
    slots: Mutex<Slots>,
}

/// The slots, and the retries granted and not yet sent, in units.
#[derive(Default)]
struct Slots {
    ring: [Slot; KEPT],
    pending: u64,
}

impl Budget {
    /// A budget of `deposit` units per first attempt and `min_per_second` retries a second,
    /// over `window_nanos` (at least [`SLOTS`] ns, checked by the builder).
    pub(super) fn new(
        deposit: u64,
        min_per_second: u32,
        window_nanos: u64,
        clock: Box<dyn Clock>,
    ) -> Self {
        let reserve =
            u128::from(min_per_second) * u128::from(ONE) * u128::from(window_nanos) / 1_000_000_000;
        Self {
            deposit,
            reserve: u64::try_from(reserve).unwrap_or(u64::MAX),
            // Rounded up, so that `SLOTS` slots span the window at least: a withdrawal counts
            // for the window (a deposit for it less at most a tenth, give or take 10 ns).
            slot_nanos: window_nanos.div_ceil(SLOTS),
            clock,
            slots: Mutex::default(),
        }
    }

    /// Runs `change` on the slots and the index and epoch of the current one. The clock is read
    /// under the lock, and an epoch earlier than the latest slot's (a clock that went back) is
    /// taken as that one, so that slots only move forward.
    fn with_slots<T>(&self, change: impl FnOnce(&mut Slots, usize, u64) -> T) -> T {
        // Each change is a few additions that cannot panic half-way.
        let mut slots = lock(&self.slots);
        let latest = slots.ring.iter().map(|slot| slot.epoch).fold(0, u64::max);
        let epoch = (self.clock.now() / self.slot_nanos).max(latest);
        let index = (epoch % KEPT as u64) as usize;
        if slots.ring[index].epoch != epoch {
            slots.ring[index] = Slot {
                epoch,
                ..Slot::default()
            };
        }
        change(&mut slots, index, epoch)
    }

    /// The units the slots hold at `epoch`, with the reserve, less the pending retries.
    fn balance(&self, slots: &Slots, epoch: u64) -> u64 {
        // One pass over the slots, under the budget's lock: deposits count for `SLOTS` slots,
        // withdrawals for one more.
        let (deposited, withdrawn) =
            slots
                .ring
                .iter()
                .fold((self.reserve, 0u64), |(d, w), slot| {
                    let age = epoch - slot.epoch;
                    let d = if age < SLOTS {
                        d.saturating_add(slot.deposited)
                    } else {
                        d
                    };
                    let w = if age <= SLOTS {
                        w.saturating_add(slot.withdrawn)
                    } else {
                        w
                    };
                    (d, w)
                });
        deposited.saturating_sub(withdrawn.saturating_add(slots.pending))
    }

    /// A first attempt: deposits the ratio.
    pub(super) fn deposit(&self) {
        self.with_slots(|slots, index, _| {
            let slot = &mut slots.ring[index];
            slot.deposited = slot.deposited.saturating_add(self.deposit);
        });
    }

    /// Grants a retry, pending until it is [`sent`](Self::send) or
    /// [`cancelled`](Self::cancel), if the budget holds one.
    pub(super) fn grant(&self) -> bool {
        self.with_slots(|slots, _, epoch| {
            let granted = self.balance(slots, epoch) >= ONE;
            if granted {
                slots.pending += ONE;
            }
            granted
        })
    }

    /// A pending retry is sent: withdrawn into the slot of now, whose epoch it returns for
    /// [`give_back`](Self::give_back).
    pub(super) fn send(&self) -> u64 {
        self.with_slots(|slots, index, epoch| {
            slots.pending = slots.pending.saturating_sub(ONE);
            slots.ring[index].withdrawn += ONE;
            epoch
        })
    }

    /// A pending retry will not be sent.
    pub(super) fn cancel(&self) {
        self.with_slots(|slots, _, _| slots.pending = slots.pending.saturating_sub(ONE));
    }

    /// Gives back a retry sent at `epoch` that never reached the dependency. A withdrawal whose
    /// slot has been forgotten counts no more, so nothing is given back for it.
    pub(super) fn give_back(&self, epoch: u64) {
        self.with_slots(|slots, _, _| {
            let slot = &mut slots.ring[(epoch % KEPT as u64) as usize];
            if slot.epoch == epoch {
                slot.withdrawn = slot.withdrawn.saturating_sub(ONE);
            }
        });
    }

    /// Whole retries the budget holds now.
    pub(super) fn available(&self) -> u64 {
        self.with_slots(|slots, _, epoch| self.balance(slots, epoch) / ONE)
    }
}
