//! `cargo xtask perf-gate`: a short run of the criterion benches (`ARX_BENCH_QUICK=1`) compared with
//! `perf/baseline-DRIVER-MACHINE.json`. Raw times depend on the machine, so the gate compares each method's time
//! divided by a plain device copy of the same bytes timed by the same ranks in the same run; a method whose
//! ratio grew by more than the threshold fails the gate. Even those ratios do not carry between processor models
//! (on the host driver, an AMD EPYC's were half an Intel Xeon's at 1024 elements and 2.5 times them at 1M), so
//! each machine (CPU model for the host driver, device name for GPUs) has its own baseline, and a machine without
//! one is measured and reported, not judged.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Largest allowed slowdown against the baseline, as a fraction (0.25: 25% slower relative to the copy).
    #[arg(long, default_value_t = 0.25, value_parser = parse_threshold)]
    threshold: f64,
    /// Write this run's ratios to perf/baseline-DRIVER-MACHINE.json instead of comparing.
    #[arg(long)]
    update_baseline: bool,
    /// Judge this summary (a previous run's ARX_BENCH_SUMMARY file) instead of running the benches.
    #[arg(long)]
    summary: Option<PathBuf>,
    /// Re-measurements of the methods over the threshold (with the copy), each folded into the best so far,
    /// before a slowdown counts as a regression.
    #[arg(long, default_value_t = 4)]
    retries: usize,
}

/// Runs `--update-baseline` takes the best of, as the gate may when it retries.
const BASELINE_RUNS: usize = 3;

fn parse_threshold(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive fraction (0.25 means 25%)")),
    }
}

/// What the bench binary writes to `$ARX_BENCH_SUMMARY` (allreduce_benches::Summary).
#[derive(Deserialize)]
struct Summary {
    driver: String,
    device: String,
    arch: String,
    world: usize,
    dtype: String,
    entries: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    method: String,
    count: usize,
    median_ns: f64,
}

/// The reference every time is divided by (allreduce_benches::COPY).
const COPY: &str = "copy";

/// One method at one size, relative to the copy.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Ratio {
    method: String,
    count: usize,
    /// Method time / copy time.
    ratio: f64,
    time_ns: f64,
    copy_ns: f64,
}

#[derive(Serialize, Deserialize)]
struct Machine {
    device: String,
    arch: String,
    cpu: String,
    /// The CPU's family and model numbers (`f6-m207`): virtual machines often report one generic model name for
    /// different processor generations, whose ratios differ.
    #[serde(default)]
    cpu_id: String,
    cores: usize,
    os: String,
}

/// `perf/baseline-DRIVER-MACHINE.json`.
#[derive(Serialize, Deserialize)]
struct Baseline {
    driver: String,
    world: usize,
    dtype: String,
    /// UTC, when `--update-baseline` wrote it.
    created: String,
    /// Where it was measured; ratios travel between machines far better than times, but not perfectly.
    machine: Machine,
    ratios: Vec<Ratio>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Ok,
    Regressed,
    /// In the baseline but not measured now: the method broke, failed its check or was not built.
    Missing,
    /// Measured now but not in the baseline: reported, never fails.
    New,
}

#[derive(Debug)]
struct Line {
    method: String,
    count: usize,
    baseline: Option<f64>,
    current: Option<f64>,
    verdict: Verdict,
}

impl Line {
    /// ratio / baseline ratio - 1: positive is slower.
    fn change(&self) -> Option<f64> {
        Some(self.current? / self.baseline? - 1.0)
    }
}

/// Method time / copy time per (method, size); every size needs its copy.
fn ratios(summary: &Summary) -> Result<Vec<Ratio>, String> {
    let copy = |count| summary.entries.iter().find(|e| e.method == COPY && e.count == count);
    summary
        .entries
        .iter()
        .filter(|e| e.method != COPY)
        .map(|e| {
            let c =
                copy(e.count).ok_or_else(|| format!("the summary has no {COPY} reference at {} elements", e.count))?;
            if !(c.median_ns > 0.0 && e.median_ns > 0.0) {
                return Err(format!("{} at {} elements: non-positive time", e.method, e.count));
            }
            Ok(Ratio {
                method: e.method.clone(),
                count: e.count,
                ratio: e.median_ns / c.median_ns,
                time_ns: e.median_ns,
                copy_ns: c.median_ns,
            })
        })
        .collect()
}

