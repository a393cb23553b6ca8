//! Host twins of `kernels/symm_tuned.cu`: flag-and-data packets as 8-byte atomics, and the zero-copy kernels over
//! the epoch-flag barrier. Blocks run one after another in the same order on every rank; block b's packets are the
//! ones with index j = b (mod grid), as with one thread per block on the device (`symm_ll_norm`'s: the kernel's,
//! block b's threads' packets, with its per-row counters).

use crate::tuned_params::{ll_flag, TunedParams};
use collective_core::host_sync::{flag_barrier, next_epoch};
use collective_core::norm::{add_residual, add_rms_norm, rms_norm, row_range};
use collective_core::{
    block_range, shard_elems, shard_range, sum_sources, AddRmsNorm, DType, HostElem, MAX_BLOCKS, MAX_RANKS,
};
use deadline::{wait_all, Deadline};
use gpu::{DevicePtr, HostKernel, HostLaunch, KernelFault};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

pub(crate) static KERNELS: &[(&str, HostKernel)] = &[
    ("symm_ll_bf16", ll),
    ("symm_ll_fp16", ll),
    ("symm_ll_fp32", ll),
    ("symm_ll_norm_bf16", ll_norm),
    ("symm_ll_norm_fp16", ll_norm),
    ("symm_ll_norm_fp32", ll_norm),
    ("symm_epoch_1shot_bf16", epoch_one_shot),
    ("symm_epoch_1shot_fp16", epoch_one_shot),
    ("symm_epoch_1shot_fp32", epoch_one_shot),
    ("symm_epoch_1shot_norm_bf16", epoch_one_shot_norm),
    ("symm_epoch_1shot_norm_fp16", epoch_one_shot_norm),
    ("symm_epoch_1shot_norm_fp32", epoch_one_shot_norm),
    ("symm_zc_1shot_bf16", zc_one_shot),
    ("symm_zc_1shot_fp16", zc_one_shot),
    ("symm_zc_1shot_fp32", zc_one_shot),
    ("symm_zc_1shot_norm_bf16", zc_one_shot_norm),
    ("symm_zc_1shot_norm_fp16", zc_one_shot_norm),
    ("symm_zc_1shot_norm_fp32", zc_one_shot_norm),
    ("symm_zc_1shot_norm_table_bf16", zc_one_shot_norm_table),
    ("symm_zc_1shot_norm_table_fp16", zc_one_shot_norm_table),
    ("symm_zc_1shot_norm_table_fp32", zc_one_shot_norm_table),
    ("symm_zc_2shot_bf16", zc_two_shot),
    ("symm_zc_2shot_fp16", zc_two_shot),
    ("symm_zc_2shot_fp32", zc_two_shot),
    ("symm_zc_2shot_pull_bf16", zc_two_shot_pull),
    ("symm_zc_2shot_pull_fp16", zc_two_shot_pull),
    ("symm_zc_2shot_pull_fp32", zc_two_shot_pull),
    ("symm_zc_2shot_pull_table_bf16", zc_two_shot_pull_table),
    ("symm_zc_2shot_pull_table_fp16", zc_two_shot_pull_table),
    ("symm_zc_2shot_pull_table_fp32", zc_two_shot_pull_table),
    ("symm_zc_2shot_push_bf16", zc_two_shot_push),
    ("symm_zc_2shot_push_fp16", zc_two_shot_push),
    ("symm_zc_2shot_push_fp32", zc_two_shot_push),
    ("symm_zc_2shot_push_table_bf16", zc_two_shot_push_table),
    ("symm_zc_2shot_push_table_fp16", zc_two_shot_push_table),
    ("symm_zc_2shot_push_table_fp32", zc_two_shot_push_table),
    ("symm_zc_2shot_push_norm_bf16", zc_two_shot_push_norm),
    ("symm_zc_2shot_push_norm_fp16", zc_two_shot_push_norm),
    ("symm_zc_2shot_push_norm_fp32", zc_two_shot_push_norm),
    ("symm_zc_2shot_push_norm_table_bf16", zc_two_shot_push_norm_table),
    ("symm_zc_2shot_push_norm_table_fp16", zc_two_shot_push_norm_table),
    ("symm_zc_2shot_push_norm_table_fp32", zc_two_shot_push_norm_table),
    ("symm_zc_2shot_norm_bf16", zc_two_shot_norm),
    ("symm_zc_2shot_norm_fp16", zc_two_shot_norm),
    ("symm_zc_2shot_norm_fp32", zc_two_shot_norm),
    ("symm_zc_2shot_norm_table_bf16", zc_two_shot_norm_table),
    ("symm_zc_2shot_norm_table_fp16", zc_two_shot_norm_table),
    ("symm_zc_2shot_norm_table_fp32", zc_two_shot_norm_table),
    ("symm_zc_2shot_ll_bf16", zc_two_shot_ll),
    ("symm_zc_2shot_ll_fp16", zc_two_shot_ll),
    ("symm_zc_2shot_ll_fp32", zc_two_shot_ll),
    ("symm_zc_1shot_table_bf16", zc_one_shot_table),
    ("symm_zc_1shot_table_fp16", zc_one_shot_table),
    ("symm_zc_1shot_table_fp32", zc_one_shot_table),
    ("symm_zc_2shot_table_bf16", zc_two_shot_table),
    ("symm_zc_2shot_table_fp16", zc_two_shot_table),
    ("symm_zc_2shot_table_fp32", zc_two_shot_table),
    ("symm_zc_2shot_ll_table_bf16", zc_two_shot_ll_table),
    ("symm_zc_2shot_ll_table_fp16", zc_two_shot_ll_table),
    ("symm_zc_2shot_ll_table_fp32", zc_two_shot_ll_table),
    ("symm_zc_2shot_ll_norm_bf16", zc_two_shot_ll_norm),
    ("symm_zc_2shot_ll_norm_fp16", zc_two_shot_ll_norm),
    ("symm_zc_2shot_ll_norm_fp32", zc_two_shot_ll_norm),
    ("symm_zc_2shot_ll_norm_table_bf16", zc_two_shot_ll_norm_table),
    ("symm_zc_2shot_ll_norm_table_fp16", zc_two_shot_ll_norm_table),
    ("symm_zc_2shot_ll_norm_table_fp32", zc_two_shot_ll_norm_table),
];

