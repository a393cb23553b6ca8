//! symm_tuned.cu's designs on the host, whole (kernels/check/tuned_sim.cpp: a process per block of every rank, a
//! kernel boundary per rank between calls): the plain kernels give every rank the rank-ordered f32 sum's bits, the
//! norm kernels the host twin's, call after call on fresh inputs (so a read of the previous call's data shows).

use crate::run;
use collective_core::{DType, HostElem};
use measure::check::{input_values, NormCase};
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

/// The designs in tuned_sim.cpp's order (`KERNELS`), whether each carries the norm, and the ways its input may come
/// (the zero-copy designs fuse the copy-in; the pushed two-shots always push from the caller's buffer).
const KERNELS: [(&str, bool, &[Input]); 13] = [
    ("symm_ll", false, &[Registered]),
    ("symm_ll_norm", true, &[Registered]),
    ("symm_zc_2shot_ll", false, &[Registered]),
    ("symm_zc_2shot_ll_norm", true, &[Registered]),
    ("symm_zc_1shot", false, &[Registered, CopiedIn]),
    ("symm_zc_1shot_norm", true, &[Registered, CopiedIn]),
    ("symm_zc_2shot", false, &[Registered, CopiedIn]),
    ("symm_zc_2shot_norm", true, &[Registered, CopiedIn]),
    ("symm_zc_2shot_push", false, &[CopiedIn]),
    ("symm_zc_2shot_push_norm", true, &[CopiedIn]),
    ("symm_epoch_1shot", false, &[Registered]),
    ("symm_epoch_1shot_norm", true, &[Registered]),
    ("symm_zc_2shot_table", false, &[Registered]),
];

/// Every design in turn at (dtype, world, rows, hidden): rows x hidden elements (a plain call's hidden is any row
/// length), two blocks per rank.
const SHAPES: [(DType, usize, usize, usize); 3] =
    [(DType::Bf16, 3, 7, 256), (DType::F32, 4, 5, 300), (DType::F16, 2, 3, 1000)];
const CALLS: usize = 3;
const GRID: u32 = 2;

/// Runs the simulation `sim` on every case, its files in `out`.
pub fn check(sim: &Path, out: &Path) -> Result<(), String> {
    let seed = super::fresh_seed()?;
    let cases = KERNELS.iter().enumerate().flat_map(|(id, &(name, norm, inputs))| {
        inputs.iter().flat_map(move |&input| SHAPES.iter().map(move |&shape| (id, name, norm, input, shape)))
    });
    let mut runs = 0;
    for (k, (id, name, norm, input, (dtype, world, rows, hidden))) in cases.enumerate() {
        runs += 1;
        // The plain designs at a count that is no whole number of vectors, where it differs from the norm's.
        let count = if norm { rows * hidden } else { rows * hidden + 1 };
        let what = format!("{name} {dtype} {rows} x {hidden}, {world} ranks, {input:?} input (seed {seed})");
        // Norm blocks are the canonical order's 512 lanes; the plain designs take any block.
        let block: u32 = if norm { 512 } else { 64 };
        let eps = 1e-5f32;
        let norm_hidden = if norm { hidden as u32 } else { 0 };
        let copy_in = u32::from(input == CopiedIn);
        let head = [id as u32, dtype.code(), world as u32, GRID, block, CALLS as u32, norm_hidden, copy_in];
        let mut plan: Vec<u8> = head.into_iter().flat_map(u32::to_le_bytes).collect();
        // Packets per source: every row's, more than any design needs.
        let ll_packets = (count * dtype.size()).div_ceil(4) + rows;
        plan.extend([count as u64, ll_packets as u64, 10_000_000_000].into_iter().flat_map(u64::to_le_bytes));
        plan.extend(eps.to_le_bytes());
        let mut want = Vec::new();
        for c in 0..CALLS {
            let seed = seed.wrapping_add((k * CALLS + c) as u64);
            let inputs: Vec<Vec<u8>> = (0..world).map(|r| dtype.encode(&input_values(seed, r, count, dtype))).collect();
            inputs.iter().for_each(|x| plan.extend(x));
            if norm {
                let case = NormCase::new(seed, world, count, hidden, dtype, eps);
                plan.extend(dtype.encode(&case.residual));
                plan.extend(dtype.encode(&case.weight));
                want.push((case.twin_y, Some(case.twin_r)));
            } else {
                let mut sum = vec![0u8; count * dtype.size()];
                let srcs: Vec<*const u8> = inputs.iter().map(|x| x.as_ptr()).collect();
                // SAFETY: every input holds `count` elements of `dtype`, and so does `sum`.
                unsafe { HostElem::reduce(dtype, &srcs, 0, count, sum.as_mut_ptr()) };
                want.push((sum, None));
            }
        }
        let (input, output) = (out.join("tuned_sim.in"), out.join("tuned_sim.out"));
        std::fs::write(&input, &plan).map_err(|e| format!("{}: {e}", input.display()))?;
        run(Command::new(sim).arg(&input).arg(&output)).map_err(|e| format!("the designs on the host, {what}: {e}"))?;
        let got = std::fs::read(&output).map_err(|e| format!("{}: {e}", output.display()))?;
        let bytes = count * dtype.size();
        let per = if norm { 2 * bytes } else { bytes };
        if got.len() != CALLS * world * per {
            return Err(format!("tuned_sim on {what}: {} bytes out, {} expected", got.len(), CALLS * world * per));
        }
        for (c, (y, r)) in want.iter().enumerate() {
            for rank in 0..world {
                let at = (c * world + rank) * per;
                let (got_y, got_r) = (&got[at..at + bytes], &got[at + bytes..at + per]);
                let differs = |part: &str, got: &[u8], want: &[u8]| {
                    let n = dtype.size();
                    got.chunks(n)
                        .zip(want.chunks(n))
                        .position(|(g, w)| g != w)
                        .map(|i| format!("{what}, call {c}, rank {rank}: {part}[{i}] is not the host twin's"))
                };
                if let Some(e) = differs("y", got_y, y).or_else(|| r.as_ref().and_then(|r| differs("r", got_r, r))) {
                    return Err(format!("the designs on the host: {e}"));
                }
            }
        }
    }
    println!(
        "tuned: every symm_tuned design's kernel, plain and with the norm, on registered and copied-in inputs, gives \
         the host twins' bits on every rank, {CALLS} calls on fresh inputs ({runs} runs)"
    );
    Ok(())
}
