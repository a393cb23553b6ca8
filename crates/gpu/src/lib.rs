//! One HIP-shaped device API over three drivers: `host` (shared memory and Rust "kernels", runs anywhere),
//! `cuda` (cudarc, loaded at run time) and `hip` (loaded at run time), the two GPU drivers being one core
//! (`device`) over each vendor's raw calls. Nothing here knows about collectives.
//!
//! Drivers implement the object-safe [`Driver`] trait with raw handles; the rest of the workspace uses the RAII
//! wrappers ([`Gpu`], [`DeviceBuffer`], [`Stream`], [`Event`], [`Kernel`], [`Graph`]) so that every allocation,
//! mapping and handle is released on every path.

mod cuda;
mod device;
mod error;
mod hip;
mod host;
mod kernel_cache;

pub use error::{mismatch, GpuError, KernelFault, Result};
pub use host::{unknown_unfit_stems, HostKernel, HostLaunch, UNFIT_KERNELS_VAR};

use std::collections::HashMap;
use std::fmt;
use std::os::fd::OwnedFd;
use std::str::FromStr;
use std::sync::Arc;

/// An address in the device's (for `host`: the process's) address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0 + bytes as u64)
    }
}

/// Which driver to use; `Auto` takes hip, then cuda, when its library loads and sees a device, else host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Auto,
    Host,
    Cuda,
    Hip,
}

impl FromStr for Backend {
    type Err = GpuError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Backend::Auto),
            "host" => Ok(Backend::Host),
            "cuda" => Ok(Backend::Cuda),
            "hip" => Ok(Backend::Hip),
            other => Err(GpuError::BadArgs(format!("unknown backend {other:?} (expected auto, host, cuda or hip)"))),
        }
    }
}

/// The driver actually in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DriverKind {
    Host,
    Cuda,
    Hip,
}

impl DriverKind {
    pub const ALL: [DriverKind; 3] = [DriverKind::Host, DriverKind::Cuda, DriverKind::Hip];
}

impl FromStr for DriverKind {
    type Err = GpuError;
    fn from_str(s: &str) -> Result<Self> {
        DriverKind::ALL
            .into_iter()
            .find(|d| d.to_string() == s)
            .ok_or_else(|| GpuError::BadArgs(format!("unknown driver {s:?} (expected host, cuda or hip)")))
    }
}

impl fmt::Display for DriverKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DriverKind::Host => "host",
            DriverKind::Cuda => "cuda",
            DriverKind::Hip => "hip",
        })
    }
}

/// What the selected device is.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub kind: DriverKind,
    pub name: String,
    pub ordinal: usize,
    pub count: usize,
    /// `sm_90`, `gfx942`, or `host`.
    pub arch: String,
    pub multiprocessors: usize,
    /// Elements a comm_bench.py size is rounded up to on this driver (512 on HIP, 256 elsewhere).
    pub size_align: usize,
    /// The PCI bus id, lower case (`0000:1b:00.0`), so ranks can tell which of them share a device; `host` on the
    /// host driver, whose ranks all share the one "device".
    pub bus_id: String,
    /// The driver's own version, for reports: `CUDA 13.0` (the kernel driver's CUDA version), `HIP 6.4.43482`,
    /// `host`.
    pub driver_version: String,
}

/// How an allocation may be shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    /// Private to this process.
    Device,
    /// Exportable with [`Gpu::ipc_export`]. `uncached` asks for memory whose stores reach a peer's running kernel
    /// without cache flushes (ROCm's `hipDeviceMallocUncached`; ignored where the driver has no such type).
    Ipc { uncached: bool },
}

/// How an allocation is handed to a peer process.
#[derive(Debug)]
pub enum ShareHandle {
    /// Opened with [`Gpu::ipc_import`].
    Ipc(Vec<u8>),
    /// Mapped with [`Gpu::vmm_import_fd`].
    Vmm(OwnedFd),
}

