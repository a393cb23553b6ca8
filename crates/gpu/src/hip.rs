//! The HIP driver: ROCm's runtime (`libamdhip64`) and hipRTC (`libhiprtc`), loaded at run time through the
//! table in [`sys`]. Supported: ROCm 6.0 and later (7.x included). ROCm 5.x is refused as not available: its
//! device-property struct and (before 5.7) its VMM property struct have other layouts, and MI300X needs 6.x.
//!
//! A machine without ROCm gets [`GpuError::NotAvailable`] naming `libamdhip64`, never a panic; so does one
//! whose runtime loads but sees no device. Handles are HIP's own pointers (`hipStream_t`, `hipEvent_t`,
//! `hipModule_t`, `hipFunction_t`, `hipGraphExec_t`) as integers; every one is kept in a live set, so a stale or
//! foreign handle is refused instead of reaching the runtime. Every method makes the device current on the
//! calling thread first (HIP's current device is per thread), so the driver may be used from any thread.
//!
//! Memory kinds: [`MemKind::Ipc`] with `uncached` takes `hipExtMallocWithFlags(hipDeviceMallocUncached)`
//! (fine-grained, uncached: what upstream car allocates), without it plain `hipMalloc` (coarse-grained);
//! [`MemKind::Device`] is `hipMalloc`. VMM allocations are `hipMemCreate` of the pinned type, coarse-grained too.
//! IPC and VMM allocations are whole multiples of [`SHARE_UNIT`] (or of a larger runtime granularity), as on CUDA,
//! and VMM methods are refused on a device that reports no VMM support. Nothing here multicasts.

mod sys;

use crate::{
    c_buf_text, forget, kernel_cache, offset_in, pick_ordinal, DeviceInfo, DevicePtr, Driver, DriverKind,
    DriverOptions, GpuError, Handle, KernelLibrary, LaunchDims, MemKind, PeerLink, RawMem, Result, ShareHandle,
    SharedRange, PRIVATE_MEMORY, REIMPORTED_MEMORY,
};
use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use sys::{HipApi, HiprtcApi};

/// Named in every "not available" message, so the user knows which library to install or put on the path.
const HIP_LIBRARY: &str = "libamdhip64";
/// Sonames tried, newest first (5 only to say plainly that 5.x is too old).
const HIP_MAJORS: [u32; 3] = [7, 6, 5];

/// The largest by-value parameter struct a launch accepts (the classic kernel-parameter limit).
const MAX_PARAM_BYTES: usize = 4096;

/// The hipRTC options besides the architecture. No fast math: the kernels keep IEEE semantics.
const HIPRTC_OPTIONS: [&str; 3] = ["-std=c++17", "-DARX_HIP=1", "-O3"];

fn not_available(reason: String) -> GpuError {
    GpuError::NotAvailable { backend: "hip", reason }
}

fn bad(msg: impl Into<String>) -> GpuError {
    GpuError::BadArgs(msg.into())
}

fn unsupported(msg: impl Into<String>) -> GpuError {
    GpuError::Unsupported(msg.into())
}

