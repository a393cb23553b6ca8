//! The harness behind `comm-bench`: comm_bench.py's sweep over every registered method, with results checked
//! against a float64 reference, ranks aligned before timing, max over ranks, medians of repeats, busbw and a
//! graph-replay mode.

pub mod auto;
pub mod ceilings;
pub mod check;
pub mod cli;
pub mod methods;
pub mod plot;
pub mod progress;
pub mod report;
pub mod run;
pub mod sizes;
pub mod soak;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Gpu(#[from] gpu::GpuError),
    #[error(transparent)]
    Ipc(#[from] ipc::IpcError),
    #[error(transparent)]
    Collective(#[from] collective::CollectiveError),
    #[error(transparent)]
    Launch(#[from] launch::LaunchError),
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