/// The allocation that holds a range, exported: `base` is the allocation's start, `alloc_bytes` its size, and the
/// range begins `offset` bytes into it. A peer imports `handle` with `alloc_bytes` and adds `offset`.
#[derive(Debug)]
pub struct SharedRange {
    pub handle: ShareHandle,
    pub base: DevicePtr,
    pub alloc_bytes: usize,
    pub offset: usize,
}

/// A kernel's launch shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    pub grid: u32,
    pub block: u32,
    pub shared_bytes: u32,
}

/// Kernels as one vendor-neutral source (compiled at run time by NVRTC / hipRTC) plus the host driver's Rust
/// implementations of the same entry points.
pub struct KernelLibrary {
    pub name: &'static str,
    pub source: &'static str,
    /// The headers `source` includes, as (include name, text): handed to the run-time compiler, and part of the
    /// kernel cache's key.
    pub headers: &'static [(&'static str, &'static str)],
    pub host: &'static [(&'static str, HostKernel)],
}

/// A driver's handle of one kind of object (a stream, event, module, kernel or graph): the raw value is the
/// driver's, the kind is the type's, so a stream cannot be passed where an event is wanted.
pub struct Handle<K> {
    raw: u64,
    kind: std::marker::PhantomData<fn() -> K>,
}

impl<K> Handle<K> {
    pub fn from_raw(raw: u64) -> Self {
        Handle { raw, kind: std::marker::PhantomData }
    }
    /// The driver's value (a `CUstream`, `hipStream_t`, ... or the host driver's id).
    pub fn raw(self) -> u64 {
        self.raw
    }
}

// By hand: derived impls would ask the same of `K`, which names a kind and is never built.
impl<K> Clone for Handle<K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K> Copy for Handle<K> {}
impl<K> PartialEq for Handle<K> {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}
impl<K> Eq for Handle<K> {}
impl<K> std::hash::Hash for Handle<K> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.raw.hash(state)
    }
}
impl<K> fmt::LowerHex for Handle<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.raw, f)
    }
}
impl<K> fmt::Debug for Handle<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.raw)
    }
}

/// The kinds of driver objects a [`Handle`] names.
pub mod kinds {
    pub enum Stream {}
    pub enum Event {}
    pub enum Module {}
    pub enum Kernel {}
    pub enum Graph {}
}
pub type StreamHandle = Handle<kinds::Stream>;
pub type EventHandle = Handle<kinds::Event>;
pub type ModuleHandle = Handle<kinds::Module>;
pub type KernelHandle = Handle<kinds::Kernel>;
pub type GraphHandle = Handle<kinds::Graph>;

/// A piece of memory as the driver sees it.
#[derive(Clone, Copy, Debug)]
pub struct RawMem {
    pub ptr: DevicePtr,
    pub bytes: usize,
    /// The driver's own id for it.
    pub token: u64,
}

/// How this device reaches a peer device, as the driver reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerLink {
    /// Kernels here can load from and store to the peer's memory.
    pub access: bool,
    /// Atomic operations on the peer's memory are native (the compare-and-swap handshakes rely on them).
    pub native_atomics: bool,
}

