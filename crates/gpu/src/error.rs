/// Every failure of a driver call, named by the call.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// A driver call returned an error status.
    #[error("{call} failed: {msg} (code {code})")]
    Driver { call: &'static str, code: i64, msg: String },
    /// The driver's library or device is not there.
    #[error("{backend} driver not available: {reason}")]
    NotAvailable { backend: &'static str, reason: String },
    /// The driver cannot do this (for example: share this memory with other processes); the text says why.
    #[error("not supported: {0}")]
    Unsupported(String),
    /// Run-time compilation failed; `log` is the compiler's output.
    #[error("compiling kernel library {library} for {arch} failed:\n{log}")]
    Compile { library: String, arch: String, log: String },
    /// A host kernel stopped: a wait for peers that ended (its ranks as data) or another fault.
    #[error("kernel {kernel} failed: {fault}")]
    Kernel { kernel: String, fault: KernelFault },
    #[error("invalid argument: {0}")]
    BadArgs(String),
}

pub type Result<T> = std::result::Result<T, GpuError>;

/// Why a host kernel stopped.
#[derive(Debug, thiserror::Error)]
pub enum KernelFault {
    /// It waited for peers past its deadline, or a peer's abort ended the wait: the ranks are in the error.
    #[error(transparent)]
    Wait(#[from] deadline::WaitError),
    /// A barrier met `peer` at this call's epoch in another kernel (the ranks chose different designs for one
    /// call): neither may read what the other wrote.
    #[error("rank {peer} {}", mismatch(ours, theirs))]
    Mismatch { peer: usize, ours: &'static str, theirs: &'static str },
    /// Anything else (a malformed parameter block, a message larger than an area).
    #[error("{0}")]
    Other(String),
}

/// What a peer met at the same epoch in another kernel did, for any error that names it (the host twins', the
/// device kernels' record in the status words).
pub fn mismatch(ours: &str, theirs: &str) -> String {
    format!("ran {theirs} where this rank ran {ours} (every rank must make the same call, on buffers of the same residency)")
}

impl From<String> for KernelFault {
    fn from(msg: String) -> KernelFault {
        KernelFault::Other(msg)
    }
}

impl GpuError {
    /// For nix calls on the host driver.
    pub(crate) fn sys(call: &'static str, e: nix::errno::Errno) -> GpuError {
        GpuError::Driver { call, code: e as i64, msg: e.desc().to_string() }
    }
}
