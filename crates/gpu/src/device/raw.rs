//! The raw calls a vendor driver supplies to the shared core ([`super::Device`]): one method a driver call (or a
//! short fixed sequence of them), each checked and returning an error that names the call. Handles and
//! addresses travel as integers; the core keeps them in its live sets and passes only live ones.

use crate::{DeviceInfo, LaunchDims, MemKind, PeerLink, Result, ShareHandle};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::fd::OwnedFd;

/// Which way a copy goes, for the vendor's memcpy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    DeviceToDevice,
    HostToDevice,
    DeviceToHost,
}

/// What a library is compiled for, and what goes into its cache key.
pub(crate) struct CompileTarget {
    /// The architecture in the cache file's name (`sm_90`, `gfx942`).
    pub cache_arch: String,
    /// The architecture a compile error names (`compute_90`, `gfx942:sramecc+:xnack-`).
    pub arch: String,
    /// The image's file extension: `cubin`, `ptx` or `hsaco`.
    pub ext: &'static str,
    /// Every compiler option, the architecture included.
    pub options: Vec<String>,
    /// The compiler's name and version.
    pub compiler: String,
}

/// A program's text as the compilers' create calls take it: NUL-terminated strings, the headers found by their
/// include names.
pub(crate) struct Source<'a> {
    pub src: &'a CStr,
    pub name: &'a CStr,
    pub headers: &'a [*const c_char],
    pub include_names: &'a [*const c_char],
}

impl Source<'_> {
    /// The source, its name, the header count, the header texts and their include names: the create calls'
    /// arguments after the program.
    pub fn args(&self) -> (*const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char) {
        let count = self.headers.len().min(self.include_names.len()) as c_int;
        (self.src.as_ptr(), self.name.as_ptr(), count, self.headers.as_ptr(), self.include_names.as_ptr())
    }
}

/// A vendor's run-time compiler (NVRTC, hipRTC): the calls of one compile, which [`super::rtc`] sequences.
pub(crate) trait Compiler {
    /// The compiler's program handle.
    type Program: Copy;
    /// The call that yields the image, named when it yields nothing.
    const CODE_CALL: &'static str;

    /// Creates a program of `source`.
    ///
    /// # Safety
    /// Every string `source` points at outlives the call.
    unsafe fn create(&self, source: &Source) -> Result<Self::Program>;
    /// Compiles `prog` with `options`.
    ///
    /// # Safety
    /// `prog` is a live program; every pointer in `options` is a NUL-terminated string that outlives the call.
    unsafe fn compile(&self, prog: Self::Program, options: &[*const c_char]) -> Result<()>;
    /// The size of the compile log, its NUL included.
    ///
    /// # Safety
    /// `prog` is a live program.
    unsafe fn log_size(&self, prog: Self::Program) -> Result<usize>;
    /// Writes the compile log into `buf`.
    ///
    /// # Safety
    /// `prog` is a live program and `buf` holds at least [`Compiler::log_size`] bytes.
    unsafe fn log(&self, prog: Self::Program, buf: &mut [u8]) -> Result<()>;
    /// The size of the image compiled for `target`.
    ///
    /// # Safety
    /// `prog` is a live program, compiled.
    unsafe fn code_size(&self, prog: Self::Program, target: &CompileTarget) -> Result<usize>;
    /// Writes the image compiled for `target` into `buf`.
    ///
    /// # Safety
    /// `prog` is a live program, compiled, and `buf` holds at least [`Compiler::code_size`] bytes.
    unsafe fn code(&self, prog: Self::Program, target: &CompileTarget, buf: &mut [u8]) -> Result<()>;
    /// Destroys `prog`.
    ///
    /// # Safety
    /// `prog` is a live program, destroyed once.
    unsafe fn destroy(&self, prog: Self::Program);
}

/// The raw calls of one vendor's driver on one device. Stream, event, module, kernel, graph and VMM handles and
/// device addresses are the driver's own values as integers.
pub(crate) trait Raw: Send + Sync + Sized {
    type Compiler: Compiler;
    /// The backend named in "not available" errors (`cuda`, `hip`).
    const BACKEND: &'static str;
    /// The run-time compiler's name, for messages.
    const COMPILER: &'static str;