/// The driver interface. Every call's status is checked and turned into a [`GpuError`] naming the call.
pub trait Driver: Send + Sync {
    fn info(&self) -> &DeviceInfo;
    /// Free and total bytes of the device's memory now; `None` on the host driver, whose "device" memory is the
    /// process's.
    fn memory(&self) -> Result<Option<(u64, u64)>>;
    /// How many launches of each kernel were enqueued through this driver (a captured launch once), by kernel name;
    /// `None` on the GPU drivers, which keep no count (a profiler does).
    fn launches(&self) -> Option<HashMap<&'static str, u64>> {
        None
    }

    fn alloc(&self, bytes: usize, kind: MemKind) -> Result<RawMem>;
    fn ipc_export(&self, mem: &RawMem) -> Result<Vec<u8>>;
    fn ipc_import(&self, handle: &[u8], bytes: usize) -> Result<RawMem>;
    /// A VMM-style allocation (cuMemCreate / hipMemCreate / memfd), mapped here, exportable as a file descriptor.
    fn vmm_create(&self, bytes: usize) -> Result<RawMem>;
    fn vmm_export_fd(&self, mem: &RawMem) -> Result<OwnedFd>;
    fn vmm_import_fd(&self, fd: OwnedFd, bytes: usize) -> Result<RawMem>;
    /// Frees, unmaps or closes whatever `mem` came from.
    fn release(&self, mem: &RawMem) -> Result<()>;

    /// The allocation holding `bytes` at `ptr`, exported for a peer process; only queries and exports.
    fn share_range(&self, ptr: DevicePtr, bytes: usize) -> Result<SharedRange>;

    fn stream_create(&self) -> Result<StreamHandle>;
    /// Destroys a stream made by `stream_create`; one that was only adopted is refused (see `stream_forget`).
    fn stream_destroy(&self, stream: StreamHandle) -> Result<()>;
    /// Starts tracking a stream this driver did not create, so every stream-taking method accepts it; returns the
    /// handle to use. Adopting one stream several times needs as many `stream_forget`s.
    fn stream_adopt(&self, raw: u64) -> Result<StreamHandle>;
    /// How this device reaches the device with PCI bus id `bus_id`; `None` when that device is this one or is not
    /// visible to this process (a per-rank `CUDA_VISIBLE_DEVICES`), so the driver cannot say.
    fn peer_link(&self, bus_id: &str) -> Result<Option<PeerLink>>;
    /// Stops tracking an adopted stream without destroying it.
    fn stream_forget(&self, stream: StreamHandle) -> Result<()>;
    fn stream_sync(&self, stream: StreamHandle) -> Result<()>;
    fn event_create(&self) -> Result<EventHandle>;
    fn event_destroy(&self, event: EventHandle) -> Result<()>;
    fn event_record(&self, event: EventHandle, stream: StreamHandle) -> Result<()>;
    fn event_sync(&self, event: EventHandle) -> Result<()>;
    /// Whether the work before the event's last record has completed (an event never recorded has).
    fn event_query(&self, event: EventHandle) -> Result<bool>;
    fn event_elapsed_ms(&self, start: EventHandle, end: EventHandle) -> Result<f32>;

    fn memcpy_dtod(&self, stream: StreamHandle, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()>;
    fn memset_d8(&self, stream: StreamHandle, dst: DevicePtr, value: u8, bytes: usize) -> Result<()>;
    /// Host to device; returns once the copy is done.
    fn memcpy_htod(&self, stream: StreamHandle, dst: DevicePtr, src: &[u8]) -> Result<()>;
    /// Device to host; returns once the copy is done.
    fn memcpy_dtoh(&self, stream: StreamHandle, dst: &mut [u8], src: DevicePtr) -> Result<()>;

    fn module_load(&self, lib: &KernelLibrary) -> Result<ModuleHandle>;
    fn module_unload(&self, module: ModuleHandle) -> Result<()>;
    fn kernel(&self, module: ModuleHandle, name: &str) -> Result<KernelHandle>;
    /// How many blocks of `block` threads of this kernel can be resident on the whole device at once.
    fn max_resident_blocks(&self, kernel: KernelHandle, block: u32, shared_bytes: u32) -> Result<usize>;
    fn launch(&self, stream: StreamHandle, kernel: KernelHandle, dims: LaunchDims, params: &[u8]) -> Result<()>;

    fn capture_begin(&self, stream: StreamHandle) -> Result<()>;
    /// Whether work issued on `stream` now goes into a graph capture (an invalidated capture counts).
    fn capturing(&self, stream: StreamHandle) -> Result<bool>;
    fn capture_end(&self, stream: StreamHandle) -> Result<GraphHandle>;
    fn graph_launch(&self, graph: GraphHandle, stream: StreamHandle) -> Result<()>;
    fn graph_destroy(&self, graph: GraphHandle) -> Result<()>;
}

