//! A memory budget for untrusted computations (a GGUF file's chat template): a global-allocator
//! wrapper that counts the bytes one thread allocates while it has a budget, and a runner that
//! gives a closure its own short-lived thread with a budget.
//!
//! Why an allocator: minijinja (the template engine) bounds the instructions a template runs
//! (fuel), not the memory its values take. `{% set s = s ~ s %}` in a loop of 40 doubles a
//! string to a terabyte in a few dozen instructions, and Rust aborts the process when such an
//! allocation fails. Nothing in the engine can refuse it; the allocator can see it coming.
//!
//! How: a binary installs [`BudgetAllocator`] around its allocator:
//!
//! ```
//! use std::alloc::System;
//! use xfmr_llm::budget::{self, BudgetAllocator, OverBudget};
//!
//! #[global_allocator]
//! static ALLOC: BudgetAllocator<System> = BudgetAllocator::new(System);
//!
//! fn main() {
//!     assert!(budget::installed());
//!     // 1 KiB within a 1 MiB budget: the result comes back.
//!     assert_eq!(budget::run_with_budget(1 << 20, || vec![7u8; 1024].len()), Ok(1024));
//!     // 1 GiB is refused before it is allocated: a typed error, not an abort.
//!     let big = budget::run_with_budget(1 << 20, || vec![0u8; 1 << 30].len());
//!     assert_eq!(big, Err(OverBudget::Exceeded { budget: 1 << 20 }));
//!     assert_eq!(budget::blocked_threads(), 1);
//! }
//! ```
//!
//! [`run_with_budget`] runs a closure on a new thread whose net allocations (bytes allocated
//! minus bytes freed by that thread) may not exceed the budget. An allocation that would exceed
//! it cannot fail (the allocator returning null aborts the process, and an allocator must not
//! unwind), so it flags the run as over budget and blocks that thread for good, before it
//! allocates: the caller, which polls the flag, returns [`OverBudget`] at once. The blocked
//! thread keeps what it had (at most the budget) and its stack; callers must therefore not
//! repeat an over-budget computation (the tokenizer refuses a template for good after one such
//! incident), and [`run_with_budget`] refuses to run at all once [`MAX_STUCK`] threads are
//! blocked in the process.
//!
//! Without the allocator installed ([`installed`] is false), [`run_with_budget`] runs the
//! closure on the calling thread without any memory bound; callers keep their other limits.
//!
//! The same allocator counts the allocations of the threads that ask for it
//! ([`count_allocations`], [`allocations`]).
//!
//! Invariants: the allocator's bookkeeping is five `const`-initialised thread-locals of `Cell`s
//! without destructors (on targets with native thread-local storage, Linux, macOS and Windows
//! among them, reading them allocates nothing) and a static flag; it never allocates, panics or
//! unwinds.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use thiserror::Error;

/// The most threads [`run_with_budget`] leaves blocked over their budget in one process;
/// beyond it, it refuses to run anything ([`OverBudget::TooManyBlocked`]). Each keeps at most
/// its budget and its stack.
pub const MAX_STUCK: usize = 64;

/// The longest [`run_with_budget`] waits for its closure (a chat template's rendering takes
/// milliseconds; minijinja's fuel stops a long one well before this).
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// The stack of a budgeted thread: 16 MiB of address space (pages are only taken as used),
/// room for the engine's deepest recursion (minijinja stops at 500 levels).
pub const STACK_BYTES: usize = 16 << 20;

/// Set by the first allocation through a [`BudgetAllocator`].
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Threads blocked over their budget.
static STUCK: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The most net bytes this thread had while it had a budget (see [`peak_of`]).
    static PEAK: Cell<isize> = const { Cell::new(0) };
    /// Net bytes this thread allocated since its budget was set.
    static USED: Cell<isize> = const { Cell::new(0) };
    /// This thread's budget in bytes; `usize::MAX` when it has none.
    static LIMIT: Cell<usize> = const { Cell::new(usize::MAX) };
    /// The flag to raise when the budget is exceeded (an `AtomicBool` kept alive by the
    /// thread's own closure, see [`run_with_budget`]); null when none.
    static FLAG: Cell<*const AtomicBool> = const { Cell::new(std::ptr::null()) };
    /// Whether this thread's allocations count in [`allocations`].
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Allocations (and reallocations) of the threads that called [`count_allocations`].
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// Counts the calling thread's allocations and reallocations from now on in [`allocations`]
/// (with a [`BudgetAllocator`] installed; without one nothing is counted): how a test or a
/// benchmark checks that a loop allocates nothing, on the threads that run it only (a thread
/// pool's workers call it from their start handler).
pub fn count_allocations() {
    let _ = COUNTED.try_with(|c| c.set(true));
}

