//! sync.h's `next_epoch` on the host (kernels/check/epoch_sim.cpp: a process per block, a thread per thread): over
//! launches whose grids grow and shrink, every thread of launch n is given epoch n and every one of the
//! `ARX_MAX_BLOCKS` counters holds n after it, so that the blocks of any later grid agree on their epochs.

use crate::output;
use collective_core::MAX_BLOCKS;
use std::path::Path;
use std::process::Command;

/// Threads a block: one (the host driver's blocks), fewer than the counters and more, neither a power of two.
const BLOCK_THREADS: [usize; 3] = [1, 33, 96];

pub fn check(sim: &Path) -> Result<(), String> {
    let max = MAX_BLOCKS as u64;
    let grids = [1, 3, max, 2, 17, 1, 40, 5, max, 1];
    for block in BLOCK_THREADS {
        let mut cmd = Command::new(sim);
        cmd.arg(block.to_string()).args(grids.map(|g| g.to_string()));
        let printed = output(&mut cmd)?;
        let fail = |what: String| Err(format!("next_epoch on the host, {block} thread(s) a block: {what}"));
        let lines: Vec<&str> = printed.lines().collect();
        if lines.len() != grids.len() {
            return fail(format!("{} launches reported of {}", lines.len(), grids.len()));
        }
        for (n, (line, grid)) in lines.iter().zip(grids).enumerate() {
            let epoch = n as u64 + 1;
            let words: Vec<u64> =
                line.split(' ').map(str::parse).collect::<Result<_, _>>().map_err(|e| format!("{e}"))?;
            let [g, lo, hi, counters @ ..] = words.as_slice() else {
                return fail(format!("launch {n} printed {line}"));
            };
            if (*g, *lo, *hi) != (grid, epoch, epoch) {
                return fail(format!(
                    "launch {n} of {grid} block(s) gave its threads epochs {lo} to {hi}, not {epoch}"
                ));
            }
            if counters.len() != MAX_BLOCKS {
                return fail(format!("launch {n} printed {} counters", counters.len()));
            }
            if let Some((j, c)) = counters.iter().enumerate().find(|(_, c)| **c != epoch) {
                return fail(format!("after launch {n} of {grid} block(s) counter {j} holds {c}, not {epoch}"));
            }
        }
    }
    println!(
        "epoch: every thread of launch n gets epoch n and all {MAX_BLOCKS} counters hold n after it, over {} launches of \
         1 to {MAX_BLOCKS} blocks of {BLOCK_THREADS:?} threads",
        grids.len()
    );
    Ok(())
}
