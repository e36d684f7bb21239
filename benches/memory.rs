//! Memory per key of the keyed limiters, measured with a counting allocator.
//!
//! ```sh
//! cargo bench --bench memory
//! ```
//!
//! Inserts 1 000 000 distinct IPv4 keys into a keyed limiter and divides the bytes still
//! allocated by the number of keys; the same for governor's keyed limiter, and for our limiter
//! keyed by `IpAddr` (the HTTP layer's key), in the same run.

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicIsize, Ordering};

use tower_bulwark::{KeyedRateLimiter, Quota};

/// Counts live heap bytes, delegating the allocation itself to the system allocator.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every method forwards to `System` with the caller's own arguments, so `System`'s
// guarantees hold unchanged; the only addition is an atomic counter update.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same layout as given to us.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const KEYS: u32 = 1_000_000;

fn measure<T>(name: &str, build: impl FnOnce() -> T) -> f64 {
    let before = LIVE.load(Ordering::Relaxed);
    let value = build();
    let after = LIVE.load(Ordering::Relaxed);
    let per_key = (after - before) as f64 / f64::from(KEYS);
    println!("{name:<32} {per_key:>7.1} bytes/key");
    drop(value);
    per_key
}

fn ip(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(i.wrapping_mul(2_654_435_761))
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing we need.
    let quota = Quota::per_second(10).unwrap();
    let ours_v4 = measure("bulwark KeyedRateLimiter<Ipv4Addr>", || {
        let l = KeyedRateLimiter::<Ipv4Addr>::builder(quota)
            .max_keys(2_000_000)
            .build();
        for i in 0..KEYS {
            l.check(&ip(i));
        }
        assert_eq!(l.len(), KEYS as usize);
        l
    });
    let ours_ip = measure("bulwark KeyedRateLimiter<IpAddr>", || {
        let l = KeyedRateLimiter::<IpAddr>::builder(quota)
            .max_keys(2_000_000)
            .build();
        for i in 0..KEYS {
            l.check(&IpAddr::V4(ip(i)));
        }
        l
    });
    let gov = measure("governor keyed (dashmap) <Ipv4Addr>", || {
        let l =
            governor::RateLimiter::keyed(governor::Quota::per_second(NonZeroU32::new(10).unwrap()));
        for i in 0..KEYS {
            let _ = l.check_key(&ip(i));
        }
        l
    });
    println!(
        "ratio governor/bulwark (Ipv4Addr): {:.2}x; IpAddr keys cost {:.1} bytes more per key",
        gov / ours_v4,
        ours_ip - ours_v4
    );
}
