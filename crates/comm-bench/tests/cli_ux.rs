//! comm-bench as a user coming from comm_bench.py and nccl-tests meets it, on the host driver: the run header and
//! closing summary, refusals before any rank starts (paths, memory, world size), exit codes, the flags of both
//! tools, `--report`, `--tune`'s table and `launch`'s environment.

use serde_json::Value;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_comm-bench");
const QUICK: &[&str] = &["--backend", "host", "-n", "2", "-w", "0", "--repeats", "2"];

fn comm_bench(args: &[&str]) -> Output {
    Command::new(BIN).args(QUICK).args(args).output().expect("comm-bench runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn json(dir: &std::path::Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("comm_ops_benchmark.json")).unwrap()).unwrap()
}

#[test]
fn header_names_what_cannot_run_once_and_summary_closes_like_nccl_tests() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = comm_bench(&["--num_ranks", "2", "--counts", "1024,4096,65536", "--export_csv", "--output_dir", d]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    // The default methods: comm_bench.py's and auto; nccl is named once, with its reason, and has no row.
    assert_eq!(t.matches("not run: nccl:").count(), 1, "{t}");
    assert!(t.contains("Not run: nccl"), "the summary repeats it: {t}");
    assert!(!t.contains("skipped"), "{t}");
    for head in [
        "comm-bench 0.1.0 (commit ",
        "host driver",
        "eager mode",
        "2 timed calls after 0 warm-up",
        "max (--report)",
        "auto on caller buffers follows",
    ] {
        assert!(t.contains(head), "the header lacks {head:?}:\n{t}");
    }
    for tail in
        ["# Summary: us per call", "fastest", "# Mean busbw (GB/s)", "# Failures: none", "# Avg bus bandwidth    : "]
    {
        assert!(t.contains(tail), "the summary lacks {tail:?}:\n{t}");
    }
    let j = json(dir.path());
    let methods: Vec<&str> = j["rows"].as_array().unwrap().iter().map(|r| r["method"].as_str().unwrap()).collect();
    assert_eq!(methods.len(), 3 * 6, "car and symm one- and two-shot, auto and auto+reg at 3 sizes: {methods:?}");
    assert_eq!(j["unavailable"][0]["method"], "nccl");
    assert!(j["provenance"]["tool"].as_str().unwrap().starts_with("comm-bench"));
}

/// A design whose kernel the device fits no block of (the host driver told so) is named as not run, with why, and the
/// others run; `auto`, which would have picked it, runs car's of its shape.
#[test]
fn a_design_the_device_cannot_fit_is_not_run_and_the_rest_is() {
    let o = Command::new(BIN)
        .args(QUICK)
        .args(["--num_ranks", "2", "--counts", "1024,1048576", "--methods", "symm_zc_2shot,car_2shot,auto"])
        .env(gpu::UNFIT_KERNELS_VAR, "symm_zc_2shot")
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("Not run: symm_zc_2shot: does not run on this device: symm_zc_2shot: not even one block"),
        "{t}"
    );
    assert!(t.contains("symm_zc_2shot: not even one block of 1 thread(s) per rank fits beside the 2 ranks that share a device: the designs that need it run car's"), "{t}");
    assert!(t.contains("# Failures: none"), "{t}");
    // A name that is no kernel's is refused, rather than leave every kernel fit.
    let o = Command::new(BIN)
        .args(QUICK)
        .args(["--num_ranks", "2", "--counts", "1024", "--methods", "car_2shot"])
        .env(gpu::UNFIT_KERNELS_VAR, "symm_zc_2shot,symm_zc_2sht")
        .output()
        .unwrap();
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("ARX_HOST_UNFIT_KERNELS names [\"symm_zc_2sht\"], which are no kernel's name"), "{t}");
}

