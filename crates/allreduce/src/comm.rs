//! The communicator: one per rank, built from the launcher's environment or from explicit coordinates; it opens the
//! local rank's device, agrees on placement, builds the engine once, and runs allreduce / reduce-scatter on the
//! caller's stream and buffers with the algorithm its tune table names for the size.

use crate::check;
use crate::engine::Engine;
use crate::placement::{decode_links, encode_links, Placement, RankDevice};
use crate::timing::{Timer, TimingOptions};
use crate::tune::{self, Algorithm, LoadedTable, Mode, TableKey, TableSource, TuneTable};
use crate::{Error, Scalar};
use collective_core::{Collective, DType, Op, Team, MAX_RANKS, VEC_BYTES};
use gpu::{Backend, DeviceBuffer, DevicePtr, DriverKind, Gpu, MemKind, ShareHandle, Stream};
use ipc::{Rendezvous, RendezvousOptions};
use launch::RankInfo;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;
use symm::tuned::CallBuffers;

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
        }
    }
}

/// A buffer every peer has mapped, for calls whose input or output lies in it.
struct Registration {
    /// This rank's range.
    ptr: DevicePtr,
    bytes: usize,
    /// Every rank's address of its own range, as mapped here.
    peers: [u64; MAX_RANKS],
    _mapped: Vec<DeviceBuffer>,
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
/// println!("ran {algo} following {}", comm.table_source(allreduce::Mode::Eager));
/// ```
pub struct Communicator {
    // Field order is drop order: the engine and the mappings go before the rendezvous and the driver.
    engine: Engine,
    reduce_scatter: car::Car,
    registrations: Vec<Registration>,
    /// Caller streams seen so far, by raw handle (borrowed, never destroyed here).
    streams: Vec<(u64, Stream)>,
    own: Stream,
    scratch: Option<DeviceBuffer>,
    last: Option<Algorithm>,
    capacity: usize,
    tune_dir: Option<PathBuf>,
    placement: Placement,
    /// Why the compare-and-swap handshakes cannot run on these devices, if the drivers say so.
    no_peer_atomics: Option<String>,
    notes: Vec<String>,
    rdv: Rendezvous,
    gpu: Gpu,
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
        let timeout = match opts.timeout {
            Some(t) => t,
            None => deadline::timeout_from_env().map_err(Error::BadArgs)?,
        };
        let setup = match opts.setup_timeout {
            Some(t) => t,
            None => deadline::seconds_from_env(deadline::SETUP_TIMEOUT_ENV)
                .map_err(Error::BadArgs)?
                .unwrap_or((timeout * 6).max(Duration::from_secs(60))),
        };
        if opts.capacity_bytes == 0 {
            return Err(Error::BadArgs("capacity_bytes must be at least 1".into()));
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
            Ok((engine, reduce_scatter, placement, notes, own)) => {
                rdv.set_timeout(timeout);
                Ok(Communicator {
                    engine,
                    reduce_scatter,
                    registrations: Vec::new(),
                    streams: Vec::new(),
                    own,
                    scratch: None,
                    last: None,
                    capacity: opts.capacity_bytes,
                    tune_dir: opts.tune_dir.or_else(tune::cache_dir),
                    no_peer_atomics: placement.missing_peer_atomics(),
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
    ) -> Result<(Engine, car::Car, Placement, Vec<String>, Stream), Error> {
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
            "driver={}\ncapacity_bytes={}\ntimeout_ns={}\ntune_table={:?}\n",
            i.kind,
            opts.capacity_bytes,
            timeout.as_nanos(),
            opts.tune_table
        );
        crate::agree(rdv, "communicator options", &mine)?;
        let tables = match &opts.tune_table {
            Some(path) => {
                let t = LoadedTable::new(TuneTable::load(path)?, TableSource::File(path.clone()))?;
                [t.clone(), t]
            }
            None => {
                let dir = opts.tune_dir.clone().or_else(tune::cache_dir);
                let find =
                    |mode| TuneTable::find(&TableKey::new(i.kind, &i.name, info.world, mode), i.kind, dir.as_deref());
                [find(Mode::Eager)?, find(Mode::Graph)?]
            }
        };
        // Every rank follows the same tables, or they would run different kernels for one call.
        let digest = serde_json::to_string(&[&tables[0].table, &tables[1].table]).expect("tables serialise");
        crate::agree(rdv, "tune tables", &digest)?;
        for t in &tables {
            if let TableSource::BuiltIn(what) = &t.source {
                notes.push(format!("no tune table for this machine: using the {what} (run Communicator::tune)"));
            }
        }
        let no_atomics = placement.missing_peer_atomics();
        let team = Team::new(&gpu, rdv, placement.ranks_per_device)
            .with_kernel_timeout(timeout)
            .with_missing_peer_atomics(no_atomics.as_deref());
        let engine = Engine::new(team, opts.capacity_bytes, tables)?;
        let rs_opts = car::CarOptions {
            capacity_bytes: opts.capacity_bytes,
            uncached: true,
            rule: None,
            variant: car::Variant::Base,
        };
        let reduce_scatter = car::Car::new(team, car::Algo::ReduceScatter, rs_opts)?;
        notes.dedup();
        Ok((engine, reduce_scatter, placement, notes, gpu.stream()?))
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
    /// Which device every rank runs on.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }
    /// What set-up decided on the caller's behalf (drivers passed over, built-in tables in use).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }
    /// The algorithm the last call ran.
    pub fn last_algorithm(&self) -> Option<Algorithm> {
        self.last
    }
    /// The table calls issued in `mode` follow.
    pub fn tune_table(&self, mode: Mode) -> &TuneTable {
        &self.engine.table(mode).table
    }
    /// The table calls issued in `mode` follow, ready for the launch path (for [`crate::methods::BuildOptions`]).
    pub fn engine_table(&self, mode: Mode) -> &LoadedTable {
        self.engine.table(mode)
    }
    /// Where that table came from.
    pub fn table_source(&self, mode: Mode) -> &TableSource {
        &self.engine.table(mode).source
    }
    /// The engine as a [`Collective`] (comm-bench's `auto`).
    pub fn engine(&mut self) -> &mut Engine {
        &mut self.engine
    }
    /// The engine and the rendezvous together, for a caller that drives the engine collectively.
    pub fn engine_and_rendezvous(&mut self) -> (&mut Engine, &Rendezvous) {
        (&mut self.engine, &self.rdv)
    }
    /// The team methods are built from (for comm-bench's registry: [`crate::methods::build`]).
    pub fn team(&self) -> Team<'_> {
        Team::new(&self.gpu, &self.rdv, self.placement.ranks_per_device)
            .with_missing_peer_atomics(self.no_peer_atomics.as_deref())
    }

    /// The registered input: a caller that writes its input here saves the zero-copy designs their copy-in
    /// (torch's "allocate the tensor in symmetric memory").
    pub fn registered_input(&self) -> &DeviceBuffer {
        self.engine.registered_input().expect("the engine has registered buffers")
    }
    /// The registered output, which the zero-copy two-shot's peers write into directly.
    pub fn registered_output(&self) -> &DeviceBuffer {
        self.engine.registered_output().expect("the engine has registered buffers")
    }

    /// Enqueues an allreduce of `count` elements of `dtype` from `input` into `output` (they may be the same
    /// buffer) on the caller's stream `stream` (a `CUstream` / `hipStream_t`, or a host-driver stream handle), and
    /// returns the algorithm it chose. It does not wait: the result is there once the stream has run it. Issued
    /// while the stream is capturing, it is captured into the caller's graph, and every replay runs it again.
    ///
    /// # Safety
    /// - `input` and `output` are device memory of this communicator's device, aligned to 16 bytes (checked),
    ///   holding `count` elements, live and untouched by other work until the stream has run the call;
    /// - `stream` is a live stream of this device's context that outlives the communicator's use of it (the
    ///   communicator remembers it by handle);
    /// - every rank makes the same calls, with the same counts and dtypes, in the same order, each rank either
    ///   capturing or not;
    /// - where `input` or `output` lies in a buffer passed to [`Communicator::register`], every rank's lies in
    ///   its own buffer of that registration, at the same offset.
    pub unsafe fn all_reduce(
        &mut self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DType,
        stream: u64,
    ) -> Result<Algorithm, Error> {
        // SAFETY: the caller's contract.
        unsafe { self.all_reduce_with(None, input, output, count, dtype, stream) }
    }

    /// [`Communicator::all_reduce`] with the algorithm chosen by the caller (`None`: by the tune table), as
    /// NCCL_ALGO does for NCCL; every rank must choose alike.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce`].
    pub unsafe fn all_reduce_with(
        &mut self,
        algo: Option<Algorithm>,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DType,
        stream: u64,
    ) -> Result<Algorithm, Error> {
        // SAFETY: the caller's contract.
        unsafe { self.split().0.all_reduce_with(algo, input, output, count, dtype, stream) }
    }

    /// Enqueues a reduce-scatter: rank r receives elements `[r * count / W, (r + 1) * count / W)` of the sum in
    /// `output` (`count / W` elements). `count` must divide by the world size; input and output may not overlap.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce`], with `output` holding `count / W` elements.
    pub unsafe fn reduce_scatter(
        &mut self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DType,
        stream: u64,
    ) -> Result<Algorithm, Error> {
        // SAFETY: the caller's contract.
        unsafe { self.split().0.reduce_scatter(input, output, count, dtype, stream) }
    }

    /// The call path and the rendezvous, borrowed apart: for a caller that times calls collectively (comm-bench
    /// measures the communicator itself this way, as a [`Collective`]).
    pub fn split(&mut self) -> (Calls<'_>, &Rendezvous) {
        let calls = Calls {
            engine: &mut self.engine,
            reduce_scatter: &mut self.reduce_scatter,
            registrations: &self.registrations,
            streams: &mut self.streams,
            last: &mut self.last,
            gpu: &self.gpu,
            capacity: self.capacity,
            world: self.rdv.world(),
        };
        (calls, &self.rdv)
    }

    /// Registers `bytes` of the caller's device memory at `ptr` with every peer, so calls whose input (or output)
    /// lies in it read (or write) it in place on every rank, as zero-copy designs need. The allocation that holds
    /// the range is exported (its IPC handle, or the shareable handle of a VMM allocation) with the range's
    /// offset, and mapped by every peer. Collective: every rank registers a range of the same size, in the same
    /// order. Returns the registration's index.
    ///
    /// # Safety
    /// The range is device memory of this communicator's device that stays allocated while the communicator
    /// lives: peers keep it mapped and write into it during calls that name it.
    pub unsafe fn register(&mut self, ptr: DevicePtr, bytes: usize) -> Result<usize, Error> {
        let name = format!("registration {}", self.registrations.len());
        let shared = self.gpu.share_range(ptr, bytes);
        // Every rank learns whether every rank could export, so none waits for a handle that never comes.
        let verdict = match &shared {
            Ok(s) => format!("ok {bytes} {}", matches!(s.handle, ShareHandle::Vmm(_))),
            Err(e) => format!("error {e}"),
        };
        let all = self.rdv.all_gather(&format!("{name} verdict"), verdict.as_bytes())?;
        let shared = shared?;
        for (r, v) in all.iter().enumerate() {
            let v = String::from_utf8_lossy(v);
            if let Some(e) = v.strip_prefix("error ") {
                return Err(Error::Unsupported(format!("rank {r} cannot share its buffer: {e}")));
            }
            if v != verdict {
                return Err(Error::Mismatch(format!(
                    "{name}: rank {r} registered {v:?}, rank {} {verdict:?}",
                    self.rank()
                )));
            }
        }
        let place = format!("{} {}", shared.alloc_bytes, shared.offset);
        let places = self.rdv.all_gather(&format!("{name} places"), place.as_bytes())?;
        let parse = |b: &[u8]| -> Result<(usize, usize), Error> {
            let s = String::from_utf8_lossy(b);
            let mut it = s.split(' ').map(|x| x.parse::<usize>());
            match (it.next(), it.next()) {
                (Some(Ok(a)), Some(Ok(o))) if o.checked_add(bytes).is_some_and(|e| e <= a) => Ok((a, o)),
                _ => Err(Error::Mismatch(format!("{name}: malformed place {s:?}"))),
            }
        };
        let me = self.rank();
        let mut peers = [0u64; MAX_RANKS];
        let mut mapped = Vec::new();
        let handles: Vec<Option<(Vec<u8>, Option<std::os::fd::OwnedFd>)>> = match &shared.handle {
            ShareHandle::Ipc(h) => {
                self.rdv.all_gather(&format!("{name} handles"), h)?.into_iter().map(|h| Some((h, None))).collect()
            }
            ShareHandle::Vmm(fd) => {
                let all = self.rdv.all_gather_fds(&format!("{name} fds"), &[fd.as_fd()])?;
                all.into_iter().map(|mut f| f.pop().map(|fd| (Vec::new(), Some(fd)))).collect()
            }
        };
        for (r, handle) in handles.into_iter().enumerate() {
            if r == me {
                peers[r] = ptr.0;
                continue;
            }
            let (alloc_bytes, offset) = parse(&places[r])?;
            let buf = match handle {
                Some((_, Some(fd))) => self.gpu.vmm_import_fd(fd, alloc_bytes)?,
                Some((h, None)) => self.gpu.ipc_import(&h, alloc_bytes)?,
                None => return Err(Error::Mismatch(format!("{name}: rank {r} sent no handle"))),
            };
            peers[r] = buf.ptr().0 + offset as u64;
            mapped.push(buf);
        }
        self.rdv.barrier(&format!("{name} mapped"))?;
        self.registrations.push(Registration { ptr, bytes, peers, _mapped: mapped });
        Ok(self.registrations.len() - 1)
    }

    /// Allreduces host slices on the host driver, where device memory is this process's memory; the call is
    /// complete when it returns. Slices not aligned to 16 bytes are staged through an aligned buffer.
    pub fn all_reduce_host<T: Scalar>(&mut self, input: &[T], output: &mut [T]) -> Result<Algorithm, Error> {
        let out = (output.as_mut_ptr(), output.len());
        self.host_call(Op::AllReduce, input.as_ptr(), input.len(), Some(out))
    }

    /// In-place allreduce of a host slice on the host driver.
    pub fn all_reduce_host_in_place<T: Scalar>(&mut self, data: &mut [T]) -> Result<Algorithm, Error> {
        self.host_call(Op::AllReduce, data.as_mut_ptr(), data.len(), None)
    }

    /// Reduce-scatter of host slices on the host driver: `output` holds `input.len() / W` elements.
    pub fn reduce_scatter_host<T: Scalar>(&mut self, input: &[T], output: &mut [T]) -> Result<Algorithm, Error> {
        let out = (output.as_mut_ptr(), output.len());
        self.host_call(Op::ReduceScatter, input.as_ptr(), input.len(), Some(out))
    }

    /// One host-driver call on slices the public wrappers borrowed (`output` None: in place, `input` then comes
    /// from a mutable borrow).
    fn host_call<T: Scalar>(
        &mut self,
        op: Op,
        input: *const T,
        count: usize,
        output: Option<(*mut T, usize)>,
    ) -> Result<Algorithm, Error> {
        if self.gpu.kind() != DriverKind::Host {
            return Err(Error::Unsupported(format!(
                "host slices are device memory only on the host driver; this communicator runs on {}",
                self.gpu.kind()
            )));
        }
        let dtype = T::DTYPE;
        let out_count = op.output_count(count, self.world());
        let (out_ptr, out_len) = output.unwrap_or((input as *mut T, count));
        if out_len != out_count {
            return Err(Error::BadArgs(format!(
                "{op} of {count} elements needs an output of {out_count}, not {out_len}"
            )));
        }
        let (in_dev, out_dev) = (DevicePtr(input as u64), DevicePtr(out_ptr as u64));
        let aligned = in_dev.0 % VEC_BYTES as u64 == 0 && out_dev.0 % VEC_BYTES as u64 == 0;
        let own = self.own.handle();
        let run = |comm: &mut Communicator, i: DevicePtr, o: DevicePtr| {
            // SAFETY: on the host driver these addresses are the borrowed slices (or our scratch), live for this
            // function, which returns only after the host stream has run the call on this thread.
            unsafe {
                match op {
                    Op::AllReduce => comm.all_reduce(i, o, count, dtype, own),
                    Op::ReduceScatter => comm.reduce_scatter(i, o, count, dtype, own),
                }
            }
        };
        if aligned {
            return run(self, in_dev, out_dev);
        }
        let in_bytes = (count * dtype.size()).next_multiple_of(VEC_BYTES);
        let need = in_bytes + out_count * dtype.size();
        if self.scratch.as_ref().is_none_or(|s| s.bytes() < need) {
            self.scratch = Some(self.gpu.alloc(need, MemKind::Device)?);
        }
        let (s_in, s_out) = {
            let scratch = self.scratch.as_ref().expect("allocated above");
            // SAFETY: the wrappers borrowed `count` elements at `input`.
            let src = unsafe { std::slice::from_raw_parts(input as *const u8, count * dtype.size()) };
            self.own.upload(scratch, 0, src)?;
            let s_in = scratch.ptr();
            (s_in, if output.is_none() { s_in } else { s_in.offset(in_bytes) })
        };
        let algo = run(self, s_in, s_out)?;
        let scratch = self.scratch.as_ref().expect("allocated above");
        // SAFETY: `out_ptr` is the output slice (or, in place, the mutably borrowed data), `out_count` elements.
        let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr as *mut u8, out_count * dtype.size()) };
        self.own.download(scratch, (s_out.0 - s_in.0) as usize, dst)?;
        Ok(algo)
    }

