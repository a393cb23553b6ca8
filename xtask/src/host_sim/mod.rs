//! Part of `cargo xtask kernel-check`: the kernels' device code compiled for the host and run there
//! (kernels/check/*_sim.cpp with host_sim_prelude.h: a host thread per thread of a block, a process per rank), its
//! results held to the host twins', so that a change to the kernels' arithmetic order or to their barrier is caught
//! with no GPU. What it cannot show is a GPU's memory model or its compilers' code.

mod designs;
mod epoch;
mod norm;
mod sync;

use crate::run;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles and runs each simulation with `clangxx`, its files in `out`.
pub fn check(clangxx: &Path, kernels: &Path, out: &Path) -> Result<(), String> {
    norm::check(&compile(clangxx, kernels, out, "norm_sim")?, out)?;
    sync::check(&compile(clangxx, kernels, out, "sync_sim")?, out)?;
    epoch::check(&compile(clangxx, kernels, out, "epoch_sim")?)?;
    designs::check(&compile(clangxx, kernels, out, "kernel_sim")?, out)
}

/// A seed that differs from run to run (printed with any failure, to rerun it).
fn fresh_seed() -> Result<u64, String> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_err(|e| e.to_string())?;
    Ok(now.as_nanos() as u64)
}

/// kernels/check/`name`.cpp built into `out`/`name`.
fn compile(clangxx: &Path, kernels: &Path, out: &Path, name: &str) -> Result<PathBuf, String> {
    let sim = out.join(name);
    run(Command::new(clangxx)
        .args(["-std=c++20", "-O2", "-pthread", "-ffp-contract=off", "-Werror", "-Wall", "-Wno-unused-function"])
        .arg("-I")
        .arg(kernels.join("include"))
        .arg("-include")
        .arg(kernels.join("check/host_sim_prelude.h"))
        .arg("-o")
        .arg(&sim)
        .arg(kernels.join(format!("check/{name}.cpp"))))?;
    Ok(sim)
}
