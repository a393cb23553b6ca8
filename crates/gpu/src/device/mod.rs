//! The one driver core of CUDA and HIP: handle bookkeeping, the kernel cache and run-time compilation, module
//! handling, VMM mapping with its rollback, IPC, and every [`Driver`] method, written once over a vendor's
//! [`Raw`] calls. A vendor module says only what differs: how its libraries load, its calls and error codes, and
//! its memory attributes.

mod live;
pub(crate) mod raw;
mod rtc;

use crate::{
    forget, kernel_cache, offset_in, DeviceInfo, DevicePtr, Driver, EventHandle, GpuError, GraphHandle, KernelHandle,
    KernelLibrary, LaunchDims, MemKind, ModuleHandle, PeerLink, RawMem, Result, ShareHandle, SharedRange, StreamHandle,
    PRIVATE_MEMORY, REIMPORTED_MEMORY,
};
use live::{Live, Mem, MemEntry};
use raw::{Direction, Raw};
use std::ffi::{c_int, c_void, CString};
use std::os::fd::{FromRawFd, OwnedFd};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// The largest by-value parameter struct a launch accepts (the classic kernel-parameter limit).
const MAX_PARAM_BYTES: usize = 4096;

pub(crate) fn bad(msg: impl Into<String>) -> GpuError {
    GpuError::BadArgs(msg.into())
}