    /// Measures every candidate at sizes up to the capacity, eagerly and in graph replays, checks each against
    /// the float64 reference first, and stores the fastest per size as this machine's tables in the cache
    /// directory, where later communicators find them. Collective. Returns the tables and where they went.
    pub fn tune(&mut self, dtype: DType) -> Result<Vec<(TuneTable, PathBuf)>, Error> {
        let dir = self
            .tune_dir
            .clone()
            .ok_or_else(|| Error::Tune("no cache directory: set ALLREDUCE_TUNE_DIR, XDG_CACHE_HOME or HOME".into()))?;
        let info = self.gpu.info().clone();
        let max = self.capacity / dtype.size();
        let sizes: Vec<usize> =
            crate::sizes::comm_bench_sizes(10, 24, 20, info.size_align).into_iter().filter(|&n| n <= max).collect();
        let timer = Timer::new(&self.gpu)?;
        let input = self.gpu.alloc(self.capacity, MemKind::Device)?;
        let output = self.gpu.alloc(self.capacity, MemKind::Device)?;
        let mut out = Vec::new();
        for mode in Mode::ALL {
            let opts = TimingOptions { iters: 20, warmup: 5, repeats: 3, graph: mode == Mode::Graph };
            let mut times = Vec::new();
            for &count in &sizes {
                for algo in Algorithm::CANDIDATES {
                    let seed = crate::agree_seed(&self.rdv)?;
                    let values = check::input_values(seed, self.rank(), count, dtype);
                    timer.stream.upload(&input, 0, &dtype.encode(&values))?;
                    let bufs = CallBuffers::local(input.ptr(), output.ptr());
                    // SAFETY: our own buffers of `capacity` bytes; every rank runs the same sequence.
                    unsafe { self.engine.run_algorithm(algo, dtype, &bufs, count, &timer.stream)? };
                    let mut got = vec![0u8; count * dtype.size()];
                    timer.stream.download(&output, 0, &mut got)?;
                    let want = check::reference(seed, self.world(), count, dtype, 0, count);
                    let tol = check::tolerance(dtype, self.world(), false);
                    // A candidate that fails its check (any rank, or bits that differ across ranks) is not timed.
                    if check::agree_verdict(&self.rdv, &got, dtype, &want, tol, true, "tune")?.is_some() {
                        continue;
                    }
                    let engine = &mut self.engine;
                    let t = timer.time_calls(&opts, &self.rdv, |s| {
                        // SAFETY: as above.
                        unsafe { engine.run_algorithm(algo, dtype, &bufs, count, s)? };
                        Ok(())
                    })?;
                    times.push((count * dtype.size(), algo, t.median_ms()));
                }
            }
            let key = TableKey::new(info.kind, &info.name, self.world(), mode);
            let on = format!("{}, {} ranks, {}, {}, {dtype}", info.name, self.world(), info.kind, mode.name());
            let table = TuneTable::from_times(&times, key.clone(), on)?;
            let path = dir.join(key.file_name());
            if self.rank() == 0 {
                table.store(&path)?;
            }
            out.push((table, path));
        }
        self.rdv.barrier("tune tables stored")?;
        Ok(out)
    }
}

/// A communicator's call path, borrowed apart from its rendezvous ([`Communicator::split`]).
pub struct Calls<'a> {
    engine: &'a mut Engine,
    reduce_scatter: &'a mut car::Car,
    registrations: &'a [Registration],
    streams: &'a mut Vec<(u64, Stream)>,
    last: &'a mut Option<Algorithm>,
    gpu: &'a Gpu,
    capacity: usize,
    world: usize,
}

