//! The allreduce kernels on the host, whole (kernels/check/kernel_sim.cpp: a process per block of every rank, a
//! kernel boundary per rank between calls): symm_tuned.cu's designs and car.cu's. The plain kernels give every rank
//! the rank-ordered f32 sum's bits, the norm kernels the host twin's, call after call on fresh inputs (so a read of
//! the previous call's data shows).

use crate::run;
use collective_core::{DType, HostElem};
use measure::check::{first_difference, input_values, NormCase};
use std::path::Path;
use std::process::Command;

/// How a design's input reaches it: from the registered input, or copied (or pushed) in by the kernel from a
/// caller's buffer (`copy_from`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Input {
    Registered,
    CopiedIn,
}
use Input::{CopiedIn, Registered};

/// What a kernel computes from every rank's input.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Computes {
    /// The allreduce.
    Sum,
    /// The allreduce, the residual add and RMSNorm.
    SumNorm,
    /// The residual add and RMSNorm of an allreduce's result (the unfused sequence's norm kernel): its input on
    /// every rank is the sum.
    NormOfSum,
    /// Rank r's shard of the sum, `count / world` elements from element `r * count / world`.
    ReduceScatter,
    /// Rank r's columns of every row of the sum (`hidden / world` of each), densely.
    ReduceScatterColumns,
    /// Every rank's input, in rank order.
    AllGather,
}
use Computes::{AllGather, NormOfSum, ReduceScatter, ReduceScatterColumns, Sum, SumNorm};

impl Computes {
    fn norm(self) -> bool {
        matches!(self, SumNorm | NormOfSum)
    }

    /// The elements and row length of a call of `rows` x `hidden` at `world` ranks: whole rows for the norm, a count
    /// that is no whole number of vectors for the plain allreduce and the all-gather, whole shards for the
    /// reduce-scatters.
    fn shape(self, world: usize, rows: usize, hidden: usize) -> (usize, usize) {
        match self {
            SumNorm | NormOfSum => (rows * hidden, hidden),
            Sum | AllGather => (rows * hidden + 1, hidden),
            ReduceScatter => (rows * hidden / world * world, hidden),
            ReduceScatterColumns => (rows * (hidden / world * world), hidden / world * world),
        }
    }

    /// Elements of each rank's output for a call of `count` elements.
    fn out_count(self, count: usize, world: usize) -> usize {
        match self {
            Sum | SumNorm | NormOfSum => count,
            ReduceScatter | ReduceScatterColumns => count / world,
            AllGather => count * world,
        }
    }

    /// Rank `rank`'s output, from the sum of every rank's input (and the inputs themselves).
    fn output(self, rank: usize, sum: &[u8], inputs: &[Vec<u8>], dtype: DType, hidden: usize) -> Vec<u8> {
        let (n, world) = (dtype.size(), inputs.len());
        match self {
            Sum | SumNorm | NormOfSum => sum.to_vec(),
            ReduceScatter => {
                let shard = sum.len() / world;
                sum[rank * shard..(rank + 1) * shard].to_vec()
            }
            ReduceScatterColumns => {
                let cols = hidden / world * n;
                sum.chunks(hidden * n).flat_map(|row| row[rank * cols..(rank + 1) * cols].to_vec()).collect()
            }
            AllGather => inputs.concat(),
        }
    }
}

