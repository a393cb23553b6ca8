//! `cargo xtask kernel-check`: compiles every kernels/*.cu the way the drivers' run-time compilers see them
//! (the library, its headers found under kernels/include) with Debian's clang, for NVIDIA (PTX for sm_80) and for AMD (code objects
//! for gfx90a and gfx940, the newest CDNA targets Debian 12's LLVM knows; gfx940 is MI300's ISA and memory model,
//! though MI300X runs gfx942 code). A check that needs no GPU toolkit: no CUDA, no ROCm.
//!
//! Every entry point the sources declare must come out, and nothing else: the PTX's `.visible .entry` lines,
//! the code object's kernel descriptors (`<name>.kd`). The code object must also have no undefined symbols. Last,
//! the norm's and the barrier's device code run on the host against their twins (`host_sim`).

use crate::{output, root, run};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(clap::Args)]
pub struct Args {
    /// First install the compilers with apt-get (clang-15, lld-15, llvm-15: Debian 12's ROCm-capable LLVM), as
    /// CI does. Needs root.
    #[arg(long)]
    install: bool,
}

/// What `--install` installs: clang for both targets, lld to link AMD code objects, llvm for llvm-readelf.
const APT_PACKAGES: [&str; 3] = ["clang-15", "lld-15", "llvm-15"];
/// AMD targets, each compiled to its own code object.
const AMD_TARGETS: [&str; 2] = ["gfx90a", "gfx940"];
/// The LLVM versions tried for the AMD check, newest first (15 is the first with gfx940).
const AMD_LLVM: [u32; 4] = [18, 17, 16, 15];
/// The libraries and the algorithms of their entry points `<lib>_<algo>_<dtype>` the Rust side launches, which must
/// be there whatever else the sources add.
const REQUIRED: [(&str, &[&str]); 2] = [("car", &["1shot", "2shot", "rs", "ag"]), ("symm", &["1shot", "2shot", "rs"])];
const DTYPES: [&str; 3] = ["bf16", "fp16", "fp32"];

