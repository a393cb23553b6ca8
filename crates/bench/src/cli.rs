//! comm-bench's command line: comm_bench.py's flags (snake_case, with kebab-case aliases) and ours.

use crate::config::{Sizes, SweepConfig};
use allreduce::timing::TimingOptions;
use allreduce::{DType, Op};
use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "comm-bench",
    version,
    about = "Allreduce / reduce-scatter sweep, compatible with FBGEMM's comm_bench.py"
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub bench: BenchArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Draw the log-log plot (SVG and PNG) of a comm_ops_benchmark.json, next to it.
    Plot {
        /// comm_ops_benchmark.json files.
        #[arg(required = true)]
        json: Vec<PathBuf>,
        /// Only these methods, in this order.
        #[arg(long, value_delimiter = ',')]
        methods: Option<Vec<String>>,
        /// Plot every time divided by this method's at the same size.
        #[arg(long = "relative_to", alias = "relative-to")]
        relative_to: Option<String>,
        /// Write OUTPUT.svg and OUTPUT.png instead of comm_ops_benchmark.* next to the JSON (one JSON only).
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Many back-to-back calls with random methods, sizes and dtypes, every result checked exactly.
    Soak(crate::soak::SoakArgs),
    /// Run any command as W ranks (RANK, WORLD_SIZE, LOCAL_RANK and the job id set), like torchrun.
    Launch {
        #[arg(short = 'n', long = "num_ranks", alias = "num-ranks", value_parser = clap::value_parser!(u64).range(1..=1024))]
        num_ranks: u64,
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CarMemory {
    Uncached,
    Coarse,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Directory for comm_ops_benchmark.csv and .json.
    #[arg(long = "output_dir", alias = "output-dir", default_value = "/tmp")]
    pub output_dir: PathBuf,
    /// Write comm_ops_benchmark.csv (comm_bench.py's columns) and comm_ops_benchmark.json (everything).
    #[arg(long = "export_csv", alias = "export-csv")]
    pub export_csv: bool,
    /// Ranks to launch [default: 8 on GPUs, 2 on the host driver].
    #[arg(long = "num_ranks", alias = "num-ranks", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub num_ranks: Option<u64>,
    /// Timed calls per measurement.
    #[arg(long = "num_iters", alias = "num-iters", default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub num_iters: u64,
    /// Untimed calls before each measurement.
    #[arg(long = "num_warmup_iters", alias = "num-warmup-iters", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub num_warmup_iters: u64,
    /// Smallest size is 2**min_size elements.
    #[arg(long = "min_size", alias = "min-size", default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=30))]
    pub min_size: u32,
    /// Largest size is 2**max_size elements.
    #[arg(long = "max_size", alias = "max-size", default_value_t = 24, value_parser = clap::value_parser!(u32).range(0..=30))]
    pub max_size: u32,
    /// Number of sizes, log-spaced.
    #[arg(long = "size_steps", alias = "size-steps", default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub size_steps: u64,
    /// Exact element counts to run instead of the log-spaced sweep (comma-separated, any value >= 1).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["min_size", "max_size", "size_steps"], value_parser = clap::value_parser!(u64).range(1..=(1u64 << 30)))]
    pub counts: Option<Vec<u64>>,
    /// allreduce or reduce_scatter.
    #[arg(long, default_value = "allreduce", value_parser = parse_op)]
    pub op: Op,
    /// auto, host, cuda or hip.
    #[arg(long, default_value = "auto", value_parser = parse_backend)]
    pub backend: gpu::Backend,
    /// Comma-separated methods [default: comm_bench.py's methods of the op, then ours]. Also: the ablation variants
    /// (car_1shot_vmm, ...), a launch shape on any car method or one-kernel symm method (car_1shot@16x512: 16 blocks
    /// of 512 threads at every size), and groups: `ablation`, `shapes`.
    #[arg(long, value_delimiter = ',')]
    pub methods: Option<Vec<String>>,
    /// Element type.
    #[arg(long, default_value = "bf16", value_parser = parse_dtype)]
    pub dtype: DType,
    /// Capture the timed calls into a graph once and time its replay.
    #[arg(long)]
    pub graph: bool,
    /// Timed measurements per method and size; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub repeats: u64,
    /// car's data buffers: uncached (fine-grained; ROCm's hipDeviceMallocUncached, as upstream) or coarse (plain
    /// device memory). Its flags are uncached either way, and CUDA has one type for both.
    #[arg(long = "car_memory", alias = "car-memory", value_enum, default_value_t = CarMemory::Uncached)]
    pub car_memory: CarMemory,
    /// Measure auto's candidates and write the fastest per size to this file (a tune table).
    #[arg(long)]
    pub tune: Option<PathBuf>,
    /// The tune table `auto` follows [default: the built-in one].
    #[arg(long = "tune_table", alias = "tune-table")]
    pub tune_table: Option<PathBuf>,
    /// Seconds any rank waits for a peer before it gives up, naming who did not arrive.
    #[arg(long = "timeout_s", alias = "timeout-s", value_parser = parse_timeout)]
    pub timeout_s: Option<f64>,
    /// Seconds set-up (cold kernel compiles on every rank) may wait for a peer [default: ALLREDUCE_SETUP_TIMEOUT_S,
    /// else six times --timeout_s, at least 60].
    #[arg(long = "setup_timeout_s", alias = "setup-timeout-s", value_parser = parse_timeout)]
    pub setup_timeout_s: Option<f64>,
}

fn parse_op(s: &str) -> Result<Op, String> {
    s.parse()
}
fn parse_dtype(s: &str) -> Result<DType, String> {
    s.parse()
}
fn parse_backend(s: &str) -> Result<gpu::Backend, String> {
    s.parse().map_err(|e: gpu::GpuError| e.to_string())
}
fn parse_timeout(s: &str) -> Result<f64, String> {
    deadline::parse_seconds(s).map(|d| d.as_secs_f64())
}

impl BenchArgs {
    /// Checks that clap's per-flag ranges cannot express.
    pub fn validate(&self) -> Result<(), String> {
        if self.tune.is_some() && self.op != Op::AllReduce {
            return Err("--tune measures allreduce methods; drop --op".into());
        }
        if let Some(path) = &self.tune_table {
            allreduce::TuneTable::load(path).map_err(|e| e.to_string())?;
        }
        if let Some(n) = self.num_ranks.filter(|&n| n as usize > collective::MAX_RANKS) {
            return Err(format!(
                "--num_ranks {n}: the communicator's algorithms run 1 to {} ranks (one node)",
                collective::MAX_RANKS
            ));
        }
        if self.min_size > self.max_size {
            return Err(format!("--min_size {} is above --max_size {}", self.min_size, self.max_size));
        }
        if let Some(methods) = &self.methods {
            if methods.is_empty() {
                return Err("--methods names no method".into());
            }
            for m in &allreduce::methods::expand(methods) {
                allreduce::methods::op_of(m).map_err(|e| e.to_string())?;
                if allreduce::methods::op_of(m)? != self.op {
                    return Err(format!("method {m} does not run --op {}", self.op));
                }
            }
        }
        Ok(())
    }

    /// The sweep these flags describe.
    pub fn config(&self) -> SweepConfig {
        let sizes = match &self.counts {
            Some(c) => Sizes::Counts(c.iter().map(|&n| n as usize).collect()),
            None => {
                Sizes::CommBench { min_exp: self.min_size, max_exp: self.max_size, steps: self.size_steps as usize }
            }
        };
        SweepConfig {
            backend: self.backend,
            op: self.op,
            dtype: self.dtype,
            sizes,
            methods: self.method_names(),
            timing: TimingOptions {
                iters: self.num_iters,
                warmup: self.num_warmup_iters,
                repeats: self.repeats,
                graph: self.graph,
            },
            car_uncached: self.car_memory == CarMemory::Uncached,
            timeout: self.timeout_s.map(Duration::from_secs_f64),
            setup_timeout: self.setup_timeout_s.map(Duration::from_secs_f64),
            tune_table: self.tune_table.clone(),
        }
    }

    /// The methods to run, in comm_bench.py's column order (with `--tune`: auto's candidates).
    pub fn method_names(&self) -> Vec<String> {
        match (&self.methods, &self.tune) {
            (Some(m), _) => allreduce::methods::expand(m),
            (None, Some(_)) => allreduce::Algorithm::CANDIDATES.iter().map(|a| a.name().to_string()).collect(),
            (None, None) => allreduce::methods::defaults(self.op).iter().map(|s| s.to_string()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, String> {
        let cli = Cli::try_parse_from(std::iter::once("comm-bench").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.bench.validate()?;
        Ok(cli)
    }

    #[test]
    fn accepts_comm_bench_py_flags_and_kebab_aliases() {
        let c = parse(&[
            "--num_iters",
            "5",
            "--num-warmup-iters",
            "2",
            "--export_csv",
            "--min_size",
            "12",
            "--max-size",
            "14",
            "--size_steps",
            "3",
            "--op",
            "reduce_scatter",
        ])
        .unwrap();
        assert_eq!((c.bench.num_iters, c.bench.num_warmup_iters, c.bench.size_steps), (5, 2, 3));
        assert!(c.bench.export_csv);
        assert_eq!(c.bench.op, Op::ReduceScatter);
        assert_eq!(c.bench.method_names(), vec!["car_rs", "symm_rs", "nccl_rs", "nccl_symm_rs"]);
    }

    #[test]
    fn refuses_out_of_range_flags() {
        for bad in [
            &["--num_iters", "0"][..],
            &["--num_ranks", "0"],
            &["--num_ranks", "2000"],
            &["--max_size", "31"],
            &["--min_size", "20", "--max_size", "10"],
            &["--size_steps", "0"],
            &["--op", "allgather"],
            &["--dtype", "int8"],
            &["--backend", "metal"],
            &["--methods", "car_9shot"],
            &["--methods", "car_rs"],
            &["--timeout_s", "-1"],
            &["--repeats", "0"],
            &["--counts", "0"],
            &["--counts", "8", "--min_size", "3"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn launch_subcommand_takes_the_rest() {
        let c = parse(&["launch", "-n", "3", "--", "sh", "-c", "true"]).unwrap();
        match c.command {
            Some(Command::Launch { num_ranks, command }) => {
                assert_eq!(num_ranks, 3);
                assert_eq!(command, vec!["sh", "-c", "true"]);
            }
            other => panic!("expected the launch subcommand, got {other:?}"),
        }
    }
}
