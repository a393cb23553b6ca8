//! `cargo xtask <task>`: the project's chores, in Rust so they run wherever cargo does.

mod perf_gate;

use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build the release binaries a GPU node needs into dist/ (comm-bench, gpu_smoke, scripts).
    Bundle,
    /// Run comm-bench (release build) with these arguments.
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Compile kernels/*.cu for NVIDIA (clang, PTX for sm_80) as a check that needs no GPU toolkit.
    KernelCheck,
    /// Quick criterion run compared with perf/baseline-<driver>.json (time relative to a device copy).
    PerfGate(perf_gate::Args),
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed: {status}"))
    }
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn bundle() -> Result<(), String> {
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "bench",
        "--bin",
        "comm-bench",
        "-p",
        "gpu",
        "--example",
        "gpu_smoke",
    ]))?;
    let dist = root().join("dist");
    std::fs::create_dir_all(&dist).map_err(|e| e.to_string())?;
    let release = root().join("target/release");
    for (from, to) in [(release.join("comm-bench"), "comm-bench"), (release.join("examples/gpu_smoke"), "gpu_smoke")] {
        std::fs::copy(&from, dist.join(to)).map_err(|e| format!("copy {}: {e}", from.display()))?;
    }
    for script in ["gpu_node.sh", "gpu_verify.sh"] {
        let from = root().join("scripts").join(script);
        std::fs::copy(&from, dist.join(script)).map_err(|e| format!("copy {}: {e}", from.display()))?;
    }
    println!("dist/ holds comm-bench, gpu_smoke, gpu_node.sh and gpu_verify.sh");
    Ok(())
}

fn kernel_check() -> Result<(), String> {
    let clang = which_clang().ok_or("no clang on PATH: `apt-get install clang` (Debian 12 ships clang 14)")?;
    let kernels = root().join("kernels");
    let out = std::env::temp_dir().join(format!("arx-kernel-check-{}", std::process::id()));
    std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
    // 3 algorithms x 3 dtypes, plus car's barrier-only floor.
    for (lib, want) in [("car", 10), ("symm", 9)] {
        // The Rust side concatenates common.h and the library the same way (include_str! + concat!).
        let mut src = std::fs::read_to_string(kernels.join("common.h")).map_err(|e| e.to_string())?;
        src += &std::fs::read_to_string(kernels.join(format!("{lib}.cu"))).map_err(|e| e.to_string())?;
        let cu = out.join(format!("{lib}.cu"));
        std::fs::write(&cu, src).map_err(|e| e.to_string())?;
        let ptx = out.join(format!("{lib}.ptx"));
        run(Command::new(&clang)
            .args([
                "-x",
                "cuda",
                "--cuda-device-only",
                "--cuda-gpu-arch=sm_80",
                "-nocudainc",
                "-nocudalib",
                "-std=c++17",
            ])
            .args(["-Werror", "-Wall", "-Wno-unused-function", "-S", "-include"])
            .arg(kernels.join("check/clang_cuda_prelude.h"))
            .arg("-o")
            .arg(&ptx)
            .arg(&cu))?;
        let text = std::fs::read_to_string(&ptx).map_err(|e| e.to_string())?;
        let entries = text.lines().filter(|l| l.starts_with(".visible .entry")).count();
        if entries != want {
            return Err(format!("{lib}: expected {want} kernel entry points, found {entries}"));
        }
        println!("{lib}: {entries} entry points compile for sm_80 (PTX)");
    }
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

fn which_clang() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["clang", "clang-16", "clang-15", "clang-14"]
        .iter()
        .flat_map(|n| std::env::split_paths(&path).map(move |d| d.join(n)))
        .find(|p| p.is_file())
}

fn main() -> ExitCode {
    let result = match Cli::parse().task {
        Task::Bundle => bundle(),
        Task::Bench { args } => {
            run(cargo().args(["run", "--release", "-p", "bench", "--bin", "comm-bench", "--"]).args(args))
        }
        Task::KernelCheck => kernel_check(),
        Task::PerfGate(args) => perf_gate::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