/// Baseline entries in order, then the new ones.
fn compare(baseline: &[Ratio], current: &[Ratio], threshold: f64) -> Vec<Line> {
    let find =
        |set: &[Ratio], r: &Ratio| set.iter().find(|x| x.method == r.method && x.count == r.count).map(|x| x.ratio);
    let mut lines: Vec<Line> = baseline
        .iter()
        .map(|b| {
            let current = find(current, b);
            let verdict = match current {
                None => Verdict::Missing,
                Some(now) if now / b.ratio - 1.0 > threshold => Verdict::Regressed,
                Some(_) => Verdict::Ok,
            };
            Line { method: b.method.clone(), count: b.count, baseline: Some(b.ratio), current, verdict }
        })
        .collect();
    lines.extend(current.iter().filter(|c| find(baseline, c).is_none()).map(|c| Line {
        method: c.method.clone(),
        count: c.count,
        baseline: None,
        current: Some(c.ratio),
        verdict: Verdict::New,
    }));
    lines
}

fn failures(lines: &[Line]) -> usize {
    lines.iter().filter(|l| matches!(l.verdict, Verdict::Regressed | Verdict::Missing)).count()
}

fn table(lines: &[Line], threshold: f64) -> String {
    let num = |v: Option<f64>| v.map_or("-".into(), |x| format!("{x:.2}"));
    let mut out = format!(
        "{:<12} {:>10} {:>14} {:>10} {:>9}  verdict (fails above +{:.0}%)\n",
        "method",
        "elements",
        "baseline ratio",
        "ratio",
        "change",
        threshold * 100.0
    );
    for l in lines {
        let change = l.change().map_or("-".into(), |c| format!("{:+.1}%", c * 100.0));
        let verdict = match l.verdict {
            Verdict::Ok => "ok",
            Verdict::Regressed => "REGRESSED",
            Verdict::Missing => "MISSING (not measured)",
            Verdict::New => "new (not in baseline)",
        };
        out += &format!(
            "{:<12} {:>10} {:>14} {:>10} {:>9}  {verdict}\n",
            l.method,
            l.count,
            num(l.baseline),
            num(l.current),
            change
        );
    }
    out
}

/// UTC as `YYYY-MM-DDTHH:MM:SSZ` (Hinnant's civil-from-days), so xtask needs no date crate.
fn utc(secs: u64) -> String {
    let z = (secs / 86_400) as i64 + 719_468;
    let (era, doe) = (z.div_euclid(146_097), z.rem_euclid(146_097));
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + (month <= 2) as i64;
    let s = secs % 86_400;
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", s / 3600, s / 60 % 60, s % 60)
}

fn machine(summary: &Summary) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo.lines().find_map(|l| l.strip_prefix(name)).and_then(|l| l.split(':').nth(1)).map(str::trim)
    };
    let cpu = field("model name");
    let cpu_id = match (field("cpu family"), field("model\t")) {
        (Some(f), Some(m)) => format!("f{f}-m{m}"),
        _ => String::new(),
    };
    Machine {
        device: summary.device.clone(),
        arch: summary.arch.clone(),
        cpu: cpu.map_or("unknown".into(), |c| c.to_string()),
        cpu_id,
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        os: format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
    }
}

/// `AMD EPYC f26-m2, 2 cores`: what the gate prints of a machine.
fn describe(m: &Machine) -> String {
    let id = if m.cpu_id.is_empty() { String::new() } else { format!(" {}", m.cpu_id) };
    format!("{}{id}, {} cores", m.cpu, m.cores)
}

/// The machine part of a baseline's file name: the CPU model for the host driver (where the CPU is the device), with
/// its family and model numbers when `with_id`, the device name otherwise, in lower case with every run of other
/// characters one `-`.
fn machine_slug(m: &Machine, driver: &str, with_id: bool) -> String {
    let name = match driver {
        "host" if with_id && !m.cpu_id.is_empty() => format!("{} {}", m.cpu, m.cpu_id),
        "host" => m.cpu.clone(),
        _ => m.device.clone(),
    };
    let mut slug = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let slug = slug.trim_end_matches('-');
    if slug.is_empty() {
        "unknown".into()
    } else {
        slug.into()
    }
}

