//! The closing summary of a sweep: a size x method pivot of times with the fastest method per size, each method's
//! mean bus bandwidth, what failed, and nccl-tests' closing `# Avg bus bandwidth` line; then, per residency (the
//! benchmark's own buffers, or the methods' registered ones: the `+reg` rows), `auto` against the fastest other
//! method of that residency at each size, flagging where `auto` is more than [`AUTO_SLOW_RATIO`] slower; last,
//! `auto` on caller buffers against its bound: `auto+reg` plus the copy floor of the same size.

use crate::report::{Outcome, Row, Status};
use allreduce::{Algorithm, Choice, Residency};
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
    if let (Some(first), Some(last)) = (outcome.not_run.first(), outcome.not_run.last()) {
        let sizes = outcome.not_run.len();
        let _ = writeln!(w, "# Not run: {sizes} size(s), {first} to {last} elements: --max_seconds was reached first");
    }
    let all = mean(outcome.rows.iter().filter(|r| r.status == Status::Passed).filter_map(|r| r.busbw_gbs));
    let _ = writeln!(w, "# Avg bus bandwidth    : {}", all.map_or("-".into(), |b| format!("{b:.4}")));
    render_auto(w, outcome);
    render_bound(w, outcome);
    out
}

/// Above this ratio of `auto`'s time to the fastest other method's, the summary says `auto` chose wrong.
pub const AUTO_SLOW_RATIO: f64 = 1.05;

/// Whether `auto` chose wrong: more than [`AUTO_SLOW_RATIO`] slower than the fastest other method, unless it ran that
/// very design (`same_design`), when the gap is between two timings of one kernel: noise, not the table.
pub fn auto_chose_wrong(ratio: f64, same_design: bool) -> bool {
    ratio > AUTO_SLOW_RATIO && !same_design
}

/// The residencies a sweep's rows are timed on: the benchmark's own buffers (a caller's ordinary tensors, the plainly
/// named rows) and the methods' registered buffers (the `METHOD+reg` rows).
pub const ROW_RESIDENCIES: [Residency; 2] = [Residency::Caller, Residency::Registered];

/// The residency of a row's method name, and the method's name without the `+reg` suffix.
pub fn residency_of(method: &str) -> (Residency, &str) {
    match method.strip_suffix("+reg") {
        Some(base) => (Residency::Registered, base),
        None => (Residency::Caller, method),
    }
}

/// The name of `auto`'s rows of `residency`: `auto` or `auto+reg`.
fn auto_method(residency: Residency) -> &'static str {
    if residency == Residency::Registered {
        "auto+reg"
    } else {
        "auto"
    }
}

/// `auto` at one size against the fastest other passed method of the same residency.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoRatio {
    pub residency: Residency,
    pub count: usize,
    /// `auto`'s (or `auto+reg`'s) time per call.
    pub auto_ms: f64,
    /// The fastest other method of the residency at this size (its row's name, `+reg` included).
    pub best_method: String,
    pub best_ms: f64,
    /// `auto_ms / best_ms`: above 1 `auto` is slower than the method it could have chosen.
    pub ratio: f64,
    /// The design `auto` ran here (its row's `ran`), where the row says.
    pub ran: Option<String>,
}

impl AutoRatio {
    /// Whether `auto` ran the fastest method's own design.
    pub fn same_design(&self) -> bool {
        let best = Algorithm::from_name(residency_of(&self.best_method).1).map(Choice::of);
        best.is_some() && self.ran.as_deref().and_then(Choice::from_name) == best
    }

    /// Whether `auto` chose wrong here ([`auto_chose_wrong`]).
    pub fn flagged(&self) -> bool {
        auto_chose_wrong(self.ratio, self.same_design())
    }

    /// More than [`AUTO_SLOW_RATIO`] slower while running the fastest method's design: noise between two timings.
    fn slow_by_noise(&self) -> bool {
        self.ratio > AUTO_SLOW_RATIO && !self.flagged()
    }
}

/// Whether a method name is `auto` itself (either residency): never a competitor of `auto`.
fn is_auto(method: &str) -> bool {
    residency_of(method).1 == "auto"
}