struct Call {
    p: TunedParams,
    dtype: DType,
    rank: usize,
    world: usize,
    grid: usize,
    deadline: Deadline,
}

fn call(l: &HostLaunch<'_>) -> Result<Call, KernelFault> {
    call_with(l.params()?, l)
}

/// The kernels' `with_peer_table`: every rank's input and output from the table the launch names.
fn call_from_table(l: &HostLaunch<'_>) -> Result<Call, KernelFault> {
    let mut p: TunedParams = l.params()?;
    if p.peer_table == 0 || !p.peer_table.is_multiple_of(8) {
        return Err(format!("a *_table kernel launched with peer table {:#x}", p.peer_table).into());
    }
    // SAFETY: `peer_table` is a live slot of 2 * MAX_RANKS u64 (`run_design`'s contract for these kernels).
    let t = unsafe { std::slice::from_raw_parts(p.peer_table as *const u64, 2 * MAX_RANKS) };
    p.inputs.copy_from_slice(&t[..MAX_RANKS]);
    p.outputs.copy_from_slice(&t[MAX_RANKS..]);
    call_with(p, l)
}

/// The norm a `*_norm` launch carries.
fn norm_of(p: &TunedParams) -> AddRmsNorm {
    let (residual, weight) = (DevicePtr(p.residual), DevicePtr(p.weight));
    AddRmsNorm { residual, weight, hidden: p.hidden as usize, eps: p.eps }
}

fn call_with(p: TunedParams, l: &HostLaunch<'_>) -> Result<Call, KernelFault> {
    Ok(Call {
        dtype: DType::from_code(p.dtype)?,
        rank: p.rank as usize,
        world: p.world as usize,
        grid: l.dims.grid as usize,
        // SAFETY: the status words are the communicator's (or the method's own) live memory, process memory on the
        // host driver, which others change only with atomic stores.
        deadline: unsafe { Deadline::after(Duration::from_nanos(p.timeout_ns)).watching(p.status) },
        p,
    })
}

/// # Safety
/// `area` is a live packet area of `2 * MAX_RANKS * ll_packets` u64.
unsafe fn packet<'a>(area: u64, index: usize) -> &'a AtomicU64 {
    // SAFETY: the caller's contract; AtomicU64 has u64's layout and the area is 8-aligned.
    unsafe { &*(area as *const AtomicU64).add(index) }
}

/// One packet of a call: its slot in each source's part of an area, its first element and how many it holds.
#[derive(Clone, Copy)]
struct Packet {
    slot: usize,
    elem: usize,
    len: usize,
}

impl Call {
    /// Stores `value` at `slot` of this rank's part of every rank's packet area (`area`: the parity's first slot).
    fn push(&self, area: usize, slot: usize, value: u64) {
        let npk = self.p.ll_packets as usize;
        for &dst in &self.p.packets[..self.world] {
            // SAFETY: every packet area was mapped at setup; callers keep `slot` below `ll_packets`.
            unsafe { packet(dst, area + self.rank * npk + slot).store(value, Ordering::Relaxed) };
        }
    }