/// Where cargo builds: `$CARGO_TARGET_DIR` (relative to where we were started, as cargo reads it) or target/.
fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => std::path::absolute(&d).unwrap_or_else(|_| PathBuf::from(d)),
        None => root.join("target"),
    }
}

/// Runs the quick benches once (only `methods` and the copy when given) and reads their summary.
fn measure(root: &Path, methods: Option<&[String]>) -> Result<Summary, String> {
    let path = target_dir(root).join("perf-gate/summary.json");
    // A stale summary must not pass for this run's.
    let _ = std::fs::remove_file(&path);
    let mut cargo = crate::cargo();
    cargo.args(["bench", "-p", "allreduce-benches", "--bench", "allreduce"]);
    cargo.env("ARX_BENCH_QUICK", "1").env("ARX_BENCH_SUMMARY", &path);
    if let Some(methods) = methods {
        cargo.env("ARX_BENCH_METHODS", methods.join(","));
    }
    crate::run(&mut cargo)?;
    load(&path)
}

fn load(path: &Path) -> Result<Summary, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("{}: {e} (the bench wrote no summary)", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The best of several runs of the same configuration: per method and size, the lowest ratio, each taken within
/// one run (its time over the same run's copy). Background load only ever slows a run down, so the best is what the
/// code can do; pairing the shortest time of one run with the shortest copy of another would not be: a copy of a few
/// dozen nanoseconds that one run caught fast inflates every ratio of its size.
fn best(runs: &[Summary]) -> Result<Vec<Ratio>, String> {
    let first = runs.first().ok_or("no run to judge")?;
    let mut best: Vec<Ratio> = Vec::new();
    for run in runs {
        if (run.driver.as_str(), run.world) != (first.driver.as_str(), first.world) {
            return Err("the runs disagree on driver or world size".into());
        }
        for r in ratios(run)? {
            match best.iter_mut().find(|b| b.method == r.method && b.count == r.count) {
                Some(b) if r.ratio < b.ratio => *b = r,
                Some(_) => {}
                None => best.push(r),
            }
        }
    }
    Ok(best)
}

/// The baseline files of `driver` in `dir`, by name.
fn known_baselines(dir: &Path, driver: &str) -> Vec<String> {
    let prefix = format!("baseline-{driver}-");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix) && n.ends_with(".json"))
        .collect();
    names.sort();
    if names.is_empty() {
        names.push("none".into());
    }
    names
}

