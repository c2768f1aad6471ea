//! The corpus programs' tests, a few per file.

mod basic;
mod lds;
mod symbols;
mod wave;

pub(crate) use super::{assert_close as close, cfg as cfg1, emu as start, inputs as data};
use hip_rt::LaunchConfig;

/// A 2-D launch: `grid` blocks of `block` threads.
pub(crate) fn cfg2(grid: (u32, u32), block: (u32, u32)) -> LaunchConfig {
    LaunchConfig {
        grid: (grid.0, grid.1, 1),
        block: (block.0, block.1, 1),
        shared_mem_bytes: 0,
    }
}
