//! The slice of the HIP runtime and hipRTC C ABI that the hip driver calls, loaded at run time with
//! `libloading`, written out from ROCm's `hip_runtime_api.h` / `hiprtc.h` (checked against the 6.0, 6.2 and
//! 7.x headers; every struct below has a layout test). Nothing links at build time.
//!
//! Why not `cubecl-hip-sys`: it loads at run time too, but it picks its bindings (struct layouts, symbol
//! versions) at build time from `hipconfig` (a ROCm without a matching bindings file, such as 6.0 or 6.1, fails
//! to build the whole workspace), it panics on a missing library or symbol, and it resolves every symbol with
//! `dlsym` on every call (the launch path included).

// The C names are kept so each item can be looked up in the ROCm headers as written.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use libloading::Library;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};

pub type hipError_t = c_int;
pub const hipSuccess: hipError_t = 0;
pub const hipErrorInsufficientDriver: hipError_t = 35;
pub const hipErrorNoDevice: hipError_t = 100;
/// hipEventQuery / hipStreamQuery: the work is not yet complete.
pub const hipErrorNotReady: hipError_t = 600;

pub type hipDevice_t = c_int;
pub type hipStream_t = *mut c_void;
pub type hipEvent_t = *mut c_void;
pub type hipModule_t = *mut c_void;
pub type hipFunction_t = *mut c_void;
pub type hipGraph_t = *mut c_void;
pub type hipGraphExec_t = *mut c_void;
/// A pointer in HIP (CUDA's is a 64-bit integer).
pub type hipMemGenericAllocationHandle_t = *mut c_void;

/// `hipDeviceP2PAttr`.
pub const hipDevP2PAttrAccessSupported: c_int = 1;
pub const hipDevP2PAttrNativeAtomicSupported: c_int = 2;

/// `hipDeviceAttribute_t`: the same values in ROCm 5.x, 6.x and 7.x.
pub const hipDeviceAttributeMultiprocessorCount: c_int = 63;
pub const hipDeviceAttributeVirtualMemoryManagementSupported: c_int = 89;

pub const HIP_IPC_HANDLE_SIZE: usize = 64;
#[repr(C)]
#[derive(Clone, Copy)]
pub struct hipIpcMemHandle_t {
    pub reserved: [c_char; HIP_IPC_HANDLE_SIZE],
}
pub const hipIpcMemLazyEnablePeerAccess: c_uint = 0x1;
/// `hipExtMallocWithFlags`: fine-grained memory that bypasses the caches (upstream car's buffers).
pub const hipDeviceMallocUncached: c_uint = 0x3;
pub const hipStreamNonBlocking: c_uint = 0x1;
pub const hipEventDefault: c_uint = 0x0;
/// `hipStreamCaptureMode`.
pub const hipStreamCaptureModeThreadLocal: c_int = 1;
/// `hipStreamCaptureStatus`: not capturing.
pub const hipStreamCaptureStatusNone: c_int = 0;

/// `hipMemcpyKind`.
pub const hipMemcpyHostToDevice: c_int = 1;
pub const hipMemcpyDeviceToHost: c_int = 2;
pub const hipMemcpyDeviceToDevice: c_int = 3;

