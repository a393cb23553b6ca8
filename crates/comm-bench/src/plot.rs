//! `comm_ops_benchmark.svg` and `.png`: time per call (left) and bus bandwidth (right) against message size,
//! log-log, one line per method and run (passed measurements only), the legend in its own column beside the data.
//! Each series has its own colour, marker and dash, so none is reused up to 80 series. `comm-bench plot` also
//! draws a chosen set of methods and their time relative to one of them (below 1: faster than it);
//! `comm-bench compare` overlays several runs. Text is drawn with an embedded DejaVu Sans through ab_glyph, so
//! rendering needs neither fontconfig nor system fonts.

use crate::report::Outcome;
use crate::runs::Run;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

const SIZE: (u32, u32) = (1600, 640);
/// The legend's column on the right.
const LEGEND_WIDTH: u32 = 300;
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
const MARKERS: usize = 4;

/// Series `i`'s colour, marker and whether its line is dashed: colours cycle every 10, markers shift by one each
/// cycle and dashes alternate every 40, so the first 80 series all differ.
fn style(i: usize) -> (RGBColor, usize, bool) {
    (COLORS[i % COLORS.len()], (i + i / COLORS.len()) % MARKERS, (i / 40) % 2 == 1)
}

/// Binds marker `kind` at `at` (circle, triangle, cross or square) to `e` for `body`: the four are different
/// types, each drawn where it is bound.
macro_rules! with_marker {
    ($kind:expr, $at:expr, $color:expr, |$e:ident| $body:expr) => {
        match $kind {
            0 => {
                let $e = Circle::new($at, 4, $color.filled());
                $body
            }
            1 => {
                let $e = TriangleMarker::new($at, 5, $color.filled());
                $body
            }
            2 => {
                let $e = Cross::new($at, 4, $color.stroke_width(2));
                $body
            }
            _ => {
                let $e = EmptyElement::at($at) + Rectangle::new([(-3, -3), (3, 3)], $color.filled());
                $body
            }
        }
    };
}

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

/// One line: (bytes, time or ratio, busbw GB/s) by size.
#[derive(Clone, Debug)]
struct Series {
    name: String,
    points: Vec<(f64, f64, f64)>,
}

/// What to draw of the runs.
#[derive(Clone, Debug, Default)]
pub struct PlotOptions {
    /// These methods, in this order (default: every method, in the order they first appear).
    pub methods: Option<Vec<String>>,
    /// Draw each time divided by this method's at the same size in the same run.
    pub relative_to: Option<String>,
}

/// The series `opts` asks for, per run: the chosen methods (each must have passed at some size in some run), then
/// divided by the reference method's time at the same size (sizes it lacks are left out). Several runs label
/// their series `run: method`.
fn series(runs: &[Run], opts: &PlotOptions) -> Result<Vec<Series>, String> {
    let mut known: Vec<&str> = Vec::new();
    runs.iter().flat_map(|r| r.methods()).for_each(|m| {
        if !known.contains(&m) {
            known.push(m);
        }
    });
    let missing = |m: &str| format!("{m}: no passed measurement of it to plot; plotted can be: {}", known.join(", "));
    let wanted: Vec<&str> = match &opts.methods {
        Some(list) => list
            .iter()
            .map(|m| known.iter().copied().find(|k| k == m).ok_or_else(|| missing(m)))
            .collect::<Result<_, _>>()?,
        None => known.clone(),
    };
    if let Some(r) = opts.relative_to.as_deref().filter(|r| !known.contains(r)) {
        return Err(missing(r));
    }
    let mut out = Vec::new();
    for run in runs {
        for m in &wanted {
            let mut points: Vec<(f64, f64, f64)> =
                run.series(m).iter().map(|p| (p.bytes.max(1) as f64, p.time_us, p.busbw_gbs)).collect();
            if let Some(r) = &opts.relative_to {
                let reference = run.series(r);
                points = points
                    .iter()
                    .filter_map(|&(x, t, bw)| {
                        reference.iter().find(|p| p.bytes.max(1) as f64 == x).map(|p| (x, t / p.time_us, bw))
                    })
                    .collect();
            }
            if !points.is_empty() {
                let name = if runs.len() > 1 { format!("{}: {m}", run.label) } else { m.to_string() };
                out.push(Series { name, points });
            }
        }
    }
    if out.is_empty() {
        return Err("no passed measurement to plot".into());
    }
    Ok(out)
}

/// Writes `comm_ops_benchmark.svg` and `comm_ops_benchmark.png` of a sweep into `dir` (next to the CSV).
pub fn plot(outcome: &Outcome, dir: &Path) -> Result<(PathBuf, PathBuf), String> {
    let run = Run::from_outcome(outcome, "comm_ops_benchmark", None)?;
    plot_runs(&[run], &PlotOptions::default(), &dir.join("comm_ops_benchmark"))
}

