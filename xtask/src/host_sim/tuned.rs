//! symm_tuned.cu's packet designs on the host, whole (kernels/check/tuned_sim.cpp: a process per block of every
//! rank, a kernel boundary per rank between calls): the plain packets and the zero-copy two-shot with packets give
//! every rank the rank-ordered f32 sum's bits, and their norm designs the host twin's bits, call after call on fresh
//! inputs (so a read of the previous call's packets or inputs shows).

use crate::run;
use collective_core::{DType, HostElem};
use measure::check::{input_values, NormCase};
use std::path::Path;
use std::process::Command;

/// A design's kernel id in tuned_sim.cpp, and whether it carries the norm.
#[derive(Clone, Copy, Debug)]
enum Kernel {
    Ll = 0,
    LlNorm = 1,
    Zc2ShotLl = 2,
    Zc2ShotLlNorm = 3,
}

/// (kernel, dtype, world, rows, hidden): rows x hidden elements (hidden of a plain call is any row length), two
/// blocks per rank.
const CASES: [(Kernel, DType, usize, usize, usize); 6] = [
    (Kernel::Ll, DType::Bf16, 3, 1, 3001),
    (Kernel::Ll, DType::F32, 4, 1, 1000),
    (Kernel::Zc2ShotLl, DType::Bf16, 3, 1, 3000),
    (Kernel::LlNorm, DType::Bf16, 3, 4, 1000),
    (Kernel::Zc2ShotLlNorm, DType::Bf16, 3, 7, 256),
    (Kernel::Zc2ShotLlNorm, DType::F16, 4, 5, 300),
];
const CALLS: usize = 3;
const GRID: u32 = 2;

/// Runs the simulation `sim` on every case, its files in `out`.
pub fn check(sim: &Path, out: &Path) -> Result<(), String> {
    let seed = super::fresh_seed()?;
    for (k, &(kernel, dtype, world, rows, hidden)) in CASES.iter().enumerate() {
        let norm = matches!(kernel, Kernel::LlNorm | Kernel::Zc2ShotLlNorm);
        let count = rows * hidden;
        let what = format!("{kernel:?} {dtype} {rows} x {hidden}, {world} ranks (seed {seed})");
        // Norm blocks are the canonical order's 512 lanes; the plain designs take any block.
        let block: u32 = if norm { 512 } else { 64 };
        let eps = 1e-5f32;
        let head = [
            kernel as u32,
            dtype.code(),
            world as u32,
            GRID,
            block,
            CALLS as u32,
            if norm { hidden as u32 } else { 0 },
        ];
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
        run(Command::new(sim).arg(&input).arg(&output))?;
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
                    return Err(format!("the packet designs on the host: {e}"));
                }
            }
        }
    }
    println!(
        "tuned: the packet designs' kernels (symm_ll, symm_zc_2shot_ll and their norms) give the host twins' bits on \
         every rank, {CALLS} calls on fresh inputs ({} cases)",
        CASES.len()
    );
    Ok(())
}
