//! The library part of the `xfmr` program: what its benchmarks must share with it, so that
//! they time what the program runs. Everything else the program does is a call into the
//! xfmr libraries (`src/commands/`).
//!
//! - [`alloc`]: the program's allocator options (mimalloc keeps the memory it has).

pub mod alloc;
