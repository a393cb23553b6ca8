//! `comm_ops_benchmark.svg` and `.png`: time per call against message size, log-log, one line per method
//! (passed measurements only), so a sweep can be read at a glance. `comm-bench plot` also draws a chosen set of
//! methods, and their time relative to one of them (below 1: faster than it). Text is drawn with an embedded
//! DejaVu Sans through ab_glyph, so rendering needs neither fontconfig nor system fonts.

use crate::report::{Outcome, Status};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

const SIZE: (u32, u32) = (1024, 640);
/// Tableau's ten colours: distinct, and all readable on white.
const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Registers the embedded font under every family name plotters asks for: with ab_glyph, text in an
/// unregistered family fails to render, and that includes criterion's plots (sans-serif) in any binary that
/// links this crate, since cargo unifies plotters' features.
pub fn register_fonts() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for family in ["sans-serif", "serif", "monospace"] {
            // Only fails on bytes that are not a font; these are DejaVu Sans, checked by the tests.
            let _ = plotters::style::register_font(family, FontStyle::Normal, dejavu::sans::regular());
        }
    });
}

/// One method's points: (bytes, microseconds per call), by size.
type Series = (String, Vec<(f64, f64)>);

/// What to draw of an outcome.
#[derive(Clone, Debug, Default)]
pub struct PlotOptions {
    /// These methods, in this order (default: every method, in the order they first appear).
    pub methods: Option<Vec<String>>,
    /// Draw each time divided by this method's at the same size.
    pub relative_to: Option<String>,
}

/// Passed rows with a positive time, grouped by method in the order methods first appear.
fn series(outcome: &Outcome) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for row in outcome.rows.iter().filter(|r| r.status == Status::Passed) {
        let Some(us) = row.time_ms.map(|ms| ms * 1e3).filter(|us| us.is_finite() && *us > 0.0) else {
            continue;
        };
        let point = (row.bytes.max(1) as f64, us);
        match out.iter_mut().find(|s| s.0 == row.method) {
            Some(s) => s.1.push(point),
            None => out.push((row.method.clone(), vec![point])),
        }
    }
    out.iter_mut().for_each(|s| s.1.sort_by(|a, b| a.0.total_cmp(&b.0)));
    out
}

/// The series `opts` asks for: the chosen methods (each must have passed at some size), then divided by the
/// reference method's time at the same size (sizes it lacks are left out).
fn chosen(outcome: &Outcome, opts: &PlotOptions) -> Result<Vec<Series>, String> {
    let all = series(outcome);
    let find = |m: &str| {
        all.iter().find(|s| s.0 == m).cloned().ok_or_else(|| {
            let known: Vec<&str> = all.iter().map(|s| s.0.as_str()).collect();
            format!("{m}: no passed measurement of it to plot; plotted can be: {}", known.join(", "))
        })
    };
    let mut out = match &opts.methods {
        Some(list) => list.iter().map(|m| find(m)).collect::<Result<Vec<_>, _>>()?,
        None => all.clone(),
    };
    if let Some(r) = &opts.relative_to {
        let reference = find(r)?;
        for s in &mut out {
            s.1 =
                s.1.iter().filter_map(|&(x, y)| reference.1.iter().find(|p| p.0 == x).map(|p| (x, y / p.1))).collect();
        }
        out.retain(|s| !s.1.is_empty());
    }
    if out.is_empty() {
        return Err("no passed measurement to plot".into());
    }
    Ok(out)
}

/// Writes `comm_ops_benchmark.svg` and `comm_ops_benchmark.png` into `dir` (next to the CSV).
pub fn plot(outcome: &Outcome, dir: &Path) -> Result<(PathBuf, PathBuf), String> {
    plot_to(outcome, &PlotOptions::default(), &dir.join("comm_ops_benchmark"))
}

/// Writes `<stem>.svg` and `<stem>.png`.
pub fn plot_to(outcome: &Outcome, opts: &PlotOptions, stem: &Path) -> Result<(PathBuf, PathBuf), String> {
    register_fonts();
    let series = chosen(outcome, opts)?;
    if let Some(dir) = stem.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mode = if outcome.graph { "graph" } else { "eager" };
    let title = format!(
        "{} {}, {} ranks, {} driver ({}), {mode}",
        outcome.op, outcome.dtype, outcome.world, outcome.driver, outcome.device
    );
    let y_desc = match &opts.relative_to {
        Some(r) => format!("time / time of {r}"),
        None => "time per call (us)".into(),
    };
    let (svg, png) = (stem.with_extension("svg"), stem.with_extension("png"));
    draw(SVGBackend::new(&svg, SIZE).into_drawing_area(), &title, &y_desc, &series)
        .map_err(|e| format!("{}: {e}", svg.display()))?;
    draw(BitMapBackend::new(&png, SIZE).into_drawing_area(), &title, &y_desc, &series)
        .map_err(|e| format!("{}: {e}", png.display()))?;
    Ok((svg, png))
}

/// The axis range around `values` on a log scale, padded so end points do not sit on the frame.
fn log_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    lo / 1.5..hi * 1.5
}