pub fn kernel_check(args: Args) -> Result<(), String> {
    if args.install {
        install()?;
    }
    let kernels = root().join("kernels");
    let out = std::env::temp_dir().join(format!("arx-kernel-check-{}", std::process::id()));
    std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
    let nvidia = which_clang().ok_or("no clang on PATH: `apt-get install clang` (Debian 12 ships clang 14)")?;
    let amd = amd_toolchain().ok_or_else(|| {
        format!(
            "no clang 15 or newer with lld for the AMD check: `cargo xtask kernel-check --install` \
             (apt-get install {})",
            APT_PACKAGES.join(" ")
        )
    })?;
    for lib in libraries(&kernels)? {
        let lib = lib.as_str();
        // The run-time compilers get kernels/include's headers by the same include names (collective_core::KERNEL_HEADERS).
        let cu = kernels.join(format!("{lib}.cu"));
        let body = read(&cu)?;
        let include = kernels.join("include");
        let expected = declared_entries(&body);
        if expected.is_empty() {
            return Err(format!("{lib}.cu declares no entry point"));
        }
        let algos = REQUIRED.iter().find(|r| r.0 == lib).map_or(&[][..], |r| r.1);
        let required: BTreeSet<String> =
            algos.iter().flat_map(|a| DTYPES.iter().map(move |d| format!("{lib}_{a}_{d}"))).collect();
        if let Some(missing) = required.difference(&expected).next() {
            return Err(format!("{lib}.cu no longer declares {missing}, which crates/{lib} launches"));
        }
        let ptx = out.join(format!("{lib}.ptx"));
        run(Command::new(&nvidia)
            .args(["-x", "cuda", "--cuda-device-only", "--cuda-gpu-arch=sm_80"])
            .args(["-nocudainc", "-nocudalib", "-std=c++17"])
            .args(["-Werror", "-Wall", "-Wno-unused-function", "-S"])
            .arg("-I")
            .arg(&include)
            .arg("-include")
            .arg(kernels.join("check/clang_cuda_prelude.h"))
            .arg("-o")
            .arg(&ptx)
            .arg(&cu))?;
        let found = ptx_entries(&read(&ptx)?);
        same(lib, "sm_80 PTX", &expected, &found)?;
        println!("{lib}: {} entry points compile for sm_80 (PTX)", found.len());

        for arch in AMD_TARGETS {
            let co = out.join(format!("{lib}-{arch}.hsaco"));
            // The options hipRTC gets from the hip driver, and -nogpuinc/-nogpulib: the prelude stands in for
            // the HIP headers, and the kernels call nothing from the device libraries.
            run(Command::new(&amd.clang)
                .args(["-x", "hip", "--cuda-device-only", "--no-gpu-bundle-output"])
                .arg(format!("--offload-arch={arch}"))
                .args(["-nogpuinc", "-nogpulib", "-std=c++17", "-DARX_HIP=1", "-O3"])
                .args(["-Werror", "-Wall", "-Wno-unused-function"])
                .arg("-I")
                .arg(&include)
                .arg("-include")
                .arg(kernels.join("check/clang_hip_prelude.h"))
                .arg("-o")
                .arg(&co)
                .arg(&cu))?;
            let symbols = output(Command::new(&amd.readelf).args(["--symbols", "--wide"]).arg(&co))?;
            let (found, undefined) = code_object_symbols(&symbols);
            if !undefined.is_empty() {
                return Err(format!("{lib} for {arch}: undefined symbols {undefined:?}"));
            }
            same(lib, arch, &expected, &found)?;
            let notes = output(Command::new(&amd.readelf).arg("--notes").arg(&co))?;
            let target = format!("amdgcn-amd-amdhsa--{arch}");
            if !notes.contains(&target) {
                return Err(format!("{lib}: the code object for {arch} does not say it targets {target}"));
            }
            println!("{lib}: {} entry points compile for {arch} (code object)", found.len());
        }
    }
    crate::host_sim::check(&amd.clangxx, &kernels, &out)?;
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// The kernel libraries: every `kernels/*.cu`, by name, sorted.
fn libraries(kernels: &Path) -> Result<Vec<String>, String> {
    let dir = std::fs::read_dir(kernels).map_err(|e| format!("{}: {e}", kernels.display()))?;
    let mut libs: Vec<String> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".cu")).map(str::to_string))
        .collect();
    libs.sort();
    if let Some((missing, _)) = REQUIRED.iter().find(|r| !libs.iter().any(|l| l == r.0)) {
        return Err(format!("kernels/{missing}.cu is missing"));
    }
    Ok(libs)
}