    /// symm_ll's exchange, for one block's packets: pushes this rank's input elements of each to every rank, then
    /// waits for each from every source and writes their sum (rank order, then the bias) into the output. Only the
    /// peers' same block, which ran before, sends them.
    fn exchange(
        &self,
        epoch: u64,
        packets: impl Iterator<Item = Packet> + Clone,
        what: &str,
    ) -> Result<(), KernelFault> {
        let (p, size, npk) = (&self.p, self.dtype.size(), self.p.ll_packets as usize);
        let (flag, area) = (ll_flag(epoch), (epoch as usize & 1) * MAX_RANKS * npk);
        let (input, output) = (p.inputs[self.rank] as *const u8, p.outputs[self.rank] as *mut u8);
        for pk in packets.clone() {
            let mut word = [0u8; 4];
            // SAFETY: the input holds the packet's elements; a half-filled packet's high bytes stay 0.
            unsafe { std::ptr::copy_nonoverlapping(input.add(pk.elem * size), word.as_mut_ptr(), pk.len * size) };
            self.push(area, pk.slot, flag | u32::from_le_bytes(word) as u64);
        }
        for pk in packets {
            let mut words = [0u32; MAX_RANKS];
            wait_all(
                what,
                0..self.world,
                &self.deadline,
                |s| {
                    // SAFETY: this rank's packet area, as above.
                    let v = unsafe { packet(p.packets[self.rank], area + s * npk + pk.slot) }.load(Ordering::Relaxed);
                    words[s] = v as u32;
                    v & 0xffff_ffff_0000_0000 == flag
                },
                || None,
            )?;
            let bytes: Vec<[u8; 4]> = words[..self.world].iter().map(|w| w.to_le_bytes()).collect();
            // The packets' words, then (as the kernel adds it) this packet's elements of the bias.
            let bias = if p.bias == 0 { 0 } else { p.bias + (pk.elem * size) as u64 };
            let srcs = sum_sources(bytes.iter().map(|w| w.as_ptr() as u64), bias);
            let mut sum = [0u8; 4];
            // SAFETY: each word holds the packet's elements; the sum is written to a local word, then out.
            unsafe {
                HostElem::reduce(self.dtype, &srcs, 0, pk.len, sum.as_mut_ptr());
                std::ptr::copy_nonoverlapping(sum.as_ptr(), output.add(pk.elem * size), pk.len * size);
            }
        }
        Ok(())
    }
}

fn ll(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    let c = call(l)?;
    let per = 4 / c.dtype.size();
    let (count, npk) = (c.p.count as usize, c.p.ll_packets as usize);
    let n = count.div_ceil(per);
    if n > npk {
        return Err(format!("symm_ll: {count} elements need {n} packets, the area holds {npk}").into());
    }
    for b in 0..c.grid {
        // SAFETY: counters is this rank's array of MAX_BLOCKS u64.
        let epoch = unsafe { next_epoch(c.p.counters, b, c.grid) };
        let packets =
            (b..n).step_by(c.grid).map(|j| Packet { slot: j, elem: j * per, len: (count - j * per).min(per) });
        c.exchange(epoch, packets, &format!("symm_ll rank {} block {b}", c.rank))?;
        ll_clean(&c.p, c.rank, epoch, b, c.grid);
    }
    Ok(())
}

/// Packets of a row in `symm_ll_norm`'s layout (`ll_row_packets` in the kernels): row `row` from slot
/// `row * row_packets`, so that no packet holds two rows' elements.
pub(crate) fn row_packets(hidden: usize, size: usize) -> usize {
    (hidden * size).div_ceil(4)
}

/// How many of the packets `[lo, hi)` fall to block b of `threads` threads in a grid of `stride` threads, where thread
/// t of block b takes the packets j with j % stride == b * threads + t (the kernels' `block_packets_in`).
fn block_packets_in(lo: usize, hi: usize, b: usize, threads: usize, stride: usize) -> usize {
    let below = |x: usize| x / stride * threads + (x % stride).saturating_sub(b * threads).min(threads);
    below(hi) - below(lo)
}

