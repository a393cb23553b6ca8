//! The communicator: one per rank, built from the launcher's environment or from explicit coordinates; it opens the
//! local rank's device, agrees on placement, builds the engine once, and runs allreduce / reduce-scatter /
//! all-gather on the caller's stream and buffers with the algorithm its tune table names for the size, mode and
//! residency (car's one algorithm for reduce-scatter and for all-gather).

mod host_slices;
mod register;
mod tuning;
mod watch;

use crate::engine::Engine;
use crate::placement::{decode_links, encode_links, Placement, RankDevice};
use crate::tune::{self, Algorithm, Choice, LoadedTable, Mode, Residency, TableKey, TableSource, Tables, TuneTable};
use crate::Error;
use collective_core::{AddRmsNorm, Call, DType, Op, PeerProcesses, Team, MAX_RANKS};
use gpu::{Backend, BorrowedStreams, DeviceBuffer, DevicePtr, Gpu, Stream};
use ipc::{Rendezvous, RendezvousOptions};
use launch::RankInfo;
pub use register::CAPTURE_SLOTS;
use register::{Capture, DeferredCall, Imports, PeerTables, Registration};
use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use symm::tuned::{Deferred, PeerBuffers};
pub use tuning::{Measured, TuneReport, TuneRequest, NORM_HIDDEN};
use watch::Watch;
pub use watch::{AbortHandle, Failure};

/// How a communicator is built.
#[derive(Clone, Debug)]
pub struct Options {
    /// Which driver: `Auto` takes hip, then cuda, where its library loads and sees a device, else the host driver.
    pub backend: Backend,
    /// The largest message in bytes (every rank must give the same); the registered buffers are this large.
    pub capacity_bytes: usize,
    /// How long any rank waits for a peer inside a call [default: `ALLREDUCE_TIMEOUT_S`, else 10 s].
    pub timeout: Option<Duration>,
    /// How long set-up may wait for a peer (cold kernel compiles on every rank take longer than a call)
    /// [default: `ALLREDUCE_SETUP_TIMEOUT_S`, else six times the call timeout, at least 60 s].
    pub setup_timeout: Option<Duration>,
    /// Where tune tables are cached [default: [`tune::cache_dir`]].
    pub tune_dir: Option<PathBuf>,
    /// One table for both modes instead of the cached or built-in ones (comm-bench's `--tune_table`).
    pub tune_table: Option<PathBuf>,
    /// How many ranks in all run kernels on each of this communicator's devices at once, where ranks of other
    /// communicators or jobs share them (several emulated nodes on one host, say): the launch caps then leave room
    /// for all of them, since a barrier whose peer's blocks cannot become resident waits until the deadline
    /// [default: this communicator's own ranks per device].
    pub device_shared_by: Option<usize>,
}

impl Options {
    /// The call timeout and the set-up timeout these options give: each as set, else from the environment, else
    /// the defaults (10 s; six times the call timeout, at least 60 s).
    pub fn timeouts(&self) -> Result<(Duration, Duration), Error> {
        let timeout = match self.timeout {
            Some(t) => t,
            None => deadline::timeout_from_env().map_err(Error::BadArgs)?,
        };
        let setup = match self.setup_timeout {
            Some(t) => t,
            None => deadline::seconds_from_env(deadline::SETUP_TIMEOUT_ENV)
                .map_err(Error::BadArgs)?
                .unwrap_or((timeout * 6).max(Duration::from_secs(60))),
        };
        Ok((timeout, setup))
    }
}

impl Default for Options {
    fn default() -> Options {
        Options {
            backend: Backend::Auto,
            capacity_bytes: 32 << 20,
            timeout: None,
            setup_timeout: None,
            tune_dir: None,
            tune_table: None,
            device_shared_by: None,
        }
    }
}

