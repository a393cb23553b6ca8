//! Run-time compilation through a vendor's [`Compiler`], and the compiled images' load through the on-disk cache.

use super::raw::{CompileTarget, Compiler, Source};
use crate::{GpuError, KernelLibrary, Result};
use std::ffi::{c_char, CString};

fn c_string(text: &str, what: &str) -> Result<CString> {
    CString::new(text).map_err(|_| GpuError::BadArgs(format!("{what} contains a NUL byte")))
}

/// A program, destroyed on drop.
struct Program<'a, C: Compiler> {
    compiler: &'a C,
    raw: C::Program,
}

impl<C: Compiler> Drop for Program<'_, C> {
    fn drop(&mut self) {
        // SAFETY: the program was created by `compile` below and is destroyed once.
        unsafe { self.compiler.destroy(self.raw) }
    }
}

impl<C: Compiler> Program<'_, C> {
    /// The compile log, or nothing where the compiler cannot give it.
    fn log(&self) -> String {
        // SAFETY: a live program; `buf` holds the size the compiler reported (NUL included).
        let log = unsafe {
            self.compiler.log_size(self.raw).and_then(|n| {
                let mut buf = vec![0u8; n];
                self.compiler.log(self.raw, &mut buf).map(|_| buf)
            })
        };
        log.map(|buf| String::from_utf8_lossy(&buf).trim_end_matches('\0').trim_end().to_string()).unwrap_or_default()
    }

    fn image(&self, target: &CompileTarget) -> Result<Vec<u8>> {
        // SAFETY: a live, compiled program; `buf` holds the size the compiler reported.
        let buf = unsafe {
            let mut buf = vec![0u8; self.compiler.code_size(self.raw, target)?];
            self.compiler.code(self.raw, target, &mut buf)?;
            buf
        };
        if buf.is_empty() {
            return Err(GpuError::Driver {
                call: C::CODE_CALL,
                code: 0,
                msg: "the compiler produced an empty image".into(),
            });
        }
        Ok(buf)
    }
}

/// Compiles `lib` (its source and headers) for `target`; a failure carries the compiler's log.
pub(crate) fn compile<C: Compiler>(compiler: &C, lib: &KernelLibrary, target: &CompileTarget) -> Result<Vec<u8>> {
    let src = c_string(lib.source, &format!("kernel library {}", lib.name))?;
    let name = c_string(&format!("{}.cu", lib.name), "kernel library name")?;
    let texts = lib.headers.iter().map(|(_, text)| c_string(text, "a kernel header")).collect::<Result<Vec<_>>>()?;
    let names = lib.headers.iter().map(|(n, _)| c_string(n, "a kernel header name")).collect::<Result<Vec<_>>>()?;
    let opts = target.options.iter().map(|o| c_string(o, "a compiler option")).collect::<Result<Vec<_>>>()?;
    let ptrs = |v: &[CString]| v.iter().map(|s| s.as_ptr()).collect::<Vec<*const c_char>>();
    // SAFETY: every string lives through the call.
    let (headers, include_names) = (ptrs(&texts), ptrs(&names));
    let source = Source { src: &src, name: &name, headers: &headers, include_names: &include_names };
    let raw = unsafe { compiler.create(&source)? };
    let prog = Program { compiler, raw };
    // SAFETY: a live program; the options live through the call.
    if let Err(e) = unsafe { compiler.compile(prog.raw, &ptrs(&opts)) } {
        let log = prog.log();
        let log = if log.is_empty() { e.to_string() } else { log };
        return Err(GpuError::Compile { library: lib.name.into(), arch: target.arch.clone(), log });
    }
    prog.image(target)
}

/// `image` copied into 8-byte-aligned memory with at least one zero word after it, so PTX text is NUL-terminated.
pub(crate) fn aligned(image: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; image.len().div_ceil(8) + 1];
    bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..image.len()].copy_from_slice(image);
    words
}
