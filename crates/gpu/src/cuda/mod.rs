//! The CUDA driver: cudarc's raw driver-API and NVRTC bindings, loaded at run time, under the shared core
//! ([`crate::device`]).
//!
//! cudarc panics when its library or one of its symbols is missing, so [`open`] first loads the libraries itself
//! ([`probe`]); only then does it call cudarc, inside `catch_unwind` as a second guard. A machine without CUDA gets
//! [`GpuError::NotAvailable`], never a panic.
//!
//! Handles are the driver's own pointers (`CUstream`, `CUevent`, `CUmodule`, `CUfunction`, `CUgraphExec`) as
//! integers. Every call makes the device's primary context current first, so the driver may be used from any
//! thread. Memory: `cuMemAlloc` (pool memory cannot be IPC-exported), IPC memory rounded up to the allocation
//! granularity; VMM is `cuMemCreate` with POSIX-fd handles. Never multicast.

mod nvrtc;
mod probe;
mod raw;

use crate::device::Device;
use crate::{c_buf_text, pick_ordinal, DeviceInfo, Driver, DriverKind, DriverOptions, GpuError, Result};
use cudarc::driver::sys as cu;
use nvrtc::Nvrtc;
use probe::{panic_text, probe, ElapsedFn, DRIVER_SYMBOLS, ELAPSED_SYMBOLS, NVRTC_SYMBOLS};
use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{null, null_mut};
use std::sync::Arc;

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

fn not_available(reason: String) -> GpuError {
    GpuError::NotAvailable { backend: "cuda", reason }
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
    match catch_unwind(AssertUnwindSafe(|| Cuda::new(opts, lib, elapsed, nvrtc).and_then(Device::new))) {
        Ok(d) => Ok(Arc::new(d?)),
        Err(p) => Err(not_available(format!("cudarc panicked while opening {lib_name}: {}", panic_text(&*p)))),
    }
}

/// One CUDA device: its primary context and what its calls need.
pub(crate) struct Cuda {
    info: DeviceInfo,
    device: cu::CUdevice,
    ctx: cu::CUcontext,
    /// `major * 10 + minor`.
    cc: c_int,
    elapsed: ElapsedFn,
    /// NVRTC, or why it is not here (only module_load needs it).
    nvrtc: std::result::Result<Nvrtc, String>,
    /// Holds libcuda loaded while `elapsed` points into it.
    _lib: libloading::Library,
}

// SAFETY: `ctx` is the device's primary context, which the driver API lets any thread make current (each call
// does); every driver-API call used here is thread-safe.
unsafe impl Send for Cuda {}
// SAFETY: as above.
unsafe impl Sync for Cuda {}

impl Cuda {
    fn new(
        opts: &DriverOptions,
        lib: libloading::Library,
        elapsed: ElapsedFn,
        nvrtc: std::result::Result<(libloading::Library, String), String>,
    ) -> Result<Cuda> {
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
        let mut version: c_int = 0;
        // SAFETY: writes one int.
        ck("cuDriverGetVersion", unsafe { cu::cuDriverGetVersion(&mut version) })?;
        let mut ctx: cu::CUcontext = null_mut();
        // SAFETY: writes one context; released in Drop.
        ck("cuDevicePrimaryCtxRetain", unsafe { cu::cuDevicePrimaryCtxRetain(&mut ctx, device) })?;
        let nvrtc = nvrtc.and_then(|l| Nvrtc::new(l).map_err(|e| e.to_string()));
        Ok(Cuda {
            info: DeviceInfo {
                kind: DriverKind::Cuda,
                name,
                ordinal,
                count: count as usize,
                arch: format!("sm_{major}{minor}"),
                multiprocessors: sms.max(1) as usize,
                size_align: 256,
                bus_id,
                driver_version: format!("CUDA {}.{}", version / 1000, version % 1000 / 10),
            },
            device,
            ctx,
            cc: major * 10 + minor,
            elapsed,
            nvrtc,
            _lib: lib,
        })
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        // SAFETY: balances the retain in new; the core has released everything made in the context by now.
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
