//! What one sweep is, as a plain struct below the command line: the sweep, its ceilings and its report read this,
//! never the CLI.

use allreduce::timing::TimingOptions;
use allreduce::{Backend, DType, Mode, Op};
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
}

#[derive(Clone, Debug)]
pub struct SweepConfig {
    pub backend: Backend,
    pub op: Op,
    pub dtype: DType,
    pub sizes: Sizes,
    pub methods: Vec<String>,
    pub timing: TimingOptions,
    /// car's buffers and flags uncached (fine-grained) rather than coarse-grained.
    pub car_uncached: bool,
    /// How long a rank waits for a peer in a call [default: the environment's or 10 s].
    pub timeout: Option<Duration>,
    /// How long set-up waits for a peer.
    pub setup_timeout: Option<Duration>,
    /// The one table `auto` follows, instead of the cached or built-in ones.
    pub tune_table: Option<PathBuf>,
}

impl SweepConfig {
    /// The element counts on a driver that rounds comm_bench.py's sizes to `align`.
    pub fn counts(&self, align: usize) -> Vec<usize> {
        match &self.sizes {
            Sizes::Counts(c) => c.clone(),
            &Sizes::CommBench { min_exp, max_exp, steps } => {
                allreduce::sizes::comm_bench_sizes(min_exp, max_exp, steps, align)
            }
        }
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
             repeats={}\ngraph={}\ncar_uncached={}\n",
            self.op,
            self.dtype,
            self.methods.join(","),
            t.iters,
            t.warmup,
            t.repeats,
            t.graph,
            self.car_uncached
        )
    }
}
