//! Loading libcuda and NVRTC before cudarc is touched: cudarc panics when a library or symbol is missing, so each
//! library is loaded here by cudarc's names, in cudarc's order, and every symbol this driver calls is checked.

use cudarc::driver::sys as cu;
use std::ffi::c_void;

/// The driver-API entry points this driver calls (cudarc resolves each by exactly this name on first use).
pub(super) const DRIVER_SYMBOLS: &[&str] = &[
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
pub(super) const ELAPSED_SYMBOLS: [&str; 2] = ["cuEventElapsedTime_v2", "cuEventElapsedTime"];
pub(super) type ElapsedFn = unsafe extern "C" fn(*mut f32, cu::CUevent, cu::CUevent) -> cu::CUresult;

pub(super) const NVRTC_SYMBOLS: &[&str] = &[
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

/// Loads the first of `names` that loads (as cudarc's loader does) and checks that it has every symbol in
/// `symbols`. Returns the library and the name it was loaded by.
pub(super) fn probe(names: &[String], symbols: &[&str]) -> std::result::Result<(libloading::Library, String), String> {
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

pub(super) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}