    fn info(&self) -> &DeviceInfo;
    /// Makes this device (its context) current on the calling thread.
    fn make_current(&self) -> Result<()>;
    /// Free and total bytes of the current device's memory.
    fn mem_info(&self) -> Result<(u64, u64)>;
    /// The run-time compiler, or why it is not here.
    fn compiler(&self) -> std::result::Result<&Self::Compiler, &str>;
    /// What `compiler` builds for this device.
    fn compile_target(&self, compiler: &Self::Compiler) -> Result<CompileTarget>;

    /// `bytes` rounded up to the size unit of memory peers map (IPC and VMM allocations); a peer that imports an
    /// allocation rounds its size the same way, so it maps all of it.
    fn shared_size(&self, bytes: usize) -> Result<usize>;
    /// Allocates `size` bytes of the memory `kind` asks for; never from a stream-ordered pool, whose memory
    /// cannot be IPC-exported.
    fn malloc(&self, size: usize, kind: MemKind) -> Result<u64>;
    /// Frees what `malloc` returned.
    ///
    /// # Safety
    /// `ptr` came from `malloc` and is freed once.
    unsafe fn free(&self, ptr: u64) -> Result<()>;
    /// The IPC handle of the allocation that starts at `base`.
    ///
    /// # Safety
    /// `base` is device memory of this device (the driver checks that it starts an exportable allocation).
    unsafe fn ipc_handle(&self, base: u64) -> Result<Vec<u8>>;
    /// Opens a peer's IPC handle (its length is the vendor's).
    fn ipc_open(&self, handle: &[u8]) -> Result<u64>;
    /// Closes what `ipc_open` returned.
    ///
    /// # Safety
    /// `ptr` came from `ipc_open` and is closed once.
    unsafe fn ipc_close(&self, ptr: u64) -> Result<()>;
    /// Whether an IPC mapping whose range the driver cannot report is refused (else it is let through, the
    /// handle having been validated when it was opened).
    const IPC_RANGE_REQUIRED: bool;
    /// The base and size of the allocation (for VMM memory: the one mapping) that holds `ptr`.
    fn address_range(&self, ptr: u64) -> Result<(u64, usize)>;

    /// Refuses VMM work where the device has none.
    fn vmm_supported(&self) -> Result<()>;
    /// A new VMM allocation of `size` bytes (a multiple of [`Raw::shared_size`]'s unit), exportable as a POSIX fd.
    fn vmm_create(&self, size: usize) -> Result<u64>;
    /// The VMM allocation a peer exported as `fd`.
    fn vmm_import(&self, fd: &OwnedFd) -> Result<u64>;
    /// Drops this process's reference to a VMM allocation.
    ///
    /// # Safety
    /// `handle` came from `vmm_create` or `vmm_import`, is mapped nowhere, and is released once.
    unsafe fn vmm_release(&self, handle: u64) -> Result<()>;
    /// Reserves an address range of `size` bytes.
    fn vmm_reserve(&self, size: usize) -> Result<u64>;
    /// Maps `size` bytes of `handle` at `ptr`.
    ///
    /// # Safety
    /// `ptr` is a reserved range of `size` bytes with nothing mapped in it; `handle` is live.
    unsafe fn vmm_map(&self, ptr: u64, size: usize, handle: u64) -> Result<()>;
    /// Opens `size` bytes at `ptr` read-write to this device.
    ///
    /// # Safety
    /// The range is mapped.
    unsafe fn vmm_set_access(&self, ptr: u64, size: usize) -> Result<()>;
    /// Unmaps `size` bytes at `ptr`.
    ///
    /// # Safety
    /// The range was mapped by `vmm_map` and nothing uses it any more.
    unsafe fn vmm_unmap(&self, ptr: u64, size: usize) -> Result<()>;
    /// Frees a reservation.
    ///
    /// # Safety
    /// The range came from `vmm_reserve` with this size, has nothing mapped in it, and is freed once.
    unsafe fn vmm_address_free(&self, ptr: u64, size: usize) -> Result<()>;
    /// A new POSIX file descriptor for the VMM allocation `handle`.
    ///
    /// # Safety
    /// `handle` is a live VMM allocation handle.
    unsafe fn vmm_export(&self, handle: u64) -> Result<OwnedFd>;
    /// Exports an allocation another allocator of this device made (a framework's tensor) that starts at `base`.
    fn share_foreign(&self, base: u64) -> Result<ShareHandle>;