/// One rank's endpoint of an intra-node allreduce job. Drop it only once the streams it ran on are idle: its buffers
/// are unmapped after a barrier of every rank.
///
/// ```
/// use allreduce::{Communicator, Options};
/// use launch::RankInfo;
///
/// // A job of one rank on the host driver; under torchrun, mpirun, srun or comm-bench's launcher,
/// // `Communicator::from_env` reads the same from the environment.
/// let me = RankInfo::explicit(0, 1, 0, ipc::JobId::random()).unwrap();
/// let mut comm = Communicator::new(me, Options { backend: gpu::Backend::Host, capacity_bytes: 1 << 16, ..Default::default() }).unwrap();
/// let input = vec![1.5f32; 1000];
/// let mut output = vec![0f32; 1000];
/// let algo = comm.all_reduce_host(&input, &mut output).unwrap();
/// assert_eq!(output, input);
/// println!("ran {algo} following {}", comm.table_source(allreduce::Mode::Eager, allreduce::Residency::Caller));
/// ```
pub struct Communicator {
    // Field order is drop order: the engine and the mappings go before the rendezvous and the driver.
    engine: Engine,
    reduce_scatter: car::Car,
    all_gather: car::Car,
    registrations: Vec<Registration>,
    next_registration: usize,
    /// What calls change; calls take `&self`, as NCCL's take a communicator handle.
    state: RefCell<CallState>,
    /// The peers' buffers mapped for past captures.
    capture_mappings: Vec<Arc<DeviceBuffer>>,
    imports: Imports,
    /// The status words the kernels' waits watch, the watchdog, and the failure that poisons every later call.
    watch: Watch,
    own: Stream,
    last: Cell<Option<Choice>>,
    capacity: usize,
    /// How long set-up waited for a peer at most ([`Options::setup_timeout`]).
    setup_timeout: Duration,
    /// Ranks whose kernels share each of this communicator's devices (its launch caps leave room for all).
    device_shared_by: usize,
    tune_dir: Option<PathBuf>,
    /// Whether the caller named the tables to follow ([`Options::tune_table`]), which a tune then leaves in place.
    named_tables: bool,
    placement: Placement,
    notes: Vec<String>,
    rdv: Rendezvous,
    gpu: Gpu,
}

/// Ranks whose kernels share each device: the communicator's own per device, or what the options say if more.
fn sharers(placement: &Placement, opts: &Options) -> usize {
    placement.ranks_per_device.max(opts.device_shared_by.unwrap_or(1))
}

/// What a caller asked a call to run.
#[derive(Clone, Copy)]
enum Ask {
    /// The table's choice for the call's size, mode and residency.
    Table,
    /// This one.
    Choice(Choice),
    /// The unfused sequence after this allreduce, or after the plain allreduces' table's.
    Unfused(Option<Algorithm>),
}

impl Ask {
    /// The algorithm asked for by name, if any.
    fn algorithm(self) -> Option<Algorithm> {
        match self {
            Ask::Table | Ask::Unfused(None) => None,
            Ask::Choice(c) => Some(c.algorithm),
            Ask::Unfused(a) => a,
        }
    }
}

/// The part of a communicator its calls change.
#[derive(Default)]
struct CallState {
    /// The graph capture being recorded, and the peer tables of its calls.
    capture: Option<Capture>,
    peer_tables: PeerTables,
    /// Caller streams seen so far.
    streams: BorrowedStreams,
    /// Where the host-slice calls stage slices that are not 16-byte aligned.
    scratch: Option<DeviceBuffer>,
}

impl Communicator {
    /// This rank's communicator, its place read from the launcher's environment (our launcher, torchrun, OpenMPI's
    /// mpirun, srun, MPICH / Intel MPI). Collective: every rank of the job calls it.
    pub fn from_env(opts: Options) -> Result<Communicator, Error> {
        let info = launch::detect()?.ok_or(Error::NoLauncher)?;
        Communicator::new(info, opts)
    }

