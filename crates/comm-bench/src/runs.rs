//! A measured run as the plots and `comm-bench compare` read it, from any of the files a user has: our
//! comm_ops_benchmark.json, our comm_ops_benchmark.csv, or FBGEMM's comm_bench.py CSV (the same columns: `N`, then
//! `<method>_time` in ms and `<method>_bwidth` in GB/s per method).

use crate::config::Report;
use crate::report::{bus_factor, Outcome, Status};
use collective_core::Op;
use std::path::Path;

/// One method at one size.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub method: String,
    pub count: usize,
    pub bytes: usize,
    pub time_us: f64,
    pub busbw_gbs: f64,
}

/// A run's passed measurements and what is known of where they came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// The file's name, to tell runs apart.
    pub label: String,
    /// e.g. `allreduce bf16, 8 ranks, hip driver (MI300X), graph`.
    pub title: String,
    pub world: usize,
    /// How the ranks' times were combined: `rank0` for comm_bench.py, whose figure is rank 0's own.
    pub report: String,
    pub points: Vec<Point>,
}

/// comm_bench.py's element size: it times bf16.
const CSV_ELEM: usize = 2;

impl Run {
    /// A run of ours; with `report`, each figure is recombined from every rank's times where the JSON has them.
    pub fn from_outcome(o: &Outcome, label: &str, report: Option<Report>) -> Result<Run, String> {
        let factor = bus_factor(o.op.parse::<Op>()?, o.world);
        let points = o
            .rows
            .iter()
            .filter(|r| r.status == Status::Passed)
            .filter_map(|r| {
                let ms = match report.filter(|_| !r.ranks_ms.is_empty()) {
                    Some(rep) => {
                        let per_repeat: Vec<f64> = r.ranks_ms.iter().map(|ranks| rep.combine(ranks)).collect();
                        measure::timing::median(&per_repeat)
                    }
                    None => r.time_ms?,
                };
                (ms.is_finite() && ms > 0.0).then(|| Point {
                    method: r.method.clone(),
                    count: r.count,
                    bytes: r.bytes,
                    time_us: ms * 1e3,
                    busbw_gbs: r.bytes as f64 / (ms * 1e-3) / 1e9 * factor,
                })
            })
            .collect();
        let mode = if o.graph { "graph" } else { "eager" };
        Ok(Run {
            label: label.into(),
            title: format!("{} {}, {} ranks, {} driver ({}), {mode}", o.op, o.dtype, o.world, o.driver, o.device),
            world: o.world,
            report: report.unwrap_or(o.report).name().into(),
            points,
        })
    }

    /// A comm_bench.py CSV (ours has the same columns) of a run on `world` ranks; column stems are named as our
    /// methods (`fbgemm_1shot` is `car_1shot`), so a CSV and a JSON compare method by method.
    pub fn from_csv(text: &str, label: &str, world: usize) -> Result<Run, String> {
        let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
        let (_, head) = lines.next().ok_or("empty file: expected comm_bench.py's CSV header N,<method>_time,...")?;
        let cols: Vec<&str> = head.split(',').map(str::trim).collect();
        let shape = "expected comm_bench.py's CSV: N, then <method>_time and <method>_bwidth per method";
        if cols.first() != Some(&"N") || cols.len() % 2 != 1 || cols.len() < 3 {
            return Err(format!("line 1: {shape}, found {head:?}"));
        }
        let mut methods = Vec::new();
        for pair in cols[1..].chunks(2) {
            let stem = pair[0].strip_suffix("_time").filter(|s| pair[1].strip_suffix("_bwidth") == Some(*s));
            let stem = stem.ok_or_else(|| format!("line 1: {shape}, found {} and {}", pair[0], pair[1]))?;
            let ours = methods::METHODS.iter().find(|m| m.csv == Some(stem));
            methods.push((ours.map_or(stem, |m| m.name), ours.map_or(Op::AllReduce, |m| m.op)));
        }
        let mut points = Vec::new();
        for (i, line) in lines {
            let cells: Vec<&str> = line.split(',').map(str::trim).collect();
            let bad = |what: &str| format!("line {}: {what}: {line:?}", i + 1);
            if cells.len() != cols.len() {
                return Err(bad(&format!("{} cells where the header has {}", cells.len(), cols.len())));
            }
            let count: usize = cells[0].parse().map_err(|_| bad("N is not a whole number"))?;
            for (k, &(method, op)) in methods.iter().enumerate() {
                // An empty cell: the method did not run at that size.
                if cells[1 + 2 * k].is_empty() {
                    continue;
                }
                let ms: f64 = cells[1 + 2 * k].parse().map_err(|_| bad(&format!("{method}'s time is not a number")))?;
                let bytes = count * CSV_ELEM;
                points.push(Point {
                    method: method.to_string(),
                    count,
                    bytes,
                    time_us: ms * 1e3,
                    busbw_gbs: bytes as f64 / (ms * 1e-3) / 1e9 * bus_factor(op, world),
                });
            }
        }
        Ok(Run {
            label: label.into(),
            title: format!("comm_bench.py CSV, bf16, {world} ranks (from --world)"),
            world,
            report: Report::Rank0.name().into(),
            points,
        })
    }

