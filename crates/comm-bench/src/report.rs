//! What a sweep produced, and its three renderings: the terminal table (nccl-tests style), comm_bench.py's CSV
//! (same columns, same bandwidth formula) and a JSON file with everything.

use crate::ceilings::{Ceilings, CopyFloor};
use crate::config::{Report, SweepConfig};
use collective_core::Op;
use methods::{csv_column, csv_columns};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "status", content = "reason", rename_all = "lowercase")]
pub enum Status {
    Passed,
    Failed(String),
    Skipped(String),
}

/// One method at one size.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    pub method: String,
    pub op: String,
    pub dtype: String,
    /// Elements of the input (comm_bench.py's N).
    pub count: usize,
    pub bytes: usize,
    #[serde(flatten)]
    pub status: Status,
    /// Median over repeats of the ranks' times per call combined as `--report` says (the slowest rank's unless
    /// told otherwise: the outcome's `report`).
    pub time_ms: Option<f64>,
    /// Every repeat's slowest-rank time per call.
    pub repeats_ms: Vec<f64>,
    /// Every repeat's time per call of every rank (rank order), so any `--report` can be derived later.
    #[serde(default)]
    pub ranks_ms: Vec<Vec<f64>>,
    /// Rank 0's first measurement: what comm_bench.py itself would have reported.
    pub rank0_ms: Option<f64>,
    /// Median over repeats of the slowest rank's host time per call spent issuing the timed calls (a graph replay
    /// issues `num_iters` calls at once).
    #[serde(default)]
    pub issue_us: Option<f64>,
    /// comm_bench.py's `bwidth`: input bytes / time.
    pub algbw_gbs: Option<f64>,
    /// nccl-tests' bus bandwidth: algbw x [`bus_factor`].
    pub busbw_gbs: Option<f64>,
    /// The design a method that picks one per call (`auto`) ran in the timed calls, by its table name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran: Option<String>,
    #[serde(skip)]
    bus_factor: f64,
}

/// nccl-tests' bus bandwidth per unit of algbw (input bytes / time) on `world` ranks: 2(W-1)/W for allreduce,
/// (W-1)/W for reduce-scatter, and for all-gather W - 1, which is nccl-tests' (W-1)/W of a bandwidth that counts
/// the W inputs gathered.
pub fn bus_factor(op: Op, world: usize) -> f64 {
    let w = world as f64;
    match op {
        Op::AllReduce => 2.0 * (w - 1.0) / w,
        Op::ReduceScatter => (w - 1.0) / w,
        Op::AllGather => w - 1.0,
    }
}

impl Row {
    pub fn new(method: &str, cfg: &SweepConfig, count: usize, world: usize, status: Status) -> Row {
        Row {
            method: method.into(),
            op: cfg.op.name().into(),
            dtype: cfg.dtype.name().into(),
            count,
            bytes: count * cfg.dtype.size(),
            status,
            time_ms: None,
            repeats_ms: Vec::new(),
            ranks_ms: Vec::new(),
            rank0_ms: None,
            issue_us: None,
            algbw_gbs: None,
            busbw_gbs: None,
            ran: None,
            bus_factor: bus_factor(cfg.op, world),
        }
    }

    /// Adds the timings: per repeat the ranks' times combined as `report` says, then the median over repeats.
    pub fn timed(mut self, timing: measure::timing::Timing, report: Report) -> Row {
        let median = report.figure_ms(&timing);
        self.issue_us = Some(timing.median_issue_ms() * 1e3);
        let (mut repeats, rank0) = (timing.repeats_ms, timing.rank0_ms);
        self.ranks_ms = timing.ranks_ms;
        let algbw = self.bytes as f64 / (median * 1e-3) / 1e9;
        self.time_ms = Some(median);
        self.rank0_ms = Some(rank0);
        self.algbw_gbs = Some(algbw);
        self.busbw_gbs = Some(algbw * self.bus_factor);
        self.repeats_ms = std::mem::take(&mut repeats);
        self
    }