/// `hipMemGetAccess` answers for VMM mappings only from ROCm 6.1 on (6.0's returns success for any address), and
/// share_range needs it to tell VMM memory apart before it may call `hipMemRetainAllocationHandle`, which crashes
/// on other memory in the ROCm releases before the fix of rocm-systems#5807 (2026).
fn vmm_query_works(version: (u32, u32, u32)) -> bool {
    (version.0, version.1) >= (6, 1)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A static C string the runtime returned, or `None`.
///
/// # Safety
/// `p` is null or points at a NUL-terminated string that outlives the call.
unsafe fn c_text(p: *const c_char) -> Option<String> {
    // SAFETY: as the caller vouches.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// `HIP_VERSION` as `hipRuntimeGetVersion` reports it: `major * 10^7 + minor * 10^5 + patch`.
fn decode_version(v: c_int) -> (u32, u32, u32) {
    let v = v.max(0) as u32;
    (v / 10_000_000, v / 100_000 % 100, v % 100_000)
}

/// `hipMemImportFromShareableHandle` takes a POSIX descriptor's value cast to a pointer from ROCm 7.1 on (as
/// CUDA does); before, a pointer to the `int` holding it (PyTorch's symmetric memory makes the same switch).
fn fd_passed_by_value(version: (u32, u32, u32)) -> bool {
    (version.0, version.1) >= (7, 1)
}

/// The processor of a target ID: `gfx942` of `gfx942:sramecc+:xnack-`. `None` unless it is `gfx` + digits and
/// lower-case letters.
fn processor(target_id: &str) -> Option<&str> {
    let p = target_id.split(':').next()?.trim();
    let rest = p.strip_prefix("gfx")?;
    (!rest.is_empty() && rest.chars().all(|c| c.is_ascii_digit() || c.is_ascii_lowercase())).then_some(p)
}

/// `bytes` rounded up to a multiple of `granularity` (0 counts as 1); `None` on overflow. At least one unit.
fn round_up(bytes: usize, granularity: usize) -> Option<usize> {
    let g = granularity.max(1);
    bytes.max(1).div_ceil(g).checked_mul(g)
}

/// The least size unit of memory peers map (IPC and VMM allocations), as on CUDA, where peers read other sizes slowly;
/// ROCm's recommended VMM granularity alone can be as small as a page (docs/rocm.md).
const SHARE_UNIT: usize = 2 << 20;

/// What shared allocations are rounded to and VMM reservations aligned to: [`SHARE_UNIT`], or the runtime's VMM
/// granularity where that is larger (granularities are powers of two, so either is a multiple of the other).
fn share_unit(granularity: usize) -> usize {
    SHARE_UNIT.max(granularity)
}

/// Why VMM allocations are refused on a device without VMM support.
const NO_VMM: &str = "this device reports no virtual memory management support \
                      (hipDeviceAttributeVirtualMemoryManagementSupported is 0), so it can neither create nor map VMM \
                      allocations (hipMemCreate); only classic IPC memory can be shared here";

fn device_location(ordinal: c_int) -> sys::hipMemLocation {
    sys::hipMemLocation { type_: sys::hipMemLocationTypeDevice, id: ordinal }
}

/// Pinned device memory on device `ordinal`, shareable as a POSIX file descriptor.
fn vmm_prop(ordinal: c_int) -> sys::hipMemAllocationProp {
    sys::hipMemAllocationProp {
        type_: sys::hipMemAllocationTypePinned,
        requestedHandleType: sys::hipMemHandleTypePosixFileDescriptor,
        location: device_location(ordinal),
        win32HandleMetaData: null_mut(),
        allocFlags: sys::hipMemAllocFlags::default(),
    }
}

/// The `kernelParams` array of a launch. The kernels take one by-value struct, so it has one entry, pointing at
/// the struct's bytes; HIP copies them (the size comes from the kernel's metadata) at launch or capture.
fn kernel_args(params: &[u8]) -> Result<[*mut c_void; 1]> {
    if params.len() > MAX_PARAM_BYTES {
        return Err(bad(format!("kernel parameter struct of {} bytes (at most {MAX_PARAM_BYTES})", params.len())));
    }
    Ok([params.as_ptr() as *mut c_void])
}

/// The runtime library, its table and its version.
struct Runtime {
    api: HipApi,
    path: PathBuf,
    version: (u32, u32, u32),
    /// Never unloaded: the runtime leaves threads and exit handlers behind that would run unmapped code after a
    /// `dlclose`. The table's pointers point into it.
    _lib: ManuallyDrop<libloading::Library>,
}

impl Runtime {
    fn load() -> std::result::Result<Runtime, String> {
        let names = sys::candidates("amdhip64", &HIP_MAJORS, &sys::rocm_lib_dirs());
        let (lib, path) = sys::load_first(&names).map_err(|failures| {
            format!(
                "cannot load {HIP_LIBRARY} (tried {}): {}",
                names.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
                failures.first().map(String::as_str).unwrap_or("no name to try")
            )
        })?;
        // SAFETY: `lib` is libamdhip64 and is never unloaded.
        let api = unsafe { HipApi::bind(&lib) }.map_err(|missing| {
            format!("{} lacks {} (the hip driver needs ROCm 6.0 or newer)", path.display(), missing.join(", "))
        })?;
        let mut raw = 0;
        // SAFETY: writes one int; needs no initialisation.
        let status = unsafe { (api.hipRuntimeGetVersion)(&mut raw) };
        let rt = Runtime { api, path, version: decode_version(raw), _lib: ManuallyDrop::new(lib) };
        rt.ck("hipRuntimeGetVersion", status).map_err(|e| e.to_string())?;
        if rt.version.0 < 6 {
            let (a, b, c) = rt.version;
            return Err(format!("{} is HIP {a}.{b}.{c}; the hip driver needs ROCm 6.0 or newer", rt.path.display()));
        }
        Ok(rt)
    }

    /// Turns a runtime status into a [`GpuError::Driver`] naming `call`, with HIP's name and text for it.
    fn ck(&self, call: &'static str, status: sys::hipError_t) -> Result<()> {
        if status == sys::hipSuccess {
            return Ok(());
        }
        // SAFETY: both return a static NUL-terminated string (or null) for any value.
        let (name, desc) =
            unsafe { (c_text((self.api.hipGetErrorName)(status)), c_text((self.api.hipGetErrorString)(status))) };
        let msg = match (name, desc) {
            (Some(n), Some(d)) if n != d => format!("{n}: {d}"),
            (Some(s), _) | (None, Some(s)) => s,
            (None, None) => format!("hipError_t {status}"),
        };
        Err(GpuError::Driver { call, code: status as i64, msg })
    }
}

/// hipRTC, its table and version.
struct Hiprtc {
    api: HiprtcApi,
    version: (c_int, c_int),
    /// Never unloaded, like the runtime.
    _lib: ManuallyDrop<libloading::Library>,
}

impl Hiprtc {
    /// Loads the hipRTC of the same ROCm as `rt`: first from the runtime's own directory, by its major soname.
    fn load(rt: &Runtime) -> std::result::Result<Hiprtc, String> {
        let own = rt.path.parent().filter(|d| !d.as_os_str().is_empty()).map(Path::to_path_buf);
        let mut dirs: Vec<PathBuf> = own.clone().into_iter().collect();
        dirs.extend(sys::rocm_lib_dirs().into_iter().filter(|d| Some(d) != own.as_ref()));
        let names = sys::candidates("hiprtc", &[rt.version.0], &dirs);
        let (lib, path) = sys::load_first(&names)
            .map_err(|f| format!("cannot load libhiprtc: {}", f.first().map(String::as_str).unwrap_or("no name")))?;
        // SAFETY: `lib` is libhiprtc and is never unloaded.
        let api = unsafe { HiprtcApi::bind(&lib) }
            .map_err(|missing| format!("{} lacks {}", path.display(), missing.join(", ")))?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        let status = unsafe { (api.hiprtcVersion)(&mut major, &mut minor) };
        let rtc = Hiprtc { api, version: (major, minor), _lib: ManuallyDrop::new(lib) };
        rtc.ck("hiprtcVersion", status).map_err(|e| e.to_string())?;
        Ok(rtc)
    }

    fn ck(&self, call: &'static str, status: sys::hiprtcResult) -> Result<()> {
        if status == sys::HIPRTC_SUCCESS {
            return Ok(());
        }
        // SAFETY: hiprtcGetErrorString returns a static NUL-terminated string (or null) for any value.
        let msg = unsafe { c_text((self.api.hiprtcGetErrorString)(status)) }
            .unwrap_or_else(|| format!("hiprtcResult {status}"));
        Err(GpuError::Driver { call, code: status as i64, msg })
    }

    /// Compiles `lib` with `options`; a failure carries hipRTC's log.
    fn compile(&self, lib: &KernelLibrary, target_id: &str, options: &[String]) -> Result<Vec<u8>> {
        let src =
            CString::new(lib.source).map_err(|_| bad(format!("kernel library {} contains a NUL byte", lib.name)))?;
        let name =
            CString::new(format!("{}.cu", lib.name)).map_err(|_| bad("kernel library name contains a NUL byte"))?;
        let mut raw: sys::hiprtcProgram = null_mut();
        // SAFETY: both strings live through the call; no headers are passed.
        self.ck("hiprtcCreateProgram", unsafe {
            (self.api.hiprtcCreateProgram)(&mut raw, src.as_ptr(), name.as_ptr(), 0, null(), null())
        })?;
        let prog = Program { rtc: self, raw };
        let opts: Vec<CString> =
            options.iter().map(|o| CString::new(o.as_str()).expect("options have no NUL")).collect();
        let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: `ptrs` points at `opts`, which live through the call.
        let status = unsafe { (self.api.hiprtcCompileProgram)(prog.raw, ptrs.len() as c_int, ptrs.as_ptr()) };
        if let Err(e) = self.ck("hiprtcCompileProgram", status) {
            let log = prog.log();
            return Err(GpuError::Compile {
                library: lib.name.into(),
                arch: target_id.into(),
                log: if log.is_empty() { e.to_string() } else { log },
            });
        }
        prog.code()
    }
}

/// A hipRTC program, destroyed on drop.
struct Program<'a> {
    rtc: &'a Hiprtc,
    raw: sys::hiprtcProgram,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: the program was created by hiprtcCreateProgram and is destroyed once.
        let _ = unsafe { (self.rtc.api.hiprtcDestroyProgram)(&mut self.raw) };
    }
}