    /// The passed points of one method, by size.
    pub fn series(&self, method: &str) -> Vec<&Point> {
        let mut s: Vec<&Point> = self.points.iter().filter(|p| p.method == method).collect();
        s.sort_by_key(|p| p.count);
        s
    }

    /// The methods in the order they first appear.
    pub fn methods(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for p in &self.points {
            if !out.contains(&p.method.as_str()) {
                out.push(&p.method);
            }
        }
        out
    }
}

/// Reads a run from a JSON or CSV file, by its content; `world` is the rank count of a CSV (which does not say).
pub fn load(path: &Path, report: Option<Report>, world: usize) -> Result<Run, String> {
    let text = crate::paths::read(path)?;
    let label = path.file_stem().map_or_else(|| path.display().to_string(), |s| s.to_string_lossy().into_owned());
    let named = |e: String| format!("{}: {e}", path.display());
    if text.trim_start().starts_with('{') {
        let outcome: Outcome = serde_json::from_str(&text).map_err(|e| named(e.to_string()))?;
        Run::from_outcome(&outcome, &label, report).map_err(named)
    } else {
        if report.is_some_and(|r| r != Report::Rank0) {
            return Err(named("a comm_bench.py CSV holds rank 0's times only: --report other than rank0".into()));
        }
        Run::from_csv(&text, &label, world).map_err(named)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFERENCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/mi300x-8rank-comm-bench.csv");

    #[test]
    fn reads_the_comm_bench_py_reference_csv() {
        let run = load(Path::new(REFERENCE), None, 8).unwrap();
        assert_eq!(run.methods(), ["car_1shot", "symm_1shot", "car_2shot", "symm_2shot", "nccl"]);
        let first = run.series("car_1shot")[0];
        assert_eq!((first.count, first.bytes), (1024, 2048));
        assert!((first.time_us - 9.477099776268006).abs() < 1e-9);
        // busbw = bytes / time x 2(W-1)/W: 0.216 GB/s algbw x 1.75.
        assert!((first.busbw_gbs - 0.21609986687366958 * 1.75).abs() < 1e-9, "{first:?}");
        assert_eq!(run.report, "rank0");
    }

    #[test]
    fn malformed_csvs_are_refused_by_line() {
        let e = Run::from_csv("size,time\n1,2\n", "x", 8).unwrap_err();
        assert!(e.starts_with("line 1: expected comm_bench.py's CSV"), "{e}");
        let e = Run::from_csv("N,a_time,a_bwidth\n1024,zz,1\n", "x", 8).unwrap_err();
        assert!(e.contains("line 2") && e.contains("a's time"), "{e}");
        let e = Run::from_csv("N,a_time,a_bwidth\n1024,1\n", "x", 8).unwrap_err();
        assert!(e.contains("2 cells where the header has 3"), "{e}");
        let e = load(Path::new(REFERENCE), Some(Report::Max), 8).unwrap_err();
        assert!(e.contains("rank 0's times only"), "{e}");
        let run = Run::from_csv("N,nccl_time,nccl_bwidth\n1024,,\n2048,0.01,0.4\n", "x", 2).unwrap();
        assert_eq!(run.points.len(), 1, "empty cells are sizes the method did not run");
    }
}
