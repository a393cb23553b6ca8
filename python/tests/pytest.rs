//! The Python package's tests, run by `cargo test`: a virtual environment under the target directory (made once,
//! kept between runs) gets maturin, pytest, numpy, ml_dtypes and torch (PyPI's, with its CUDA wheels: the only
//! torch PyPI serves; CPU tensors are what the tests use) from PyPI; `pip install ./python` builds and
//! installs the wheel there (its own cargo target directory, so the workspace's builds and the extension module's
//! never rebuild each other); then pytest runs `python/tests` and the scripts' tests (`scripts/test_peer_bench.py`:
//! the peer benchmark and the results combiner) and must pass. Without python3 the test says it was skipped,
//! loudly; under CI (CI=true) that is a failure.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// What the environment needs, pinned to the majors tested.
const REQUIREMENTS: &[&str] =
    &["maturin>=1.9.4,<2", "pytest>=8,<10", "numpy>=1.22,<3", "ml_dtypes>=0.4,<1", "torch==2.11.*"];

/// The interpreter to build the environment from: `$PYTHON`, else `python3`, if it runs.
fn python() -> Option<PathBuf> {
    let exe = std::env::var_os("PYTHON").map_or_else(|| PathBuf::from("python3"), PathBuf::from);
    let ok = Command::new(&exe).args(["-c", "import sys, venv; assert sys.version_info >= (3, 9)"]).output();
    ok.is_ok_and(|o| o.status.success()).then_some(exe)
}

/// Runs `cmd`, failing the test with its output when it fails.
fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The environment under `dir`, made (or remade, when the requirements changed) with `python`.
fn venv(python: &Path, dir: &Path) -> PathBuf {
    let venv = dir.join("venv");
    let stamp = venv.join("allreduce-requirements.txt");
    let wanted = REQUIREMENTS.join("\n");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(wanted.as_str()) {
        let _ = std::fs::remove_dir_all(&venv);
        run(Command::new(python).args(["-m", "venv"]).arg(&venv));
        run(Command::new(venv.join("bin/python"))
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(REQUIREMENTS));
        std::fs::write(&stamp, wanted).expect("writing the environment's stamp");
    }
    venv
}

#[test]
fn python_package_builds_installs_and_passes_pytest() {
    let Some(python) = python() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but no python3 (3.9+, with venv) to test the Python package"
        );
        // Written past the test harness's capture, so a skip is seen even when the run passes.
        let _ = writeln!(std::io::stderr(), "SKIPPED: python_package: no python3 (3.9+, with venv) on this machine");
        return;
    };
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python");
    let venv = venv(&python, &dir);
    let bin = venv.join("bin");
    let path = std::env::join_paths(
        std::iter::once(bin.clone()).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .expect("PATH joins");
    // The user's command, `pip install ./python`, with the environment's maturin as the build backend.
    run(Command::new(bin.join("pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "--no-build-isolation", "--no-deps"])
        .args(["--force-reinstall"])
        .arg(here)
        .env("PATH", &path)
        .env("CARGO_TARGET_DIR", dir.join("cargo")));
    let out = run(Command::new(bin.join("python"))
        .args(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"])
        .arg(here.join("tests"))
        .arg(here.join("../scripts/test_peer_bench.py"))
        .env("PATH", &path)
        .current_dir(&dir));
    let summary = String::from_utf8_lossy(&out.stdout);
    let last = summary.lines().last().unwrap_or_default().to_string();
    let _ = writeln!(std::io::stderr(), "pytest: {last}");
    assert!(last.contains(" passed") && !last.contains("failed") && !last.contains("skipped"), "{summary}");
}