#[test]
fn nothing_measured_exits_non_zero() {
    let o = comm_bench(&["--num_ranks", "2", "--counts", "64", "--methods", "nccl"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("none of the methods asked for can run here"), "{}", text(&o));
    // Every row skipped (1000 elements do not split into 3 shards).
    let o = comm_bench(&["--num_ranks", "3", "--op", "reduce_scatter", "--counts", "1000"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("nothing could be measured"), "{}", text(&o));
}

#[test]
fn a_sweep_the_machine_cannot_hold_is_refused_before_any_rank_starts() {
    let o = comm_bench(&["--max_size", "30"]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("this sweep needs about") && t.contains("--max_size"), "{t}");
    assert!(!t.contains("[rank"), "refused before any rank starts: {t}");
}

#[test]
fn output_paths_are_checked_before_any_rank_starts_and_errors_name_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let bad = file.join("out");
    let bad = bad.to_str().unwrap();
    for args in [&["--export_csv", "--output_dir", bad][..], &["--tune", &format!("{bad}/table.json")]] {
        let o = comm_bench(&[&["--counts", "64"][..], args].concat());
        let t = text(&o);
        assert!(!o.status.success(), "{t}");
        assert!(t.contains(bad), "the error names the path: {t}");
        assert!(!t.contains("[rank"), "refused before any rank starts: {t}");
    }
    // A directory that does not exist yet is created.
    let fresh = dir.path().join("new/deeper");
    let o = comm_bench(&[
        "--counts",
        "64",
        "--methods",
        "car_1shot",
        "--export_csv",
        "--output_dir",
        fresh.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(fresh.join("comm_ops_benchmark.csv").exists());
}

#[test]
fn report_rank0_reproduces_comm_bench_py_figure() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = comm_bench(&[
        "--num_ranks",
        "3",
        "--counts",
        "4096",
        "--methods",
        "car_1shot",
        "--report",
        "rank0",
        "--export_csv",
        "--output_dir",
        d,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let j = json(dir.path());
    assert_eq!(j["report"], "rank0");
    let row = &j["rows"][0];
    let rank0: Vec<f64> = row["ranks_ms"].as_array().unwrap().iter().map(|r| r[0].as_f64().unwrap()).collect();
    assert_eq!(rank0.len(), 2, "one per repeat");
    assert!(row["ranks_ms"][0].as_array().unwrap().len() == 3, "every rank's time: {row}");
    // The one median (measure::timing's), so the comparison is exact rather than a second formula's rounding.
    let median = measure::timing::median(&rank0);
    assert_eq!(row["time_ms"].as_f64().unwrap(), median, "the median of rank 0's own times: {row}");
    let csv = std::fs::read_to_string(dir.path().join("comm_ops_benchmark.csv")).unwrap();
    let cell: f64 = csv.lines().nth(1).unwrap().split(',').nth(1).unwrap().parse().unwrap();
    assert_eq!(cell, median, "the CSV holds the figure asked for");
}

#[test]
fn nccl_tests_sizes_and_short_flags_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = comm_bench(&[
        "--num_ranks",
        "2",
        "-b",
        "1K",
        "-e",
        "4K",
        "-f",
        "2",
        "-d",
        "fp32",
        "-G",
        "1",
        "--methods",
        "car_1shot",
        "--export_csv",
        "--output_dir",
        d,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let j = json(dir.path());
    let counts: Vec<u64> = j["rows"].as_array().unwrap().iter().map(|r| r["count"].as_u64().unwrap()).collect();
    assert_eq!(counts, [256, 512, 1024]);
    assert_eq!((j["dtype"].as_str(), j["graph"].as_bool()), (Some("fp32"), Some(true)));
    let o = Command::new(BIN).args(["--num_iters", "-5"]).output().unwrap();
    assert!(!o.status.success() && text(&o).contains("-5 is not in 1..=1000000"), "{}", text(&o));
}

#[test]
fn tune_prints_its_table_by_size_range() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("tables/tune.json");
    let o = Command::new(BIN)
        .args(QUICK)
        .args(["--num_ranks", "2", "--counts", "1024,65536", "--tune", table.to_str().unwrap()])
        .env("ALLREDUCE_TUNE_DIR", dir.path().join("cache"))
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("message size (bytes)  algorithm") && t.contains("eager"), "{t}");
    // One line per size range, the last open-ended (one range when one algorithm won both sizes).
    assert!(t.contains(" and above  "), "{t}");
    // Plain tables and, rows of 4096 fitting the largest size, norm calls' own: every mode and residency of each.
    let set: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&table).unwrap()).unwrap();
    let norm = set.iter().filter(|t| t["key"]["op"] == "add_rms_norm").count();
    assert_eq!((set.len(), norm), (12, 6), "{t}");
    assert!(t.contains(" norm ") && t.contains("allreduce + residual add + RMSNorm"), "{t}");
    // Norm calls measure the unfused sequence too, after the fastest plain allreduces.
    assert!(t.lines().any(|l| l.contains(" norm ") && l.contains(" unfused:")), "{t}");
    // --tune_hidden 0: plain tables only.
    let o = Command::new(BIN)
        .args(QUICK)
        .args(["--num_ranks", "2", "--counts", "1024", "--tune_hidden", "0", "--tune", table.to_str().unwrap()])
        .env("ALLREDUCE_TUNE_DIR", dir.path().join("cache"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let set: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&table).unwrap()).unwrap();
    assert!(set.len() == 6 && set.iter().all(|t| t["key"].get("op").is_none()), "{set:?}");
    // --tune_norm_only: norm tables only (rows of 512 up to 1024 elements); with no row to measure, refused.
    let tune = |extra: &[&str]| {
        let args = ["--num_ranks", "2", "--counts", "1024", "--tune_norm_only", "--tune", table.to_str().unwrap()];
        Command::new(BIN)
            .args(QUICK)
            .args(args)
            .args(extra)
            .env("ALLREDUCE_TUNE_DIR", dir.path().join("cache"))
            .output()
    };
    let o = tune(&["--tune_hidden", "512"]).unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let set: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&table).unwrap()).unwrap();
    assert!(set.len() == 6 && set.iter().all(|t| t["key"]["op"] == "add_rms_norm"), "{set:?}");
    assert!(!text(&o).contains(" plain "), "{}", text(&o));
    // Without plain measurements, after the table's allreduce.
    assert!(text(&o).lines().any(|l| l.contains(" norm ") && l.contains(" unfused:")), "{}", text(&o));
    let o = tune(&["--tune_hidden", "0"]).unwrap();
    assert!(!o.status.success() && text(&o).contains("norm calls only"), "{}", text(&o));
    assert!(!text(&o).contains("[rank"), "refused before any rank starts: {}", text(&o));
    let o = comm_bench(&["--num_ranks", "2", "--tune_norm_only"]);
    assert!(!o.status.success() && text(&o).contains("--tune"), "{}", text(&o));
    // --tune_residency: only the residencies named, each in both modes; a name that is none, refused first.
    let o = tune(&["--tune_hidden", "512", "--tune_residency", "caller"]).unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let set: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&table).unwrap()).unwrap();
    let modes: Vec<&str> = set.iter().map(|t| t["key"]["mode"].as_str().unwrap()).collect();
    assert!(set.iter().all(|t| t["key"]["residency"] == "caller") && modes == ["eager", "graph"], "{set:?}");
    assert!(!text(&o).contains(" registered "), "{}", text(&o));
    let o = tune(&["--tune_hidden", "512", "--tune_residency", "caller,shared"]).unwrap();
    assert!(
        !o.status.success() && text(&o).contains("residency \"shared\": expected one of caller, registered"),
        "{}",
        text(&o)
    );
    assert!(!text(&o).contains("[rank"), "refused before any rank starts: {}", text(&o));
}

