//! Host twins of `kernels/car.cu`: the same partition, epochs, flag slots and barriers, with std atomics on the
//! shared mappings. Blocks run one after another; every rank runs them in the same order, so block b's barrier
//! only ever waits for the peers' block b, as on the device. The ablation variants take the same knobs as the
//! kernels' `K` bits. The two-shot twins read the fixed input buffers as the kernel does: the host driver runs the
//! memcpy that `Car::enqueue` puts before the launch in order, synchronously or in the captured graph.

use crate::CarParams;
use collective_core::host_sync::{cas_barrier, flag_barrier, next_epoch};
use collective_core::norm::{self, add_residual, rms_norm, row_range};
use collective_core::{block_range, shard_elems, shard_range, sum_sources, AddRmsNorm, DType, HostElem, MAX_RANKS};
use deadline::Deadline;
use gpu::{DevicePtr, HostKernel, HostLaunch, KernelFault};
use std::time::Duration;

macro_rules! kernels {
    ($($stem:literal => $f:ident),* $(,)?) => {
        pub(crate) static KERNELS: &[(&str, HostKernel)] = &[
            $((concat!($stem, "_bf16"), $f), (concat!($stem, "_fp16"), $f), (concat!($stem, "_fp32"), $f),)*
            ("car_barrier_only", barrier_only),
            ("car_add_rms_norm_bf16", add_rms_norm),
            ("car_add_rms_norm_fp16", add_rms_norm),
            ("car_add_rms_norm_fp32", add_rms_norm),
        ];
    };
}

kernels! {
    "car_1shot" => one_shot,
    "car_2shot" => two_shot,
    "car_rs" => reduce_scatter,
    "car_rs_cols" => reduce_scatter_cols,
    "car_ag" => all_gather,
    "car_1shot_norm" => one_shot_norm,
    "car_2shot_norm" => two_shot_norm,
    "car_1shot_round" => one_shot_round,
    "car_1shot_ptrtable" => one_shot_table,
    "car_1shot_push" => one_shot_push,
    "car_1shot_oneblock" => one_shot_one_block,
    "car_1shot_cas" => one_shot_cas,
    "car_2shot_3bar" => two_shot_exit,
    "car_1shot_broken_samehalf" => one_shot_same_half,
    "car_ag_broken_ringorder" => all_gather_ring_order,
    "car_2shot_broken_suminput" => two_shot_sum_in_input,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum CarKernel {
    BarrierOnly,
    OneShot,
    TwoShot,
    ReduceScatter,
    AllGather,
    OneShotNorm,
    TwoShotNorm,
    ReduceScatterCols,
}

/// The kernels' `K` bits.
#[derive(Clone, Copy, Default)]
struct Knobs {
    round: bool,
    table: bool,
    push: bool,
    one_block: bool,
    exit: bool,
    cas: bool,
    /// The broken variant: one buffer half for every call.
    same_half: bool,
    /// The broken all-gather: output slot s holds rank (rank + s) mod W's input.
    ring_order: bool,
    /// The broken two-shot: each shard's sum in its rank's fixed input buffer, gathered from there.
    sum_in_input: bool,
}

fn barrier_only(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_barrier_only", CarKernel::BarrierOnly, Knobs::default())
}
fn one_shot(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_1shot", CarKernel::OneShot, Knobs::default())
}
fn two_shot(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_2shot", CarKernel::TwoShot, Knobs::default())
}
fn reduce_scatter(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_rs", CarKernel::ReduceScatter, Knobs::default())
}
fn all_gather(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_ag", CarKernel::AllGather, Knobs::default())
}
fn reduce_scatter_cols(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_rs_cols", CarKernel::ReduceScatterCols, Knobs::default())
}
fn one_shot_norm(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_1shot_norm", CarKernel::OneShotNorm, Knobs::default())
}
fn two_shot_norm(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_2shot_norm", CarKernel::TwoShotNorm, Knobs::default())
}
/// The unfused sequence's norm over an allreduce's result (no peers, so no blocks to tell apart).
fn add_rms_norm(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    let p: CarParams = l.params()?;
    let (dtype, norm) = (DType::from_code(p.dtype)?, norm_of(&p));
    let rows = (0, p.count as usize / norm.hidden);
    // SAFETY: the launch's contract: the call's output holds `count` elements, the residual too, the weight `hidden`.
    unsafe { norm::add_rms_norm(dtype, &[p.input as *const u8], &norm, p.output as *mut u8, rows) };
    Ok(())
}

/// The norm a `*_norm` launch carries.
fn norm_of(p: &CarParams) -> AddRmsNorm {
    let (residual, weight) = (DevicePtr(p.residual), DevicePtr(p.weight));
    AddRmsNorm { residual, weight, hidden: p.hidden as usize, eps: p.eps }
}

fn one_shot_round(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_1shot_round", CarKernel::OneShot, Knobs { round: true, ..Knobs::default() })
}
fn one_shot_table(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_1shot_ptrtable", CarKernel::OneShot, Knobs { table: true, ..Knobs::default() })
}
fn one_shot_push(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_1shot_push", CarKernel::OneShot, Knobs { push: true, ..Knobs::default() })
}
fn one_shot_one_block(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_1shot_oneblock", CarKernel::OneShot, Knobs { one_block: true, ..Knobs::default() })
}
fn one_shot_cas(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_1shot_cas", CarKernel::OneShot, Knobs { cas: true, ..Knobs::default() })
}
fn one_shot_same_half(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_1shot_broken_samehalf", CarKernel::OneShot, Knobs { same_half: true, ..Knobs::default() })
}
fn all_gather_ring_order(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_ag_broken_ringorder", CarKernel::AllGather, Knobs { ring_order: true, ..Knobs::default() })
}
fn two_shot_exit(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_2shot_3bar", CarKernel::TwoShot, Knobs { exit: true, ..Knobs::default() })
}
fn two_shot_sum_in_input(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, "car_2shot_broken_suminput", CarKernel::TwoShot, Knobs { sum_in_input: true, ..Knobs::default() })
}

