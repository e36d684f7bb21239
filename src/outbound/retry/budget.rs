//! The retry budget: retries a bounded fraction of first attempts, in exact integers.
//!
//! Amounts are counted in millionths of a retry, so that a ratio given to the millionth is
//! exact: five deposits of 0.2 make one retry, never a little more (tower's budget rounds a
//! fractional percentage up and grants more than asked, tower#857).
//!
//! The window is cut into [`SLOTS`] slots. A first attempt deposits `ratio` into the slot of
//! its time, a retry withdraws one retry into the slot of its time, and a slot is forgotten
//! whole, deposits and withdrawals alike, once it is a window old. A retry is granted when the
//! reserve (`min_per_second` for each second of the window) plus what the live slots hold is at
//! least one retry. A withdrawal is never older than the deposits it spends, so it outlives
//! them: the retries of any stretch of time are at most `ratio` times the first attempts made in
//! it or in the window before it (whose deposits are still live when it begins), plus the
//! reserve once for each window the stretch spans.

use crate::clock::Clock;
use crate::sync::{lock, Mutex};

/// One retry, in the budget's units.
pub(super) const ONE: u64 = 1_000_000;

/// The slots a window is cut into.
const SLOTS: u64 = 10;

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
    slots: Mutex<[Slot; SLOTS as usize]>,
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
            slot_nanos: window_nanos / SLOTS,
            clock,
            slots: Mutex::new([Slot::default(); SLOTS as usize]),
        }
    }

    /// Runs `change` on the slots and the index and epoch of the current one. The clock is read
    /// under the lock, and an epoch earlier than the latest slot's (a clock that went back) is
    /// taken as that one, so that slots only move forward.
    fn with_slots<T>(&self, change: impl FnOnce(&mut [Slot], usize, u64) -> T) -> T {
        // Each change is a few additions that cannot panic half-way.
        let mut slots = lock(&self.slots);
        let latest = slots.iter().map(|slot| slot.epoch).fold(0, u64::max);
        let epoch = (self.clock.now() / self.slot_nanos).max(latest);
        let index = (epoch % SLOTS) as usize;
        if slots[index].epoch != epoch {
            slots[index] = Slot {
                epoch,
                ..Slot::default()
            };
        }
        change(&mut slots[..], index, epoch)
    }

    /// The units the slots live at `epoch` hold, with the reserve.
    fn balance(&self, slots: &[Slot], epoch: u64) -> u64 {
        let live = slots.iter().filter(|slot| epoch - slot.epoch < SLOTS);
        // One pass over the live slots, under the budget's lock.
        let (deposited, withdrawn) = live.fold((self.reserve, 0u64), |(d, w), slot| {
            (
                d.saturating_add(slot.deposited),
                w.saturating_add(slot.withdrawn),
            )
        });
        deposited.saturating_sub(withdrawn)
    }

    /// A first attempt: deposits the ratio.
    pub(super) fn deposit(&self) {
        self.with_slots(|slots, index, _| {
            let slot = &mut slots[index];
            slot.deposited = slot.deposited.saturating_add(self.deposit);
        });
    }

    /// Withdraws one retry if the budget holds one: the epoch of the slot it was taken from,
    /// for [`give_back`](Self::give_back).
    pub(super) fn withdraw(&self) -> Option<u64> {
        self.with_slots(|slots, index, epoch| {
            if self.balance(slots, epoch) < ONE {
                return None;
            }
            slots[index].withdrawn += ONE;
            Some(epoch)
        })
    }

    /// Gives back a retry withdrawn at `epoch` and never sent. A withdrawal whose slot has been
    /// forgotten counts no more, so nothing is given back for it.
    pub(super) fn give_back(&self, epoch: u64) {
        self.with_slots(|slots, _, _| {
            let slot = &mut slots[(epoch % SLOTS) as usize];
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