pub const hipMemAllocationTypePinned: c_int = 0x1;
pub const hipMemHandleTypePosixFileDescriptor: c_int = 0x1;
pub const hipMemLocationTypeDevice: c_int = 1;
pub const hipMemAccessFlagsProtReadWrite: c_int = 3;
pub const hipMemAllocationGranularityRecommended: c_int = 0x1;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct hipMemLocation {
    pub type_: c_int,
    pub id: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct hipMemAccessDesc {
    pub location: hipMemLocation,
    pub flags: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct hipMemAllocFlags {
    pub compressionType: u8,
    pub gpuDirectRDMACapable: u8,
    pub usage: u16,
}

/// The layout of ROCm 5.7 and later (5.2's differed); 7.x puts `requestedHandleType` in a same-typed union.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct hipMemAllocationProp {
    pub type_: c_int,
    pub requestedHandleType: c_int,
    pub location: hipMemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: hipMemAllocFlags,
}

/// `hipDeviceProp_tR0600`, what `hipGetDevicePropertiesR0600` fills (ROCm 6.0 to 7.x; 5.x had another layout
/// under `hipGetDeviceProperties`). Runs of fields of one type are grouped into arrays; the comments name them.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct hipDeviceProp_tR0600 {
    pub name: [c_char; 256],
    /// `uuid` (16), `luid` (8).
    pub uuid_luid: [c_char; 24],
    pub luidDeviceNodeMask: c_uint,
    pub totalGlobalMem: usize,
    pub sharedMemPerBlock: usize,
    /// `regsPerBlock`, `warpSize`.
    pub regs_warp: [c_int; 2],
    pub memPitch: usize,
    /// `maxThreadsPerBlock`, `maxThreadsDim[3]`, `maxGridSize[3]`, `clockRate`.
    pub threads_grid_clock: [c_int; 8],
    pub totalConstMem: usize,
    pub major: c_int,
    pub minor: c_int,
    pub textureAlignment: usize,
    pub texturePitchAlignment: usize,
    pub deviceOverlap: c_int,
    pub multiProcessorCount: c_int,
    /// `kernelExecTimeoutEnabled` through `maxSurfaceCubemapLayered[2]`.
    pub texture_surface: [c_int; 44],
    pub surfaceAlignment: usize,
    /// `concurrentKernels` through `localL1CacheSupported`.
    pub ints_a: [c_int; 16],
    pub sharedMemPerMultiprocessor: usize,
    /// `regsPerMultiprocessor` through `cooperativeMultiDeviceLaunch`.
    pub ints_b: [c_int; 12],
    pub sharedMemPerBlockOptin: usize,
    /// `pageableMemoryAccessUsesHostPageTables` through `accessPolicyMaxWindowSize`.
    pub ints_c: [c_int; 4],
    pub reservedSharedMemPerBlock: usize,
    /// `hostRegisterSupported` through `unifiedFunctionPointers`.
    pub ints_d: [c_int; 13],
    pub reserved: [c_int; 63],
    pub hipReserved: [c_int; 32],
    /// e.g. `gfx942:sramecc+:xnack-`.
    pub gcnArchName: [c_char; 256],
    pub maxSharedMemoryPerMultiProcessor: usize,
    pub clockInstructionRate: c_int,
    /// `hipDeviceArch_t`, a 32-bit bit field.
    pub arch: c_uint,
    pub hdpMemFlushCntl: *mut c_uint,
    pub hdpRegFlushCntl: *mut c_uint,
    /// `cooperativeMultiDeviceUnmatched{Func,GridDim,BlockDim,SharedMem}`, `isLargeBar`, `asicRevision`.
    pub ints_e: [c_int; 6],
}

pub type hiprtcResult = c_int;
pub const HIPRTC_SUCCESS: hiprtcResult = 0;
pub type hiprtcProgram = *mut c_void;

