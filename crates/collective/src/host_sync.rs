//! The host twins of `kernels/common.h`'s synchronisation: per-block epoch counters and the epoch-flag barrier,
//! with std atomics on shared mappings. Host kernels run their blocks one after another, in the same order on
//! every rank, so block b's barrier only ever waits for the peers' block b, as on the device.

use crate::{MAX_BLOCKS, MAX_RANKS};
use deadline::{wait_all, Deadline};
use std::sync::atomic::{AtomicU64, Ordering};

/// u64 flag slots per rank: one per (block, phase, source rank).
pub const FLAG_SLOTS: usize = MAX_BLOCKS * 2 * MAX_RANKS;

/// Block `block`'s epoch for this call; advances the counters of the blocks this grid lacks too (`next_epoch`).
///
/// # Safety
/// `counters` is this rank's live array of [`MAX_BLOCKS`] u64.
pub unsafe fn next_epoch(counters: u64, block: usize, grid: usize) -> u64 {
    let c = counters as *mut u64;
    // SAFETY: the caller's contract; only this block's thread touches these counters.
    unsafe {
        let e = *c.add(block) + 1;
        for j in (block..MAX_BLOCKS).step_by(grid) {
            *c.add(j) = e;
        }
        e
    }
}

/// # Safety
/// `base` is a live flag array of [`FLAG_SLOTS`] u64.
unsafe fn flag<'a>(base: u64, block: usize, phase: usize, src: usize) -> &'a AtomicU64 {
    // SAFETY: the caller's contract; AtomicU64 has u64's layout and the array is 8-aligned.
    unsafe { &*(base as *const AtomicU64).add((block * 2 + phase) * MAX_RANKS + src) }
}

/// Tells every rank that `block` of `rank` reached `epoch` in `phase` (release store into their slot for us), then
/// waits until every rank's `block` said the same (acquire loads of our slots). The error names who did not come.
///
/// # Safety
/// `flags[r]` for r < `flags.len()` are live flag arrays of [`FLAG_SLOTS`] u64 (rank r's, mapped here).
pub unsafe fn flag_barrier(
    flags: &[u64],
    rank: usize,
    block: usize,
    phase: usize,
    epoch: u64,
    deadline: &Deadline,
    what: &str,
) -> Result<(), String> {
    // SAFETY: the caller's contract.
    unsafe {
        for &peer in flags {
            flag(peer, block, phase, rank).store(epoch, Ordering::Release);
        }
        let what = format!("{what} rank {rank} block {block} barrier {phase}");
        wait_all(
            &what,
            0..flags.len(),
            deadline,
            |t| flag(flags[rank], block, phase, t).load(Ordering::Acquire) >= epoch,
            || None,
        )
        .map_err(|e| e.to_string())
    }
}
