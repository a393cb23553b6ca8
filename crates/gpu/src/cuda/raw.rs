//! The CUDA driver API's calls for the shared core ([`crate::device`]), and what only CUDA has: the context
//! check of adopted streams, the allocation-granularity rounding, the pool and handle-type checks of foreign
//! memory.

use super::{ck, nvrtc::Nvrtc, Cuda};
use crate::device::raw::{CompileTarget, Direction, Raw};
use crate::device::{bad, owned_fd, unsupported};
use crate::{DeviceInfo, LaunchDims, MemKind, PeerLink, Result, ShareHandle};
use cudarc::driver::sys as cu;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::null_mut;

/// `NULL` (the default stream), `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`: stream handles that name the
/// current context's default streams rather than a stream object, so they are adopted without a context check.
const DEFAULT_STREAMS: [u64; 3] = [0, 1, 2];

const POSIX_FD: cu::CUmemAllocationHandleType = cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

impl Cuda {
    fn location(&self) -> cu::CUmemLocation {
        cu::CUmemLocation { type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: self.info.ordinal as c_int }
    }

    /// Pinned device memory on this device, shareable as a POSIX file descriptor.
    fn vmm_prop(&self) -> cu::CUmemAllocationProp {
        cu::CUmemAllocationProp {
            type_: cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: POSIX_FD,
            location: self.location(),
            win32HandleMetaData: null_mut(),
            allocFlags: cu::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        }
    }

    /// Refuses a VMM allocation that was not created exportable as a POSIX file descriptor.
    fn fd_shareable(handle: cu::CUmemGenericAllocationHandle) -> Result<()> {
        let mut prop = std::mem::MaybeUninit::<cu::CUmemAllocationProp>::zeroed();
        // SAFETY: writes one property struct for a handle retained by the caller.
        ck("cuMemGetAllocationPropertiesFromHandle", unsafe {
            cu::cuMemGetAllocationPropertiesFromHandle(prop.as_mut_ptr(), handle)
        })?;
        // Only this bit-mask field is read: the others are Rust enums, which a newer driver may fill with values
        // they lack.
        // SAFETY: the field is initialised (zeroed, then written by the driver) and any integer is valid for it.
        let types = unsafe { (*prop.as_ptr()).requestedHandleTypes.0 };
        if types & POSIX_FD.0 == 0 {
            return Err(unsupported(format!(
                "this VMM allocation was created without the POSIX file-descriptor handle type (requested handle \
                 types {types:#x}), so the driver cannot export it to another process (PyTorch's expandable \
                 segments, for one, may be made so)"
            )));
        }
        Ok(())
    }

    /// Whether `ptr` is memory of a stream-ordered pool (false where the driver cannot say).
    fn in_pool(ptr: cu::CUdeviceptr) -> bool {
        let mut pool: cu::CUmemoryPool = null_mut();
        let attr = cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE;
        // SAFETY: this attribute is one pool handle, written here. Only a message depends on the answer.
        let status = unsafe { cu::cuPointerGetAttribute(&mut pool as *mut cu::CUmemoryPool as *mut c_void, attr, ptr) };
        status == cu::CUresult::CUDA_SUCCESS && !pool.is_null()
    }
}

impl Raw for Cuda {
    type Compiler = Nvrtc;
    const BACKEND: &'static str = "cuda";
    const COMPILER: &'static str = "NVRTC";
    const IPC_RANGE_REQUIRED: bool = true;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn make_current(&self) -> Result<()> {
        // SAFETY: the context is retained until Drop.
        ck("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(self.ctx) })
    }
    fn mem_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two sizes; the caller made the context current.
        ck("cuMemGetInfo", unsafe { cu::cuMemGetInfo_v2(&mut free, &mut total) })?;
        Ok((free as u64, total as u64))
    }
    fn compiler(&self) -> std::result::Result<&Nvrtc, &str> {
        self.nvrtc.as_ref().map_err(String::as_str)
    }
    fn compile_target(&self, nvrtc: &Nvrtc) -> Result<CompileTarget> {
        nvrtc.target(self.cc)
    }

