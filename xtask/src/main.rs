//! `cargo xtask <task>`: the project's chores, in Rust so they run wherever cargo does.

mod host_sim;
mod kernels;
mod perf_gate;
mod tables;

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
    /// Build the release binaries a GPU node needs into dist/ (comm-bench, gpu_smoke, the GPU tests, scripts).
    Bundle {
        /// Bundle this commit instead of the work tree (built in a git worktree of its own under target/), for an
        /// A/B against it on a GPU node (scripts/gpu_ab.sh).
        #[arg(long)]
        rev: Option<String>,
        /// Where --rev's bundle goes [default: dist-REV, beside dist/].
        #[arg(long, requires = "rev")]
        into: Option<PathBuf>,
    },
    /// Run comm-bench (release build) with these arguments.
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Compile kernels/*.cu for NVIDIA (clang, PTX for sm_80) and AMD (code objects for gfx90a and gfx940) as a
    /// check that needs no GPU toolkit.
    KernelCheck(kernels::Args),
    /// Quick criterion run compared with perf/baseline-DRIVER-MACHINE.json (time relative to a device copy).
    PerfGate(perf_gate::Args),
    /// Put tuned tables into a driver's built-in set (crates/allreduce/tables/DRIVER.json): each replaces the table
    /// of its key (driver, device, ranks, mode, residency, call) or joins the set.
    Tables(tables::Args),
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

fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn bundle() -> Result<(), String> {
    run(cargo().args(["build", "--release", "-p", "comm-bench", "--bin", "comm-bench"]))?;
    run(cargo().args(["build", "--release", "-p", "gpu", "--example", "gpu_smoke", "--example", "cuda_foreign"]))?;
    run(cargo().args(["build", "--release", "-p", "allreduce-examples", "--features", "cuda", "--bins"]))?;
    let dist = root().join("dist");
    std::fs::create_dir_all(&dist).map_err(|e| e.to_string())?;
    let release = root().join("target/release");
    let built = [
        (release.join("comm-bench"), "comm-bench"),
        (release.join("examples/gpu_smoke"), "gpu_smoke"),
        (release.join("examples/cuda_foreign"), "cuda_foreign"),
        (release.join("cuda_graph_allreduce"), "cuda_graph_allreduce"),
        (release.join("host_allreduce"), "host_allreduce"),
    ];
    for (from, to) in &built {
        std::fs::copy(from, dist.join(to)).map_err(|e| format!("copy {}: {e}", from.display()))?;
    }
    strip(&dist, &built.map(|b| b.1))?;
    let scripts = [
        "gpu_env.sh",
        "gpu_node.sh",
        "gpu_verify.sh",
        "gpu_library.sh",
        "first_node_run.sh",
        "gpu_python.sh",
        "gpu_residency.sh",
        "gpu_ab.sh",
        "gpu_python_check.py",
        "gpu_dead_peer.py",
        "gpu_across.py",
        "ab_table.py",
        "comm_json.py",
    ];
    for script in scripts {
        let from = root().join("scripts").join(script);
        std::fs::copy(&from, dist.join(script)).map_err(|e| format!("copy {}: {e}", from.display()))?;
    }
    let example = root().join("python/examples/row_parallel.py");
    std::fs::copy(&example, dist.join("row_parallel.py")).map_err(|e| format!("copy {}: {e}", example.display()))?;
    // The test binaries that run on a GPU node: comm-bench's GPU sweep (COMM_BENCH=dist/comm-bench REQUIRE_GPU=1
    // dist/gpu_tests) and the communicator's driver-independent tests (ARX_TEST_BACKEND=cuda dist/communicator_tests,
    // dist/dead_peer_tests, dist/rows_tests, dist/disagreeing_ranks_tests), and the emulated nodes of `across` (ARX_TEST_BACKEND=cuda ARX_TEST_RANKS=8 dist/across_tests).
    for (package, test, to) in [
        ("comm-bench", "gpu", "gpu_tests"),
        ("allreduce", "communicator", "communicator_tests"),
        ("allreduce", "dead_peer", "dead_peer_tests"),
        ("allreduce", "rows", "rows_tests"),
        ("allreduce", "disagreeing_ranks", "disagreeing_ranks_tests"),
        ("across", "emulated_nodes", "across_tests"),
    ] {
        let json = output(cargo().args([
            "test",
            "--release",
            "-p",
            package,
            "--test",
            test,
            "--no-run",
            "--message-format=json",
        ]))?;
        let exe = json
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["target"]["name"] == test && v["executable"].is_string())
            .and_then(|v| v["executable"].as_str().map(PathBuf::from))
            .ok_or_else(|| format!("cargo reported no executable for {package}'s {test} tests"))?;
        std::fs::copy(&exe, dist.join(to)).map_err(|e| format!("copy {}: {e}", exe.display()))?;
        strip(&dist, &[to])?;
    }
    wheel(&dist)?;
    println!("dist/ holds comm-bench, the GPU checks and examples, the test binaries, the allreduce_rs wheel and the GPU-node scripts");
    Ok(())
}

/// Bundles commit `rev` (that commit's own `cargo xtask bundle`, in a detached worktree under target/, removed after)
/// into `into`, which must not exist yet.
fn bundle_at(rev: &str, into: Option<PathBuf>) -> Result<(), String> {
    let git = || {
        let mut c = Command::new("git");
        c.current_dir(root());
        c
    };
    let short = output(git().args(["rev-parse", "--short", &format!("{rev}^{{commit}}")]))
        .map_err(|e| format!("{rev} names no commit of this repository: {e}"))?;
    let short = short.trim();
    let into = into.unwrap_or_else(|| root().join(format!("dist-{short}")));
    if into.exists() {
        return Err(format!("{} exists: remove it, or name another place with --into", into.display()));
    }
    let tree = root().join("target/bundle-worktrees").join(short);
    if tree.exists() {
        run(git().args(["worktree", "remove", "--force"]).arg(&tree))?;
    }
    run(git().args(["worktree", "add", "--detach"]).arg(&tree).arg(short))?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = run(Command::new(cargo).current_dir(&tree).env_remove("CARGO_TARGET_DIR").args(["xtask", "bundle"]))
        .and_then(|()| std::fs::rename(tree.join("dist"), &into).map_err(|e| format!("move {short}'s dist/: {e}")));
    run(git().args(["worktree", "remove", "--force"]).arg(&tree))?;
    built?;
    println!("{} holds the bundle of {short}", into.display());
    Ok(())
}

/// Builds the allreduce_rs wheel (abi3, manylinux) into `dist` with maturin from the virtual environment that
/// python/tests/pytest.rs keeps under target/ (made here, with maturin alone, when missing), in that test's cargo
/// target directory, so neither rebuilds the other's pyo3.
fn wheel(dist: &Path) -> Result<(), String> {
    let tmp = root().join("target/tmp/python");
    let venv = tmp.join("venv");
    if !venv.join("bin/maturin").is_file() {
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        run(Command::new(python).args(["-m", "venv"]).arg(&venv))?;
        run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", "maturin>=1.9.4,<2"]))?;
    }
    // A stale wheel beside the new one would make the node's `pip install dist/allreduce_rs-*.whl` install two.
    for old in std::fs::read_dir(dist).map_err(|e| e.to_string())?.filter_map(|e| e.ok()) {
        let name = old.file_name();
        if name.to_string_lossy().starts_with("allreduce_rs-") {
            std::fs::remove_file(old.path()).map_err(|e| format!("remove {}: {e}", old.path().display()))?;
        }
    }
    run(Command::new(venv.join("bin/maturin"))
        .args(["build", "--release", "--manifest-path"])
        .arg(root().join("python/Cargo.toml"))
        .arg("--out")
        .arg(dist)
        .env("CARGO_TARGET_DIR", tmp.join("cargo")))
}

/// Strips debug information from the bundled binaries: a GPU node's transfer limits are tight, and a release
/// binary's line tables make it several times larger. Without binutils' `strip` they stay as they are.
fn strip(dist: &std::path::Path, names: &[&str]) -> Result<(), String> {
    match Command::new("strip").args(names.iter().map(|n| dist.join(n))).status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("strip failed: {s}")),
        Err(e) => {
            eprintln!("xtask: binaries left unstripped (no strip: {e})");
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let result = match Cli::parse().task {
        Task::Bundle { rev: None, .. } => bundle(),
        Task::Bundle { rev: Some(rev), into } => bundle_at(&rev, into),
        Task::Bench { args } => {
            run(cargo().args(["run", "--release", "-p", "comm-bench", "--bin", "comm-bench", "--"]).args(args))
        }
        Task::KernelCheck(args) => kernels::kernel_check(args),
        Task::PerfGate(args) => perf_gate::run(&args),
        Task::Tables(args) => tables::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
