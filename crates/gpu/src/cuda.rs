//! The CUDA driver: cudarc's raw driver-API and NVRTC bindings, loaded at run time.
//!
//! cudarc panics when its library or one of its symbols is missing, so [`open`] first loads the libraries itself
//! (the same names, in the same order, as cudarc's loader) and checks every symbol this driver calls; only then
//! does it call cudarc, inside `catch_unwind` as a second guard. A machine without CUDA gets
//! [`GpuError::NotAvailable`], never a panic.
//!
//! Handles are the driver's own pointers (`CUstream`, `CUevent`, `CUmodule`, `CUfunction`, `CUgraphExec`) as
//! integers; every one is kept in a live set, so a stale or foreign handle is refused instead of reaching the
//! driver. Every method makes the device's primary context current first, so the driver may be used from any
//! thread.

use crate::{
    c_buf_text, forget, kernel_cache, offset_in, pick_ordinal, DeviceInfo, DevicePtr, Driver, DriverKind,
    DriverOptions, GpuError, Handle, KernelLibrary, LaunchDims, MemKind, PeerLink, RawMem, Result, ShareHandle,
    SharedRange, PRIVATE_MEMORY, REIMPORTED_MEMORY,
};
use cudarc::driver::sys as cu;
use cudarc::nvrtc::sys as nv;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The driver-API entry points this driver calls (cudarc resolves each by exactly this name on first use).
const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceGetPCIBusId",
    "cuDeviceGetByPCIBusId",
    "cuDeviceGetP2PAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetAddressRange_v2",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuMemGetAllocationGranularity",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemRetainAllocationHandle",
    "cuMemGetAllocationPropertiesFromHandle",
    "cuPointerGetAttribute",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamGetCtx",
    "cuStreamSynchronize",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8Async",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuLaunchKernel",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuStreamIsCapturing",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
];

/// `cuEventElapsedTime_v2` exists from driver 12.8 on (and cudarc's CUDA 13 bindings only have it); older
/// drivers export the same call as `cuEventElapsedTime`. Both are looked up at open.
const ELAPSED_SYMBOLS: [&str; 2] = ["cuEventElapsedTime_v2", "cuEventElapsedTime"];
type ElapsedFn = unsafe extern "C" fn(*mut f32, cu::CUevent, cu::CUevent) -> cu::CUresult;

const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcGetErrorString",
    "nvrtcGetNumSupportedArchs",
    "nvrtcGetSupportedArchs",
    "nvrtcCreateProgram",
    "nvrtcDestroyProgram",
    "nvrtcCompileProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
];

/// The largest by-value parameter struct a launch accepts (the classic kernel-parameter limit).
const MAX_PARAM_BYTES: usize = 4096;

/// `NULL` (the default stream), `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`: stream handles that name the
/// current context's default streams rather than a stream object, so they are adopted without a context check.
const DEFAULT_STREAMS: [Handle; 3] = [0, 1, 2];