/// Options for opening a driver.
#[derive(Clone, Debug)]
pub struct DriverOptions {
    /// Device ordinal; `None` takes `local_rank % device count` (so ranks spread over GPUs, or share one).
    pub device: Option<usize>,
    /// The launcher's local rank (every launcher names it differently); `None` reads `LOCAL_RANK`.
    pub local_rank: Option<usize>,
    /// Prefix of every shared-memory name the host driver creates (`/arx-<job>`), so a launcher can sweep them.
    pub shm_prefix: String,
}

/// A driver and the reasons the ones tried before it were passed over.
pub struct Opened {
    pub gpu: Gpu,
    pub notes: Vec<String>,
}

type OpenFn = fn(&DriverOptions) -> Result<Arc<dyn Driver>>;

/// Opens the driver `backend` asks for. `Auto` says in `notes` why it passed over each GPU driver.
pub fn open(backend: Backend, opts: &DriverOptions) -> Result<Opened> {
    let mut notes = Vec::new();
    let driver: Arc<dyn Driver> = match backend {
        Backend::Host => Arc::new(host::HostDriver::new(&opts.shm_prefix)),
        Backend::Hip => hip::open(opts)?,
        Backend::Cuda => cuda::open(opts)?,
        Backend::Auto => {
            let tried: [(&str, OpenFn); 2] = [("hip", hip::open), ("cuda", cuda::open)];
            let mut found = None;
            for (name, open) in tried {
                match open(opts) {
                    Ok(d) => {
                        found = Some(d);
                        break;
                    }
                    // Only a missing library or device moves on; a driver that loaded and then failed is an error.
                    Err(e @ GpuError::NotAvailable { .. }) => notes.push(format!("{name}: {e}")),
                    Err(e) => return Err(e),
                }
            }
            match found {
                Some(d) => d,
                None => Arc::new(host::HostDriver::new(&opts.shm_prefix)),
            }
        }
    };
    Ok(Opened { gpu: Gpu(driver), notes })
}

/// Picks the ordinal from the options or `LOCAL_RANK`.
pub(crate) fn pick_ordinal(opts: &DriverOptions, count: usize) -> Result<usize> {
    if count == 0 {
        return Err(GpuError::NotAvailable { backend: "gpu", reason: "no device".into() });
    }
    let ordinal = match opts.device {
        Some(d) => d,
        None => {
            let env = || std::env::var("LOCAL_RANK").ok().and_then(|s| s.parse::<usize>().ok());
            opts.local_rank.or_else(env).unwrap_or(0) % count
        }
    };
    if ordinal >= count {
        return Err(GpuError::BadArgs(format!("device {ordinal} requested, {count} present")));
    }
    Ok(ordinal)
}

/// A shared handle to the driver in use.
#[derive(Clone)]
pub struct Gpu(Arc<dyn Driver>);

