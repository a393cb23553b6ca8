//! Host twins of `kernels/symm_tuned.cu`: flag-and-data packets as 8-byte atomics, and the zero-copy kernels over
//! the epoch-flag barrier. Blocks run one after another in the same order on every rank; block b's packets are the
//! ones with index j = b (mod grid), as with one thread per block on the device.

use crate::tuned_params::{ll_flag, TunedParams};
use collective_core::host_sync::{flag_barrier, next_epoch};
use collective_core::{block_range, shard_elems, shard_range, sum_sources, DType, HostElem, MAX_RANKS};
use deadline::{wait_all, Deadline};
use gpu::{HostKernel, HostLaunch, KernelFault};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub(crate) static KERNELS: &[(&str, HostKernel)] = &[
    ("symm_ll_bf16", ll),
    ("symm_ll_fp16", ll),
    ("symm_ll_fp32", ll),
    ("symm_epoch_1shot_bf16", epoch_one_shot),
    ("symm_epoch_1shot_fp16", epoch_one_shot),
    ("symm_epoch_1shot_fp32", epoch_one_shot),
    ("symm_zc_1shot_bf16", zc_one_shot),
    ("symm_zc_1shot_fp16", zc_one_shot),
    ("symm_zc_1shot_fp32", zc_one_shot),
    ("symm_zc_2shot_bf16", zc_two_shot),
    ("symm_zc_2shot_fp16", zc_two_shot),
    ("symm_zc_2shot_fp32", zc_two_shot),
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

fn ll(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    let c = call(l)?;
    let (p, size) = (&c.p, c.dtype.size());
    let per = 4 / size;
    let count = p.count as usize;
    let n = count.div_ceil(per);
    let npk = p.ll_packets as usize;
    if n > npk {
        return Err(format!("symm_ll: {count} elements need {n} packets, the area holds {npk}").into());
    }
    let input = p.inputs[c.rank] as *const u8;
    let output = p.outputs[c.rank] as *mut u8;
    for b in 0..c.grid {
        // SAFETY: counters is this rank's array of MAX_BLOCKS u64.
        let epoch = unsafe { next_epoch(p.counters, b, c.grid) };
        let flag = ll_flag(epoch);
        let area = (epoch as usize & 1) * MAX_RANKS * npk;
        for j in (b..n).step_by(c.grid) {
            let len = (count - j * per).min(per) * size;
            let mut word = [0u8; 4];
            // SAFETY: the registered input holds `count` elements; `len` stops at its end.
            unsafe { std::ptr::copy_nonoverlapping(input.add(j * 4), word.as_mut_ptr(), len) };
            let pk = flag | u32::from_le_bytes(word) as u64;
            for &dst in &p.packets[..c.world] {
                // SAFETY: every packet area was mapped at setup and holds this slot (n <= npk).
                unsafe { packet(dst, area + c.rank * npk + j).store(pk, Ordering::Relaxed) };
            }
        }
        let what = format!("symm_ll rank {} block {b}", c.rank);
        for j in (b..n).step_by(c.grid) {
            let mut words = [0u32; MAX_RANKS];
            // SAFETY: this rank's packet area, as above.
            wait_all(
                &what,
                0..c.world,
                &c.deadline,
                |s| {
                    let v = unsafe { packet(p.packets[c.rank], area + s * npk + j) }.load(Ordering::Relaxed);
                    words[s] = v as u32;
                    v & 0xffff_ffff_0000_0000 == flag
                },
                || None,
            )?;
            let bytes: Vec<[u8; 4]> = words[..c.world].iter().map(|w| w.to_le_bytes()).collect();
            // The packets' words, then (as the kernel adds it) this packet's elements of the bias.
            let bias = if p.bias == 0 { 0 } else { p.bias + (j * 4) as u64 };
            let srcs = sum_sources(bytes.iter().map(|w| w.as_ptr() as u64), bias);
            let mut sum = [0u8; 4];
            let k = (count - j * per).min(per);
            // SAFETY: each word holds `per` elements; the sum is written to a local word, then `k` elements out.
            unsafe {
                HostElem::reduce(c.dtype, &srcs, 0, k, sum.as_mut_ptr());
                std::ptr::copy_nonoverlapping(sum.as_ptr(), output.add(j * 4), k * size);
            }
        }
        ll_clean(p, c.rank, epoch, b, c.grid);
    }
    Ok(())
}

/// The kernels' `ll_clean`: block b zeroes the slots j = b (mod grid) of this rank's area of `epoch`'s parity, for
/// every source, when the packet flags wrap before the area's next use.
fn ll_clean(p: &TunedParams, rank: usize, epoch: u64, b: usize, grid: usize) {
    if ll_flag(epoch + 2) > ll_flag(epoch) {
        return;
    }
    let npk = p.ll_packets as usize;
    let area = (epoch as usize & 1) * MAX_RANKS * npk;
    for j in (b..npk).step_by(grid) {
        for src in 0..MAX_RANKS {
            // SAFETY: this rank's packet area, mapped at setup: 2 parities x MAX_RANKS sources x npk slots.
            unsafe { packet(p.packets[rank], area + src * npk + j).store(0, Ordering::Relaxed) };
        }
    }
}

fn zc(c: Call, two_shot: bool) -> Result<(), KernelFault> {
    let (p, size, vec) = (&c.p, c.dtype.size(), c.dtype.vec());
    let count = p.count as usize;
    let name = if two_shot { "symm_zc_2shot" } else { "symm_zc_1shot" };
    let srcs = sum_sources(p.inputs[..c.world].iter().copied(), p.bias);
    for b in 0..c.grid {
        // SAFETY: counters is this rank's array of MAX_BLOCKS u64; flags[r] are live flag arrays.
        let epoch = unsafe { next_epoch(p.counters, b, c.grid) };
        // Block b's part of shard s (one-shot: of the whole message): what block b of every rank reads.
        let part = |s: usize| {
            if two_shot {
                let (lo, hi) = shard_range(count, shard_elems(count, c.world, vec), s);
                block_range(lo, hi, b, c.grid, vec)
            } else {
                block_range(0, count, b, c.grid, vec)
            }
        };
        if p.copy_from != 0 {
            for s in if two_shot { 0..c.world } else { 0..1 } {
                let (lo, hi) = part(s);
                // SAFETY: the caller's input and our registered input hold `count` elements; no peer still reads
                // ours (the previous call's last barrier).
                unsafe { HostElem::copy(c.dtype, p.copy_from as *const u8, p.inputs[c.rank] as *mut u8, lo, hi) };
            }
        }
        unsafe { flag_barrier(&p.flags[..c.world], c.rank, b, 0, epoch, &c.deadline, name)? };
        let (lo, hi) = part(c.rank);
        let mine = p.outputs[c.rank] as *mut u8;
        // SAFETY: registered inputs and outputs hold `count` elements.
        unsafe { HostElem::reduce(c.dtype, &srcs, lo, hi, mine.add(lo * size)) };
        if two_shot {
            for (d, &out) in p.outputs[..c.world].iter().enumerate().filter(|(d, _)| *d != c.rank) {
                // SAFETY: as above; rank d's output, mapped here, is written only by this range's owner.
                unsafe { HostElem::copy(c.dtype, mine, out as *mut u8, lo, hi) };
                debug_assert_ne!(d, c.rank);
            }
        }
        // SAFETY: as above.
        unsafe { flag_barrier(&p.flags[..c.world], c.rank, b, 1, epoch, &c.deadline, name)? };
        ll_clean(p, c.rank, epoch, b, c.grid);
    }
    Ok(())
}

fn epoch_one_shot(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    let c = call(l)?;
    let (p, size, vec) = (&c.p, c.dtype.size(), c.dtype.vec());
    let count = p.count as usize;
    for b in 0..c.grid {
        // SAFETY: counters is this rank's array of MAX_BLOCKS u64; flags[r] are live flag arrays.
        let epoch = unsafe { next_epoch(p.counters, b, c.grid) };
        let off = (epoch & 1) * p.half_bytes;
        let views: Vec<*const u8> = p.staging[..c.world].iter().map(|&a| (a + off) as *const u8).collect();
        let sum_of = sum_sources(views.iter().map(|&v| v as u64), p.bias);
        let (lo, hi) = block_range(0, count, b, c.grid, vec);
        // SAFETY: registered input and staging halves hold `count` elements.
        unsafe { HostElem::copy(c.dtype, p.inputs[c.rank] as *const u8, views[c.rank] as *mut u8, lo, hi) };
        unsafe { flag_barrier(&p.flags[..c.world], c.rank, b, 0, epoch, &c.deadline, "symm_epoch_1shot")? };
        // SAFETY: as above; the output holds `count` elements.
        unsafe { HostElem::reduce(c.dtype, &sum_of, lo, hi, (p.outputs[c.rank] as *mut u8).add(lo * size)) };
        ll_clean(p, c.rank, epoch, b, c.grid);
    }
    Ok(())
}

fn zc_one_shot(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call(l)?, false)
}
fn zc_two_shot(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call(l)?, true)
}
fn zc_one_shot_table(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call_from_table(l)?, false)
}
fn zc_two_shot_table(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc(call_from_table(l)?, true)
}
fn zc_two_shot_ll(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc_2shot_ll(call(l)?)
}
fn zc_two_shot_ll_table(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    zc_2shot_ll(call_from_table(l)?)
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
        unsafe { flag_barrier(&p.flags[..c.world], c.rank, b, 0, epoch, &c.deadline, "symm_zc_2shot_ll")? };
        let flag = ll_flag(epoch);
        let area = (epoch as usize & 1) * MAX_RANKS * npk;
        let (lo, hi) = shard_range(count, shard, c.rank);
        for j in (b..(hi - lo).div_ceil(per)).step_by(c.grid) {
            let (e, k) = (lo + j * per, (hi - lo - j * per).min(per));
            let mut word = [0u8; 4];
            // SAFETY: registered inputs hold `count` elements and [e, e + k) lies in this shard.
            unsafe { HostElem::reduce(c.dtype, &srcs, e, e + k, word.as_mut_ptr()) };
            let pk = flag | u32::from_le_bytes(word) as u64;
            for &dst in &p.packets[..c.world] {
                // SAFETY: every packet area was mapped at setup and holds this slot (checked above).
                unsafe { packet(dst, area + c.rank * npk + j).store(pk, Ordering::Relaxed) };
            }
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