fn install() -> Result<(), String> {
    run(Command::new("apt-get").arg("update"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(APT_PACKAGES)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn same(lib: &str, what: &str, expected: &BTreeSet<String>, found: &BTreeSet<String>) -> Result<(), String> {
    if expected == found {
        return Ok(());
    }
    let missing: Vec<_> = expected.difference(found).collect();
    let extra: Vec<_> = found.difference(expected).collect();
    Err(format!("{lib} for {what}: entry points missing {missing:?}, unexpected {extra:?}"))
}

/// The entry points a library's source declares: `ARX_INSTANTIATE(name, ...)`, `ARX_INSTANTIATE_K(name, ...)` and
/// `ARX_INSTANTIATE_BOUNDED(name, ...)` give `name_{bf16,fp16,fp32}`,
/// `ARX_KERNEL void name(` gives `name`.
fn declared_entries(src: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in src.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
        let instantiation = ["ARX_INSTANTIATE(", "ARX_INSTANTIATE_K(", "ARX_INSTANTIATE_BOUNDED("];
        if let Some(rest) = instantiation.iter().find_map(|p| line.strip_prefix(p)) {
            let name = rest.split(',').next().unwrap_or("").trim();
            names.extend(DTYPES.iter().map(|d| format!("{name}_{d}")));
        } else if let Some(rest) = line.strip_prefix("ARX_KERNEL void ") {
            names.insert(rest.split('(').next().unwrap_or("").trim().to_string());
        }
    }
    names.retain(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    names
}

/// `.visible .entry name(` lines of PTX.
fn ptx_entries(ptx: &str) -> BTreeSet<String> {
    ptx.lines()
        .filter_map(|l| l.strip_prefix(".visible .entry "))
        .map(|rest| rest.split('(').next().unwrap_or("").trim().to_string())
        .collect()
}

/// From `llvm-readelf --symbols --wide`: the kernels (their `<name>.kd` descriptors) and the undefined symbols.
fn code_object_symbols(listing: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut kernels, mut undefined) = (BTreeSet::new(), BTreeSet::new());
    for line in listing.lines() {
        // Num: Value Size Type Bind Vis Ndx Name
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 || !f[0].ends_with(':') {
            continue;
        }
        let (kind, ndx, name) = (f[3], f[6], f[7]);
        if ndx == "UND" && !name.is_empty() {
            undefined.insert(name.to_string());
        } else if kind == "OBJECT" {
            if let Some(k) = name.strip_suffix(".kd") {
                kernels.insert(k.to_string());
            }
        }
    }
    (kernels, undefined)
}

fn which_clang() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["clang", "clang-16", "clang-15", "clang-14"]
        .iter()
        .flat_map(|n| std::env::split_paths(&path).map(move |d| d.join(n)))
        .find(|p| p.is_file())
}

struct AmdToolchain {
    clang: PathBuf,
    /// The same clang's C++ driver, for the norm's host simulation.
    clangxx: PathBuf,
    readelf: PathBuf,
}

/// Debian's layout: `/usr/lib/llvm-N/bin/{clang,ld.lld,llvm-readelf}`. The clang there finds its own ld.lld.
fn amd_toolchain() -> Option<AmdToolchain> {
    AMD_LLVM.iter().map(|v| PathBuf::from(format!("/usr/lib/llvm-{v}/bin"))).find_map(|bin| {
        let (clang, clangxx) = (bin.join("clang"), bin.join("clang++"));
        let (lld, readelf) = (bin.join("ld.lld"), bin.join("llvm-readelf"));
        let found = [&clang, &clangxx, &lld, &readelf].iter().all(|p| p.is_file());
        found.then_some(AmdToolchain { clang, clangxx, readelf })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_from_instantiations_and_plain_kernels() {
        let src = "#define ARX_INSTANTIATE(NAME, PARAMS) \\\n ARX_KERNEL void NAME##_bf16(PARAMS p) {}\n\
                   ARX_KERNEL void car_barrier_only(CarParams p) { car_barrier(p); }\n\
                   ARX_INSTANTIATE(car_1shot, CarParams)\n\
                   ARX_INSTANTIATE_BOUNDED(car_1shot_norm, CarParams, ARX_NORM_LANES)\n";
        let names: Vec<String> = declared_entries(src).into_iter().collect();
        let want = ["car_1shot_bf16", "car_1shot_fp16", "car_1shot_fp32", "car_1shot_norm_bf16", "car_1shot_norm_fp16"];
        assert_eq!(names[..5], want);
        assert_eq!(names[5..], ["car_1shot_norm_fp32", "car_barrier_only"]);
    }

    #[test]
    fn ptx_and_code_object_listings_parse() {
        let ptx = ".visible .entry car_rs_fp32(\n\t.param .align 8 .b8 p[160]\n)\n.func helper(\n";
        assert_eq!(ptx_entries(ptx).into_iter().collect::<Vec<_>>(), ["car_rs_fp32"]);
        let listing = "Symbol table '.dynsym' contains 3 entries:\n   Num:    Value          Size Type    Bind   Vis       Ndx Name\n\
                       0: 0000000000000000     0 NOTYPE  LOCAL  DEFAULT   UND \n\
                       1: 0000000000001580    64 OBJECT  GLOBAL PROTECTED   6 car_2shot_fp16.kd\n\
                       2: 000000000000c400  6840 FUNC    GLOBAL PROTECTED   7 car_2shot_fp16\n\
                       3: 0000000000000000     0 NOTYPE  GLOBAL DEFAULT   UND __ockl_get_local_size\n";
        let (kernels, undefined) = code_object_symbols(listing);
        assert_eq!(kernels.into_iter().collect::<Vec<_>>(), ["car_2shot_fp16"]);
        assert_eq!(undefined.into_iter().collect::<Vec<_>>(), ["__ockl_get_local_size"]);
    }
}