/// The kernels by family (0: symm_tuned.cu's, 1: car.cu's, 2: symm.cu's) in kernel_sim.cpp's order (`TUNED`, `CAR`,
/// `SYMM`), what each computes, and the ways its input may come (the zero-copy designs fuse the copy-in; the pushed
/// two-shots always push from the caller's buffer; car and symm copy from the caller's buffer, or read the buffer the
/// host's memcpy fills).
const KERNELS: [(u32, &str, Computes, &[Input]); 32] = [
    (0, "symm_ll", Sum, &[Registered]),
    (0, "symm_ll_norm", SumNorm, &[Registered]),
    (0, "symm_zc_2shot_ll", Sum, &[Registered]),
    (0, "symm_zc_2shot_ll_norm", SumNorm, &[Registered]),
    (0, "symm_zc_1shot", Sum, &[Registered, CopiedIn]),
    (0, "symm_zc_1shot_norm", SumNorm, &[Registered, CopiedIn]),
    (0, "symm_zc_2shot", Sum, &[Registered, CopiedIn]),
    (0, "symm_zc_2shot_norm", SumNorm, &[Registered, CopiedIn]),
    (0, "symm_zc_2shot_push", Sum, &[CopiedIn]),
    (0, "symm_zc_2shot_push_norm", SumNorm, &[CopiedIn]),
    (0, "symm_epoch_1shot", Sum, &[Registered]),
    (0, "symm_epoch_1shot_norm", SumNorm, &[Registered]),
    (0, "symm_zc_2shot_table", Sum, &[Registered]),
    (0, "symm_zc_2shot_pull", Sum, &[Registered, CopiedIn]),
    (0, "symm_zc_2shot_pull_table", Sum, &[Registered]),
    (1, "car_1shot", Sum, &[CopiedIn]),
    (1, "car_2shot", Sum, &[CopiedIn]),
    (1, "car_1shot_norm", SumNorm, &[CopiedIn]),
    (1, "car_2shot_norm", SumNorm, &[CopiedIn]),
    (1, "car_add_rms_norm", NormOfSum, &[CopiedIn]),
    (1, "car_1shot_ptrtable", Sum, &[CopiedIn]),
    (1, "car_1shot_push", Sum, &[CopiedIn]),
    (1, "car_1shot_oneblock", Sum, &[CopiedIn]),
    (1, "car_1shot_cas", Sum, &[CopiedIn]),
    (1, "car_2shot_3bar", Sum, &[CopiedIn]),
    (1, "car_rs", ReduceScatter, &[CopiedIn]),
    (1, "car_ag", AllGather, &[CopiedIn]),
    (1, "car_rs_cols", ReduceScatterColumns, &[CopiedIn]),
    (2, "symm_1shot", Sum, &[CopiedIn]),
    (2, "symm_2shot", Sum, &[Registered]),
    (2, "symm_2shot_fused", Sum, &[CopiedIn]),
    (2, "symm_rs", ReduceScatter, &[Registered]),
];

/// Every design in turn at (dtype, world, rows, hidden): rows x hidden elements (a plain call's hidden is any row
/// length), two blocks per rank. The last two rows are longer than a norm block's 512 lanes of 16 bytes, so some
/// threads take a second vector (the fp16 rows off 16-byte boundaries, a partial one).
const SHAPES: [(DType, usize, usize, usize); 3] =
    [(DType::Bf16, 3, 7, 256), (DType::F32, 4, 3, 2100), (DType::F16, 2, 3, 4099)];
const CALLS: usize = 3;
const GRID: u32 = 2;

/// The sum of `inputs` (`count` elements of `dtype` each) in rank order with f32 accumulation, as every kernel adds.
fn rank_ordered_sum(dtype: DType, inputs: &[Vec<u8>], count: usize) -> Vec<u8> {
    let mut sum = vec![0u8; count * dtype.size()];
    let srcs: Vec<*const u8> = inputs.iter().map(|x| x.as_ptr()).collect();
    // SAFETY: every input holds `count` elements of `dtype`, and so does `sum`.
    unsafe { HostElem::reduce(dtype, &srcs, 0, count, sum.as_mut_ptr()) };
    sum
}