impl Gpu {
    pub fn info(&self) -> &DeviceInfo {
        self.0.info()
    }
    /// Free and total bytes of the device's memory now (`None` on the host driver).
    pub fn memory(&self) -> Result<Option<(u64, u64)>> {
        self.0.memory()
    }
    /// How many launches of each kernel were enqueued, by name: the host driver's count of what its calls ran (for
    /// tests and debugging); `None` on the GPU drivers.
    pub fn launches(&self) -> Option<HashMap<&'static str, u64>> {
        self.0.launches()
    }
    pub fn kind(&self) -> DriverKind {
        self.0.info().kind
    }

    fn wrap(&self, raw: RawMem) -> DeviceBuffer {
        DeviceBuffer { gpu: self.clone(), raw }
    }

    /// Allocates `bytes` (at least 1) of device memory.
    pub fn alloc(&self, bytes: usize, kind: MemKind) -> Result<DeviceBuffer> {
        if bytes == 0 {
            return Err(GpuError::BadArgs("zero-byte allocation".into()));
        }
        Ok(self.wrap(self.0.alloc(bytes, kind)?))
    }
    pub fn ipc_export(&self, buf: &DeviceBuffer) -> Result<Vec<u8>> {
        self.0.ipc_export(&buf.raw)
    }
    /// Maps a peer's allocation; the mapping is closed when the returned buffer drops.
    pub fn ipc_import(&self, handle: &[u8], bytes: usize) -> Result<DeviceBuffer> {
        Ok(self.wrap(self.0.ipc_import(handle, bytes)?))
    }
    pub fn vmm_create(&self, bytes: usize) -> Result<DeviceBuffer> {
        if bytes == 0 {
            return Err(GpuError::BadArgs("zero-byte allocation".into()));
        }
        Ok(self.wrap(self.0.vmm_create(bytes)?))
    }
    pub fn vmm_export_fd(&self, buf: &DeviceBuffer) -> Result<OwnedFd> {
        self.0.vmm_export_fd(&buf.raw)
    }
    pub fn vmm_import_fd(&self, fd: OwnedFd, bytes: usize) -> Result<DeviceBuffer> {
        Ok(self.wrap(self.0.vmm_import_fd(fd, bytes)?))
    }

    /// Exports the allocation that holds `bytes` at `ptr` (memory from this driver, or from another allocator of
    /// this device's context, such as a framework's tensors), for a peer to import and offset. Safe: it only
    /// queries the driver and exports, never touching the memory.
    /// How this device reaches the device with PCI bus id `bus_id` (see [`Driver::peer_link`]).
    pub fn peer_link(&self, bus_id: &str) -> Result<Option<PeerLink>> {
        self.0.peer_link(bus_id)
    }

    pub fn share_range(&self, ptr: DevicePtr, bytes: usize) -> Result<SharedRange> {
        if bytes == 0 {
            return Err(GpuError::BadArgs("share_range of zero bytes".into()));
        }
        self.0.share_range(ptr, bytes)
    }

    pub fn stream(&self) -> Result<Stream> {
        Ok(Stream { gpu: self.clone(), handle: self.0.stream_create()?, owned: true })
    }

    /// Wraps a stream the caller owns (a framework's current stream, say); dropping the returned [`Stream`] stops
    /// using it and leaves it alive. On CUDA, `0` and `1` (the legacy default stream) and `2` (the per-thread
    /// default stream) are taken as they are; any other stream must belong to this driver's context (on HIP: to
    /// its device), else the error says whose it is.
    ///
    /// # Safety
    /// `raw` is a live stream of this device's context (for the host driver: a stream of this driver), it outlives
    /// the returned `Stream`, and the caller orders its own uses of it with the work issued here.
    pub unsafe fn borrow_stream(&self, raw: u64) -> Result<Stream> {
        Ok(Stream { gpu: self.clone(), handle: self.0.stream_adopt(raw)?, owned: false })
    }
    pub fn event(&self) -> Result<Event> {
        Ok(Event { gpu: self.clone(), handle: self.0.event_create()? })
    }
    pub fn load(&self, lib: &KernelLibrary) -> Result<Module> {
        Ok(Module(Arc::new(Loaded { gpu: self.clone(), handle: self.0.module_load(lib)? })))
    }
}

/// Device memory (owned, IPC-mapped or VMM-mapped); released on drop.
pub struct DeviceBuffer {
    gpu: Gpu,
    raw: RawMem,
}

impl DeviceBuffer {
    pub fn ptr(&self) -> DevicePtr {
        self.raw.ptr
    }
    /// The device (and driver) this memory belongs to.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
    pub fn bytes(&self) -> usize {
        self.raw.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Err(e) = self.gpu.0.release(&self.raw) {
            eprintln!("warning: releasing device memory: {e}");
        }
    }
}

