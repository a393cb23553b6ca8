//! What every collective implementation shares: the [`Collective`] trait the benchmark drives, element types,
//! argument checks, and the work partition ([`shard_range`], [`block_range`]) that the device kernels in
//! `kernels/include/arx/` and the host kernels compute identically, so each block of each rank touches the same
//! elements on every driver.

mod call;
mod elem;
pub mod flag_tags;
pub mod host_sync;
mod kernel_headers;
pub mod norm;
mod peers;
mod plan;
pub mod status;
mod team;

pub use call::{AddRmsNorm, Call, CallError, Residency, UnknownResidency, MAX_HIDDEN};
pub use elem::{sum_sources, Element, HostElem};
pub use kernel_headers::KERNEL_HEADERS;
pub use peers::PeerProcesses;
pub use plan::{LaunchPlan, LaunchRule};
pub use status::STATUS_BYTES;
pub use team::{status_words, OwnStatus, PeerMaps, Sharing, Team};

use gpu::Stream;
use std::fmt;
use std::str::FromStr;

/// Most ranks the custom kernels (car, symm) address: their parameter blocks hold 8 peer pointers.
pub const MAX_RANKS: usize = 8;
/// Most blocks a custom kernel launches; flag and signal arrays have one slot per block.
pub const MAX_BLOCKS: usize = 64;
/// Bytes of one vector load or store.
pub const VEC_BYTES: usize = 16;
/// Shard and block edges fall on multiples of this many bytes, so no two ranks (or blocks) ever write one cache line.
pub const LINE_BYTES: usize = 128;
const LINE_VECS: usize = LINE_BYTES / VEC_BYTES;

/// How calls reach the device: launched one by one, or replayed from a captured graph (ranks start their kernels
/// closer together there, which moves the best hand-over points).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Eager,
    Graph,
}

impl Mode {
    pub const ALL: [Mode; 2] = [Mode::Eager, Mode::Graph];
    pub fn name(self) -> &'static str {
        match self {
            Mode::Eager => "eager",
            Mode::Graph => "graph",
        }
    }
}

impl Mode {
    /// How `stream` issues work: into a graph capture or eagerly (a driver call).
    pub fn of(stream: &Stream) -> Result<Mode, CollectiveError> {
        Ok(if stream.is_capturing()? { Mode::Graph } else { Mode::Eager })
    }
}

/// Element type of a collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    Bf16,
    F16,
    F32,
}

impl DType {
    pub const ALL: [DType; 3] = [DType::Bf16, DType::F16, DType::F32];
    pub fn size(self) -> usize {
        match self {
            DType::Bf16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }
    /// Elements per 16-byte vector.
    pub fn vec(self) -> usize {
        VEC_BYTES / self.size()
    }
    /// The code the kernels' parameter blocks carry.
    pub fn code(self) -> u32 {
        match self {
            DType::Bf16 => 0,
            DType::F16 => 1,
            DType::F32 => 2,
        }
    }
    pub fn from_code(code: u32) -> Result<DType, String> {
        DType::ALL.into_iter().find(|d| d.code() == code).ok_or_else(|| format!("unknown dtype code {code}"))
    }
    /// Also the suffix of the kernels' entry points (`car_1shot_bf16`).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::F16 => "fp16",
            DType::F32 => "fp32",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            "fp16" | "f16" | "half" | "float16" => Ok(DType::F16),
            "fp32" | "f32" | "float" | "float32" => Ok(DType::F32),
            _ => Err(format!("unknown dtype {s:?} (expected bf16, fp16 or fp32)")),
        }
    }
}

/// The collective operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Every rank gets the sum of all inputs (`count` elements).
    AllReduce,
    /// Rank r gets elements `[r * count / W, (r + 1) * count / W)` of the sum.
    ReduceScatter,
    /// Every rank gets every rank's `count` elements in rank order (`count * W` elements).
    AllGather,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "allreduce",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
        }
    }
    /// Elements of the output on each rank (saturating, so a count too large for any buffer stays too large).
    pub fn output_count(self, count: usize, world: usize) -> usize {
        match self {
            Op::AllReduce => count,
            Op::ReduceScatter => count / world,
            Op::AllGather => count.saturating_mul(world),
        }
    }
    /// Bytes of an output buffer for every input of up to `capacity` bytes: `capacity` (a reduce-scatter's shard
    /// fits), or all-gather's `capacity * world`.
    pub fn output_capacity(self, capacity: usize, world: usize) -> usize {
        capacity.max(self.output_count(capacity, world))
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Op {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "allreduce" | "all_reduce" => Ok(Op::AllReduce),
            "reduce_scatter" | "reducescatter" | "reduce-scatter" => Ok(Op::ReduceScatter),
            "all_gather" | "allgather" | "all-gather" => Ok(Op::AllGather),
            _ => Err(format!("unknown op {s:?} (expected allreduce, reduce_scatter or all_gather)")),
        }
    }
}