    /// IPC memory is rounded up to the allocation granularity (2 MiB on the H200), since peers read an IPC
    /// allocation of another size several times slower (docs/symm-vs-car.md).
    fn shared_size(&self, bytes: usize) -> Result<usize> {
        let prop = self.vmm_prop();
        let mut gran = 0usize;
        let option = cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED;
        // SAFETY: `prop` is a complete allocation description; writes one size.
        ck("cuMemGetAllocationGranularity", unsafe { cu::cuMemGetAllocationGranularity(&mut gran, &prop, option) })?;
        let gran = gran.max(1);
        bytes.max(1).div_ceil(gran).checked_mul(gran).ok_or_else(|| bad(format!("VMM size {bytes} overflows")))
    }
    fn malloc(&self, size: usize, _kind: MemKind) -> Result<u64> {
        let mut ptr: cu::CUdeviceptr = 0;
        // SAFETY: writes one device pointer.
        ck("cuMemAlloc", unsafe { cu::cuMemAlloc_v2(&mut ptr, size) })?;
        Ok(ptr)
    }
    unsafe fn free(&self, ptr: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuMemFree", unsafe { cu::cuMemFree_v2(ptr) })
    }
    unsafe fn ipc_handle(&self, base: u64) -> Result<Vec<u8>> {
        let mut handle = cu::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: writes one handle; the driver checks that `base` starts an exportable allocation.
        ck("cuIpcGetMemHandle", unsafe { cu::cuIpcGetMemHandle(&mut handle, base) })?;
        Ok(handle.reserved.iter().map(|&c| c as u8).collect())
    }
    fn ipc_open(&self, handle: &[u8]) -> Result<u64> {
        let mut h = cu::CUipcMemHandle { reserved: [0; 64] };
        if handle.len() != h.reserved.len() {
            return Err(bad(format!("a CUDA IPC handle is 64 bytes, not {}", handle.len())));
        }
        h.reserved.iter_mut().zip(handle).for_each(|(d, &s)| *d = s as c_char);
        let mut ptr: cu::CUdeviceptr = 0;
        let flags = cu::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: writes one device pointer; the driver validates the handle.
        ck("cuIpcOpenMemHandle", unsafe { cu::cuIpcOpenMemHandle_v2(&mut ptr, h, flags) })?;
        Ok(ptr)
    }
    unsafe fn ipc_close(&self, ptr: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuIpcCloseMemHandle", unsafe { cu::cuIpcCloseMemHandle(ptr) })
    }
    fn address_range(&self, ptr: u64) -> Result<(u64, usize)> {
        let (mut base, mut size) = (0, 0usize);
        // SAFETY: writes one pointer and one size; the driver looks the address up.
        ck("cuMemGetAddressRange", unsafe { cu::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) })?;
        Ok((base, size))
    }

    fn vmm_supported(&self) -> Result<()> {
        Ok(())
    }
    fn vmm_create(&self, size: usize) -> Result<u64> {
        let prop = self.vmm_prop();
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` is complete and `size` a multiple of its granularity; writes one handle.
        ck("cuMemCreate", unsafe { cu::cuMemCreate(&mut handle, size, &prop, 0) })?;
        Ok(handle)
    }
    fn vmm_import(&self, fd: &OwnedFd) -> Result<u64> {
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: for a POSIX file descriptor the OS handle is the fd's value cast to a pointer; writes one handle.
        ck("cuMemImportFromShareableHandle", unsafe {
            cu::cuMemImportFromShareableHandle(&mut handle, fd.as_raw_fd() as usize as *mut c_void, POSIX_FD)
        })?;
        Ok(handle)
    }
    unsafe fn vmm_release(&self, handle: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuMemRelease", unsafe { cu::cuMemRelease(handle) })
    }
    fn vmm_reserve(&self, size: usize) -> Result<u64> {
        let mut ptr: cu::CUdeviceptr = 0;
        // SAFETY: writes one address; default alignment, no fixed address.
        ck("cuMemAddressReserve", unsafe { cu::cuMemAddressReserve(&mut ptr, size, 0, 0, 0) })?;
        Ok(ptr)
    }
    unsafe fn vmm_map(&self, ptr: u64, size: usize, handle: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuMemMap", unsafe { cu::cuMemMap(ptr, size, 0, handle, 0) })
    }
    unsafe fn vmm_set_access(&self, ptr: u64, size: usize) -> Result<()> {
        let desc = cu::CUmemAccessDesc {
            location: self.location(),
            flags: cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range is mapped, as the caller vouches; one descriptor is passed.
        ck("cuMemSetAccess", unsafe { cu::cuMemSetAccess(ptr, size, &desc, 1) })
    }
    unsafe fn vmm_unmap(&self, ptr: u64, size: usize) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuMemUnmap", unsafe { cu::cuMemUnmap(ptr, size) })
    }
    unsafe fn vmm_address_free(&self, ptr: u64, size: usize) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuMemAddressFree", unsafe { cu::cuMemAddressFree(ptr, size) })
    }
    unsafe fn vmm_export(&self, handle: u64) -> Result<OwnedFd> {
        let mut fd: c_int = -1;
        // SAFETY: for a POSIX file descriptor the shareable handle is an int, written here.
        ck("cuMemExportToShareableHandle", unsafe {
            cu::cuMemExportToShareableHandle(&mut fd as *mut c_int as *mut c_void, handle, POSIX_FD, 0)
        })?;
        // SAFETY: the driver hands us a new descriptor that nothing else owns.
        unsafe { owned_fd("cuMemExportToShareableHandle", fd) }
    }
    /// VMM memory (cuMemCreate + cuMemMap) goes as a file descriptor, else cuMemAlloc memory as an IPC handle.
    fn share_foreign(&self, base: u64) -> Result<ShareHandle> {
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: writes one handle; fails (and retains nothing) unless `base` is mapped with cuMemMap.
        let vmm = unsafe { cu::cuMemRetainAllocationHandle(&mut handle, base as *mut c_void) };
        if vmm == cu::CUresult::CUDA_SUCCESS {
            // SAFETY: the handle was just retained.
            let exported = Self::fd_shareable(handle).and_then(|_| unsafe { self.vmm_export(handle) });
            // SAFETY: balances the retain above; an exported descriptor holds a reference of its own.
            let released = unsafe { self.vmm_release(handle) };
            return match (exported, released) {
                (Ok(fd), Ok(())) => Ok(ShareHandle::Vmm(fd)),
                (Err(e), _) | (Ok(_), Err(e)) => Err(e),
            };
        }
        // SAFETY: the driver checks that `base` starts an exportable allocation.
        unsafe { self.ipc_handle(base) }.map(ShareHandle::Ipc).map_err(|e| {
            if Self::in_pool(base) {
                unsupported(format!(
                    "the allocation at {base:#x} comes from a stream-ordered memory pool (cudaMallocAsync), whose \
                     memory cuIpcGetMemHandle cannot export ({e}); allocate it with cudaMalloc or cuMemCreate"
                ))
            } else {
                unsupported(format!("the allocation at {base:#x} cannot be shared with other processes: {e}"))
            }
        })
    }

    fn stream_create(&self) -> Result<u64> {
        let mut s: cu::CUstream = null_mut();
        let flags = cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: writes one stream.
        ck("cuStreamCreate", unsafe { cu::cuStreamCreate(&mut s, flags) })?;
        Ok(s as u64)
    }
    unsafe fn stream_destroy(&self, stream: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuStreamDestroy", unsafe { cu::cuStreamDestroy_v2(stream as cu::CUstream) })
    }
    unsafe fn stream_check_owner(&self, raw: u64) -> Result<()> {
        if DEFAULT_STREAMS.contains(&raw) {
            return Ok(());
        }
        let mut ctx: cu::CUcontext = null_mut();
        // SAFETY: a live stream, as the caller vouches; writes one context.
        ck("cuStreamGetCtx", unsafe { cu::cuStreamGetCtx(raw as cu::CUstream, &mut ctx) })?;
        if ctx != self.ctx {
            return Err(bad(format!(
                "stream {raw:#x} belongs to context {ctx:p}, not to this driver's: the primary context {:p} of \
                 device {}",
                self.ctx, self.info.ordinal
            )));
        }
        Ok(())
    }
    unsafe fn stream_sync(&self, stream: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(stream as cu::CUstream) })
    }
    fn event_create(&self) -> Result<u64> {
        let mut e: cu::CUevent = null_mut();
        // SAFETY: writes one event; default flags keep timing on.
        ck("cuEventCreate", unsafe { cu::cuEventCreate(&mut e, cu::CUevent_flags::CU_EVENT_DEFAULT as u32) })?;
        Ok(e as u64)
    }
    unsafe fn event_destroy(&self, event: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuEventDestroy", unsafe { cu::cuEventDestroy_v2(event as cu::CUevent) })
    }
    unsafe fn event_record(&self, event: u64, stream: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuEventRecord", unsafe { cu::cuEventRecord(event as cu::CUevent, stream as cu::CUstream) })
    }
    unsafe fn event_sync(&self, event: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuEventSynchronize", unsafe { cu::cuEventSynchronize(event as cu::CUevent) })
    }
    unsafe fn event_query(&self, event: u64) -> Result<bool> {
        // SAFETY: as the caller vouches.
        match unsafe { cu::cuEventQuery(event as cu::CUevent) } {
            cu::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            status => ck("cuEventQuery", status).map(|()| true),
        }
    }
    unsafe fn event_elapsed_ms(&self, start: u64, end: u64) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: two live events; writes one float. `elapsed` points into libcuda, which `_lib` keeps loaded.
        ck("cuEventElapsedTime", unsafe { (self.elapsed)(&mut ms, start as cu::CUevent, end as cu::CUevent) })?;
        Ok(ms)
    }

    unsafe fn copy(&self, stream: u64, dir: Direction, dst: u64, src: u64, bytes: usize) -> Result<()> {
        let s = stream as cu::CUstream;
        // SAFETY: as the caller vouches.
        unsafe {
            match dir {
                Direction::DeviceToDevice => ck("cuMemcpyDtoDAsync", cu::cuMemcpyDtoDAsync_v2(dst, src, bytes, s)),
                Direction::HostToDevice => {
                    ck("cuMemcpyHtoDAsync", cu::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, bytes, s))
                }
                Direction::DeviceToHost => {
                    ck("cuMemcpyDtoHAsync", cu::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, bytes, s))
                }
            }
        }
    }
    unsafe fn memset_d8(&self, stream: u64, dst: u64, value: u8, bytes: usize) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuMemsetD8Async", unsafe { cu::cuMemsetD8Async(dst, value, bytes, stream as cu::CUstream) })
    }

    unsafe fn module_load(&self, image: *const c_void) -> Result<u64> {
        let mut module: cu::CUmodule = null_mut();
        // SAFETY: as the caller vouches; the call copies what it needs.
        ck("cuModuleLoadData", unsafe { cu::cuModuleLoadData(&mut module, image) })?;
        Ok(module as u64)
    }
    unsafe fn module_unload(&self, module: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuModuleUnload", unsafe { cu::cuModuleUnload(module as cu::CUmodule) })
    }
    unsafe fn function(&self, module: u64, name: &CStr) -> Result<u64> {
        let mut f: cu::CUfunction = null_mut();
        // SAFETY: a live module; the name lives through the call; writes one function.
        ck("cuModuleGetFunction", unsafe { cu::cuModuleGetFunction(&mut f, module as cu::CUmodule, name.as_ptr()) })?;
        Ok(f as u64)
    }
    unsafe fn occupancy(&self, function: u64, block: u32, shared_bytes: u32) -> Result<usize> {
        let mut n: c_int = 0;
        // SAFETY: a live function; writes one int.
        ck("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            cu::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                function as cu::CUfunction,
                block as c_int,
                shared_bytes as usize,
            )
        })?;
        Ok(n.max(0) as usize)
    }
    unsafe fn launch(&self, function: u64, dims: LaunchDims, stream: u64, args: *mut *mut c_void) -> Result<()> {
        let (f, s) = (function as cu::CUfunction, stream as cu::CUstream);
        // SAFETY: as the caller vouches.
        ck("cuLaunchKernel", unsafe {
            cu::cuLaunchKernel(f, dims.grid, 1, 1, dims.block, 1, 1, dims.shared_bytes, s, args, null_mut())
        })
    }

    unsafe fn capture_begin(&self, stream: u64) -> Result<()> {
        let mode = cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: as the caller vouches.
        ck("cuStreamBeginCapture", unsafe { cu::cuStreamBeginCapture_v2(stream as cu::CUstream, mode) })
    }
    unsafe fn capturing(&self, stream: u64) -> Result<bool> {
        let mut status = cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a live stream; writes one status.
        ck("cuStreamIsCapturing", unsafe { cu::cuStreamIsCapturing(stream as cu::CUstream, &mut status) })?;
        Ok(status != cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
    unsafe fn capture_end(&self, stream: u64) -> Result<u64> {
        let mut graph: cu::CUgraph = null_mut();
        // SAFETY: a live stream; writes one graph.
        ck("cuStreamEndCapture", unsafe { cu::cuStreamEndCapture(stream as cu::CUstream, &mut graph) })?;
        Ok(graph as u64)
    }
    unsafe fn graph_instantiate(&self, graph: u64) -> Result<u64> {
        let mut exec: cu::CUgraphExec = null_mut();
        // SAFETY: a live graph; writes one executable graph.
        ck("cuGraphInstantiate", unsafe { cu::cuGraphInstantiateWithFlags(&mut exec, graph as cu::CUgraph, 0) })?;
        Ok(exec as u64)
    }
    unsafe fn graph_launch(&self, exec: u64, stream: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuGraphLaunch", unsafe { cu::cuGraphLaunch(exec as cu::CUgraphExec, stream as cu::CUstream) })
    }
    unsafe fn graph_exec_destroy(&self, exec: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuGraphExecDestroy", unsafe { cu::cuGraphExecDestroy(exec as cu::CUgraphExec) })
    }
    unsafe fn graph_destroy(&self, graph: u64) -> Result<()> {
        // SAFETY: as the caller vouches.
        ck("cuGraphDestroy", unsafe { cu::cuGraphDestroy(graph as cu::CUgraph) })
    }

    fn device_by_bus_id(&self, bus: &CStr) -> Option<i32> {
        let mut peer: cu::CUdevice = 0;
        // SAFETY: a NUL-terminated bus id; writes one device.
        let status = unsafe { cu::cuDeviceGetByPCIBusId(&mut peer, bus.as_ptr()) };
        (status == cu::CUresult::CUDA_SUCCESS).then_some(peer)
    }
    fn peer_link(&self, peer: i32) -> Result<PeerLink> {
        let attr = |a: cu::CUdevice_P2PAttribute| -> Result<bool> {
            let mut v: c_int = 0;
            // SAFETY: writes one int; both devices are valid ordinals of this process.
            ck("cuDeviceGetP2PAttribute", unsafe { cu::cuDeviceGetP2PAttribute(&mut v, a, self.device, peer) })?;
            Ok(v != 0)
        };
        use cu::CUdevice_P2PAttribute::*;
        Ok(PeerLink {
            access: attr(CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)?,
            native_atomics: attr(CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)?,
        })
    }
}