impl Program<'_> {
    fn log(&self) -> String {
        let mut n = 0usize;
        // SAFETY: writes one size.
        if unsafe { (self.rtc.api.hiprtcGetProgramLogSize)(self.raw, &mut n) } != sys::HIPRTC_SUCCESS || n == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` holds the log size hipRTC reported (NUL included).
        if unsafe { (self.rtc.api.hiprtcGetProgramLog)(self.raw, buf.as_mut_ptr() as *mut c_char) }
            != sys::HIPRTC_SUCCESS
        {
            return String::new();
        }
        String::from_utf8_lossy(&buf).trim_end_matches('\0').trim_end().to_string()
    }

    /// The code object (an AMDGPU ELF).
    fn code(&self) -> Result<Vec<u8>> {
        let mut n = 0usize;
        // SAFETY: writes one size.
        self.rtc.ck("hiprtcGetCodeSize", unsafe { (self.rtc.api.hiprtcGetCodeSize)(self.raw, &mut n) })?;
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` holds the size hipRTC reported.
        self.rtc
            .ck("hiprtcGetCode", unsafe { (self.rtc.api.hiprtcGetCode)(self.raw, buf.as_mut_ptr() as *mut c_char) })?;
        if buf.is_empty() {
            return Err(GpuError::Driver {
                call: "hiprtcGetCode",
                code: 0,
                msg: "hipRTC produced an empty code object".into(),
            });
        }
        Ok(buf)
    }
}

/// Opens the HIP driver on the device `opts` picks.
pub(crate) fn open(opts: &DriverOptions) -> Result<Arc<dyn Driver>> {
    let rt = Runtime::load().map_err(not_available)?;
    Ok(Arc::new(HipDriver::new(opts, rt)?))
}

/// What a token's memory is, so release undoes the right thing.
#[derive(Clone, Copy)]
enum Mem {
    /// hipMalloc / hipExtMallocWithFlags; `ipc` says whether it may be exported.
    Alloc { ipc: bool },
    /// A peer's allocation, opened with hipIpcOpenMemHandle.
    IpcMapped,
    /// hipMemCreate or an imported VMM handle, mapped at `ptr` for `mapped` bytes.
    Vmm { handle: sys::hipMemGenericAllocationHandle_t, mapped: usize },
}

struct MemEntry {
    ptr: *mut c_void,
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

pub(crate) struct HipDriver {
    info: DeviceInfo,
    ordinal: c_int,
    /// What `hipDeviceGet` returned for it, which `hipStreamGetDevice` reports.
    device: sys::hipDevice_t,
    /// The device's full target ID (`gfx942:sramecc+:xnack-`), what hipRTC compiles for.
    target_id: String,
    /// Whether the device supports VMM (`hipMemCreate` and the mapping calls).
    vmm: bool,
    /// The size unit of shared allocations and the alignment of VMM reservations ([`share_unit`]).
    share_unit: usize,
    rt: Runtime,
    /// hipRTC, or why it is not here (only module_load needs it).
    rtc: std::result::Result<Hiprtc, String>,
    next: AtomicU64,
    live: Mutex<Live>,
}

// SAFETY: the raw pointers (memory, and the handles kept as integers) are only used through the HIP runtime,
// which is thread-safe; the live sets are behind their mutex, and each method sets the device on its thread.
unsafe impl Send for HipDriver {}
// SAFETY: as above.
unsafe impl Sync for HipDriver {}

impl HipDriver {
    fn new(opts: &DriverOptions, rt: Runtime) -> Result<HipDriver> {
        let api = &rt.api;
        // SAFETY: hipInit may be called any number of times, from any thread.
        rt.ck("hipInit", unsafe { (api.hipInit)(0) })
            .map_err(|e| not_available(format!("{}: {e}", rt.path.display())))?;
        let mut count: c_int = 0;
        // SAFETY: writes one int.
        let status = unsafe { (api.hipGetDeviceCount)(&mut count) };
        if status == sys::hipErrorNoDevice || status == sys::hipErrorInsufficientDriver {
            return Err(not_available(format!(
                "{} loads but sees no device: {}",
                rt.path.display(),
                rt.ck("hipGetDeviceCount", status).unwrap_err()
            )));
        }
        rt.ck("hipGetDeviceCount", status)?;
        if count <= 0 {
            return Err(not_available(format!("{} loads but sees no device", rt.path.display())));
        }
        let ordinal = pick_ordinal(opts, count as usize)?;
        let dev_ord = ordinal as c_int;
        // SAFETY: the ordinal is below the count.
        rt.ck("hipSetDevice", unsafe { (api.hipSetDevice)(dev_ord) })?;
        let mut device: sys::hipDevice_t = 0;
        // SAFETY: writes one device.
        rt.ck("hipDeviceGet", unsafe { (api.hipDeviceGet)(&mut device, dev_ord) })?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds the length passed.
        rt.ck("hipDeviceGetName", unsafe { (api.hipDeviceGetName)(name.as_mut_ptr(), name.len() as c_int, device) })?;
        let name = c_buf_text(&name);
        let mut bus = [0 as c_char; 64];
        // SAFETY: the buffer holds the length passed (an id is 12 characters and a NUL).
        rt.ck("hipDeviceGetPCIBusId", unsafe {
            (api.hipDeviceGetPCIBusId)(bus.as_mut_ptr(), bus.len() as c_int, dev_ord)
        })?;
        let bus_id = c_buf_text(&bus).to_ascii_lowercase();
        let mut cus: c_int = 0;
        // SAFETY: writes one int.
        rt.ck("hipDeviceGetAttribute", unsafe {
            (api.hipDeviceGetAttribute)(&mut cus, sys::hipDeviceAttributeMultiprocessorCount, dev_ord)
        })?;
        let mut vmm: c_int = 0;
        // SAFETY: writes one int.
        rt.ck("hipDeviceGetAttribute", unsafe {
            (api.hipDeviceGetAttribute)(&mut vmm, sys::hipDeviceAttributeVirtualMemoryManagementSupported, dev_ord)
        })?;
        let vmm = vmm != 0;
        // Without VMM the granularity query may fail, and only IPC allocations (rounded to SHARE_UNIT) are made.
        let granularity = if vmm { Self::vmm_granularity(&rt, dev_ord)? } else { 0 };
        let target_id = Self::target_id(&rt, dev_ord)?;
        let arch = processor(&target_id)
            .ok_or_else(|| GpuError::Driver {
                call: "hipGetDevicePropertiesR0600",
                code: 0,
                msg: format!("gcnArchName {target_id:?} is not a gfx target ID"),
            })?
            .to_string();
        let rtc = Hiprtc::load(&rt);
        Ok(HipDriver {
            info: DeviceInfo {
                kind: DriverKind::Hip,
                name,
                ordinal,
                count: count as usize,
                arch,
                multiprocessors: cus.max(1) as usize,
                size_align: 512,
                bus_id,
            },
            ordinal: dev_ord,
            device,
            target_id,
            vmm,
            share_unit: share_unit(granularity),
            rt,
            rtc,
            next: AtomicU64::new(1),
            live: Mutex::default(),
        })
    }

