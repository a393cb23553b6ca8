//! `allreduce_rs._native`: the extension module behind the `allreduce_rs` package. It links no GPU library (the
//! drivers load theirs when a communicator opens one) and imports neither torch nor numpy: a tensor is read through
//! the methods torch gives it, once the program has imported torch, and a host array through
//! `__array_interface__`.

mod across;
mod args;
mod calls;
mod comm;
mod comm_core;
mod dlpack;
mod errors;
mod placement;
mod reach;
mod registered;

use pyo3::prelude::*;
use std::ffi::OsString;
use std::time::Duration;

/// Runs `argv` as the `world` ranks of a fresh job (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
/// ALLREDUCE_JOB_ID, MASTER_ADDR / MASTER_PORT unless set, and `env`), prefixing each output line with its rank,
/// and waits for them. The first rank that fails stops the others and raises LauncherError naming it.
#[pyfunction(name = "launch")]
#[pyo3(signature = (world, argv, env = None, prefix_output = true))]
fn launch_job(
    py: Python<'_>,
    world: usize,
    argv: Vec<OsString>,
    env: Option<Vec<(String, String)>>,
    prefix_output: bool,
) -> PyResult<()> {
    let Some((program, args)) = argv.split_first() else {
        return Err(errors::ArgumentError::new_err("argv: empty; give the program to run and its arguments"));
    };
    let opts = ::launch::LaunchOptions {
        world,
        program: program.into(),
        args: args.to_vec(),
        env: env.unwrap_or_default(),
        grace: Duration::from_secs(2),
        prefix_output,
        rank0_stderr_on_terminal: false,
    };
    py.detach(move || ::launch::run(&opts)).map_err(errors::from_launch)
}

/// A fresh job id (32 random hex digits) for Communicator(rank, world_size, local_rank, job_id): every rank of
/// the job must be given the same one.
#[pyfunction]
fn new_job_id() -> String {
    ipc::JobId::random().to_string()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<comm_core::PyCommunicator>()?;
    m.add_class::<across::PyAcross>()?;
    m.add_class::<registered::RegisteredBuffer>()?;
    m.add_class::<calls::PreparedCall>()?;
    m.add_class::<calls::GraphCapture>()?;
    m.add_class::<placement::PyPlacement>()?;
    m.add_class::<placement::PyRankDevice>()?;
    m.add_function(wrap_pyfunction!(launch_job, m)?)?;
    m.add_function(wrap_pyfunction!(new_job_id, m)?)?;
    m.add("DEFAULT_CAPACITY_BYTES", comm::DEFAULT_CAPACITY)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