    /// This rank's communicator at an explicit place. Collective: every rank of the job calls it.
    pub fn new(info: RankInfo, opts: Options) -> Result<Communicator, Error> {
        let (timeout, setup) = opts.timeouts()?;
        if opts.capacity_bytes == 0 {
            return Err(Error::BadArgs("capacity_bytes must be at least 1".into()));
        }
        if opts.device_shared_by == Some(0) {
            return Err(Error::BadArgs("device_shared_by must be at least 1 (the ranks sharing a device)".into()));
        }
        // Said at once: the ranks on other nodes could never arrive through this node's shared memory.
        if let Some(here) = info.spans_nodes() {
            return Err(Error::Unsupported(format!(
                "this job spans nodes ({} ranks, {here} on this host, as {} says): the communicator runs within one \
                 node; across nodes, build `across::Across` (our designs within each node, NCCL/RCCL across them)",
                info.world, info.launcher
            )));
        }
        if info.world > MAX_RANKS {
            return Err(Error::Unsupported(format!(
                "{} ranks: the communicator's algorithms run 1 to {MAX_RANKS} ranks (one node)",
                info.world
            )));
        }
        let driver_opts =
            gpu::DriverOptions { device: None, local_rank: Some(info.local_rank), shm_prefix: info.job.shm_name("g") };
        let opened = gpu::open(opts.backend, &driver_opts)?;
        let gpu = opened.gpu;
        let rdv = Rendezvous::join(
            &info.job,
            info.rank,
            info.world,
            RendezvousOptions { timeout: setup, ..Default::default() },
        )?;
        let built = Communicator::build(info, &opts, gpu.clone(), &rdv, opened.notes, timeout);
        match built {
            Ok((engine, [reduce_scatter, all_gather], placement, notes, own, watch)) => {
                rdv.set_timeout(timeout);
                Ok(Communicator {
                    engine,
                    reduce_scatter,
                    all_gather,
                    registrations: Vec::new(),
                    next_registration: 0,
                    state: RefCell::default(),
                    capture_mappings: Vec::new(),
                    imports: Imports::default(),
                    watch,
                    own,
                    last: Cell::new(None),
                    capacity: opts.capacity_bytes,
                    setup_timeout: setup,
                    device_shared_by: sharers(&placement, &opts),
                    named_tables: opts.tune_table.is_some(),
                    tune_dir: opts.tune_dir.or_else(tune::cache_dir),
                    placement,
                    notes,
                    rdv,
                    gpu,
                })
            }
            Err(e) => {
                rdv.abort(&e.to_string());
                Err(e)
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn build(
        info: RankInfo,
        opts: &Options,
        gpu: Gpu,
        rdv: &Rendezvous,
        mut notes: Vec<String>,
        timeout: Duration,
    ) -> Result<(Engine, [car::Car; 2], Placement, Vec<String>, Stream, Watch), Error> {
        let i = gpu.info();
        let host = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
        let me = RankDevice {
            rank: info.rank,
            local_rank: info.local_rank,
            host,
            ordinal: i.ordinal,
            bus_id: i.bus_id.clone(),
            visible: i.count,
        };
        let reports = rdv.all_gather("placement", &me.encode())?;
        let reports = reports.iter().map(|b| RankDevice::decode(b)).collect::<Result<Vec<_>, _>>();
        let placement = Placement::agree(reports.map_err(Error::Placement)?)?;
        let row = placement.ranks.iter().map(|d| gpu.peer_link(&d.bus_id)).collect::<Result<Vec<_>, _>>()?;
        let rows = rdv.all_gather("peer links", &encode_links(&row))?;
        let rows = rows.iter().map(|b| decode_links(b)).collect::<Result<Vec<_>, _>>().map_err(Error::Placement)?;
        let placement = placement.with_links(rows)?;
        // The settings that must agree, so a mismatch is named here rather than found at a kernel's deadline.
        let mine = format!(
            "driver={}\ncapacity_bytes={}\ntimeout_ns={}\ntune_table={:?}\ndevice_shared_by={:?}\n",
            i.kind,
            opts.capacity_bytes,
            timeout.as_nanos(),
            opts.tune_table,
            opts.device_shared_by
        );
        crate::agree(rdv, "communicator options", &mine)?;
        // Tables are keyed by the sharing of a device too: under MPS peers' buffers are local memory, not a link.
        let shape = (info.world, sharers(&placement, opts));
        let tables = match &opts.tune_table {
            Some(path) => {
                let set = TuneTable::load_set(path)?;
                Tables::try_from_fn(|op, mode, residency| {
                    let key = TableKey::new(i.kind, &i.name, shape, mode, residency).for_op(op);
                    let picked = TuneTable::pick(&set, &key);
                    picked.map(|(t, _)| LoadedTable::new(t, TableSource::File(path.clone()))).transpose()
                })?
            }
            None => {
                let dir = opts.tune_dir.clone().or_else(tune::cache_dir);
                Tables::try_from_fn(|op, mode, residency| {
                    let key = TableKey::new(i.kind, &i.name, shape, mode, residency).for_op(op);
                    TuneTable::find(&key, i.kind, dir.as_deref())
                })?
            }
        };
        // Every rank follows the same tables, or they would run different kernels for one call.
        let all: Vec<&TuneTable> = tables.iter().map(|t| &t.3.table).collect();
        crate::agree(rdv, "tune tables", &serde_json::to_string(&all).expect("tables serialise"))?;
        // One note for the built-in set (deduplicated below), one per table measured for another job than this.
        for (_, _, _, t) in tables.iter() {
            if let TableSource::BuiltIn { what, used_for, why } = &t.source {
                notes.push(format!("no tune table cached for this machine: using the built-in {what} (run tune)"));
                if why != "its key matches" {
                    notes.push(format!("the table for {used_for} was {why}"));
                }
            }
        }
        if Mode::ALL.iter().any(|&m| Residency::ALL.iter().any(|&r| tables.norm(m, r).is_none())) {
            notes.push(
                "no tune table for calls with the residual add and RMSNorm in some mode or residency: those take the \
                 engine's rule (car's fused one-shot, its two-shot from 1 MiB; measured on one H200 under MPS); \
                 tune to measure them"
                    .into(),
            );
        }
        let no_atomics = placement.missing_peer_atomics();
        let peers = PeerProcesses::gather(rdv)?;
        if !peers.hidden().is_empty() {
            notes.push(format!(
                "the processes of ranks {:?} on this host are not visible from here (another pid namespace?): their \
                 death is found by the kernels' deadline only",
                peers.hidden()
            ));
        }
        let watch = Watch::start(&gpu, peers)?;
        let team = Team::new(&gpu, rdv, sharers(&placement, opts))
            .with_kernel_timeout(timeout)
            .with_missing_peer_atomics(no_atomics.as_deref())
            .with_status(watch.status());
        notes.extend(team.spare_unit_note());
        let engine = Engine::new(team, opts.capacity_bytes, tables)?;
        let car_opts = car::CarOptions {
            capacity_bytes: opts.capacity_bytes,
            uncached: true,
            rule: None,
            variant: car::Variant::Base,
        };
        let reduce_scatter = car::Car::new(team, car::Algo::ReduceScatter, car_opts)?;
        let all_gather = car::Car::new(team, car::Algo::AllGather, car_opts)?;
        notes.extend(engine.unfit());
        if let Some(why) = reduce_scatter.unfit() {
            notes.push(format!("{why}: reduce-scatter along the last dimension is refused"));
        }
        let mut seen = std::collections::HashSet::new();
        notes.retain(|n| seen.insert(n.clone()));
        Ok((engine, [reduce_scatter, all_gather], placement, notes, gpu.stream()?, watch))
    }

    pub fn rank(&self) -> usize {
        self.rdv.rank()
    }
    pub fn world(&self) -> usize {
        self.rdv.world()
    }
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
    pub fn rendezvous(&self) -> &Rendezvous {
        &self.rdv
    }
    /// The largest message, in bytes.
    pub fn capacity_bytes(&self) -> usize {
        self.capacity
    }
    /// How long set-up waited for a peer at most: the deadline work that queues deep (an NCCL step beside this
    /// communicator, say) gets, where a call's would end healthy programs.
    pub fn setup_timeout(&self) -> Duration {
        self.setup_timeout
    }
    /// Which device every rank runs on.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }
    /// How many ranks run kernels on each of this communicator's devices: its own per device, or
    /// [`Options::device_shared_by`] where that is more. Every design's launch caps leave room for all of them.
    pub fn device_shared_by(&self) -> usize {
        self.device_shared_by
    }
    /// What set-up decided on the caller's behalf (drivers passed over, built-in tables in use, kernels the device
    /// fits no block of, dropped, and what runs instead).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }
    /// The algorithm the last call ran.
    pub fn last_algorithm(&self) -> Option<Algorithm> {
        self.last.get().map(|c| c.algorithm)
    }
    /// What the last call ran: its algorithm, and whether a norm ran after it rather than in its kernel.
    pub fn last_choice(&self) -> Option<Choice> {
        self.last.get()
    }
    /// The table calls issued in `mode` on buffers in `residency` follow.
    pub fn tune_table(&self, mode: Mode, residency: Residency) -> &TuneTable {
        &self.engine.table(mode, residency).table
    }
    /// Every table, ready for the launch path.
    pub fn tables(&self) -> &Tables {
        self.engine.tables()
    }
    /// Where the table of `mode` and `residency` came from.
    pub fn table_source(&self, mode: Mode, residency: Residency) -> &TableSource {
        &self.engine.table(mode, residency).source
    }

    /// The registered input: a caller that writes its input here saves the zero-copy designs their copy-in
    /// (torch's "allocate the tensor in symmetric memory").
    pub fn registered_input(&self) -> &DeviceBuffer {
        self.engine.registered_input()
    }
    /// The registered output, which the zero-copy two-shot's peers write into directly.
    pub fn registered_output(&self) -> &DeviceBuffer {
        self.engine.registered_output()
    }

    /// Checks a request once, before anything is enqueued: the value every call below takes as it is.
    pub fn call(&self, op: Op, dtype: DType, input: DevicePtr, output: DevicePtr, count: usize) -> Result<Call, Error> {
        let call = Call::new(op, dtype, input, output, count, self.world(), self.capacity)?;
        // The registered buffers are the zero-copy designs' own: an allreduce on them starts at their start, since a
        // copy into or out of them from a range inside them would overlap itself.
        if op == Op::AllReduce {
            let bufs = [("input", input, self.registered_input()), ("output", output, self.registered_output())];
            for (what, p, b) in bufs {
                if p.0 > b.ptr().0 && p.0 < b.ptr().0 + b.bytes() as u64 {
                    return Err(Error::BadArgs(format!(
                        "{what} {:#x} lies {} bytes into the registered {what}: pass the registered buffer from its start",
                        p.0,
                        p.0 - b.ptr().0
                    )));
                }
            }
        }
        Ok(call)
    }

    /// Enqueues a checked call ([`Communicator::call`]) on the caller's stream `stream` (a `CUstream` /
    /// `hipStream_t`, or a host-driver stream handle) with the algorithm chosen by the caller (`None`: by the tune
    /// table; an allreduce only, as NCCL_ALGO for NCCL: every rank must choose alike), and returns the algorithm
    /// it ran. It does not wait: the result is there once the stream has run it. Issued while the stream is
    /// capturing, it is captured into the caller's graph, and every replay runs it again.
    ///
    /// # Safety
    /// - the call's input and output are device memory of this communicator's device, holding its count and
    ///   output count of elements, live and untouched by other work until the stream has run the call;
    /// - `stream` is a live stream of this device's context that outlives the communicator's use of it (the
    ///   communicator remembers it by handle);
    /// - every rank makes the same calls, with the same counts and dtypes, in the same order, each rank either
    ///   capturing or not;
    /// - where the input or output lies in a buffer passed to [`Communicator::register`], every rank's lies in
    ///   its own buffer of that registration, at the same offset.
    ///
    /// Where one rank's input is its [registered input](Communicator::registered_input), every rank's should be:
    /// `auto` picks by where the buffers lie, and ranks that run different kernels on one call fail it (every epoch
    /// flag names the kernel that stored it, so a barrier that meets a peer at its epoch in another kernel records
    /// [`Error::Peer`] naming the peer and both kernels; designs of different flag arrays end at the deadline), and
    /// the communicator with it.
    pub unsafe fn issue(&self, call: Call, algo: Option<Algorithm>, stream: u64) -> Result<Algorithm, Error> {
        let ask = algo.map_or(Ask::Table, |a| Ask::Choice(Choice::of(a)));
        // SAFETY: the caller's contract.
        unsafe { self.issue_choice(call, ask, stream) }.map(|c| c.algorithm)
    }

    /// [`Communicator::issue`] with a [`Choice`] (a norm table's): `unfused` runs the norm after the allreduce, as
    /// [`Communicator::issue_unfused`]; returns what ran, unfused wherever the norm ran after the allreduce.
    ///
    /// # Safety
    /// As [`Communicator::issue`].
    pub unsafe fn issue_as(&self, call: Call, choice: Choice, stream: u64) -> Result<Choice, Error> {
        // SAFETY: the caller's contract.
        unsafe { self.issue_choice(call, Ask::Choice(choice), stream) }
    }

    /// The one path of every issue.
    ///
    /// # Safety
    /// As [`Communicator::issue`].
    unsafe fn issue_choice(&self, call: Call, ask: Ask, stream: u64) -> Result<Choice, Error> {
        call.checked_for(self.world(), self.capacity)?;
        if let Some(f) = self.watch.failure() {
            return Err(Error::Peer { ranks: f.ranks, what: f.what });
        }
        // SAFETY (every arm): the caller's contract.
        let issued = match call.op() {
            Op::AllReduce => unsafe { self.issue_all_reduce(call, ask, stream) },
            Op::ReduceScatter => unsafe {
                self.issue_car(&self.reduce_scatter, Algorithm::CarReduceScatter, call, ask, stream).map(Choice::of)
            },
            Op::AllGather => unsafe {
                self.issue_car(&self.all_gather, Algorithm::CarAllGather, call, ask, stream).map(Choice::of)
            },
        };
        let ran = issued.map_err(|e| self.poisoned_by(e))?;
        self.last.set(Some(ran));
        Ok(ran)
    }

    /// A host kernel's wait that ended without its peers, or met one in another kernel, poisons the communicator, as
    /// a device kernel's record in the status words does; any other error is returned as it is.
    fn poisoned_by(&self, e: Error) -> Error {
        let fault = match &e {
            Error::Gpu(gpu::GpuError::Kernel { fault, .. }) => fault,
            Error::Collective(collective_core::CollectiveError::Gpu(gpu::GpuError::Kernel { fault, .. })) => fault,
            _ => return e,
        };
        let failure = match fault {
            gpu::KernelFault::Wait(deadline::WaitError::TimedOut(t)) => {
                let what = format!("never arrived ({}; timed out after {:?})", t.what, t.timeout);
                Failure { ranks: t.missing.clone(), what }
            }
            gpu::KernelFault::Wait(deadline::WaitError::Aborted { what, reason }) => {
                Failure { ranks: Vec::new(), what: format!("{what}: {reason}") }
            }
            gpu::KernelFault::Mismatch { peer, ours, theirs } => {
                Failure { ranks: vec![*peer], what: gpu::mismatch(ours, theirs) }
            }
            gpu::KernelFault::Other(_) => return e,
        };
        self.watch.fail(failure);
        let f = self.watch.failure().expect("recorded above");
        Error::Peer { ranks: f.ranks, what: f.what }
    }

    /// Whether every call so far could run: after a graph replay (or any time), the failure the kernels' status
    /// words record, read now. A failed communicator stays failed: every later call returns the same error.
    pub fn check(&self) -> Result<(), Error> {
        match self.watch.check() {
            Some(f) => Err(Error::Peer { ranks: f.ranks, what: f.what }),
            None => Ok(()),
        }
    }

    /// A handle that ends this communicator from any thread ([`AbortHandle::abort`]), as `ncclCommAbort`.
    pub fn abort_handle(&self) -> AbortHandle {
        self.watch.abort_handle()
    }

    /// The processes of the peers on this host that its watchdog watches (another watchdog, NCCL's say, may
    /// watch them too).
    pub fn peer_processes(&self) -> &PeerProcesses {
        self.watch.peers()
    }

    /// Enqueues an allreduce of `count` elements of `dtype` from `input` into `output` (they may be the same
    /// buffer) on the caller's stream `stream`: [`Communicator::call`], then [`Communicator::issue`].
    ///
    /// # Safety
    /// As [`Communicator::issue`].
    pub unsafe fn all_reduce(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DType,
        stream: u64,
    ) -> Result<Algorithm, Error> {
        let call = self.call(Op::AllReduce, dtype, input, output, count)?;
        // SAFETY: the caller's contract.
        unsafe { self.issue(call, None, stream) }
    }

    /// Enqueues an allreduce followed by the residual add and RMSNorm of `norm` ([`AddRmsNorm`], serving stacks'
    /// fused epilogue): `r = residual + sum` written back to the residual, `y = r / sqrt(mean(r^2) + eps) * weight`
    /// per row of `norm.hidden` elements into `output` (which may be `input`). Every rank and every algorithm gives
    /// the same bits, fused or not; `count` is a whole number of rows.
    ///
    /// # Safety
    /// As [`Communicator::issue`], for the residual (`count` elements, written) and the weight (`hidden`) too.
    pub unsafe fn all_reduce_add_rms_norm(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DType,
        norm: AddRmsNorm,
        stream: u64,
    ) -> Result<Algorithm, Error> {
        let call = self.call(Op::AllReduce, dtype, input, output, count)?.with_add_rms_norm(norm)?;
        // SAFETY: the caller's contract.
        unsafe { self.issue(call, None, stream) }
    }

    /// Issues a call with the residual add and RMSNorm as the unfused sequence: its allreduce (`algo`, else the
    /// plain allreduces' table's), then the norm kernel over the result on the same stream. For comparison with the
    /// fused designs, which [`Communicator::issue`] runs where the design carries the norm; the bits are the same.
    ///
    /// # Safety
    /// As [`Communicator::issue`].
    pub unsafe fn issue_unfused(&self, call: Call, algo: Option<Algorithm>, stream: u64) -> Result<Algorithm, Error> {
        if call.norm().is_none() {
            return Err(Error::BadArgs("issue_unfused runs a call with a residual add and RMSNorm".into()));
        }
        // SAFETY: the caller's contract.
        unsafe { self.issue_choice(call, Ask::Unfused(algo), stream) }.map(|c| c.algorithm)
    }

    /// Enqueues a reduce-scatter: rank r receives elements `[r * count / W, (r + 1) * count / W)` of the sum in
    /// `output` (`count / W` elements). `count` must divide by the world size; input and output may not overlap.
    ///
    /// # Safety
    /// As [`Communicator::issue`].
    pub unsafe fn reduce_scatter(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DType,
        stream: u64,
    ) -> Result<Algorithm, Error> {
        let call = self.call(Op::ReduceScatter, dtype, input, output, count)?;
        // SAFETY: the caller's contract.
        unsafe { self.issue(call, None, stream) }
    }

    /// Enqueues a reduce-scatter split along the last dimension (car's `split_last_dim`): `input` holds rows of
    /// `row_len` elements (`count` in all), and rank r receives columns `[r * row_len / W, (r + 1) * row_len / W)`
    /// of every row in `output`, densely (`count / W` elements). `row_len` divides `count` and divides by `W`.
    ///
    /// # Safety
    /// As [`Communicator::issue`].
    pub unsafe fn reduce_scatter_last_dim(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        row_len: usize,
        dtype: DType,
        stream: u64,
    ) -> Result<Algorithm, Error> {
        let call = self.call(Op::ReduceScatter, dtype, input, output, count)?.with_split_last_dim(row_len)?;
        // SAFETY: the caller's contract.
        unsafe { self.issue(call, None, stream) }
    }

    /// Enqueues an all-gather: every rank receives every rank's `count` elements in rank order in `output`
    /// (`count * W` elements, rank r's from element `r * count`); input and output may not overlap.
    ///
    /// # Safety
    /// As [`Communicator::issue`].
    pub unsafe fn all_gather(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DType,
        stream: u64,
    ) -> Result<Algorithm, Error> {
        let call = self.call(Op::AllGather, dtype, input, output, count)?;
        // SAFETY: the caller's contract.
        unsafe { self.issue(call, None, stream) }
    }

    /// Forgets `raw`, a stream this communicator was called on that the caller is about to destroy, so a later
    /// stream that reuses its handle is borrowed afresh.
    pub fn forget_stream(&self, raw: u64) {
        self.state.borrow_mut().streams.forget(raw);
    }

    /// The peers' addresses of `ptr` when it lies in a registered buffer.
    fn registered_peers(&self, ptr: DevicePtr, bytes: usize) -> Option<[u64; MAX_RANKS]> {
        let r =
            self.registrations.iter().find(|r| ptr.0 >= r.ptr.0 && ptr.0 + bytes as u64 <= r.ptr.0 + r.bytes as u64)?;
        let offset = ptr.0 - r.ptr.0;
        let mut peers = r.peers;
        peers.iter_mut().take(self.world()).for_each(|p| *p += offset);
        Some(peers)
    }

    /// A reduce-scatter or all-gather, which `car` alone runs, as `runs` (the one algorithm a caller may force).
    ///
    /// # Safety
    /// As [`Communicator::issue`].
    unsafe fn issue_car(
        &self,
        car: &car::Car,
        runs: Algorithm,
        call: Call,
        ask: Ask,
        stream: u64,
    ) -> Result<Algorithm, Error> {
        if let Some(a) = ask.algorithm().filter(|&a| a != runs) {
            return Err(Error::BadArgs(format!("{a} does not run {}", call.op())));
        }
        let mut state = self.state.borrow_mut();
        let k = state.caller_stream(&self.gpu, stream)?;
        // SAFETY: the caller's contract; the call was checked for this communicator's capacity.
        unsafe { car.enqueue(&call, &state.streams[k])? };
        Ok(runs)
    }

    /// An allreduce: its residency, its algorithm (the table's for the size, mode and residency, or `algo`), and,
    /// for a call captured on unregistered buffers, its peer table.
    ///
    /// # Safety
    /// As [`Communicator::issue`].
    unsafe fn issue_all_reduce(&self, call: Call, ask: Ask, stream: u64) -> Result<Choice, Error> {
        if let Some(a) = ask.algorithm().filter(|a| !Algorithm::CANDIDATES.contains(a)) {
            return Err(Error::BadArgs(format!("{a} is not an allreduce algorithm")));
        }
        let mut state = self.state.borrow_mut();
        let k = state.caller_stream(&self.gpu, stream)?;
        let bytes = call.bytes();
        let mut peers = PeerBuffers {
            inputs: self.registered_peers(call.input(), bytes),
            outputs: self.registered_peers(call.output(), bytes),
            deferred: None,
        };
        let registered_input = self.engine.residency_of(call.input()) == Residency::Registered;
        // A capture being recorded defers the peers' views of buffers no registration holds.
        let deferring = state.capture.is_some()
            && peers.inputs.is_none()
            && !registered_input
            && state.streams[k].is_capturing()?;
        let residency = match () {
            _ if registered_input => Residency::Registered,
            _ if peers.inputs.is_some() || deferring => Residency::CallerRegistered,
            _ => Residency::Caller,
        };
        let call = call.in_residency(residency);
        let choice = match (ask, call.norm()) {
            (Ask::Choice(c), _) => c,
            (Ask::Unfused(Some(a)), _) => Choice::unfused(a),
            (Ask::Unfused(None), _) => {
                Choice::unfused(self.engine.choose(bytes, residency, &state.streams[k])?.algorithm)
            }
            (Ask::Table, Some(norm)) => self.engine.choose_norm(&call, &norm, residency, &state.streams[k])?,
            (Ask::Table, None) => self.engine.choose(bytes, residency, &state.streams[k])?,
        };
        // Only a design that reads its peers' buffers in place needs their addresses deferred.
        let slot = if deferring && self.engine.reads_peer_buffers(choice, &call) {
            state.deferred_slot(&self.gpu, &call, &mut peers)
        } else {
            None
        };
        // SAFETY: the caller's contract, which is Engine::run's; a deferred call's table holds the registered
        // buffers' addresses until end_graph_capture fills it.
        let used = unsafe { self.engine.run(choice, &call, &peers, &state.streams[k])? };
        if let (Some(used), Some((slot, input, output))) = (used, slot) {
            let capture = state.capture.as_mut().expect("deferring");
            capture.calls.push(DeferredCall { slot, bytes, used, input, output });
        }
        // What ran: a packet design asked for beyond its area runs its stand-in.
        Ok(self.engine.runs_as(choice, &call))
    }
}

impl CallState {
    /// The caller's stream, borrowed once and remembered by handle.
    fn caller_stream(&mut self, gpu: &Gpu, raw: u64) -> Result<usize, Error> {
        // SAFETY: the caller's contract on `issue`: `raw` is a live stream of this device's context.
        Ok(unsafe { self.streams.position(gpu, raw)? })
    }

    /// A peer table for a call captured on unregistered buffers, and the exports of its input and output (taken
    /// now, while their memory is surely allocated); None when the capture's slots are used up.
    #[allow(clippy::type_complexity)]
    fn deferred_slot(
        &mut self,
        gpu: &Gpu,
        call: &Call,
        peers: &mut PeerBuffers,
    ) -> Option<(usize, Option<gpu::SharedRange>, Option<gpu::SharedRange>)> {
        let capture = self.capture.as_mut().expect("only while recording");
        let Some((slot, table)) = self.peer_tables.take() else {
            capture.fallbacks.push(("input and output", format!("more than {CAPTURE_SLOTS} calls in one capture")));
            return None;
        };
        let mut share = |what: &'static str, ptr: DevicePtr| match gpu.share_range(ptr, call.bytes()) {
            Ok(r) => Some(r),
            Err(e) => {
                capture.fallbacks.push((what, format!("the {what} at {:#x} cannot be shared ({e})", ptr.0)));
                None
            }
        };
        let input = share("input", call.input());
        let output = share("output", call.output());
        peers.deferred = Some(Deferred { table, input_shareable: input.is_some(), output_shareable: output.is_some() });
        Some((slot, input, output))
    }
}

impl Drop for Communicator {
    /// Peers may still read this rank's buffers: unmap only once every rank has come this far.
    /// (The caller's streams are the caller's to have finished: they may be gone by now.)
    fn drop(&mut self) {
        let _ = self.own.sync();
        // A failed communicator's peers may be gone: nobody would come to the barrier. Its memory is released
        // here all the same; what a dead peer had mapped of it went with that peer's process.
        if self.watch.failure().is_some() {
            return;
        }
        if let Err(e) = self.rdv.barrier("communicator teardown") {
            eprintln!("warning: allreduce communicator: teardown barrier: {e}");
        }
    }
}
