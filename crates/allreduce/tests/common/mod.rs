//! What the multi-process tests share: the driver and world size they run on, and a test body run as every rank of
//! a job that the project's launcher starts from this test binary.
#![allow(dead_code)] // each test binary uses its own part

use allreduce::{Algorithm, Communicator, DType, DevicePtr, Error, Options};
use symm::tuned::{Design, SymmTuned, TunedOptions};

/// The driver of the driver-independent tests.
pub fn backend() -> gpu::Backend {
    std::env::var("ARX_TEST_BACKEND").map_or(gpu::Backend::Host, |b| b.parse().expect("ARX_TEST_BACKEND"))
}

/// Their world size: `default`, or `ARX_TEST_RANKS`.
pub fn ranks(default: usize) -> usize {
    std::env::var("ARX_TEST_RANKS").map_or(default, |r| r.parse().expect("ARX_TEST_RANKS"))
}

/// Runs `body` as every rank of a `world`-rank job: the launcher starts this test binary again, filtered to `test`.
pub fn as_job(test: &str, world: usize, body: impl FnOnce(launch::RankInfo)) {
    as_job_with(test, world, &[], body)
}

/// [`as_job`], with `env` set in every rank's environment.
pub fn as_job_with(test: &str, world: usize, env: &[(&str, &str)], body: impl FnOnce(launch::RankInfo)) {
    if let Some(info) = launch::detect().unwrap() {
        body(info);
        return;
    }
    let mut opts = launch::LaunchOptions::new(world, launch::self_exe().unwrap());
    opts.args = ["--exact", test, "--nocapture", "--test-threads", "1"].map(Into::into).to_vec();
    opts.env = vec![("ALLREDUCE_TUNE_DIR".into(), std::env::temp_dir().join("arx-no-tables").display().to_string())];
    opts.env.extend(env.iter().map(|&(k, v)| (k.into(), v.into())));
    // On a GPU, one job at a time, whatever the harness's thread count (or other test processes) would start: the
    // kernels of two 8-rank jobs on one device need not all be resident, and their waits would end at the deadline.
    let _one_job = (backend() != gpu::Backend::Host).then(|| {
        let path = std::env::temp_dir().join("arx-gpu-tests.lock");
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).unwrap();
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| e).unwrap()
    });
    launch::run(&opts).unwrap();
}

pub fn comm_on(backend: gpu::Backend, info: launch::RankInfo, capacity_bytes: usize) -> Communicator {
    let opts = Options { backend, capacity_bytes, ..Options::default() };
    Communicator::new(info, opts).unwrap()
}

pub fn host_comm(info: launch::RankInfo, capacity_bytes: usize) -> Communicator {
    comm_on(gpu::Backend::Host, info, capacity_bytes)
}

/// A symmetric-memory design of its own on `comm`'s device and ranks, for tests that reach options the communicator
/// does not expose (a first epoch near the flag wrap, a copy-in variant).
pub fn tuned_on(comm: &Communicator, design: Design, opts: TunedOptions) -> SymmTuned {
    let team = collective_core::Team::new(comm.gpu(), comm.rendezvous(), comm.placement().ranks_per_device);
    SymmTuned::new(team, design, opts).unwrap()
}

/// An allreduce checked, then issued with `algo` forced (`None`: the table's).
///
/// # Safety
/// As `Communicator::issue`.
pub unsafe fn all_reduce_with(
    comm: &Communicator,
    algo: Option<Algorithm>,
    input: DevicePtr,
    output: DevicePtr,
    count: usize,
    dtype: DType,
    stream: u64,
) -> Result<Algorithm, Error> {
    let call = comm.call(allreduce::Op::AllReduce, dtype, input, output, count)?;
    // SAFETY: the caller's contract.
    unsafe { comm.issue(call, algo, stream) }
}