/// Writes `<stem>.svg` and `<stem>.png` of one run or several overlaid.
pub fn plot_runs(runs: &[Run], opts: &PlotOptions, stem: &Path) -> Result<(PathBuf, PathBuf), String> {
    register_fonts();
    let series = series(runs, opts)?;
    let (svg, png) = (stem.with_extension("svg"), stem.with_extension("png"));
    crate::paths::writable_file(&svg)?;
    let title = match runs {
        [one] => one.title.clone(),
        _ => runs.iter().map(|r| r.label.as_str()).collect::<Vec<_>>().join(" vs "),
    };
    let y_desc = match &opts.relative_to {
        Some(r) => format!("time / time of {r}"),
        None => "time per call (us)".into(),
    };
    draw(SVGBackend::new(&svg, SIZE).into_drawing_area(), &title, &y_desc, &series)
        .map_err(|e| format!("{}: {e}", svg.display()))?;
    draw(BitMapBackend::new(&png, SIZE).into_drawing_area(), &title, &y_desc, &series)
        .map_err(|e| format!("{}: {e}", png.display()))?;
    Ok((svg, png))
}

/// Whether a log axis can show `v`.
fn loggable(v: f64) -> bool {
    v.is_finite() && v > 0.0
}

/// The axis range around the loggable `values` on a log scale, padded so end points do not sit on the frame;
/// `None` when there are none (a log axis over zeros never finishes laying out its ticks).
fn log_range(values: impl Iterator<Item = f64>) -> Option<std::ops::Range<f64>> {
    let (lo, hi) = values.filter(|&v| loggable(v)).fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    (hi > 0.0).then(|| lo / 1.5..hi * 1.5)
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
    let root = root.titled(title, ("sans-serif", 22)).map_err(err)?;
    let (data, legend) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
    let panels = data.split_evenly((1, 2));
    panel(&panels[0], y_desc, series, |p| p.1)?;
    panel(&panels[1], "bus bandwidth (GB/s)", series, |p| p.2)?;
    // The legend: one row per series, its line, marker and name, in a column of its own.
    let row = (((SIZE.1 - 60) / series.len().max(1) as u32).clamp(8, 20)) as i32;
    // Small enough that the longest name fits the column (DejaVu Sans: about 0.6 em per character).
    let longest = series.iter().map(|s| s.name.chars().count()).max().unwrap_or(1) as f64;
    let fits = ((LEGEND_WIDTH - 44) as f64 / (0.6 * longest)) as i32;
    let font = ("sans-serif", (row - 4).min(fits).clamp(8, 14));
    for (i, s) in series.iter().enumerate() {
        let (color, kind, dashed) = style(i);
        let y = 24 + i as i32 * row;
        let segments: &[(i32, i32)] = if dashed { &[(8, 16), (24, 32)] } else { &[(8, 32)] };
        for &(a, b) in segments {
            legend.draw(&PathElement::new(vec![(a, y), (b, y)], color.stroke_width(2))).map_err(err)?;
        }
        with_marker!(kind, (20, y), color, |m| legend.draw(&m)).map_err(err)?;
        legend.draw(&Text::new(s.name.clone(), (40, y - row / 3), font)).map_err(err)?;
    }
    root.present().map_err(err)
}