/// Streams a caller created, each borrowed ([`Gpu::borrow_stream`]) the first time it is seen and found again by its
/// raw handle; never destroyed here. Indexed by what [`BorrowedStreams::position`] returned, so a holder can keep the
/// index while it borrows its other state.
#[derive(Default)]
pub struct BorrowedStreams(Vec<(u64, Stream)>);

impl BorrowedStreams {
    /// The index of the caller's stream `raw` on `gpu`, borrowing it the first time.
    ///
    /// # Safety
    /// As [`Gpu::borrow_stream`]: `raw` is a live stream of `gpu`'s context that outlives its use here (or is
    /// [forgotten](BorrowedStreams::forget) first).
    pub unsafe fn position(&mut self, gpu: &Gpu, raw: u64) -> Result<usize> {
        if let Some(k) = self.0.iter().position(|s| s.0 == raw) {
            return Ok(k);
        }
        // SAFETY: the caller's contract.
        self.0.push((raw, unsafe { gpu.borrow_stream(raw)? }));
        Ok(self.0.len() - 1)
    }

    /// Forgets `raw` (the caller is about to destroy it), so a later stream that reuses its handle is borrowed afresh.
    pub fn forget(&mut self, raw: u64) {
        self.0.retain(|s| s.0 != raw);
    }
}

impl std::ops::Index<usize> for BorrowedStreams {
    type Output = Stream;
    fn index(&self, k: usize) -> &Stream {
        &self.0[k].1
    }
}

/// An ordered queue of device work: created here, or borrowed with [`Gpu::borrow_stream`].
pub struct Stream {
    gpu: Gpu,
    handle: StreamHandle,
    /// Destroyed on drop when created here; a borrowed one is only forgotten.
    owned: bool,
}

impl Stream {
    /// The driver's raw stream (a `CUstream`, `hipStream_t` or the host driver's id): what the communicator's calls
    /// take.
    pub fn handle(&self) -> u64 {
        self.handle.raw()
    }
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
    pub fn sync(&self) -> Result<()> {
        self.gpu.0.stream_sync(self.handle)
    }
    /// Enqueues a copy of `bytes` from `src` to `dst`.
    ///
    /// # Safety
    /// Both ranges are device memory of this driver (or mapped into it) that stays allocated until the copy has
    /// run, and nothing else writes `dst` or `src` (or reads `dst`) while it runs. The host driver dereferences the
    /// addresses on this thread.
    pub unsafe fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.gpu.0.memcpy_dtod(self.handle, dst, src, bytes)
    }
    /// Enqueues a fill of `bytes` at `dst` with `value`.
    ///
    /// # Safety
    /// As [`Stream::copy`], for the one range `dst`.
    pub unsafe fn memset(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        self.gpu.0.memset_d8(self.handle, dst, value, bytes)
    }
    /// Fills all of `buf` with `value`: safe, since the range is the buffer's own and the buffer outlives the call
    /// (a device driver keeps it until its stream is idle: see [`DeviceBuffer`]'s owner's duty to sync first).
    pub fn fill(&self, buf: &DeviceBuffer, value: u8) -> Result<()> {
        self.gpu.0.memset_d8(self.handle, buf.ptr(), value, buf.bytes())
    }
    pub fn upload(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> Result<()> {
        check_range(dst, offset, src.len())?;
        self.gpu.0.memcpy_htod(self.handle, dst.ptr().offset(offset), src)
    }
    pub fn download(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(src, offset, dst.len())?;
        self.gpu.0.memcpy_dtoh(self.handle, dst, src.ptr().offset(offset))
    }
    /// Launches `kernel` with one by-value parameter struct (the kernels' ABI in this workspace).
    ///
    /// # Safety
    /// `params` is the parameter struct `kernel` was written for, and every address in it is memory the kernel may
    /// access as it does, live until the launch has run (on the host driver it runs on this thread).
    pub unsafe fn launch<P: bytemuck::Pod>(&self, kernel: &Kernel, dims: LaunchDims, params: &P) -> Result<()> {
        self.gpu.0.launch(self.handle, kernel.handle, dims, bytemuck::bytes_of(params))
    }
    pub fn record(&self, event: &Event) -> Result<()> {
        self.gpu.0.event_record(event.handle, self.handle)
    }
    /// Starts capturing the work issued on this stream into a graph.
    pub fn begin_capture(&self) -> Result<()> {
        self.gpu.0.capture_begin(self.handle)
    }
    /// Whether this stream is capturing: a collective may pick a different protocol for a graph, whose ranks start
    /// their kernels closer together than eager launches do.
    pub fn is_capturing(&self) -> Result<bool> {
        self.gpu.0.capturing(self.handle)
    }
    pub fn end_capture(&self) -> Result<Graph> {
        Ok(Graph { gpu: self.gpu.clone(), handle: self.gpu.0.capture_end(self.handle)? })
    }
    pub fn replay(&self, graph: &Graph) -> Result<()> {
        self.gpu.0.graph_launch(graph.handle, self.handle)
    }
}

