//! The Rust errors as the Python exceptions of `allreduce_rs.errors`, chosen by whose fault it was: the caller's
//! arguments, ranks that disagree, a peer that is gone (named), something the driver cannot do, the launcher.

use allreduce::Error;
use collective_core::{CallError, CollectiveError};
use gpu::{GpuError, KernelFault};
use ipc::IpcError;
use pyo3::PyErr;

pyo3::import_exception!(allreduce_rs.errors, AllreduceError);
pyo3::import_exception!(allreduce_rs.errors, ArgumentError);
pyo3::import_exception!(allreduce_rs.errors, CapacityError);
pyo3::import_exception!(allreduce_rs.errors, MismatchError);
pyo3::import_exception!(allreduce_rs.errors, PeerError);
pyo3::import_exception!(allreduce_rs.errors, UnsupportedError);
pyo3::import_exception!(allreduce_rs.errors, LauncherError);

/// The exception for a communicator's error.
pub fn from_error(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Call(c) => from_call(&c, msg),
        Error::BadArgs(_) | Error::Placement(_) => ArgumentError::new_err(msg),
        Error::Mismatch(_) => MismatchError::new_err(msg),
        Error::Unsupported(_) => UnsupportedError::new_err(msg),
        Error::NoLauncher => LauncherError::new_err(msg),
        Error::Peer { ranks, .. } => PeerError::new_err((msg, ranks)),
        Error::Launch(e) => from_launch(e),
        Error::Gpu(e) => from_gpu(&e, msg),
        Error::Ipc(e) => from_ipc(&e, msg),
        Error::Collective(e) => from_collective(&e, msg),
        Error::Tune(_) => AllreduceError::new_err(msg),
    }
}

/// The exception for an error of a job over several nodes: a peer that never came to the bootstrap is named.
pub fn from_across(e: across::Error) -> PyErr {
    let msg = e.to_string();
    match e {
        across::Error::Allreduce(e) => from_error(e),
        across::Error::Collective(e) => from_collective(&e, msg),
        across::Error::Call(c) => from_call(&c, msg),
        across::Error::Gpu(g) => from_gpu(&g, msg),
        across::Error::Bootstrap(bootstrap::BootstrapError::Missing { timed_out, .. }) => {
            PeerError::new_err((msg, timed_out.missing))
        }
        across::Error::Bootstrap(bootstrap::BootstrapError::Lost { missing, .. }) => PeerError::new_err((msg, missing)),
        across::Error::Bootstrap(bootstrap::BootstrapError::BadEnv { .. }) | across::Error::Topology(_) => {
            LauncherError::new_err((msg, None::<usize>))
        }
        across::Error::BadArgs(_) => ArgumentError::new_err(msg),
        across::Error::Unsupported(_) => UnsupportedError::new_err(msg),
        across::Error::Bootstrap(_) | across::Error::Setup(_) => AllreduceError::new_err(msg),
    }
}

/// The exception for a launcher's error: a failed rank is named in `rank`.
pub fn from_launch(e: launch::LaunchError) -> PyErr {
    let msg = e.to_string();
    match e {
        launch::LaunchError::RankFailed { rank, .. } => LauncherError::new_err((msg, rank)),
        launch::LaunchError::BadArgs(_) | launch::LaunchError::BadEnv { .. } => ArgumentError::new_err(msg),
        _ => LauncherError::new_err((msg, None::<usize>)),
    }
}

/// A call the communicator refused before any work: too large for the capacity, else a bad argument.
fn from_call(e: &CallError, msg: String) -> PyErr {
    match e {
        CallError::TooLarge { bytes, capacity } => CapacityError::new_err((msg, *bytes, *capacity)),
        _ => ArgumentError::new_err(msg),
    }
}

fn from_collective(e: &CollectiveError, msg: String) -> PyErr {
    match e {
        CollectiveError::Call(c) => from_call(c, msg),
        CollectiveError::Gpu(g) => from_gpu(g, msg),
        CollectiveError::Ipc(i) => from_ipc(i, msg),
        CollectiveError::BadArgs(_) => ArgumentError::new_err(msg),
        CollectiveError::Unsupported(_) => UnsupportedError::new_err(msg),
        CollectiveError::Mismatch(_) => MismatchError::new_err(msg),
        // A watchdog's abort: a peer failed, which NCCL does not name.
        CollectiveError::Aborted(_) => PeerError::new_err((msg, Vec::<usize>::new())),
    }
}

fn from_ipc(e: &IpcError, msg: String) -> PyErr {
    match e {
        IpcError::Wait(deadline::WaitError::TimedOut(t)) => PeerError::new_err((msg, t.missing.clone())),
        IpcError::Wait(deadline::WaitError::Aborted { .. }) => PeerError::new_err((msg, Vec::<usize>::new())),
        IpcError::Aborted { rank, .. } => PeerError::new_err((msg, vec![*rank])),
        IpcError::BadArgs(_) | IpcError::BadJobId(_) => ArgumentError::new_err(msg),
        _ => AllreduceError::new_err(msg),
    }
}

fn from_gpu(e: &GpuError, msg: String) -> PyErr {
    match e {
        // The host driver's kernels wait for their peers with a deadline and name the ranks that never came.
        GpuError::Kernel { fault: KernelFault::Wait(deadline::WaitError::TimedOut(t)), .. } => {
            PeerError::new_err((msg, t.missing.clone()))
        }
        GpuError::Kernel { fault: KernelFault::Wait(deadline::WaitError::Aborted { .. }), .. } => {
            PeerError::new_err((msg, Vec::<usize>::new()))
        }
        GpuError::Kernel { fault: KernelFault::Mismatch { peer, .. }, .. } => PeerError::new_err((msg, vec![*peer])),
        GpuError::NotAvailable { .. } | GpuError::Unsupported(_) => UnsupportedError::new_err(msg),
        GpuError::BadArgs(_) => ArgumentError::new_err(msg),
        _ => AllreduceError::new_err(msg),
    }
}
