//! GPU tests: the sweep on the machine's GPU driver, every method checked (comm-bench checks against the float64
//! reference and across ranks; this reads its verdicts), eager and graph. Without a GPU they skip, saying so, and
//! with `REQUIRE_GPU=1` that skip is a failure. `COMM_BENCH` points at the binary when the test runs away from its
//! build tree (a GPU node fed by `cargo xtask bundle`).

use serde_json::Value;
use std::process::Command;

fn gpu_present() -> Option<gpu::DriverKind> {
    let opts = gpu::DriverOptions { device: None, local_rank: None, shm_prefix: String::new() };
    let kind = gpu::open(gpu::Backend::Auto, &opts).ok()?.gpu.kind();
    let present = kind != gpu::DriverKind::Host;
    if !present {
        assert!(std::env::var("REQUIRE_GPU").as_deref() != Ok("1"), "REQUIRE_GPU=1 but no GPU driver opened");
        eprintln!("skipped: no GPU driver opened on this machine (set REQUIRE_GPU=1 to make this a failure)");
    }
    present.then_some(kind)
}

fn comm_bench() -> String {
    std::env::var("COMM_BENCH").unwrap_or_else(|_| env!("CARGO_BIN_EXE_comm-bench").to_string())
}

fn sweep(extra: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(comm_bench())
        .args(["--num_ranks", "2", "--counts", "8,1000,4099,65536,1048583", "--num_iters", "5", "--repeats", "1"])
        .args(["--methods", "all"])
        .args(["--export_csv", "--output_dir", dir.path().to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    let json: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("comm_ops_benchmark.json")).unwrap()).unwrap();
    json["rows"].as_array().unwrap().clone()
}

#[test]
fn every_custom_method_passes_on_the_gpu_eager_and_graph() {
    let Some(kind) = gpu_present() else { return };
    for extra in [&[][..], &["--graph"]] {
        let rows = sweep(extra);
        let custom = rows.iter().filter(|r| !r["method"].as_str().unwrap().starts_with("nccl"));
        for r in custom {
            // symm_ll carries messages up to its packet area only, and says so.
            let too_big = r["status"] == "skipped" && r["reason"].as_str().unwrap_or("").contains("largest message");
            assert!(r["status"] == "passed" || too_big, "{kind} {extra:?}: {r}");
        }
    }
}
