//! hipRTC: loaded beside the runtime, and its calls for the shared compile ([`crate::device`]).

use super::runtime::{c_text, Runtime};
use super::sys::{self, HiprtcApi};
use crate::device::raw::{CompileTarget, Compiler, Source};
use crate::{GpuError, Result};
use std::ffi::{c_char, c_int};
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};

/// The hipRTC options besides the architecture. No fast math: the kernels keep IEEE semantics.
const HIPRTC_OPTIONS: [&str; 3] = ["-std=c++17", "-DARX_HIP=1", "-O3"];

/// hipRTC, its table and version.
pub(crate) struct Hiprtc {
    api: HiprtcApi,
    version: (c_int, c_int),
    /// Never unloaded, like the runtime.
    _lib: ManuallyDrop<libloading::Library>,
}

impl Hiprtc {
    /// Loads the hipRTC of the same ROCm as `rt`: first from the runtime's own directory, by its major soname.
    pub(super) fn load(rt: &Runtime) -> std::result::Result<Hiprtc, String> {
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

    /// What to compile for the device of target ID `target_id` (processor `arch`) under runtime `rt`.
    pub(super) fn target(&self, rt: &Runtime, arch: &str, target_id: &str) -> CompileTarget {
        let mut options = vec![format!("--offload-arch={target_id}")];
        options.extend(HIPRTC_OPTIONS.iter().map(|o| o.to_string()));
        let (a, b, c) = rt.version;
        let compiler = format!("hiprtc {}.{} (HIP {a}.{b}.{c})", self.version.0, self.version.1);
        CompileTarget { cache_arch: arch.into(), arch: target_id.into(), ext: "hsaco", options, compiler }
    }
}

impl Compiler for Hiprtc {
    type Program = sys::hiprtcProgram;
    const CODE_CALL: &'static str = "hiprtcGetCode";

    unsafe fn create(&self, source: &Source) -> Result<sys::hiprtcProgram> {
        let mut prog: sys::hiprtcProgram = std::ptr::null_mut();
        let (src, name, count, headers, include_names) = source.args();
        // SAFETY: the strings live through the call, as the caller vouches.
        self.ck("hiprtcCreateProgram", unsafe {
            (self.api.hiprtcCreateProgram)(&mut prog, src, name, count, headers, include_names)
        })?;
        Ok(prog)
    }
    unsafe fn compile(&self, prog: sys::hiprtcProgram, options: &[*const c_char]) -> Result<()> {
        // SAFETY: as the caller vouches.
        self.ck("hiprtcCompileProgram", unsafe {
            (self.api.hiprtcCompileProgram)(prog, options.len() as c_int, options.as_ptr())
        })
    }
    unsafe fn log_size(&self, prog: sys::hiprtcProgram) -> Result<usize> {
        let mut n = 0usize;
        // SAFETY: a live program; writes one size.
        self.ck("hiprtcGetProgramLogSize", unsafe { (self.api.hiprtcGetProgramLogSize)(prog, &mut n) })?;
        Ok(n)
    }
    unsafe fn log(&self, prog: sys::hiprtcProgram, buf: &mut [u8]) -> Result<()> {
        // SAFETY: as the caller vouches, `buf` holds the log.
        self.ck("hiprtcGetProgramLog", unsafe { (self.api.hiprtcGetProgramLog)(prog, buf.as_mut_ptr() as *mut c_char) })
    }
    /// The code object is an AMDGPU ELF, whatever the target.
    unsafe fn code_size(&self, prog: sys::hiprtcProgram, _target: &CompileTarget) -> Result<usize> {
        let mut n = 0usize;
        // SAFETY: a live, compiled program; writes one size.
        self.ck("hiprtcGetCodeSize", unsafe { (self.api.hiprtcGetCodeSize)(prog, &mut n) })?;
        Ok(n)
    }
    unsafe fn code(&self, prog: sys::hiprtcProgram, _target: &CompileTarget, buf: &mut [u8]) -> Result<()> {
        // SAFETY: as the caller vouches, `buf` holds the code object.
        self.ck("hiprtcGetCode", unsafe { (self.api.hiprtcGetCode)(prog, buf.as_mut_ptr() as *mut c_char) })
    }
    unsafe fn destroy(&self, mut prog: sys::hiprtcProgram) {
        // SAFETY: as the caller vouches, destroyed once.
        let _ = unsafe { (self.api.hiprtcDestroyProgram)(&mut prog) };
    }
}
