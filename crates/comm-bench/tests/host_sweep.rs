//! End-to-end tests of comm-bench on the host driver: real rank processes, real shared memory, every result
//! checked against the float64 reference and across ranks by comm-bench itself; these tests read its JSON.

use serde_json::Value;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_comm-bench");

fn comm_bench(args: &[&str]) -> Output {
    Command::new(BIN).args(["--backend", "host"]).args(args).output().expect("comm-bench runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Runs a sweep, passed or not, and returns its output and its JSON rows.
fn run(world: usize, extra: &[&str]) -> (Output, Vec<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let w = world.to_string();
    let mut args = vec!["--num_ranks", &w, "--repeats", "1", "--export_csv"];
    let out_dir = dir.path().to_str().unwrap().to_string();
    args.extend(["--output_dir", &out_dir]);
    args.extend(extra);
    let o = comm_bench(&args);
    let json = std::fs::read(dir.path().join("comm_ops_benchmark.json"));
    let json: Value = serde_json::from_slice(&json.unwrap_or_else(|e| panic!("{args:?}: {e}:\n{}", text(&o)))).unwrap();
    assert_eq!(json["world"], world);
    (o, json["rows"].as_array().unwrap().clone())
}

/// Runs a short sweep and returns its JSON rows, after asserting success.
fn sweep(world: usize, extra: &[&str]) -> Vec<Value> {
    let (o, rows) = run(world, &[&["--num_iters", "3", "--num_warmup_iters", "1"][..], extra].concat());
    assert!(o.status.success(), "comm-bench {extra:?} failed:\n{}", text(&o));
    rows
}

/// Runs a sweep that must fail: `good` passes every row, every other method fails each with a reason containing
/// `reason`.
fn sweep_fails(world: usize, extra: &[&str], good: &str, reason: &str) {
    let (o, rows) = run(world, extra);
    assert!(!o.status.success(), "{}", text(&o));
    for r in rows {
        if r["method"] == good {
            assert_eq!(r["status"], "passed", "{r}");
        } else {
            assert_eq!(r["status"], "failed", "{r}");
            assert!(r["reason"].as_str().unwrap().contains(reason), "{r}");
        }
    }
}

fn assert_passed(rows: &[Value], methods: &[&str], counts: &[usize]) {
    for m in methods {
        for &n in counts {
            let row =
                rows.iter().find(|r| r["method"] == *m && r["count"] == n).unwrap_or_else(|| panic!("no row {m} {n}"));
            assert_eq!(row["status"], "passed", "{m} at {n}: {row}");
            assert!(row["time_ms"].as_f64().unwrap() > 0.0);
        }
    }
}

const COUNTS: &[usize] = &[8, 13, 1000, 4099, 65536, 1_048_583];

#[test]
fn allreduce_every_world_size_and_odd_counts() {
    let counts = COUNTS.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
    for world in [1, 2, 3, 4, 8] {
        let rows = sweep(world, &["--counts", &counts, "--methods", "all"]);
        assert_passed(&rows, &["car_1shot", "symm_1shot", "car_2shot", "symm_2shot"], COUNTS);
        let tuned =
            ["symm_1shot_tuned", "symm_2shot_tuned", "symm_epoch_1shot", "symm_zc_1shot", "symm_zc_2shot", "auto"];
        assert_passed(&rows, &tuned, COUNTS);
        assert_passed(&rows, &["symm_ll"], &COUNTS[..4]);
        // One shard per source in a 96 KiB packet area: up to world x 96 KiB (bf16).
        let (fits, above): (Vec<usize>, Vec<usize>) = COUNTS.iter().partition(|&&n| 2 * n <= world * (96 << 10));
        assert_passed(&rows, &["symm_zc_2shot_ll"], &fits);
        for n in above {
            let row = rows.iter().find(|r| r["method"] == "symm_zc_2shot_ll" && r["count"] == n).unwrap();
            assert!(row["status"].as_str().unwrap().starts_with("skipped"), "{row}");
        }
        assert!(!rows.iter().any(|r| r["method"] == "nccl"), "the host driver has no NCCL: no rows");
    }
}

#[test]
fn ablation_variants_and_launch_shapes_every_world_size() {
    let counts = [8, 13, 4099, 65536, 300_001];
    let list = counts.map(|c| c.to_string()).join(",");
    let variants: Vec<&str> = methods::ablations().collect();
    let shapes = ["car_1shot@1x512", "car_1shot@64x512", "car_2shot@64x512", "symm_1shot@4x512", "car_1shot@16x128"];
    let tuned_shapes = ["symm_ll@3x64", "symm_epoch_1shot@5x128", "symm_zc_1shot@2x256", "symm_zc_2shot@7x32"];
    for world in [1, 2, 3, 8] {
        let rows = sweep(world, &["--counts", &list, "--methods", "ablation,staging,shapes"]);
        assert_passed(&rows, &variants, &counts);
        assert_passed(&rows, &shapes, &counts);
        let rows = sweep(world, &["--counts", "8,4099,20001", "--methods", &tuned_shapes.join(",")]);
        assert_passed(&rows, &tuned_shapes, &[8, 4099, 20001]);
    }
    for dtype in ["fp16", "fp32"] {
        let rows = sweep(3, &["--counts", "8,4099,70001", "--dtype", dtype, "--methods", "ablation,staging"]);
        assert_passed(&rows, &variants, &[8, 4099, 70001]);
    }
    let rows = sweep(4, &["--counts", "1000,300000", "--graph", "--methods", "ablation,staging"]);
    assert_passed(&rows, &variants, &[1000, 300000]);
}

#[test]
fn launch_shapes_the_device_cannot_give_are_refused() {
    let o = comm_bench(&["--num_ranks", "2", "--counts", "64", "--methods", "car_1shot@65x512"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("blocks must be 1 to 64"), "{}", text(&o));
    let o = comm_bench(&["--num_ranks", "2", "--counts", "64", "--methods", "symm_2shot_tuned@4x512"]);
    assert!(text(&o).contains("launch shapes"), "{}", text(&o));
    let rows = sweep(3, &["--counts", "64", "--methods", "car_1shot@64x32"]);
    assert_eq!(rows[0]["status"], "passed", "32 threads serve 3 ranks: {}", rows[0]);
}

#[test]
fn allreduce_fp16_fp32_and_graph_mode() {
    for dtype in ["fp16", "fp32"] {
        let rows = sweep(3, &["--counts", "8,4099,36000,70001", "--dtype", dtype, "--methods", "all"]);
        let all = ["car_1shot", "symm_1shot", "car_2shot", "symm_2shot", "symm_1shot_tuned", "symm_2shot_tuned"];
        assert_passed(&rows, &all, &[8, 4099, 36000, 70001]);
    }
    // 36000 bf16 elements lie between the tuned methods' graph and eager packet hand-overs: epoch one-shot here,
    // packets in the fp16 sweep above.
    let rows = sweep(4, &["--counts", "1000,36000,300000", "--graph", "--methods", "all"]);
    assert_passed(
        &rows,
        &["car_1shot", "symm_1shot", "car_2shot", "symm_2shot", "symm_1shot_tuned", "symm_2shot_tuned"],
        &[1000, 36000, 300000],
    );
}

#[test]
fn reduce_scatter_every_world_size() {
    // Multiples of 840 = lcm(1..=8), so every world splits them; 840 / 8 = 105 is not a multiple of the vector.
    let counts = [24, 840, 10920, 1_049_160];
    let list = counts.map(|c| c.to_string()).join(",");
    for world in [1, 2, 3, 4, 8] {
        let rows = sweep(world, &["--op", "reduce_scatter", "--counts", &list]);
        assert_passed(&rows, &["car_rs", "symm_rs"], &counts);
    }
    let rows = sweep(3, &["--op", "reduce_scatter", "--counts", "840,1000"]);
    let row = rows.iter().find(|r| r["method"] == "car_rs" && r["count"] == 1000).unwrap();
    assert_eq!(row["status"], "skipped");
    assert!(row["reason"].as_str().unwrap().contains("equal shards"));
}

/// All-gather at every world size up to 4, at counts whose per-rank bytes are not a multiple of 16 too (rank r's
/// slot of the output is then not aligned like its source); its bus bandwidth is nccl-tests'; a gather that puts
/// the ranks' inputs in the wrong slots fails the check of every rank's output.
#[test]
fn all_gather_every_world_size_and_a_wrong_gather_fails() {
    let counts = [8, 13, 1000, 4099, 65536];
    let list = counts.map(|c| c.to_string()).join(",");
    for world in [1, 2, 3, 4] {
        let rows = sweep(world, &["--op", "all_gather", "--counts", &list]);
        assert_passed(&rows, &["car_ag"], &counts);
        assert!(!rows.iter().any(|r| r["method"] == "nccl_ag"), "the host driver has no NCCL: no rows");
        let row = rows.iter().find(|r| r["count"] == 1000).unwrap();
        let (algbw, busbw) = (row["algbw_gbs"].as_f64().unwrap(), row["busbw_gbs"].as_f64().unwrap());
        assert!((busbw - algbw * (world - 1) as f64).abs() <= 1e-9 * algbw, "{row}");
    }
    let args = ["--op", "all_gather", "--counts", "8,4099,20000", "--methods", "car_ag,car_ag_broken_ringorder"];
    sweep_fails(3, &args, "car_ag", "before timing: rank 1 has");
}

#[test]
fn csv_has_comm_bench_py_columns_and_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let o = comm_bench(&[
        "--num_ranks",
        "2",
        "--num_iters",
        "2",
        "--num_warmup_iters",
        "0",
        "--repeats",
        "1",
        "--max_size",
        "14",
        "--size_steps",
        "5",
        "--export_csv",
        "--output_dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let csv = std::fs::read_to_string(dir.path().join("comm_ops_benchmark.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next().unwrap(),
        "N,fbgemm_1shot_time,fbgemm_1shot_bwidth,symm_1shot_time,symm_1shot_bwidth,fbgemm_2shot_time,\
         fbgemm_2shot_bwidth,symm_2shot_time,symm_2shot_bwidth,nccl_time,nccl_bwidth"
    );
    let ns: Vec<usize> = lines.map(|l| l.split(',').next().unwrap().parse().unwrap()).collect();
    assert_eq!(ns, measure::sizes::comm_bench_sizes(10, 14, 5, 256));
    // bwidth = N * 2 bytes / time.
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    let (n, t, bw): (f64, f64, f64) = (row[0].parse().unwrap(), row[1].parse().unwrap(), row[2].parse().unwrap());
    assert!((n * 2.0 / (t * 1e-3) / 1e9 - bw).abs() <= 1e-9 * bw);
    assert_eq!(row[9], "", "nccl cells stay empty on the host driver");
}

/// `--max_seconds` of a nanosecond: set-up alone outlasts it, so every rank stops after the first size (which always
/// runs), and the summary and JSON name the sizes that did not run; the run still passes.
#[test]
fn max_seconds_ends_the_sweep_after_the_same_size_on_every_rank() {
    let counts = "1024,2048,4096";
    let (o, rows) =
        run(3, &["--counts", counts, "--methods", "car_1shot,auto", "--num_iters", "2", "--max_seconds", "1e-9"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_passed(&rows, &["car_1shot", "auto"], &[1024]);
    assert!(rows.iter().all(|r| r["count"] == 1024), "{rows:?}");
    let out = text(&o);
    assert!(out.contains("# Not run: 2 size(s), 2048 to 4096 elements: --max_seconds was reached first"), "{out}");
}

/// A sweep with `auto` times every rank's copy of its input at each size (the JSON's `copy_floor`) and closes its
/// summary with `auto` on caller buffers against `auto+reg` plus that copy; a sweep without `auto` measures none. The
/// JSON's `auto` rows say which design ran.
#[test]
fn a_sweep_with_auto_measures_the_copy_floor_of_its_caller_bound_and_the_design_it_ran() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let counts = [1024usize, 65536];
    let mut args = vec!["--num_ranks", "2", "--counts", "1024,65536", "--num_iters", "3", "--num_warmup_iters", "1"];
    args.extend(["--repeats", "1", "--export_csv", "--output_dir", out_dir, "--methods", "car_1shot,auto"]);
    let o = comm_bench(&args);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let json: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("comm_ops_benchmark.json")).unwrap()).unwrap();
    let floors = json["copy_floor"].as_array().unwrap();
    let got: Vec<u64> = floors.iter().map(|f| f["count"].as_u64().unwrap()).collect();
    assert_eq!(got, counts.map(|c| c as u64), "{json}");
    assert!(floors.iter().all(|f| f["time_ms"].as_f64().unwrap() > 0.0), "{json}");
    assert!(out.contains("# auto (caller buffers) against its bound"), "{out}");
    assert!(out.contains("its bound at 2 sizes"), "{out}");
    // The design `auto` ran is in its rows, and only in them.
    for r in json["rows"].as_array().unwrap() {
        let ran = r["ran"].as_str();
        match r["method"].as_str().unwrap() {
            "auto" | "auto+reg" => {
                assert!(ran.is_some_and(|d| allreduce::Algorithm::from_name(d).is_some()), "{r}")
            }
            _ => assert!(ran.is_none(), "{r}"),
        }
    }

    let (o, _) = run(2, &["--counts", "1024", "--methods", "car_1shot", "--num_iters", "2"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("against its bound"), "{}", text(&o));
}

/// A size's methods are timed in rounds (each one repeat a round, in turn), each checked again after its last round:
/// designs whose caller-buffer calls copy into the registered input that their `+reg` calls read (the zero-copy
/// ones, and `auto` on them) still pass, each with one timing a round, since every round puts that input back.
#[test]
fn methods_timed_in_rounds_pass_the_check_after_their_last_round() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let methods = ["auto", "symm_zc_1shot", "symm_zc_2shot", "symm_zc_2shot_pull", "car_1shot"];
    let joined = methods.join(",");
    let mut args = vec!["--num_ranks", "3", "--counts", "4099,65536", "--num_iters", "2", "--num_warmup_iters", "1"];
    args.extend(["--repeats", "3", "--export_csv", "--output_dir", out_dir, "--methods", &joined]);
    let o = comm_bench(&args);
    assert!(o.status.success(), "{}", text(&o));
    let json: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("comm_ops_benchmark.json")).unwrap()).unwrap();
    let rows = json["rows"].as_array().unwrap();
    let with_reg: Vec<String> = methods.iter().flat_map(|m| [m.to_string(), format!("{m}+reg")]).collect();
    let names: Vec<&str> = with_reg.iter().map(String::as_str).filter(|m| *m != "car_1shot+reg").collect();
    assert_passed(rows, &names, &[4099, 65536]);
    assert_eq!(rows.len(), 2 * names.len(), "{rows:?}");
    for r in rows {
        assert_eq!(r["repeats_ms"].as_array().unwrap().len(), 3, "{r}");
    }
}

