//! The program's allocator: mimalloc, told to keep the memory it has.
//!
//! Each burn operation allocates its output, so a training step allocates and frees the same
//! large tensor buffers again and again. By default mimalloc commits its arenas' memory lazily and
//! hands freed memory back to the kernel ("purges" it) after a delay; the next step then
//! page-faults buffers it had a moment ago, and the kernel zeroes every page of them.
//! [`keep_memory`] keeps the memory instead (the profiles before and after are in
//! docs/benchmarks.md). The cost: the process keeps its peak footprint until it exits, which a
//! training run reaches in its first steps anyway. `xfmr serve` does not call it: a server
//! must return the memory a burst of requests took (docs/reliability.md, "Hostile clients"):
//! it calls [`release_memory`] on each of its threads when that thread runs out of work.

use libmimalloc_sys::{mi_option_set, mi_option_t};

/// `mi_option_arena_eager_commit` of mimalloc 3's `mi_option_e` (`mimalloc.h`); the Rust
/// bindings name neither of these two options. A test pins both ids to their defaults.
const ARENA_EAGER_COMMIT: mi_option_t = 4;
/// `mi_option_purge_delay` (milliseconds; -1: never purge).
const PURGE_DELAY: mi_option_t = 15;

/// Never return freed memory to the kernel, and commit arena memory when it is reserved.
/// Call it first thing in `main` (before the first allocation that should be kept).
#[allow(unsafe_code)]
pub fn keep_memory() {
    // SAFETY: `mi_option_set` stores an integer in mimalloc's option table (thread-safe, any
    // time); both ids are options of the linked mimalloc 3 (pinned by the test below).
    unsafe {
        mi_option_set(PURGE_DELAY, -1);
        mi_option_set(ARENA_EAGER_COMMIT, 1);
    }
}

/// Purge freed memory at once instead of after mimalloc's delay (1 s): `xfmr serve`'s
/// setting, with [`release_memory`] on each idle thread. During a burst of large requests the
/// threads' freed pages then go back to the kernel as they are freed rather than a second
/// later (48 concurrent 1 MB chats to SmolLM2, with an earlier admission: peak 1.67x idle
/// instead of 2.10x, docs/benchmarks.md); decoding speed did not change measurably.
#[allow(unsafe_code)]
pub fn purge_promptly() {
    // SAFETY: as in `keep_memory`.
    unsafe { mi_option_set(PURGE_DELAY, 0) }
}

/// Gives this thread's free pages back to mimalloc's arenas and purges the arenas' free
/// memory now (returns it to the kernel), instead of after the purge delay at a later
/// allocation: mimalloc's `mi_collect(true)`. An idle thread never allocates again, so without
/// this what it freed stays resident. A few microseconds on an idle heap.
#[allow(unsafe_code)]
pub fn release_memory() {
    // SAFETY: `mi_collect` takes no pointers; it collects the calling thread's own heap and
    // mimalloc's arenas under their own synchronisation (any thread, any time).
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// The current value of mimalloc option `option`.
#[cfg(test)]
#[allow(unsafe_code)]
fn option(option: mi_option_t) -> std::os::raw::c_long {
    // SAFETY: reads mimalloc's option table; `option` is one of the ids above.
    unsafe { libmimalloc_sys::mi_option_get(option) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ids name the options they claim to: mimalloc 3's defaults are a 1000 ms purge delay
    /// and eager commit "on overcommitting systems" (2), unless the environment set them; after
    /// `keep_memory`, -1 and 1.
    #[test]
    fn option_ids_are_mimallocs() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(option(PURGE_DELAY), 1000);
        }
        if std::env::var_os("MIMALLOC_ARENA_EAGER_COMMIT").is_none() {
            assert_eq!(option(ARENA_EAGER_COMMIT), 2);
        }
        keep_memory();
        assert_eq!((option(PURGE_DELAY), option(ARENA_EAGER_COMMIT)), (-1, 1));
    }
}