    pub fn print(&self) {
        let fmt = |v: Option<f64>, scale: f64| v.map_or("-".to_string(), |x| format!("{:.2}", x * scale));
        let (wrong, status) = match &self.status {
            Status::Passed => ("0".to_string(), "ok".to_string()),
            Status::Failed(r) => ("FAIL".to_string(), format!("FAILED: {r}")),
            Status::Skipped(r) => ("-".to_string(), format!("skipped: {r}")),
        };
        println!(
            "  {:>12} {:>10} {:>5} {:>18} {:>11} {:>11} {:>11} {:>7}  {status}",
            self.bytes,
            self.count,
            self.dtype,
            self.method,
            fmt(self.time_ms, 1e3),
            fmt(self.algbw_gbs, 1.0),
            fmt(self.busbw_gbs, 1.0),
            wrong
        );
    }
}

/// The table's column heads, matching [`Row::print`].
pub fn print_header() {
    println!(
        "# {:>12} {:>10} {:>5} {:>18} {:>11} {:>11} {:>11} {:>7}  status",
        "size(B)", "count", "type", "method", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"
    );
}

/// A method the sweep left out, and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Unavailable {
    pub method: String,
    pub reason: String,
}

/// What a run knows of itself besides its rows, for [`Outcome::new`].
pub struct RunNotes {
    pub tune_table: String,
    pub ceilings: Ceilings,
    pub unavailable: Vec<Unavailable>,
    pub provenance: Provenance,
    /// The sizes `--max_seconds` left out.
    pub not_run: Vec<usize>,
    pub copy_floor: Vec<CopyFloor>,
}

/// Where and with what a run was made.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Provenance {
    pub host: String,
    /// comm-bench's version and the git commit it was built from (`unknown` outside git).
    pub tool: String,
    /// NCCL's or RCCL's version, where a method loaded it.
    pub library: Option<String>,
}

/// The whole sweep, as rank 0 reports it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Outcome {
    pub driver: String,
    pub device: String,
    pub arch: String,
    pub world: usize,
    pub op: String,
    pub dtype: String,
    pub graph: bool,
    pub num_iters: u64,
    pub num_warmup_iters: u64,
    pub repeats: u64,
    /// car's memory type (`--car_memory`).
    #[serde(default)]
    pub car_memory: String,
    /// Where the table `auto` followed came from.
    #[serde(default)]
    pub tune_table: String,
    /// How each measurement's figure combines the ranks' times (`--report`).
    #[serde(default)]
    pub report: Report,
    /// Methods that cannot run here at all (driver, world size, dtype or mode), with the reason: they have no rows.
    #[serde(default)]
    pub unavailable: Vec<Unavailable>,
    /// Where and with what it ran: host name, comm-bench's version and commit, the collective library's version.
    #[serde(default)]
    pub provenance: Provenance,
    /// Element counts of the sweep that did not run: `--max_seconds` was reached before them.
    #[serde(default)]
    pub not_run: Vec<usize>,
    /// Per size of a sweep with `auto`, the copy floor of its caller-buffer bound (`auto+reg` plus this).
    #[serde(default)]
    pub copy_floor: Vec<CopyFloor>,
    /// Seconds since the Unix epoch when the sweep ended.
    pub unix_time: u64,
    pub ceilings: Ceilings,
    pub rows: Vec<Row>,
}

impl Outcome {
    pub fn new(info: &gpu::DeviceInfo, world: usize, cfg: &SweepConfig, run: RunNotes, rows: Vec<Row>) -> Outcome {
        Outcome {
            driver: info.kind.to_string(),
            device: info.name.clone(),
            arch: info.arch.clone(),
            world,
            op: cfg.op.name().into(),
            dtype: cfg.dtype.name().into(),
            graph: cfg.timing.graph,
            num_iters: cfg.timing.iters,
            num_warmup_iters: cfg.timing.warmup,
            repeats: cfg.timing.repeats,
            car_memory: if cfg.car_uncached { "uncached" } else { "coarse" }.into(),
            tune_table: run.tune_table,
            report: cfg.report,
            unavailable: run.unavailable,
            provenance: run.provenance,
            not_run: run.not_run,
            copy_floor: run.copy_floor,
            unix_time: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            ceilings: run.ceilings,
            rows,
        }
    }

