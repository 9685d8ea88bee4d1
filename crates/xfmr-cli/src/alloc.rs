//! The program's allocator: mimalloc, told to keep the memory it has.
//!
//! Each burn operation allocates its output, so a training step allocates and frees the same
//! large tensor buffers again and again. By default mimalloc commits its arenas' memory lazily and
//! hands freed memory back to the kernel ("purges" it) after a delay; the next step then
//! page-faults buffers it had a moment ago, and the kernel zeroes every page of them.
//! [`keep_memory`] keeps the memory instead (the profiles before and after are in
//! docs/benchmarks.md). The cost: the process keeps its peak footprint until it exits, which a
//! training run reaches in its first steps anyway. `xfmr serve` does not call it: a server
//! must return the memory a burst of requests took (docs/reliability.md, "Hostile clients").

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
