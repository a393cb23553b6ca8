//! Launch shapes per message size. A rule, never one constant: the tuner (and the per-method defaults) say how
//! many bytes each block should own and how many threads it has; the device caps the grid so that every rank's
//! blocks fit on the GPU at once (a cross-rank barrier deadlocks otherwise, e.g. 8 ranks on one GPU under MPS).

use crate::{CollectiveError, MAX_BLOCKS};

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

impl LaunchPlan {
    /// The launch of this shape (no dynamic shared memory).
    pub fn dims(self) -> gpu::LaunchDims {
        gpu::LaunchDims { grid: self.grid, block: self.threads, shared_bytes: 0 }
    }
}

impl LaunchRule {
    /// `grid` blocks of `threads` at every size (fewer only for a message of fewer bytes than blocks): the
    /// launch-shape ablation, asked for as `METHOD@GRIDxTHREADS`.
    pub fn fixed(grid: u32, threads: u32) -> LaunchRule {
        LaunchRule { threads, bytes_per_block: 1, max_grid: grid }
    }

    /// Parses `GRIDxTHREADS` (e.g. `16x512`) into [`LaunchRule::fixed`], within the kernels' limits.
    pub fn parse_fixed(shape: &str) -> Result<LaunchRule, String> {
        let bad = || format!("launch shape {shape:?}: expected BLOCKSxTHREADS, e.g. 16x512");
        let (g, t) = shape.split_once('x').ok_or_else(bad)?;
        let (grid, threads): (u32, u32) = (g.parse().map_err(|_| bad())?, t.parse().map_err(|_| bad())?);
        if !(1..=MAX_BLOCKS as u32).contains(&grid) {
            return Err(format!("launch shape {shape:?}: blocks must be 1 to {MAX_BLOCKS}"));
        }
        if !(32..=1024).contains(&threads) || threads % 32 != 0 {
            return Err(format!("launch shape {shape:?}: threads must be a multiple of 32 from 32 to 1024"));
        }
        Ok(LaunchRule::fixed(grid, threads))
    }

    /// Refuses a shape the caller asked for that this device cannot give exactly: more blocks than fit beside
    /// the other ranks (`resident_cap`), or fewer threads than ranks (every barrier signals with one thread per
    /// rank).
    pub fn check_requested(&self, method: &str, resident_cap: usize, world: usize) -> Result<(), CollectiveError> {
        let fit = resident_cap.min(MAX_BLOCKS);
        if self.max_grid as usize > fit {
            return Err(CollectiveError::Unsupported(format!(
                "{method}: {} blocks of {} threads per rank asked, {fit} fit beside {world} ranks",
                self.max_grid, self.threads
            )));
        }
        if (self.threads as usize) < world {
            return Err(CollectiveError::Unsupported(format!(
                "{method}: {} threads per block, fewer than the {world} ranks",
                self.threads
            )));
        }
        Ok(())
    }

    /// The shape for a message of `bytes`, with at most `resident_cap` blocks (what fits beside the other ranks).
    pub fn plan(&self, bytes: usize, resident_cap: usize) -> LaunchPlan {
        let want = bytes.div_ceil(self.bytes_per_block.max(1)).max(1);
        let cap = (self.max_grid as usize).min(MAX_BLOCKS).clamp(1, resident_cap.max(1));
        LaunchPlan { grid: want.min(cap) as u32, threads: self.threads }
    }
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

    #[test]
    fn fixed_shapes_parse_and_are_checked() {
        let r = LaunchRule::parse_fixed("16x256").unwrap();
        assert_eq!(r.plan(2048, 1000), LaunchPlan { grid: 16, threads: 256 });
        assert_eq!(r.plan(1 << 30, 1000), LaunchPlan { grid: 16, threads: 256 });
        for bad in ["16", "0x512", "65x512", "16x100", "16x2048", "ax512", "16x"] {
            assert!(LaunchRule::parse_fixed(bad).is_err(), "{bad}");
        }
        assert!(r.check_requested("m", 16, 8).is_ok());
        assert!(r.check_requested("m", 15, 8).unwrap_err().to_string().contains("15 fit"));
        assert!(LaunchRule::fixed(4, 4).check_requested("m", 64, 8).unwrap_err().to_string().contains("fewer than"));
    }
}