/// symm_ll's exchange, whose sum lands in the output, then the one-shot designs' epilogue over it, as the kernel
/// runs them: block b's threads take the packets j with j % (grid x threads) in block b's range; each block then
/// counts what it stored of each row on the row's counter (after the epoch counters), and the block that completes a
/// row normalises it and zeroes the counter. The twin runs the blocks in turn, so the last block of a row is the
/// highest that holds a packet of it: the same sums, rows and bits.
fn ll_norm(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    let c = call(l)?;
    let (p, size) = (&c.p, c.dtype.size());
    let norm = norm_of(p);
    let (hidden, per, npk) = (norm.hidden, 4 / size, p.ll_packets as usize);
    let (rows, ppr) = (p.count as usize / hidden, row_packets(hidden, size));
    let n = rows * ppr;
    if n > npk {
        return Err(format!("symm_ll_norm: {rows} rows of {hidden} need {n} packets, the area holds {npk}").into());
    }
    let (threads, stride) = (l.dims.block as usize, c.grid * l.dims.block as usize);
    let output = p.outputs[c.rank] as *mut u8;
    // SAFETY: the counters hold MAX_BLOCKS u64 epochs, then a u32 per packet of the area (so per row), 8-aligned.
    let row_count = |row: usize| unsafe { &*((p.counters as usize + MAX_BLOCKS * 8) as *const AtomicU32).add(row) };
    for b in 0..c.grid {
        // SAFETY: counters is this rank's array of MAX_BLOCKS u64.
        let epoch = unsafe { next_epoch(p.counters, b, c.grid) };
        let mine = move |end: usize| (b * threads..end).step_by(stride).flat_map(move |j| j..(j + threads).min(end));
        let packets = mine(n).map(|slot| {
            let (row, q) = (slot / ppr, slot % ppr);
            Packet { slot, elem: row * hidden + q * per, len: (hidden - q * per).min(per) }
        });
        c.exchange(epoch, packets, &format!("symm_ll_norm rank {} block {b}", c.rank))?;
        for row in 0..rows {
            let stored = block_packets_in(row * ppr, (row + 1) * ppr, b, threads, stride) as u32;
            if stored > 0 && row_count(row).fetch_add(stored, Ordering::AcqRel) + stored == ppr as u32 {
                row_count(row).store(0, Ordering::Relaxed);
                // SAFETY: the output and the residual hold `count` elements, the weight `hidden`; the sum is read
                // from the output before y overwrites it.
                unsafe { add_rms_norm(c.dtype, &[output], &norm, output, (row, row + 1)) };
            }
        }
        // The slots this block's threads read, and their share of those past the rows, which nobody reads.
        ll_clean_slots(p, c.rank, epoch, mine(npk).flat_map(every_source));
    }
    Ok(())
}

/// The kernels' `ll_clean`: block b zeroes the slots j = b (mod grid) of this rank's area of `epoch`'s parity, for
/// every source, when the packet flags wrap before the area's next use.
fn ll_clean(p: &TunedParams, rank: usize, epoch: u64, b: usize, grid: usize) {
    ll_clean_slots(p, rank, epoch, (b..p.ll_packets as usize).step_by(grid).flat_map(every_source));
}

/// Slot `j` of every source's part of an area, as `(source, slot)`.
fn every_source(j: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..MAX_RANKS).map(move |src| (src, j))
}

/// Zeroes `slots` (`(source, slot)`) of this rank's area of `epoch`'s parity when the flags wrap before the area's
/// next use.
fn ll_clean_slots(p: &TunedParams, rank: usize, epoch: u64, slots: impl Iterator<Item = (usize, usize)>) {
    if ll_flag(epoch + 2) > ll_flag(epoch) {
        return;
    }
    let npk = p.ll_packets as usize;
    let area = (epoch as usize & 1) * MAX_RANKS * npk;
    for (src, j) in slots {
        // SAFETY: this rank's packet area, mapped at setup: 2 parities x MAX_RANKS sources x npk slots.
        unsafe { packet(p.packets[rank], area + src * npk + j).store(0, Ordering::Relaxed) };
    }
}

/// The zero-copy designs: one-shot, two-shot, two-shot with its input pushed into the shard owners' staging, two-shot
/// gathering by pulling from them, or
/// one- or two-shot with the residual add and RMSNorm (blocks own rows; the two-shot's rows split among the ranks
/// first).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Zc {
    OneShot,
    TwoShot,
    TwoShotPush,
    TwoShotPull,
    OneShotNorm,
    TwoShotNorm,
    TwoShotPushNorm,
}

