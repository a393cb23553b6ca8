//! `comm-bench compare BASELINE OTHER...`: runs side by side, method by method, as time per call and the ratio
//! other / baseline at each size. Sizes are matched by nearest element count, because comm_bench.py rounds its
//! sizes up to multiples of 512 elements on HIP and of 256 on CUDA (and the host driver), so a ROCm run and a CUDA
//! run of the same sweep do not share every N; the output says where a match was not exact.

use crate::runs::Run;
use std::fmt::Write as _;

/// Two sizes match when they are within this factor of each other (the rounding moves a size by at most 256
/// elements, i.e. 25% at comm_bench.py's smallest, 1024).
const MATCH_WITHIN: f64 = 1.3;

/// For each of `base`'s counts, `other`'s nearest count (by ratio), if one is within `MATCH_WITHIN`.
pub fn nearest(base: &[usize], other: &[usize]) -> Vec<(usize, Option<usize>)> {
    let distance = |a: usize, b: usize| (a as f64 / b as f64).ln().abs();
    base.iter()
        .map(|&n| {
            let best = other.iter().copied().min_by(|&a, &b| distance(n, a).total_cmp(&distance(n, b)));
            (n, best.filter(|&m| distance(n, m) <= MATCH_WITHIN.ln()))
        })
        .collect()
}

fn counts(run: &Run, method: &str) -> Vec<usize> {
    run.series(method).iter().map(|p| p.count).collect()
}

/// The comparison as text; an error when no method is in both runs.
pub fn render(base: &Run, other: &Run, methods: Option<&[String]>) -> Result<String, String> {
    let common: Vec<&str> = base
        .methods()
        .into_iter()
        .filter(|m| other.methods().contains(m))
        .filter(|m| methods.is_none_or(|list| list.iter().any(|l| l == m)))
        .collect();
    if common.is_empty() {
        return Err(format!(
            "no method measured in both {} ({}) and {} ({})",
            base.label,
            base.methods().join(", "),
            other.label,
            other.methods().join(", ")
        ));
    }
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "# baseline: {}: {} (times: {})", base.label, base.title, base.report);
    let _ = writeln!(w, "# other:    {}: {} (times: {})", other.label, other.title, other.report);
    let _ = writeln!(w, "# ratio = other / baseline time per call (below 1: the other is faster)");
    let mut inexact = Vec::new();
    for m in common {
        let _ = writeln!(
            w,
            "# {m}\n# {:>10} {:>10} {:>12} {:>12} {:>8}",
            "N", "N other", "baseline us", "other us", "ratio"
        );
        let (b, o) = (base.series(m), other.series(m));
        for (n, matched) in nearest(&counts(base, m), &counts(other, m)) {
            let bt = b.iter().find(|p| p.count == n).map_or(f64::NAN, |p| p.time_us);
            match matched.and_then(|k| o.iter().find(|p| p.count == k)) {
                Some(p) => {
                    if p.count != n {
                        inexact.push(format!("{n} -> {}", p.count));
                    }
                    let _ =
                        writeln!(w, "  {n:>10} {:>10} {bt:>12.2} {:>12.2} {:>8.3}", p.count, p.time_us, p.time_us / bt);
                }
                None => {
                    let _ = writeln!(w, "  {n:>10} {:>10} {bt:>12.2} {:>12} {:>8}", "-", "-", "-");
                }
            }
        }
    }
    inexact.dedup();
    if !inexact.is_empty() {
        let _ = writeln!(
            w,
            "# sizes matched by nearest element count (comm_bench.py rounds up to multiples of 512 elements on HIP, \
             256 on CUDA and the host driver): {}",
            inexact.join(", ")
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::Point;

    fn run(label: &str, times: &[(usize, f64)]) -> Run {
        let points = times
            .iter()
            .map(|&(count, time_us)| Point {
                method: "car_1shot".into(),
                count,
                bytes: 2 * count,
                time_us,
                busbw_gbs: 1.0,
            })
            .collect();
        Run { label: label.into(), title: "t".into(), world: 8, report: "max".into(), points }
    }

    #[test]
    fn hip_and_cuda_size_lists_match_by_nearest() {
        let hip = measure::sizes::comm_bench_sizes(10, 24, 20, 512);
        let cuda = measure::sizes::comm_bench_sizes(10, 24, 20, 256);
        assert_ne!(hip, cuda, "the two roundings differ somewhere");
        let pairs = nearest(&hip, &cuda);
        assert!(pairs.iter().zip(&cuda).all(|(p, &c)| p.1 == Some(c)), "{pairs:?}");
        assert_eq!(nearest(&[1024], &[1 << 20]), [(1024, None)], "too far apart to be one size");
    }

    #[test]
    fn ratios_per_size_and_inexact_matches_are_said() {
        let base = run("hip", &[(1024, 10.0), (3072, 20.0)]);
        let other = run("cuda", &[(1024, 5.0), (2816, 30.0)]);
        let text = render(&base, &other, None).unwrap();
        assert!(text.contains("# car_1shot"), "{text}");
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(lines[0].split_whitespace().collect::<Vec<_>>(), ["1024", "1024", "10.00", "5.00", "0.500"]);
        assert_eq!(lines[1].split_whitespace().collect::<Vec<_>>(), ["3072", "2816", "20.00", "30.00", "1.500"]);
        assert!(text.contains("nearest element count") && text.contains("3072 -> 2816"), "{text}");
        let mut lone = other.clone();
        lone.points.iter_mut().for_each(|p| p.method = "nccl".into());
        assert!(render(&base, &lone, None).unwrap_err().contains("no method measured in both"));
    }
}