/// Per residency (caller first) and size (in the order of the rows), `auto`'s time against the fastest other
/// method of the same residency; only passed rows with a time count, and sizes where `auto` did not pass or no other
/// method of its residency did are left out.
pub fn auto_ratios(outcome: &Outcome) -> Vec<AutoRatio> {
    let mut counts: Vec<usize> = Vec::new();
    for r in &outcome.rows {
        if !counts.contains(&r.count) {
            counts.push(r.count);
        }
    }
    let mut out = Vec::new();
    for residency in ROW_RESIDENCIES {
        for &count in &counts {
            let passed = || {
                outcome
                    .rows
                    .iter()
                    .filter(move |r| r.count == count && residency_of(&r.method).0 == residency)
                    .filter_map(|r| Some((r, passed_time(r)?)))
            };
            let Some((auto, auto_ms)) = passed().find(|(r, _)| r.method == auto_method(residency)) else {
                continue;
            };
            let best = passed().filter(|(r, _)| !is_auto(&r.method)).min_by(|a, b| a.1.total_cmp(&b.1));
            if let Some((best, best_ms)) = best {
                out.push(AutoRatio {
                    residency,
                    count,
                    auto_ms,
                    best_method: best.method.clone(),
                    best_ms,
                    ratio: auto_ms / best_ms,
                    ran: auto.ran.clone(),
                });
            }
        }
    }
    out
}

/// The `auto` blocks of the summary: one per residency that has rows, from [`auto_ratios`].
fn render_auto(w: &mut String, outcome: &Outcome) {
    let ratios = auto_ratios(outcome);
    let over = (AUTO_SLOW_RATIO - 1.0) * 100.0;
    for residency in ROW_RESIDENCIES {
        if !outcome.rows.iter().any(|r| residency_of(&r.method).0 == residency) {
            continue;
        }
        let auto = auto_method(residency);
        let label = format!("{} buffers", residency.name());
        let what = format!("the fastest other {}-buffer method", residency.name());
        if !outcome.rows.iter().any(|r| r.method == auto) {
            let _ = writeln!(w, "#\n# {auto} ({label}): not in this sweep, nothing to compare with {what}");
            continue;
        }
        let mine: Vec<&AutoRatio> = ratios.iter().filter(|a| a.residency == residency).collect();
        let width = mine.iter().map(|a| a.best_method.len()).max().unwrap_or(0).max(7);
        let _ = writeln!(w, "#\n# {auto} against {what} at each size where both passed (us per call):");
        let _ = writeln!(w, "# {:>10} {:>10} {:>10}  {:<width$} {:>7}", "count", auto, "fastest", "method", "ratio");
        for a in &mine {
            let _ = write!(
                w,
                "# {:>10} {:>10.2} {:>10.2}  {:<width$} {:>7.3}",
                a.count,
                a.auto_ms * 1e3,
                a.best_ms * 1e3,
                a.best_method,
                a.ratio
            );
            if a.flagged() {
                let _ = write!(w, "  <-- {auto} slower than {} by more than {over:.0}%", a.best_method);
                // Which design the table gave this size, so the table to mend is named.
                if let Some(ran) = &a.ran {
                    let _ = write!(w, " (it ran {ran})");
                }
            } else if a.slow_by_noise() {
                let _ =
                    write!(w, "  ({auto} ran {} itself: two timings of one design)", a.ran.as_deref().unwrap_or("-"));
            }
            let _ = writeln!(w);
        }
        let flagged = mine.iter().filter(|a| a.flagged()).count();
        let _ = write!(w, "# {auto} ({label}): {flagged} of {} sizes above {AUTO_SLOW_RATIO}x {what}", mine.len());
        let noise = mine.iter().filter(|a| a.slow_by_noise()).count();
        if noise > 0 {
            let _ = write!(w, " ({noise} more where {auto} ran that method's design itself)");
        }
        let _ = writeln!(w);
    }
}

/// `auto` on caller buffers at one size against its bound: `auto+reg` (the same call on registered buffers) plus
/// every rank's copy of its input at once, the least a caller-buffer call adds.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoBound {
    pub count: usize,
    pub auto_ms: f64,
    pub registered_ms: f64,
    pub copy_ms: f64,
    /// `auto_ms` over `registered_ms + copy_ms`.
    pub ratio: f64,
}

/// [`AutoBound`] at each size (in the order of the rows) where `auto` and `auto+reg` passed and the copy floor was
/// measured.
pub fn auto_bounds(outcome: &Outcome) -> Vec<AutoBound> {
    let time = |method: &str, count: usize| {
        outcome.rows.iter().find(|r| r.count == count && r.method == method).and_then(passed_time)
    };
    outcome
        .copy_floor
        .iter()
        .filter_map(|c| {
            let (auto_ms, registered_ms) = (time("auto", c.count)?, time("auto+reg", c.count)?);
            let ratio = auto_ms / (registered_ms + c.time_ms);
            Some(AutoBound { count: c.count, auto_ms, registered_ms, copy_ms: c.time_ms, ratio })
        })
        .collect()
}

