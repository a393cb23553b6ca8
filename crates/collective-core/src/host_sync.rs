//! The host twins of `kernels/include/arx/sync.h`'s synchronisation: per-block epoch counters and the epoch-flag barrier,
//! with std atomics on shared mappings, and torch's compare-and-swap handshake on signal pads ([`cas_barrier`],
//! symm's). Host kernels run their blocks one after another, in the same order on every rank, so block b's
//! barrier only ever waits for the peers' block b, as on the device.
//!
//! Under `--cfg loom` the atomics are loom's and the waits spin with `loom::thread::yield_now` and no deadline,
//! so `tests/loom_protocols.rs` model-checks this very code (there the flag arrays and pads it is handed are
//! arrays of loom atomics, allocated by the test, instead of shared mappings of plain words).

use crate::flag_tags::{flag_kernel, flag_word, TAG_BITS};
use crate::{MAX_BLOCKS, MAX_RANKS};
use deadline::Deadline;
use gpu::KernelFault;
#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Barriers per call that the epoch flags tell apart (`ARX_PHASES` in `kernels/include/arx/portability.h`).
pub const PHASES: usize = 3;

/// u64 flag slots per rank: one per (block, phase, source rank).
pub const FLAG_SLOTS: usize = MAX_BLOCKS * PHASES * MAX_RANKS;

/// u32 slots of one signal pad: one per (channel, peer rank).
pub const PAD_SLOTS: usize = MAX_BLOCKS * MAX_RANKS;

/// Waits until `arrived(r)` holds for every rank in `ranks`: [`deadline::wait_all`], the ranks that never came in its
/// error.
#[cfg(not(loom))]
fn wait(
    what: &str,
    ranks: impl IntoIterator<Item = usize>,
    deadline: &Deadline,
    arrived: impl FnMut(usize) -> bool,
) -> Result<(), KernelFault> {
    Ok(deadline::wait_all(what, ranks, deadline, arrived, || None)?)
}

/// Loom's twin of the wait above: the same polling of the pending ranks, yielding to loom's scheduler between
/// rounds and never timing out (a protocol that can hang shows up as loom's deadlock or branch-limit report).
///
/// Two spinning threads can pass the turn back and forth without a preemption, so with 3 ranks loom would explore
/// ever longer spins; after `LOOM_SPIN_ROUNDS` (default 2) fruitless rounds a wait stops loom branching for the
/// rest of that execution (`loom::skip_branch`), which still runs to its end on loom's fair default schedule.
#[cfg(loom)]
fn wait(
    _what: &str,
    ranks: impl IntoIterator<Item = usize>,
    _deadline: &Deadline,
    mut arrived: impl FnMut(usize) -> bool,
) -> Result<(), KernelFault> {
    let bound = std::env::var("LOOM_SPIN_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(2usize);
    let mut pending: Vec<usize> = ranks.into_iter().collect();
    let mut rounds = 0;
    loop {
        pending.retain(|&r| !arrived(r));
        if pending.is_empty() {
            return Ok(());
        }
        rounds += 1;
        if rounds == bound {
            loom::skip_branch();
        }
        loom::thread::yield_now();
    }
}

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
    unsafe { &*(base as *const AtomicU64).add((block * PHASES + phase) * MAX_RANKS + src) }
}

/// Tells every rank that `block` of `rank` reached `epoch` in `phase` in the kernel of `tag` (release store of
/// [`flag_word`] into their slot for us), then waits until every rank's `block` said it reached `epoch`: relaxed loads
/// of our slots, then one acquire fence, as the kernels' `flag_barrier` waits. The error names who did not come, or
/// the first peer met at this epoch in another kernel ([`KernelFault::Mismatch`]; a peer already past this epoch
/// is not judged).
///
/// # Safety
/// `flags[r]` for r < `flags.len()` are live flag arrays of [`FLAG_SLOTS`] u64 (rank r's, mapped here).
#[allow(clippy::too_many_arguments)]
pub unsafe fn flag_barrier(
    flags: &[u64],
    rank: usize,
    block: usize,
    phase: usize,
    epoch: u64,
    tag: u32,
    deadline: &Deadline,
    what: &str,
) -> Result<(), KernelFault> {
    let mut other = None;
    // SAFETY: the caller's contract.
    unsafe {
        for &peer in flags {
            flag(peer, block, phase, rank).store(flag_word(epoch, tag), Ordering::Release);
        }
        let what = format!("{what} rank {rank} block {block} barrier {phase}");
        wait(&what, 0..flags.len(), deadline, |t| {
            let word = flag(flags[rank], block, phase, t).load(Ordering::Relaxed);
            let theirs = word & ((1 << TAG_BITS) - 1);
            if word >> TAG_BITS == epoch && theirs != u64::from(tag) {
                other.get_or_insert((t, theirs));
            }
            word >> TAG_BITS >= epoch
        })?;
    }
    fence(Ordering::Acquire);
    match other {
        Some((peer, theirs)) => {
            Err(KernelFault::Mismatch { peer, ours: flag_kernel(u64::from(tag)), theirs: flag_kernel(theirs) })
        }
        None => Ok(()),
    }
}

/// # Safety
/// `pad` is a live signal pad of [`PAD_SLOTS`] u32.
unsafe fn slot<'a>(pad: u64, channel: usize, peer: usize) -> &'a AtomicU32 {
    // SAFETY: the caller's contract; AtomicU32 has u32's layout and the pad is 4-aligned.
    unsafe { &*(pad as *const AtomicU32).add(channel * MAX_RANKS + peer) }
}

fn cas(a: &AtomicU32, from: u32, to: u32) -> bool {
    a.compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire).is_ok()
}

/// Torch's signal-pad handshake on `channel`: signal every peer (CAS 0 -> 1 on its pad's slot for us, retried
/// until the peer consumed our previous signal), then wait for every peer's signal (CAS 1 -> 0 on our pad's slot
/// for it). `what` names the barrier in the error, which names the ranks that did not come.
///
/// # Safety
/// `pads[r]` for r < `pads.len()` are live signal pads of [`PAD_SLOTS`] u32 (rank r's, mapped here).
pub unsafe fn cas_barrier(
    pads: &[u64],
    rank: usize,
    channel: usize,
    deadline: &Deadline,
    what: &str,
) -> Result<(), KernelFault> {
    let peers = (0..pads.len()).filter(|&t| t != rank);
    // SAFETY: the caller's contract.
    unsafe {
        wait(&format!("{what}: signal"), peers.clone(), deadline, |t| cas(slot(pads[t], channel, rank), 0, 1))?;
        wait(&format!("{what}: wait"), peers, deadline, |t| cas(slot(pads[rank], channel, t), 1, 0))
    }
}
