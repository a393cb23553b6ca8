//! The parts of the multi-process criterion bench (`benches/allreduce.rs`) that need no ranks, kept here so they
//! are unit-tested: the command rank 0 broadcasts to the ranks that follow it, the size lists, and the summary
//! file the perf gate (`cargo xtask perf-gate`) reads.

use serde::{Deserialize, Serialize};

/// Ranks to launch; default 2 on the host driver (the ranks share the CPU cores), else one per GPU up to 8.
pub const RANKS_ENV: &str = "ARX_BENCH_RANKS";
/// `1`: short warm-up and measurement, no plots; what the perf gate runs.
pub const QUICK_ENV: &str = "ARX_BENCH_QUICK";
/// Where rank 0 writes the [`Summary`] once criterion is done.
pub const SUMMARY_ENV: &str = "ARX_BENCH_SUMMARY";

/// Comma-separated allreduce methods to bench instead of [`METHODS`]: any comm-bench name, `@BLOCKSxTHREADS`
/// shapes and groups (`ablation`, `shapes`) included.
pub const METHODS_ENV: &str = "ARX_BENCH_METHODS";

/// The allreduce methods benchmarked by default, in comm_bench.py's column order; those a driver lacks are skipped.
pub const METHODS: [&str; 6] = ["car_1shot", "symm_1shot", "car_2shot", "symm_2shot", "nccl", "nccl_symm"];

/// The methods to bench: `list` (the value of [`METHODS_ENV`]) with its groups expanded, or [`METHODS`].
pub fn methods(list: Option<&str>) -> Result<Vec<String>, String> {
    let Some(list) = list.filter(|l| !l.trim().is_empty()) else {
        return Ok(METHODS.iter().map(|m| m.to_string()).collect());
    };
    let names: Vec<String> = list.split(',').map(|m| m.trim().to_string()).collect();
    let names = methods::expand(&names);
    for m in &names {
        if methods::op_of(m)? != allreduce::Op::AllReduce {
            return Err(format!("{METHODS_ENV}: {m} is not an allreduce method"));
        }
    }
    Ok(names)
}
/// The pseudo-method that times a plain device copy of the same bytes: the perf gate divides by it, which
/// cancels the machine's speed.
pub const COPY: &str = "copy";

/// Samples per benchmark the summary takes its median over: criterion's smallest sample size, so they are
/// always measurement samples (criterion's warm-up calls come before them).
pub const SUMMARY_SAMPLES: usize = 10;

/// What rank 0 tells the other ranks, as a fixed 32-byte record (kind, method, size, iters; little endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Time `iters` calls of target `method` at size index `size`.
    Run { method: usize, size: usize, iters: u64 },
    /// Criterion is done: tear down.
    Stop,
}

impl Command {
    pub const BYTES: usize = 32;

    pub fn encode(&self) -> [u8; Command::BYTES] {
        let words = match *self {
            Command::Run { method, size, iters } => [1, method as u64, size as u64, iters],
            Command::Stop => [2, 0, 0, 0],
        };
        let mut out = [0u8; Command::BYTES];
        out.chunks_exact_mut(8).zip(words).for_each(|(c, w)| c.copy_from_slice(&w.to_le_bytes()));
        out
    }

    /// Refuses anything but a record [`Command::encode`] wrote, so a corrupted command cannot be followed.
    pub fn decode(bytes: &[u8]) -> Result<Command, String> {
        if bytes.len() != Command::BYTES {
            return Err(format!("command of {} bytes, expected {}", bytes.len(), Command::BYTES));
        }
        let w = |k: usize| u64::from_le_bytes(bytes[8 * k..8 * k + 8].try_into().expect("8 bytes"));
        match w(0) {
            1 => Ok(Command::Run { method: w(1) as usize, size: w(2) as usize, iters: w(3) }),
            2 => Ok(Command::Stop),
            k => Err(format!("unknown command kind {k}")),
        }
    }
}