/// The bound block of the summary, where [`auto_bounds`] has any size.
fn render_bound(w: &mut String, outcome: &Outcome) {
    let bounds = auto_bounds(outcome);
    let (Some(least), Some(most)) =
        (bounds.iter().map(|b| b.ratio).min_by(f64::total_cmp), bounds.iter().map(|b| b.ratio).max_by(f64::total_cmp))
    else {
        return;
    };
    let _ = writeln!(
        w,
        "#\n# auto (caller buffers) against its bound: auto+reg plus every rank's copy of its input, all ranks at \
         once (us per call):"
    );
    let head = ["count", "auto", "auto+reg", "copy", "bound", "ratio"];
    let _ =
        writeln!(w, "# {:>10} {:>10} {:>10} {:>10} {:>10} {:>7}", head[0], head[1], head[2], head[3], head[4], head[5]);
    for b in &bounds {
        let us = |ms: f64| ms * 1e3;
        let bound = b.registered_ms + b.copy_ms;
        let _ = writeln!(
            w,
            "# {:>10} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>7.3}",
            b.count,
            us(b.auto_ms),
            us(b.registered_ms),
            us(b.copy_ms),
            us(bound),
            b.ratio
        );
    }
    let _ = writeln!(w, "# auto (caller buffers): {least:.3}x to {most:.3}x its bound at {} sizes", bounds.len());
}