fn zc(c: Call, kind: Zc) -> Result<(), KernelFault> {
    let (p, size, vec) = (&c.p, c.dtype.size(), c.dtype.vec());
    let count = p.count as usize;
    let two_shot =
        matches!(kind, Zc::TwoShot | Zc::TwoShotPush | Zc::TwoShotPull | Zc::TwoShotNorm | Zc::TwoShotPushNorm);
    let pushes = matches!(kind, Zc::TwoShotPush | Zc::TwoShotPushNorm);
    let name = match kind {
        Zc::OneShot => "symm_zc_1shot",
        Zc::TwoShot => "symm_zc_2shot",
        Zc::TwoShotPush => "symm_zc_2shot_push",
        Zc::TwoShotPull => "symm_zc_2shot_pull",
        Zc::OneShotNorm => "symm_zc_1shot_norm",
        Zc::TwoShotNorm => "symm_zc_2shot_norm",
        Zc::TwoShotPushNorm => "symm_zc_2shot_push_norm",
    };
    if pushes && p.copy_from == 0 {
        return Err(format!("{name} launched without the input it pushes (copy_from 0)").into());
    }
    let shard = shard_elems(count, c.world, vec);
    let norm = norm_of(p);
    let all_rows = if kind == Zc::TwoShotPushNorm { (0, count / norm.hidden) } else { (0, 0) };
    // The pushed copy-in's slots, each a shard (with the norm: the largest share's rows), and where the owner's part
    // of the message starts.
    let stride = if kind == Zc::TwoShotPushNorm { all_rows.1.div_ceil(c.world) * norm.hidden } else { shard };
    let first = |owner: usize| match kind {
        Zc::TwoShotPushNorm => row_range(all_rows, owner, c.world).0 * norm.hidden,
        _ => shard_range(count, shard, owner).0,
    };
    // The fused copy-in of the two-shots that sum from the inputs leaves this rank's own shard, which no peer reads,
    // in the caller's input, and sums it from there.
    let own_in_place = matches!(kind, Zc::TwoShot | Zc::TwoShotPull | Zc::TwoShotNorm) && p.copy_from != 0;
    let summed = |r: usize| if own_in_place && r == c.rank { p.copy_from } else { p.inputs[r] };
    let srcs = sum_sources((0..c.world).map(summed), p.bias);
    for b in 0..c.grid {
        // SAFETY: counters is this rank's array of MAX_BLOCKS u64; flags[r] are live flag arrays.
        let epoch = unsafe { next_epoch(p.counters, b, c.grid) };
        // Block b's part of shard s (one-shot: of the whole message; with the norm: its rows' elements): what block b
        // of every rank reads.
        let part = |s: usize| match kind {
            Zc::TwoShot | Zc::TwoShotPush | Zc::TwoShotPull => {
                let (lo, hi) = shard_range(count, shard, s);
                block_range(lo, hi, b, c.grid, vec)
            }
            Zc::OneShot => block_range(0, count, b, c.grid, vec),
            Zc::OneShotNorm => {
                let (lo, hi) = row_range((0, count / norm.hidden), b, c.grid);
                (lo * norm.hidden, hi * norm.hidden)
            }
            Zc::TwoShotNorm | Zc::TwoShotPushNorm => {
                let (lo, hi) = row_range(row_range((0, count / norm.hidden), s, c.world), b, c.grid);
                (lo * norm.hidden, hi * norm.hidden)
            }
        };
        // The pushed copy-in's slot of rank `q` in rank `owner`'s staging half of this epoch, at element `i` of the
        // owner's part: where the kernel's view of the slot puts it.
        let slot = |owner: usize, q: usize, i: usize| {
            (p.staging[owner] + (epoch & 1) * p.half_bytes) as usize + (q * stride + i - first(owner)) * size
        };
        if pushes {
            let src = p.copy_from as *const u8;
            for s in 0..c.world {
                let (lo, hi) = part(s);
                // SAFETY: the input holds `count` elements; rank s's staging half holds every rank's slot of shard
                // s, which block b of rank s read last before the previous call's last barrier.
                unsafe { HostElem::copy(c.dtype, src.add(lo * size), slot(s, c.rank, lo) as *mut u8, 0, hi - lo) };
            }
        } else if p.copy_from != 0 {
            for s in (if two_shot { 0..c.world } else { 0..1 }).filter(|&s| !(own_in_place && s == c.rank)) {
                let (lo, hi) = part(s);
                // SAFETY: the caller's input and our registered input hold `count` elements; no peer still reads
                // ours (the previous call's last barrier).
                unsafe { HostElem::copy(c.dtype, p.copy_from as *const u8, p.inputs[c.rank] as *mut u8, lo, hi) };
            }
        }
        unsafe { flag_barrier(&p.flags[..c.world], c.rank, b, 0, epoch, p.tag, &c.deadline, name)? };
        let (lo, hi) = part(c.rank);
        let mine = p.outputs[c.rank] as *mut u8;
        let inputs: Vec<*const u8> = (0..c.world).map(|r| summed(r) as *const u8).collect();
        let rows = |(lo, hi): (usize, usize)| (lo / norm.hidden, hi / norm.hidden);
        if kind == Zc::OneShotNorm {
            // SAFETY: the inputs summed, the output and the residual hold `count` elements, the weight `hidden`.
            unsafe { add_rms_norm(c.dtype, &inputs, &norm, mine, rows((lo, hi))) };
        } else if kind == Zc::TwoShotNorm {
            let residual = norm.residual.0 as *const u8;
            // SAFETY: as above; r of this rank's rows into its output, then pushed below.
            unsafe { add_residual(c.dtype, &inputs, residual, mine, norm.hidden, rows((lo, hi))) };
        } else if kind == Zc::TwoShotPushNorm {
            // Every rank's slot of this rank's share, the residual and the output, from element lo on.
            let slots: Vec<*const u8> = (0..c.world).map(|q| slot(c.rank, q, lo) as *const u8).collect();
            let residual = (norm.residual.0 as usize + lo * size) as *const u8;
            // SAFETY: the slots, the residual and the output hold this share's rows from lo on.
            unsafe {
                add_residual(c.dtype, &slots, residual, mine.add(lo * size), norm.hidden, (0, (hi - lo) / norm.hidden))
            };
        } else if kind == Zc::TwoShotPush {
            // Every rank's slot of this rank's shard, and the bias, from element lo on.
            let slots = (0..c.world).map(|q| slot(c.rank, q, lo) as u64);
            let from_lo = sum_sources(slots, if p.bias == 0 { 0 } else { p.bias + (lo * size) as u64 });
            // SAFETY: the slots and the bias hold the shard's elements from lo on, the output `count` elements.
            unsafe { HostElem::reduce(c.dtype, &from_lo, 0, hi - lo, mine.add(lo * size)) };
        } else {
            // SAFETY: registered inputs and outputs hold `count` elements.
            unsafe { HostElem::reduce(c.dtype, &srcs, lo, hi, mine.add(lo * size)) };
        }
        // This epoch's staging half of rank `owner`, where the pulled two-shot leaves the owner's shard.
        let half = |owner: usize| (p.staging[owner] + (epoch & 1) * p.half_bytes) as *mut u8;
        if kind == Zc::TwoShotPull {
            // SAFETY: the output and our staging half hold `count` elements; no peer reads this half before the
            // barrier below (it was last read in call epoch - 2).
            unsafe { HostElem::copy(c.dtype, mine, half(c.rank), lo, hi) };
        } else if two_shot {
            for (d, &out) in p.outputs[..c.world].iter().enumerate().filter(|(d, _)| *d != c.rank) {
                // SAFETY: as above; rank d's output, mapped here, is written only by this range's owner.
                unsafe { HostElem::copy(c.dtype, mine, out as *mut u8, lo, hi) };
                debug_assert_ne!(d, c.rank);
            }
        }
        // SAFETY: as above.
        unsafe { flag_barrier(&p.flags[..c.world], c.rank, b, 1, epoch, p.tag, &c.deadline, name)? };
        if kind == Zc::TwoShotPull {
            for s in (0..c.world).filter(|&s| s != c.rank) {
                let (lo, hi) = part(s);
                // SAFETY: rank s's half holds block b's part of its shard (its block b stored it before this
                // barrier); the output holds `count` elements.
                unsafe { HostElem::copy(c.dtype, half(s), mine, lo, hi) };
            }
        }
        if matches!(kind, Zc::TwoShotNorm | Zc::TwoShotPushNorm) {
            // Block b's rows of every share, whose r block b of every rank pushed: r into the residual, y over r.
            for s in 0..c.world {
                let residual = norm.residual.0 as *mut u8;
                // SAFETY: the output and the residual hold `count` elements, the weight `hidden`.
                unsafe { rms_norm(c.dtype, mine, Some(residual), mine, &norm, rows(part(s))) };
            }
        }
        ll_clean(p, c.rank, epoch, b, c.grid);
    }
    Ok(())
}