/// Runs the simulation `sim` on every case, its files in `out`.
pub fn check(sim: &Path, out: &Path) -> Result<(), String> {
    let seed = super::fresh_seed()?;
    // Each kernel's index within its family.
    let ids = KERNELS.iter().scan([0u32; 3], |next, k| {
        next[k.0 as usize] += 1;
        Some(next[k.0 as usize] - 1)
    });
    let cases = KERNELS.iter().zip(ids).flat_map(|(&(family, name, computes, inputs), id)| {
        inputs.iter().flat_map(move |&input| SHAPES.iter().map(move |&s| (family, id, name, computes, input, s)))
    });
    let mut runs = 0;
    for (k, (family, id, name, computes, input, (dtype, world, rows, hidden))) in cases.enumerate() {
        runs += 1;
        let norm = computes.norm();
        let (count, hidden) = computes.shape(world, rows, hidden);
        let what = format!("{name} {dtype} {rows} x {hidden}, {world} ranks, {input:?} input (seed {seed})");
        // Norm blocks are the canonical order's 512 lanes; the plain designs take any block.
        let block: u32 = if norm { 512 } else { 64 };
        let eps = 1e-5f32;
        let copy_in = u32::from(input == CopiedIn);
        let head = [
            family,
            id,
            dtype.code(),
            world as u32,
            GRID,
            block,
            CALLS as u32,
            hidden as u32,
            u32::from(norm),
            copy_in,
        ];
        let mut plan: Vec<u8> = head.into_iter().flat_map(u32::to_le_bytes).collect();
        // Packets per source: every row's, more than any design needs.
        let ll_packets = (count * dtype.size()).div_ceil(4) + rows;
        let out_count = computes.out_count(count, world);
        // symm_tuned.cu's kernels cross the packet flags' wrap: the first two calls zero their packet areas, beside
        // blocks and peers still reading them, and the third runs on the new period's first flag (car's and symm's
        // kernels have no packets).
        let first_epoch = if family == 0 { symm::LL_FLAG_PERIOD - 3 } else { 0 };
        let fields = [count as u64, out_count as u64, ll_packets as u64, 10_000_000_000, first_epoch];
        plan.extend(fields.into_iter().flat_map(u64::to_le_bytes));
        plan.extend(eps.to_le_bytes());
        let mut want = Vec::new();
        for c in 0..CALLS {
            let seed = seed.wrapping_add((k * CALLS + c) as u64);
            let inputs: Vec<Vec<u8>> = (0..world).map(|r| dtype.encode(&input_values(seed, r, count, dtype))).collect();
            if computes == NormOfSum {
                // The norm kernel's input: the allreduce's result, on every rank.
                let sum = rank_ordered_sum(dtype, &inputs, count);
                (0..world).for_each(|_| plan.extend(&sum));
            } else {
                inputs.iter().for_each(|x| plan.extend(x));
            }
            if norm {
                let case = NormCase::new(seed, world, count, hidden, dtype, eps);
                plan.extend(dtype.encode(&case.residual));
                plan.extend(dtype.encode(&case.weight));
                want.push(vec![(case.twin_y, Some(case.twin_r)); world]);
            } else {
                let sum = rank_ordered_sum(dtype, &inputs, count);
                want.push((0..world).map(|r| (computes.output(r, &sum, &inputs, dtype, hidden), None)).collect());
            }
        }
        let (input, output) = (out.join("kernel_sim.in"), out.join("kernel_sim.out"));
        std::fs::write(&input, &plan).map_err(|e| format!("{}: {e}", input.display()))?;
        // Stalls seeded per run (kernels/check/host_sim_prelude.h), so a rank's thread falls calls behind its peers,
        // and a torn clock now and then, which no wait's deadline may take for a timeout.
        let stalls = (seed ^ k as u64) | 1;
        let noise = [("ARX_SIM_STALLS", stalls.to_string()), ("ARX_SIM_TIMER_TEARS", stalls.to_string())];
        run(Command::new(sim).envs(noise).arg(&input).arg(&output))
            .map_err(|e| format!("the designs on the host, {what}: {e}"))?;
        let got = std::fs::read(&output).map_err(|e| format!("{}: {e}", output.display()))?;
        let (bytes, out_bytes) = (count * dtype.size(), out_count * dtype.size());
        let per = if norm { out_bytes + bytes } else { out_bytes };
        if got.len() != CALLS * world * per {
            return Err(format!("kernel_sim on {what}: {} bytes out, {} expected", got.len(), CALLS * world * per));
        }
        for (c, ranks) in want.iter().enumerate() {
            for (rank, (y, r)) in ranks.iter().enumerate() {
                let at = (c * world + rank) * per;
                let (got_y, got_r) = (&got[at..at + out_bytes], &got[at + out_bytes..at + per]);
                let differs = |part: &str, got: &[u8], want: &[u8]| {
                    first_difference(dtype, got, want).map(|(i, got, want)| {
                        format!("{what}, call {c}, rank {rank}: {part}[{i}] is {got:e}, the host twin's {want:e}")
                    })
                };
                if let Some(e) = differs("y", got_y, y).or_else(|| r.as_ref().and_then(|r| differs("r", got_r, r))) {
                    return Err(format!("the designs on the host: {e}"));
                }
            }
        }
    }
    println!(
        "kernels: every symm_tuned design's kernel, car's and symm's (allreduce, with the norm, reduce-scatter, \
         all-gather), on registered and copied-in inputs, give the host twins' bits on every rank, {CALLS} calls on \
         fresh inputs, symm_tuned's across the packet flags' wrap ({runs} runs)"
    );
    Ok(())
}
