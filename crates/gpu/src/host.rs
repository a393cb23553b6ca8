//! The host driver: a real driver whose "device memory" is memory other processes can map (POSIX shared memory
//! for IPC handles, memfd for VMM-style handles), whose streams run each operation to completion in the calling
//! thread, and whose "kernels" are Rust functions that run the same algorithms with std atomics.

use crate::{
    forget, offset_in, DeviceInfo, DevicePtr, Driver, DriverKind, EventHandle, GpuError, GraphHandle, Handle,
    KernelFault, KernelHandle, KernelLibrary, LaunchDims, MemKind, ModuleHandle, PeerLink, RawMem, Result, ShareHandle,
    SharedRange, StreamHandle, PRIVATE_MEMORY, REIMPORTED_MEMORY,
};
use nix::fcntl::OFlag;
use nix::sys::mman::{self, MapFlags, ProtFlags};
use nix::sys::stat::{fstat, Mode};
use std::collections::HashMap;
use std::ffi::c_void;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// A host "kernel": the Rust twin of a device kernel, given the same by-value parameter struct.
pub type HostKernel = fn(&HostLaunch<'_>) -> std::result::Result<(), KernelFault>;

/// What a host kernel is launched with.
pub struct HostLaunch<'a> {
    pub dims: LaunchDims,
    params: &'a [u8],
}

impl HostLaunch<'_> {
    /// The launch's parameter struct.
    pub fn params<P: bytemuck::Pod>(&self) -> std::result::Result<P, String> {
        bytemuck::try_pod_read_unaligned(self.params).map_err(|e| {
            format!("parameter block of {} bytes does not fit {}: {e}", self.params.len(), std::any::type_name::<P>())
        })
    }
}

enum Backing {
    Anonymous,
    Shm {
        name: String,
    },
    Memfd(OwnedFd),
    /// A peer's allocation mapped here (through its shm name or its fd).
    Imported,
}

struct Mapping {
    addr: NonNull<c_void>,
    len: usize,
    backing: Backing,
}

// SAFETY: the mapping's address is only an address; access to the memory goes through raw pointers in kernels.
unsafe impl Send for Mapping {}

#[derive(Clone)]
enum Op {
    Launch { name: String, kernel: HostKernel, dims: LaunchDims, params: Vec<u8> },
    Copy { dst: DevicePtr, src: DevicePtr, bytes: usize },
    Set { dst: DevicePtr, value: u8, bytes: usize },
}

/// Handles and tokens count up process-wide, so one host driver never mistakes another's handle for its own.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct HostDriver {
    info: DeviceInfo,
    prefix: String,
    mems: Mutex<HashMap<u64, Mapping>>,
    /// Per stream: `Some(ops)` while capturing.
    streams: Mutex<HashMap<StreamHandle, Option<Vec<Op>>>>,
    /// How many times each stream was adopted and not yet forgotten.
    adopted: Mutex<HashMap<StreamHandle, usize>>,
    events: Mutex<HashMap<EventHandle, Option<Instant>>>,
    modules: Mutex<HashMap<ModuleHandle, &'static [(&'static str, HostKernel)]>>,
    kernels: Mutex<HashMap<KernelHandle, (&'static str, HostKernel)>>,
    graphs: Mutex<HashMap<GraphHandle, Vec<Op>>>,
    launches: Mutex<HashMap<&'static str, u64>>,
    /// Kernels of which not even one block is "resident" ([`UNFIT_KERNELS_VAR`]).
    unfit: Vec<String>,
}

/// Names of kernels (without their dtype suffix, comma-separated) of which the host driver says that not even one
/// block fits, as a GPU says of a kernel with too many registers: so the host driver can test what a program does
/// where a device cannot run some kernel.
pub const UNFIT_KERNELS_VAR: &str = "ARX_HOST_UNFIT_KERNELS";

/// The stems of `stems` (comma-separated, as [`UNFIT_KERNELS_VAR`] holds them) that name no kernel of `libraries`:
/// a misspelt name would otherwise leave every kernel fit and a test that relies on it vacuous.
pub fn unknown_unfit_stems(stems: &str, libraries: &[&KernelLibrary]) -> Vec<String> {
    let known = |stem: &str| {
        let one = [stem.to_string()];
        libraries.iter().flat_map(|l| l.host.iter()).any(|(name, _)| is_unfit(&one, name))
    };
    unfit_stems(stems).filter(|s| !known(s)).map(String::from).collect()
}

/// The stems of [`UNFIT_KERNELS_VAR`]'s comma-separated value.
fn unfit_stems(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').filter(|s| !s.is_empty())
}

