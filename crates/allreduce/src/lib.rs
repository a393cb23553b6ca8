//! Intra-node allreduce for AMD ROCm and NVIDIA GPUs: **the library a program calls**.
//!
//! A [`Communicator`] per rank, built from the launcher's environment ([`Communicator::from_env`]: comm-bench's
//! launcher, torchrun, OpenMPI's mpirun, srun, MPICH / Intel MPI) or from explicit coordinates
//! ([`Communicator::new`]), opens its local rank's device, agrees with its peers on the placement, and runs
//! allreduce, reduce-scatter and all-gather **on the caller's stream with the caller's buffers**. It picks the
//! allreduce algorithm per message size from a tune table measured on this machine ([`Communicator::tune`] stores one
//! per driver, device, world size and mode in a per-user cache directory), or from the driver's built-in default, and
//! says which ([`Communicator::table_source`], [`Communicator::notes`]).
//!
//! Every algorithm gives the same bits for the same inputs: each element is summed in f32 in rank order and rounded
//! once, so the choice by size never changes a result (batch invariance).
//!
//! Raw device pointers and streams cross this boundary only through `unsafe` functions with a written contract
//! ([`Communicator::all_reduce`], [`Communicator::reduce_scatter`], [`Communicator::all_gather`],
//! [`Communicator::register`]); the safe entry
//! points take host slices on the host driver ([`Communicator::all_reduce_host`]) and, with the `cudarc` feature,
//! cudarc's `CudaSlice` on a `CudaStream`.
//!
//! Every call is checked once, where it enters: [`Communicator::call`] turns a request into a [`Call`], which
//! [`Communicator::issue`] and everything below it take as it is (the plain calls do both in one step).

mod comm;
#[cfg(feature = "cudarc")]
mod cuda_slices;
mod engine;
pub mod placement;
pub mod tune;

pub use collective_core::{AddRmsNorm, Call, CallError, DType, Op, MAX_HIDDEN};
pub use comm::{
    AbortHandle, Communicator, Failure, Measured, Options, TuneReport, TuneRequest, CAPTURE_SLOTS, NORM_HIDDEN,
};
pub use gpu::{Backend, DevicePtr, DriverKind};
pub use launch::RankInfo;
pub use placement::Placement;
pub use tune::{Algorithm, Choice, Mode, Residency, TableSource, Tables, TuneTable};

use ipc::Rendezvous;

/// Everything a communicator call can refuse or fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gpu(#[from] gpu::GpuError),
    #[error(transparent)]
    Ipc(#[from] ipc::IpcError),
    #[error(transparent)]
    Collective(#[from] collective_core::CollectiveError),
    #[error(transparent)]
    Launch(#[from] launch::LaunchError),
    #[error(transparent)]
    Call(#[from] CallError),
    #[error(
        "no launcher environment found (RANK/WORLD_SIZE of torchrun or comm-bench launch, OMPI_COMM_WORLD_*, \
         SLURM_*, PMI_*): start the program under a launcher, or build the communicator with Communicator::new"
    )]
    NoLauncher,
    #[error("invalid argument: {0}")]
    BadArgs(String),
    #[error("placement: {0}")]
    Placement(String),
    #[error("{0}")]
    Tune(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("ranks disagree: {0}")]
    Mismatch(String),
    /// A peer that did not arrive (or an abort): the communicator is poisoned, and every later call says the same.
    #[error("peer rank(s) {ranks:?} {what}: this communicator has failed; build a new one (with a new job id)")]
    Peer { ranks: Vec<usize>, what: String },
}

/// The element types a safe wrapper takes: `half::bf16`, `half::f16` and `f32`.
pub trait Scalar: Copy + sealed::Sealed + 'static {
    const DTYPE: DType;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
    impl Sealed for f32 {}
}

impl Scalar for half::bf16 {
    const DTYPE: DType = DType::Bf16;
}
impl Scalar for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Scalar for f32 {
    const DTYPE: DType = DType::F32;
}

/// Checks that every rank holds the same `key=value` lines as rank 0, naming the first that differs.
pub fn agree(rdv: &Rendezvous, what: &str, mine: &str) -> Result<(), Error> {
    let root = rdv.broadcast(what, 0, mine.as_bytes())?;
    let root = String::from_utf8_lossy(&root);
    if root != mine {
        let (a, b) = root.lines().zip(mine.lines()).find(|(a, b)| a != b).unwrap_or((&root, mine));
        return Err(Error::Mismatch(format!("{what}: rank {} has {b}, rank 0 has {a}", rdv.rank())));
    }
    Ok(())
}