/// The text of the NUL-terminated string a driver call wrote into `buf` (all of it if it wrote no NUL).
pub(crate) fn c_buf_text(buf: &[std::ffi::c_char]) -> String {
    let bytes: &[u8] = bytemuck::cast_slice(buf);
    match std::ffi::CStr::from_bytes_until_nul(bytes) {
        Ok(s) => s.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// Why every driver's share_range refuses its own MemKind::Device memory.
pub(crate) const PRIVATE_MEMORY: &str = "MemKind::Device memory is private to this process and cannot be shared with \
                                         other processes (allocate it with MemKind::Ipc or vmm_create)";
/// Why every driver's share_range refuses a peer's allocation mapped here.
pub(crate) const REIMPORTED_MEMORY: &str =
    "memory mapped from another process cannot be shared again; share the owner's handle instead";

/// Drops one adoption of `stream` (the `stream_forget` of every driver).
pub(crate) fn forget(adopted: &mut std::collections::HashMap<StreamHandle, usize>, stream: StreamHandle) -> Result<()> {
    match adopted.get_mut(&stream) {
        Some(n) if *n > 1 => *n -= 1,
        Some(_) => {
            adopted.remove(&stream);
        }
        None => return Err(GpuError::BadArgs(format!("stream_forget of {stream:#x}, which was not adopted"))),
    }
    Ok(())
}

/// Where `bytes` at `ptr` begin in the allocation of `alloc_bytes` at `base`, or why they are not inside it.
pub(crate) fn offset_in(base: DevicePtr, alloc_bytes: usize, ptr: DevicePtr, bytes: usize) -> Result<usize> {
    let span = ptr.0.checked_sub(base.0).and_then(|o| Some((o, o.checked_add(bytes as u64)?)));
    match span {
        Some((offset, end)) if end <= alloc_bytes as u64 => Ok(offset as usize),
        _ => Err(GpuError::BadArgs(format!(
            "{bytes} bytes at {:#x} overrun the allocation of {alloc_bytes} bytes at {:#x} that holds their start",
            ptr.0, base.0
        ))),
    }
}

fn check_range(buf: &DeviceBuffer, offset: usize, len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= buf.bytes() => Ok(()),
        _ => Err(GpuError::BadArgs(format!(
            "copy of {len} bytes at offset {offset} overruns a buffer of {} bytes",
            buf.bytes()
        ))),
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let (what, done) = if self.owned {
            ("destroying", self.gpu.0.stream_destroy(self.handle))
        } else {
            ("forgetting borrowed", self.gpu.0.stream_forget(self.handle))
        };
        if let Err(e) = done {
            eprintln!("warning: {what} stream: {e}");
        }
    }
}

/// A timestamp recorded on a stream.
pub struct Event {
    gpu: Gpu,
    handle: EventHandle,
}

impl Event {
    pub fn sync(&self) -> Result<()> {
        self.gpu.0.event_sync(self.handle)
    }
    /// Whether the work before its last record has completed, without waiting.
    pub fn query(&self) -> Result<bool> {
        self.gpu.0.event_query(self.handle)
    }
    /// Milliseconds from `self` to `end`, both recorded and complete.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.gpu.0.event_elapsed_ms(self.handle, end.handle)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Err(e) = self.gpu.0.event_destroy(self.handle) {
            eprintln!("warning: destroying event: {e}");
        }
    }
}

