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
    /// A kernel reported a failure (on the host driver: a timed-out wait names the ranks).
    #[error("kernel {kernel} failed: {msg}")]
    Kernel { kernel: String, msg: String },
    #[error("invalid argument: {0}")]
    BadArgs(String),
}

pub type Result<T> = std::result::Result<T, GpuError>;

impl GpuError {
    /// For nix calls on the host driver.
    pub(crate) fn sys(call: &'static str, e: nix::errno::Errno) -> GpuError {
        GpuError::Driver { call, code: e as i64, msg: e.desc().to_string() }
    }
}
