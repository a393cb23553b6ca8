//! The HIP runtime's calls for the shared core ([`crate::device`]), and what only HIP has: uncached IPC memory
//! (`hipExtMallocWithFlags`), the VMM-support check, the 2 MiB share unit, the device check of adopted streams,
//! the descriptor convention of each ROCm release, and the VMM query before a foreign allocation is retained.

use super::sys;
use super::{device_location, fd_passed_by_value, round_up, vmm_prop, vmm_query_works, Hip, NO_VMM};
use crate::device::raw::{CompileTarget, Direction, Raw};
use crate::device::{bad, owned_fd, unsupported};
use crate::{DeviceInfo, LaunchDims, MemKind, PeerLink, Result, ShareHandle};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::null_mut;

impl Hip {
    fn ck(&self, call: &'static str, status: sys::hipError_t) -> Result<()> {
        self.rt.ck(call, status)
    }

    fn api(&self) -> &sys::HipApi {
        &self.rt.api
    }

    /// Whether `ptr` lies in a VMM mapping (hipMemMap) this device can access.
    fn vmm_mapped(&self, ptr: *mut c_void) -> bool {
        if !vmm_query_works(self.rt.version) {
            return false;
        }
        let mut flags = 0u64;
        let location = device_location(self.ordinal);
        // SAFETY: writes one flag word; the runtime looks the address up among its VMM mappings and fails for any
        // other address. Only the choice of export path depends on the answer.
        unsafe { (self.api().hipMemGetAccess)(&mut flags, &location, ptr) == sys::hipSuccess }
    }
}