fn epoch_one_shot(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    epoch(call(l)?, false)
}
fn epoch_one_shot_norm(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    epoch(call(l)?, true)
}

/// The epoch one-shot: block b copies its part of this rank's input into its staging half, and past the one barrier
/// sums that part from every rank's half; with the residual add and RMSNorm, blocks own whole rows.
fn epoch(c: Call, with_norm: bool) -> Result<(), KernelFault> {
    let (p, size, vec) = (&c.p, c.dtype.size(), c.dtype.vec());
    let count = p.count as usize;
    let norm = norm_of(p);
    let name = if with_norm { "symm_epoch_1shot_norm" } else { "symm_epoch_1shot" };
    for b in 0..c.grid {
        // SAFETY: counters is this rank's array of MAX_BLOCKS u64; flags[r] are live flag arrays.
        let epoch = unsafe { next_epoch(p.counters, b, c.grid) };
        let off = (epoch & 1) * p.half_bytes;
        let views: Vec<*const u8> = p.staging[..c.world].iter().map(|&a| (a + off) as *const u8).collect();
        let (lo, hi) = if with_norm {
            let (lo, hi) = row_range((0, count / norm.hidden), b, c.grid);
            (lo * norm.hidden, hi * norm.hidden)
        } else {
            block_range(0, count, b, c.grid, vec)
        };
        // SAFETY: registered input and staging halves hold `count` elements.
        unsafe { HostElem::copy(c.dtype, p.inputs[c.rank] as *const u8, views[c.rank] as *mut u8, lo, hi) };
        unsafe { flag_barrier(&p.flags[..c.world], c.rank, b, 0, epoch, p.tag, &c.deadline, name)? };
        let out = p.outputs[c.rank] as *mut u8;
        if with_norm {
            // SAFETY: the staging halves, the output and the residual hold `count` elements, the weight `hidden`.
            unsafe { add_rms_norm(c.dtype, &views, &norm, out, (lo / norm.hidden, hi / norm.hidden)) };
        } else {
            let sum_of = sum_sources(views.iter().map(|&v| v as u64), p.bias);
            // SAFETY: as above; the output holds `count` elements.
            unsafe { HostElem::reduce(c.dtype, &sum_of, lo, hi, out.add(lo * size)) };
        }
        ll_clean(p, c.rank, epoch, b, c.grid);
    }
    Ok(())
}