impl Calls<'_> {
    /// Checks a call's arguments before anything is enqueued.
    fn check_call(&self, op: Op, dtype: DType, input: DevicePtr, output: DevicePtr, count: usize) -> Result<(), Error> {
        let bytes =
            count.checked_mul(dtype.size()).ok_or_else(|| Error::BadArgs(format!("count {count} overflows")))?;
        if count == 0 {
            return Err(Error::BadArgs("count must be at least 1".into()));
        }
        if bytes > self.capacity {
            return Err(Error::TooLarge { bytes, capacity: self.capacity });
        }
        for (what, p) in [("input", input), ("output", output)] {
            if p.0 % VEC_BYTES as u64 != 0 {
                return Err(Error::Misaligned { what, ptr: p.0, align: VEC_BYTES });
            }
        }
        let world = self.world;
        if op == Op::ReduceScatter && !count.is_multiple_of(world) {
            return Err(Error::BadArgs(format!("reduce_scatter needs count divisible by {world} ranks: {count}")));
        }
        let out_bytes = op.output_count(count, world) * dtype.size();
        let (i, o) = (input.0, output.0);
        let overlap = i < o + out_bytes as u64 && o < i + bytes as u64;
        if overlap && (i != o || op == Op::ReduceScatter) {
            return Err(Error::BadArgs(format!(
                "input {i:#x} (+{bytes} bytes) and output {o:#x} (+{out_bytes}) overlap without being the same buffer"
            )));
        }
        Ok(())
    }

    /// The caller's stream, borrowed once and remembered by handle.
    fn caller_stream(&mut self, raw: u64) -> Result<usize, Error> {
        if let Some(k) = self.streams.iter().position(|s| s.0 == raw) {
            return Ok(k);
        }
        // SAFETY: the caller's contract on `all_reduce` etc.: `raw` is a live stream of this device's context.
        let s = unsafe { self.gpu.borrow_stream(raw)? };
        self.streams.push((raw, s));
        Ok(self.streams.len() - 1)
    }

    /// The peers' addresses of `ptr` when it lies in a registered buffer.
    fn registered_peers(&self, ptr: DevicePtr, bytes: usize) -> Option<[u64; MAX_RANKS]> {
        let r =
            self.registrations.iter().find(|r| ptr.0 >= r.ptr.0 && ptr.0 + bytes as u64 <= r.ptr.0 + r.bytes as u64)?;
        let offset = ptr.0 - r.ptr.0;
        let mut peers = r.peers;
        peers.iter_mut().take(self.world).for_each(|p| *p += offset);
        Some(peers)
    }

    /// [`Communicator::all_reduce_with`]'s work.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce`].
    pub(crate) unsafe fn all_reduce_with(
        &mut self,
        algo: Option<Algorithm>,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DType,
        stream: u64,
    ) -> Result<Algorithm, Error> {
        self.check_call(Op::AllReduce, dtype, input, output, count)?;
        if algo.is_some_and(|a| !Algorithm::CANDIDATES.contains(&a)) {
            return Err(Error::BadArgs(format!("{} is not an allreduce algorithm", algo.expect("checked"))));
        }
        let k = self.caller_stream(stream)?;
        let bytes = count * dtype.size();
        let bufs = CallBuffers {
            input,
            output,
            peer_inputs: self.registered_peers(input, bytes),
            peer_outputs: self.registered_peers(output, bytes),
        };
        let s = &self.streams[k].1;
        let algo = match algo {
            Some(a) => a,
            None => self.engine.choose(bytes, s)?,
        };
        // SAFETY: the caller's contract, which is run_algorithm's.
        unsafe { self.engine.run_algorithm(algo, dtype, &bufs, count, s)? };
        *self.last = Some(algo);
        Ok(algo)
    }

    /// [`Communicator::reduce_scatter`]'s work.
    ///
    /// # Safety
    /// As [`Communicator::reduce_scatter`].
    pub(crate) unsafe fn reduce_scatter(
        &mut self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DType,
        stream: u64,
    ) -> Result<Algorithm, Error> {
        self.check_call(Op::ReduceScatter, dtype, input, output, count)?;
        let k = self.caller_stream(stream)?;
        // SAFETY: the caller's contract.
        unsafe { self.reduce_scatter.run(Op::ReduceScatter, dtype, input, output, count, &self.streams[k].1)? };
        *self.last = Some(Algorithm::CarReduceScatter);
        Ok(Algorithm::CarReduceScatter)
    }
}

