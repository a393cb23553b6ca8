//! comm-bench's command line: comm_bench.py's flags (snake_case, with kebab-case aliases) and ours.

use crate::config::Report;
use crate::config::{Sizes, SweepConfig};
use allreduce::{DType, Op, Residency};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};
use measure::timing::TimingOptions;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "comm-bench",
    version,
    about = "Allreduce / reduce-scatter / all-gather sweep, compatible with FBGEMM's comm_bench.py"
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
    /// Draw time and bus bandwidth against size (SVG and PNG) of a comm_ops_benchmark.json, our CSV or a
    /// comm_bench.py CSV, next to it.
    Plot {
        /// comm_ops_benchmark.json or comm_bench.py CSV files (one plot each).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Only these methods, in this order.
        #[arg(long, value_delimiter = ',')]
        methods: Option<Vec<String>>,
        /// Plot every time divided by this method's at the same size.
        #[arg(long = "relative_to", alias = "relative-to")]
        relative_to: Option<String>,
        /// Write OUTPUT.svg and OUTPUT.png instead of comm_ops_benchmark.* next to the file (one file only).
        #[arg(long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        read: ReadArgs,
    },
    /// Compare runs: per method and size, each run's time against the first's (ratio), and one plot of them all.
    /// Reads comm_ops_benchmark.json, our CSV and comm_bench.py CSVs; sizes are matched by nearest element count.
    Compare {
        /// The baseline, then the runs to compare with it.
        #[arg(required = true, num_args = 2..)]
        files: Vec<PathBuf>,
        /// Only these methods.
        #[arg(long, value_delimiter = ',')]
        methods: Option<Vec<String>>,
        /// Write the overlay plot as OUTPUT.svg and OUTPUT.png.
        #[arg(long, default_value = "comm_bench_compare")]
        output: PathBuf,
        #[command(flatten)]
        read: ReadArgs,
    },
    /// Many back-to-back calls with random methods, sizes and dtypes, every result checked exactly.
    Soak(crate::soak::SoakArgs),
    /// Allreduce + residual add + RMSNorm: fused designs against the unfused sequence, per token count.
    Norm(crate::norm::NormArgs),
    /// Run any command as W ranks (RANK, WORLD_SIZE, LOCAL_RANK and the job id set), like torchrun.
    Launch {
        #[arg(short = 'n', long = "num_ranks", alias = "num-ranks", value_parser = clap::value_parser!(u64).range(1..=1024))]
        num_ranks: u64,
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
}