/// Whether `kernel` (`{stem}_{dtype}`, or a name without a suffix) is one of the `unfit` stems.
fn is_unfit(unfit: &[String], kernel: &str) -> bool {
    unfit.iter().any(|stem| {
        kernel.strip_prefix(stem.as_str()).is_some_and(|rest| {
            rest.is_empty() || rest.strip_prefix('_').is_some_and(|dtype| !dtype.is_empty() && !dtype.contains('_'))
        })
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn nonzero(bytes: usize) -> Result<NonZeroUsize> {
    NonZeroUsize::new(bytes).ok_or_else(|| GpuError::BadArgs("zero-byte mapping".into()))
}

impl HostDriver {
    pub(crate) fn new(shm_prefix: &str) -> HostDriver {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        HostDriver {
            info: DeviceInfo {
                kind: DriverKind::Host,
                name: format!("host ({cores} cores)"),
                ordinal: 0,
                count: 1,
                arch: "host".into(),
                multiprocessors: cores,
                size_align: 256,
                bus_id: "host".into(),
                driver_version: "host".into(),
            },
            prefix: if shm_prefix.is_empty() { format!("/arx-p{}", std::process::id()) } else { shm_prefix.into() },
            mems: Mutex::default(),
            streams: Mutex::default(),
            adopted: Mutex::default(),
            events: Mutex::default(),
            modules: Mutex::default(),
            kernels: Mutex::default(),
            graphs: Mutex::default(),
            launches: Mutex::default(),
            unfit: unfit_stems(&std::env::var(UNFIT_KERNELS_VAR).unwrap_or_default()).map(String::from).collect(),
        }
    }

    /// A fresh number: one counter for memory tokens, names and handles, so no two objects share one.
    fn next(&self) -> u64 {
        NEXT_ID.fetch_add(1, Ordering::Relaxed)
    }

    /// A fresh handle of any kind.
    fn id<K>(&self) -> Handle<K> {
        Handle::from_raw(self.next())
    }

    fn map_shared(&self, fd: impl AsFd, bytes: usize, backing: Backing) -> Result<RawMem> {
        // SAFETY: a fresh shared mapping of a file we hold open; nothing else aliases it in this process.
        let addr = unsafe {
            mman::mmap(None, nonzero(bytes)?, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED, fd, 0)
        }
        .map_err(|e| GpuError::sys("mmap", e))?;
        Ok(self.insert(Mapping { addr, len: bytes, backing }))
    }

    fn insert(&self, m: Mapping) -> RawMem {
        let token = self.next();
        let raw = RawMem { ptr: DevicePtr(m.addr.as_ptr() as u64), bytes: m.len, token };
        lock(&self.mems).insert(token, m);
        raw
    }

    /// Opens a file for mapping and checks it is ours and large enough.
    fn check_file(fd: &OwnedFd, bytes: usize, what: &str) -> Result<()> {
        let st = fstat(fd).map_err(|e| GpuError::sys("fstat", e))?;
        if st.st_uid != nix::unistd::geteuid().as_raw() {
            return Err(GpuError::BadArgs(format!("{what} belongs to uid {}, not to us", st.st_uid)));
        }
        if (st.st_size as u64) < bytes as u64 {
            return Err(GpuError::BadArgs(format!("{what} holds {} bytes, {bytes} asked for", st.st_size)));
        }
        Ok(())
    }

    fn with_stream<T>(&self, stream: StreamHandle, f: impl FnOnce(&mut Option<Vec<Op>>) -> T) -> Result<T> {
        let mut streams = lock(&self.streams);
        let s =
            streams.get_mut(&stream).ok_or_else(|| GpuError::BadArgs(format!("unknown stream {}", stream.raw())))?;
        Ok(f(s))
    }

    /// Runs `op` now, or appends it to the stream's capture.
    fn submit(&self, stream: StreamHandle, op: Op) -> Result<()> {
        let pending = self.with_stream(stream, |s| match s {
            Some(ops) => {
                ops.push(op);
                None
            }
            None => Some(op),
        })?;
        match pending {
            Some(op) => run(&op),
            None => Ok(()),
        }
    }

    fn not_capturing(&self, stream: StreamHandle, what: &'static str) -> Result<()> {
        if self.capturing(stream)? {
            return Err(GpuError::BadArgs(format!("{what} is not allowed while the stream is capturing")));
        }
        Ok(())
    }
}

fn dup(fd: &OwnedFd) -> Result<OwnedFd> {
    fd.try_clone().map_err(|e| GpuError::Driver {
        call: "dup",
        code: e.raw_os_error().unwrap_or(0) as i64,
        msg: e.to_string(),
    })
}

fn run(op: &Op) -> Result<()> {
    match op {
        Op::Launch { name, kernel, dims, params } => kernel(&HostLaunch { dims: *dims, params })
            .map_err(|fault| GpuError::Kernel { kernel: name.clone(), fault }),
        // SAFETY: device pointers on the host driver are addresses of live mappings; the caller's ranges were
        // sized by it from its own buffers, as with cuMemcpy.
        Op::Copy { dst, src, bytes } => unsafe {
            std::ptr::copy(src.0 as *const u8, dst.0 as *mut u8, *bytes);
            Ok(())
        },
        // SAFETY: as above.
        Op::Set { dst, value, bytes } => unsafe {
            std::ptr::write_bytes(dst.0 as *mut u8, *value, *bytes);
            Ok(())
        },
    }
}

impl Driver for HostDriver {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn memory(&self) -> Result<Option<(u64, u64)>> {
        Ok(None)
    }
    fn launches(&self) -> Option<HashMap<&'static str, u64>> {
        Some(lock(&self.launches).clone())
    }

    fn alloc(&self, bytes: usize, kind: MemKind) -> Result<RawMem> {
        match kind {
            MemKind::Device => {
                // SAFETY: a fresh anonymous mapping.
                let addr = unsafe {
                    mman::mmap_anonymous(
                        None,
                        nonzero(bytes)?,
                        ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                        MapFlags::MAP_PRIVATE,
                    )
                }
                .map_err(|e| GpuError::sys("mmap(anonymous)", e))?;
                Ok(self.insert(Mapping { addr, len: bytes, backing: Backing::Anonymous }))
            }
            MemKind::Ipc { .. } => {
                let name = format!("{}-h{}-{}", self.prefix, std::process::id(), self.next());
                let fd = mman::shm_open(
                    name.as_str(),
                    OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR,
                    Mode::S_IRUSR | Mode::S_IWUSR,
                )
                .map_err(|e| GpuError::sys("shm_open", e))?;
                let mapped = nix::unistd::ftruncate(&fd, bytes as i64)
                    .map_err(|e| GpuError::sys("ftruncate", e))
                    .and_then(|_| self.map_shared(&fd, bytes, Backing::Shm { name: name.clone() }));
                if mapped.is_err() {
                    let _ = mman::shm_unlink(name.as_str());
                }
                mapped
            }
        }
    }

    fn ipc_export(&self, mem: &RawMem) -> Result<Vec<u8>> {
        match &lock(&self.mems).get(&mem.token).map(|m| &m.backing) {
            Some(Backing::Shm { name }) => Ok(name.as_bytes().to_vec()),
            _ => Err(GpuError::BadArgs("ipc_export of memory not allocated with MemKind::Ipc".into())),
        }
    }

    fn ipc_import(&self, handle: &[u8], bytes: usize) -> Result<RawMem> {
        let name = std::str::from_utf8(handle)
            .ok()
            .filter(|n| n.starts_with("/arx-") && !n[1..].contains('/') && n.len() < 250)
            .ok_or_else(|| {
                GpuError::BadArgs(format!("not a host IPC handle: {:?}", String::from_utf8_lossy(handle)))
            })?;
        let fd = mman::shm_open(name, OFlag::O_RDWR, Mode::empty()).map_err(|e| GpuError::sys("shm_open", e))?;
        Self::check_file(&fd, bytes, name)?;
        self.map_shared(&fd, bytes, Backing::Imported)
    }

    fn vmm_create(&self, bytes: usize) -> Result<RawMem> {
        let fd = nix::sys::memfd::memfd_create(c"arx-vmm", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
            .map_err(|e| GpuError::sys("memfd_create", e))?;
        nix::unistd::ftruncate(&fd, bytes as i64).map_err(|e| GpuError::sys("ftruncate", e))?;
        let kept = dup(&fd)?;
        self.map_shared(&fd, bytes, Backing::Memfd(kept))
    }

    fn vmm_export_fd(&self, mem: &RawMem) -> Result<OwnedFd> {
        match lock(&self.mems).get(&mem.token).map(|m| &m.backing) {
            Some(Backing::Memfd(fd)) => dup(fd),
            _ => Err(GpuError::BadArgs("vmm_export_fd of memory not made by vmm_create".into())),
        }
    }

    fn vmm_import_fd(&self, fd: OwnedFd, bytes: usize) -> Result<RawMem> {
        Self::check_file(&fd, bytes, "imported VMM handle")?;
        self.map_shared(&fd, bytes, Backing::Imported)
    }

    fn release(&self, mem: &RawMem) -> Result<()> {
        let m = lock(&self.mems)
            .remove(&mem.token)
            .ok_or_else(|| GpuError::BadArgs(format!("release of unknown allocation {}", mem.token)))?;
        // SAFETY: the mapping was made by this driver with this length and is no longer referenced.
        let unmapped = unsafe { mman::munmap(m.addr, m.len) }.map_err(|e| GpuError::sys("munmap", e));
        if let Backing::Shm { name } = &m.backing {
            mman::shm_unlink(name.as_str()).map_err(|e| GpuError::sys("shm_unlink", e))?;
        }
        unmapped
    }

    fn share_range(&self, ptr: DevicePtr, bytes: usize) -> Result<SharedRange> {
        let mems = lock(&self.mems);
        let holder =
            mems.values().find(|m| (m.addr.as_ptr() as u64..m.addr.as_ptr() as u64 + m.len as u64).contains(&ptr.0));
        let Some(m) = holder else {
            return Err(GpuError::Unsupported(format!(
                "{:#x} is not memory of this host driver, so it cannot be shared with other processes (allocate it \
                 with MemKind::Ipc or vmm_create)",
                ptr.0
            )));
        };
        let base = DevicePtr(m.addr.as_ptr() as u64);
        let offset = offset_in(base, m.len, ptr, bytes)?;
        let handle = match &m.backing {
            Backing::Shm { name } => ShareHandle::Ipc(name.as_bytes().to_vec()),
            Backing::Memfd(fd) => ShareHandle::Vmm(dup(fd)?),
            Backing::Anonymous => return Err(GpuError::Unsupported(PRIVATE_MEMORY.into())),
            Backing::Imported => return Err(GpuError::Unsupported(REIMPORTED_MEMORY.into())),
        };
        Ok(SharedRange { handle, base, alloc_bytes: m.len, offset })
    }

    fn stream_create(&self) -> Result<StreamHandle> {
        let h = self.id();
        lock(&self.streams).insert(h, None);
        Ok(h)
    }
    fn stream_destroy(&self, stream: StreamHandle) -> Result<()> {
        lock(&self.streams).remove(&stream).map(|_| ()).ok_or_else(|| GpuError::BadArgs("unknown stream".into()))
    }
    fn stream_adopt(&self, raw: u64) -> Result<StreamHandle> {
        // Host streams have no existence outside a driver, so only this driver's own can be adopted.
        let h = StreamHandle::from_raw(raw);
        if !lock(&self.streams).contains_key(&h) {
            return Err(GpuError::BadArgs(format!(
                "stream_adopt of {raw}, which is not a live stream of this host driver"
            )));
        }
        *lock(&self.adopted).entry(h).or_default() += 1;
        Ok(h)
    }
    /// Every host-driver rank shares the one "device".
    fn peer_link(&self, _bus_id: &str) -> Result<Option<PeerLink>> {
        Ok(None)
    }

    fn stream_forget(&self, stream: StreamHandle) -> Result<()> {
        forget(&mut lock(&self.adopted), stream)
    }
    fn stream_sync(&self, stream: StreamHandle) -> Result<()> {
        self.not_capturing(stream, "stream_sync")
    }
    fn event_create(&self) -> Result<EventHandle> {
        let h = self.id();
        lock(&self.events).insert(h, None);
        Ok(h)
    }
    fn event_destroy(&self, event: EventHandle) -> Result<()> {
        lock(&self.events).remove(&event).map(|_| ()).ok_or_else(|| GpuError::BadArgs("unknown event".into()))
    }
    fn event_record(&self, event: EventHandle, stream: StreamHandle) -> Result<()> {
        self.not_capturing(stream, "event_record")?;
        let mut events = lock(&self.events);
        let e = events.get_mut(&event).ok_or_else(|| GpuError::BadArgs("unknown event".into()))?;
        *e = Some(Instant::now());
        Ok(())
    }
    fn event_sync(&self, event: EventHandle) -> Result<()> {
        lock(&self.events).get(&event).map(|_| ()).ok_or_else(|| GpuError::BadArgs("unknown event".into()))
    }
    fn event_query(&self, event: EventHandle) -> Result<bool> {
        // A host stream runs its work as it is enqueued: whatever came before a record has completed.
        self.event_sync(event).map(|()| true)
    }
    fn event_elapsed_ms(&self, start: EventHandle, end: EventHandle) -> Result<f32> {
        let events = lock(&self.events);
        match (events.get(&start), events.get(&end)) {
            (Some(Some(a)), Some(Some(b))) => Ok(b.saturating_duration_since(*a).as_secs_f32() * 1e3),
            _ => Err(GpuError::BadArgs("elapsed time of an event that was never recorded".into())),
        }
    }

    fn memcpy_dtod(&self, stream: StreamHandle, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.submit(stream, Op::Copy { dst, src, bytes })
    }
    fn memset_d8(&self, stream: StreamHandle, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        self.submit(stream, Op::Set { dst, value, bytes })
    }
    fn memcpy_htod(&self, stream: StreamHandle, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.not_capturing(stream, "memcpy_htod")?;
        // SAFETY: `dst` was range-checked against its buffer by the caller (Stream::upload).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.0 as *mut u8, src.len()) };
        Ok(())
    }
    fn memcpy_dtoh(&self, stream: StreamHandle, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        self.not_capturing(stream, "memcpy_dtoh")?;
        // SAFETY: as above (Stream::download).
        unsafe { std::ptr::copy_nonoverlapping(src.0 as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn module_load(&self, lib: &KernelLibrary) -> Result<ModuleHandle> {
        let h = self.id();
        lock(&self.modules).insert(h, lib.host);
        Ok(h)
    }
    fn module_unload(&self, module: ModuleHandle) -> Result<()> {
        lock(&self.modules).remove(&module).map(|_| ()).ok_or_else(|| GpuError::BadArgs("unknown module".into()))
    }
    fn kernel(&self, module: ModuleHandle, name: &str) -> Result<KernelHandle> {
        let table = *lock(&self.modules).get(&module).ok_or_else(|| GpuError::BadArgs("unknown module".into()))?;
        let (n, f) = table
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or_else(|| GpuError::BadArgs(format!("kernel {name} has no host implementation")))?;
        let h = self.id();
        lock(&self.kernels).insert(h, (n, *f));
        Ok(h)
    }
    fn max_resident_blocks(&self, kernel: KernelHandle, _block: u32, _shared_bytes: u32) -> Result<usize> {
        let (name, _) = *lock(&self.kernels).get(&kernel).ok_or_else(|| GpuError::BadArgs("unknown kernel".into()))?;
        // A host kernel runs to completion on its caller's thread: every block is "resident".
        Ok(if is_unfit(&self.unfit, name) { 0 } else { usize::MAX })
    }
    fn launch(&self, stream: StreamHandle, kernel: KernelHandle, dims: LaunchDims, params: &[u8]) -> Result<()> {
        let (name, f) = *lock(&self.kernels).get(&kernel).ok_or_else(|| GpuError::BadArgs("unknown kernel".into()))?;
        *lock(&self.launches).entry(name).or_default() += 1;
        self.submit(stream, Op::Launch { name: name.to_string(), kernel: f, dims, params: params.to_vec() })
    }

    fn capture_begin(&self, stream: StreamHandle) -> Result<()> {
        self.with_stream(stream, |s| match s {
            Some(_) => Err(GpuError::BadArgs("stream is already capturing".into())),
            None => {
                *s = Some(Vec::new());
                Ok(())
            }
        })?
    }
    fn capturing(&self, stream: StreamHandle) -> Result<bool> {
        self.with_stream(stream, |s| s.is_some())
    }
    fn capture_end(&self, stream: StreamHandle) -> Result<GraphHandle> {
        let ops = self
            .with_stream(stream, |s| s.take())?
            .ok_or_else(|| GpuError::BadArgs("capture_end on a stream that is not capturing".into()))?;
        let h = self.id();
        lock(&self.graphs).insert(h, ops);
        Ok(h)
    }
    fn graph_launch(&self, graph: GraphHandle, stream: StreamHandle) -> Result<()> {
        self.not_capturing(stream, "graph_launch")?;
        let ops = lock(&self.graphs).get(&graph).cloned().ok_or_else(|| GpuError::BadArgs("unknown graph".into()))?;
        ops.iter().try_for_each(run)
    }
    fn graph_destroy(&self, graph: GraphHandle) -> Result<()> {
        lock(&self.graphs).remove(&graph).map(|_| ()).ok_or_else(|| GpuError::BadArgs("unknown graph".into()))
    }
}

impl Drop for HostDriver {
    fn drop(&mut self) {
        for (_, m) in lock(&self.mems).drain() {
            // SAFETY: as in release; the driver is going away, so nothing uses its mappings any more.
            let _ = unsafe { mman::munmap(m.addr, m.len) };
            if let Backing::Shm { name } = &m.backing {
                let _ = mman::shm_unlink(name.as_str());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        open, Backend, DevicePtr, DriverOptions, GpuError, KernelFault, KernelLibrary, LaunchDims, MemKind, ShareHandle,
    };
    use std::os::fd::AsRawFd;

    fn host() -> crate::Gpu {
        let prefix = format!("/arx-test{}", std::process::id());
        open(Backend::Host, &DriverOptions { device: None, local_rank: None, shm_prefix: prefix }).unwrap().gpu
    }

    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C)]
    struct AddOne {
        ptr: u64,
        n: u64,
    }

    fn add_one(l: &crate::HostLaunch<'_>) -> Result<(), KernelFault> {
        let p: AddOne = l.params()?;
        // SAFETY: the test passes a live buffer of n bytes.
        let s = unsafe { std::slice::from_raw_parts_mut(p.ptr as *mut u8, p.n as usize) };
        s.iter_mut().for_each(|b| *b = b.wrapping_add(1));
        Ok(())
    }

    static LIB: KernelLibrary = KernelLibrary { name: "test", source: "", headers: &[], host: &[("add_one", add_one)] };

    #[test]
    fn unfit_stems_that_name_no_kernel_are_found() {
        assert_eq!(super::unknown_unfit_stems("add_one,,add_on,add_one_x", &[&LIB]), ["add_on", "add_one_x"]);
        assert!(super::unknown_unfit_stems("", &[&LIB]).is_empty());
    }

    #[test]
    fn unfit_kernels_are_named_by_their_stem() {
        let unfit = ["symm_zc_2shot_norm".to_string(), "car_barrier_only".to_string()];
        for (kernel, want) in [
            ("symm_zc_2shot_norm_bf16", true),
            ("symm_zc_2shot_norm", true),
            ("car_barrier_only", true),
            ("symm_zc_2shot_norm_table_bf16", false),
            ("symm_zc_2shot_bf16", false),
            ("symm_zc_2shot_norm_", false),
        ] {
            assert_eq!(super::is_unfit(&unfit, kernel), want, "{kernel}");
        }
    }

    #[test]
    fn copy_set_launch_and_graph_replay() {
        let gpu = host();
        let s = gpu.stream().unwrap();
        let a = gpu.alloc(4096, MemKind::Device).unwrap();
        let b = gpu.alloc(4096, MemKind::Device).unwrap();
        let data: Vec<u8> = (0..4096).map(|_| rand::random()).collect();
        s.upload(&a, 0, &data).unwrap();
        // SAFETY: the test's own buffers and kernels, sized for the call.
        unsafe { s.copy(b.ptr(), a.ptr(), 4096) }.unwrap();
        let module = gpu.load(&LIB).unwrap();
        let k = module.kernel("add_one").unwrap();
        let dims = LaunchDims { grid: 1, block: 1, shared_bytes: 0 };
        let params = AddOne { ptr: b.ptr().0, n: 4096 };
        s.begin_capture().unwrap();
        // SAFETY: the test's own buffers and kernels, sized for the call.
        unsafe { s.launch(&k, dims, &params) }.unwrap();
        // SAFETY: the test's own buffers and kernels, sized for the call.
        unsafe { s.launch(&k, dims, &params) }.unwrap();
        let g = s.end_capture().unwrap();
        let mut out = vec![0u8; 4096];
        s.download(&b, 0, &mut out).unwrap();
        assert_eq!(out, data, "captured work must not run before replay");
        s.replay(&g).unwrap();
        s.replay(&g).unwrap();
        s.download(&b, 0, &mut out).unwrap();
        let want: Vec<u8> = data.iter().map(|x| x.wrapping_add(4)).collect();
        assert_eq!(out, want);
        // Launches are counted as enqueued: a captured one once, however often it is replayed.
        assert_eq!(gpu.launches().unwrap().get("add_one"), Some(&2));
        // A host stream has run whatever came before an event's record.
        let e = gpu.event().unwrap();
        s.record(&e).unwrap();
        assert!(e.query().unwrap());
        // SAFETY: the test's own buffers and kernels, sized for the call.
        unsafe { s.memset(b.ptr(), 7, 4096) }.unwrap();
        s.download(&b, 0, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 7));
        assert!(module.kernel("missing").is_err());
        assert!(s.download(&b, 1, &mut out).is_err(), "overrun must be refused");
        // A kernel keeps its module: it still launches once the module it came from is dropped.
        let kept = gpu.load(&LIB).unwrap().kernel("add_one").unwrap();
        drop(module);
        // SAFETY: the test's own buffer, sized for the call.
        unsafe { s.launch(&kept, dims, &params) }.unwrap();
        s.download(&b, 0, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 8));
    }

    #[test]
    fn ipc_and_vmm_mappings_alias_and_are_released() {
        let gpu = host();
        let s = gpu.stream().unwrap();
        let a = gpu.alloc(8192, MemKind::Ipc { uncached: true }).unwrap();
        let handle = gpu.ipc_export(&a).unwrap();
        let name = String::from_utf8(handle.clone()).unwrap();
        assert!(std::path::Path::new(&format!("/dev/shm{name}")).exists());
        let mapped = gpu.ipc_import(&handle, 8192).unwrap();
        s.upload(&mapped, 100, b"hello").unwrap();
        let mut got = [0u8; 5];
        s.download(&a, 100, &mut got).unwrap();
        assert_eq!(&got, b"hello");
        assert!(gpu.ipc_import(&handle, 1 << 20).is_err(), "import larger than the segment must fail");
        assert!(gpu.ipc_import(b"/etc/passwd", 8).is_err());
        drop(mapped);
        drop(a);
        assert!(!std::path::Path::new(&format!("/dev/shm{name}")).exists(), "segment must be unlinked on free");

        let v = gpu.vmm_create(4096).unwrap();
        let fd = gpu.vmm_export_fd(&v).unwrap();
        assert!(fd.as_raw_fd() >= 0);
        let w = gpu.vmm_import_fd(fd, 4096).unwrap();
        s.upload(&v, 0, b"xyz").unwrap();
        let mut got = [0u8; 3];
        s.download(&w, 0, &mut got).unwrap();
        assert_eq!(&got, b"xyz");
        assert!(gpu.ipc_export(&v).is_err());
    }

    #[test]
    fn events_time_and_capture_refuses_sync() {
        let gpu = host();
        let s = gpu.stream().unwrap();
        let (e0, e1) = (gpu.event().unwrap(), gpu.event().unwrap());
        assert!(e0.elapsed_ms(&e1).is_err(), "unrecorded events have no elapsed time");
        s.record(&e0).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        s.record(&e1).unwrap();
        assert!(e0.elapsed_ms(&e1).unwrap() >= 1.5);
        assert!(!s.is_capturing().unwrap());
        s.begin_capture().unwrap();
        assert!(s.is_capturing().unwrap());
        assert!(s.sync().is_err());
        assert!(s.begin_capture().is_err());
        s.end_capture().unwrap();
        assert!(!s.is_capturing().unwrap());
        assert!(s.end_capture().is_err());
    }

    #[test]
    fn bus_id_names_the_one_shared_device() {
        assert_eq!(host().info().bus_id, "host");
    }

    #[test]
    fn borrowed_streams_are_found_again_by_handle_and_forgotten_on_request() {
        let gpu = host();
        let (one, two) = (gpu.stream().unwrap(), gpu.stream().unwrap());
        let mut seen = crate::BorrowedStreams::default();
        // SAFETY: both are live streams of this driver and outlive `seen`.
        let (a, b, a_again) = unsafe {
            (
                seen.position(&gpu, one.handle()).unwrap(),
                seen.position(&gpu, two.handle()).unwrap(),
                seen.position(&gpu, one.handle()).unwrap(),
            )
        };
        assert_eq!((a, b, a_again), (0, 1, 0));
        assert_eq!((seen[a].handle(), seen[b].handle()), (one.handle(), two.handle()));
        seen.forget(one.handle());
        assert_eq!(seen[0].handle(), two.handle());
        // SAFETY: as above.
        assert_eq!(unsafe { seen.position(&gpu, one.handle()) }.unwrap(), 1, "borrowed afresh");
        // SAFETY: not a stream: the host driver refuses it without using it.
        assert!(unsafe { seen.position(&gpu, u64::MAX) }.is_err());
    }

    #[test]
    fn borrowed_streams_run_work_and_are_only_forgotten_on_drop() {
        let gpu = host();
        let own = gpu.stream().unwrap();
        let buf = gpu.alloc(4096, MemKind::Device).unwrap();
        // SAFETY: `own` is a live stream of this driver and outlives both borrows.
        let (a, b) = unsafe { (gpu.borrow_stream(own.handle()).unwrap(), gpu.borrow_stream(own.handle()).unwrap()) };
        assert_eq!(a.handle(), own.handle());
        // SAFETY: the test's own buffers and kernels, sized for the call.
        unsafe { a.memset(buf.ptr(), 3, 4096) }.unwrap();
        a.sync().unwrap();
        let mut out = vec![0u8; 4096];
        own.download(&buf, 0, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 3));
        drop(a);
        // SAFETY: the test's own buffers and kernels, sized for the call.
        unsafe { b.memset(buf.ptr(), 4, 16) }.unwrap();
        drop(b);
        // SAFETY: the test's own buffers and kernels, sized for the call.
        unsafe { own.memset(buf.ptr(), 9, 4096) }.unwrap();
        own.download(&buf, 0, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 9), "the original stream must outlive its borrows");
        assert!(
            matches!(gpu.0.stream_forget(crate::StreamHandle::from_raw(own.handle())), Err(GpuError::BadArgs(_))),
            "nothing left to forget"
        );
        // SAFETY: the handles are not streams; the host driver refuses them without using them.
        unsafe {
            assert!(matches!(gpu.borrow_stream(u64::MAX), Err(GpuError::BadArgs(_))));
            assert!(matches!(gpu.borrow_stream(0), Err(GpuError::BadArgs(_))));
        }
        let other = host();
        let theirs = other.stream().unwrap();
        // SAFETY: as above: a stream of another driver instance is refused, not used.
        assert!(unsafe { gpu.borrow_stream(theirs.handle()) }.is_err());
    }

    #[test]
    fn share_range_exports_ipc_and_vmm_allocations_at_an_offset() {
        let (gpu, peer) = (host(), host());
        let s = gpu.stream().unwrap();
        let ps = peer.stream().unwrap();
        let data: Vec<u8> = (0..3000).map(|_| rand::random()).collect();
        let ipc = gpu.alloc(16384, MemKind::Ipc { uncached: false }).unwrap();
        let vmm = gpu.vmm_create(16384).unwrap();
        for (buf, offset) in [(&ipc, 4096), (&vmm, 1234)] {
            s.upload(buf, offset, &data).unwrap();
            let r = gpu.share_range(buf.ptr().offset(offset), data.len()).unwrap();
            assert_eq!((r.base, r.alloc_bytes, r.offset), (buf.ptr(), buf.bytes(), offset));
            let mapped = match r.handle {
                ShareHandle::Ipc(h) => {
                    assert!(std::ptr::eq(buf, &ipc));
                    peer.ipc_import(&h, r.alloc_bytes).unwrap()
                }
                ShareHandle::Vmm(fd) => {
                    assert!(std::ptr::eq(buf, &vmm));
                    peer.vmm_import_fd(fd, r.alloc_bytes).unwrap()
                }
            };
            let mut got = vec![0u8; data.len()];
            ps.download(&mapped, r.offset, &mut got).unwrap();
            assert_eq!(got, data, "the peer sees the bytes written at base + offset");
        }
        let whole = gpu.share_range(ipc.ptr(), 16384).unwrap();
        assert_eq!(whole.offset, 0);
        for (ptr, bytes) in [(ipc.ptr().offset(4096), 16384 - 4095), (vmm.ptr().offset(16383), 2)] {
            match gpu.share_range(ptr, bytes) {
                Err(GpuError::BadArgs(msg)) => assert!(msg.contains("overrun"), "{msg}"),
                other => panic!("a range past the end must be BadArgs, got {other:?}"),
            }
        }
        assert!(matches!(gpu.share_range(ipc.ptr(), 0), Err(GpuError::BadArgs(_))));
    }

    #[test]
    fn share_range_refuses_private_and_foreign_memory_plainly() {
        let gpu = host();
        let private = gpu.alloc(4096, MemKind::Device).unwrap();
        let stack = [0u8; 64];
        for (ptr, bytes) in [(private.ptr().offset(8), 8), (DevicePtr(stack.as_ptr() as u64), stack.len())] {
            match gpu.share_range(ptr, bytes) {
                Err(GpuError::Unsupported(msg)) => {
                    assert!(msg.contains("cannot be shared with other processes"), "{msg}");
                    assert!(msg.contains("MemKind::Ipc or vmm_create"), "{msg}");
                }
                other => panic!("expected Unsupported, got {other:?}"),
            }
        }
        let ipc = gpu.alloc(4096, MemKind::Ipc { uncached: false }).unwrap();
        let name = gpu.ipc_export(&ipc).unwrap();
        let mapped = gpu.ipc_import(&name, 4096).unwrap();
        assert!(matches!(gpu.share_range(mapped.ptr(), 8), Err(GpuError::Unsupported(_))), "imports are not re-shared");
    }
}