pub(crate) fn unsupported(msg: impl Into<String>) -> GpuError {
    GpuError::Unsupported(msg.into())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The first error of steps that were all tried.
fn first_error(steps: impl IntoIterator<Item = Result<()>>) -> Result<()> {
    steps.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
}

/// The `kernelParams` array of a launch. The kernels take one by-value struct, so it has one entry, pointing at
/// the struct's bytes; the driver copies them (the size comes from the kernel's metadata) at launch or capture.
fn kernel_args(params: &[u8]) -> Result<[*mut c_void; 1]> {
    if params.len() > MAX_PARAM_BYTES {
        return Err(bad(format!("kernel parameter struct of {} bytes (at most {MAX_PARAM_BYTES})", params.len())));
    }
    Ok([params.as_ptr() as *mut c_void])
}

/// The descriptor a driver call `call` wrote, owned; a negative one is that call's failure.
///
/// # Safety
/// `fd`, unless negative, is a new descriptor that nothing else owns.
pub(crate) unsafe fn owned_fd(call: &'static str, fd: c_int) -> Result<OwnedFd> {
    if fd < 0 {
        return Err(GpuError::Driver { call, code: 0, msg: format!("fd {fd}") });
    }
    // SAFETY: as the caller vouches.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A GPU driver: the vendor's raw calls and what is alive.
pub(crate) struct Device<R: Raw> {
    raw: R,
    next: AtomicU64,
    live: Mutex<Live>,
}

impl<R: Raw> Device<R> {
    /// Takes over an opened device and makes it current on this thread.
    pub(crate) fn new(raw: R) -> Result<Device<R>> {
        raw.make_current()?;
        Ok(Device { raw, next: AtomicU64::new(1), live: Mutex::default() })
    }

    fn not_available(reason: String) -> GpuError {
        GpuError::NotAvailable { backend: R::BACKEND, reason }
    }

    fn insert(&self, ptr: u64, bytes: usize, mem: Mem) -> RawMem {
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.live).mems.insert(token, MemEntry { ptr, mem });
        RawMem { ptr: DevicePtr(ptr), bytes, token }
    }

    /// A live stream, with this device current.
    fn stream(&self, h: StreamHandle) -> Result<u64> {
        self.raw.make_current()?;
        lock(&self.live).stream(h).map(StreamHandle::raw)
    }

    /// Reserves an address range for `size` bytes of `handle`, maps it and opens it read-write to this device;
    /// undoes what it did on failure.
    fn vmm_map(&self, handle: u64, size: usize) -> Result<u64> {
        let ptr = self.raw.vmm_reserve(size)?;
        // SAFETY: the range was just reserved with this size; the handle is live.
        if let Err(e) = unsafe { self.raw.vmm_map(ptr, size, handle) } {
            // SAFETY: as above; nothing is mapped in it.
            let _ = unsafe { self.raw.vmm_address_free(ptr, size) };
            return Err(e);
        }
        // SAFETY: the range is mapped.
        if let Err(e) = unsafe { self.raw.vmm_set_access(ptr, size) } {
            // SAFETY: undoes the mapping and reservation made above.
            unsafe {
                let _ = self.raw.vmm_unmap(ptr, size);
                let _ = self.raw.vmm_address_free(ptr, size);
            }
            return Err(e);
        }
        Ok(ptr)
    }

    /// Maps a VMM allocation just created or imported, releasing it if the mapping fails.
    fn vmm_adopt(&self, handle: u64, size: usize, bytes: usize) -> Result<RawMem> {
        match self.vmm_map(handle, size) {
            Ok(ptr) => Ok(self.insert(ptr, bytes, Mem::Vmm { handle, mapped: size })),
            Err(e) => {
                // SAFETY: the handle was just made and is mapped nowhere.
                let _ = unsafe { self.raw.vmm_release(handle) };
                Err(e)
            }
        }
    }

    /// Undoes whatever `entry` is; tries every step and reports the first failure.
    fn free(&self, entry: &MemEntry) -> Result<()> {
        // SAFETY: the entry was just taken out of the live set, so what it holds is undone once.
        unsafe {
            match entry.mem {
                Mem::Alloc { .. } => self.raw.free(entry.ptr),
                Mem::IpcMapped => self.raw.ipc_close(entry.ptr),
                Mem::Vmm { handle, mapped } => first_error([
                    self.raw.vmm_unmap(entry.ptr, mapped),
                    self.raw.vmm_address_free(entry.ptr, mapped),
                    self.raw.vmm_release(handle),
                ]),
            }
        }
    }

    fn load_image(&self, image: &[u8]) -> Result<ModuleHandle> {
        let words = rtc::aligned(image);
        // SAFETY: an aligned, terminated copy of the image that outlives the call.
        let module = ModuleHandle::from_raw(unsafe { self.raw.module_load(words.as_ptr() as *const c_void)? });
        lock(&self.live).modules.insert(module);
        Ok(module)
    }
}

impl<R: Raw> Driver for Device<R> {
    fn info(&self) -> &DeviceInfo {
        self.raw.info()
    }

    fn memory(&self) -> Result<Option<(u64, u64)>> {
        self.raw.make_current()?;
        self.raw.mem_info().map(Some)
    }

    fn alloc(&self, bytes: usize, kind: MemKind) -> Result<RawMem> {
        self.raw.make_current()?;
        let size = match kind {
            MemKind::Ipc { .. } => self.raw.shared_size(bytes)?,
            MemKind::Device => bytes.max(1),
        };
        let ptr = self.raw.malloc(size, kind)?;
        Ok(self.insert(ptr, bytes, Mem::Alloc { ipc: matches!(kind, MemKind::Ipc { .. }) }))
    }

    fn ipc_export(&self, mem: &RawMem) -> Result<Vec<u8>> {
        self.raw.make_current()?;
        let ptr = match lock(&self.live).mems.get(&mem.token) {
            Some(MemEntry { ptr, mem: Mem::Alloc { ipc: true } }) => *ptr,
            _ => return Err(bad("ipc_export of memory not allocated with MemKind::Ipc")),
        };
        // SAFETY: the start of an exportable allocation of ours.
        unsafe { self.raw.ipc_handle(ptr) }
    }

    fn ipc_import(&self, handle: &[u8], bytes: usize) -> Result<RawMem> {
        self.raw.make_current()?;
        let ptr = self.raw.ipc_open(handle)?;
        let fits = match self.raw.address_range(ptr) {
            Ok((base, size)) => {
                let held = (base + size as u64).saturating_sub(ptr);
                if held < bytes as u64 {
                    Err(bad(format!("IPC allocation holds {held} bytes, {bytes} asked for")))
                } else {
                    Ok(())
                }
            }
            Err(e) if R::IPC_RANGE_REQUIRED => Err(e),
            Err(_) => Ok(()),
        };
        if let Err(e) = fits {
            // SAFETY: closes the mapping just opened.
            let _ = unsafe { self.raw.ipc_close(ptr) };
            return Err(e);
        }
        Ok(self.insert(ptr, bytes, Mem::IpcMapped))
    }

    fn vmm_create(&self, bytes: usize) -> Result<RawMem> {
        self.raw.vmm_supported()?;
        self.raw.make_current()?;
        let size = self.raw.shared_size(bytes)?;
        let handle = self.raw.vmm_create(size)?;
        self.vmm_adopt(handle, size, bytes)
    }

    fn vmm_export_fd(&self, mem: &RawMem) -> Result<OwnedFd> {
        self.raw.make_current()?;
        let handle = match lock(&self.live).mems.get(&mem.token) {
            Some(MemEntry { mem: Mem::Vmm { handle, .. }, .. }) => *handle,
            _ => return Err(bad("vmm_export_fd of memory not made by vmm_create")),
        };
        // SAFETY: a live VMM handle of ours.
        unsafe { self.raw.vmm_export(handle) }
    }

    fn vmm_import_fd(&self, fd: OwnedFd, bytes: usize) -> Result<RawMem> {
        self.raw.vmm_supported()?;
        self.raw.make_current()?;
        let size = self.raw.shared_size(bytes)?;
        let handle = self.raw.vmm_import(&fd)?;
        // The imported handle keeps the allocation alive; the descriptor is no longer needed.
        drop(fd);
        self.vmm_adopt(handle, size, bytes)
    }

    fn release(&self, mem: &RawMem) -> Result<()> {
        self.raw.make_current()?;
        let entry = lock(&self.live)
            .mems
            .remove(&mem.token)
            .ok_or_else(|| bad(format!("release of unknown allocation {}", mem.token)))?;
        self.free(&entry)
    }

    fn share_range(&self, ptr: DevicePtr, bytes: usize) -> Result<SharedRange> {
        self.raw.make_current()?;
        // For VMM memory the range is the one mapping (one VMM allocation) that holds the address.
        let (base, size) = self.raw.address_range(ptr.0).map_err(|e| {
            unsupported(format!("{:#x} is not device memory of this device, so it cannot be shared ({e})", ptr.0))
        })?;
        let offset = offset_in(DevicePtr(base), size, ptr, bytes)?;
        let own = lock(&self.live).mems.values().find(|e| e.ptr == base).map(|e| e.mem);
        let handle = match own {
            // SAFETY: the start of an exportable allocation of ours.
            Some(Mem::Alloc { ipc: true }) => ShareHandle::Ipc(unsafe { self.raw.ipc_handle(base)? }),
            Some(Mem::Alloc { ipc: false }) => return Err(unsupported(PRIVATE_MEMORY)),
            Some(Mem::IpcMapped) => return Err(unsupported(REIMPORTED_MEMORY)),
            // SAFETY: a live VMM handle of ours.
            Some(Mem::Vmm { handle, .. }) => ShareHandle::Vmm(unsafe { self.raw.vmm_export(handle)? }),
            None => self.raw.share_foreign(base)?,
        };
        Ok(SharedRange { handle, base: DevicePtr(base), alloc_bytes: size, offset })
    }

    fn stream_create(&self) -> Result<StreamHandle> {
        self.raw.make_current()?;
        let s = StreamHandle::from_raw(self.raw.stream_create()?);
        lock(&self.live).streams.insert(s);
        Ok(s)
    }
    fn stream_destroy(&self, stream: StreamHandle) -> Result<()> {
        self.raw.make_current()?;
        if !lock(&self.live).streams.remove(&stream) {
            return Err(bad(format!("unknown stream {stream:#x}")));
        }
        // SAFETY: a live stream of ours, destroyed once.
        unsafe { self.raw.stream_destroy(stream.raw()) }
    }
    fn stream_adopt(&self, raw: u64) -> Result<StreamHandle> {
        self.raw.make_current()?;
        // SAFETY: the caller vouches (Gpu::borrow_stream) that `raw` is a live stream.
        unsafe { self.raw.stream_check_owner(raw)? };
        let h = StreamHandle::from_raw(raw);
        *lock(&self.live).adopted.entry(h).or_default() += 1;
        Ok(h)
    }
    fn peer_link(&self, bus_id: &str) -> Result<Option<PeerLink>> {
        if bus_id.eq_ignore_ascii_case(&self.info().bus_id) {
            return Ok(None);
        }
        let c_bus = CString::new(bus_id).map_err(|_| bad(format!("bus id {bus_id:?} holds a NUL byte")))?;
        // A device this process cannot see is not an error: the driver cannot say.
        match self.raw.device_by_bus_id(&c_bus) {
            Some(peer) => self.raw.peer_link(peer).map(Some),
            None => Ok(None),
        }
    }

    fn stream_forget(&self, stream: StreamHandle) -> Result<()> {
        forget(&mut lock(&self.live).adopted, stream)
    }
    fn stream_sync(&self, stream: StreamHandle) -> Result<()> {
        let s = self.stream(stream)?;
        // SAFETY: a live stream.
        unsafe { self.raw.stream_sync(s) }
    }
    fn event_create(&self) -> Result<EventHandle> {
        self.raw.make_current()?;
        let e = EventHandle::from_raw(self.raw.event_create()?);
        lock(&self.live).events.insert(e);
        Ok(e)
    }
    fn event_destroy(&self, event: EventHandle) -> Result<()> {
        self.raw.make_current()?;
        if !lock(&self.live).events.remove(&event) {
            return Err(bad(format!("unknown event {event:#x}")));
        }
        // SAFETY: a live event of ours, destroyed once.
        unsafe { self.raw.event_destroy(event.raw()) }
    }
    fn event_record(&self, event: EventHandle, stream: StreamHandle) -> Result<()> {
        let s = self.stream(stream)?;
        let e = lock(&self.live).event(event)?.raw();
        // SAFETY: a live event and stream.
        unsafe { self.raw.event_record(e, s) }
    }
    fn event_sync(&self, event: EventHandle) -> Result<()> {
        self.raw.make_current()?;
        let e = lock(&self.live).event(event)?.raw();
        // SAFETY: a live event.
        unsafe { self.raw.event_sync(e) }
    }
    fn event_query(&self, event: EventHandle) -> Result<bool> {
        self.raw.make_current()?;
        let e = lock(&self.live).event(event)?.raw();
        // SAFETY: a live event.
        unsafe { self.raw.event_query(e) }
    }
    fn event_elapsed_ms(&self, start: EventHandle, end: EventHandle) -> Result<f32> {
        self.raw.make_current()?;
        let (a, b) = {
            let live = lock(&self.live);
            (live.event(start)?.raw(), live.event(end)?.raw())
        };
        // SAFETY: two live events.
        unsafe { self.raw.event_elapsed_ms(a, b) }
    }

    fn memcpy_dtod(&self, stream: StreamHandle, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        let s = self.stream(stream)?;
        // SAFETY: device addresses; the driver checks them, and the callers size ranges from their buffers.
        unsafe { self.raw.copy(s, Direction::DeviceToDevice, dst.0, src.0, bytes) }
    }
    fn memset_d8(&self, stream: StreamHandle, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        let s = self.stream(stream)?;
        // SAFETY: as above.
        unsafe { self.raw.memset_d8(s, dst.0, value, bytes) }
    }
    fn memcpy_htod(&self, stream: StreamHandle, dst: DevicePtr, src: &[u8]) -> Result<()> {
        let s = self.stream(stream)?;
        // SAFETY: `src` is borrowed until the stream is synchronised below; `dst` was range-checked by the caller.
        unsafe {
            self.raw.copy(s, Direction::HostToDevice, dst.0, src.as_ptr() as u64, src.len())?;
            self.raw.stream_sync(s)
        }
    }
    fn memcpy_dtoh(&self, stream: StreamHandle, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let s = self.stream(stream)?;
        // SAFETY: `dst` is borrowed mutably until the stream is synchronised below; `src` was range-checked.
        unsafe {
            self.raw.copy(s, Direction::DeviceToHost, dst.as_mut_ptr() as u64, src.0, dst.len())?;
            self.raw.stream_sync(s)
        }
    }

    fn module_load(&self, lib: &KernelLibrary) -> Result<ModuleHandle> {
        self.raw.make_current()?;
        let compiler = self.raw.compiler().map_err(|why| {
            Self::not_available(format!("{} is needed to compile kernel library {}: {why}", R::COMPILER, lib.name))
        })?;
        let target = self.raw.compile_target(compiler)?;
        let path = kernel_cache::image_path(lib, &target.cache_arch, target.ext, &target.options, &target.compiler);
        if let Some(image) = path.as_deref().and_then(|p| std::fs::read(p).ok()) {
            // A cached image the driver refuses (corrupt, or from another driver) is recompiled and replaced.
            if let Ok(module) = self.load_image(&image) {
                return Ok(module);
            }
        }
        let image = rtc::compile(compiler, lib, &target)?;
        if let Some(p) = &path {
            kernel_cache::store(p, &image);
        }
        self.load_image(&image)
    }
    fn module_unload(&self, module: ModuleHandle) -> Result<()> {
        self.raw.make_current()?;
        {
            let mut live = lock(&self.live);
            if !live.modules.remove(&module) {
                return Err(bad(format!("unknown module {module:#x}")));
            }
            live.kernels.retain(|_, m| *m != module);
        }
        // SAFETY: a live module of ours, unloaded once; its functions were dropped from the live set above.
        unsafe { self.raw.module_unload(module.raw()) }
    }
    fn kernel(&self, module: ModuleHandle, name: &str) -> Result<KernelHandle> {
        self.raw.make_current()?;
        let m = lock(&self.live).module(module)?.raw();
        let cname = CString::new(name).map_err(|_| bad(format!("kernel name {name:?} contains a NUL byte")))?;
        // SAFETY: a live module.
        let f = KernelHandle::from_raw(unsafe { self.raw.function(m, &cname)? });
        lock(&self.live).kernels.insert(f, module);
        Ok(f)
    }
    fn max_resident_blocks(&self, kernel: KernelHandle, block: u32, shared_bytes: u32) -> Result<usize> {
        self.raw.make_current()?;
        let f = lock(&self.live).function(kernel)?.raw();
        // SAFETY: a live function.
        let per_unit = unsafe { self.raw.occupancy(f, block, shared_bytes)? };
        Ok(per_unit * self.info().multiprocessors)
    }
    fn launch(&self, stream: StreamHandle, kernel: KernelHandle, dims: LaunchDims, params: &[u8]) -> Result<()> {
        let mut args = kernel_args(params)?;
        let s = self.stream(stream)?;
        let f = lock(&self.live).function(kernel)?.raw();
        let args = if params.is_empty() { null_mut() } else { args.as_mut_ptr() };
        // SAFETY: a live function and stream; `args` and the bytes it points at outlive the call.
        unsafe { self.raw.launch(f, dims, s, args) }
    }

    fn capture_begin(&self, stream: StreamHandle) -> Result<()> {
        let s = self.stream(stream)?;
        // SAFETY: a live stream.
        unsafe { self.raw.capture_begin(s) }
    }
    fn capturing(&self, stream: StreamHandle) -> Result<bool> {
        let s = self.stream(stream)?;
        // SAFETY: a live stream.
        unsafe { self.raw.capturing(s) }
    }
    fn capture_end(&self, stream: StreamHandle) -> Result<GraphHandle> {
        let s = self.stream(stream)?;
        // SAFETY: a live stream; then the graph just captured, ours and used nowhere else.
        let exec = unsafe {
            let graph = self.raw.capture_end(s)?;
            match self.raw.graph_instantiate(graph) {
                Ok(exec) => (exec, graph),
                Err(e) => {
                    let _ = self.raw.graph_destroy(graph);
                    return Err(e);
                }
            }
        };
        let exec_handle = GraphHandle::from_raw(exec.0);
        lock(&self.live).graphs.insert(exec_handle, exec.1);
        Ok(exec_handle)
    }
    fn graph_launch(&self, graph: GraphHandle, stream: StreamHandle) -> Result<()> {
        let s = self.stream(stream)?;
        let g = lock(&self.live).graph(graph)?.raw();
        // SAFETY: a live executable graph and stream.
        unsafe { self.raw.graph_launch(g, s) }
    }
    fn graph_destroy(&self, graph: GraphHandle) -> Result<()> {
        self.raw.make_current()?;
        let g = lock(&self.live).graphs.remove(&graph).ok_or_else(|| bad(format!("unknown graph {graph:#x}")))?;
        // SAFETY: the executable graph and its graph are ours, destroyed once.
        unsafe { first_error([self.raw.graph_exec_destroy(graph.raw()), self.raw.graph_destroy(g)]) }
    }
}

impl<R: Raw> Drop for Device<R> {
    fn drop(&mut self) {
        // The RAII wrappers hold the driver, so normally nothing is left here; whatever is, is released once.
        if self.raw.make_current().is_err() {
            return;
        }
        let live = std::mem::take(&mut *lock(&self.live));
        // SAFETY: every handle below is live and ours; each is taken out of the live set, so it is undone once.
        unsafe {
            for (exec, graph) in live.graphs {
                let _ = self.raw.graph_exec_destroy(exec.raw());
                let _ = self.raw.graph_destroy(graph);
            }
            for e in live.events {
                let _ = self.raw.event_destroy(e.raw());
            }
            // Streams that were only adopted (`live.adopted`) belong to the caller and are left alone.
            for s in live.streams {
                let _ = self.raw.stream_destroy(s.raw());
            }
            for m in live.modules {
                let _ = self.raw.module_unload(m.raw());
            }
        }
        for entry in live.mems.values() {
            let _ = self.free(entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_packs_one_pointer_to_the_param_struct() {
        #[repr(C)]
        #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
        struct P {
            bufs: [u64; 8],
            count: u64,
            rank: u32,
            world: u32,
        }
        let p = P { bufs: [7; 8], count: 1 << 20, rank: 3, world: 8 };
        let bytes = bytemuck::bytes_of(&p);
        let args = kernel_args(bytes).unwrap();
        assert_eq!(args[0] as *const u8, bytes.as_ptr());
        // What the driver reads through the one entry is the struct itself.
        // SAFETY: args[0] points at `bytes`, a live `P`.
        let back: P = unsafe { std::ptr::read_unaligned(args[0] as *const P) };
        assert_eq!(bytemuck::bytes_of(&back), bytes);
        assert!(kernel_args(&[0u8; MAX_PARAM_BYTES]).is_ok());
        assert!(matches!(kernel_args(&[0u8; MAX_PARAM_BYTES + 1]), Err(GpuError::BadArgs(_))));
    }

    #[test]
    fn images_are_copied_aligned_and_terminated() {
        let words = rtc::aligned(b"12345678");
        assert_eq!(words.len(), 2, "a whole spare zero word");
        assert_eq!(bytemuck::cast_slice::<u64, u8>(&words)[..8], *b"12345678");
        assert_eq!(words[1], 0);
    }
}