pub fn run(args: &Args) -> Result<(), String> {
    let started = Instant::now();
    let root = &crate::root();
    let mut runs = vec![match &args.summary {
        Some(p) => load(p)?,
        None => measure(root, None)?,
    }];
    let driver = runs[0].driver.clone();
    let here = machine(&runs[0]);
    // This CPU generation's own baseline; else (reading) one recorded before baselines named the generation.
    let path_for =
        |with_id| root.join(format!("perf/baseline-{driver}-{}.json", machine_slug(&here, &driver, with_id)));
    let baseline_path = match path_for(true) {
        p if p.is_file() || args.update_baseline => p,
        _ => path_for(false),
    };
    let shown = baseline_path.strip_prefix(root).unwrap_or(&baseline_path).display().to_string();
    if args.update_baseline {
        while args.summary.is_none() && runs.len() < BASELINE_RUNS {
            runs.push(measure(root, None)?);
        }
        let baseline = Baseline {
            driver: runs[0].driver.clone(),
            world: runs[0].world,
            dtype: runs[0].dtype.clone(),
            created: utc(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())),
            machine: here,
            ratios: best(&runs)?,
        };
        std::fs::create_dir_all(root.join("perf")).map_err(|e| e.to_string())?;
        let json = serde_json::to_string_pretty(&baseline).map_err(|e| e.to_string())? + "\n";
        std::fs::write(&baseline_path, json).map_err(|e| format!("{shown}: {e}"))?;
        print!("{}", table(&compare(&[], &baseline.ratios, args.threshold), args.threshold));
        let secs = started.elapsed().as_secs_f64();
        println!(
            "perf-gate: wrote {shown} ({} ratios, best of {BASELINE_RUNS} runs) in {secs:.0} s",
            baseline.ratios.len()
        );
        return Ok(());
    }
    let text = match std::fs::read_to_string(&baseline_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            print!("{}", table(&compare(&[], &best(&runs)?, args.threshold), args.threshold));
            println!(
                "perf-gate: no baseline for this machine ({shown} does not exist), so nothing was judged: ratios \
                 do not carry between machines. Known: {}. Record one with `cargo xtask perf-gate \
                 --update-baseline` on a quiet machine of this kind and commit it.",
                known_baselines(&root.join("perf"), &driver).join(", ")
            );
            return Ok(());
        }
        Err(e) => return Err(format!("{shown}: {e}")),
    };
    let baseline: Baseline = serde_json::from_str(&text).map_err(|e| format!("{shown}: {e}"))?;
    if (baseline.world, baseline.dtype.as_str()) != (runs[0].world, runs[0].dtype.as_str()) {
        return Err(format!(
            "{shown} was measured with {} ranks on {}, this run had {} ranks on {}: set ARX_BENCH_RANKS={} \
             or update the baseline",
            baseline.world, baseline.dtype, runs[0].world, runs[0].dtype, baseline.world
        ));
    }
    let lines = loop {
        let lines = compare(&baseline.ratios, &best(&runs)?, args.threshold);
        let failed = failures(&lines);
        if failed == 0 || args.summary.is_some() || runs.len() > args.retries {
            break lines;
        }
        let over: Vec<&Line> = lines.iter().filter(|l| l.verdict != Verdict::Ok && l.verdict != Verdict::New).collect();
        let named: Vec<String> = over
            .iter()
            .map(|l| {
                format!(
                    "{} at {} ({})",
                    l.method,
                    l.count,
                    l.change().map_or("missing".into(), |c| format!("{:+.0}%", c * 100.0))
                )
            })
            .collect();
        // Only the suspects are measured again: a retry costs a sixth of a run, so a noisy size gets several.
        let mut suspects: Vec<String> = over.iter().map(|l| l.method.clone()).collect();
        suspects.sort();
        suspects.dedup();
        println!(
            "perf-gate: {failed} over the threshold ({}); measuring {} again, in case load slowed them",
            named.join(", "),
            suspects.join(", ")
        );
        runs.push(measure(root, Some(&suspects))?);
    };
    println!(
        "perf-gate: {driver} driver, {} ranks, best of {} run(s); ratio = time / copy of the same bytes; \
         this machine {}; baseline of {} ({})",
        baseline.world,
        runs.len(),
        describe(&here),
        baseline.created,
        describe(&baseline.machine)
    );
    print!("{}", table(&lines, args.threshold));
    let secs = started.elapsed().as_secs_f64();
    match failures(&lines) {
        0 => {
            println!("perf-gate: passed in {secs:.0} s");
            Ok(())
        }
        n => Err(format!(
            "perf-gate: {n} of {} measurements regressed beyond +{:.0}% or went missing ({secs:.0} s); if the \
             slowdown is intended, rerun with --update-baseline and commit {shown}",
            lines.len(),
            args.threshold * 100.0
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> Summary {
        let e = |method: &str, count, median_ns| Entry { method: method.into(), count, median_ns };
        Summary {
            driver: "host".into(),
            device: "host (2 cores)".into(),
            arch: "host".into(),
            world: 2,
            dtype: "bf16".into(),
            entries: vec![
                e("copy", 1024, 50.0),
                e("car_1shot", 1024, 5000.0),
                e("symm_2shot", 1024, 4000.0),
                e("copy", 65536, 2000.0),
                e("car_1shot", 65536, 100_000.0),
            ],
        }
    }

    fn scaled(r: &[Ratio], by: f64) -> Vec<Ratio> {
        r.iter().map(|x| Ratio { ratio: x.ratio * by, ..x.clone() }).collect()
    }

    #[test]
    fn ratios_divide_by_the_copy_of_the_same_size() {
        let r = ratios(&summary()).unwrap();
        let got: Vec<(&str, usize, f64)> = r.iter().map(|x| (x.method.as_str(), x.count, x.ratio)).collect();
        assert_eq!(got, [("car_1shot", 1024, 100.0), ("symm_2shot", 1024, 80.0), ("car_1shot", 65536, 50.0)]);
        let mut s = summary();
        s.entries.retain(|e| !(e.method == "copy" && e.count == 65536));
        assert!(ratios(&s).unwrap_err().contains("65536"));
    }

    #[test]
    fn a_tightened_baseline_fails_and_a_loose_one_passes() {
        let now = ratios(&summary()).unwrap();
        // The baseline claims everything used to be 30% faster relative to the copy: now 1/0.7 - 1 = 43% slower.
        let tight = compare(&scaled(&now, 0.7), &now, 0.25);
        assert_eq!(failures(&tight), 3);
        assert!(tight.iter().all(|l| l.verdict == Verdict::Regressed));
        assert!((tight[0].change().unwrap() - (1.0 / 0.7 - 1.0)).abs() < 1e-12);
        // A looser threshold lets the same numbers through.
        assert_eq!(failures(&compare(&scaled(&now, 0.7), &now, 0.5)), 0);
        // A baseline slower than now (or equal, or within the threshold) passes.
        assert_eq!(failures(&compare(&scaled(&now, 1.5), &now, 0.25)), 0);
        assert_eq!(failures(&compare(&now, &now, 0.25)), 0);
        assert_eq!(failures(&compare(&scaled(&now, 0.9), &now, 0.25)), 0);
        assert!(table(&tight, 0.25).contains("REGRESSED"));
    }

    #[test]
    fn missing_measurements_fail_and_new_ones_do_not() {
        let now = ratios(&summary()).unwrap();
        let lines = compare(&now, &now[..2], 0.25);
        assert_eq!((failures(&lines), lines[2].verdict), (1, Verdict::Missing));
        let lines = compare(&now[..2], &now, 0.25);
        assert_eq!((failures(&lines), lines[2].verdict), (0, Verdict::New));
    }

    #[test]
    fn best_of_runs_takes_each_lowest_ratio_within_a_run() {
        // A second run that caught the 1024-element copy fast (all its ratios there doubled), one method faster, and
        // a method the first run did not measure.
        let mut other = summary();
        other.entries.iter_mut().filter(|e| e.method == "copy" && e.count == 1024).for_each(|e| e.median_ns /= 2.0);
        other
            .entries
            .iter_mut()
            .filter(|e| e.method == "car_1shot" && e.count == 65536)
            .for_each(|e| e.median_ns /= 4.0);
        other.entries.push(Entry { method: "car_2shot".into(), count: 1024, median_ns: 3000.0 });
        let b = best(&[summary(), other]).unwrap();
        let got: Vec<(&str, usize, f64)> = b.iter().map(|x| (x.method.as_str(), x.count, x.ratio)).collect();
        assert_eq!(
            got,
            [
                ("car_1shot", 1024, 100.0),
                ("symm_2shot", 1024, 80.0),
                ("car_1shot", 65536, 12.5),
                ("car_2shot", 1024, 120.0)
            ]
        );
        assert!(best(&[]).is_err());
    }

    #[test]
    fn baselines_are_per_machine() {
        let m = |cpu: &str, device: &str| Machine {
            device: device.into(),
            arch: "x".into(),
            cpu: cpu.into(),
            cpu_id: "f6-m207".into(),
            cores: 2,
            os: "linux".into(),
        };
        let intel = m("Intel(R) Xeon(R) Processor", "host (2 cores)");
        assert_eq!(machine_slug(&intel, "host", false), "intel-r-xeon-r-processor");
        assert_eq!(machine_slug(&intel, "host", true), "intel-r-xeon-r-processor-f6-m207");
        assert_eq!(machine_slug(&m("AMD EPYC", "host (2 cores)"), "host", false), "amd-epyc");
        assert_eq!(machine_slug(&m("AMD EPYC", "NVIDIA H200"), "cuda", true), "nvidia-h200");
        assert_eq!(machine_slug(&m("", ""), "host", false), "unknown");
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(known_baselines(dir.path(), "host"), ["none"]);
        for f in ["baseline-host-b.json", "baseline-host-a.json", "baseline-cuda-x.json", "notes.txt"] {
            std::fs::write(dir.path().join(f), "{}").unwrap();
        }
        assert_eq!(known_baselines(dir.path(), "host"), ["baseline-host-a.json", "baseline-host-b.json"]);
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn thresholds_must_be_positive() {
        assert_eq!(parse_threshold("0.4"), Ok(0.4));
        assert!(parse_threshold("0").is_err() && parse_threshold("x").is_err() && parse_threshold("-1").is_err());
    }
}
