//! The allocation bound: a global allocator that counts the bytes alive and refuses, while a
//! target runs, any allocation that would take them past the target's bound.
//!
//! A parser that believes a lying count (`n_tensors = 2^60`, a `Vec::with_capacity` of a
//! declared size) asks for far more memory than its input could fill. Under [`within`], such a
//! request is refused: the allocator returns null, Rust's allocation-error handler aborts the
//! process with "memory allocation of N bytes failed", and libFuzzer (or the replayer) reports
//! the input that did it. The bound counts every thread's allocations (the server target's
//! workers too), measured from the bytes alive when [`within`] began.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes alive now (allocated and not freed), over every thread.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// The most bytes that may be alive; `usize::MAX` outside [`within`].
static LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);
/// The most bytes alive since [`within`] began.
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counted and bounded.
pub struct Bounded;

fn reserve(bytes: usize) -> bool {
    let live = LIVE
        .fetch_add(bytes, Ordering::Relaxed)
        .saturating_add(bytes);
    if live > LIMIT.load(Ordering::Relaxed) {
        LIVE.fetch_sub(bytes, Ordering::Relaxed);
        return false;
    }
    PEAK.fetch_max(live, Ordering::Relaxed);
    true
}

fn release(bytes: usize) {
    LIVE.fetch_sub(bytes, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's layout and pointer unchanged, so
// `System`'s guarantees hold; the only addition is bookkeeping on atomics (no allocation, no
// panic), and a refused request returns null, which `GlobalAlloc` permits.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !reserve(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as the trait's caller promised for `layout`.
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            release(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !reserve(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as the trait's caller promised for `layout`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            release(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation here is).
        unsafe { System.dealloc(ptr, layout) };
        release(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        if new_size > old && !reserve(new_size - old) {
            return std::ptr::null_mut();
        }
        // SAFETY: as the trait's caller promised for `ptr`, `layout` and `new_size`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            if new_size > old {
                release(new_size - old);
            }
        } else if new_size < old {
            release(old - new_size);
        }
        p
    }
}

/// Runs `f` with at most `extra` more bytes alive than when it began; returns its result and
/// the most bytes it had alive above that start.
///
/// Not reentrant and not for concurrent use: one target runs at a time (libFuzzer's loop and
/// the replayer are sequential).
pub fn within<T>(extra: usize, f: impl FnOnce() -> T) -> (T, usize) {
    let start = LIVE.load(Ordering::Relaxed);
    PEAK.store(start, Ordering::Relaxed);
    LIMIT.store(start.saturating_add(extra), Ordering::Relaxed);
    // Whatever happens in `f` (a panic included), the bound ends with it.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            LIMIT.store(usize::MAX, Ordering::Relaxed);
        }
    }
    let reset = Reset;
    let out = f();
    drop(reset);
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(start);
    (out, peak)
}
