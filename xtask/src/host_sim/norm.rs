//! The norm's device code (kernels/include/arx/norm.h) on the host (kernels/check/norm_sim.cpp, one block of 512
//! threads), on fresh random rows of every dtype and every path it takes (rows in vectors, long and short,
//! rows of scalars; the one-shot designs' epilogue and the two-shot's), its bits held to the host twin's
//! (collective_core::norm). The GPU runs compare the two as well, but a change to the kernels' order is caught here
//! first.

use crate::run;
use collective_core::DType;
use measure::check::{input_values, NormCase};
use std::path::Path;
use std::process::Command;

/// (dtype, world, rows, hidden): every path of norm.h's row functions for each dtype.
const CASES: [(DType, usize, usize, usize); 10] = [
    (DType::Bf16, 3, 3, 4096),  // a vector per thread
    (DType::Bf16, 8, 2, 8192),  // two per thread, eight sources
    (DType::Bf16, 2, 2, 16384), // four per thread
    (DType::Bf16, 3, 2, 16392), // 2049 vectors: one thread takes a fifth
    (DType::Bf16, 3, 3, 300),   // rows off 16-byte boundaries: scalars
    (DType::F16, 5, 3, 4096),
    (DType::F16, 3, 2, 257),
    (DType::F32, 3, 3, 1000),
    (DType::F32, 2, 2, 8196),
    (DType::F32, 4, 2, 301),
];

/// Runs the simulation `sim` on every case, its files in `out`.
pub fn check(sim: &Path, out: &Path) -> Result<(), String> {
    let seed = super::fresh_seed()?;
    for (k, &(dtype, world, rows, hidden)) in CASES.iter().enumerate() {
        let seed = seed.wrapping_add(k as u64);
        let what = format!("{dtype} {rows} x {hidden}, {world} ranks (seed {seed})");
        let count = rows * hidden;
        let eps = 1e-5;
        let case = NormCase::new(seed, world, count, hidden, dtype, eps);
        let mut blob: Vec<u8> = [dtype.code(), world as u32, rows as u32, hidden as u32]
            .into_iter()
            .flat_map(u32::to_le_bytes)
            .chain(eps.to_le_bytes())
            .collect();
        (0..world).for_each(|r| blob.extend(dtype.encode(&input_values(seed, r, count, dtype))));
        blob.extend(dtype.encode(&case.residual));
        blob.extend(dtype.encode(&case.weight));
        let (input, output) = (out.join("norm_sim.in"), out.join("norm_sim.out"));
        std::fs::write(&input, &blob).map_err(|e| format!("{}: {e}", input.display()))?;
        run(Command::new(sim).arg(&input).arg(&output))?;
        let got = std::fs::read(&output).map_err(|e| format!("{}: {e}", output.display()))?;
        let bytes = count * dtype.size();
        if got.len() != 4 * bytes {
            return Err(format!("norm_sim on {what}: {} bytes out, {} expected", got.len(), 4 * bytes));
        }
        let part = |i: usize| &got[i * bytes..(i + 1) * bytes];
        for (path, r, y) in [("one-shot", part(0), part(1)), ("two-shot", part(2), part(3))] {
            if let Some(differs) = case.twin_difference(dtype, r, y) {
                return Err(format!("the norm's device code, {path} path, {what}: {differs}"));
            }
        }
    }
    println!("norm: the device code's bits equal the host twin's ({} shapes, both paths; seed {seed})", CASES.len());
    Ok(())
}