    /// The device's `gcnArchName` (no attribute query returns it). The struct is filled into a buffer with
    /// room to spare, so a runtime that writes more than the 6.x layout cannot overrun it.
    fn target_id(rt: &Runtime, device: c_int) -> Result<String> {
        #[repr(C)]
        struct Padded {
            props: sys::hipDeviceProp_tR0600,
            _spare: [u8; 4096],
        }
        // SAFETY: all-zero bytes are a valid value of this plain C struct (integers, arrays, null pointers).
        let mut buf: Box<Padded> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: writes one hipDeviceProp_tR0600 into `buf`, which is larger.
        rt.ck("hipGetDevicePropertiesR0600", unsafe { (rt.api.hipGetDevicePropertiesR0600)(&mut buf.props, device) })?;
        let raw = &mut buf.props.gcnArchName;
        raw[raw.len() - 1] = 0;
        // SAFETY: NUL-terminated just above at the latest.
        Ok(unsafe { CStr::from_ptr(raw.as_ptr()) }.to_string_lossy().trim().to_string())
    }

    fn ck(&self, call: &'static str, status: sys::hipError_t) -> Result<()> {
        self.rt.ck(call, status)
    }

    fn api(&self) -> &HipApi {
        &self.rt.api
    }

    /// Makes this driver's device current on the calling thread.
    fn current(&self) -> Result<()> {
        // SAFETY: the ordinal was checked against the device count at open.
        self.ck("hipSetDevice", unsafe { (self.api().hipSetDevice)(self.ordinal) })
    }

    fn id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn insert(&self, ptr: *mut c_void, bytes: usize, mem: Mem) -> RawMem {
        let token = self.id();
        lock(&self.live).mems.insert(token, MemEntry { ptr, mem });
        RawMem { ptr: DevicePtr(ptr as u64), bytes, token }
    }

    fn stream(&self, h: Handle) -> Result<sys::hipStream_t> {
        let live = lock(&self.live);
        if live.streams.contains(&h) || live.adopted.contains_key(&h) {
            Ok(h as sys::hipStream_t)
        } else {
            Err(bad(format!("unknown stream {h:#x}")))
        }
    }

    fn event(&self, h: Handle) -> Result<sys::hipEvent_t> {
        if lock(&self.live).events.contains(&h) {
            Ok(h as sys::hipEvent_t)
        } else {
            Err(bad(format!("unknown event {h:#x}")))
        }
    }

    fn function(&self, h: Handle) -> Result<sys::hipFunction_t> {
        if lock(&self.live).kernels.contains_key(&h) {
            Ok(h as sys::hipFunction_t)
        } else {
            Err(bad(format!("unknown kernel {h:#x}")))
        }
    }

    fn location(&self) -> sys::hipMemLocation {
        device_location(self.ordinal)
    }

    /// The recommended VMM granularity of device `ordinal`.
    fn vmm_granularity(rt: &Runtime, ordinal: c_int) -> Result<usize> {
        let prop = vmm_prop(ordinal);
        let mut gran = 0usize;
        // SAFETY: `prop` is a complete allocation description; writes one size.
        rt.ck("hipMemGetAllocationGranularity", unsafe {
            (rt.api.hipMemGetAllocationGranularity)(&mut gran, &prop, sys::hipMemAllocationGranularityRecommended)
        })?;
        Ok(gran)
    }

    /// `bytes` rounded up to the size unit of shared allocations; a peer that imports an allocation rounds its
    /// size the same way, so it maps all of it.
    fn shared_size(&self, bytes: usize) -> Result<usize> {
        round_up(bytes, self.share_unit).ok_or_else(|| bad(format!("shared allocation of {bytes} bytes overflows")))
    }

    /// Refuses VMM work on a device without VMM support.
    fn check_vmm(&self) -> Result<()> {
        if self.vmm {
            Ok(())
        } else {
            Err(unsupported(NO_VMM))
        }
    }

    /// Reserves an address range for `size` bytes of `handle`, maps it and opens it read-write to this device.
    fn vmm_map(&self, handle: sys::hipMemGenericAllocationHandle_t, size: usize) -> Result<*mut c_void> {
        let api = self.api();
        let mut ptr: *mut c_void = null_mut();
        // SAFETY: writes one address; no fixed address. Aligned as CUDA's reservations are (runtimes that predate
        // aligned reservations ignore the alignment).
        self.ck("hipMemAddressReserve", unsafe {
            (api.hipMemAddressReserve)(&mut ptr, size, self.share_unit, null_mut(), 0)
        })?;
        // SAFETY: the range was just reserved with this size.
        if let Err(e) = self.ck("hipMemMap", unsafe { (api.hipMemMap)(ptr, size, 0, handle, 0) }) {
            // SAFETY: as above; nothing is mapped in it.
            let _ = unsafe { (api.hipMemAddressFree)(ptr, size) };
            return Err(e);
        }
        let desc = sys::hipMemAccessDesc { location: self.location(), flags: sys::hipMemAccessFlagsProtReadWrite };
        // SAFETY: the range is mapped; one descriptor is passed.
        if let Err(e) = self.ck("hipMemSetAccess", unsafe { (api.hipMemSetAccess)(ptr, size, &desc, 1) }) {
            // SAFETY: undoes the mapping and reservation made above.
            unsafe {
                let _ = (api.hipMemUnmap)(ptr, size);
                let _ = (api.hipMemAddressFree)(ptr, size);
            }
            return Err(e);
        }
        Ok(ptr)
    }

    /// An IPC handle for the hipMalloc / hipExtMallocWithFlags allocation that starts at `base`.
    fn ipc_handle(&self, base: *mut c_void) -> Result<Vec<u8>> {
        let mut handle = sys::hipIpcMemHandle_t { reserved: [0; sys::HIP_IPC_HANDLE_SIZE] };
        // SAFETY: writes one handle; the runtime checks that `base` is an exportable allocation.
        self.ck("hipIpcGetMemHandle", unsafe { (self.api().hipIpcGetMemHandle)(&mut handle, base) })?;
        Ok(handle.reserved.iter().map(|&c| c as u8).collect())
    }