/// Declares the function table: one field per C function, typed as its declaration in the ROCm headers.
macro_rules! table {
    ($(#[$meta:meta])* $name:ident { $($f:ident: fn($($arg:ty),*) -> $ret:ty;)* }) => {
        $(#[$meta])*
        pub struct $name {
            $(pub $f: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }
        impl $name {
            #[cfg(test)]
            pub const SYMBOLS: &'static [&'static str] = &[$(stringify!($f)),*];

            /// Copies every entry point out of `lib`, or names all the missing ones.
            ///
            /// # Safety
            /// `lib` must be the library the table describes, and stay loaded while the table is used.
            pub unsafe fn bind(lib: &Library) -> Result<$name, Vec<&'static str>> {
                let mut missing = Vec::new();
                $(
                    // SAFETY: the field's type is the C declaration of the symbol of the same name.
                    let $f = match unsafe { lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(stringify!($f).as_bytes()) } {
                        Ok(s) => Some(*s),
                        Err(_) => {
                            missing.push(stringify!($f));
                            None
                        }
                    };
                )*
                if !missing.is_empty() {
                    return Err(missing);
                }
                Ok($name { $($f: $f.expect("checked above"),)* })
            }
        }
    };
}

table! {
    /// The HIP runtime (`libamdhip64`).
    HipApi {
        hipGetErrorName: fn(hipError_t) -> *const c_char;
        hipGetErrorString: fn(hipError_t) -> *const c_char;
        hipRuntimeGetVersion: fn(*mut c_int) -> hipError_t;
        hipInit: fn(c_uint) -> hipError_t;
        hipGetDeviceCount: fn(*mut c_int) -> hipError_t;
        hipSetDevice: fn(c_int) -> hipError_t;
        hipMemGetInfo: fn(*mut usize, *mut usize) -> hipError_t;
        hipDeviceGet: fn(*mut hipDevice_t, c_int) -> hipError_t;
        hipDeviceGetName: fn(*mut c_char, c_int, hipDevice_t) -> hipError_t;
        hipDeviceGetAttribute: fn(*mut c_int, c_int, c_int) -> hipError_t;
        hipDeviceGetPCIBusId: fn(*mut c_char, c_int, c_int) -> hipError_t;
        hipDeviceGetByPCIBusId: fn(*mut c_int, *const c_char) -> hipError_t;
        hipDeviceGetP2PAttribute: fn(*mut c_int, c_int, c_int, c_int) -> hipError_t;
        hipGetDevicePropertiesR0600: fn(*mut hipDeviceProp_tR0600, c_int) -> hipError_t;
        hipMalloc: fn(*mut *mut c_void, usize) -> hipError_t;
        hipExtMallocWithFlags: fn(*mut *mut c_void, usize, c_uint) -> hipError_t;
        hipFree: fn(*mut c_void) -> hipError_t;
        hipMemGetAddressRange: fn(*mut *mut c_void, *mut usize, *mut c_void) -> hipError_t;
        hipIpcGetMemHandle: fn(*mut hipIpcMemHandle_t, *mut c_void) -> hipError_t;
        hipIpcOpenMemHandle: fn(*mut *mut c_void, hipIpcMemHandle_t, c_uint) -> hipError_t;
        hipIpcCloseMemHandle: fn(*mut c_void) -> hipError_t;
        hipMemGetAllocationGranularity: fn(*mut usize, *const hipMemAllocationProp, c_int) -> hipError_t;
        hipMemCreate: fn(*mut hipMemGenericAllocationHandle_t, usize, *const hipMemAllocationProp, u64) -> hipError_t;
        hipMemRelease: fn(hipMemGenericAllocationHandle_t) -> hipError_t;
        hipMemAddressReserve: fn(*mut *mut c_void, usize, usize, *mut c_void, u64) -> hipError_t;
        hipMemAddressFree: fn(*mut c_void, usize) -> hipError_t;
        hipMemMap: fn(*mut c_void, usize, usize, hipMemGenericAllocationHandle_t, u64) -> hipError_t;
        hipMemUnmap: fn(*mut c_void, usize) -> hipError_t;
        hipMemSetAccess: fn(*mut c_void, usize, *const hipMemAccessDesc, usize) -> hipError_t;
        hipMemExportToShareableHandle: fn(*mut c_void, hipMemGenericAllocationHandle_t, c_int, u64) -> hipError_t;
        hipMemImportFromShareableHandle: fn(*mut hipMemGenericAllocationHandle_t, *mut c_void, c_int) -> hipError_t;
        hipMemRetainAllocationHandle: fn(*mut hipMemGenericAllocationHandle_t, *mut c_void) -> hipError_t;
        hipMemGetAllocationPropertiesFromHandle: fn(
            *mut hipMemAllocationProp, hipMemGenericAllocationHandle_t
        ) -> hipError_t;
        hipMemGetAccess: fn(*mut u64, *const hipMemLocation, *mut c_void) -> hipError_t;
        hipStreamCreateWithFlags: fn(*mut hipStream_t, c_uint) -> hipError_t;
        hipStreamDestroy: fn(hipStream_t) -> hipError_t;
        hipStreamSynchronize: fn(hipStream_t) -> hipError_t;
        hipStreamGetDevice: fn(hipStream_t, *mut hipDevice_t) -> hipError_t;
        hipEventCreateWithFlags: fn(*mut hipEvent_t, c_uint) -> hipError_t;
        hipEventDestroy: fn(hipEvent_t) -> hipError_t;
        hipEventRecord: fn(hipEvent_t, hipStream_t) -> hipError_t;
        hipEventSynchronize: fn(hipEvent_t) -> hipError_t;
        hipEventQuery: fn(hipEvent_t) -> hipError_t;
        hipEventElapsedTime: fn(*mut f32, hipEvent_t, hipEvent_t) -> hipError_t;
        hipMemcpyAsync: fn(*mut c_void, *const c_void, usize, c_int, hipStream_t) -> hipError_t;
        hipMemsetD8Async: fn(*mut c_void, u8, usize, hipStream_t) -> hipError_t;
        hipModuleLoadData: fn(*mut hipModule_t, *const c_void) -> hipError_t;
        hipModuleUnload: fn(hipModule_t) -> hipError_t;
        hipModuleGetFunction: fn(*mut hipFunction_t, hipModule_t, *const c_char) -> hipError_t;
        hipModuleOccupancyMaxActiveBlocksPerMultiprocessor: fn(*mut c_int, hipFunction_t, c_int, usize) -> hipError_t;
        hipModuleLaunchKernel: fn(
            hipFunction_t, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, hipStream_t,
            *mut *mut c_void, *mut *mut c_void
        ) -> hipError_t;
        hipStreamBeginCapture: fn(hipStream_t, c_int) -> hipError_t;
        hipStreamEndCapture: fn(hipStream_t, *mut hipGraph_t) -> hipError_t;
        hipStreamIsCapturing: fn(hipStream_t, *mut c_int) -> hipError_t;
        hipGraphInstantiateWithFlags: fn(*mut hipGraphExec_t, hipGraph_t, u64) -> hipError_t;
        hipGraphLaunch: fn(hipGraphExec_t, hipStream_t) -> hipError_t;
        hipGraphExecDestroy: fn(hipGraphExec_t) -> hipError_t;
        hipGraphDestroy: fn(hipGraph_t) -> hipError_t;
    }
}

table! {
    /// hipRTC (`libhiprtc`, a library of its own since ROCm 6.0).
    HiprtcApi {
        hiprtcVersion: fn(*mut c_int, *mut c_int) -> hiprtcResult;
        hiprtcGetErrorString: fn(hiprtcResult) -> *const c_char;
        hiprtcCreateProgram: fn(
            *mut hiprtcProgram, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char
        ) -> hiprtcResult;
        hiprtcDestroyProgram: fn(*mut hiprtcProgram) -> hiprtcResult;
        hiprtcCompileProgram: fn(hiprtcProgram, c_int, *const *const c_char) -> hiprtcResult;
        hiprtcGetProgramLogSize: fn(hiprtcProgram, *mut usize) -> hiprtcResult;
        hiprtcGetProgramLog: fn(hiprtcProgram, *mut c_char) -> hiprtcResult;
        hiprtcGetCodeSize: fn(hiprtcProgram, *mut usize) -> hiprtcResult;
        hiprtcGetCode: fn(hiprtcProgram, *mut c_char) -> hiprtcResult;
    }
}

/// The file names a ROCm library `stem` (`amdhip64`, `hiprtc`) is tried by, in order: each directory of
/// `$ROCM_PATH/lib`, `$HIP_PATH/lib` and `/opt/rocm/lib`, then the loader's own search path. Within each, the
/// soname of `majors` first (a runtime-only install ships no unversioned `.so`), then the `.so` link.
pub fn candidates(stem: &str, majors: &[u32], dirs: &[PathBuf]) -> Vec<PathBuf> {
    let names: Vec<String> =
        majors.iter().map(|m| format!("lib{stem}.so.{m}")).chain([format!("lib{stem}.so")]).collect();
    let mut out = Vec::new();
    for dir in dirs {
        out.extend(names.iter().map(|n| dir.join(n)));
    }
    out.extend(names.iter().map(PathBuf::from));
    out
}

/// `$ROCM_PATH/lib`, `$HIP_PATH/lib`, `/opt/rocm/lib`: those that exist, once each.
pub fn rocm_lib_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = ["ROCM_PATH", "HIP_PATH"]
        .iter()
        .filter_map(|k| std::env::var_os(k).filter(|v| !v.is_empty()))
        .map(|v| Path::new(&v).join("lib"))
        .chain([PathBuf::from("/opt/rocm/lib")])
        .collect();
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| d.is_dir() && seen.insert(d.clone()));
    dirs
}