fn zc_one_shot(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call(l)?, Zc::OneShot)
}
fn zc_two_shot(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call(l)?, Zc::TwoShot)
}
fn zc_two_shot_pull(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call(l)?, Zc::TwoShotPull)
}
fn zc_two_shot_pull_table(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call_from_table(l)?, Zc::TwoShotPull)
}
fn zc_two_shot_push(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call(l)?, Zc::TwoShotPush)
}
fn zc_two_shot_push_table(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call_from_table(l)?, Zc::TwoShotPush)
}
fn zc_two_shot_push_norm(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call(l)?, Zc::TwoShotPushNorm)
}
fn zc_two_shot_push_norm_table(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call_from_table(l)?, Zc::TwoShotPushNorm)
}
fn zc_one_shot_norm(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call(l)?, Zc::OneShotNorm)
}
fn zc_two_shot_norm(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call(l)?, Zc::TwoShotNorm)
}
fn zc_two_shot_norm_table(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call_from_table(l)?, Zc::TwoShotNorm)
}
fn zc_one_shot_table(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call_from_table(l)?, Zc::OneShot)
}
fn zc_two_shot_table(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call_from_table(l)?, Zc::TwoShot)
}
fn zc_one_shot_norm_table(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call_from_table(l)?, Zc::OneShotNorm)
}
fn zc_two_shot_ll(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc_2shot_ll(call(l)?)
}
fn zc_two_shot_ll_table(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc_2shot_ll(call_from_table(l)?)
}
fn zc_two_shot_ll_norm(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc_2shot_ll_norm(call(l)?, l.dims.block as usize)
}
fn zc_two_shot_ll_norm_table(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc_2shot_ll_norm(call_from_table(l)?, l.dims.block as usize)
}

/// The packet two-shot with the residual add and RMSNorm, block by block as the kernel: block b adds the residual to
/// the sum of its rows of this rank's share (r, into the output) and sends r's packets (rows from the share's first)
/// to every rank, then waits for block b's rows of every other share, stores them and normalises all of them there.
/// Only the peers' block b, which ran before, sends them. At the flags' wrap it zeroes the slots it polled, this
/// rank's own, and (as thread t of the kernel's `threads`) its part of those past every share's rows.
fn zc_2shot_ll_norm(c: Call, threads: usize) -> Result<(), KernelFault> {
    let (p, size) = (&c.p, c.dtype.size());
    let norm = norm_of(p);
    let (hidden, per, npk) = (norm.hidden, 4 / size, p.ll_packets as usize);
    let (rows, ppr) = (p.count as usize / hidden, row_packets(hidden, size));
    if rows.div_ceil(c.world) * ppr > npk {
        return Err(
            format!("symm_zc_2shot_ll_norm: shares of {rows} rows of {hidden} need more than {npk} packets").into()
        );
    }
    let share = |s: usize| row_range((0, rows), s, c.world);
    let inputs: Vec<*const u8> = p.inputs[..c.world].iter().map(|&a| a as *const u8).collect();
    let (output, residual) = (p.outputs[c.rank] as *mut u8, norm.residual.0 as *mut u8);
    // Packet q of `row` in the output: its first element and how many it holds.
    let at = |row: usize, q: usize| (row * hidden + q * per, (hidden - q * per).min(per));
    for b in 0..c.grid {
        // SAFETY: counters is this rank's array of MAX_BLOCKS u64; flags[r] are live flag arrays.
        let epoch = unsafe { next_epoch(p.counters, b, c.grid) };
        unsafe { flag_barrier(&p.flags[..c.world], c.rank, b, 0, epoch, p.tag, &c.deadline, "symm_zc_2shot_ll_norm")? };
        let (flag, area) = (ll_flag(epoch), (epoch as usize & 1) * MAX_RANKS * npk);
        let mine = share(c.rank);
        let (lo, hi) = row_range(mine, b, c.grid);
        // SAFETY: registered inputs, the output and the residual hold `count` elements.
        unsafe { add_residual(c.dtype, &inputs, residual, output, hidden, (lo, hi)) };
        for (row, q) in (lo..hi).flat_map(|row| (0..ppr).map(move |q| (row, q))) {
            let ((e, k), mut word) = (at(row, q), [0u8; 4]);
            // SAFETY: the output holds the packet's elements; a half-filled packet's high bytes stay 0.
            unsafe { std::ptr::copy_nonoverlapping(output.add(e * size), word.as_mut_ptr(), k * size) };
            c.push(area, (row - mine.0) * ppr + q, flag | u32::from_le_bytes(word) as u64);
        }
        let what = format!("symm_zc_2shot_ll_norm rank {} block {b}", c.rank);
        for s in (0..c.world).filter(|&s| s != c.rank) {
            let sh = share(s);
            let (lo, hi) = row_range(sh, b, c.grid);
            for (row, q) in (lo..hi).flat_map(|row| (0..ppr).map(move |q| (row, q))) {
                let slot = area + s * npk + (row - sh.0) * ppr + q;
                let mut v = 0;
                // SAFETY: this rank's packet area, as above.
                let arrived = |_| {
                    v = unsafe { packet(p.packets[c.rank], slot) }.load(Ordering::Relaxed);
                    v & 0xffff_ffff_0000_0000 == flag
                };
                wait_all(&what, [s], &c.deadline, arrived, || None)?;
                let ((e, k), word) = (at(row, q), (v as u32).to_le_bytes());
                // SAFETY: the output holds `count` elements; the packet's lie in row `row`.
                unsafe { std::ptr::copy_nonoverlapping(word.as_ptr(), output.add(e * size), k * size) };
            }
        }
        for s in 0..c.world {
            // SAFETY: the output and the residual hold `count` elements, the weight `hidden`.
            unsafe { rms_norm(c.dtype, output, Some(residual), output, &norm, row_range(share(s), b, c.grid)) };
        }
        let stride = c.grid * threads;
        let polled = (0..MAX_RANKS).flat_map(|src| {
            let sh = if src < c.world { share(src) } else { (0, 0) };
            let (lo, hi) = row_range(sh, b, c.grid);
            let past =
                ((sh.1 - sh.0) * ppr + b * threads..npk).step_by(stride).flat_map(move |j| j..(j + threads).min(npk));
            ((lo - sh.0) * ppr..(hi - sh.0) * ppr).chain(past).map(move |j| (src, j))
        });
        ll_clean_slots(p, c.rank, epoch, polled);
    }
    Ok(())
}

