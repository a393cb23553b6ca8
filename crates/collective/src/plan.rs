//! Launch shapes per message size. A rule, never one constant: the tuner (and the per-method defaults) say how
//! many bytes each block should own and how many threads it has; the device caps the grid so that every rank's
//! blocks fit on the GPU at once (a cross-rank barrier deadlocks otherwise, e.g. 8 ranks on one GPU under MPS).

use crate::MAX_BLOCKS;

/// How a method shapes its launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchRule {
    pub threads: u32,
    pub bytes_per_block: usize,
    pub max_grid: u32,
}

/// A concrete launch shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchPlan {
    pub grid: u32,
    pub threads: u32,
}

impl LaunchRule {
    /// The shape for a message of `bytes`, with at most `resident_cap` blocks (what fits beside the other ranks).
    pub fn plan(&self, bytes: usize, resident_cap: usize) -> LaunchPlan {
        let want = bytes.div_ceil(self.bytes_per_block.max(1)).max(1);
        let cap = (self.max_grid as usize).min(MAX_BLOCKS).clamp(1, resident_cap.max(1));
        LaunchPlan { grid: want.min(cap) as u32, threads: self.threads }
    }
}

/// Blocks of `kernel` one rank may launch so that the blocks of every rank sharing its device fit at once.
pub fn resident_cap(kernel: &gpu::Kernel, threads: u32, world: usize, devices: usize) -> gpu::Result<usize> {
    let ranks_per_device = world.div_ceil(devices.max(1)).max(1);
    Ok(kernel.max_resident_blocks(threads, 0)? / ranks_per_device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_grows_with_size_and_respects_caps() {
        let r = LaunchRule { threads: 512, bytes_per_block: 64 << 10, max_grid: 32 };
        assert_eq!(r.plan(2048, 1000).grid, 1);
        assert_eq!(r.plan(256 << 10, 1000).grid, 4);
        assert_eq!(r.plan(1 << 30, 1000).grid, 32);
        assert_eq!(r.plan(1 << 30, 12).grid, 12);
        assert_eq!(r.plan(1 << 30, 0).grid, 1);
    }
}