impl Raw for Hip {
    type Compiler = super::Hiprtc;
    const BACKEND: &'static str = "hip";
    const COMPILER: &'static str = "hipRTC";
    /// Whether an IPC mapping is tracked for the range query has varied between ROCm releases.
    const IPC_RANGE_REQUIRED: bool = false;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn make_current(&self) -> Result<()> {
        // SAFETY: the ordinal was checked against the device count at open.
        self.ck("hipSetDevice", unsafe { (self.api().hipSetDevice)(self.ordinal) })
    }
    fn mem_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two sizes; the caller made the device current.
        self.ck("hipMemGetInfo", unsafe { (self.api().hipMemGetInfo)(&mut free, &mut total) })?;
        Ok((free as u64, total as u64))
    }
    fn compiler(&self) -> std::result::Result<&super::Hiprtc, &str> {
        self.rtc.as_ref().map_err(String::as_str)
    }
    fn compile_target(&self, rtc: &super::Hiprtc) -> Result<CompileTarget> {
        Ok(rtc.target(&self.rt, &self.info.arch, &self.target_id))
    }

    fn shared_size(&self, bytes: usize) -> Result<usize> {
        round_up(bytes, self.share_unit).ok_or_else(|| bad(format!("shared allocation of {bytes} bytes overflows")))
    }
    /// Uncached IPC memory is fine-grained (what upstream car allocates); everything else is coarse `hipMalloc`.
    fn malloc(&self, size: usize, kind: MemKind) -> Result<u64> {
        let api = self.api();
        let mut ptr: *mut c_void = null_mut();
        match kind {
            // SAFETY: writes one device pointer.
            MemKind::Ipc { uncached: true } => self.ck("hipExtMallocWithFlags", unsafe {
                (api.hipExtMallocWithFlags)(&mut ptr, size, sys::hipDeviceMallocUncached)
            })?,
            // SAFETY: writes one device pointer.
            MemKind::Ipc { uncached: false } | MemKind::Device => {
                self.ck("hipMalloc", unsafe { (api.hipMalloc)(&mut ptr, size) })?
            }
        }
        Ok(ptr as u64)
    }
    unsafe fn free(&self, ptr: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        self.ck("hipFree", unsafe { (self.api().hipFree)(ptr as *mut c_void) })
    }
    unsafe fn ipc_handle(&self, base: u64) -> Result<Vec<u8>> {
        let mut handle = sys::hipIpcMemHandle_t { reserved: [0; sys::HIP_IPC_HANDLE_SIZE] };
        // SAFETY: writes one handle; the runtime checks that `base` is an exportable allocation.
        self.ck("hipIpcGetMemHandle", unsafe { (self.api().hipIpcGetMemHandle)(&mut handle, base as *mut c_void) })?;
        Ok(handle.reserved.iter().map(|&c| c as u8).collect())
    }
    fn ipc_open(&self, handle: &[u8]) -> Result<u64> {
        let mut h = sys::hipIpcMemHandle_t { reserved: [0; sys::HIP_IPC_HANDLE_SIZE] };
        if handle.len() != h.reserved.len() {
            return Err(bad(format!("a HIP IPC handle is {} bytes, not {}", h.reserved.len(), handle.len())));
        }
        h.reserved.iter_mut().zip(handle).for_each(|(d, &s)| *d = s as c_char);
        let mut ptr: *mut c_void = null_mut();
        // SAFETY: writes one device pointer; the runtime validates the handle.
        self.ck("hipIpcOpenMemHandle", unsafe {
            (self.api().hipIpcOpenMemHandle)(&mut ptr, h, sys::hipIpcMemLazyEnablePeerAccess)
        })?;
        Ok(ptr as u64)
    }
    unsafe fn ipc_close(&self, ptr: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        self.ck("hipIpcCloseMemHandle", unsafe { (self.api().hipIpcCloseMemHandle)(ptr as *mut c_void) })
    }
    fn address_range(&self, ptr: u64) -> Result<(u64, usize)> {
        let (mut base, mut size): (*mut c_void, usize) = (null_mut(), 0);
        // SAFETY: writes one pointer and one size; the runtime looks the address up.
        self.ck("hipMemGetAddressRange", unsafe {
            (self.api().hipMemGetAddressRange)(&mut base, &mut size, ptr as *mut c_void)
        })?;
        Ok((base as u64, size))
    }

    fn vmm_supported(&self) -> Result<()> {
        if self.vmm {
            Ok(())
        } else {
            Err(unsupported(NO_VMM))
        }
    }
    fn vmm_create(&self, size: usize) -> Result<u64> {
        let prop = vmm_prop(self.ordinal);
        let mut handle: sys::hipMemGenericAllocationHandle_t = null_mut();
        // SAFETY: `prop` is complete and `size` a multiple of its granularity; writes one handle.
        self.ck("hipMemCreate", unsafe { (self.api().hipMemCreate)(&mut handle, size, &prop, 0) })?;
        Ok(handle as u64)
    }
    fn vmm_import(&self, fd: &OwnedFd) -> Result<u64> {
        let mut handle: sys::hipMemGenericAllocationHandle_t = null_mut();
        let raw: c_int = fd.as_raw_fd();
        let os_handle = if fd_passed_by_value(self.rt.version) {
            raw as isize as *mut c_void
        } else {
            &raw as *const c_int as *mut c_void
        };
        // SAFETY: `os_handle` is the descriptor in the form this runtime version reads (`raw` outlives the call);
        // writes one handle.
        self.ck("hipMemImportFromShareableHandle", unsafe {
            (self.api().hipMemImportFromShareableHandle)(
                &mut handle,
                os_handle,
                sys::hipMemHandleTypePosixFileDescriptor,
            )
        })?;
        Ok(handle as u64)
    }
    unsafe fn vmm_release(&self, handle: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        self.ck("hipMemRelease", unsafe { (self.api().hipMemRelease)(handle as sys::hipMemGenericAllocationHandle_t) })
    }
    /// Aligned as CUDA's reservations are (runtimes that predate aligned reservations ignore the alignment).
    fn vmm_reserve(&self, size: usize) -> Result<u64> {
        let mut ptr: *mut c_void = null_mut();
        // SAFETY: writes one address; no fixed address.
        self.ck("hipMemAddressReserve", unsafe {
            (self.api().hipMemAddressReserve)(&mut ptr, size, self.share_unit, null_mut(), 0)
        })?;
        Ok(ptr as u64)
    }
    unsafe fn vmm_map(&self, ptr: u64, size: usize, handle: u64) -> Result<()> {
        let handle = handle as sys::hipMemGenericAllocationHandle_t;
        // SAFETY: as the caller vouches.
        self.ck("hipMemMap", unsafe { (self.api().hipMemMap)(ptr as *mut c_void, size, 0, handle, 0) })
    }
    unsafe fn vmm_set_access(&self, ptr: u64, size: usize) -> Result<()> {
        let desc = sys::hipMemAccessDesc {
            location: device_location(self.ordinal),
            flags: sys::hipMemAccessFlagsProtReadWrite,
        };
        // SAFETY: the range is mapped, as the caller vouches; one descriptor is passed.
        self.ck("hipMemSetAccess", unsafe { (self.api().hipMemSetAccess)(ptr as *mut c_void, size, &desc, 1) })
    }
    unsafe fn vmm_unmap(&self, ptr: u64, size: usize) -> Result<()> {
        // SAFETY: as the caller vouches.
        self.ck("hipMemUnmap", unsafe { (self.api().hipMemUnmap)(ptr as *mut c_void, size) })
    }
    unsafe fn vmm_address_free(&self, ptr: u64, size: usize) -> Result<()> {
        // SAFETY: as the caller vouches.
        self.ck("hipMemAddressFree", unsafe { (self.api().hipMemAddressFree)(ptr as *mut c_void, size) })
    }
    unsafe fn vmm_export(&self, handle: u64) -> Result<OwnedFd> {
        let mut fd: c_int = -1;
        // SAFETY: for a POSIX file descriptor the shareable handle is an int, written here.
        self.ck("hipMemExportToShareableHandle", unsafe {
            (self.api().hipMemExportToShareableHandle)(
                &mut fd as *mut c_int as *mut c_void,
                handle as sys::hipMemGenericAllocationHandle_t,
                sys::hipMemHandleTypePosixFileDescriptor,
                0,
            )
        })?;
        // SAFETY: the runtime hands us a new descriptor that nothing else owns.
        unsafe { owned_fd("hipMemExportToShareableHandle", fd) }
    }
    /// VMM memory goes as a file descriptor, else hipMalloc memory as an IPC handle.
    fn share_foreign(&self, base: u64) -> Result<ShareHandle> {
        let base_ptr = base as *mut c_void;
        if !self.vmm_mapped(base_ptr) {
            // SAFETY: the runtime checks that `base` is an exportable allocation.
            return unsafe { self.ipc_handle(base) }.map(ShareHandle::Ipc).map_err(|e| {
                unsupported(format!(
                    "the allocation at {base_ptr:p} cannot be shared with other processes: it is not hipMalloc \
                     memory that hipIpcGetMemHandle exports (memory from a stream-ordered pool, hipMallocAsync, is \
                     not), nor a VMM mapping{} ({e})",
                    if vmm_query_works(self.rt.version) { "" } else { " (which HIP before 6.1 cannot tell apart)" }
                ))
            });
        }
        let api = self.api();
        let mut handle: sys::hipMemGenericAllocationHandle_t = null_mut();
        // SAFETY: `base` is a VMM mapping (checked above, so this runtime finds its allocation); writes one handle.
        self.ck("hipMemRetainAllocationHandle", unsafe { (api.hipMemRetainAllocationHandle)(&mut handle, base_ptr) })?;
        // The handle is not released: ROCm only made this call take a reference in 2026 (rocm-systems#2696), so a
        // release would free the allocation under its owner on older runtimes. On newer ones one reference stays
        // with the allocation until this process exits.
        // SAFETY: all-zero bytes are a valid value of this plain C struct (integers and a null pointer).
        let mut prop: sys::hipMemAllocationProp = unsafe { std::mem::zeroed() };
        // SAFETY: writes one property struct for the handle just found.
        self.ck("hipMemGetAllocationPropertiesFromHandle", unsafe {
            (api.hipMemGetAllocationPropertiesFromHandle)(&mut prop, handle)
        })?;
        if prop.requestedHandleType != sys::hipMemHandleTypePosixFileDescriptor {
            return Err(unsupported(format!(
                "this VMM allocation was created with handle type {} rather than the POSIX file descriptor, so the \
                 runtime cannot export it to another process",
                prop.requestedHandleType
            )));
        }
        // SAFETY: the handle was just retained.
        unsafe { self.vmm_export(handle as u64) }.map(ShareHandle::Vmm)
    }

    fn stream_create(&self) -> Result<u64> {
        let mut s: sys::hipStream_t = null_mut();
        // SAFETY: writes one stream.
        self.ck("hipStreamCreateWithFlags", unsafe {
            (self.api().hipStreamCreateWithFlags)(&mut s, sys::hipStreamNonBlocking)
        })?;
        Ok(s as u64)
    }
    unsafe fn stream_destroy(&self, stream: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        self.ck("hipStreamDestroy", unsafe { (self.api().hipStreamDestroy)(stream as sys::hipStream_t) })
    }
    /// The null and per-thread streams report the current device, which is ours.
    unsafe fn stream_check_owner(&self, raw: u64) -> Result<()> {
        let mut device: sys::hipDevice_t = -1;
        // SAFETY: a live stream, as the caller vouches, and the runtime checks it; writes one device.
        self.ck("hipStreamGetDevice", unsafe {
            (self.api().hipStreamGetDevice)(raw as sys::hipStream_t, &mut device)
        })?;
        if device != self.device {
            return Err(bad(format!(
                "stream {raw:#x} belongs to device {device}, not to this driver's device {}",
                self.device
            )));
        }
        Ok(())
    }
    unsafe fn stream_sync(&self, stream: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        self.ck("hipStreamSynchronize", unsafe { (self.api().hipStreamSynchronize)(stream as sys::hipStream_t) })
    }
    fn event_create(&self) -> Result<u64> {
        let mut e: sys::hipEvent_t = null_mut();
        // SAFETY: writes one event; default flags keep timing on.
        self.ck("hipEventCreateWithFlags", unsafe {
            (self.api().hipEventCreateWithFlags)(&mut e, sys::hipEventDefault)
        })?;
        Ok(e as u64)
    }
    unsafe fn event_destroy(&self, event: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        self.ck("hipEventDestroy", unsafe { (self.api().hipEventDestroy)(event as sys::hipEvent_t) })
    }
    unsafe fn event_record(&self, event: u64, stream: u64) -> Result<()> {
        let (e, s) = (event as sys::hipEvent_t, stream as sys::hipStream_t);
        // SAFETY: as the caller vouches.
        self.ck("hipEventRecord", unsafe { (self.api().hipEventRecord)(e, s) })
    }
    unsafe fn event_sync(&self, event: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        self.ck("hipEventSynchronize", unsafe { (self.api().hipEventSynchronize)(event as sys::hipEvent_t) })
    }
    unsafe fn event_query(&self, event: u64) -> Result<bool> {
        // SAFETY: as the caller vouches.
        match unsafe { (self.api().hipEventQuery)(event as sys::hipEvent_t) } {
            sys::hipErrorNotReady => Ok(false),
            status => self.ck("hipEventQuery", status).map(|()| true),
        }
    }
    unsafe fn event_elapsed_ms(&self, start: u64, end: u64) -> Result<f32> {
        let (a, b) = (start as sys::hipEvent_t, end as sys::hipEvent_t);
        let mut ms = 0f32;
        // SAFETY: two live events; writes one float.
        self.ck("hipEventElapsedTime", unsafe { (self.api().hipEventElapsedTime)(&mut ms, a, b) })?;
        Ok(ms)
    }

    unsafe fn copy(&self, stream: u64, dir: Direction, dst: u64, src: u64, bytes: usize) -> Result<()> {
        let kind = match dir {
            Direction::DeviceToDevice => sys::hipMemcpyDeviceToDevice,
            Direction::HostToDevice => sys::hipMemcpyHostToDevice,
            Direction::DeviceToHost => sys::hipMemcpyDeviceToHost,
        };
        let (d, s) = (dst as *mut c_void, src as *const c_void);
        // SAFETY: as the caller vouches.
        self.ck("hipMemcpyAsync", unsafe { (self.api().hipMemcpyAsync)(d, s, bytes, kind, stream as sys::hipStream_t) })
    }
    unsafe fn memset_d8(&self, stream: u64, dst: u64, value: u8, bytes: usize) -> Result<()> {
        let (d, s) = (dst as *mut c_void, stream as sys::hipStream_t);
        // SAFETY: as the caller vouches.
        self.ck("hipMemsetD8Async", unsafe { (self.api().hipMemsetD8Async)(d, value, bytes, s) })
    }

    unsafe fn module_load(&self, image: *const c_void) -> Result<u64> {
        let mut module: sys::hipModule_t = null_mut();
        // SAFETY: as the caller vouches; the call copies what it needs.
        self.ck("hipModuleLoadData", unsafe { (self.api().hipModuleLoadData)(&mut module, image) })?;
        Ok(module as u64)
    }
    unsafe fn module_unload(&self, module: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        self.ck("hipModuleUnload", unsafe { (self.api().hipModuleUnload)(module as sys::hipModule_t) })
    }
    unsafe fn function(&self, module: u64, name: &CStr) -> Result<u64> {
        let mut f: sys::hipFunction_t = null_mut();
        // SAFETY: a live module; the name lives through the call; writes one function.
        self.ck("hipModuleGetFunction", unsafe {
            (self.api().hipModuleGetFunction)(&mut f, module as sys::hipModule_t, name.as_ptr())
        })?;
        Ok(f as u64)
    }
    unsafe fn occupancy(&self, function: u64, block: u32, shared_bytes: u32) -> Result<usize> {
        let f = function as sys::hipFunction_t;
        let mut n: c_int = 0;
        // SAFETY: a live function; writes one int.
        self.ck("hipModuleOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            (self.api().hipModuleOccupancyMaxActiveBlocksPerMultiprocessor)(
                &mut n,
                f,
                block as c_int,
                shared_bytes as usize,
            )
        })?;
        Ok(n.max(0) as usize)
    }
    unsafe fn launch(&self, function: u64, dims: LaunchDims, stream: u64, args: *mut *mut c_void) -> Result<()> {
        let (f, s) = (function as sys::hipFunction_t, stream as sys::hipStream_t);
        let LaunchDims { grid, block, shared_bytes } = dims;
        // SAFETY: as the caller vouches.
        self.ck("hipModuleLaunchKernel", unsafe {
            (self.api().hipModuleLaunchKernel)(f, grid, 1, 1, block, 1, 1, shared_bytes, s, args, null_mut())
        })
    }

    unsafe fn capture_begin(&self, stream: u64) -> Result<()> {
        let mode = sys::hipStreamCaptureModeThreadLocal;
        // SAFETY: as the caller vouches.
        self.ck("hipStreamBeginCapture", unsafe {
            (self.api().hipStreamBeginCapture)(stream as sys::hipStream_t, mode)
        })
    }
    unsafe fn capturing(&self, stream: u64) -> Result<bool> {
        let mut status = sys::hipStreamCaptureStatusNone;
        // SAFETY: a live stream; writes one status.
        self.ck("hipStreamIsCapturing", unsafe {
            (self.api().hipStreamIsCapturing)(stream as sys::hipStream_t, &mut status)
        })?;
        Ok(status != sys::hipStreamCaptureStatusNone)
    }
    unsafe fn capture_end(&self, stream: u64) -> Result<u64> {
        let mut graph: sys::hipGraph_t = null_mut();
        // SAFETY: a live stream; writes one graph.
        self.ck("hipStreamEndCapture", unsafe {
            (self.api().hipStreamEndCapture)(stream as sys::hipStream_t, &mut graph)
        })?;
        Ok(graph as u64)
    }
    unsafe fn graph_instantiate(&self, graph: u64) -> Result<u64> {
        let mut exec: sys::hipGraphExec_t = null_mut();
        // SAFETY: a live graph; writes one executable graph.
        self.ck("hipGraphInstantiate", unsafe {
            (self.api().hipGraphInstantiateWithFlags)(&mut exec, graph as sys::hipGraph_t, 0)
        })?;
        Ok(exec as u64)
    }
    unsafe fn graph_launch(&self, exec: u64, stream: u64) -> Result<()> {
        let (g, s) = (exec as sys::hipGraphExec_t, stream as sys::hipStream_t);
        // SAFETY: as the caller vouches.
        self.ck("hipGraphLaunch", unsafe { (self.api().hipGraphLaunch)(g, s) })
    }
    unsafe fn graph_exec_destroy(&self, exec: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        self.ck("hipGraphExecDestroy", unsafe { (self.api().hipGraphExecDestroy)(exec as sys::hipGraphExec_t) })
    }
    unsafe fn graph_destroy(&self, graph: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        self.ck("hipGraphDestroy", unsafe { (self.api().hipGraphDestroy)(graph as sys::hipGraph_t) })
    }

    fn device_by_bus_id(&self, bus: &CStr) -> Option<i32> {
        let mut peer: c_int = 0;
        // SAFETY: a NUL-terminated bus id; writes one device.
        let status = unsafe { (self.api().hipDeviceGetByPCIBusId)(&mut peer, bus.as_ptr()) };
        (status == sys::hipSuccess).then_some(peer)
    }
    fn peer_link(&self, peer: i32) -> Result<PeerLink> {
        let attr = |a: c_int| -> Result<bool> {
            let mut v: c_int = 0;
            // SAFETY: writes one int; both devices are valid ordinals of this process.
            self.ck("hipDeviceGetP2PAttribute", unsafe {
                (self.api().hipDeviceGetP2PAttribute)(&mut v, a, self.ordinal, peer)
            })?;
            Ok(v != 0)
        };
        Ok(PeerLink {
            access: attr(sys::hipDevP2PAttrAccessSupported)?,
            native_atomics: attr(sys::hipDevP2PAttrNativeAtomicSupported)?,
        })
    }
}
