//! What one sweep is, as a plain struct below the command line: the sweep, its ceilings and its report read this,
//! never the CLI.

use allreduce::{Backend, DType, Mode, Op, Residency};
use measure::timing::TimingOptions;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Which element counts a sweep runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Sizes {
    /// comm_bench.py's log-spaced sizes: `steps` points of 2^x for x in `[min_exp, max_exp]`, rounded up to the
    /// driver's alignment.
    CommBench { min_exp: u32, max_exp: u32, steps: usize },
    /// Exactly these counts.
    Counts(Vec<usize>),
    /// nccl-tests' sweep: `min` bytes, then times `factor` up to `max` bytes.
    Bytes { min: usize, max: usize, factor: usize },
}

/// How the ranks' times of one measurement combine into its figure, as nccl-tests' `-a` chooses.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Report {
    /// The slowest rank: when the collective is done everywhere.
    #[default]
    Max,
    /// Rank 0's own time, what comm_bench.py reports.
    Rank0,
    /// The mean over the ranks.
    Mean,
    /// The fastest rank.
    Min,
}

impl Report {
    pub fn name(self) -> &'static str {
        match self {
            Report::Max => "max",
            Report::Rank0 => "rank0",
            Report::Mean => "mean",
            Report::Min => "min",
        }
    }

    /// One measurement's figure from every rank's time (rank order).
    pub fn combine(self, ranks: &[f64]) -> f64 {
        match self {
            Report::Max => ranks.iter().copied().fold(f64::NAN, f64::max),
            Report::Rank0 => ranks.first().copied().unwrap_or(f64::NAN),
            Report::Mean => ranks.iter().sum::<f64>() / ranks.len() as f64,
            Report::Min => ranks.iter().copied().fold(f64::NAN, f64::min),
        }
    }

    /// A timing's figure: per repeat the ranks' times combined, then the median over the repeats.
    pub fn figure_ms(self, timing: &measure::timing::Timing) -> f64 {
        let combined: Vec<f64> = timing.ranks_ms.iter().map(|ranks| self.combine(ranks)).collect();
        measure::timing::median(&combined)
    }
}

#[derive(Clone, Debug)]
pub struct SweepConfig {
    pub backend: Backend,
    pub op: Op,
    pub dtype: DType,
    pub sizes: Sizes,
    pub methods: Vec<String>,
    pub timing: TimingOptions,
    pub report: Report,
    /// car's buffers and flags uncached (fine-grained) rather than coarse-grained.
    pub car_uncached: bool,
    /// How long a rank waits for a peer in a call [default: the environment's or 10 s].
    pub timeout: Option<Duration>,
    /// How long set-up waits for a peer.
    pub setup_timeout: Option<Duration>,
    /// The one table `auto` follows, instead of the cached or built-in ones.
    pub tune_table: Option<PathBuf>,
    /// The row length a tune measures norm calls at (`TuneRequest::norm_hidden`); None: no norm tables.
    pub tune_hidden: Option<usize>,
    /// A tune of norm calls only (`TuneRequest::plain` false).
    pub tune_norm_only: bool,
    /// The residencies a tune measures (`TuneRequest::residencies`).
    pub tune_residencies: Vec<Residency>,
    /// Ranks in all that run kernels on each device (`Options::device_shared_by`).
    pub device_shared_by: Option<usize>,
    /// Microseconds rank r is held back, times r, before the consecutive checked calls (`--skew_us`).
    pub skew_us: u64,
    /// No size after the first starts once the rank has run this long (`--max_seconds`).
    pub max_duration: Option<Duration>,
}

impl SweepConfig {
    /// The element counts on a driver that rounds comm_bench.py's sizes to `align`.
    pub fn counts(&self, align: usize) -> Vec<usize> {
        match &self.sizes {
            Sizes::Counts(c) => c.clone(),
            &Sizes::Bytes { min, max, factor } => {
                let elem = self.dtype.size();
                let bytes = std::iter::successors(Some(min), |&b| Some(b * factor)).take_while(|&b| b <= max);
                let mut counts: Vec<usize> = bytes.map(|b| (b / elem).max(1)).collect();
                counts.dedup();
                counts
            }
            &Sizes::CommBench { min_exp, max_exp, steps } => {
                measure::sizes::comm_bench_sizes(min_exp, max_exp, steps, align)
            }
        }
    }

    /// The sizes `--tune` measures: the sweep's, and with comm_bench.py's sweep the powers of two between its sizes
    /// too ([`measure::sizes::tune_sizes`]).
    pub fn tune_counts(&self, align: usize) -> Vec<usize> {
        match self.sizes {
            Sizes::CommBench { min_exp, max_exp, steps } => measure::sizes::tune_sizes(min_exp, max_exp, steps, align),
            _ => self.counts(align),
        }
    }

    /// Bytes of the largest message on any driver: every driver rounds comm_bench.py's sizes to at most 512
    /// elements, so the sweep's largest size rounded to 512 bounds them all.
    pub fn capacity_bytes(&self) -> usize {
        self.counts(512).iter().max().copied().unwrap_or(1) * self.dtype.size()
    }

    pub fn mode(&self) -> Mode {
        if self.timing.graph {
            Mode::Graph
        } else {
            Mode::Eager
        }
    }

    /// The settings every rank must share, as `key=value` lines.
    pub fn fingerprint(&self, driver: gpu::DriverKind, counts: &[usize]) -> String {
        let t = &self.timing;
        format!(
            "driver={driver}\nop={}\ndtype={}\nsizes={counts:?}\nmethods={}\nnum_iters={}\nnum_warmup_iters={}\n\
             repeats={}\ngraph={}\ncar_uncached={}\nreport={}\ntune_hidden={:?}\ntune_norm_only={}\n\
             tune_residencies={:?}\n",
            self.op,
            self.dtype,
            self.methods.join(","),
            t.iters,
            t.warmup,
            t.repeats,
            t.graph,
            self.car_uncached,
            self.report.name(),
            self.tune_hidden,
            self.tune_norm_only,
            self.tune_residencies
        )
    }
}

/// Seconds in (0, 86400]: every timeout flag of comm-bench and its soak.
pub fn parse_timeout(s: &str) -> Result<f64, String> {
    deadline::parse_seconds(s).map(|d| d.as_secs_f64())
}
