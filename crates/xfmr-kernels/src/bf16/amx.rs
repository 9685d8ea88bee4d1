//! The AMX kernel of [`super`]: blocks of 32 rows by pairs of 16-column tiles, four tiles of
//! `f32` sums (`tmm0`–`tmm3`), two of activations (`tmm4`, `tmm5`) and two of packed weights
//! (`tmm6`, `tmm7`), `tdpbf16ps` on each pair per chunk of 32 inner indices. Written as inline
//! assembly: Rust's AMX intrinsics are not stable (rust-lang/rust#126622), the instructions are
//! (the assembler knows them). Called only for [`Bf16Level::Amx`](crate::cpu::Bf16Level::Amx),
//! which requires `cpuid`'s AMX-TILE and AMX-BF16 and the OS's leave for this process
//! (`cpu.rs`).

use std::arch::asm;
use std::mem::MaybeUninit;

use super::{Block, TILE_N};

/// The tile configuration `ldtilecfg` loads: palette 1, eight tiles of 16 rows by 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        // `colsb[t]` (bytes per row, u16 at 16 + 2t) and `rows[t]` (u8 at 48 + t).
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    TileConfig(c)
};

/// One task's block of sums (`super::block_on`): all `BLOCK_M` rows of the block's columns
/// into `c` (row `r` at `c[r·ldc..]`), each tile of sums started from the block's `start`
/// (loaded with a row stride of zero: the same 16 values in every row).
///
/// # Safety
/// The CPU has AMX-TILE and AMX-BF16 and the OS lets this process use the tiles
/// ([`Bf16Level::Amx`](crate::cpu::Bf16Level::Amx) is available); `block.check(BLOCK_M, c,
/// ldc)` holds (`block_on` asserts it): every load and store below stays inside it.
#[allow(unsafe_code)]
pub(super) unsafe fn block(block: &Block<'_>, c: &mut [MaybeUninit<f32>], ldc: usize) {
    let (a, width, w) = (block.a, block.width, block.w);
    // Every block names the eight tile registers as clobbered: it changes them, and Rust's
    // inline assembly requires every register it does not preserve to be declared.
    asm!(
        "ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(),
        out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
        out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _,
        options(nostack, readonly),
    );
    for pair in 0..block.tiles / 2 {
        // Each holds `chunks` packed tiles of 16 rows by 64 bytes, read in order.
        let b0 = w.column_tiles(block.t0 + 2 * pair).as_ptr();
        let b1 = w.column_tiles(block.t0 + 2 * pair + 1).as_ptr();
        let a0 = a.as_ptr();
        let a1 = a.as_ptr().add(16 * width);
        // The starting sums of the pair's 32 columns (the second tile's 64 bytes on).
        let s0 = block.start.as_ptr().add(2 * pair * TILE_N);
        // The four 16×16 tiles of sums: rows 0–15 (from `c0`) and 16–31 (from `c1`), columns
        // 32·pair + 0–15 and, 64 bytes on, 16–31. (Displacements rather than registers: the
        // block uses twelve general registers, which a frame pointer leaves room for.)
        let c0 = c.as_mut_ptr().cast::<f32>().add(2 * pair * TILE_N);
        let c1 = c0.add(16 * ldc);
        asm!(
            "tileloadd tmm0, [{s0} + {zero}*1]",
            "tileloadd tmm1, [{s0} + {zero}*1 + 64]",
            "tileloadd tmm2, [{s0} + {zero}*1]",
            "tileloadd tmm3, [{s0} + {zero}*1 + 64]",
            "2:",
            "tileloadd tmm4, [{a0} + {sa}*1]",
            "tileloadd tmm6, [{b0} + {sb}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tileloadd tmm5, [{a1} + {sa}*1]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tileloadd tmm7, [{b1} + {sb}*1]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a0}, 64",
            "add {a1}, 64",
            "add {b0}, 1024",
            "add {b1}, 1024",
            "dec {chunks}",
            "jnz 2b",
            "tilestored [{c0} + {sc}*1], tmm0",
            "tilestored [{c0} + {sc}*1 + 64], tmm1",
            "tilestored [{c1} + {sc}*1], tmm2",
            "tilestored [{c1} + {sc}*1 + 64], tmm3",
            s0 = in(reg) s0,
            zero = in(reg) 0usize,
            a0 = inout(reg) a0 => _,
            a1 = inout(reg) a1 => _,
            b0 = inout(reg) b0 => _,
            b1 = inout(reg) b1 => _,
            chunks = inout(reg) w.chunks => _,
            sa = in(reg) width * 2,
            sb = in(reg) 2 * 2 * TILE_N,
            c0 = in(reg) c0,
            c1 = in(reg) c1,
            sc = in(reg) ldc * 4,
            out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
            out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _,
            options(nostack),
        );
    }
    asm!(
        "tilerelease",
        out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
        out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _,
        options(nostack, nomem),
    );
}