/// The algorithms of the families car and symm (each with its own protocol; all-gather is car's alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    /// Every rank sums all buffers.
    OneShot,
    /// Each rank sums its shard, then every rank gathers all shards.
    TwoShot,
    /// The first half of two-shot with exact `count / world` shards: rank r keeps shard r.
    ReduceScatter,
    /// Every rank copies its input into its buffer, then every buffer out in rank order.
    AllGather,
}

impl Algo {
    pub const fn op(self) -> Op {
        match self {
            Algo::OneShot | Algo::TwoShot => Op::AllReduce,
            Algo::ReduceScatter => Op::ReduceScatter,
            Algo::AllGather => Op::AllGather,
        }
    }
    /// The registry name, also the stem of the kernels' names; `None` where the family does not run it.
    pub fn method(self, family: Family) -> Option<&'static str> {
        Some(match (family, self) {
            (Family::Car, Algo::OneShot) => "car_1shot",
            (Family::Car, Algo::TwoShot) => "car_2shot",
            (Family::Car, Algo::ReduceScatter) => "car_rs",
            (Family::Car, Algo::AllGather) => "car_ag",
            (Family::Symm, Algo::OneShot) => "symm_1shot",
            (Family::Symm, Algo::TwoShot) => "symm_2shot",
            (Family::Symm, Algo::ReduceScatter) => "symm_rs",
            (Family::Symm, Algo::AllGather) => return None,
        })
    }
}

/// Whose protocol runs an [`Algo`]: FBGEMM's custom allreduce or PyTorch's symmetric memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Car,
    Symm,
}

#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    #[error(transparent)]
    Gpu(#[from] gpu::GpuError),
    #[error(transparent)]
    Ipc(#[from] ipc::IpcError),
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("{0}")]
    BadArgs(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("ranks disagree: {0}")]
    Mismatch(String),
    /// A watchdog ended the communicator (a step past its deadline, a peer's connection lost): why.
    #[error("{0}")]
    Aborted(String),
}

/// One allreduce / reduce-scatter / all-gather implementation, driven by the benchmark through this trait alone.
pub trait Collective {
    /// The method's registry name (`car_1shot`, `symm_2shot`, `nccl`, ...).
    fn name(&self) -> &str;
    /// The one operation this method runs.
    fn op(&self) -> Op;
    /// `Err(reason)` when this method cannot run `op` on `dtype` (every method takes every dtype).
    fn supports(&self, op: Op, _dtype: DType) -> Result<(), String> {
        if op == self.op() {
            Ok(())
        } else {
            Err(format!("{} runs {}, not {op}", self.name(), self.op()))
        }
    }
    /// Largest input, in bytes, that `run` accepts.
    fn capacity_bytes(&self) -> usize;
    /// Whether the sum is rounded to the element type after every add (an ablation) rather than accumulated in f32:
    /// its results are checked against a bound that grows with the number of adds.
    fn rounds_every_add(&self) -> bool {
        false
    }

    /// Whether `run` may be captured into a graph and replayed (every method here keeps its per-call state, such
    /// as epochs, in device memory, so replays advance it).
    fn capturable(&self) -> bool {
        true
    }
    /// A registered input the method reads in place, the way a tensor allocated in torch's symmetric memory is
    /// read: a caller that writes its input there saves the copy-in. `None`: the method takes input from anywhere.
    fn registered_input(&self) -> Option<&gpu::DeviceBuffer> {
        None
    }
    /// Likewise, a registered output peers write into directly.
    fn registered_output(&self) -> Option<&gpu::DeviceBuffer> {
        None
    }
    /// What made a wait of this method's kernels end without its peer, if one did (the ranks waited for and what was
    /// seen; [`status::recorded`]), read now from the status words it watches where they are its own; None where
    /// nothing failed or another owner (a communicator) reports its words. The calls after such a failure end their
    /// waits at once, so their results mean nothing.
    fn failure(&self) -> Result<Option<(Vec<usize>, String)>, CollectiveError> {
        Ok(None)
    }
    /// The design the last call ran, by its table name, for a method that picks one per call (the communicator's
    /// `auto`); `None` for a method that is one design.
    fn last_design(&self) -> Option<String> {
        None
    }
    /// Enqueues `call` on `stream`. Every rank must make the same calls, in the same order.
    ///
    /// # Safety
    /// `call` was checked for no more than this method's [`Collective::capacity_bytes`] and runs its
    /// [`Collective::op`]; its input and output are device memory of `stream`'s driver holding `call.count()` and
    /// `call.output_count()` elements, live and not touched by other work until the call has run.
    unsafe fn run(&mut self, call: &Call, stream: &Stream) -> Result<(), CollectiveError>;
}