/// Loads the first of `names` that loads. Returns it and the name it was loaded by, or every failure.
pub fn load_first(names: &[PathBuf]) -> Result<(Library, PathBuf), Vec<String>> {
    let mut failures = Vec::new();
    for name in names {
        // SAFETY: loading the ROCm runtime runs its initialisers, which is what using it requires anyway.
        match unsafe { Library::new(name) } {
            Ok(lib) => return Ok((lib, name.clone())),
            Err(e) => failures.push(e.to_string()),
        }
    }
    Err(failures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The offsets below are what clang computes (`offsetof`, x86_64) from ROCm 6.0's and 6.2's
    /// `hip_runtime_api.h`; ROCm 7's header declares the same fields.
    #[test]
    fn device_prop_r0600_layout() {
        assert_eq!(size_of::<hipDeviceProp_tR0600>(), 1472);
        assert_eq!(offset_of!(hipDeviceProp_tR0600, multiProcessorCount), 388);
        assert_eq!(offset_of!(hipDeviceProp_tR0600, gcnArchName), 1160);
    }

    #[test]
    fn vmm_struct_layouts() {
        assert_eq!(size_of::<hipMemAllocationProp>(), 32);
        assert_eq!(offset_of!(hipMemAllocationProp, location), 8);
        assert_eq!(offset_of!(hipMemAllocationProp, win32HandleMetaData), 16);
        assert_eq!(offset_of!(hipMemAllocationProp, allocFlags), 24);
        assert_eq!(size_of::<hipMemAccessDesc>(), 12);
        assert_eq!(offset_of!(hipMemAccessDesc, flags), 8);
        assert_eq!(size_of::<hipIpcMemHandle_t>(), 64);
    }

    #[test]
    fn candidates_try_sonames_in_each_directory_then_the_loader_path() {
        let c = candidates("amdhip64", &[7, 6], &[PathBuf::from("/opt/rocm/lib")]);
        let c: Vec<String> = c.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            c,
            [
                "/opt/rocm/lib/libamdhip64.so.7",
                "/opt/rocm/lib/libamdhip64.so.6",
                "/opt/rocm/lib/libamdhip64.so",
                "libamdhip64.so.7",
                "libamdhip64.so.6",
                "libamdhip64.so",
            ]
        );
    }

    #[test]
    fn binding_a_library_without_hip_names_every_missing_symbol() {
        // libc is loaded in every process and has no HIP entry points.
        let (lib, _) = load_first(&[PathBuf::from("libc.so.6")]).expect("libc loads");
        // SAFETY: binding only looks symbols up; nothing is called.
        let missing = unsafe { HipApi::bind(&lib) }.err().expect("libc has no HIP");
        assert_eq!(missing.len(), HipApi::SYMBOLS.len());
        assert!(missing.contains(&"hipModuleLaunchKernel"));
        // SAFETY: as above.
        let missing = unsafe { HiprtcApi::bind(&lib) }.err().expect("libc has no hipRTC");
        assert_eq!(missing.len(), HiprtcApi::SYMBOLS.len());
    }
}
