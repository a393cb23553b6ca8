//! Model checks (loom) of the two host barrier protocols, running the very functions the host kernels call
//! (`collective_core::host_sync`, built under `--cfg loom` so its atomics and waits are loom's):
//!
//! * car's one-shot: copy my slice into buffer half `epoch & 1`, epoch-flag barrier, read every rank's half, and
//!   no exit barrier: the next call writes the other half, and the call after that writes this half again only
//!   after an entry barrier that every peer passed once it finished reading it.
//! * symm's one-shot: copy into my buffer, torch's CAS handshake, read every buffer, handshake again; the next
//!   call's copy-in overwrites my buffer.
//!
//! * the epoch flags' kernel tags: ranks that change kernels call by call, alike, never see a mismatch (a peer's flag
//!   from the next call is not judged; judging it is caught), and ranks of different kernels on one call all fail,
//!   naming a peer of the other kernel.
//!
//! The buffers are `loom::cell::UnsafeCell`s (plain memory, as the real copies are), so loom reports any read
//! that races with a write; on top, every read asserts that it saw this call's number (no early read of the
//! previous call's data, no overwrite by the next call). Every model must terminate: a lost wake-up shows up as
//! loom's deadlock report. Two variants break the protocol on purpose (same half every call; no exit
//! handshake) and must be caught.
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=/work/target-loom cargo test --release -p collective-core --test
//! loom_protocols` (LOOM_MAX_PREEMPTIONS overrides the default bound of 2).
#![cfg(loom)]

use collective_core::host_sync::{cas_barrier, flag_barrier, next_epoch};
use collective_core::{MAX_BLOCKS, MAX_RANKS};
use deadline::Deadline;
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU32, AtomicU64};
use loom::sync::Arc;
use std::time::Duration;

/// One buffer (or buffer half): the data of one call, reduced to the call's number.
struct Buf(UnsafeCell<u64>);

// SAFETY: sharing it is the point of the model; loom's UnsafeCell checks every access for races.
unsafe impl Sync for Buf {}

impl Buf {
    fn new() -> Buf {
        Buf(UnsafeCell::new(0))
    }
    fn write(&self, v: u64) {
        // SAFETY: loom tracks the access and panics if it races with another.
        self.0.with_mut(|p| unsafe { *p = v })
    }
    fn read(&self) -> u64 {
        // SAFETY: as in `write`.
        self.0.with(|p| unsafe { *p })
    }
}

/// Runs `rank(r)` for r in 0..world under loom (rank 0 on the model's main thread), bounded to `LOOM_MAX_PREEMPTIONS`
/// preemptions (2 unless set).
fn model<S: Send + Sync + 'static>(world: usize, shared: fn(usize) -> S, rank: fn(&S, usize)) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    builder.check(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let s = Arc::new(shared(world));
        let peers: Vec<_> = (1..world)
            .map(|r| {
                let s = s.clone();
                loom::thread::spawn(move || rank(&s, r))
            })
            .collect();
        rank(&s, 0);
        for p in peers {
            p.join().unwrap();
        }
    });
    eprintln!("{world} ranks: {} executions explored", runs.load(std::sync::atomic::Ordering::Relaxed));
}

/// No wait in a model may time out: loom decides termination.
fn forever() -> Deadline {
    Deadline::after(Duration::from_secs(1 << 30))
}

/// car's shared state: every rank's flag array (block 0's two phases are all a one-block grid touches) and the
/// two halves of its registered buffer.
struct Car {
    flags: Vec<Vec<AtomicU64>>,
    bufs: Vec<[Buf; 2]>,
}

fn car(world: usize) -> Car {
    Car {
        flags: (0..world).map(|_| (0..2 * MAX_RANKS).map(|_| AtomicU64::new(0)).collect()).collect(),
        bufs: (0..world).map(|_| [Buf::new(), Buf::new()]).collect(),
    }
}

/// car's one-shot, `calls` calls back to back, as `car::host::run` does it for a grid of one block; `parity` false
/// is the broken variant that writes the same half every call.
fn car_rank(s: &Car, rank: usize, calls: u64, parity: bool) {
    let flags: Vec<u64> = s.flags.iter().map(|f| f.as_ptr() as u64).collect();
    let mut counters = [0u64; MAX_BLOCKS];
    let deadline = forever();
    for call in 1..=calls {
        // SAFETY: counters is this rank's array of MAX_BLOCKS u64.
        let epoch = unsafe { next_epoch(counters.as_mut_ptr() as u64, 0, 1) };
        assert_eq!(epoch, call);
        let half = if parity { (epoch & 1) as usize } else { 0 };
        s.bufs[rank][half].write(epoch);
        // SAFETY: flags[r] are live arrays of loom atomics covering block 0's slots.
        unsafe { flag_barrier(&flags, rank, 0, 0, epoch, 1, &deadline, "car_1shot") }.unwrap();
        for (t, buf) in s.bufs.iter().enumerate() {
            let got = buf[half].read();
            assert_eq!(got, epoch, "rank {rank} call {call}: rank {t}'s half {half} holds call {got}");
        }
    }
}