    /// A POSIX file descriptor for the VMM allocation `handle`.
    fn export_fd(&self, handle: sys::hipMemGenericAllocationHandle_t) -> Result<OwnedFd> {
        let mut fd: c_int = -1;
        // SAFETY: for a POSIX file descriptor the shareable handle is an int, written here.
        self.ck("hipMemExportToShareableHandle", unsafe {
            (self.api().hipMemExportToShareableHandle)(
                &mut fd as *mut c_int as *mut c_void,
                handle,
                sys::hipMemHandleTypePosixFileDescriptor,
                0,
            )
        })?;
        if fd < 0 {
            return Err(GpuError::Driver { call: "hipMemExportToShareableHandle", code: 0, msg: format!("fd {fd}") });
        }
        // SAFETY: the runtime hands us a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Whether `ptr` lies in a VMM mapping (hipMemMap) this device can access.
    fn vmm_mapped(&self, ptr: *mut c_void) -> bool {
        if !vmm_query_works(self.rt.version) {
            return false;
        }
        let mut flags = 0u64;
        let location = self.location();
        // SAFETY: writes one flag word; the runtime looks the address up among its VMM mappings and fails for any
        // other address. Only the choice of export path depends on the answer.
        unsafe { (self.api().hipMemGetAccess)(&mut flags, &location, ptr) == sys::hipSuccess }
    }

    /// Exports an allocation another allocator of this device made (a framework's tensor): VMM memory as a file
    /// descriptor, else hipMalloc memory as an IPC handle.
    fn share_foreign(&self, base: *mut c_void) -> Result<ShareHandle> {
        if !self.vmm_mapped(base) {
            return self.ipc_handle(base).map(ShareHandle::Ipc).map_err(|e| {
                unsupported(format!(
                    "the allocation at {base:p} cannot be shared with other processes: it is not hipMalloc memory \
                     that hipIpcGetMemHandle exports (memory from a stream-ordered pool, hipMallocAsync, is not), \
                     nor a VMM mapping{} ({e})",
                    if vmm_query_works(self.rt.version) { "" } else { " (which HIP before 6.1 cannot tell apart)" }
                ))
            });
        }
        let api = self.api();
        let mut handle: sys::hipMemGenericAllocationHandle_t = null_mut();
        // SAFETY: `base` is a VMM mapping (checked above, so this runtime finds its allocation); writes one handle.
        self.ck("hipMemRetainAllocationHandle", unsafe { (api.hipMemRetainAllocationHandle)(&mut handle, base) })?;
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
        self.export_fd(handle).map(ShareHandle::Vmm)
    }

    /// Undoes whatever `entry` is; tries every step and reports the first failure.
    fn free(&self, entry: &MemEntry) -> Result<()> {
        let api = self.api();
        match entry.mem {
            // SAFETY: the pointer came from hipMalloc / hipExtMallocWithFlags and its token was just removed.
            Mem::Alloc { .. } => self.ck("hipFree", unsafe { (api.hipFree)(entry.ptr) }),
            // SAFETY: the pointer came from hipIpcOpenMemHandle and is closed once.
            Mem::IpcMapped => self.ck("hipIpcCloseMemHandle", unsafe { (api.hipIpcCloseMemHandle)(entry.ptr) }),
            Mem::Vmm { handle, mapped } => {
                // SAFETY: the range and handle were made by vmm_create or vmm_import_fd and are undone once.
                let steps = unsafe {
                    [
                        self.ck("hipMemUnmap", (api.hipMemUnmap)(entry.ptr, mapped)),
                        self.ck("hipMemAddressFree", (api.hipMemAddressFree)(entry.ptr, mapped)),
                        self.ck("hipMemRelease", (api.hipMemRelease)(handle)),
                    ]
                };
                steps.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
            }
        }
    }

    /// Loads a code object, copied to 8-byte-aligned memory first.
    fn load_image(&self, image: &[u8]) -> Result<sys::hipModule_t> {
        let mut words = vec![0u64; image.len().div_ceil(8) + 1];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..image.len()].copy_from_slice(image);
        let mut module: sys::hipModule_t = null_mut();
        // SAFETY: the image stays alive through the call, which copies what it needs.
        self.ck("hipModuleLoadData", unsafe {
            (self.api().hipModuleLoadData)(&mut module, words.as_ptr() as *const c_void)
        })?;
        Ok(module)
    }

    fn add_module(&self, module: sys::hipModule_t) -> Handle {
        let h = module as Handle;
        lock(&self.live).modules.insert(h);
        h
    }
}

impl Driver for HipDriver {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize, kind: MemKind) -> Result<RawMem> {
        self.current()?;
        let api = self.api();
        let mut ptr: *mut c_void = null_mut();
        let size = match kind {
            MemKind::Ipc { .. } => self.shared_size(bytes)?,
            MemKind::Device => bytes.max(1),
        };
        // Never the async pool: pool memory cannot be IPC-exported.
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
        Ok(self.insert(ptr, bytes, Mem::Alloc { ipc: matches!(kind, MemKind::Ipc { .. }) }))
    }

    fn ipc_export(&self, mem: &RawMem) -> Result<Vec<u8>> {
        self.current()?;
        let ptr = match lock(&self.live).mems.get(&mem.token) {
            Some(MemEntry { ptr, mem: Mem::Alloc { ipc: true } }) => *ptr,
            _ => return Err(bad("ipc_export of memory not allocated with MemKind::Ipc")),
        };
        self.ipc_handle(ptr)
    }

    fn ipc_import(&self, handle: &[u8], bytes: usize) -> Result<RawMem> {
        self.current()?;
        let api = self.api();
        let mut h = sys::hipIpcMemHandle_t { reserved: [0; sys::HIP_IPC_HANDLE_SIZE] };
        if handle.len() != h.reserved.len() {
            return Err(bad(format!("a HIP IPC handle is {} bytes, not {}", h.reserved.len(), handle.len())));
        }
        h.reserved.iter_mut().zip(handle).for_each(|(d, &s)| *d = s as c_char);
        let mut ptr: *mut c_void = null_mut();
        // SAFETY: writes one device pointer; the runtime validates the handle.
        self.ck("hipIpcOpenMemHandle", unsafe {
            (api.hipIpcOpenMemHandle)(&mut ptr, h, sys::hipIpcMemLazyEnablePeerAccess)
        })?;
        let (mut base, mut size): (*mut c_void, usize) = (null_mut(), 0);
        // SAFETY: `ptr` is a live mapping; writes one pointer and one size.
        let range = self.ck("hipMemGetAddressRange", unsafe { (api.hipMemGetAddressRange)(&mut base, &mut size, ptr) });
        // A range the runtime reports too small is refused. One it cannot report is let through: whether an IPC
        // mapping is tracked for this query has varied between ROCm releases, and hipIpcOpenMemHandle already
        // validated the handle.
        if range.is_ok() {
            let held = (base as u64 + size as u64).saturating_sub(ptr as u64);
            if held < bytes as u64 {
                // SAFETY: closes the mapping just opened.
                let _ = unsafe { (api.hipIpcCloseMemHandle)(ptr) };
                return Err(bad(format!("IPC allocation holds {held} bytes, {bytes} asked for")));
            }
        }
        Ok(self.insert(ptr, bytes, Mem::IpcMapped))
    }