/// Refuses world sizes the custom kernels cannot address.
pub fn check_world(method: &str, world: usize) -> Result<(), CollectiveError> {
    if world == 0 || world > MAX_RANKS {
        return Err(CollectiveError::Unsupported(format!("{method} supports 1 to {MAX_RANKS} ranks, not {world}")));
    }
    Ok(())
}

/// Elements of one shard of a two-shot allreduce: whole 128-byte lines (`vec` elements per 16-byte vector), so
/// shards start line-aligned; the last shard may be shorter or empty. Reduce-scatter uses exact `count / world`
/// shards instead.
pub fn shard_elems(count: usize, world: usize, vec: usize) -> usize {
    let line = vec * LINE_VECS;
    count.div_ceil(line).div_ceil(world) * line
}

/// Shard `s` of `[0, count)` for shards of `shard` elements.
pub fn shard_range(count: usize, shard: usize, s: usize) -> (usize, usize) {
    let lo = (s * shard).min(count);
    (lo, (lo + shard).min(count))
}

/// The part of `[lo, hi)` that block `b` of `grid` handles: contiguous chunks of whole 128-byte lines from `lo`.
pub fn block_range(lo: usize, hi: usize, b: usize, grid: usize, vec: usize) -> (usize, usize) {
    let line = vec * LINE_VECS;
    let per = (hi - lo).div_ceil(grid).div_ceil(line) * line;
    let start = (lo + b * per).min(hi);
    (start, (start + per).min(hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_each_shard_exactly_once() {
        for &(count, world, grid) in &[(1, 1, 1), (8, 3, 2), (1000, 8, 7), (1 << 20, 8, 24), (4099, 3, 64), (17, 8, 5)]
        {
            for dtype in DType::ALL {
                let vec = dtype.vec();
                let shard = shard_elems(count, world, vec);
                let mut seen = vec![0u8; count];
                for s in 0..world {
                    let (lo, hi) = shard_range(count, shard, s);
                    assert!(lo % (vec * LINE_VECS) == 0 || lo == count, "shards start on a 128-byte line");
                    for b in 0..grid {
                        let (a, z) = block_range(lo, hi, b, grid, vec);
                        assert!(lo <= a && a <= z && z <= hi);
                        assert!(a == hi || (a * dtype.size()) % LINE_BYTES == 0, "blocks start on a line");
                        seen[a..z].iter_mut().for_each(|x| *x += 1);
                    }
                }
                assert!(seen.iter().all(|&x| x == 1), "count {count} world {world} grid {grid}");
            }
        }
    }

    #[test]
    fn world_sizes_and_names() {
        assert!(check_world("car_1shot", 9).is_err());
        assert!(check_world("car_1shot", 8).is_ok());
        assert_eq!("bf16".parse::<DType>().unwrap(), DType::Bf16);
        assert!("int8".parse::<DType>().is_err());
        assert_eq!("reduce_scatter".parse::<Op>().unwrap(), Op::ReduceScatter);
        for name in ["all_gather", "allgather"] {
            assert_eq!(name.parse::<Op>().unwrap(), Op::AllGather);
        }
        assert_eq!(Op::AllGather.name(), "all_gather");
        assert_eq!(Op::AllGather.output_count(5, 3), 15);
        assert_eq!(
            [Op::AllReduce, Op::ReduceScatter, Op::AllGather].map(|op| op.output_capacity(64, 4)),
            [64, 64, 256]
        );
        assert_eq!(Algo::AllGather.method(Family::Car), Some("car_ag"));
        assert_eq!(Algo::AllGather.method(Family::Symm), None);
    }
}