struct Call<'a> {
    p: &'a CarParams,
    knobs: Knobs,
    name: &'a str,
    /// Every rank's flag array (or signal pad, with `cas`).
    flags: Vec<u64>,
    dtype: DType,
    rank: usize,
    world: usize,
    deadline: Deadline,
}

impl Call<'_> {
    fn barrier(&self, block: usize, phase: usize, epoch: u64) -> Result<(), KernelFault> {
        // SAFETY: flags[r] for r < world are live flag arrays (signal pads), mapped at setup.
        unsafe {
            if self.knobs.cas {
                let what = format!("{} rank {} block {block} barrier {phase}", self.name, self.rank);
                cas_barrier(&self.flags, self.rank, block, &self.deadline, &what)
            } else {
                flag_barrier(&self.flags, self.rank, block, phase, epoch, self.p.tag, &self.deadline, self.name)
            }
        }
    }

    /// Every rank's buffer half for `epoch`.
    fn views(&self, epoch: u64) -> Vec<u64> {
        if self.knobs.table {
            let parity = (epoch & 1) as usize * MAX_RANKS;
            // SAFETY: the table holds 3 * MAX_RANKS u64 (views of both parities, then flag arrays).
            (0..self.world).map(|r| unsafe { *(self.p.table as *const u64).add(parity + r) }).collect()
        } else {
            let off = if self.knobs.same_half { 0 } else { (epoch & 1) * self.p.half_bytes };
            self.p.bufs[..self.world].iter().map(|&a| a + off).collect()
        }
    }

    fn copy(&self, src: u64, dst: u64, (lo, hi): (usize, usize)) {
        // SAFETY: both are buffers of at least `count` elements (input, or a registered half of capacity).
        unsafe { HostElem::copy(self.dtype, src as *const u8, dst as *mut u8, lo, hi) }
    }

    fn reduce(&self, srcs: &[u64], (lo, hi): (usize, usize), dst: *mut u8) {
        let srcs = sum_sources(srcs.iter().copied(), self.p.bias);
        // SAFETY: every source holds `hi` elements; `dst` holds `hi - lo` (or is the sources' element `lo`).
        unsafe {
            if self.knobs.round {
                HostElem::reduce_rounded(self.dtype, &srcs, lo, hi, dst)
            } else {
                HostElem::reduce(self.dtype, &srcs, lo, hi, dst)
            }
        }
    }
}