/// The tables in a tune cache directory, by file name.
fn cached_tables(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.ends_with(".json")).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// A tune keeps every table it finished: with `--max_seconds` of a nanosecond (which any table outlasts), the first
/// (eager, caller buffers) is measured, written and cached and no other, and the last line names the rest; a tune
/// ended by a signal part-way leaves the tables it had finished in the cache, each whole.
#[test]
fn a_tune_keeps_the_tables_it_finished() {
    let dir = tempfile::tempdir().unwrap();
    let (table, cache) = (dir.path().join("tune.json"), dir.path().join("cache"));
    let tune = |extra: &[&str]| {
        let mut c = Command::new(BIN);
        c.args(QUICK)
            .args(["--num_ranks", "2", "--tune_hidden", "0", "--tune", table.to_str().unwrap()])
            .args(extra)
            .env("ALLREDUCE_TUNE_DIR", &cache);
        c
    };
    let o =
        tune(&["--counts", "1024", "--tune_residency", "registered,caller", "--max_seconds", "1e-9"]).output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let set: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&table).unwrap()).unwrap();
    let keys: Vec<(&str, &str)> =
        set.iter().map(|t| (t["key"]["mode"].as_str().unwrap(), t["key"]["residency"].as_str().unwrap())).collect();
    assert_eq!(keys, [("eager", "caller")], "{t}");
    assert!(
        t.contains("# Not run: the tables of eager registered, graph caller, graph registered: --max_seconds"),
        "{t}"
    );
    let measured_past = |l: &str| l.contains(" plain ") && (l.contains(" graph ") || l.contains(" registered "));
    assert!(!t.lines().any(measured_past), "{t}");
    let cached = cached_tables(&cache);
    assert!(cached.len() == 1 && cached[0].ends_with("-eager-caller.json"), "{cached:?}");
    std::fs::remove_dir_all(&cache).unwrap();
    // Ended by SIGTERM once the first table is cached: that one stays, whole, and the last is never reached.
    let mut child = tune(&["--counts", "1024,4096,16384,65536,262144"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while cached_tables(&cache).is_empty() {
        assert!(child.try_wait().unwrap().is_none(), "the tune ended before any table was cached");
        assert!(start.elapsed() < std::time::Duration::from_secs(120), "no table cached within 2 minutes");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(!o.status.success() && text(&o).contains("SIGTERM"), "{}", text(&o));
    let cached = cached_tables(&cache);
    assert!(!cached.is_empty() && cached.len() < 6, "{cached:?}");
    assert!(cached.iter().all(|n| !n.contains("graph-caller_registered")), "{cached:?}");
    for name in &cached {
        let t: Value = serde_json::from_str(&std::fs::read_to_string(cache.join(name)).unwrap()).unwrap();
        assert!(t["key"]["world"] == 2 && t["entries"].as_array().is_some_and(|e| !e.is_empty()), "{name}: {t}");
    }
}

#[test]
fn launch_sets_master_addr_and_port() {
    let o = Command::new(BIN)
        .args(["launch", "-n", "2", "--", "sh", "-c", "echo \"at $MASTER_ADDR:$MASTER_PORT\""])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let ports: Vec<&str> = t.lines().filter_map(|l| l.split("at 127.0.0.1:").nth(1)).collect();
    assert_eq!(ports.len(), 2, "{t}");
    assert!(ports[0] == ports[1] && ports[0].parse::<u16>().is_ok_and(|p| p > 0), "{t}");
}

const REFERENCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/mi300x-8rank-comm-bench.csv");

#[test]
fn compare_overlays_a_comm_bench_py_csv_and_our_json_with_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = comm_bench(&[
        "--num_ranks",
        "2",
        "--counts",
        "1024,2816",
        "--methods",
        "car_1shot,auto",
        "--export_csv",
        "--output_dir",
        d,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let stem = dir.path().join("cmp");
    let json = dir.path().join("comm_ops_benchmark.json");
    let o = Command::new(BIN)
        .args(["compare", REFERENCE, json.to_str().unwrap(), "--output", stem.to_str().unwrap()])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("# car_1shot") && !t.contains("# auto"), "only methods in both runs: {t}");
    // comm_bench.py's 3072 (HIP, multiple of 512) against our 2816 (multiple of 256).
    assert!(t.contains("nearest element count") && t.contains("3072 -> 2816"), "{t}");
    let row: Vec<&str> = t.lines().find(|l| l.trim_start().starts_with("1024 ")).unwrap().split_whitespace().collect();
    // The ratio must be the quotient of the two times, as far as their printed digits tell it: each printed value
    // lies within half a unit of its last digit of the true one.
    let around = |s: &str| {
        let half = 0.5 * 10f64.powi(-(s.split('.').nth(1).map_or(0, str::len) as i32));
        let v: f64 = s.parse().unwrap();
        (v - half, v + half)
    };
    let ((ref_lo, ref_hi), (ours_lo, ours_hi), (ratio_lo, ratio_hi)) = (around(row[2]), around(row[3]), around(row[4]));
    assert!(
        ours_lo / ref_hi <= ratio_hi && ratio_lo <= ours_hi / ref_lo,
        "the ratio is not our time over theirs: {row:?}"
    );
    let svg = std::fs::read_to_string(stem.with_extension("svg")).unwrap();
    assert!(svg.contains("mi300x-8rank-comm-bench: car_1shot") && svg.contains("comm_ops_benchmark: auto"));
    // `plot` reads the CSV too; a file that is neither format is refused by its name and line.
    let o = Command::new(BIN).args(["plot", REFERENCE, "--output", stem.to_str().unwrap()]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "size;time\n").unwrap();
    let o = Command::new(BIN).args(["plot", bad.to_str().unwrap()]).output().unwrap();
    assert!(!o.status.success() && text(&o).contains("bad.csv: line 1: expected comm_bench.py's CSV"), "{}", text(&o));
}

#[test]
fn norm_checks_every_method_and_names_what_ran() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out");
    let o = Command::new(BIN)
        .args(["norm", "--backend", "host", "--num_ranks", "2", "--hidden", "8192", "--tokens", "1,16"])
        .args(["-n", "2", "-w", "0", "--repeats", "1", "--output_dir", json.to_str().unwrap()])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let row = |tokens: &str, method: &str| {
        let cells = |l: &str| l.trim_start_matches("[rank 0]").split_whitespace().next() == Some(tokens);
        t.lines().find(|l| cells(l) && l.contains(method)).map(str::to_string)
    };
    // One row of 16 KiB fits the fused packets; 16 rows (256 KiB) do not, and car's fused one-shot stands in.
    let one = row("1", "fused_ll").unwrap_or_else(|| panic!("{t}"));
    assert!(!one.contains('('), "{one}");
    assert!(row("16", "fused_ll (car_1shot)").is_some(), "{t}");
    assert!(row("16", "unfused (").is_some() && row("16", "auto (").is_some(), "{t}");
    // The default methods: every fused design, each checked once and over consecutive calls, at both sizes.
    let fused =
        ["fused_1shot", "fused_2shot", "fused_zc_1shot", "fused_zc_2shot", "fused_zc_2shot_push", "fused_zc_2shot_ll"];
    for method in fused {
        assert!(row("1", method).is_some() && row("16", method).is_some(), "{method}: {t}");
    }
    assert!(row("1", "fused_epoch_1shot").is_some() && row("16", "fused_epoch_1shot").is_some(), "{t}");
    // auto against the fastest other method, per token count and in all.
    assert_eq!(t.lines().filter(|l| l.contains("auto / the fastest other method (")).count(), 2, "{t}");
    assert!(t.contains("# auto: ") && t.contains(" of 2 token counts above 1.05x the fastest other method"), "{t}");
    // --output_dir: a row per method and token count, as comm_ops_benchmark.json's rows, what ran named.
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json.join("norm_benchmark.json")).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!((report["hidden"].as_u64(), report["world"].as_u64(), rows.len()), (Some(8192), Some(2), 2 * 10));
    let fell_back = rows.iter().find(|r| r["method"] == "fused_ll" && r["tokens"] == 16).unwrap();
    assert_eq!((fell_back["ran"].as_str(), fell_back["count"].as_u64()), (Some("car_1shot"), Some(16 * 8192)));
    assert!(rows.iter().all(|r| r["status"] == "passed" && r["time_ms"].as_f64().is_some_and(|t| t > 0.0)), "{rows:?}");
}