/// Element counts: three on the host driver (CI time), five of comm_bench.py's 20 on a GPU driver.
pub fn sizes(gpu: bool, align: usize) -> Vec<usize> {
    if gpu {
        let all = measure::sizes::comm_bench_sizes(10, 24, 20, align);
        [0, 5, 10, 15, 19].iter().map(|&i| all[i]).collect()
    } else {
        vec![1024, 65536, 1 << 20]
    }
}

/// Whether an environment flag is set to something other than empty, `0` or `false`.
pub fn env_flag(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

/// One benchmark's result in the [`Summary`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    pub method: String,
    /// Elements (bf16).
    pub count: usize,
    pub bytes: usize,
    /// Median over criterion's measurement samples of the slowest rank's time per call.
    pub median_ns: f64,
    pub samples: usize,
}

/// Everything the perf gate needs from one run, written by rank 0 to `$ARX_BENCH_SUMMARY`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// `host`, `cuda` or `hip`: picks the baseline file.
    pub driver: String,
    pub device: String,
    pub arch: String,
    pub world: usize,
    pub dtype: String,
    pub quick: bool,
    pub unix_time: u64,
    pub entries: Vec<Entry>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_lists_expand_groups_and_refuse_unknown_or_other_ops() {
        assert_eq!(methods(None).unwrap(), METHODS);
        assert_eq!(methods(Some(" ")).unwrap(), METHODS);
        let m = methods(Some("car_1shot@4x256, ablation")).unwrap();
        assert_eq!(m[0], "car_1shot@4x256");
        assert!(m.contains(&"car_1shot_push".to_string()));
        assert!(methods(Some("car_9shot")).unwrap_err().contains("unknown method"));
        assert!(methods(Some("car_rs")).unwrap_err().contains("not an allreduce"));
    }

    #[test]
    fn commands_round_trip_and_garbage_is_refused() {
        for c in [Command::Run { method: 3, size: 2, iters: 1 << 40 }, Command::Stop] {
            assert_eq!(Command::decode(&c.encode()), Ok(c));
        }
        assert!(Command::decode(&[0u8; 31]).is_err());
        assert!(Command::decode(&[0u8; 32]).unwrap_err().contains("kind 0"));
    }

    /// `cargo bench -- --warm-up-time 1` hands criterion's options to every bench target of the workspace's default
    /// members; libtest, which benches a library or binary unless told not to, refuses them. So every library and
    /// binary of every member says `bench = false`, and criterion's `[[bench]]` targets are the only ones left.
    #[test]
    fn only_criterion_benches_are_benchmarked() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let workspace = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let members = workspace.split("members = [").nth(1).unwrap().split(']').next().unwrap();
        let sections = |manifest: &str, header: &str| -> Vec<String> {
            manifest.split(header).skip(1).map(|s| s.split("\n[").next().unwrap().to_string()).collect()
        };
        let benched = |section: &str| !section.lines().any(|l| l.replace(' ', "") == "bench=false");
        let mut checked = 0;
        for member in members.split(',').map(|m| m.trim().trim_matches('"')).filter(|m| !m.is_empty()) {
            let dir = root.join(member);
            let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
            if dir.join("src/lib.rs").exists() || manifest.contains("\n[lib]") {
                let lib = sections(&manifest, "\n[lib]");
                assert!(lib.len() == 1 && !benched(&lib[0]), "{member}: [lib] needs bench = false");
            }
            let bins = sections(&manifest, "\n[[bin]]");
            assert!(bins.iter().all(|b| !benched(b)), "{member}: every [[bin]] needs bench = false");
            let discovered = dir.join("src/main.rs").exists() as usize
                + std::fs::read_dir(dir.join("src/bin")).map_or(0, |d| d.count());
            assert!(bins.len() >= discovered, "{member}: declare each binary, with bench = false");
            checked += 1;
        }
        assert!(checked >= 10, "read {checked} members");
    }

    #[test]
    fn sizes_and_medians() {
        assert_eq!(sizes(false, 256), [1024, 65536, 1 << 20]);
        let gpu = sizes(true, 512);
        assert_eq!(gpu.len(), 5);
        assert_eq!((gpu[0], gpu[4]), (1024, 1 << 24));
        assert!(gpu.iter().all(|n| n % 512 == 0));
    }
}
