//! The on-disk cache of compiled kernel images, shared by the drivers that compile at run time (cuda: NVRTC,
//! hip: hipRTC). A file's name carries a hash of everything that went into it, so a stale image is never
//! picked up; a driver that refuses a cached image recompiles and replaces it.

use crate::KernelLibrary;
use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// FNV-1a 64 over length-prefixed parts: a cache key that is the same in every build, where no two lists of parts
/// run together.
fn key(parts: &[&[u8]]) -> u64 {
    let mut h = fnv::FnvHasher::default();
    for part in parts {
        h.write_u64(part.len() as u64);
        h.write(part);
    }
    h.finish()
}

/// `$ARX_KERNEL_CACHE`, else `$XDG_CACHE_HOME/allreduce-rs/kernels`, else `~/.cache/allreduce-rs/kernels`.
fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("ARX_KERNEL_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("allreduce-rs").join("kernels")))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("allreduce-rs").join("kernels")))
}

/// `<name>-<arch>-<key>.<ext>`, the key hashing the source, every header's name and text, the compiler options
/// and `compiler` (its name and version).
fn file_name(lib: &KernelLibrary, arch: &str, ext: &str, options: &[String], compiler: &str) -> String {
    let joined = options.join("\u{1f}");
    let mut parts: Vec<&[u8]> = vec![b"arx-kernel-v2", lib.source.as_bytes()];
    parts.extend(lib.headers.iter().flat_map(|(name, text)| [name.as_bytes(), text.as_bytes()]));
    parts.extend([joined.as_bytes(), compiler.as_bytes()]);
    let key = key(&parts);
    let stem: String =
        lib.name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    format!("{stem}-{arch}-{key:016x}.{ext}")
}

/// Where the image of `lib` compiled for `arch` with `options` by `compiler` is cached; `None` when there is
/// no cache directory.
pub(crate) fn image_path(
    lib: &KernelLibrary,
    arch: &str,
    ext: &str,
    options: &[String],
    compiler: &str,
) -> Option<PathBuf> {
    cache_dir().map(|d| d.join(file_name(lib, arch, ext, options, compiler)))
}

/// Writes a compiled image to the cache through a temporary file and a rename, so ranks compiling the same
/// library at once never see a partial file. The cache is an optimisation: failing to write it is not an error.
pub(crate) fn store(path: &Path, image: &[u8]) {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let Some(dir) = path.parent() else { return };
    let tmp = dir.join(format!(
        ".{}.tmp{}-{}",
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let written = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&tmp, image))
        .and_then(|_| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_their_parts_apart() {
        assert_ne!(key(&[b"ab", b"c"]), key(&[b"a", b"bc"]), "parts must not run together");
        assert_eq!(key(&[b"ab", b"c"]), key(&[b"ab", b"c"]));
    }

    #[test]
    fn file_names_sanitise_the_library_name_and_change_with_every_input() {
        static LIB: KernelLibrary =
            KernelLibrary { name: "my lib/x", source: "src", headers: &[("a.h", "x")], host: &[] };
        static EDITED: KernelLibrary =
            KernelLibrary { name: "my lib/x", source: "src", headers: &[("a.h", "y")], host: &[] };
        let opts = vec!["-O3".to_string()];
        let name = file_name(&LIB, "gfx942", "hsaco", &opts, "hiprtc 6.2");
        assert!(name.starts_with("my_lib_x-gfx942-") && name.ends_with(".hsaco"), "{name}");
        assert_ne!(name, file_name(&LIB, "gfx942", "hsaco", &opts, "hiprtc 6.3"));
        assert_ne!(name, file_name(&EDITED, "gfx942", "hsaco", &opts, "hiprtc 6.2"), "a header's text is in the key");
        assert_ne!(name, file_name(&LIB, "gfx942", "hsaco", &["-O2".to_string()], "hiprtc 6.2"));
    }
}