/// `norm --max_seconds` of a nanosecond: set-up alone outlasts it, so the first token count runs and the rest do not,
/// on every rank alike (the run passes); the output and the JSON name them.
#[test]
fn norm_max_seconds_ends_after_the_first_token_count() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(BIN)
        .args(["norm", "--backend", "host", "--num_ranks", "3", "--hidden", "256", "--tokens", "1,8,32"])
        .args(["-n", "2", "-w", "0", "--repeats", "1", "--methods", "unfused,auto", "--max_seconds", "1e-9"])
        .args(["--output_dir", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("# Not run: tokens [8, 32]: --max_seconds was reached first"), "{t}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("norm_benchmark.json")).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert!(rows.len() == 2 && rows.iter().all(|r| r["tokens"] == 1 && r["status"] == "passed"), "{rows:?}");
    assert_eq!(report["not_run"], serde_json::json!([8, 32]));
}

/// `unfused:ALGO` runs the unfused sequence on the allreduce named, checked as every method is; a name that is no
/// allreduce is refused.
#[test]
fn norm_unfused_on_a_named_allreduce() {
    let o = Command::new(BIN)
        .args(["norm", "--backend", "host", "--num_ranks", "2", "--hidden", "1024", "--tokens", "1,8"])
        .args(["-n", "2", "-w", "0", "--repeats", "1", "--bursts", "2", "--skew_us", "2000"])
        .args(["--methods", "unfused,unfused:car_1shot,unfused:symm_ll"])
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for tokens in ["1", "8"] {
        for method in ["unfused:car_1shot", "unfused:symm_ll"] {
            let named = |l: &&str| {
                let mut cells = l.trim_start_matches("[rank 0]").split_whitespace();
                cells.next() == Some(tokens) && cells.nth(1) == Some(method)
            };
            assert!(t.lines().any(|l| named(&l)), "{tokens} x {method}: {t}");
        }
    }
    let o = Command::new(BIN).args(["norm", "--num_ranks", "2", "--methods", "unfused:car_rs"]).output().unwrap();
    assert!(!o.status.success() && text(&o).contains("unfused:ALGO with ALGO an allreduce"), "{}", text(&o));
}