/// Whether anything at all was measured.
pub fn measured_any(outcome: &Outcome) -> bool {
    outcome.rows.iter().any(|r| passed_time(r).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An outcome of `(method, count, status, us per call)` rows, every rank at that time.
    fn outcome(rows: &[(&str, usize, Status, f64)]) -> Outcome {
        let rows: Vec<_> = rows.iter().map(|(m, n, st, us)| (*m, *n, st.clone(), Some(us * 1e-3))).collect();
        crate::report::fixtures::outcome(2, &rows)
    }

    /// `auto` 10% slower than car_1shot at 1024 and 10% faster at 2048; `auto+reg` 4% faster than the fastest `+reg`
    /// method at 1024 and 7% slower at 2048, while the caller rows would give the opposite verdicts were the two
    /// residencies mixed. A failed row is faster still: it does not compete.
    /// At 4096 `auto` failed and `auto+reg` has no `+reg` competitor: no ratio there.
    fn mixed() -> Outcome {
        let (p, failed) = (Status::Passed, Status::Failed("wrong sums".into()));
        let skipped = Status::Skipped("too large".into());
        outcome(&[
            ("auto+reg", 1024, p.clone(), 11.5),
            ("symm_zc_2shot+reg", 1024, p.clone(), 12.0),
            ("auto", 1024, p.clone(), 11.0),
            ("car_1shot", 1024, p.clone(), 10.0),
            ("symm_1shot", 1024, p.clone(), 12.0),
            ("car_2shot", 1024, failed.clone(), 1.0),
            ("symm_zc_2shot", 1024, p.clone(), 30.0),
            ("auto+reg", 2048, p.clone(), 15.0),
            ("symm_zc_2shot+reg", 2048, p.clone(), 14.0),
            ("auto", 2048, p.clone(), 18.0),
            ("car_1shot", 2048, p.clone(), 20.0),
            ("symm_1shot", 2048, p.clone(), 25.0),
            ("car_2shot", 2048, failed.clone(), 1.0),
            ("symm_zc_2shot", 2048, p.clone(), 30.0),
            ("auto+reg", 4096, p.clone(), 20.0),
            ("symm_zc_2shot+reg", 4096, skipped.clone(), 1.0),
            ("auto", 4096, failed.clone(), 1.0),
            ("car_1shot", 4096, p.clone(), 40.0),
        ])
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn auto_ratios_compare_each_residency_with_itself_only() {
        let ratios = auto_ratios(&mixed());
        let got: Vec<(Residency, usize, &str)> =
            ratios.iter().map(|a| (a.residency, a.count, a.best_method.as_str())).collect();
        assert_eq!(
            got,
            [
                (Residency::Caller, 1024, "car_1shot"),
                (Residency::Caller, 2048, "car_1shot"),
                (Residency::Registered, 1024, "symm_zc_2shot+reg"),
                (Residency::Registered, 2048, "symm_zc_2shot+reg"),
            ],
            "{ratios:?}"
        );
        let want = [(11.0, 10.0, 1.1), (18.0, 20.0, 0.9), (11.5, 12.0, 11.5 / 12.0), (15.0, 14.0, 15.0 / 14.0)];
        for (a, (auto_us, best_us, ratio)) in ratios.iter().zip(want) {
            assert!(close(a.auto_ms, auto_us * 1e-3) && close(a.best_ms, best_us * 1e-3), "{a:?}");
            assert!(close(a.ratio, ratio), "{a:?}: want {ratio}");
        }
        let flagged: Vec<(Residency, usize)> =
            ratios.iter().filter(|a| a.flagged()).map(|a| (a.residency, a.count)).collect();
        assert_eq!(flagged, [(Residency::Caller, 1024), (Residency::Registered, 2048)]);
    }

    #[test]
    fn render_flags_exactly_the_slow_sizes_per_residency() {
        let text = render(&mixed());
        println!("{text}");
        assert!(text.lines().all(|l| l.starts_with('#')), "{text}");
        let marked: Vec<&str> = text.lines().filter(|l| l.contains("<--")).collect();
        assert_eq!(marked.len(), 2, "{text}");
        let fields = |l: &str| l.split_whitespace().take(6).map(String::from).collect::<Vec<_>>();
        assert_eq!(fields(marked[0]), ["#", "1024", "11.00", "10.00", "car_1shot", "1.100"], "{text}");
        assert!(marked[0].ends_with("<-- auto slower than car_1shot by more than 5%"), "{text}");
        assert_eq!(fields(marked[1]), ["#", "2048", "15.00", "14.00", "symm_zc_2shot+reg", "1.071"], "{text}");
        assert!(marked[1].ends_with("<-- auto+reg slower than symm_zc_2shot+reg by more than 5%"), "{text}");
        let unmarked = text.lines().find(|l| l.split_whitespace().nth(1) == Some("2048") && l.contains("car_1shot"));
        assert!(unmarked.is_some_and(|l| l.contains("0.900") && !l.contains("<--")), "{text}");
        assert!(
            text.contains("# auto (caller buffers): 1 of 2 sizes above 1.05x the fastest other caller-buffer method\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "# auto+reg (registered buffers): 1 of 2 sizes above 1.05x the fastest other registered-buffer method\n"
            ),
            "{text}"
        );
        let pivot_end = text.find("# Avg bus bandwidth").unwrap();
        assert!(text.find("# auto against").unwrap() > pivot_end, "after the pivot: {text}");
    }

    #[test]
    fn blocks_only_for_residencies_present_and_auto_missing_is_said() {
        let p = Status::Passed;
        let caller_only = render(&outcome(&[("auto", 1024, p.clone(), 10.0), ("car_1shot", 1024, p.clone(), 10.2)]));
        assert!(caller_only.contains("# auto (caller buffers): 0 of 1 sizes above"), "{caller_only}");
        assert!(!caller_only.contains("auto+reg"), "no +reg rows, no +reg block: {caller_only}");
        let no_auto = outcome(&[("car_1shot", 1024, p.clone(), 10.0), ("symm_zc_2shot+reg", 1024, p.clone(), 9.0)]);
        assert!(auto_ratios(&no_auto).is_empty());
        let text = render(&no_auto);
        assert!(text.contains("# auto (caller buffers): not in this sweep"), "{text}");
        assert!(text.contains("# auto+reg (registered buffers): not in this sweep"), "{text}");
        let alone = outcome(&[("auto", 1024, p.clone(), 10.0), ("auto+reg", 1024, p, 9.0)]);
        assert!(auto_ratios(&alone).is_empty(), "auto is no competitor of itself");
        assert!(render(&alone).contains("# auto (caller buffers): 0 of 0 sizes above"));
    }

    /// `mixed()` with copy floors of 2 us at 1024, 1 us at 2048 and 4096, and 3 us at 8192, which has no rows.
    fn with_floors() -> Outcome {
        let mut o = mixed();
        o.copy_floor = [(1024, 2.0), (2048, 1.0), (4096, 1.0), (8192, 3.0)]
            .map(|(count, us)| crate::ceilings::CopyFloor { count, time_ms: us * 1e-3 })
            .to_vec();
        o
    }

    #[test]
    fn auto_bounds_add_the_copy_floor_to_auto_reg_where_both_passed() {
        let bounds = auto_bounds(&with_floors());
        let got: Vec<usize> = bounds.iter().map(|b| b.count).collect();
        assert_eq!(got, [1024, 2048], "4096: auto failed; 8192: no rows: {bounds:?}");
        for (b, (auto_us, reg_us, copy_us)) in bounds.iter().zip([(11.0, 11.5, 2.0), (18.0, 15.0, 1.0)]) {
            assert!(close(b.auto_ms, auto_us * 1e-3) && close(b.registered_ms, reg_us * 1e-3), "{b:?}");
            assert!(close(b.copy_ms, copy_us * 1e-3), "{b:?}");
            assert!(close(b.ratio, auto_us / (reg_us + copy_us)), "{b:?}");
        }
        assert!(auto_bounds(&mixed()).is_empty(), "no copy floor measured, no bound");
    }

    #[test]
    fn render_gives_the_bound_block_last_and_only_with_copy_floors() {
        let text = render(&with_floors());
        println!("{text}");
        let block = text.find("# auto (caller buffers) against its bound").expect("the bound block");
        assert!(block > text.find("# auto+reg (registered buffers): 1 of 2").unwrap(), "after the auto blocks: {text}");
        let fields = |count: &str| {
            let line = text[block..].lines().find(|l| l.split_whitespace().nth(1) == Some(count));
            line.map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
        };
        let want = ["#", "1024", "11.00", "11.50", "2.00", "13.50", &format!("{:.3}", 11.0 / 13.5)].map(String::from);
        assert_eq!(fields("1024").as_deref(), Some(&want[..]), "{text}");
        assert_eq!(fields("2048").unwrap()[5..], ["16.00".to_string(), "1.125".into()], "{text}");
        assert!(fields("4096").is_none() && fields("8192").is_none(), "{text}");
        assert!(text.contains("# auto (caller buffers): 0.815x to 1.125x its bound at 2 sizes\n"), "{text}");
        assert!(!render(&mixed()).contains("against its bound"), "no copy floor, no block");
    }

    /// `mixed()` with the designs `auto` ran: car_1shot at 1024 (the fastest method's, 10% slower: two timings of
    /// one kernel), symm_ll at 2048; `auto+reg` symm_ll at 1024 and symm_zc_2shot at 2048 (7% slower, its own).
    fn with_designs() -> Outcome {
        let mut o = mixed();
        let ran = [("auto", 1024, "car_1shot"), ("auto", 2048, "symm_ll"), ("auto+reg", 1024, "symm_ll")];
        for (method, count, design) in ran.into_iter().chain([("auto+reg", 2048, "symm_zc_2shot")]) {
            let row = o.rows.iter_mut().find(|r| r.method == method && r.count == count).unwrap();
            row.ran = Some(design.into());
        }
        o
    }

    #[test]
    fn auto_running_the_fastest_design_itself_is_not_a_wrong_choice() {
        assert!(auto_chose_wrong(1.06, false) && !auto_chose_wrong(1.06, true) && !auto_chose_wrong(1.05, false));
        let ratios = auto_ratios(&with_designs());
        let same: Vec<bool> = ratios.iter().map(AutoRatio::same_design).collect();
        assert_eq!(same, [true, false, false, true], "{ratios:?}");
        assert!(ratios.iter().all(|a| !a.flagged()), "both slow sizes ran the fastest design: {ratios:?}");
        let text = render(&with_designs());
        println!("{text}");
        assert!(!text.contains("<--"), "{text}");
        let noted: Vec<&str> = text.lines().filter(|l| l.contains("two timings of one design")).collect();
        assert_eq!(noted.len(), 2, "{text}");
        assert!(
            noted[0].contains(" 1024 ") && noted[0].ends_with("(auto ran car_1shot itself: two timings of one design)")
        );
        assert!(noted[1].ends_with("(auto+reg ran symm_zc_2shot itself: two timings of one design)"), "{text}");
        assert!(text.contains(
            "# auto (caller buffers): 0 of 2 sizes above 1.05x the fastest other caller-buffer method (1 more where \
             auto ran that method's design itself)\n"
        ));
        // A design that is not the fastest method's is a wrong choice however it is named.
        let mut other = with_designs();
        other.rows.iter_mut().filter(|r| r.method == "auto").for_each(|r| r.ran = Some("car_2shot".into()));
        assert!(auto_ratios(&other).iter().any(|a| a.residency == Residency::Caller && a.count == 1024 && a.flagged()));
        let text = render(&other);
        let marked: Vec<&str> = text.lines().filter(|l| l.contains("<--")).collect();
        assert_eq!(marked.len(), 1, "{text}");
        assert!(marked[0].ends_with("<-- auto slower than car_1shot by more than 5% (it ran car_2shot)"), "{text}");
        // A design the tables do not know never counts as the same.
        other.rows.iter_mut().filter(|r| r.method == "auto").for_each(|r| r.ran = Some("car_1shot_push".into()));
        assert!(auto_ratios(&other).iter().any(|a| a.count == 1024 && a.flagged()));
    }
}