#[test]
fn world_above_eight_is_refused_up_front_with_a_reason() {
    for world in ["9", "16"] {
        let o = comm_bench(&["--num_ranks", world, "--counts", "16"]);
        assert!(!o.status.success(), "{}", text(&o));
        assert!(text(&o).contains("1 to 8 ranks"), "{}", text(&o));
        assert!(!text(&o).contains("[rank"), "refused before any rank starts: {}", text(&o));
    }
}

#[test]
fn a_rank_that_never_arrives_times_out_naming_it() {
    let start = Instant::now();
    let o = Command::new(BIN)
        .args(["--backend", "host", "--counts", "8", "--timeout_s", "1", "--setup_timeout_s", "2"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "3")
        .env("LOCAL_RANK", "0")
        .env("ALLREDUCE_JOB_ID", ipc::JobId::random().as_str())
        .output()
        .unwrap();
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("[1, 2]") && t.contains("timed out"), "{t}");
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn ranks_that_disagree_are_refused() {
    let job = ipc::JobId::random();
    let spawn = |rank: &str, dtype: &str| {
        Command::new(BIN)
            .args(["--backend", "host", "--counts", "64", "--timeout_s", "5", "--dtype", dtype])
            .env("RANK", rank)
            .env("WORLD_SIZE", "2")
            .env("LOCAL_RANK", rank)
            .env("ALLREDUCE_JOB_ID", job.as_str())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn("0", "bf16"), spawn("1", "fp32"));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(!a.status.success() && !b.status.success());
    let t = text(&b);
    // bf16 and fp32 sweeps of one count need different capacities: the communicator names that first.
    assert!(t.contains("disagree") && t.contains("rank 0 has capacity_bytes=128"), "{t}");
}

#[test]
fn a_failing_rank_stops_the_launch() {
    let start = Instant::now();
    let o = Command::new(BIN)
        .args(["launch", "-n", "3", "--", "sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 30"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("rank 1") && t.contains("exit code 3"), "{t}");
    assert!(start.elapsed() < Duration::from_secs(10), "the other ranks must be stopped");
}

#[test]
fn bad_flags_get_a_clear_error_and_no_launch() {
    let bad_flags: [&[&str]; 4] = [
        &["--num_iters", "0"],
        &["--methods", "car_9shot"],
        &["--min_size", "20", "--max_size", "10"],
        &["--max_seconds", "0"],
    ];
    for bad in bad_flags {
        let o = comm_bench(bad);
        assert!(!o.status.success());
        assert!(!text(&o).contains("[rank"), "nothing may be launched for {bad:?}");
    }
}

/// A protocol that reads a peer's buffer while the peer already writes its next call's input (one buffer half for
/// every call) passes a single checked call and identical timed calls; the checks of consecutive calls with
/// changing inputs (device-side checksum) must fail it, at every size, while car's real one-shot passes, also with
/// the ranks held back apart before those calls (`--skew_us`).
#[test]
fn a_protocol_that_reads_a_stale_buffer_fails_the_consecutive_call_checks() {
    let args =
        ["--counts", "8,1000,4099,20000", "--methods", "car_1shot,car_1shot_broken_samehalf", "--num_iters", "5"];
    sweep_fails(3, &args, "car_1shot", "checksum");
    let args = [&args[..], &["--skew_us", "3000"]].concat();
    sweep_fails(3, &args, "car_1shot", "checksum");
}

/// A two-shot that keeps each shard's sum in its rank's fixed input buffer (upstream's layout, without upstream's
/// exit barrier) is right in any one call, but a fast rank's next memcpy into that buffer overwrites its sum while a
/// slow peer still gathers it: the checks of consecutive calls must fail it at every size, while car's two-shot
/// (sums in the parity halves, so its memcpy needs no exit barrier) passes.
#[test]
fn a_two_shot_that_gathers_from_the_fixed_input_buffer_fails_the_consecutive_call_checks() {
    let args =
        ["--counts", "8,1000,4099,20000", "--methods", "car_2shot,car_2shot_broken_suminput", "--num_iters", "5"];
    sweep_fails(3, &args, "car_2shot", "checksum");
}
