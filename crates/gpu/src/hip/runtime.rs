//! Loading libamdhip64 (ROCm 6.0 and later) and turning its statuses into errors that name the call.

use super::sys::{self, HipApi};
use crate::{GpuError, Result};
use std::ffi::{c_char, c_int, CStr};
use std::mem::ManuallyDrop;
use std::path::PathBuf;

/// Named in every "not available" message, so the user knows which library to install or put on the path.
pub(super) const HIP_LIBRARY: &str = "libamdhip64";
/// Sonames tried, newest first (5 only to say plainly that 5.x is too old).
const HIP_MAJORS: [u32; 3] = [7, 6, 5];

/// A static C string the runtime returned, or `None`.
///
/// # Safety
/// `p` is null or points at a NUL-terminated string that outlives the call.
pub(super) unsafe fn c_text(p: *const c_char) -> Option<String> {
    // SAFETY: as the caller vouches.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// `HIP_VERSION` as `hipRuntimeGetVersion` reports it: `major * 10^7 + minor * 10^5 + patch`.
pub(super) fn decode_version(v: c_int) -> (u32, u32, u32) {
    let v = v.max(0) as u32;
    (v / 10_000_000, v / 100_000 % 100, v % 100_000)
}

/// The runtime library, its table and its version.
pub(super) struct Runtime {
    pub(super) api: HipApi,
    pub(super) path: PathBuf,
    pub(super) version: (u32, u32, u32),
    /// Never unloaded: the runtime leaves threads and exit handlers behind that would run unmapped code after a
    /// `dlclose`. The table's pointers point into it.
    _lib: ManuallyDrop<libloading::Library>,
}

impl Runtime {
    pub(super) fn load() -> std::result::Result<Runtime, String> {
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
    pub(super) fn ck(&self, call: &'static str, status: sys::hipError_t) -> Result<()> {
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