/// symm's shared state: every rank's signal pad (channel 0's slots) and buffer.
struct Symm {
    pads: Vec<Vec<AtomicU32>>,
    bufs: Vec<Buf>,
}

fn symm(world: usize) -> Symm {
    Symm {
        pads: (0..world).map(|_| (0..MAX_RANKS).map(|_| AtomicU32::new(0)).collect()).collect(),
        bufs: (0..world).map(|_| Buf::new()).collect(),
    }
}

/// symm's one-shot, `calls` calls back to back, as `symm::host::run` does it for a grid of one block; `exit`
/// false is the broken variant without the closing handshake.
fn symm_rank(s: &Symm, rank: usize, calls: u64, exit: bool) {
    let pads: Vec<u64> = s.pads.iter().map(|p| p.as_ptr() as u64).collect();
    let deadline = forever();
    for call in 1..=calls {
        s.bufs[rank].write(call);
        // SAFETY: pads[r] are live arrays of loom atomics covering channel 0's slots.
        unsafe { cas_barrier(&pads, rank, 0, &deadline, "symm_1shot barrier 0") }.unwrap();
        for (t, buf) in s.bufs.iter().enumerate() {
            let got = buf.read();
            assert_eq!(got, call, "rank {rank} call {call}: rank {t}'s buffer holds call {got}");
        }
        if exit {
            // SAFETY: as above.
            unsafe { cas_barrier(&pads, rank, 0, &deadline, "symm_1shot barrier 1") }.unwrap();
        }
    }
}

#[test]
fn car_one_shot_2_ranks_3_calls() {
    model(2, car, |s, r| car_rank(s, r, 3, true));
}

#[test]
fn car_one_shot_3_ranks_2_calls() {
    model(3, car, |s, r| car_rank(s, r, 2, true));
}

/// The model can fail: without the parity a rank's next call overwrites the half a peer still reads.
#[test]
#[should_panic]
fn car_same_half_every_call_is_caught() {
    model(2, car, |s, r| car_rank(s, r, 2, false));
}

/// The epoch-flag barrier with the kernel's tag `tag(rank, call)`, `calls` calls back to back on block 0's phase 0,
/// each call's result checked by `judge(rank, call, result)`.
fn tagged_rank(
    s: &Car,
    rank: usize,
    calls: u64,
    tag: fn(usize, u64) -> u32,
    judge: fn(usize, u64, Result<(), gpu::KernelFault>),
) {
    let flags: Vec<u64> = s.flags.iter().map(|f| f.as_ptr() as u64).collect();
    let mut counters = [0u64; MAX_BLOCKS];
    let deadline = forever();
    for call in 1..=calls {
        // SAFETY: counters is this rank's array of MAX_BLOCKS u64.
        let epoch = unsafe { next_epoch(counters.as_mut_ptr() as u64, 0, 1) };
        // SAFETY: flags[r] are live arrays of loom atomics covering block 0's slots.
        judge(rank, call, unsafe { flag_barrier(&flags, rank, 0, 0, epoch, tag(rank, call), &deadline, "tagged") });
    }
}

/// Every rank runs one kernel per call, another each call: a peer already at the next call (whose flag carries the
/// next kernel's tag) is never taken for a mismatch, however the stores and polls interleave.
#[test]
fn tags_that_change_call_by_call_alike_on_every_rank_pass() {
    model(2, car, |s, r| {
        tagged_rank(
            s,
            r,
            3,
            |_, call| call as u32 % 2 + 1,
            |r, c, got| got.unwrap_or_else(|e| panic!("rank {r} call {c}: {e}")),
        )
    });
}

/// Ranks that run different kernels on one call: every rank's barrier fails naming a peer of the other kernel, in
/// every interleaving.
#[test]
fn ranks_of_different_kernels_name_each_other() {
    model(3, car, |s, r| {
        tagged_rank(
            s,
            r,
            1,
            |rank, _| u32::from(rank == 0) + 1,
            |rank, _, got| match got {
                Err(gpu::KernelFault::Mismatch { peer, .. }) => {
                    assert_eq!(peer == 0, rank != 0, "rank {rank} named {peer}")
                }
                other => panic!("rank {rank}: {other:?}"),
            },
        )
    });
}

#[test]
fn symm_one_shot_2_ranks_3_calls() {
    model(2, symm, |s, r| symm_rank(s, r, 3, true));
}

#[test]
fn symm_one_shot_3_ranks_2_calls() {
    model(3, symm, |s, r| symm_rank(s, r, 2, true));
}

/// The model can fail: without the exit handshake the next call's copy-in overwrites a buffer a peer still reads.
#[test]
#[should_panic]
fn symm_without_exit_barrier_is_caught() {
    model(2, symm, |s, r| symm_rank(s, r, 2, false));
}