    fn vmm_create(&self, bytes: usize) -> Result<RawMem> {
        self.check_vmm()?;
        self.current()?;
        let size = self.shared_size(bytes)?;
        let prop = vmm_prop(self.ordinal);
        let mut handle: sys::hipMemGenericAllocationHandle_t = null_mut();
        // SAFETY: `prop` is complete and `size` a multiple of its granularity; writes one handle.
        self.ck("hipMemCreate", unsafe { (self.api().hipMemCreate)(&mut handle, size, &prop, 0) })?;
        match self.vmm_map(handle, size) {
            Ok(ptr) => Ok(self.insert(ptr, bytes, Mem::Vmm { handle, mapped: size })),
            Err(e) => {
                // SAFETY: the handle was just created and is mapped nowhere.
                let _ = unsafe { (self.api().hipMemRelease)(handle) };
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
        self.export_fd(handle)
    }

    fn vmm_import_fd(&self, fd: OwnedFd, bytes: usize) -> Result<RawMem> {
        self.check_vmm()?;
        self.current()?;
        let size = self.shared_size(bytes)?;
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
        // The imported handle keeps the allocation alive; the descriptor is no longer needed.
        drop(fd);
        match self.vmm_map(handle, size) {
            Ok(ptr) => Ok(self.insert(ptr, bytes, Mem::Vmm { handle, mapped: size })),
            Err(e) => {
                // SAFETY: the handle was just imported and is mapped nowhere.
                let _ = unsafe { (self.api().hipMemRelease)(handle) };
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
        self.free(&entry)
    }

    fn share_range(&self, ptr: DevicePtr, bytes: usize) -> Result<SharedRange> {
        self.current()?;
        let (mut base, mut size): (*mut c_void, usize) = (null_mut(), 0);
        // SAFETY: writes one pointer and one size; the runtime looks the address up. For VMM memory the range is
        // the one hipMemMap mapping (one hipMemCreate allocation) that holds the address.
        self.ck("hipMemGetAddressRange", unsafe {
            (self.api().hipMemGetAddressRange)(&mut base, &mut size, ptr.0 as *mut c_void)
        })
        .map_err(|e| {
            unsupported(format!("{:#x} is not device memory of this runtime, so it cannot be shared ({e})", ptr.0))
        })?;
        let offset = offset_in(DevicePtr(base as u64), size, ptr, bytes)?;
        let own = lock(&self.live).mems.values().find(|e| e.ptr == base).map(|e| e.mem);
        let handle = match own {
            Some(Mem::Alloc { ipc: true }) => ShareHandle::Ipc(self.ipc_handle(base)?),
            Some(Mem::Alloc { ipc: false }) => return Err(unsupported(PRIVATE_MEMORY)),
            Some(Mem::IpcMapped) => return Err(unsupported(REIMPORTED_MEMORY)),
            Some(Mem::Vmm { handle, .. }) => ShareHandle::Vmm(self.export_fd(handle)?),
            None => self.share_foreign(base)?,
        };
        Ok(SharedRange { handle, base: DevicePtr(base as u64), alloc_bytes: size, offset })
    }

    fn stream_create(&self) -> Result<Handle> {
        self.current()?;
        let mut s: sys::hipStream_t = null_mut();
        // SAFETY: writes one stream.
        self.ck("hipStreamCreateWithFlags", unsafe {
            (self.api().hipStreamCreateWithFlags)(&mut s, sys::hipStreamNonBlocking)
        })?;
        lock(&self.live).streams.insert(s as Handle);
        Ok(s as Handle)
    }
    fn stream_destroy(&self, stream: Handle) -> Result<()> {
        self.current()?;
        if !lock(&self.live).streams.remove(&stream) {
            return Err(bad(format!("unknown stream {stream:#x}")));
        }
        // SAFETY: a live stream of ours, destroyed once.
        self.ck("hipStreamDestroy", unsafe { (self.api().hipStreamDestroy)(stream as sys::hipStream_t) })
    }
    fn stream_adopt(&self, raw: Handle) -> Result<Handle> {
        self.current()?;
        let mut device: sys::hipDevice_t = -1;
        // SAFETY: the caller vouches (Gpu::borrow_stream) that `raw` is a live stream, and the runtime checks it;
        // writes one device. The null and per-thread streams report the current device, which is ours.
        self.ck("hipStreamGetDevice", unsafe {
            (self.api().hipStreamGetDevice)(raw as sys::hipStream_t, &mut device)
        })?;
        if device != self.device {
            return Err(bad(format!(
                "stream {raw:#x} belongs to device {device}, not to this driver's device {}",
                self.device
            )));
        }
        *lock(&self.live).adopted.entry(raw).or_default() += 1;
        Ok(raw)
    }
    fn peer_link(&self, bus_id: &str) -> Result<Option<PeerLink>> {
        if bus_id.eq_ignore_ascii_case(&self.info.bus_id) {
            return Ok(None);
        }
        let Ok(c_bus) = std::ffi::CString::new(bus_id) else {
            return Err(GpuError::BadArgs(format!("bus id {bus_id:?} holds a NUL byte")));
        };
        let api = &self.rt.api;
        let mut peer: c_int = 0;
        // SAFETY: a NUL-terminated bus id; writes one device. A device this process cannot see is not an error.
        if unsafe { (api.hipDeviceGetByPCIBusId)(&mut peer, c_bus.as_ptr()) } != sys::hipSuccess {
            return Ok(None);
        }
        let me = self.info.ordinal as c_int;
        let attr = |a: c_int| -> Result<bool> {
            let mut v: c_int = 0;
            // SAFETY: writes one int; both devices are valid ordinals of this process.
            self.rt.ck("hipDeviceGetP2PAttribute", unsafe { (api.hipDeviceGetP2PAttribute)(&mut v, a, me, peer) })?;
            Ok(v != 0)
        };
        Ok(Some(PeerLink {
            access: attr(sys::hipDevP2PAttrAccessSupported)?,
            native_atomics: attr(sys::hipDevP2PAttrNativeAtomicSupported)?,
        }))
    }

    fn stream_forget(&self, stream: Handle) -> Result<()> {
        forget(&mut lock(&self.live).adopted, stream)
    }
    fn stream_sync(&self, stream: Handle) -> Result<()> {
        self.current()?;
        let s = self.stream(stream)?;
        // SAFETY: a live stream.
        self.ck("hipStreamSynchronize", unsafe { (self.api().hipStreamSynchronize)(s) })
    }
    fn event_create(&self) -> Result<Handle> {
        self.current()?;
        let mut e: sys::hipEvent_t = null_mut();
        // SAFETY: writes one event; default flags keep timing on.
        self.ck("hipEventCreateWithFlags", unsafe {
            (self.api().hipEventCreateWithFlags)(&mut e, sys::hipEventDefault)
        })?;
        lock(&self.live).events.insert(e as Handle);
        Ok(e as Handle)
    }
    fn event_destroy(&self, event: Handle) -> Result<()> {
        self.current()?;
        if !lock(&self.live).events.remove(&event) {
            return Err(bad(format!("unknown event {event:#x}")));
        }
        // SAFETY: a live event of ours, destroyed once.
        self.ck("hipEventDestroy", unsafe { (self.api().hipEventDestroy)(event as sys::hipEvent_t) })
    }
    fn event_record(&self, event: Handle, stream: Handle) -> Result<()> {
        self.current()?;
        let (e, s) = (self.event(event)?, self.stream(stream)?);
        // SAFETY: a live event and stream.
        self.ck("hipEventRecord", unsafe { (self.api().hipEventRecord)(e, s) })
    }
    fn event_sync(&self, event: Handle) -> Result<()> {
        self.current()?;
        let e = self.event(event)?;
        // SAFETY: a live event.
        self.ck("hipEventSynchronize", unsafe { (self.api().hipEventSynchronize)(e) })
    }
    fn event_elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32> {
        self.current()?;
        let (a, b) = (self.event(start)?, self.event(end)?);
        let mut ms = 0f32;
        // SAFETY: two live events; writes one float.
        self.ck("hipEventElapsedTime", unsafe { (self.api().hipEventElapsedTime)(&mut ms, a, b) })?;
        Ok(ms)
    }

    fn memcpy_dtod(&self, stream: Handle, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.current()?;
        let s = self.stream(stream)?;
        // SAFETY: device addresses; the runtime checks them, and the callers size ranges from their buffers.
        self.ck("hipMemcpyAsync", unsafe {
            (self.api().hipMemcpyAsync)(
                dst.0 as *mut c_void,
                src.0 as *const c_void,
                bytes,
                sys::hipMemcpyDeviceToDevice,
                s,
            )
        })
    }
    fn memset_d8(&self, stream: Handle, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        self.current()?;
        let s = self.stream(stream)?;
        // SAFETY: as above.
        self.ck("hipMemsetD8Async", unsafe { (self.api().hipMemsetD8Async)(dst.0 as *mut c_void, value, bytes, s) })
    }
    fn memcpy_htod(&self, stream: Handle, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.current()?;
        let s = self.stream(stream)?;
        // SAFETY: `src` is borrowed until the stream is synchronised below; `dst` was range-checked by the caller.
        self.ck("hipMemcpyAsync", unsafe {
            (self.api().hipMemcpyAsync)(
                dst.0 as *mut c_void,
                src.as_ptr() as *const c_void,
                src.len(),
                sys::hipMemcpyHostToDevice,
                s,
            )
        })?;
        // SAFETY: a live stream.
        self.ck("hipStreamSynchronize", unsafe { (self.api().hipStreamSynchronize)(s) })
    }
    fn memcpy_dtoh(&self, stream: Handle, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        self.current()?;
        let s = self.stream(stream)?;
        // SAFETY: `dst` is borrowed mutably until the stream is synchronised below; `src` was range-checked.
        self.ck("hipMemcpyAsync", unsafe {
            (self.api().hipMemcpyAsync)(
                dst.as_mut_ptr() as *mut c_void,
                src.0 as *const c_void,
                dst.len(),
                sys::hipMemcpyDeviceToHost,
                s,
            )
        })?;
        // SAFETY: a live stream.
        self.ck("hipStreamSynchronize", unsafe { (self.api().hipStreamSynchronize)(s) })
    }

    fn module_load(&self, lib: &KernelLibrary) -> Result<Handle> {
        self.current()?;
        let rtc = self
            .rtc
            .as_ref()
            .map_err(|why| not_available(format!("hipRTC is needed to compile kernel library {}: {why}", lib.name)))?;
        let mut options = vec![format!("--offload-arch={}", self.target_id)];
        options.extend(HIPRTC_OPTIONS.iter().map(|o| o.to_string()));
        let (a, b, c) = self.rt.version;
        let version = format!("hiprtc {}.{} (HIP {a}.{b}.{c})", rtc.version.0, rtc.version.1);
        let path = kernel_cache::image_path(lib, &self.info.arch, "hsaco", &options, &version);
        if let Some(image) = path.as_deref().and_then(|p| std::fs::read(p).ok()) {
            // A cached image the runtime refuses (corrupt, or from another ROCm) is recompiled and replaced.
            if let Ok(module) = self.load_image(&image) {
                return Ok(self.add_module(module));
            }
        }
        let image = rtc.compile(lib, &self.target_id, &options)?;
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
        self.ck("hipModuleUnload", unsafe { (self.api().hipModuleUnload)(module as sys::hipModule_t) })
    }
    fn kernel(&self, module: Handle, name: &str) -> Result<Handle> {
        self.current()?;
        if !lock(&self.live).modules.contains(&module) {
            return Err(bad(format!("unknown module {module:#x}")));
        }
        let cname = CString::new(name).map_err(|_| bad(format!("kernel name {name:?} contains a NUL byte")))?;
        let mut f: sys::hipFunction_t = null_mut();
        // SAFETY: a live module; the name lives through the call; writes one function.
        self.ck("hipModuleGetFunction", unsafe {
            (self.api().hipModuleGetFunction)(&mut f, module as sys::hipModule_t, cname.as_ptr())
        })?;
        lock(&self.live).kernels.insert(f as Handle, module);
        Ok(f as Handle)
    }
    fn max_resident_blocks(&self, kernel: Handle, block: u32, shared_bytes: u32) -> Result<usize> {
        self.current()?;
        let f = self.function(kernel)?;
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
        Ok(n.max(0) as usize * self.info.multiprocessors)
    }
    fn launch(&self, stream: Handle, kernel: Handle, dims: LaunchDims, params: &[u8]) -> Result<()> {
        let mut args = kernel_args(params)?;
        self.current()?;
        let (f, s) = (self.function(kernel)?, self.stream(stream)?);
        let args = if params.is_empty() { null_mut() } else { args.as_mut_ptr() };
        // SAFETY: a live function and stream; `args` and the bytes it points at outlive the call.
        self.ck("hipModuleLaunchKernel", unsafe {
            (self.api().hipModuleLaunchKernel)(
                f,
                dims.grid,
                1,
                1,
                dims.block,
                1,
                1,
                dims.shared_bytes,
                s,
                args,
                null_mut(),
            )
        })
    }

    fn capture_begin(&self, stream: Handle) -> Result<()> {
        self.current()?;
        let s = self.stream(stream)?;
        // SAFETY: a live stream. Thread-local mode leaves other threads' work alone.
        self.ck("hipStreamBeginCapture", unsafe {
            (self.api().hipStreamBeginCapture)(s, sys::hipStreamCaptureModeThreadLocal)
        })
    }
    fn capturing(&self, stream: Handle) -> Result<bool> {
        self.current()?;
        let s = self.stream(stream)?;
        let mut status = sys::hipStreamCaptureStatusNone;
        // SAFETY: a live stream; writes one status.
        self.ck("hipStreamIsCapturing", unsafe { (self.api().hipStreamIsCapturing)(s, &mut status) })?;
        Ok(status != sys::hipStreamCaptureStatusNone)
    }
    fn capture_end(&self, stream: Handle) -> Result<Handle> {
        self.current()?;
        let s = self.stream(stream)?;
        let api = self.api();
        let mut graph: sys::hipGraph_t = null_mut();
        // SAFETY: a live stream; writes one graph.
        self.ck("hipStreamEndCapture", unsafe { (api.hipStreamEndCapture)(s, &mut graph) })?;
        let mut exec: sys::hipGraphExec_t = null_mut();
        // SAFETY: the graph just captured; writes one executable graph.
        if let Err(e) =
            self.ck("hipGraphInstantiate", unsafe { (api.hipGraphInstantiateWithFlags)(&mut exec, graph, 0) })
        {
            // SAFETY: the graph is ours and used nowhere else.
            let _ = unsafe { (api.hipGraphDestroy)(graph) };
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
        self.ck("hipGraphLaunch", unsafe { (self.api().hipGraphLaunch)(graph as sys::hipGraphExec_t, s) })
    }
    fn graph_destroy(&self, graph: Handle) -> Result<()> {
        self.current()?;
        let g = lock(&self.live).graphs.remove(&graph).ok_or_else(|| bad(format!("unknown graph {graph:#x}")))?;
        let api = self.api();
        // SAFETY: the executable graph and its graph are ours, destroyed once.
        let steps = unsafe {
            [
                self.ck("hipGraphExecDestroy", (api.hipGraphExecDestroy)(graph as sys::hipGraphExec_t)),
                self.ck("hipGraphDestroy", (api.hipGraphDestroy)(g as sys::hipGraph_t)),
            ]
        };
        steps.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }
}

impl Drop for HipDriver {
    fn drop(&mut self) {
        // The RAII wrappers hold the driver, so normally nothing is left here; whatever is, is released once.
        if self.current().is_err() {
            return;
        }
        let live = std::mem::take(&mut *lock(&self.live));
        let api = self.api();
        // SAFETY: every handle below is live and ours; each is taken out of the live set, so it is undone once.
        unsafe {
            for (exec, graph) in live.graphs {
                let _ = (api.hipGraphExecDestroy)(exec as sys::hipGraphExec_t);
                let _ = (api.hipGraphDestroy)(graph as sys::hipGraph_t);
            }
            for e in live.events {
                let _ = (api.hipEventDestroy)(e as sys::hipEvent_t);
            }
            // Streams that were only adopted (`live.adopted`) belong to the caller and are left alone.
            for s in live.streams {
                let _ = (api.hipStreamDestroy)(s as sys::hipStream_t);
            }
            for m in live.modules {
                let _ = (api.hipModuleUnload)(m as sys::hipModule_t);
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
    use crate::Backend;

    fn opts() -> DriverOptions {
        DriverOptions { device: None, local_rank: None, shm_prefix: String::new() }
    }

    #[test]
    fn open_without_rocm_is_not_available_naming_libamdhip64() {
        match open(&opts()) {
            Ok(d) => assert_eq!(d.info().kind, DriverKind::Hip),
            Err(GpuError::NotAvailable { backend, reason }) => {
                assert_eq!(backend, "hip");
                if Runtime::load().is_err() {
                    assert!(reason.contains(HIP_LIBRARY), "{reason}");
                }
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
        // Through the public entry point too; `auto` passes over it with a note.
        match crate::open(Backend::Hip, &opts()) {
            Ok(o) => assert_eq!(o.gpu.kind(), DriverKind::Hip),
            Err(e) => assert!(matches!(e, GpuError::NotAvailable { backend: "hip", .. }), "{e}"),
        }
        let auto = crate::open(Backend::Auto, &opts()).expect("auto always opens something");
        if auto.gpu.kind() != DriverKind::Hip {
            assert!(auto.notes.iter().any(|n| n.starts_with("hip: ")), "{:?}", auto.notes);
        }
    }

    #[test]
    fn target_ids_reduce_to_their_processor() {
        assert_eq!(processor("gfx942:sramecc+:xnack-"), Some("gfx942"));
        assert_eq!(processor("gfx90a:sramecc+:xnack-"), Some("gfx90a"));
        assert_eq!(processor("gfx1100"), Some("gfx1100"));
        assert_eq!(processor(" gfx942 "), Some("gfx942"));
        assert_eq!(processor(""), None);
        assert_eq!(processor("gfx"), None);
        assert_eq!(processor("sm_90"), None);
        assert_eq!(processor("gfx94-2:xnack+"), None);
    }

    #[test]
    fn shared_allocations_come_in_whole_units_of_at_least_2_mib() {
        assert_eq!(share_unit(4096), 2 << 20, "a page-sized granularity");
        assert_eq!(share_unit(0), 2 << 20, "no VMM, no granularity");
        assert_eq!(share_unit(2 << 20), 2 << 20);
        assert_eq!(share_unit(8 << 20), 8 << 20, "a larger granularity wins");
        assert_eq!(round_up(12 << 10, share_unit(4096)), Some(2 << 20), "a flag array takes a whole unit");
    }

    #[test]
    fn vmm_sizes_round_up_to_the_granularity() {
        assert_eq!(round_up(1, 2 << 20), Some(2 << 20));
        assert_eq!(round_up(2 << 20, 2 << 20), Some(2 << 20));
        assert_eq!(round_up((2 << 20) + 1, 2 << 20), Some(4 << 20));
        assert_eq!(round_up(0, 4096), Some(4096), "at least one unit");
        assert_eq!(round_up(100, 0), Some(100), "a zero granularity counts as one byte");
        assert_eq!(round_up(usize::MAX, 4096), None);
    }

    #[test]
    fn versions_decode_and_pick_the_fd_convention() {
        assert_eq!(decode_version(60_241_134), (6, 2, 41134));
        assert_eq!(decode_version(70_151_831), (7, 1, 51831));
        assert_eq!(decode_version(-1), (0, 0, 0));
        assert!(!fd_passed_by_value((6, 4, 43484)));
        assert!(!fd_passed_by_value((7, 0, 51831)));
        assert!(fd_passed_by_value((7, 1, 52802)));
        assert!(fd_passed_by_value((8, 0, 0)));
    }

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
        // What HIP reads through the one entry is the struct itself.
        // SAFETY: args[0] points at `bytes`, a live `P`.
        let back: P = unsafe { std::ptr::read_unaligned(args[0] as *const P) };
        assert_eq!(bytemuck::bytes_of(&back), bytes);
        assert!(kernel_args(&[0u8; MAX_PARAM_BYTES]).is_ok());
        assert!(matches!(kernel_args(&[0u8; MAX_PARAM_BYTES + 1]), Err(GpuError::BadArgs(_))));
    }
}