/// A loaded kernel library.
pub struct Module(Arc<Loaded>);

/// A loaded module, unloaded when its [`Module`] and the last of its [`Kernel`]s are gone.
struct Loaded {
    gpu: Gpu,
    handle: ModuleHandle,
}

impl Module {
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        let handle = self.0.gpu.0.kernel(self.0.handle, name)?;
        Ok(Kernel { module: self.0.clone(), handle })
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        if let Err(e) = self.gpu.0.module_unload(self.handle) {
            eprintln!("warning: unloading module: {e}");
        }
    }
}

/// A kernel entry point; it keeps the module it was loaded from alive.
pub struct Kernel {
    module: Arc<Loaded>,
    handle: KernelHandle,
}

impl Kernel {
    pub fn max_resident_blocks(&self, block: u32, shared_bytes: u32) -> Result<usize> {
        self.module.gpu.0.max_resident_blocks(self.handle, block, shared_bytes)
    }
}

/// Captured work, replayable on a stream.
pub struct Graph {
    gpu: Gpu,
    handle: GraphHandle,
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Err(e) = self.gpu.0.graph_destroy(self.handle) {
            eprintln!("warning: destroying graph: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_checked_against_the_whole_allocation() {
        let base = DevicePtr(0x1000);
        assert_eq!(offset_in(base, 4096, base, 4096).unwrap(), 0);
        assert_eq!(offset_in(base, 4096, base.offset(4000), 96).unwrap(), 4000);
        assert!(matches!(offset_in(base, 4096, base.offset(4000), 97), Err(GpuError::BadArgs(_))));
        assert!(matches!(offset_in(base, 4096, DevicePtr(0xfff), 1), Err(GpuError::BadArgs(_))), "before the base");
        assert!(matches!(offset_in(base, 4096, DevicePtr(u64::MAX), usize::MAX), Err(GpuError::BadArgs(_))));
    }

    #[test]
    fn a_driver_parses_from_its_name_and_nothing_else() {
        for d in DriverKind::ALL {
            assert_eq!(d.to_string().parse::<DriverKind>().unwrap(), d);
        }
        let e = "rocm".parse::<DriverKind>().unwrap_err().to_string();
        assert!(e.contains("unknown driver \"rocm\" (expected host, cuda or hip)"), "{e}");
    }

    #[test]
    fn each_adoption_needs_its_own_forget() {
        let seven = StreamHandle::from_raw(7);
        let mut adopted = std::collections::HashMap::from([(seven, 2)]);
        forget(&mut adopted, seven).unwrap();
        forget(&mut adopted, seven).unwrap();
        assert!(adopted.is_empty());
        assert!(matches!(forget(&mut adopted, seven), Err(GpuError::BadArgs(_))));
    }

    #[test]
    fn c_strings_end_at_their_nul_or_the_buffer() {
        let mut buf = [0 as std::ffi::c_char; 16];
        for (d, s) in buf.iter_mut().zip(b"0000:1B:00.0") {
            *d = *s as std::ffi::c_char;
        }
        assert_eq!(c_buf_text(&buf), "0000:1B:00.0");
        assert_eq!(c_buf_text(&[b'a' as std::ffi::c_char; 3]), "aaa");
    }
}
