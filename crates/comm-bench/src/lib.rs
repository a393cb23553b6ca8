//! The harness behind `comm-bench`: comm_bench.py's sweep over every registered method, with results checked
//! against a float64 reference, ranks aligned before timing, max over ranks, medians of repeats, busbw and a
//! graph-replay mode. Built on the `allreduce` library like any program: its communicator sets each rank up, its
//! registry builds the methods, and its timing and checking paths measure them.

pub mod ceilings;
pub mod checksum;
pub mod cli;
pub mod compare;
pub mod config;
pub mod header;
pub mod memory;
pub mod norm;
pub mod paths;
pub mod plot;
pub mod progress;
pub mod report;
pub mod run;
pub mod runs;
pub mod soak;
pub mod summary;
pub mod tune;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Gpu(#[from] gpu::GpuError),
    #[error(transparent)]
    Ipc(#[from] ipc::IpcError),
    #[error(transparent)]
    Collective(#[from] collective_core::CollectiveError),
    #[error(transparent)]
    Launch(#[from] launch::LaunchError),
    #[error(transparent)]
    Allreduce(#[from] allreduce::Error),
    #[error(transparent)]
    Call(#[from] collective_core::CallError),
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