/// How runs are read from files.
#[derive(Args, Debug, Clone)]
pub struct ReadArgs {
    /// Recombine our JSON's per-rank times this way (a comm_bench.py CSV holds rank 0's, so only rank0 fits it)
    /// [default: as the run was reported].
    #[arg(long, value_enum)]
    pub report: Option<Report>,
    /// Ranks of a CSV's run, for its bus bandwidth (a CSV does not say; JSON files do).
    #[arg(long, default_value_t = 8, allow_negative_numbers = true, value_parser = whole(1, 1024))]
    pub world: u64,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CarMemory {
    Uncached,
    Coarse,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Directory for comm_ops_benchmark.csv, .json and the plots (created, and checked writable, before any rank
    /// starts).
    #[arg(long = "output_dir", alias = "output-dir", default_value = "/tmp")]
    pub output_dir: PathBuf,
    /// Write comm_ops_benchmark.csv (comm_bench.py's columns) and comm_ops_benchmark.json (everything).
    #[arg(long = "export_csv", alias = "export-csv")]
    pub export_csv: bool,
    /// Ranks to launch [default: 8 on GPUs, 2 on the host driver].
    #[arg(long = "num_ranks", alias = "num-ranks", allow_negative_numbers = true, value_parser = whole(1, 1024))]
    pub num_ranks: Option<u64>,
    /// Timed calls per measurement (nccl-tests' -n).
    #[arg(short = 'n', long = "num_iters", alias = "num-iters", default_value_t = 20, allow_negative_numbers = true, value_parser = whole(1, 1_000_000))]
    pub num_iters: u64,
    /// Untimed calls before each measurement (nccl-tests' -w).
    #[arg(short = 'w', long = "num_warmup_iters", alias = "num-warmup-iters", default_value_t = 10, allow_negative_numbers = true, value_parser = whole(0, 1_000_000))]
    pub num_warmup_iters: u64,
    /// Smallest size is 2**min_size elements.
    #[arg(long = "min_size", alias = "min-size", default_value_t = 10, allow_negative_numbers = true, value_parser = exponent())]
    pub min_size: u32,
    /// Largest size is 2**max_size elements.
    #[arg(long = "max_size", alias = "max-size", default_value_t = 24, allow_negative_numbers = true, value_parser = exponent())]
    pub max_size: u32,
    /// Number of sizes, log-spaced.
    #[arg(long = "size_steps", alias = "size-steps", default_value_t = 20, allow_negative_numbers = true, value_parser = whole(1, 1000))]
    pub size_steps: u64,
    /// Exact element counts to run instead of the log-spaced sweep (comma-separated, any value >= 1).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["min_size", "max_size", "size_steps"], allow_negative_numbers = true, value_parser = whole(1, 1 << 30))]
    pub counts: Option<Vec<u64>>,
    /// nccl-tests' sweep, in bytes: the smallest message (K, M, G suffixes: powers of 1024) [default: -e's].
    #[arg(short = 'b', long = "minbytes", conflicts_with_all = ["min_size", "max_size", "size_steps", "counts"], allow_negative_numbers = true, value_parser = parse_bytes)]
    pub min_bytes: Option<u64>,
    /// nccl-tests' sweep: the largest message in bytes [default: -b's].
    #[arg(short = 'e', long = "maxbytes", conflicts_with_all = ["min_size", "max_size", "size_steps", "counts"], allow_negative_numbers = true, value_parser = parse_bytes)]
    pub max_bytes: Option<u64>,
    /// nccl-tests' sweep: each size is the previous one times this factor.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2, allow_negative_numbers = true, value_parser = whole(2, 1024))]
    pub step_factor: u64,
    /// The collective.
    #[arg(long, default_value = "allreduce", value_parser = choices::<Op>(&[("allreduce", &["all_reduce"]), ("reduce_scatter", &["reducescatter", "reduce-scatter"]), ("all_gather", &["allgather", "all-gather"])]))]
    pub op: Op,
    /// The driver: auto takes hip, then cuda, when its library loads and sees a device, else host.
    #[arg(long, default_value = "auto", value_parser = choices::<gpu::Backend>(&[("auto", &[]), ("host", &[]), ("cuda", &[]), ("hip", &[])]))]
    pub backend: gpu::Backend,
    #[arg(long, value_delimiter = ',', long_help = methods_help())]
    pub methods: Option<Vec<String>>,
    /// Element type (nccl-tests' -d).
    #[arg(short = 'd', long, default_value = "bf16", value_parser = choices::<DType>(&[("bf16", &["bfloat16"]), ("fp16", &["f16", "half", "float16"]), ("fp32", &["f32", "float", "float32"])]))]
    pub dtype: DType,
    /// Capture the timed calls into a graph once and time its replay.
    #[arg(long)]
    pub graph: bool,
    /// nccl-tests' -G: above 0, time graph replays (as --graph).
    #[arg(short = 'G', long = "cudagraph", default_value_t = 0, allow_negative_numbers = true, value_parser = whole(0, 1_000_000))]
    pub cudagraph: u64,
    /// nccl-tests' -c: comm-bench checks every result, so only 1 is accepted.
    #[arg(short = 'c', long = "check", default_value = "1", value_parser = ["1"])]
    pub check: String,
    /// Timed measurements per method and size; the median is reported.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true, value_parser = whole(1, 1000))]
    pub repeats: u64,
    /// How the ranks' times of one measurement combine into its figure (nccl-tests' -a): the slowest rank, rank
    /// 0's own (what comm_bench.py reports), their mean or the fastest.
    #[arg(long, value_enum, default_value_t = Report::Max)]
    pub report: Report,
    /// car's data buffers: uncached (fine-grained; ROCm's hipDeviceMallocUncached, as upstream) or coarse (plain
    /// device memory). Its flags are uncached either way, and CUDA has one type for both.
    #[arg(long = "car_memory", alias = "car-memory", value_enum, default_value_t = CarMemory::Uncached)]
    pub car_memory: CarMemory,
    /// Measure auto's candidates and write the fastest per size to this file (a tune table).
    #[arg(long)]
    pub tune: Option<PathBuf>,
    /// With --tune: the row length at which calls with the residual add and RMSNorm are measured for their own
    /// tables (your model's hidden size); 0 measures none (a tune then takes about 60% of the time).
    #[arg(long = "tune_hidden", alias = "tune-hidden", default_value_t = allreduce::NORM_HIDDEN as u64)]
    pub tune_hidden: u64,
    /// With --tune: norm calls only (their tables re-measured without the plain allreduces', about 40% of a whole
    /// tune); needs --tune_hidden of at least 1.
    #[arg(long = "tune_norm_only", alias = "tune-norm-only", requires = "tune")]
    pub tune_norm_only: bool,
    /// With --tune: the residencies measured, each for its own tables (caller: the benchmark's own buffers,
    /// registered, caller_registered) [default: all three]; caller alone takes about a third of the time.
    #[arg(long = "tune_residency", alias = "tune-residency", value_delimiter = ',', requires = "tune", value_parser = str::parse::<Residency>)]
    pub tune_residency: Option<Vec<Residency>>,
    /// The tune table `auto` follows [default: the built-in one].
    #[arg(long = "tune_table", alias = "tune-table")]
    pub tune_table: Option<PathBuf>,
    /// How many ranks in all run kernels on each device at once, where other jobs share it: the launch caps leave
    /// room for them all [default: this job's ranks per device].
    #[arg(long = "device_shared_by", alias = "device-shared-by", allow_negative_numbers = true, value_parser = whole(1, 1024))]
    pub device_shared_by: Option<u64>,
    /// Before each size's consecutive checked calls rank r waits r times this many microseconds, so that they start
    /// with the ranks far apart (waits long enough to read their deadline's clock, peers whole calls ahead).
    #[arg(long = "skew_us", alias = "skew-us", default_value_t = 0, value_parser = whole(0, 1_000_000))]
    pub skew_us: u64,
    /// Seconds after which no further size starts (counted from set-up; rank 0's clock decides, so every rank stops
    /// after the same size; the first size always runs): a run under a wall-clock limit ends with its report and
    /// summary of the sizes that ran, which say how many did not. With --tune, no further table starts (counted from
    /// the tune's start; each table is measured whole, the first always): the tables finished are kept.
    #[arg(long = "max_seconds", alias = "max-seconds", allow_negative_numbers = true, value_parser = crate::config::parse_timeout)]
    pub max_seconds: Option<f64>,
    /// Seconds any rank waits for a peer before it gives up, naming who did not arrive.
    #[arg(long = "timeout_s", alias = "timeout-s", allow_negative_numbers = true, value_parser = crate::config::parse_timeout)]
    pub timeout_s: Option<f64>,
    /// Seconds set-up (cold kernel compiles on every rank) may wait for a peer [default: ALLREDUCE_SETUP_TIMEOUT_S,
    /// else six times --timeout_s, at least 60].
    #[arg(long = "setup_timeout_s", alias = "setup-timeout-s", allow_negative_numbers = true, value_parser = crate::config::parse_timeout)]
    pub setup_timeout_s: Option<f64>,
}

/// A whole number in `lo..=hi`, parsed as signed so that `-5` gets a range error rather than clap's "unexpected
/// argument".
pub fn whole(lo: i64, hi: i64) -> impl TypedValueParser<Value = u64> {
    clap::value_parser!(i64).range(lo..=hi).map(|v| v as u64)
}

/// A power-of-two exponent of comm_bench.py's sizes.
fn exponent() -> impl TypedValueParser<Value = u32> {
    clap::value_parser!(i64).range(0..=30).map(|v| v as u32)
}

/// One of `names` (each with its aliases), parsed by `T`'s `FromStr`: clap lists the names in --help and in the
/// error for any other value.
fn choices<T>(names: &[(&'static str, &'static [&'static str])]) -> impl TypedValueParser<Value = T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: std::fmt::Debug,
{
    let values = names.iter().map(|&(name, aliases)| PossibleValue::new(name).aliases(aliases.iter().copied()));
    PossibleValuesParser::new(values).map(|s| s.parse().expect("every listed name parses"))
}

/// --methods' help: every name it takes, so none has to be guessed.
fn methods_help() -> String {
    let groups: Vec<&str> = methods::GROUPS.iter().map(|g| g.0).collect();
    let methods: Vec<&str> =
        methods::METHODS.iter().filter(|m| m.role == methods::Role::Default).map(|m| m.name).collect();
    let variants: Vec<&str> = methods::ablations().collect();
    format!(
        "Comma-separated methods [default: comm_bench.py's methods of the op, and auto for allreduce].\n\
         Methods: {}.\nAblation variants: {}.\nGroups: all (every method of the op), {}.\nA launch shape on a car \
         method or one-kernel symm method: car_1shot@16x512 (16 blocks of 512 threads at every size).",
        methods.join(", "),
        variants.join(", "),
        groups.join(", ")
    )
}

/// Bytes as nccl-tests writes them: `8`, `64K`, `32M`, `1G` (powers of 1024; a trailing B is allowed).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim().trim_end_matches(['B', 'b']);
    let (digits, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    match digits.parse::<u64>() {
        Ok(n) if n >= 1 && n <= (1u64 << 34) >> shift => Ok(n << shift),
        _ => Err(format!("{s:?} is not a byte count from 1 to 16G (such as 8, 64K, 32M, 1G)")),
    }
}

impl BenchArgs {
    /// Checks that clap's per-flag ranges cannot express.
    pub fn validate(&self) -> Result<(), String> {
        if self.tune.is_some() && self.op != Op::AllReduce {
            return Err("--tune measures allreduce methods; drop --op".into());
        }
        if self.tune_norm_only && self.tune_hidden == 0 {
            return Err("--tune_norm_only measures norm calls only: --tune_hidden 0 leaves nothing to measure".into());
        }
        if let Some(path) = &self.tune_table {
            allreduce::TuneTable::load(path).map_err(|e| e.to_string())?;
        }
        if let Some(n) = self.num_ranks.filter(|&n| n as usize > collective_core::MAX_RANKS) {
            return Err(format!(
                "--num_ranks {n}: the communicator's algorithms run 1 to {} ranks (one node)",
                collective_core::MAX_RANKS
            ));
        }
        if self.min_size > self.max_size {
            return Err(format!("--min_size {} is above --max_size {}", self.min_size, self.max_size));
        }
        if let (Some(lo), Some(hi)) = (self.min_bytes, self.max_bytes) {
            if lo > hi {
                return Err(format!("-b {lo} is above -e {hi}"));
            }
        }
        if let Some(methods) = &self.methods {
            if methods.is_empty() {
                return Err("--methods names no method".into());
            }
            for m in &self.method_names() {
                methods::op_of(m).map_err(|e| e.to_string())?;
                if methods::op_of(m)? != self.op {
                    return Err(format!("method {m} does not run --op {}", self.op));
                }
            }
        }
        Ok(())
    }

    /// The sweep these flags describe.
    pub fn config(&self) -> SweepConfig {
        let sizes = match (&self.counts, self.min_bytes.or(self.max_bytes)) {
            (Some(c), _) => Sizes::Counts(c.iter().map(|&n| n as usize).collect()),
            (None, Some(either)) => Sizes::Bytes {
                min: self.min_bytes.unwrap_or(either) as usize,
                max: self.max_bytes.unwrap_or(either) as usize,
                factor: self.step_factor as usize,
            },
            (None, None) => {
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
                graph: self.graph || self.cudagraph > 0,
            },
            report: self.report,
            car_uncached: self.car_memory == CarMemory::Uncached,
            device_shared_by: self.device_shared_by.map(|n| n as usize),
            skew_us: self.skew_us,
            max_duration: self.max_seconds.map(Duration::from_secs_f64),
            timeout: self.timeout_s.map(Duration::from_secs_f64),
            setup_timeout: self.setup_timeout_s.map(Duration::from_secs_f64),
            tune_table: self.tune_table.clone(),
            tune_hidden: Some(self.tune_hidden as usize).filter(|&h| h > 0),
            tune_norm_only: self.tune_norm_only,
            tune_residencies: self.tune_residency.clone().unwrap_or_else(|| Residency::ALL.to_vec()),
        }
    }

    /// The methods to run, in comm_bench.py's column order (with `--tune`: auto's candidates). `all` stands for
    /// every method of the op.
    pub fn method_names(&self) -> Vec<String> {
        let every = || methods::defaults(self.op).iter().map(|s| s.to_string()).collect::<Vec<_>>();
        match (&self.methods, &self.tune) {
            (Some(m), _) => {
                let named: Vec<String> =
                    m.iter().flat_map(|n| if n == "all" { every() } else { vec![n.clone()] }).collect();
                methods::expand(&named)
            }
            (None, Some(_)) => allreduce::Algorithm::CANDIDATES.iter().map(|a| a.name().to_string()).collect(),
            (None, None) => {
                let mut names: Vec<String> = methods::csv_methods(self.op).iter().map(|s| s.to_string()).collect();
                if self.op == Op::AllReduce {
                    names.push("auto".into());
                }
                names
            }
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
        assert_eq!(c.bench.method_names(), vec!["car_rs", "symm_rs", "nccl_rs"]);
    }

    #[test]
    fn defaults_are_comm_bench_py_methods_and_auto_and_all_is_every_method() {
        let c = parse(&[]).unwrap();
        let want = ["car_1shot", "symm_1shot", "car_2shot", "symm_2shot", "nccl", "auto"];
        assert_eq!(c.bench.method_names(), want);
        let all = parse(&["--methods", "all"]).unwrap().bench.method_names();
        assert_eq!(all, methods::defaults(Op::AllReduce));
        let rs = parse(&["--op", "reduce_scatter", "--methods", "all"]).unwrap().bench.method_names();
        assert!(rs.contains(&"nccl_symm_rs".to_string()) && !rs.contains(&"auto".to_string()));
        assert_eq!(parse(&["--op", "allgather"]).unwrap().bench.method_names(), ["car_ag", "nccl_ag"]);
        let ag = parse(&["--op", "all_gather", "--methods", "all"]).unwrap().bench.method_names();
        assert_eq!(ag, ["car_ag", "nccl_ag", "nccl_symm_ag"], "the broken variant only by name");
        let mixed = parse(&["--methods", "car_1shot@4x256,ablation"]).unwrap().bench.method_names();
        assert_eq!(mixed[0], "car_1shot@4x256");
    }

    #[test]
    fn nccl_tests_flags() {
        let c = parse(&["-n", "7", "-w", "3", "-d", "fp32", "-G", "1", "-c", "1", "-b", "8K", "-e", "1M", "-f", "4"])
            .unwrap();
        let cfg = c.bench.config();
        assert_eq!((cfg.timing.iters, cfg.timing.warmup, cfg.dtype, cfg.timing.graph), (7, 3, DType::F32, true));
        // 8 KiB, 32 KiB, 128 KiB, 512 KiB of fp32.
        assert_eq!(cfg.counts(256), [2048, 8192, 32768, 131072]);
        let one = parse(&["-e", "64"]).unwrap().bench.config();
        assert_eq!(one.counts(256), [32], "-b defaults to -e: one size of 64 bytes of bf16");
        assert_eq!(parse_bytes("3G"), Ok(3 << 30));
        assert_eq!(parse_bytes("512b"), Ok(512));
        for bad in ["0", "1T", "-4K", "K", "17G"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        assert!(parse(&["-b", "1M", "-e", "1K"]).unwrap_err().contains("above"));
        assert!(parse(&["-b", "1M", "--max_size", "12"]).is_err(), "two sweeps at once");
        assert!(parse(&["-c", "0"]).is_err(), "checks always run");
    }

    #[test]
    fn negative_numbers_get_range_errors() {
        for (flag, value) in
            [("--num_iters", "-5"), ("-n", "-1"), ("--num_ranks", "-2"), ("--max_size", "-3"), ("--timeout_s", "-1")]
        {
            let e = parse(&[flag, value]).unwrap_err();
            assert!(!e.contains("unexpected argument"), "{flag} {value}: {e}");
            assert!(e.contains("is not in") || e.contains("not a number of seconds"), "{flag} {value}: {e}");
        }
    }

    #[test]
    fn help_lists_every_choice() {
        let help = Cli::try_parse_from(["comm-bench", "--help"]).unwrap_err().to_string();
        for values in [
            "[possible values: allreduce, reduce_scatter, all_gather]",
            "[possible values: auto, host, cuda, hip]",
            "[possible values: bf16, fp16, fp32]",
            "- rank0: Rank 0's own time",
            "- mean:",
            "[possible values: uncached, coarse]",
            "symm_zc_2shot_ll",
            "Groups: all",
        ] {
            assert!(help.contains(values), "--help lacks {values}:\n{help}");
        }
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
            &["--op", "alltoall"],
            &["--dtype", "int8"],
            &["--backend", "metal"],
            &["--methods", "car_9shot"],
            &["--methods", "car_rs"],
            &["--timeout_s", "-1"],
            &["--num_iters", "-5"],
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