fn run(l: &HostLaunch<'_>, name: &str, kind: CarKernel, knobs: Knobs) -> Result<(), KernelFault> {
    let p: CarParams = l.params()?;
    let world = p.world as usize;
    let flags = if knobs.table {
        // SAFETY: the table holds 3 * MAX_RANKS u64.
        (0..world).map(|r| unsafe { *(p.table as *const u64).add(2 * MAX_RANKS + r) }).collect()
    } else {
        p.flags[..world].to_vec()
    };
    let call = Call {
        p: &p,
        knobs,
        name,
        flags,
        dtype: DType::from_code(p.dtype)?,
        rank: p.rank as usize,
        world,
        // SAFETY: the status words are the communicator's (or the method's own) live memory, process memory on the
        // host driver, which others change only with atomic stores.
        deadline: unsafe { Deadline::after(Duration::from_nanos(p.timeout_ns)).watching(p.status) },
    };
    let (count, grid, vec, size) = (p.count as usize, l.dims.grid as usize, call.dtype.vec(), call.dtype.size());
    let at = |base: u64, elem: usize| (base as *mut u8).wrapping_add(elem * size);
    if knobs.one_block {
        // Every block copies in, then one barrier (block 0's slot) for the grid, then every block sums.
        // SAFETY: counters is this rank's array of MAX_BLOCKS u64.
        let epochs: Vec<u64> = (0..grid).map(|b| unsafe { next_epoch(p.counters, b, grid) }).collect();
        let views = call.views(epochs[0]);
        for b in 0..grid {
            call.copy(p.input, views[call.rank], block_range(0, count, b, grid, vec));
        }
        call.barrier(0, 0, epochs[0])?;
        for b in 0..grid {
            let r = block_range(0, count, b, grid, vec);
            call.reduce(&views, r, at(p.output, r.0));
        }
        return Ok(());
    }
    for b in 0..grid {
        // SAFETY: counters is this rank's array of MAX_BLOCKS u64.
        let epoch = unsafe { next_epoch(p.counters, b, grid) };
        let views = call.views(epoch);
        let mine = views[call.rank];
        match kind {
            CarKernel::BarrierOnly => call.barrier(b, 0, epoch)?,
            CarKernel::OneShot if knobs.push => {
                let r = block_range(0, count, b, grid, vec);
                for &peer in &views {
                    call.copy(p.input, peer + call.rank as u64 * p.slot_bytes, r);
                }
                call.barrier(b, 0, epoch)?;
                let slots: Vec<u64> = (0..call.world).map(|s| mine + s as u64 * p.slot_bytes).collect();
                call.reduce(&slots, r, at(p.output, r.0));
            }
            CarKernel::OneShot | CarKernel::AllGather => {
                let r = block_range(0, count, b, grid, vec);
                call.copy(p.input, mine, r);
                call.barrier(b, 0, epoch)?;
                if kind == CarKernel::OneShot {
                    call.reduce(&views, r, at(p.output, r.0));
                    continue;
                }
                for s in 0..call.world {
                    let src = if knobs.ring_order { (call.rank + s) % call.world } else { s };
                    call.copy(views[src], at(p.output, s * count) as u64, r);
                }
            }
            CarKernel::ReduceScatterCols => {
                let n = p.hidden as usize;
                let cols = n / call.world;
                let rows = row_range((0, count / n), b, grid);
                call.copy(p.input, mine, (rows.0 * n, rows.1 * n));
                call.barrier(b, 0, epoch)?;
                let first = call.rank * cols;
                for row in rows.0..rows.1 {
                    // Sources shifted so that the sum's element `row * n + first + c` is their element `c`.
                    let shift = ((row * n + first) * size) as u64;
                    let srcs: Vec<u64> = views.iter().map(|&v| v + shift).collect();
                    call.reduce(&srcs, (0, cols), at(p.output, row * cols));
                }
            }
            CarKernel::OneShotNorm => {
                let norm = norm_of(&p);
                let rows = row_range((0, count / norm.hidden), b, grid);
                call.copy(p.input, mine, (rows.0 * norm.hidden, rows.1 * norm.hidden));
                call.barrier(b, 0, epoch)?;
                let srcs: Vec<*const u8> = views.iter().map(|&v| v as *const u8).collect();
                // SAFETY: every view and the residual hold `count` elements, the output too; the weight `hidden`.
                unsafe { norm::add_rms_norm(call.dtype, &srcs, &norm, p.output as *mut u8, rows) };
            }
            CarKernel::TwoShotNorm => {
                let norm = norm_of(&p);
                let rows = count / norm.hidden;
                let shard = rows.div_ceil(call.world);
                let sub = |s: usize| row_range(shard_range(rows, shard, s), b, grid);
                for s in 0..call.world {
                    let (lo, hi) = sub(s);
                    call.copy(p.input, mine, (lo * norm.hidden, hi * norm.hidden));
                }
                call.barrier(b, 0, epoch)?;
                let srcs: Vec<*const u8> = views.iter().map(|&v| v as *const u8).collect();
                let residual = p.residual as *mut u8;
                // SAFETY: as the one-shot's; r goes in place into this rank's own rows of its own buffer.
                unsafe { add_residual(call.dtype, &srcs, residual, mine as *mut u8, norm.hidden, sub(call.rank)) };
                call.barrier(b, 1, epoch)?;
                for (s, &view) in views.iter().enumerate() {
                    // SAFETY: as above; every peer's rows of r are complete after the barrier.
                    unsafe {
                        rms_norm(call.dtype, view as *const u8, Some(residual), p.output as *mut u8, &norm, sub(s))
                    };
                }
            }
            CarKernel::TwoShot => {
                let shard = shard_elems(count, call.world, vec);
                let sub = |s: usize| {
                    let (lo, hi) = shard_range(count, shard, s);
                    block_range(lo, hi, b, grid, vec)
                };
                // No copy-in: `Car::enqueue` copied the input into this rank's fixed input buffer before the launch.
                call.barrier(b, 0, epoch)?;
                let (lo, hi) = sub(call.rank);
                // From every rank's fixed input buffer into this rank's own shard of its own half (the broken
                // variant: in place into its own shard of its own input buffer, which its next memcpy overwrites
                // while nothing has told it that the peers have gathered it).
                let inputs = &p.inputs[..call.world];
                let sums = if knobs.sum_in_input { inputs } else { &views[..] };
                call.reduce(inputs, (lo, hi), at(sums[call.rank], lo));
                call.barrier(b, 1, epoch)?;
                if knobs.sum_in_input && call.rank != 0 {
                    // The slow peer the bug needs, every call rather than when the scheduler happens to make one:
                    // rank 0 gathers at once and moves on to its next memcpy while the others still gather from it.
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                for (s, &view) in sums.iter().enumerate() {
                    call.copy(view, p.output, sub(s));
                }
                if knobs.exit {
                    call.barrier(b, 2, epoch)?;
                }
            }
            CarKernel::ReduceScatter => {
                let shard = count / call.world;
                let sub = |s: usize| {
                    let (lo, hi) = shard_range(count, shard, s);
                    block_range(lo, hi, b, grid, vec)
                };
                for s in 0..call.world {
                    call.copy(p.input, mine, sub(s));
                }
                call.barrier(b, 0, epoch)?;
                let (lo, hi) = sub(call.rank);
                // The output holds `shard` elements; [lo, hi) lies in this rank's shard.
                call.reduce(&views, (lo, hi), at(p.output, lo - call.rank * shard));
            }
        }
    }
    Ok(())
}