/// Allocations and reallocations counted so far, by every thread that called
/// [`count_allocations`].
pub fn allocations() -> usize {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Notes one allocation of the current thread, if it counts them.
#[inline]
fn note() {
    if COUNTED.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether a [`BudgetAllocator`] is the program's global allocator (it has allocated once).
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// The threads blocked over their budget in this process (see [`MAX_STUCK`]).
pub fn blocked_threads() -> usize {
    STUCK.load(Ordering::Relaxed)
}

/// A global allocator that forwards to `A` and counts, per thread, the net bytes allocated
/// while [`run_with_budget`] has given the thread a budget (see the module docs). Outside a
/// budget it adds three thread-local reads per call.
pub struct BudgetAllocator<A> {
    inner: A,
}

impl<A> BudgetAllocator<A> {
    /// `inner`, counted.
    pub const fn new(inner: A) -> Self {
        Self { inner }
    }
}

/// Charges `bytes` to the current thread's budget, if it has one; blocks the thread for good
/// when they would exceed it.
#[inline]
fn charge(bytes: usize) {
    let limit = LIMIT.try_with(Cell::get).unwrap_or(usize::MAX);
    if limit == usize::MAX {
        return;
    }
    let used = USED.try_with(Cell::get).unwrap_or(0);
    let after = used.saturating_add(isize::try_from(bytes).unwrap_or(isize::MAX));
    if after > isize::try_from(limit).unwrap_or(isize::MAX) {
        over_budget();
    }
    let _ = USED.try_with(|u| u.set(after));
    let _ = PEAK.try_with(|p| p.set(p.get().max(after)));
}

/// Gives `bytes` back to the current thread's budget, if it has one.
#[inline]
fn credit(bytes: usize) {
    if LIMIT.try_with(Cell::get).unwrap_or(usize::MAX) == usize::MAX {
        return;
    }
    let _ = USED.try_with(|u| {
        u.set(
            u.get()
                .saturating_sub(isize::try_from(bytes).unwrap_or(isize::MAX)),
        )
    });
}

/// Raises the thread's flag and blocks the thread for good, allocating nothing.
#[cold]
fn over_budget() -> ! {
    // No budget any more: were anything below to allocate, it would not come back here.
    let _ = LIMIT.try_with(|l| l.set(usize::MAX));
    let flag = FLAG.try_with(Cell::get).unwrap_or(std::ptr::null());
    if !flag.is_null() {
        raise(flag);
    }
    loop {
        // `sleep` is a system call on a stack value: no allocation.
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Stores `true` in the flag `flag` points to.
#[allow(unsafe_code)]
fn raise(flag: *const AtomicBool) {
    // SAFETY: `flag` is non-null only between the two `FLAG.set` calls of the closure that
    // `run_with_budget` runs on this thread, and points into an `Arc<AtomicBool>` that closure
    // owns until it returns. We are inside that closure (the flag is set), and this thread never
    // returns from `over_budget`, so the `Arc` outlives the access. `AtomicBool` is `Sync`.
    unsafe { &*flag }.store(true, Ordering::SeqCst);
}

// SAFETY: every method forwards to `inner` with the caller's layout, pointer and size
// unchanged, so `inner`'s guarantees hold; the bookkeeping is on `const`-initialised
// thread-locals of `Cell`s without destructors and on atomics (no allocation, no panic, no
// unwinding); an allocation over budget does not return at all (the thread sleeps for good)
// rather than returning null or unwinding.
#[allow(unsafe_code)]
unsafe impl<A: GlobalAlloc> GlobalAlloc for BudgetAllocator<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        note();
        charge(layout.size());
        // SAFETY: as the trait's caller promised for `layout`.
        let p = unsafe { self.inner.alloc(layout) };
        if p.is_null() {
            credit(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        note();
        charge(layout.size());
        // SAFETY: as the trait's caller promised for `layout`.
        let p = unsafe { self.inner.alloc_zeroed(layout) };
        if p.is_null() {
            credit(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `inner` with `layout` (every allocation here is).
        unsafe { self.inner.dealloc(ptr, layout) };
        credit(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        note();
        if new_size > old {
            charge(new_size - old);
        }
        // SAFETY: as the trait's caller promised for `ptr`, `layout` and `new_size`.
        let p = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if p.is_null() {
            if new_size > old {
                credit(new_size - old);
            }
        } else if new_size < old {
            credit(old - new_size);
        }
        p
    }
}

/// Why [`run_with_budget`] gave no result.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OverBudget {
    /// The closure needed more than its budget; its thread is blocked for good.
    #[error("it needed more than its memory budget of {budget} bytes")]
    Exceeded {
        /// The budget.
        budget: usize,
    },
    /// [`MAX_STUCK`] threads are already blocked over their budget: nothing more is run.
    #[error("refused: {MAX_STUCK} earlier computations are blocked over their memory budget")]
    TooManyBlocked,
    /// The closure ran past [`MAX_WAIT`] (its thread is counted as blocked): it may wait on a
    /// lock held by a thread blocked over its budget.
    #[error("it did not finish within {after:?}")]
    TimedOut {
        /// [`MAX_WAIT`].
        after: Duration,
    },
    /// The thread could not be started, or the closure panicked.
    #[error("its thread failed: {0}")]
    Thread(String),
}

/// Runs `f` on a new thread whose net allocations may not exceed `budget` bytes, and returns
/// its result; or [`OverBudget::Exceeded`] as soon as an allocation would exceed the budget
/// (that thread then stays blocked, see the module docs).
///
/// Without a [`BudgetAllocator`] installed ([`installed`] is false), runs `f` on the calling
/// thread, unbounded.
///
/// # Errors
/// [`OverBudget`].
pub fn run_with_budget<T: Send + 'static>(
    budget: usize,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, OverBudget> {
    if !installed() {
        return Ok(f());
    }
    if blocked_threads() >= MAX_STUCK {
        return Err(OverBudget::TooManyBlocked);
    }
    let flag = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::sync_channel(1);
    let thread_flag = Arc::clone(&flag);
    let spawned = std::thread::Builder::new()
        .name("xfmr-budgeted".into())
        .stack_size(STACK_BYTES)
        .spawn(move || {
            // Owned by this closure until it returns: `raise` relies on it.
            let flag = thread_flag;
            let _ = FLAG.try_with(|f| f.set(Arc::as_ptr(&flag)));
            let _ = USED.try_with(|u| u.set(0));
            let _ = LIMIT.try_with(|l| l.set(budget));
            // A panic in `f` is caught here, so that the budget and the flag's pointer are
            // cleared before `flag` can be dropped (on every path out of `f` but the one that
            // blocks for good): the panic's own allocations (its message, a backtrace) then
            // count against no budget, and `raise` never sees a freed flag.
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = LIMIT.try_with(|l| l.set(usize::MAX));
            let _ = FLAG.try_with(|f| f.set(std::ptr::null()));
            if let Ok(out) = out {
                let _ = tx.send(out);
            }
            drop(flag);
        });
    if let Err(e) = spawned {
        return Err(OverBudget::Thread(e.to_string()));
    }
    let deadline = std::time::Instant::now() + MAX_WAIT;
    loop {
        match rx.recv_timeout(Duration::from_millis(1)) {
            Ok(out) => return Ok(out),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if flag.load(Ordering::SeqCst) {
                    STUCK.fetch_add(1, Ordering::Relaxed);
                    return Err(OverBudget::Exceeded { budget });
                }
                // A thread blocked without raising its flag: e.g. waiting on a lock (a lazily
                // filled `OnceLock` of the template engine) that another budgeted thread took
                // before it blocked for good. Counted as blocked, never waited for for ever.
                if std::time::Instant::now() >= deadline {
                    STUCK.fetch_add(1, Ordering::Relaxed);
                    return Err(OverBudget::TimedOut { after: MAX_WAIT });
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(OverBudget::Thread("the computation panicked".into()))
            }
        }
    }
}

/// The most bytes the current thread had allocated (net) at once while running `f`, counted by
/// the [`BudgetAllocator`] (`None` when none is installed). For tests and measurements: it
/// gives `f` a budget of `usize::MAX - 1` bytes on the calling thread.
pub fn peak_of<T>(f: impl FnOnce() -> T) -> (T, Option<usize>) {
    if !installed() {
        return (f(), None);
    }
    let _ = PEAK.try_with(|p| p.set(0));
    let _ = USED.try_with(|u| u.set(0));
    let _ = LIMIT.try_with(|l| l.set(usize::MAX - 1));
    let out = f();
    let _ = LIMIT.try_with(|l| l.set(usize::MAX));
    let peak = PEAK.try_with(Cell::get).unwrap_or(0);
    (out, Some(peak.max(0) as usize))
}
