//! NVRTC: which architectures it compiles for, and its calls for the shared compile ([`crate::device`]).

use crate::device::raw::{CompileTarget, Compiler, Source};
use crate::{GpuError, Result};
use cudarc::nvrtc::sys as nv;
use std::ffi::{c_char, c_int, CStr};

/// The compiler options besides the architecture. No fast math: the kernels keep IEEE semantics.
const NVRTC_OPTIONS: [&str; 3] = ["-std=c++17", "-default-device", "-DARX_CUDA=1"];

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

/// What NVRTC is here and which architectures it compiles for.
pub(crate) struct Nvrtc {
    /// The library name it was loaded by, for messages.
    lib: String,
    version: (c_int, c_int),
    /// `major * 10 + minor` of each supported `sm_`.
    archs: Vec<c_int>,
    _lib: libloading::Library,
}

impl Nvrtc {
    pub(super) fn new((lib, name): (libloading::Library, String)) -> Result<Nvrtc> {
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

    /// What to compile for a device of compute capability `cc`: its own `sm_` (a cubin) when this NVRTC knows it,
    /// else PTX for the newest older `compute_` (JIT-compiled by the driver at load).
    pub(super) fn target(&self, cc: c_int) -> Result<CompileTarget> {
        let (arch, ext) = if self.archs.contains(&cc) {
            (format!("sm_{cc}"), "cubin")
        } else {
            match self.archs.iter().copied().filter(|&a| a <= cc).max() {
                Some(a) => (format!("compute_{a}"), "ptx"),
                None => {
                    return Err(GpuError::NotAvailable {
                        backend: "cuda",
                        reason: format!(
                            "{} (NVRTC {}.{}) compiles for {:?}, none of which runs on sm_{cc}",
                            self.lib, self.version.0, self.version.1, self.archs
                        ),
                    })
                }
            }
        };
        let mut options = vec![format!("--gpu-architecture={arch}")];
        options.extend(NVRTC_OPTIONS.iter().map(|o| o.to_string()));
        let compiler = format!("nvrtc {}.{}", self.version.0, self.version.1);
        Ok(CompileTarget { cache_arch: arch.clone(), arch, ext, options, compiler })
    }
}

fn cubin(target: &CompileTarget) -> bool {
    target.ext == "cubin"
}

impl Compiler for Nvrtc {
    type Program = nv::nvrtcProgram;
    const CODE_CALL: &'static str = "nvrtcGetCUBIN";

    unsafe fn create(&self, source: &Source) -> Result<nv::nvrtcProgram> {
        let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
        let (src, name, count, headers, include_names) = source.args();
        // SAFETY: the strings live through the call, as the caller vouches.
        nck("nvrtcCreateProgram", unsafe {
            nv::nvrtcCreateProgram(&mut prog, src, name, count, headers, include_names)
        })?;
        Ok(prog)
    }
    unsafe fn compile(&self, prog: nv::nvrtcProgram, options: &[*const c_char]) -> Result<()> {
        // SAFETY: as the caller vouches.
        nck("nvrtcCompileProgram", unsafe { nv::nvrtcCompileProgram(prog, options.len() as c_int, options.as_ptr()) })
    }
    unsafe fn log_size(&self, prog: nv::nvrtcProgram) -> Result<usize> {
        let mut n = 0usize;
        // SAFETY: a live program; writes one size.
        nck("nvrtcGetProgramLogSize", unsafe { nv::nvrtcGetProgramLogSize(prog, &mut n) })?;
        Ok(n)
    }
    unsafe fn log(&self, prog: nv::nvrtcProgram, buf: &mut [u8]) -> Result<()> {
        // SAFETY: as the caller vouches, `buf` holds the log.
        nck("nvrtcGetProgramLog", unsafe { nv::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char) })
    }
    unsafe fn code_size(&self, prog: nv::nvrtcProgram, target: &CompileTarget) -> Result<usize> {
        let mut n = 0usize;
        // SAFETY: a live, compiled program; writes one size.
        if cubin(target) {
            nck("nvrtcGetCUBINSize", unsafe { nv::nvrtcGetCUBINSize(prog, &mut n) })?;
        } else {
            nck("nvrtcGetPTXSize", unsafe { nv::nvrtcGetPTXSize(prog, &mut n) })?;
        }
        Ok(n)
    }
    unsafe fn code(&self, prog: nv::nvrtcProgram, target: &CompileTarget, buf: &mut [u8]) -> Result<()> {
        let out = buf.as_mut_ptr() as *mut c_char;
        // SAFETY: as the caller vouches, `buf` holds the image (PTX: its NUL included).
        if cubin(target) {
            nck("nvrtcGetCUBIN", unsafe { nv::nvrtcGetCUBIN(prog, out) })
        } else {
            nck("nvrtcGetPTX", unsafe { nv::nvrtcGetPTX(prog, out) })
        }
    }
    unsafe fn destroy(&self, mut prog: nv::nvrtcProgram) {
        // SAFETY: as the caller vouches, destroyed once.
        let _ = unsafe { nv::nvrtcDestroyProgram(&mut prog) };
    }
}