/// One log-log panel of `value` (time or busbw) against size.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    y_desc: &str,
    series: &[Series],
    value: impl Fn(&(f64, f64, f64)) -> f64,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let points = || series.iter().flat_map(|s| s.points.iter());
    let (Some(x), Some(y)) = (log_range(points().map(|p| p.0)), log_range(points().map(&value))) else {
        // Nothing to draw: a one-rank run moves no bytes between ranks, so its bus bandwidth is zero.
        let caption = format!("{y_desc}: no positive values to plot");
        return area.draw(&Text::new(caption, (20, 40), ("sans-serif", 16))).map_err(err);
    };
    let mut chart = ChartBuilder::on(area)
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
        .y_label_formatter(&|v| match *v {
            v if v < 0.1 => format!("{v:.1e}"),
            v if v < 10.0 => format!("{v:.2}"),
            v => format!("{v:.0}"),
        })
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let (color, kind, dashed) = style(i);
        let pts: Vec<(f64, f64)> =
            s.points.iter().map(|p| (p.0, value(p))).filter(|&(x, y)| loggable(x) && loggable(y)).collect();
        if dashed {
            chart.draw_series(DashedLineSeries::new(pts.iter().copied(), 8, 5, color.stroke_width(2))).map_err(err)?;
        } else {
            chart.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2))).map_err(err)?;
        }
        for &p in &pts {
            with_marker!(kind, p, color, |m| chart.draw_series(std::iter::once(m)).map(drop)).map_err(err)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Status;

    fn outcome() -> Outcome {
        outcome_of(2)
    }

    fn outcome_of(world: usize) -> Outcome {
        let mut rows = Vec::new();
        for (k, method) in ["car_1shot", "symm_1shot", "car_2shot"].iter().enumerate() {
            for e in 10..=24 {
                let count = 1usize << e;
                let ms = 0.005 * (k + 1) as f64 + count as f64 * 2e-9;
                rows.push((*method, count, Status::Passed, Some(ms)));
            }
        }
        rows.push(("nccl", 1024, Status::Skipped("no library".into()), None));
        crate::report::fixtures::outcome(world, &rows)
    }

    fn run() -> Run {
        Run::from_outcome(&outcome(), "test", None).unwrap()
    }

    #[test]
    fn renders_svg_and_png_of_passed_rows_with_a_busbw_panel() {
        let dir = tempfile::tempdir().unwrap();
        let out = outcome();
        assert_eq!(series(&[run()], &PlotOptions::default()).unwrap().len(), 3, "the skipped method has no line");
        let (svg, png) = plot(&out, dir.path()).unwrap();
        assert_eq!(svg, dir.path().join("comm_ops_benchmark.svg"));
        let svg_text = std::fs::read_to_string(&svg).unwrap();
        assert!(svg_text.contains("<svg") && svg_text.contains("car_2shot") && svg_text.contains("KiB"));
        assert!(svg_text.contains("time per call (us)") && svg_text.contains("bus bandwidth (GB/s)"));
        let png_bytes = std::fs::read(&png).unwrap();
        assert!(png_bytes.starts_with(b"\x89PNG") && png_bytes.len() > 10_000, "{} bytes", png_bytes.len());
    }

    #[test]
    fn a_one_rank_run_plots_its_times_and_says_it_has_no_bus_bandwidth() {
        // One rank moves no bytes between ranks: every busbw is 0, which a log axis cannot lay out (it used to spin).
        let dir = tempfile::tempdir().unwrap();
        let (svg, _) = plot(&outcome_of(1), dir.path()).unwrap();
        let svg = std::fs::read_to_string(svg).unwrap();
        assert!(svg.contains("time per call (us)") && svg.contains("car_2shot"));
        assert!(svg.contains("bus bandwidth (GB/s): no positive values to plot"));
    }

    /// The x coordinate of every SVG text element that reads `name`.
    fn text_xs(svg: &str, name: &str) -> Vec<f64> {
        let reads =
            |t: &str| t.split_once('>').and_then(|(_, c)| c.split("</text>").next()).map(str::trim) == Some(name);
        let x = |t: &str| t.split("x=\"").nth(1)?.split('"').next()?.parse().ok();
        svg.split("<text").filter(|t| reads(t)).filter_map(x).collect()
    }

    #[test]
    fn every_series_has_its_own_style_and_the_legend_sits_beside_the_data() {
        let styles: std::collections::HashSet<(u8, u8, u8, usize, bool)> =
            (0..80).map(style).map(|(c, m, d)| (c.0, c.1, c.2, m, d)).collect();
        assert_eq!(styles.len(), 80);
        let colors: std::collections::HashSet<_> = (0..10).map(|i| style(i).0 .0).collect();
        assert_eq!(colors.len(), 10, "the first ten differ in colour");
        let dir = tempfile::tempdir().unwrap();
        let (svg, _) = plot(&outcome(), dir.path()).unwrap();
        let svg = std::fs::read_to_string(svg).unwrap();
        for name in ["car_1shot", "symm_1shot", "car_2shot"] {
            let xs = text_xs(&svg, name);
            assert!(!xs.is_empty() && xs.iter().all(|&x| x >= (SIZE.0 - LEGEND_WIDTH) as f64), "{name}: {xs:?}");
        }
    }

    #[test]
    fn runs_overlay_with_their_labels() {
        let mut other = run();
        other.label = "other".into();
        let s = series(&[run(), other], &PlotOptions::default()).unwrap();
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "test: car_1shot",
                "test: symm_1shot",
                "test: car_2shot",
                "other: car_1shot",
                "other: symm_1shot",
                "other: car_2shot"
            ]
        );
    }

    #[test]
    fn chosen_methods_relative_to_one() {
        let opts = PlotOptions {
            methods: Some(vec!["car_2shot".into(), "car_1shot".into()]),
            relative_to: Some("car_1shot".into()),
        };
        let s = series(&[run()], &opts).unwrap();
        assert_eq!(s.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["car_2shot", "car_1shot"]);
        assert!(s[1].points.iter().all(|p| (p.1 - 1.0).abs() < 1e-12), "the reference over itself is 1");
        // car_2shot: 0.015 ms + 2 ns per element against 0.005 ms + the same.
        let first = &s[0].points[0];
        assert!((first.1 - (0.015 + 1024.0 * 2e-9) / (0.005 + 1024.0 * 2e-9)).abs() < 1e-9, "{first:?}");
        let bad = PlotOptions { methods: Some(vec!["nccl".into()]), relative_to: None };
        assert!(series(&[run()], &bad).unwrap_err().contains("car_1shot, symm_1shot, car_2shot"));
        let dir = tempfile::tempdir().unwrap();
        let (svg, png) = plot_runs(&[run()], &opts, &dir.path().join("sub/rel")).unwrap();
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