/// Turns a driver status into a [`GpuError::Driver`] naming `call`.
fn ck(call: &'static str, status: cu::CUresult) -> Result<()> {
    if status == cu::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let text = |f: unsafe fn(cu::CUresult, *mut *const c_char) -> cu::CUresult| {
        let mut p: *const c_char = null();
        // SAFETY: cuGetErrorName/String store a pointer to a static NUL-terminated string, or fail.
        let ok = unsafe { f(status, &mut p) } == cu::CUresult::CUDA_SUCCESS && !p.is_null();
        // SAFETY: `p` is such a static string.
        ok.then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let msg = match (text(cu::cuGetErrorName), text(cu::cuGetErrorString)) {
        (Some(name), Some(desc)) => format!("{name}: {desc}"),
        (Some(s), None) | (None, Some(s)) => s,
        (None, None) => format!("{status:?}"),
    };
    Err(GpuError::Driver { call, code: status as u32 as i64, msg })
}

/// Turns an NVRTC status into a [`GpuError::Driver`] naming `call`.
fn nck(call: &'static str, status: nv::nvrtcResult) -> Result<()> {
    if status == nv::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string for every status.
    let p = unsafe { nv::nvrtcGetErrorString(status) };
    let msg = if p.is_null() {
        format!("{status:?}")
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    };
    Err(GpuError::Driver { call, code: status as u32 as i64, msg })
}

fn not_available(reason: String) -> GpuError {
    GpuError::NotAvailable { backend: "cuda", reason }
}

fn bad(msg: impl Into<String>) -> GpuError {
    GpuError::BadArgs(msg.into())
}

fn unsupported(msg: impl Into<String>) -> GpuError {
    GpuError::Unsupported(msg.into())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Loads the first of `names` that loads (as cudarc's loader does) and checks that it has every symbol in
/// `symbols`. Returns the library and the name it was loaded by.
fn probe(names: &[String], symbols: &[&str]) -> std::result::Result<(libloading::Library, String), String> {
    let mut first_error = None;
    for name in names {
        // SAFETY: loading a CUDA library runs its initialisers, which is what using it requires anyway.
        let lib = match unsafe { libloading::Library::new(name) } {
            Ok(lib) => lib,
            Err(e) => {
                first_error.get_or_insert(e.to_string());
                continue;
            }
        };
        // SAFETY: only looks the symbols up; nothing is called.
        let missing: Vec<&str> =
            symbols.iter().copied().filter(|s| unsafe { lib.get::<*const c_void>(s.as_bytes()) }.is_err()).collect();
        if !missing.is_empty() {
            return Err(format!("{name} lacks {}", missing.join(", ")));
        }
        return Ok((lib, name.clone()));
    }
    Err(format!(
        "{} (nor any of the {} other names cudarc loads it by)",
        first_error.unwrap_or_else(|| "no library name to try".into()),
        names.len().saturating_sub(1)
    ))
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

/// Opens the CUDA driver on the device `opts` picks.
pub(crate) fn open(opts: &DriverOptions) -> Result<Arc<dyn Driver>> {
    let driver_names: Vec<String> =
        ["cuda", "nvcuda"].iter().flat_map(|l| cudarc::get_lib_name_candidates(l)).collect();
    let (lib, lib_name) = probe(&driver_names, DRIVER_SYMBOLS).map_err(not_available)?;
    let elapsed = ELAPSED_SYMBOLS
        .iter()
        // SAFETY: both names are `CUresult (float*, CUevent, CUevent)`; the pointer is used while `lib` is held.
        .find_map(|s| unsafe { lib.get::<ElapsedFn>(s.as_bytes()) }.ok().map(|f| *f))
        .ok_or_else(|| not_available(format!("{lib_name} lacks {}", ELAPSED_SYMBOLS.join(" and "))))?;
    let nvrtc_names = cudarc::get_lib_name_candidates("nvrtc");
    let nvrtc = probe(&nvrtc_names, NVRTC_SYMBOLS);
    match catch_unwind(AssertUnwindSafe(|| CudaDriver::new(opts, lib, elapsed, nvrtc))) {
        Ok(d) => Ok(Arc::new(d?)),
        Err(p) => Err(not_available(format!("cudarc panicked while opening {lib_name}: {}", panic_text(&*p)))),
    }
}

/// What NVRTC is here and which architectures it compiles for.
struct Nvrtc {
    /// The library name it was loaded by, for messages.
    lib: String,
    version: (c_int, c_int),
    /// `major * 10 + minor` of each supported `sm_`.
    archs: Vec<c_int>,
    _lib: libloading::Library,
}

impl Nvrtc {
    fn new((lib, name): (libloading::Library, String)) -> Result<Nvrtc> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        nck("nvrtcVersion", unsafe { nv::nvrtcVersion(&mut major, &mut minor) })?;
        let mut n: c_int = 0;
        // SAFETY: writes one int.
        nck("nvrtcGetNumSupportedArchs", unsafe { nv::nvrtcGetNumSupportedArchs(&mut n) })?;
        let mut archs = vec![0 as c_int; n.max(0) as usize];
        // SAFETY: `archs` holds the number of entries NVRTC just reported.
        nck("nvrtcGetSupportedArchs", unsafe { nv::nvrtcGetSupportedArchs(archs.as_mut_ptr()) })?;
        Ok(Nvrtc { lib: name, version: (major, minor), archs, _lib: lib })
    }

    /// The `--gpu-architecture` for a device of compute capability `cc`: its own `sm_` (a cubin) when this
    /// NVRTC knows it, else PTX for the newest older `compute_` (JIT-compiled by the driver at load).
    fn target(&self, cc: c_int) -> Result<Target> {
        if self.archs.contains(&cc) {
            return Ok(Target { arch: format!("sm_{cc}"), cubin: true });
        }
        match self.archs.iter().copied().filter(|&a| a <= cc).max() {
            Some(a) => Ok(Target { arch: format!("compute_{a}"), cubin: false }),
            None => Err(not_available(format!(
                "{} (NVRTC {}.{}) compiles for {:?}, none of which runs on sm_{cc}",
                self.lib, self.version.0, self.version.1, self.archs
            ))),
        }
    }
}

struct Target {
    arch: String,
    /// A cubin (`sm_`), else PTX (`compute_`).
    cubin: bool,
}

/// An NVRTC program, destroyed on drop.
struct Program(nv::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once.
        let _ = unsafe { nv::nvrtcDestroyProgram(&mut self.0) };
    }
}

impl Program {
    fn log(&self) -> String {
        let mut n = 0usize;
        // SAFETY: writes one size.
        if unsafe { nv::nvrtcGetProgramLogSize(self.0, &mut n) } != nv::nvrtcResult::NVRTC_SUCCESS || n == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` holds the log size NVRTC reported (NUL included).
        if unsafe { nv::nvrtcGetProgramLog(self.0, buf.as_mut_ptr() as *mut c_char) } != nv::nvrtcResult::NVRTC_SUCCESS
        {
            return String::new();
        }
        String::from_utf8_lossy(&buf).trim_end_matches('\0').trim_end().to_string()
    }

    fn image(&self, cubin: bool) -> Result<Vec<u8>> {
        let mut n = 0usize;
        let mut buf;
        if cubin {
            // SAFETY: writes one size.
            nck("nvrtcGetCUBINSize", unsafe { nv::nvrtcGetCUBINSize(self.0, &mut n) })?;
            buf = vec![0u8; n];
            // SAFETY: `buf` holds the size NVRTC reported.
            nck("nvrtcGetCUBIN", unsafe { nv::nvrtcGetCUBIN(self.0, buf.as_mut_ptr() as *mut c_char) })?;
        } else {
            // SAFETY: writes one size.
            nck("nvrtcGetPTXSize", unsafe { nv::nvrtcGetPTXSize(self.0, &mut n) })?;
            buf = vec![0u8; n];
            // SAFETY: `buf` holds the size NVRTC reported (NUL included).
            nck("nvrtcGetPTX", unsafe { nv::nvrtcGetPTX(self.0, buf.as_mut_ptr() as *mut c_char) })?;
        }
        if buf.is_empty() {
            return Err(GpuError::Driver {
                call: "nvrtcGetCUBIN",
                code: 0,
                msg: "NVRTC produced an empty image".into(),
            });
        }
        Ok(buf)
    }
}

/// The compiler options besides the architecture. No fast math: the kernels keep IEEE semantics.
const NVRTC_OPTIONS: [&str; 3] = ["-std=c++17", "-default-device", "-DARX_CUDA=1"];

/// Compiles `lib` for `target`; a failure carries NVRTC's log.
fn compile(lib: &KernelLibrary, target: &Target, options: &[String]) -> Result<Vec<u8>> {
    let compile_error = |log: String| GpuError::Compile { library: lib.name.into(), arch: target.arch.clone(), log };
    let src = CString::new(lib.source).map_err(|_| bad(format!("kernel library {} contains a NUL byte", lib.name)))?;
    let name = CString::new(format!("{}.cu", lib.name)).map_err(|_| bad("kernel library name contains a NUL byte"))?;
    let mut raw: nv::nvrtcProgram = null_mut();
    // SAFETY: both strings live through the call; no headers are passed.
    nck("nvrtcCreateProgram", unsafe {
        nv::nvrtcCreateProgram(&mut raw, src.as_ptr(), name.as_ptr(), 0, null(), null())
    })?;
    let prog = Program(raw);
    let opts: Vec<CString> = options.iter().map(|o| CString::new(o.as_str()).expect("options have no NUL")).collect();
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: `ptrs` points at `opts`, which live through the call.
    let status = unsafe { nv::nvrtcCompileProgram(prog.0, ptrs.len() as c_int, ptrs.as_ptr()) };
    if let Err(e) = nck("nvrtcCompileProgram", status) {
        let log = prog.log();
        return Err(compile_error(if log.is_empty() { e.to_string() } else { log }));
    }
    prog.image(target.cubin)
}

/// What a token's memory is, so release undoes the right thing.
#[derive(Clone, Copy)]
enum Mem {
    /// cuMemAlloc; `ipc` says whether it may be exported.
    Alloc { ipc: bool },
    /// A peer's cuMemAlloc, opened with cuIpcOpenMemHandle.
    IpcMapped,
    /// cuMemCreate or an imported VMM handle, mapped at `ptr` for `mapped` bytes.
    Vmm { handle: cu::CUmemGenericAllocationHandle, mapped: usize },
}

struct MemEntry {
    ptr: cu::CUdeviceptr,
    mem: Mem,
}

/// Everything alive, by handle.
#[derive(Default)]
struct Live {
    mems: HashMap<u64, MemEntry>,
    streams: HashSet<Handle>,
    /// Adopted streams (the caller's, or ours borrowed again) -> adoptions not yet forgotten; never destroyed here.
    adopted: HashMap<Handle, usize>,
    events: HashSet<Handle>,
    modules: HashSet<Handle>,
    /// Function -> its module.
    kernels: HashMap<Handle, Handle>,
    /// Executable graph -> the graph it was instantiated from.
    graphs: HashMap<Handle, Handle>,
}

pub(crate) struct CudaDriver {
    info: DeviceInfo,
    device: cu::CUdevice,
    ctx: cu::CUcontext,
    /// `major * 10 + minor`.
    cc: c_int,
    elapsed: ElapsedFn,
    /// NVRTC, or why it is not here (only module_load needs it).
    nvrtc: std::result::Result<Nvrtc, String>,
    next: AtomicU64,
    live: Mutex<Live>,
    /// Holds libcuda loaded while `elapsed` points into it.
    _lib: libloading::Library,
}

// SAFETY: `ctx` is the device's primary context, which the driver API lets any thread make current (each method
// does); the other raw handles live as integers in `live`, behind its mutex.
unsafe impl Send for CudaDriver {}
// SAFETY: as above; every driver-API call used here is thread-safe.
unsafe impl Sync for CudaDriver {}

impl CudaDriver {
    fn new(
        opts: &DriverOptions,
        lib: libloading::Library,
        elapsed: ElapsedFn,
        nvrtc: std::result::Result<(libloading::Library, String), String>,
    ) -> Result<CudaDriver> {
        // SAFETY: cuInit may be called any number of times, from any thread.
        ck("cuInit", unsafe { cu::cuInit(0) }).map_err(|e| not_available(e.to_string()))?;
        let mut count: c_int = 0;
        // SAFETY: writes one int.
        ck("cuDeviceGetCount", unsafe { cu::cuDeviceGetCount(&mut count) })?;
        if count <= 0 {
            return Err(not_available("the driver loads but sees no device".into()));
        }
        let ordinal = pick_ordinal(opts, count as usize)?;
        let mut device: cu::CUdevice = 0;
        // SAFETY: writes one device; the ordinal is below the count.
        ck("cuDeviceGet", unsafe { cu::cuDeviceGet(&mut device, ordinal as c_int) })?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds the length passed.
        ck("cuDeviceGetName", unsafe { cu::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, device) })?;
        let name = c_buf_text(&name);
        let mut bus = [0 as c_char; 64];
        // SAFETY: the buffer holds the length passed (an id is 12 characters and a NUL).
        ck("cuDeviceGetPCIBusId", unsafe { cu::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as c_int, device) })?;
        let bus_id = c_buf_text(&bus).to_ascii_lowercase();
        let attr = |a: cu::CUdevice_attribute| -> Result<c_int> {
            let mut v: c_int = 0;
            // SAFETY: writes one int.
            ck("cuDeviceGetAttribute", unsafe { cu::cuDeviceGetAttribute(&mut v, a, device) })?;
            Ok(v)
        };
        use cu::CUdevice_attribute::*;
        let major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let mut ctx: cu::CUcontext = null_mut();
        // SAFETY: writes one context; released in Drop.
        ck("cuDevicePrimaryCtxRetain", unsafe { cu::cuDevicePrimaryCtxRetain(&mut ctx, device) })?;
        let nvrtc = nvrtc.and_then(|l| Nvrtc::new(l).map_err(|e| e.to_string()));
        let driver = CudaDriver {
            info: DeviceInfo {
                kind: DriverKind::Cuda,
                name,
                ordinal,
                count: count as usize,
                arch: format!("sm_{major}{minor}"),
                multiprocessors: sms.max(1) as usize,
                size_align: 256,
                bus_id,
            },
            device,
            ctx,
            cc: major * 10 + minor,
            elapsed,
            nvrtc,
            next: AtomicU64::new(1),
            live: Mutex::default(),
            _lib: lib,
        };
        driver.current()?;
        Ok(driver)
    }

    /// Makes the primary context current on the calling thread.
    fn current(&self) -> Result<()> {
        // SAFETY: the context is retained until Drop.
        ck("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(self.ctx) })
    }

    fn id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn insert(&self, ptr: cu::CUdeviceptr, bytes: usize, mem: Mem) -> RawMem {
        let token = self.id();
        lock(&self.live).mems.insert(token, MemEntry { ptr, mem });
        RawMem { ptr: DevicePtr(ptr), bytes, token }
    }

    fn stream(&self, h: Handle) -> Result<cu::CUstream> {
        let live = lock(&self.live);
        if live.streams.contains(&h) || live.adopted.contains_key(&h) {
            Ok(h as cu::CUstream)
        } else {
            Err(bad(format!("unknown stream {h:#x}")))
        }
    }

    fn event(&self, h: Handle) -> Result<cu::CUevent> {
        if lock(&self.live).events.contains(&h) {
            Ok(h as cu::CUevent)
        } else {
            Err(bad(format!("unknown event {h:#x}")))
        }
    }

    fn function(&self, h: Handle) -> Result<cu::CUfunction> {
        if lock(&self.live).kernels.contains_key(&h) {
            Ok(h as cu::CUfunction)
        } else {
            Err(bad(format!("unknown kernel {h:#x}")))
        }
    }

    fn location(&self) -> cu::CUmemLocation {
        cu::CUmemLocation { type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: self.info.ordinal as c_int }
    }

    /// Pinned device memory on this device, shareable as a POSIX file descriptor.
    fn vmm_prop(&self) -> cu::CUmemAllocationProp {
        cu::CUmemAllocationProp {
            type_: cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
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

    /// `bytes` rounded up to the recommended VMM granularity (also used for classic IPC allocations).
    fn vmm_size(&self, bytes: usize) -> Result<usize> {
        let prop = self.vmm_prop();
        let mut gran = 0usize;
        let option = cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED;
        // SAFETY: `prop` is a complete allocation description; writes one size.
        ck("cuMemGetAllocationGranularity", unsafe { cu::cuMemGetAllocationGranularity(&mut gran, &prop, option) })?;
        let gran = gran.max(1);
        bytes.max(1).div_ceil(gran).checked_mul(gran).ok_or_else(|| bad(format!("VMM size {bytes} overflows")))
    }

    /// Reserves an address range for `size` bytes of `handle`, maps it and opens it read-write to this device.
    fn vmm_map(&self, handle: cu::CUmemGenericAllocationHandle, size: usize) -> Result<cu::CUdeviceptr> {
        let mut ptr: cu::CUdeviceptr = 0;
        // SAFETY: writes one address; default alignment, no fixed address.
        ck("cuMemAddressReserve", unsafe { cu::cuMemAddressReserve(&mut ptr, size, 0, 0, 0) })?;
        // SAFETY: the range was just reserved with this size.
        if let Err(e) = ck("cuMemMap", unsafe { cu::cuMemMap(ptr, size, 0, handle, 0) }) {
            // SAFETY: as above; nothing is mapped in it.
            let _ = unsafe { cu::cuMemAddressFree(ptr, size) };
            return Err(e);
        }
        let desc = cu::CUmemAccessDesc {
            location: self.location(),
            flags: cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range is mapped; one descriptor is passed.
        if let Err(e) = ck("cuMemSetAccess", unsafe { cu::cuMemSetAccess(ptr, size, &desc, 1) }) {
            // SAFETY: undoes the mapping and reservation made above.
            unsafe {
                let _ = cu::cuMemUnmap(ptr, size);
                let _ = cu::cuMemAddressFree(ptr, size);
            }
            return Err(e);
        }
        Ok(ptr)
    }

    /// A classic IPC handle for the cuMemAlloc allocation that starts at `base`.
    fn ipc_handle(base: cu::CUdeviceptr) -> Result<Vec<u8>> {
        let mut handle = cu::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: writes one handle; the driver checks that `base` starts an exportable allocation.
        ck("cuIpcGetMemHandle", unsafe { cu::cuIpcGetMemHandle(&mut handle, base) })?;
        Ok(handle.reserved.iter().map(|&c| c as u8).collect())
    }

    /// A POSIX file descriptor for the VMM allocation `handle`.
    fn export_fd(handle: cu::CUmemGenericAllocationHandle) -> Result<OwnedFd> {
        let mut fd: c_int = -1;
        let kind = cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: for a POSIX file descriptor the shareable handle is an int, written here.
        ck("cuMemExportToShareableHandle", unsafe {
            cu::cuMemExportToShareableHandle(&mut fd as *mut c_int as *mut c_void, handle, kind, 0)
        })?;
        if fd < 0 {
            return Err(GpuError::Driver { call: "cuMemExportToShareableHandle", code: 0, msg: format!("fd {fd}") });
        }
        // SAFETY: the driver hands us a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Exports an allocation another allocator of this context made (a framework's tensor): VMM memory
    /// (cuMemCreate + cuMemMap) as a file descriptor, else cuMemAlloc memory as an IPC handle.
    fn share_foreign(base: cu::CUdeviceptr) -> Result<ShareHandle> {
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: writes one handle; fails (and retains nothing) unless `base` is mapped with cuMemMap.
        let vmm = unsafe { cu::cuMemRetainAllocationHandle(&mut handle, base as *mut c_void) };
        if vmm == cu::CUresult::CUDA_SUCCESS {
            let exported = Self::fd_shareable(handle).and_then(|_| Self::export_fd(handle));
            // SAFETY: balances the retain above; an exported descriptor holds a reference of its own.
            let released = ck("cuMemRelease", unsafe { cu::cuMemRelease(handle) });
            return match (exported, released) {
                (Ok(fd), Ok(())) => Ok(ShareHandle::Vmm(fd)),
                (Err(e), _) | (Ok(_), Err(e)) => Err(e),
            };
        }
        Self::ipc_handle(base).map(ShareHandle::Ipc).map_err(|e| {
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
        let posix_fd = cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;
        if types & posix_fd == 0 {
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

    /// Undoes whatever `entry` is; tries every step and reports the first failure.
    fn free(entry: &MemEntry) -> Result<()> {
        match entry.mem {
            // SAFETY: the pointer came from cuMemAlloc and its token was just removed, so it is freed once.
            Mem::Alloc { .. } => ck("cuMemFree", unsafe { cu::cuMemFree_v2(entry.ptr) }),
            // SAFETY: the pointer came from cuIpcOpenMemHandle and is closed once.
            Mem::IpcMapped => ck("cuIpcCloseMemHandle", unsafe { cu::cuIpcCloseMemHandle(entry.ptr) }),
            Mem::Vmm { handle, mapped } => {
                // SAFETY: the range and handle were mapped/created by vmm_create or vmm_import_fd and are undone once.
                let steps = unsafe {
                    [
                        ck("cuMemUnmap", cu::cuMemUnmap(entry.ptr, mapped)),
                        ck("cuMemAddressFree", cu::cuMemAddressFree(entry.ptr, mapped)),
                        ck("cuMemRelease", cu::cuMemRelease(handle)),
                    ]
                };
                steps.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
            }
        }
    }

    /// Loads a cubin or NUL-terminated PTX image, copied to 8-byte-aligned memory first.
    fn load_image(&self, image: &[u8]) -> Result<cu::CUmodule> {
        // One spare zero word, so PTX text is always NUL-terminated.
        let mut words = vec![0u64; image.len().div_ceil(8) + 1];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..image.len()].copy_from_slice(image);
        let mut module: cu::CUmodule = null_mut();
        // SAFETY: the image stays alive through the call, which copies what it needs.
        ck("cuModuleLoadData", unsafe { cu::cuModuleLoadData(&mut module, words.as_ptr() as *const c_void) })?;
        Ok(module)
    }

    fn add_module(&self, module: cu::CUmodule) -> Handle {
        let h = module as Handle;
        lock(&self.live).modules.insert(h);
        h
    }
}

impl Driver for CudaDriver {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize, kind: MemKind) -> Result<RawMem> {
        self.current()?;
        // IPC memory is rounded up to the allocation granularity (2 MiB on the H200). Peers read an allocation of
        // another size through their IPC mapping at a third of the speed once messages pass a few MB (measured:
        // results/h200-mps/ipc-size: car_1shot 475 against 170 us at 6040832 elements with a 24.2 MB buffer, and
        // fast again with 64 MiB), which made car's timings depend on the largest size of the run.
        let size = match kind {
            MemKind::Ipc { .. } => self.vmm_size(bytes)?,
            MemKind::Device => bytes.max(1),
        };
        let mut ptr: cu::CUdeviceptr = 0;
        // SAFETY: writes one device pointer. Never the async pool: pool memory cannot be IPC-exported.
        ck("cuMemAlloc", unsafe { cu::cuMemAlloc_v2(&mut ptr, size) })?;
        Ok(self.insert(ptr, bytes, Mem::Alloc { ipc: matches!(kind, MemKind::Ipc { .. }) }))
    }

    fn ipc_export(&self, mem: &RawMem) -> Result<Vec<u8>> {
        self.current()?;
        let ptr = match lock(&self.live).mems.get(&mem.token) {
            Some(MemEntry { ptr, mem: Mem::Alloc { ipc: true } }) => *ptr,
            _ => return Err(bad("ipc_export of memory not allocated with MemKind::Ipc")),
        };
        Self::ipc_handle(ptr)
    }

    fn ipc_import(&self, handle: &[u8], bytes: usize) -> Result<RawMem> {
        self.current()?;
        let mut h = cu::CUipcMemHandle { reserved: [0; 64] };
        if handle.len() != h.reserved.len() {
            return Err(bad(format!("a CUDA IPC handle is 64 bytes, not {}", handle.len())));
        }
        h.reserved.iter_mut().zip(handle).for_each(|(d, &s)| *d = s as c_char);
        let mut ptr: cu::CUdeviceptr = 0;
        let flags = cu::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: writes one device pointer; the driver validates the handle.
        ck("cuIpcOpenMemHandle", unsafe { cu::cuIpcOpenMemHandle_v2(&mut ptr, h, flags) })?;
        let (mut base, mut size) = (0, 0usize);
        // SAFETY: `ptr` is a live mapping; writes one pointer and one size.
        let range = ck("cuMemGetAddressRange", unsafe { cu::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) });
        let fits = range.and_then(|_| {
            let held = (base + size as u64).saturating_sub(ptr);
            if held < bytes as u64 {
                Err(bad(format!("IPC allocation holds {held} bytes, {bytes} asked for")))
            } else {
                Ok(())
            }
        });
        if let Err(e) = fits {
            // SAFETY: closes the mapping just opened.
            let _ = unsafe { cu::cuIpcCloseMemHandle(ptr) };
            return Err(e);
        }
        Ok(self.insert(ptr, bytes, Mem::IpcMapped))
    }

    fn vmm_create(&self, bytes: usize) -> Result<RawMem> {
        self.current()?;
        let size = self.vmm_size(bytes)?;
        let prop = self.vmm_prop();
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` is complete and `size` a multiple of its granularity; writes one handle.
        ck("cuMemCreate", unsafe { cu::cuMemCreate(&mut handle, size, &prop, 0) })?;
        match self.vmm_map(handle, size) {
            Ok(ptr) => Ok(self.insert(ptr, bytes, Mem::Vmm { handle, mapped: size })),
            Err(e) => {
                // SAFETY: the handle was just created and is mapped nowhere.
                let _ = unsafe { cu::cuMemRelease(handle) };
                Err(e)
            }
        }
    }

    fn vmm_export_fd(&self, mem: &RawMem) -> Result<OwnedFd> {
        self.current()?;
        let handle = match lock(&self.live).mems.get(&mem.token) {
            Some(MemEntry { mem: Mem::Vmm { handle, .. }, .. }) => *handle,
            _ => return Err(bad("vmm_export_fd of memory not made by vmm_create")),
        };
        Self::export_fd(handle)
    }

    fn vmm_import_fd(&self, fd: OwnedFd, bytes: usize) -> Result<RawMem> {
        self.current()?;
        let size = self.vmm_size(bytes)?;
        let mut handle: cu::CUmemGenericAllocationHandle = 0;
        let kind = cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: for a POSIX file descriptor the OS handle is the fd's value cast to a pointer; writes one handle.
        ck("cuMemImportFromShareableHandle", unsafe {
            cu::cuMemImportFromShareableHandle(&mut handle, fd.as_raw_fd() as usize as *mut c_void, kind)
        })?;
        // The imported handle keeps the allocation alive; the descriptor is no longer needed.
        drop(fd);
        match self.vmm_map(handle, size) {
            Ok(ptr) => Ok(self.insert(ptr, bytes, Mem::Vmm { handle, mapped: size })),
            Err(e) => {
                // SAFETY: the handle was just imported and is mapped nowhere.
                let _ = unsafe { cu::cuMemRelease(handle) };
                Err(e)
            }
        }
    }

    fn release(&self, mem: &RawMem) -> Result<()> {
        self.current()?;
        let entry = lock(&self.live)
            .mems
            .remove(&mem.token)
            .ok_or_else(|| bad(format!("release of unknown allocation {}", mem.token)))?;
        Self::free(&entry)
    }

    fn share_range(&self, ptr: DevicePtr, bytes: usize) -> Result<SharedRange> {
        self.current()?;
        let (mut base, mut size) = (0, 0usize);
        // SAFETY: writes one pointer and one size; the driver looks the address up. For VMM memory the range is
        // the one cuMemMap mapping (one cuMemCreate allocation) that holds the address.
        ck("cuMemGetAddressRange", unsafe { cu::cuMemGetAddressRange_v2(&mut base, &mut size, ptr.0) }).map_err(
            |e| unsupported(format!("{:#x} is not device memory of this context, so it cannot be shared ({e})", ptr.0)),
        )?;
        let offset = offset_in(DevicePtr(base), size, ptr, bytes)?;
        let own = lock(&self.live).mems.values().find(|e| e.ptr == base).map(|e| e.mem);
        let handle = match own {
            Some(Mem::Alloc { ipc: true }) => ShareHandle::Ipc(Self::ipc_handle(base)?),
            Some(Mem::Alloc { ipc: false }) => return Err(unsupported(PRIVATE_MEMORY)),
            Some(Mem::IpcMapped) => return Err(unsupported(REIMPORTED_MEMORY)),
            Some(Mem::Vmm { handle, .. }) => ShareHandle::Vmm(Self::export_fd(handle)?),
            None => Self::share_foreign(base)?,
        };
        Ok(SharedRange { handle, base: DevicePtr(base), alloc_bytes: size, offset })
    }

    fn stream_create(&self) -> Result<Handle> {
        self.current()?;
        let mut s: cu::CUstream = null_mut();
        // SAFETY: writes one stream.
        ck("cuStreamCreate", unsafe { cu::cuStreamCreate(&mut s, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) })?;
        lock(&self.live).streams.insert(s as Handle);
        Ok(s as Handle)
    }
    fn stream_destroy(&self, stream: Handle) -> Result<()> {
        self.current()?;
        if !lock(&self.live).streams.remove(&stream) {
            return Err(bad(format!("unknown stream {stream:#x}")));
        }
        // SAFETY: a live stream of ours, destroyed once.
        ck("cuStreamDestroy", unsafe { cu::cuStreamDestroy_v2(stream as cu::CUstream) })
    }
    fn stream_adopt(&self, raw: Handle) -> Result<Handle> {
        self.current()?;
        if !DEFAULT_STREAMS.contains(&raw) {
            let mut ctx: cu::CUcontext = null_mut();
            // SAFETY: the caller vouches (Gpu::borrow_stream) that `raw` is a live stream; writes one context.
            ck("cuStreamGetCtx", unsafe { cu::cuStreamGetCtx(raw as cu::CUstream, &mut ctx) })?;
            if ctx != self.ctx {
                return Err(bad(format!(
                    "stream {raw:#x} belongs to context {ctx:p}, not to this driver's: the primary context {:p} of \
                     device {}",
                    self.ctx, self.info.ordinal
                )));
            }
        }
        *lock(&self.live).adopted.entry(raw).or_default() += 1;
        Ok(raw)
    }
    fn peer_link(&self, bus_id: &str) -> Result<Option<PeerLink>> {
        if bus_id.eq_ignore_ascii_case(&self.info.bus_id) {
            return Ok(None);
        }
        let Ok(c_bus) = std::ffi::CString::new(bus_id) else {
            return Err(bad(format!("bus id {bus_id:?} holds a NUL byte")));
        };
        let mut peer: cu::CUdevice = 0;
        // SAFETY: a NUL-terminated bus id; writes one device. A device this process cannot see is not an error.
        let status = unsafe { cu::cuDeviceGetByPCIBusId(&mut peer, c_bus.as_ptr()) };
        if status != cu::CUresult::CUDA_SUCCESS {
            return Ok(None);
        }
        let attr = |a: cu::CUdevice_P2PAttribute| -> Result<bool> {
            let mut v: c_int = 0;
            // SAFETY: writes one int; both devices are valid ordinals of this process.
            ck("cuDeviceGetP2PAttribute", unsafe { cu::cuDeviceGetP2PAttribute(&mut v, a, self.device, peer) })?;
            Ok(v != 0)
        };
        use cu::CUdevice_P2PAttribute::*;
        Ok(Some(PeerLink {
            access: attr(CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)?,
            native_atomics: attr(CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)?,
        }))
    }

    fn stream_forget(&self, stream: Handle) -> Result<()> {
        forget(&mut lock(&self.live).adopted, stream)
    }
    fn stream_sync(&self, stream: Handle) -> Result<()> {
        self.current()?;
        let s = self.stream(stream)?;
        // SAFETY: a live stream.
        ck("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(s) })
    }
    fn event_create(&self) -> Result<Handle> {
        self.current()?;
        let mut e: cu::CUevent = null_mut();
        // SAFETY: writes one event; default flags keep timing on.
        ck("cuEventCreate", unsafe { cu::cuEventCreate(&mut e, cu::CUevent_flags::CU_EVENT_DEFAULT as u32) })?;
        lock(&self.live).events.insert(e as Handle);
        Ok(e as Handle)
    }
    fn event_destroy(&self, event: Handle) -> Result<()> {
        self.current()?;
        if !lock(&self.live).events.remove(&event) {
            return Err(bad(format!("unknown event {event:#x}")));
        }
        // SAFETY: a live event of ours, destroyed once.
        ck("cuEventDestroy", unsafe { cu::cuEventDestroy_v2(event as cu::CUevent) })
    }
    fn event_record(&self, event: Handle, stream: Handle) -> Result<()> {
        self.current()?;
        let (e, s) = (self.event(event)?, self.stream(stream)?);
        // SAFETY: a live event and stream.
        ck("cuEventRecord", unsafe { cu::cuEventRecord(e, s) })
    }
    fn event_sync(&self, event: Handle) -> Result<()> {
        self.current()?;
        let e = self.event(event)?;
        // SAFETY: a live event.
        ck("cuEventSynchronize", unsafe { cu::cuEventSynchronize(e) })
    }
    fn event_elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32> {
        self.current()?;
        let (a, b) = (self.event(start)?, self.event(end)?);
        let mut ms = 0f32;
        // SAFETY: two live events; writes one float. `elapsed` points into libcuda, which `_lib` keeps loaded.
        ck("cuEventElapsedTime", unsafe { (self.elapsed)(&mut ms, a, b) })?;
        Ok(ms)
    }

    fn memcpy_dtod(&self, stream: Handle, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.current()?;
        let s = self.stream(stream)?;
        // SAFETY: device addresses; the driver checks them, and the callers size ranges from their buffers.
        ck("cuMemcpyDtoDAsync", unsafe { cu::cuMemcpyDtoDAsync_v2(dst.0, src.0, bytes, s) })
    }
    fn memset_d8(&self, stream: Handle, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        self.current()?;
        let s = self.stream(stream)?;
        // SAFETY: as above.
        ck("cuMemsetD8Async", unsafe { cu::cuMemsetD8Async(dst.0, value, bytes, s) })
    }
    fn memcpy_htod(&self, stream: Handle, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.current()?;
        let s = self.stream(stream)?;
        // SAFETY: `src` is borrowed until the stream is synchronised below; `dst` was range-checked by the caller.
        ck("cuMemcpyHtoDAsync", unsafe {
            cu::cuMemcpyHtoDAsync_v2(dst.0, src.as_ptr() as *const c_void, src.len(), s)
        })?;
        // SAFETY: a live stream.
        ck("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(s) })
    }
    fn memcpy_dtoh(&self, stream: Handle, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        self.current()?;
        let s = self.stream(stream)?;
        // SAFETY: `dst` is borrowed mutably until the stream is synchronised below; `src` was range-checked.
        ck("cuMemcpyDtoHAsync", unsafe {
            cu::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, src.0, dst.len(), s)
        })?;
        // SAFETY: a live stream.
        ck("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(s) })
    }

    fn module_load(&self, lib: &KernelLibrary) -> Result<Handle> {
        self.current()?;
        let nvrtc = self
            .nvrtc
            .as_ref()
            .map_err(|why| not_available(format!("NVRTC is needed to compile kernel library {}: {why}", lib.name)))?;
        let target = nvrtc.target(self.cc)?;
        let mut options = vec![format!("--gpu-architecture={}", target.arch)];
        options.extend(NVRTC_OPTIONS.iter().map(|o| o.to_string()));
        let version = format!("nvrtc {}.{}", nvrtc.version.0, nvrtc.version.1);
        let ext = if target.cubin { "cubin" } else { "ptx" };
        let path = kernel_cache::image_path(lib, &target.arch, ext, &options, &version);
        if let Some(image) = path.as_deref().and_then(|p| std::fs::read(p).ok()) {
            // A cached image the driver refuses (corrupt, or from another driver) is recompiled and replaced.
            if let Ok(module) = self.load_image(&image) {
                return Ok(self.add_module(module));
            }
        }
        let image = compile(lib, &target, &options)?;
        if let Some(p) = &path {
            kernel_cache::store(p, &image);
        }
        let module = self.load_image(&image)?;
        Ok(self.add_module(module))
    }
    fn module_unload(&self, module: Handle) -> Result<()> {
        self.current()?;
        {
            let mut live = lock(&self.live);
            if !live.modules.remove(&module) {
                return Err(bad(format!("unknown module {module:#x}")));
            }
            live.kernels.retain(|_, m| *m != module);
        }
        // SAFETY: a live module of ours, unloaded once; its functions were dropped from the live set above.
        ck("cuModuleUnload", unsafe { cu::cuModuleUnload(module as cu::CUmodule) })
    }
    fn kernel(&self, module: Handle, name: &str) -> Result<Handle> {
        self.current()?;
        if !lock(&self.live).modules.contains(&module) {
            return Err(bad(format!("unknown module {module:#x}")));
        }
        let cname = CString::new(name).map_err(|_| bad(format!("kernel name {name:?} contains a NUL byte")))?;
        let mut f: cu::CUfunction = null_mut();
        // SAFETY: a live module; the name lives through the call; writes one function.
        ck("cuModuleGetFunction", unsafe { cu::cuModuleGetFunction(&mut f, module as cu::CUmodule, cname.as_ptr()) })?;
        lock(&self.live).kernels.insert(f as Handle, module);
        Ok(f as Handle)
    }
    fn max_resident_blocks(&self, kernel: Handle, block: u32, shared_bytes: u32) -> Result<usize> {
        self.current()?;
        let f = self.function(kernel)?;
        let mut n: c_int = 0;
        // SAFETY: a live function; writes one int.
        ck("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            cu::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, f, block as c_int, shared_bytes as usize)
        })?;
        Ok(n.max(0) as usize * self.info.multiprocessors)
    }
    fn launch(&self, stream: Handle, kernel: Handle, dims: LaunchDims, params: &[u8]) -> Result<()> {
        if params.len() > MAX_PARAM_BYTES {
            return Err(bad(format!("kernel parameter struct of {} bytes (at most {MAX_PARAM_BYTES})", params.len())));
        }
        self.current()?;
        let (f, s) = (self.function(kernel)?, self.stream(stream)?);
        // The kernels take one by-value struct: one parameter, pointing at its bytes (copied at launch/capture).
        let mut args = [params.as_ptr() as *mut c_void];
        let args = if params.is_empty() { null_mut() } else { args.as_mut_ptr() };
        // SAFETY: a live function and stream; `args` and the bytes it points at outlive the call.
        ck("cuLaunchKernel", unsafe {
            cu::cuLaunchKernel(f, dims.grid, 1, 1, dims.block, 1, 1, dims.shared_bytes, s, args, null_mut())
        })
    }

    fn capture_begin(&self, stream: Handle) -> Result<()> {
        self.current()?;
        let s = self.stream(stream)?;
        let mode = cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: a live stream. Thread-local mode leaves other threads' work alone.
        ck("cuStreamBeginCapture", unsafe { cu::cuStreamBeginCapture_v2(s, mode) })
    }
    fn capturing(&self, stream: Handle) -> Result<bool> {
        self.current()?;
        let s = self.stream(stream)?;
        let mut status = cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a live stream; writes one status.
        ck("cuStreamIsCapturing", unsafe { cu::cuStreamIsCapturing(s, &mut status) })?;
        Ok(status != cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
    fn capture_end(&self, stream: Handle) -> Result<Handle> {
        self.current()?;
        let s = self.stream(stream)?;
        let mut graph: cu::CUgraph = null_mut();
        // SAFETY: a live stream; writes one graph.
        ck("cuStreamEndCapture", unsafe { cu::cuStreamEndCapture(s, &mut graph) })?;
        let mut exec: cu::CUgraphExec = null_mut();
        // SAFETY: the graph just captured; writes one executable graph.
        if let Err(e) = ck("cuGraphInstantiate", unsafe { cu::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }) {
            // SAFETY: the graph is ours and used nowhere else.
            let _ = unsafe { cu::cuGraphDestroy(graph) };
            return Err(e);
        }
        lock(&self.live).graphs.insert(exec as Handle, graph as Handle);
        Ok(exec as Handle)
    }
    fn graph_launch(&self, graph: Handle, stream: Handle) -> Result<()> {
        self.current()?;
        if !lock(&self.live).graphs.contains_key(&graph) {
            return Err(bad(format!("unknown graph {graph:#x}")));
        }
        let s = self.stream(stream)?;
        // SAFETY: a live executable graph and stream.
        ck("cuGraphLaunch", unsafe { cu::cuGraphLaunch(graph as cu::CUgraphExec, s) })
    }
    fn graph_destroy(&self, graph: Handle) -> Result<()> {
        self.current()?;
        let g = lock(&self.live).graphs.remove(&graph).ok_or_else(|| bad(format!("unknown graph {graph:#x}")))?;
        // SAFETY: the executable graph and its graph are ours, destroyed once.
        let steps = unsafe {
            [
                ck("cuGraphExecDestroy", cu::cuGraphExecDestroy(graph as cu::CUgraphExec)),
                ck("cuGraphDestroy", cu::cuGraphDestroy(g as cu::CUgraph)),
            ]
        };
        steps.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        // The RAII wrappers hold the driver, so normally nothing is left here; whatever is, is released once.
        if self.current().is_err() {
            return;
        }
        let live = std::mem::take(&mut *lock(&self.live));
        // SAFETY: every handle below is live and ours; each is taken out of the live set, so it is undone once.
        unsafe {
            for (exec, graph) in live.graphs {
                let _ = cu::cuGraphExecDestroy(exec as cu::CUgraphExec);
                let _ = cu::cuGraphDestroy(graph as cu::CUgraph);
            }
            for e in live.events {
                let _ = cu::cuEventDestroy_v2(e as cu::CUevent);
            }
            // Streams that were only adopted (`live.adopted`) belong to the caller and are left alone.
            for s in live.streams {
                let _ = cu::cuStreamDestroy_v2(s as cu::CUstream);
            }
            for m in live.modules {
                let _ = cu::cuModuleUnload(m as cu::CUmodule);
            }
        }
        for entry in live.mems.values() {
            let _ = Self::free(entry);
        }
        // SAFETY: balances the retain in new.
        let _ = unsafe { cu::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_without_cuda_is_not_available_not_a_panic() {
        let opts = DriverOptions { device: None, local_rank: None, shm_prefix: String::new() };
        match open(&opts) {
            Ok(d) => assert_eq!(d.info().kind, DriverKind::Cuda),
            Err(GpuError::NotAvailable { backend, .. }) => assert_eq!(backend, "cuda"),
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
}