/// The communicator's own path as a method comm-bench can time: `communicator` beside `auto` (the engine called
/// directly) shows what the library adds per call.
impl Collective for Calls<'_> {
    fn name(&self) -> &str {
        "communicator"
    }

    fn op(&self) -> Op {
        Op::AllReduce
    }

    fn capacity_bytes(&self) -> usize {
        self.capacity
    }

    unsafe fn run(
        &mut self,
        op: Op,
        dtype: DType,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        stream: &Stream,
    ) -> Result<(), collective_core::CollectiveError> {
        let err = |e: Error| match e {
            Error::Collective(c) => c,
            other => collective_core::CollectiveError::BadArgs(other.to_string()),
        };
        // SAFETY: the caller's contract; `stream` is one of this device's streams, live for the call.
        unsafe {
            match op {
                Op::AllReduce => self.all_reduce_with(None, input, output, count, dtype, stream.handle()),
                Op::ReduceScatter => self.reduce_scatter(input, output, count, dtype, stream.handle()),
            }
        }
        .map(|_| ())
        .map_err(err)
    }
}

impl Drop for Communicator {
    /// Peers may still read this rank's buffers: unmap only once every rank has come this far.
    /// (The caller's streams are the caller's to have finished: they may be gone by now.)
    fn drop(&mut self) {
        let _ = self.own.sync();
        if let Err(e) = self.rdv.barrier("communicator teardown") {
            eprintln!("warning: allreduce communicator: teardown barrier: {e}");
        }
    }
}