    fn stream_create(&self) -> Result<u64>;
    /// # Safety
    /// `stream` came from `stream_create` and is destroyed once.
    unsafe fn stream_destroy(&self, stream: u64) -> Result<()>;
    /// Refuses a stream of another device or context.
    ///
    /// # Safety
    /// `raw` is a live stream (or one of the driver's default-stream values).
    unsafe fn stream_check_owner(&self, raw: u64) -> Result<()>;
    /// # Safety
    /// `stream` is live.
    unsafe fn stream_sync(&self, stream: u64) -> Result<()>;
    /// An event that records timing.
    fn event_create(&self) -> Result<u64>;
    /// # Safety
    /// `event` came from `event_create` and is destroyed once.
    unsafe fn event_destroy(&self, event: u64) -> Result<()>;
    /// # Safety
    /// `event` and `stream` are live.
    unsafe fn event_record(&self, event: u64, stream: u64) -> Result<()>;
    /// # Safety
    /// `event` is live.
    unsafe fn event_sync(&self, event: u64) -> Result<()>;
    /// Whether the work before the event's last record has completed.
    ///
    /// # Safety
    /// `event` is live.
    unsafe fn event_query(&self, event: u64) -> Result<bool>;
    /// # Safety
    /// Both events are live.
    unsafe fn event_elapsed_ms(&self, start: u64, end: u64) -> Result<f32>;

    /// Enqueues a copy of `bytes` from `src` to `dst` on `stream`.
    ///
    /// # Safety
    /// `stream` is live; each address is device memory or host memory as `dir` says, valid for `bytes` until the
    /// copy has run.
    unsafe fn copy(&self, stream: u64, dir: Direction, dst: u64, src: u64, bytes: usize) -> Result<()>;
    /// Enqueues a fill of `bytes` at `dst` with `value`.
    ///
    /// # Safety
    /// `stream` is live; `dst` is device memory (the driver checks the range).
    unsafe fn memset_d8(&self, stream: u64, dst: u64, value: u8, bytes: usize) -> Result<()>;

    /// Loads a compiled image.
    ///
    /// # Safety
    /// `image` points at a whole image, 8-byte aligned (PTX NUL-terminated), alive through the call.
    unsafe fn module_load(&self, image: *const c_void) -> Result<u64>;
    /// # Safety
    /// `module` came from `module_load` and is unloaded once; none of its functions is used afterwards.
    unsafe fn module_unload(&self, module: u64) -> Result<()>;
    /// # Safety
    /// `module` is live.
    unsafe fn function(&self, module: u64, name: &CStr) -> Result<u64>;
    /// Blocks of `block` threads of `function` resident on one multiprocessor at once.
    ///
    /// # Safety
    /// `function` is live.
    unsafe fn occupancy(&self, function: u64, block: u32, shared_bytes: u32) -> Result<usize>;
    /// Launches `function` with the kernel-parameter array `args` (null for none).
    ///
    /// # Safety
    /// `function` and `stream` are live; `args` is null or points at the kernel's parameters, alive through the
    /// call (the driver copies them).
    unsafe fn launch(&self, function: u64, dims: LaunchDims, stream: u64, args: *mut *mut c_void) -> Result<()>;

    /// Starts a thread-local capture, which leaves other threads' work alone.
    ///
    /// # Safety
    /// `stream` is live.
    unsafe fn capture_begin(&self, stream: u64) -> Result<()>;
    /// Whether `stream` is capturing (an invalidated capture counts).
    ///
    /// # Safety
    /// `stream` is live.
    unsafe fn capturing(&self, stream: u64) -> Result<bool>;
    /// Ends the capture and returns the graph.
    ///
    /// # Safety
    /// `stream` is live.
    unsafe fn capture_end(&self, stream: u64) -> Result<u64>;
    /// # Safety
    /// `graph` is a live graph.
    unsafe fn graph_instantiate(&self, graph: u64) -> Result<u64>;
    /// # Safety
    /// `exec` and `stream` are live.
    unsafe fn graph_launch(&self, exec: u64, stream: u64) -> Result<()>;
    /// # Safety
    /// `exec` is live and destroyed once.
    unsafe fn graph_exec_destroy(&self, exec: u64) -> Result<()>;
    /// # Safety
    /// `graph` is live and destroyed once.
    unsafe fn graph_destroy(&self, graph: u64) -> Result<()>;

    /// The device with PCI bus id `bus`, if this process sees it.
    fn device_by_bus_id(&self, bus: &CStr) -> Option<i32>;
    /// How this device reaches the visible device `peer`.
    fn peer_link(&self, peer: i32) -> Result<PeerLink>;
}
