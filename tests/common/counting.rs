//! Test helper: a global allocator that counts, per thread, the heap bytes held and the
//! allocations made, so that a measurement on one thread is not disturbed by tests running
//! beside it. A test binary installs it with
//! `#[path = "../common/counting.rs"] mod counting;` in its `main.rs` (once: it is the process's
//! allocator), and its modules read it through `crate::counting`.

#![allow(dead_code)] // Not every test file reads both counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Counts, delegating the allocation itself to the system allocator.
struct Counting;

fn count(bytes: isize, allocations: u64) {
    // `try_with`: the thread's own storage may already be gone while it exits.
    let _ = LIVE.try_with(|live| live.set(live.get() + bytes));
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + allocations));
}

// SAFETY: every method forwards to `System` with the caller's own arguments, so `System`'s
// guarantees hold unchanged; the only addition is a thread-local counter update, which never
// allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize, 1);
        // SAFETY: same layout as given to us.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize), 0);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize, 1);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The heap bytes this thread holds (allocated and not yet freed by it).
pub fn live_bytes() -> isize {
    LIVE.with(Cell::get)
}

/// The allocations (and reallocations) this thread has made.
pub fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}