/// Block b sums packets j = b (mod grid) of this rank's shard and sends them to every peer, then waits for packets
/// j = b (mod grid) of every shard: only the peers' block b, which came before, produces them.
fn zc_2shot_ll(c: Call) -> Result<(), KernelFault> {
    let (p, size, vec) = (&c.p, c.dtype.size(), c.dtype.vec());
    let per = 4 / size;
    let (count, npk) = (p.count as usize, p.ll_packets as usize);
    let shard = shard_elems(count, c.world, vec);
    if shard.div_ceil(per) > npk {
        return Err(format!(
            "symm_zc_2shot_ll: shards of {shard} elements need more than the {npk} packets of an area"
        )
        .into());
    }
    let srcs = sum_sources(p.inputs[..c.world].iter().copied(), p.bias);
    let output = p.outputs[c.rank] as *mut u8;
    for b in 0..c.grid {
        // SAFETY: counters is this rank's array of MAX_BLOCKS u64; flags[r] are live flag arrays.
        let epoch = unsafe { next_epoch(p.counters, b, c.grid) };
        unsafe { flag_barrier(&p.flags[..c.world], c.rank, b, 0, epoch, p.tag, &c.deadline, "symm_zc_2shot_ll")? };
        let flag = ll_flag(epoch);
        let area = (epoch as usize & 1) * MAX_RANKS * npk;
        let (lo, hi) = shard_range(count, shard, c.rank);
        for j in (b..(hi - lo).div_ceil(per)).step_by(c.grid) {
            let (e, k) = (lo + j * per, (hi - lo - j * per).min(per));
            let mut word = [0u8; 4];
            // SAFETY: registered inputs hold `count` elements and [e, e + k) lies in this shard.
            unsafe { HostElem::reduce(c.dtype, &srcs, e, e + k, word.as_mut_ptr()) };
            c.push(area, j, flag | u32::from_le_bytes(word) as u64);
        }
        let what = format!("symm_zc_2shot_ll rank {} block {b}", c.rank);
        for s in 0..c.world {
            let (lo, hi) = shard_range(count, shard, s);
            for j in (b..(hi - lo).div_ceil(per)).step_by(c.grid) {
                let mut v = 0;
                // SAFETY: this rank's packet area, as above.
                let arrived = |_| {
                    v = unsafe { packet(p.packets[c.rank], area + s * npk + j) }.load(Ordering::Relaxed);
                    v & 0xffff_ffff_0000_0000 == flag
                };
                wait_all(&what, [s], &c.deadline, arrived, || None)?;
                let k = (hi - lo - j * per).min(per);
                let word = (v as u32).to_le_bytes();
                // SAFETY: the output holds `count` elements; [lo + j * per, + k) lies in shard s.
                unsafe { std::ptr::copy_nonoverlapping(word.as_ptr(), output.add((lo + j * per) * size), k * size) };
            }
        }
        ll_clean(p, c.rank, epoch, b, c.grid);
    }
    Ok(())
}