    /// comm_bench.py's CSV: `N` then `<label>_time` (ms) and `<label>_bwidth` (GB/s) per label; a method that
    /// did not run or failed leaves its cells empty (the JSON says why).
    pub fn csv(&self, op: Op) -> String {
        let labels = csv_columns(op);
        let mut out = String::from("N");
        for l in &labels {
            write!(out, ",{l}_time,{l}_bwidth").expect("write to String");
        }
        out.push('\n');
        let mut counts: Vec<usize> = self.rows.iter().map(|r| r.count).collect();
        counts.dedup();
        for n in counts {
            write!(out, "{n}").expect("write to String");
            for l in &labels {
                let row = self.rows.iter().find(|r| r.count == n && csv_column(&r.method) == Some(l));
                match row.filter(|r| r.status == Status::Passed).and_then(|r| r.time_ms.zip(r.algbw_gbs)) {
                    Some((t, bw)) => write!(out, ",{t},{bw}").expect("write to String"),
                    None => out.push_str(",,"),
                }
            }
            out.push('\n');
        }
        out
    }

    /// Writes `comm_ops_benchmark.csv` and `comm_ops_benchmark.json` into `dir`; an error names the file.
    pub fn export(&self, dir: &Path, op: Op) -> Result<(PathBuf, PathBuf), String> {
        let csv = dir.join("comm_ops_benchmark.csv");
        let json = dir.join("comm_ops_benchmark.json");
        let text = serde_json::to_string_pretty(self).map_err(|e| format!("{}: {e}", json.display()))?;
        crate::paths::write(&csv, self.csv(op))?;
        crate::paths::write(&json, text)?;
        Ok((csv, json))
    }
}

/// A tune table as a person reads it: one line per size range, `lo .. hi` bytes and its algorithm.
pub fn tune_table_text(table: &allreduce::TuneTable) -> String {
    let mut out = format!("#   {:>27}  algorithm\n", "message size (bytes)");
    let mut lo = 1;
    for e in &table.entries {
        let range = match e.max_bytes {
            Some(hi) => format!("{lo} .. {hi}"),
            None => format!("{lo} and above"),
        };
        writeln!(out, "#   {range:>27}  {}", e.method).expect("write to String");
        lo = e.max_bytes.map_or(lo, |hi| hi + 1);
    }
    out
}

/// Outcomes built by hand, for the renderings' tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::{Outcome, Row, RunNotes, Status};
    use crate::cli::Cli;
    use crate::config::Report;
    use clap::Parser;

    /// A sweep of comm-bench's default flags on the host driver, `world` ranks, of `(method, count, status, ms)`
    /// rows, every rank at that time (`None`: not timed).
    pub fn outcome(world: usize, rows: &[(&str, usize, Status, Option<f64>)]) -> Outcome {
        let cfg = Cli::try_parse_from(["comm-bench"]).unwrap().bench.config();
        let info = gpu::DeviceInfo {
            kind: gpu::DriverKind::Host,
            name: "test host".into(),
            ordinal: 0,
            count: 1,
            arch: "host".into(),
            multiprocessors: 2,
            size_align: 256,
            bus_id: "host".into(),
            driver_version: "host".into(),
        };
        let rows = rows
            .iter()
            .map(|(method, count, status, ms)| {
                let row = Row::new(method, &cfg, *count, world, status.clone());
                match *ms {
                    Some(ms) => {
                        let t = measure::timing::Timing {
                            repeats_ms: vec![ms],
                            rank0_ms: ms,
                            issue_ms: vec![ms],
                            ranks_ms: vec![vec![ms; world]],
                        };
                        row.timed(t, Report::Max)
                    }
                    None => row,
                }
            })
            .collect();
        let ceilings = crate::ceilings::Ceilings {
            copy_bytes: 1 << 20,
            copy_gbs: 10.0,
            empty_launch_us: 1.0,
            empty_graph_replay_us: 1.0,
            empty_all_ranks_us: 1.0,
            barrier_us: None,
        };
        let notes = RunNotes {
            tune_table: "test".into(),
            ceilings,
            unavailable: Vec::new(),
            provenance: Default::default(),
            not_run: Vec::new(),
            copy_floor: Vec::new(),
        };
        Outcome::new(&info, world, &cfg, notes, rows)
    }
}
