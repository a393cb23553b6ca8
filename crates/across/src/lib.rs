//! Collectives over several nodes, as serving stacks run tensor parallelism past one node: within each node the
//! ranks run our designs (an `allreduce::Communicator` of the node's ranks, with a job id of its own), and across
//! nodes NCCL/RCCL (loaded at run time), whose unique ids reach every rank over TCP (`bootstrap`). No data crosses
//! nodes by any other path.
//!
//! An allreduce runs one of two paths ([`Path`]): NCCL over the whole job, or hierarchically (reduce-scatter within
//! the node, an allreduce of each rank's shard across nodes over its rail, the ranks with its local rank, then an
//! all-gather within the node). Reduce-scatter and all-gather run NCCL over the whole job.

mod exchange;
mod paths;
mod tune;

pub use exchange::{Exchange, TcpExchange};
pub use paths::{PathEntry, PathKey, PathTable};

use allreduce::{Communicator, DType, Op, Options};
use collective_core::{Call, CollectiveError};
use gpu::{BorrowedStreams, DeviceBuffer, DevicePtr, DriverKind, MemKind};
use launch::{RankInfo, Topology};
use std::cell::{Cell, RefCell};
use std::fmt;
use std::hash::Hasher;

/// How an allreduce goes across nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Path {
    /// NCCL/RCCL over every rank of the job: the default until the paths are measured on the job's shape.
    Nccl,
    /// Reduce-scatter within the node (car), allreduce of the shard across nodes over the rail (NCCL/RCCL),
    /// all-gather within the node (car). Needs a count that divides by the node's ranks.
    Hierarchical,
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Path::Nccl => "nccl",
            Path::Hierarchical => "hierarchical",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Allreduce(#[from] allreduce::Error),
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    #[error(transparent)]
    Call(#[from] collective_core::CallError),
    #[error(transparent)]
    Gpu(#[from] gpu::GpuError),
    #[error(transparent)]
    Bootstrap(#[from] bootstrap::BootstrapError),
    #[error("the job's nodes: {0}")]
    Topology(#[from] launch::TopologyError),
    #[error("{0}")]
    Unsupported(String),
    #[error("invalid argument: {0}")]
    BadArgs(String),
    #[error("set-up across nodes: {0}")]
    Setup(String),
}

/// What every rank sends every other at set-up (JSON over the bootstrap): its host, the NCCL unique ids it made (its
/// rail's, if it is on node 0; the whole job's, if it is rank 0), or why it cannot go on, so that no rank waits for
/// one that failed.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct SetupBlob {
    host: String,
    rail_id: Option<Vec<u8>>,
    job_id: Option<Vec<u8>>,
    error: Option<String>,
}

/// What every rank sends every other once its node's communicator is up (or why it is not); rank 0 adds the path
/// table it found in its tune cache, which every rank then follows.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct ReadyBlob {
    error: Option<String>,
    paths: Option<PathTable>,
}

/// Every rank's `mine` (JSON through `exchange`), in rank order; a blob that does not parse names its rank.
fn gather_json<T: serde::Serialize + serde::de::DeserializeOwned>(
    exchange: &mut dyn Exchange,
    what: &str,
    mine: &T,
) -> Result<Vec<T>, Error> {
    let all = exchange.all_gather(&serde_json::to_vec(mine).expect("a blob serialises"))?;
    all.iter()
        .enumerate()
        .map(|(r, b)| serde_json::from_slice(b).map_err(|e| Error::Setup(format!("rank {r}'s {what} blob: {e}"))))
        .collect()
}

fn hostname() -> String {
    nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Refuses the host driver at once: across nodes the collectives run on NCCL/RCCL.
fn refuse_host(opts: &Options) -> Result<(), Error> {
    if opts.backend == gpu::Backend::Host {
        return Err(Error::Unsupported(
            "across nodes the collectives run on NCCL/RCCL, and the host driver has neither: run on a GPU driver \
             (cuda or hip)"
                .into(),
        ));
    }
    Ok(())
}

/// One rank's endpoint of a job over several nodes. Drop it only once the streams it ran on are idle.
pub struct Across {
    // Field order is drop order: the watchdog's thread first, then the NCCL communicators and the scratch before the
    // node's communicator.
    watchdog: nccl::Watchdog,
    rail: nccl::Nccl,
    job: nccl::Nccl,
    /// A rank's shard of the largest allreduce, between the hierarchical path's steps.
    scratch: DeviceBuffer,
    /// Caller streams seen so far.
    streams: RefCell<BorrowedStreams>,
    last: Cell<Option<Path>>,
    topology: Topology,
    capacity: usize,
    /// The path per size, as rank 0's tune cache held it (or as `tune` measured it); NCCL everywhere without one.
    paths: Option<PathTable>,
    path_key: PathKey,
    tune_dir: Option<std::path::PathBuf>,
    local: Communicator,
}

/// The job id of node `node`'s communicator: derived from the job's, so the ranks of one node agree on it and no two
/// nodes (emulated on one host, say) share a rendezvous.
fn node_job(job: &ipc::JobId, node: usize) -> ipc::JobId {
    let hex: String = (0u8..2)
        .map(|round| {
            let mut h = fnv::FnvHasher::default();
            h.write_u8(round);
            h.write(job.as_str().as_bytes());
            h.write_u64(node as u64);
            format!("{:016x}", h.finish())
        })
        .collect();
    ipc::JobId::parse(&hex).expect("32 hex digits")
}

impl Across {
    /// This rank's endpoint, its place read from the launcher's environment. Collective: every rank of the job.
    pub fn from_env(opts: Options) -> Result<Across, Error> {
        let info = launch::detect().map_err(allreduce::Error::from)?.ok_or(allreduce::Error::NoLauncher)?;
        Across::new(info, opts)
    }

    /// This rank's endpoint at `info`'s place, which must say the job's nodes (every launcher but a bare
    /// [`RankInfo::explicit`] does). Collective: every rank of the job calls it. The NCCL/RCCL ids travel over TCP to
    /// `MASTER_ADDR:MASTER_PORT` (or `ALLREDUCE_BOOTSTRAP_PORT`), within the set-up deadline.
    pub fn new(info: RankInfo, opts: Options) -> Result<Across, Error> {
        refuse_host(&opts)?;
        let mut tcp = TcpExchange::from_env(&info, opts.timeouts()?.1)?;
        Across::with_exchange(info, opts, &mut tcp)
    }

    /// As [`Across::new`], the set-up blobs exchanged through `exchange` (a store the program already has).
    pub fn with_exchange(info: RankInfo, opts: Options, exchange: &mut dyn Exchange) -> Result<Across, Error> {
        refuse_host(&opts)?;
        let topology = Topology::of(&info)?;
        let (_, setup) = opts.timeouts()?;
        let (l, node) = (topology.local_world(), topology.node());
        let job = node_job(&info.job, node);
        // The driver first, for the ids and the device count. The node's communicator opens it again; this handle
        // lives until then, so the device's primary context is retained once, not made, dropped and made again.
        let driver_opts =
            gpu::DriverOptions { device: None, local_rank: Some(topology.local_rank()), shm_prefix: job.shm_name("p") };
        let first = gpu::open(opts.backend, &driver_opts)?.gpu;
        let (kind, devices) = (first.kind(), first.info().count.max(1));
        // Ids: the first rank of each rail (node 0) makes its rail's, rank 0 the job's; a rank that cannot says why.
        let mut mine = SetupBlob { host: hostname(), ..SetupBlob::default() };
        let made = (|| -> Result<(), CollectiveError> {
            if kind == DriverKind::Host {
                return Err(CollectiveError::Unsupported("the host driver has no NCCL/RCCL".into()));
            }
            if node == 0 {
                mine.rail_id = Some(nccl::unique_id(kind)?);
            }
            if info.rank == 0 {
                mine.job_id = Some(nccl::unique_id(kind)?);
            }
            Ok(())
        })();
        if let Err(e) = made {
            mine.error = Some(e.to_string());
        }
        let blobs = gather_json(exchange, "set-up", &mine)?;
        if let Some((r, why)) = blobs.iter().enumerate().find_map(|(r, b)| b.error.as_ref().map(|e| (r, e))) {
            return Err(Error::Unsupported(format!("rank {r} cannot run NCCL/RCCL across nodes: {why}")));
        }
        // Ranks of several nodes on one host (emulated nodes) share its devices: the node's launch caps must leave
        // room for all of them.
        let on_host = blobs.iter().filter(|b| b.host == mine.host).count();
        let local_info = RankInfo {
            rank: topology.local_rank(),
            world: l,
            local_rank: topology.local_rank(),
            local_world: Some(l),
            job,
            launcher: info.launcher,
            node: Some(0),
            nodes: Some(1),
        };
        let capacity = opts.capacity_bytes;
        let tune_dir = opts.tune_dir.clone().or_else(allreduce::tune::cache_dir);
        let opts = Options { device_shared_by: Some(on_host.div_ceil(devices)), ..opts };
        // Every rank says whether its node's communicator came up before any rank enters NCCL's initialisation,
        // which waits for every rank of its communicator: a rank that failed stops the others here, not at the
        // set-up deadline there. Rank 0 sends the path table its cache holds for this job's shape.
        let local = Communicator::new(local_info, opts);
        drop(first);
        let path_key = local.as_ref().ok().map(|c| PathKey {
            driver: kind.to_string(),
            device: c.gpu().info().name.clone(),
            nodes: topology.nodes(),
            local_world: l,
            ranks_per_device: c.device_shared_by(),
        });
        let mut ready = ReadyBlob::default();
        match (&local, &path_key) {
            (Err(e), _) => ready.error = Some(format!("its node's communicator failed: {e}")),
            (Ok(_), Some(key)) if info.rank == 0 => match tune_dir.as_deref().map(|d| PathTable::find(key, d)) {
                Some(Err(e)) => ready.error = Some(e.to_string()),
                Some(Ok(found)) => ready.paths = found,
                None => {}
            },
            _ => {}
        }
        let ready = gather_json(exchange, "ready", &ready)?;
        if let Some((r, why)) = ready.iter().enumerate().find_map(|(r, b)| b.error.as_ref().map(|e| (r, e))) {
            return Err(Error::Setup(format!("rank {r}: {why}")));
        }
        let paths = ready.into_iter().next().and_then(|b| b.paths);
        let local = local?;
        let id = |b: &SetupBlob, rail: bool, r: usize| {
            let id = if rail { &b.rail_id } else { &b.job_id };
            id.clone().ok_or_else(|| Error::Setup(format!("rank {r} sent no {} id", if rail { "rail" } else { "job" })))
        };
        // Every rank makes its communicators in the same order (rail, then job): each initialisation waits (up to
        // the set-up deadline, then aborts) until the communicator's ranks all call it.
        let rail_root = topology.rail()[0];
        let shard_capacity = capacity.div_ceil(l).next_multiple_of(collective_core::VEC_BYTES);
        let rail_id = id(&blobs[rail_root], true, rail_root)?;
        let rail = (node, topology.nodes());
        let rail = nccl::Nccl::from_id(kind, "nccl_rail", shard_capacity, &rail_id, rail, setup)?;
        let job_id = id(&blobs[0], false, 0)?;
        let job = nccl::Nccl::from_id(kind, "nccl_job", capacity, &job_id, (info.rank, info.world), setup)?;
        let scratch = local.gpu().alloc(shard_capacity, MemKind::Device)?;
        let path_key = path_key.expect("the node's communicator is up");
        // A step's clock starts at its enqueue, so it also runs while the stream works through what came before it:
        // the set-up deadline (at least 60 s by default), not a call's, as torch gives its NCCL work minutes.
        // On a failure it also ends the node's communicator, whose kernels may wait on the same peers.
        let end_local = local.abort_handle();
        let end_local: Box<dyn Fn() + Send + Sync> = Box::new(move || {
            end_local.abort();
        });
        let peers = local.peer_processes().clone();
        let watchdog = nccl::Watchdog::start(local.gpu(), &[&rail, &job], Some(end_local), setup, peers)?;
        Ok(Across {
            watchdog,
            rail,
            job,
            scratch,
            streams: RefCell::default(),
            last: Cell::new(None),
            topology,
            capacity,
            paths,
            path_key,
            tune_dir,
            local,
        })
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The communicator of this rank's node.
    pub fn local(&self) -> &Communicator {
        &self.local
    }

    /// The path the last allreduce took.
    pub fn last_path(&self) -> Option<Path> {
        self.last.get()
    }

    /// The path table every rank follows (rank 0's cached one, or the last `tune`'s), if there is one.
    pub fn path_table(&self) -> Option<&PathTable> {
        self.paths.as_ref()
    }

    /// The path an allreduce of `count` elements of `dtype` takes when none is asked for: the path table's for its
    /// size (the hierarchical path only where the count divides among a node's ranks), else NCCL over the job.
    pub fn path_for(&self, count: usize, dtype: DType) -> Path {
        match self.paths.as_ref().map(|t| t.pick(count * dtype.size())) {
            Some(Path::Hierarchical) if count.is_multiple_of(self.topology.local_world()) => Path::Hierarchical,
            _ => Path::Nccl,
        }
    }

    /// Enqueues an allreduce of `count` elements of `dtype` from `input` into `output` (they may be the same
    /// buffer) on the caller's stream `stream`, over every rank of the job, by `path` (default:
    /// [`Across::path_for`]).
    ///
    /// # Safety
    /// As `allreduce::Communicator::issue`: `input` and `output` are device memory of this rank's device holding
    /// `count` elements until the stream has run the call, `stream` is a live stream of its context, and every rank
    /// makes the same calls in the same order.
    pub unsafe fn all_reduce(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DType,
        stream: u64,
        path: Option<Path>,
    ) -> Result<Path, Error> {
        self.failed()?;
        let path = path.unwrap_or_else(|| self.path_for(count, dtype));
        let world = self.topology.world();
        // Checked as a whole first, so a bad call fails before any step is enqueued.
        let call = Call::new(Op::AllReduce, dtype, input, output, count, world, self.capacity)?;
        let l = self.topology.local_world();
        match path {
            Path::Nccl => {
                // SAFETY: the caller's contract, for the whole call.
                unsafe { self.enqueue_on(stream, &self.job, &call)? };
            }
            Path::Hierarchical => {
                if !count.is_multiple_of(l) {
                    return Err(Error::BadArgs(format!(
                        "the hierarchical path splits {count} elements among a node's {l} ranks: they must divide"
                    )));
                }
                let (shard, scratch) = (count / l, self.scratch.ptr());
                let rail_call = Call::new(
                    Op::AllReduce,
                    dtype,
                    scratch,
                    scratch,
                    shard,
                    self.topology.nodes(),
                    self.scratch.bytes(),
                )?;
                // SAFETY (all three): the caller's contract for input and output; the scratch holds a shard of the
                // capacity; every step is on the caller's stream, in order.
                unsafe {
                    self.local.reduce_scatter(input, scratch, count, dtype, stream)?;
                    self.enqueue_on(stream, &self.rail, &rail_call)?;
                    self.local.all_gather(scratch, output, shard, dtype, stream)?;
                }
            }
        }
        self.last.set(Some(path));
        Ok(path)
    }

    /// Enqueues a reduce-scatter over every rank (NCCL/RCCL): rank r gets elements `[r * count / W, (r + 1) * count
    /// / W)` of the sum in `output`.
    ///
    /// # Safety
    /// As [`Across::all_reduce`], `output` holding `count / W` elements.
    pub unsafe fn reduce_scatter(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DType,
        stream: u64,
    ) -> Result<(), Error> {
        // SAFETY: the caller's contract.
        unsafe { self.on_job(Op::ReduceScatter, input, output, count, dtype, stream) }
    }

    /// Enqueues an all-gather over every rank (NCCL/RCCL): every rank gets every rank's `count` elements in rank
    /// order in `output` (`count * W` elements).
    ///
    /// # Safety
    /// As [`Across::all_reduce`], `output` holding `count * W` elements.
    pub unsafe fn all_gather(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DType,
        stream: u64,
    ) -> Result<(), Error> {
        // SAFETY: the caller's contract.
        unsafe { self.on_job(Op::AllGather, input, output, count, dtype, stream) }
    }

    /// `op` by NCCL/RCCL over the whole job, checked first.
    ///
    /// # Safety
    /// As [`Across::all_reduce`], `output` holding the op's output.
    unsafe fn on_job(
        &self,
        op: Op,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DType,
        stream: u64,
    ) -> Result<(), Error> {
        let call = Call::new(op, dtype, input, output, count, self.topology.world(), self.capacity)?;
        // SAFETY: the caller's contract.
        unsafe { self.enqueue_on(stream, &self.job, &call) }
    }

    /// Enqueues `call` on `nccl` on the caller's stream `raw` (borrowed once and remembered), under the watchdog,
    /// which gives each step the set-up deadline ([`nccl::Watchdog::enqueue`]).
    ///
    /// # Safety
    /// `raw` is a live stream of this rank's device context; as [`nccl::Nccl::enqueue`] for `call`.
    unsafe fn enqueue_on(&self, raw: u64, nccl: &nccl::Nccl, call: &Call) -> Result<(), Error> {
        self.failed()?;
        let mut streams = self.streams.borrow_mut();
        // SAFETY: the caller's contract.
        let k = unsafe { streams.position(self.local.gpu(), raw)? };
        // SAFETY: the caller's contract. The call was checked whole before: a refusal here is NCCL's own state (a
        // peer lost), which ends the endpoint.
        unsafe { self.watchdog.enqueue(nccl, call, &streams[k]) }.map_err(ended)
    }

    /// The failure that ended this endpoint, if any: a step past its deadline, a communicator's error or a step NCCL
    /// refused (the watchdog's; looked for now, not at the watchdog's next period), or a wait of the node's
    /// communicator. Every later call returns it.
    pub fn check(&self) -> Result<(), Error> {
        self.watchdog.check().map_err(ended)?;
        Ok(self.local.check()?)
    }

    /// The failure already recorded, without looking again: what every call checks first.
    fn failed(&self) -> Result<(), Error> {
        self.watchdog.failed().map_err(ended)?;
        Ok(self.local.check()?)
    }
}

/// The error of an endpoint the watchdog ended (a peer failure whose ranks NCCL does not say); other errors as they
/// are.
fn ended(e: CollectiveError) -> Error {
    match e {
        CollectiveError::Aborted(what) => allreduce::Error::Peer { ranks: Vec::new(), what }.into(),
        other => other.into(),
    }
}

/// The placement report of a job over nodes: this rank's place among the nodes, then its node's placement.
impl fmt::Display for Across {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.topology;
        writeln!(f, "# nodes: {} of {} ranks each; {t}", t.nodes(), t.local_world())?;
        writeln!(f, "# this node's ranks: {:?}; this rank's rail across nodes: {:?}", t.node_group(), t.rail())?;
        write!(f, "{}", self.local.placement())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_gets_its_own_job_id() {
        let job = ipc::JobId::parse("0123456789abcdef0123456789abcdef").unwrap();
        let ids: Vec<ipc::JobId> = (0..4).map(|n| node_job(&job, n)).collect();
        for (i, a) in ids.iter().enumerate() {
            assert_ne!(a, &job);
            assert_eq!(a, &node_job(&job, i), "every rank of a node derives the same");
            assert!(ids[..i].iter().all(|b| b != a), "nodes {i} and another share an id");
        }
    }

    #[test]
    fn the_host_driver_is_refused_at_once() {
        let job = ipc::JobId::random();
        let mut info = RankInfo::explicit(0, 8, 0, job).unwrap();
        (info.local_world, info.node, info.nodes) = (Some(4), Some(0), Some(2));
        let opts = Options { backend: gpu::Backend::Host, ..Options::default() };
        let started = std::time::Instant::now();
        let e = Across::new(info, opts).err().expect("refused");
        assert!(e.to_string().contains("NCCL/RCCL") && e.to_string().contains("host driver"), "{e}");
        // Well short of the set-up deadline (60 s at least) a refusal that waited for peers would reach.
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "refused after {:?}", started.elapsed());
    }
}