/// `1 KiB`, `16 MiB`: tick labels a person reads faster than `1048576`.
fn bytes_label(v: f64) -> String {
    match v {
        v if v >= (1u64 << 30) as f64 => format!("{:.0} GiB", v / (1u64 << 30) as f64),
        v if v >= (1 << 20) as f64 => format!("{:.0} MiB", v / (1 << 20) as f64),
        v if v >= 1024.0 => format!("{:.0} KiB", v / 1024.0),
        v => format!("{v:.0} B"),
    }
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let points = || series.iter().flat_map(|s| s.1.iter());
    let x = log_range(points().map(|p| p.0));
    let y = log_range(points().map(|p| p.1));
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x.log_scale().base(2.0), y.log_scale().base(2.0))
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc(y_desc)
        .x_label_formatter(&|v| bytes_label(*v))
        .y_label_formatter(&|v| if *v < 10.0 { format!("{v:.2}") } else { format!("{v:.0}") })
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use crate::config::Report;
    use crate::report::{Row, RunNotes};
    use clap::Parser;

    fn outcome() -> Outcome {
        let args = Cli::try_parse_from(["comm-bench"]).unwrap().bench.config();
        let info = gpu::DeviceInfo {
            kind: gpu::DriverKind::Host,
            name: "test host".into(),
            ordinal: 0,
            count: 1,
            arch: "host".into(),
            multiprocessors: 2,
            size_align: 256,
            bus_id: "host".into(),
        };
        let mut rows = Vec::new();
        for (k, method) in ["car_1shot", "symm_1shot", "car_2shot"].iter().enumerate() {
            for e in 10..=24 {
                let count = 1usize << e;
                let ms = 0.005 * (k + 1) as f64 + count as f64 * 2e-9;
                let t = allreduce::timing::Timing {
                    repeats_ms: vec![ms],
                    rank0_ms: ms,
                    issue_ms: vec![ms],
                    ranks_ms: vec![vec![ms, ms]],
                };
                rows.push(Row::new(method, &args, count, 2, Status::Passed).timed(t, Report::Max));
            }
        }
        rows.push(Row::new("nccl", &args, 1024, 2, Status::Skipped("no library".into())));
        let ceilings = crate::ceilings::Ceilings {
            copy_bytes: 1 << 20,
            copy_gbs: 10.0,
            empty_launch_us: 1.0,
            empty_graph_replay_us: 1.0,
            empty_all_ranks_us: 1.0,
            barrier_us: None,
        };
        let notes =
            RunNotes { tune_table: "test".into(), ceilings, unavailable: Vec::new(), provenance: Default::default() };
        Outcome::new(&info, 2, &args, notes, rows)
    }

    #[test]
    fn renders_svg_and_png_of_passed_rows() {
        let dir = tempfile::tempdir().unwrap();
        let out = outcome();
        assert_eq!(series(&out).len(), 3, "the skipped method has no line");
        let (svg, png) = plot(&out, dir.path()).unwrap();
        assert_eq!(svg, dir.path().join("comm_ops_benchmark.svg"));
        let svg_text = std::fs::read_to_string(&svg).unwrap();
        assert!(svg_text.contains("<svg") && svg_text.contains("car_2shot") && svg_text.contains("KiB"));
        let png_bytes = std::fs::read(&png).unwrap();
        assert!(png_bytes.starts_with(b"\x89PNG") && png_bytes.len() > 10_000, "{} bytes", png_bytes.len());
    }

    #[test]
    fn chosen_methods_relative_to_one() {
        let out = outcome();
        let opts = PlotOptions {
            methods: Some(vec!["car_2shot".into(), "car_1shot".into()]),
            relative_to: Some("car_1shot".into()),
        };
        let s = chosen(&out, &opts).unwrap();
        assert_eq!(s.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(), ["car_2shot", "car_1shot"]);
        assert!(s[1].1.iter().all(|p| (p.1 - 1.0).abs() < 1e-12), "the reference over itself is 1");
        // car_2shot: 0.015 ms + 2 ns per element against 0.005 ms + the same.
        let first = &s[0].1[0];
        assert!((first.1 - (0.015 + 1024.0 * 2e-9) / (0.005 + 1024.0 * 2e-9)).abs() < 1e-9, "{first:?}");
        let bad = PlotOptions { methods: Some(vec!["nccl".into()]), relative_to: None };
        assert!(chosen(&out, &bad).unwrap_err().contains("car_1shot, symm_1shot, car_2shot"));
        let dir = tempfile::tempdir().unwrap();
        let (svg, png) = plot_to(&out, &opts, &dir.path().join("sub/rel")).unwrap();
        assert!(std::fs::read_to_string(svg).unwrap().contains("time / time of car_1shot"));
        assert!(png.ends_with("sub/rel.png") && png.exists());
    }

    #[test]
    fn refuses_an_outcome_without_passed_rows() {
        let mut out = outcome();
        out.rows.iter_mut().for_each(|r| r.status = Status::Failed("wrong".into()));
        assert!(plot(&out, tempfile::tempdir().unwrap().path()).unwrap_err().contains("no passed"));
        assert_eq!(bytes_label(2048.0), "2 KiB");
        assert_eq!(bytes_label(512.0), "512 B");
    }
}
