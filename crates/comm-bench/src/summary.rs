//! The closing summary of a sweep: a size x method pivot of times with the fastest method per size, each method's
//! mean bus bandwidth, what failed, and nccl-tests' closing `# Avg bus bandwidth` line.

use crate::report::{Outcome, Row, Status};
use std::fmt::Write as _;

/// The methods in the order they first appear.
fn methods(outcome: &Outcome) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for r in &outcome.rows {
        if !out.contains(&r.method.as_str()) {
            out.push(&r.method);
        }
    }
    out
}

fn passed_time(r: &Row) -> Option<f64> {
    r.time_ms.filter(|_| r.status == Status::Passed)
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// The summary as text, every line starting with `#`.
pub fn render(outcome: &Outcome) -> String {
    let names = methods(outcome);
    let mut counts: Vec<usize> = outcome.rows.iter().map(|r| r.count).collect();
    counts.dedup();
    let width = names.iter().map(|n| n.len()).max().unwrap_or(0).max(9);
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "#\n# Summary: us per call ({} of the ranks' times, median of repeats)", outcome.report.name());
    let _ = write!(w, "# {:>10}", "count");
    names.iter().for_each(|n| {
        let _ = write!(w, " {n:>width$}");
    });
    let _ = writeln!(w, "  fastest");
    for &count in &counts {
        let rows: Vec<&Row> = outcome.rows.iter().filter(|r| r.count == count).collect();
        let _ = write!(w, "# {count:>10}");
        for n in &names {
            let cell = match rows.iter().find(|r| r.method == *n) {
                Some(r) => match (&r.status, passed_time(r)) {
                    (_, Some(t)) => format!("{:.2}", t * 1e3),
                    (Status::Failed(_), _) => "FAILED".into(),
                    _ => "-".into(),
                },
                None => "-".into(),
            };
            let _ = write!(w, " {cell:>width$}");
        }
        let fastest =
            rows.iter().filter_map(|r| Some((passed_time(r)?, r.method.as_str()))).min_by(|a, b| a.0.total_cmp(&b.0));
        let _ = writeln!(w, "  {}", fastest.map_or("-", |f| f.1));
    }
    let _ = writeln!(w, "# Mean busbw (GB/s) over the sizes each method passed:");
    for n in &names {
        let bw = mean(
            outcome.rows.iter().filter(|r| r.method == *n && r.status == Status::Passed).filter_map(|r| r.busbw_gbs),
        );
        let _ = writeln!(w, "#   {n:<width$} {}", bw.map_or("-".into(), |b| format!("{b:.3}")));
    }
    let failed: Vec<&Row> = outcome.rows.iter().filter(|r| matches!(r.status, Status::Failed(_))).collect();
    let _ =
        writeln!(w, "# Failures: {}", if failed.is_empty() { "none".to_string() } else { failed.len().to_string() });
    for r in failed {
        if let Status::Failed(why) = &r.status {
            let _ = writeln!(w, "#   {} at {}: {why}", r.method, r.count);
        }
    }
    for u in &outcome.unavailable {
        let _ = writeln!(w, "# Not run: {}: {}", u.method, u.reason);
    }
    let all = mean(outcome.rows.iter().filter(|r| r.status == Status::Passed).filter_map(|r| r.busbw_gbs));
    let _ = writeln!(w, "# Avg bus bandwidth    : {}", all.map_or("-".into(), |b| format!("{b:.4}")));
    out
}

/// Whether anything at all was measured.
pub fn measured_any(outcome: &Outcome) -> bool {
    outcome.rows.iter().any(|r| passed_time(r).is_some())
}
