//! The vendor baseline: NCCL on the cuda driver, RCCL on the hip driver; behind [`collective_core::Collective`]
//! under a [`Watchdog`] ([`WatchedNccl`]), as torch runs it.
//!
//! With [`NcclOptions::symmetric`] the collective runs between two staging buffers from `ncclMemAlloc`
//! registered as symmetric windows (NCCL 2.27+), which lets NCCL pick its symmetric-memory kernels; the
//! caller's buffers are copied in and out on the same stream, so the method accepts any device pointers like
//! the others do.

mod watchdog;

pub use watchdog::{Watchdog, WatchedNccl};

use collective_core::{Call, CollectiveError, DType, Op, Team};
use gpu::{DevicePtr, DriverKind, GpuError, Stream};
use ipc::Rendezvous;
use nccl_sys::{
    ncclCommWindowDeregisterFn, ncclCommWindowRegisterFn, ncclComm_t, ncclConfig_t, ncclDataType_t, ncclMemAllocFn,
    ncclMemFreeFn, ncclResult_t, ncclStream_t, ncclUniqueId, ncclWindow_t, Flavor, NcclError, NcclLib,
    NCCL_WIN_COLL_SYMMETRIC,
};
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How to build a [`Nccl`].
#[derive(Clone, Copy, Debug)]
pub struct NcclOptions {
    /// The one op this instance runs, so each method name maps to one instance.
    pub op: Op,
    /// Run between registered symmetric windows (`nccl_symm`, `nccl_symm_rs`, `nccl_symm_ag`).
    pub symmetric: bool,
    /// Largest input in bytes; also the size of the input staging buffer when `symmetric` (the output's is
    /// [`Op::output_capacity`]).
    pub capacity_bytes: usize,
}

/// The registry name of the method built from these options.
pub fn method_name(op: Op, symmetric: bool) -> &'static str {
    match (op, symmetric) {
        (Op::AllReduce, false) => "nccl",
        (Op::AllReduce, true) => "nccl_symm",
        (Op::ReduceScatter, false) => "nccl_rs",
        (Op::ReduceScatter, true) => "nccl_symm_rs",
        (Op::AllGather, false) => "nccl_ag",
        (Op::AllGather, true) => "nccl_symm_ag",
    }
}

/// NCCL's code for `dtype`.
pub fn nccl_dtype(dtype: DType) -> ncclDataType_t {
    match dtype {
        DType::Bf16 => nccl_sys::ncclBfloat16,
        DType::F16 => nccl_sys::ncclFloat16,
        DType::F32 => nccl_sys::ncclFloat32,
    }
}

/// The library that matches the driver: the host driver's memory is not device memory, so NCCL cannot use it.
fn flavor_for(kind: DriverKind) -> Result<Flavor, CollectiveError> {
    match kind {
        DriverKind::Cuda => Ok(Flavor::Nccl),
        DriverKind::Hip => Ok(Flavor::Rccl),
        DriverKind::Host => {
            Err(CollectiveError::Unsupported("nccl needs a GPU driver; the host driver has no NCCL".into()))
        }
    }
}

/// NCCL refuses two ranks of one communicator on one GPU (init fails or hangs), so this is checked first.
fn check_devices(method: &str, ranks_per_device: usize) -> Result<(), CollectiveError> {
    if ranks_per_device > 1 {
        return Err(CollectiveError::Unsupported(format!(
            "{method}: NCCL needs one GPU per rank, and {ranks_per_device} ranks share a device"
        )));
    }
    Ok(())
}

fn nccl_err(e: NcclError) -> CollectiveError {
    CollectiveError::Gpu(GpuError::Driver { call: e.call, code: i64::from(e.code), msg: e.msg })
}

/// The entry points the symmetric path needs; all optional in the library, so found together or not at all.
#[derive(Clone, Copy)]
struct SymmFns {
    alloc: ncclMemAllocFn,
    free: ncclMemFreeFn,
    register: ncclCommWindowRegisterFn,
    deregister: ncclCommWindowDeregisterFn,
}

/// A staging buffer from `ncclMemAlloc` of `bytes`, and its window (null until registered).
struct Staging {
    ptr: *mut c_void,
    bytes: usize,
    win: ncclWindow_t,
}

/// Opens the library and checks it can run the method; `Err` is the reason, for every rank to see.
fn open(flavor: Flavor, method: &str, symmetric: bool) -> Result<(NcclLib, Option<SymmFns>), String> {
    let lib = NcclLib::load(flavor).map_err(|e| format!("{method}: {e}"))?;
    if !symmetric {
        return Ok((lib, None));
    }
    match (lib.ncclMemAlloc, lib.ncclMemFree, lib.ncclCommWindowRegister, lib.ncclCommWindowDeregister) {
        (Some(alloc), Some(free), Some(register), Some(deregister)) => {
            Ok((lib, Some(SymmFns { alloc, free, register, deregister })))
        }
        _ => {
            let (major, minor, patch) = lib.version();
            Err(format!(
                "{method}: {} is {flavor} {major}.{minor}.{patch}, which lacks ncclMemAlloc / ncclCommWindowRegister; \
                 symmetric windows need NCCL 2.27+",
                lib.library()
            ))
        }
    }
}

/// A fresh unique id of the library, as bytes to send to the other ranks.
fn new_id(lib: &NcclLib) -> Result<Vec<u8>, CollectiveError> {
    let mut id = ncclUniqueId::zeroed();
    // SAFETY: ncclGetUniqueId writes one id.
    lib.check(unsafe { (lib.ncclGetUniqueId)(&mut id) }, "ncclGetUniqueId").map_err(nccl_err)?;
    Ok(id.as_bytes().to_vec())
}

/// How often a non-blocking communicator's state is polled while NCCL works on its own threads.
const POLL: Duration = Duration::from_millis(1);

/// Waits until `comm` has no operation in progress, at most `timeout`; `Err` with NCCL's error, or naming `call`
/// and the deadline when it is still in progress then.
fn settle(lib: &NcclLib, comm: ncclComm_t, call: &'static str, timeout: Duration) -> Result<(), NcclError> {
    let start = Instant::now();
    loop {
        let state = pending_state(lib, comm)?;
        if state != nccl_sys::ncclInProgress {
            return lib.check(state, call);
        }
        if start.elapsed() >= timeout {
            return Err(NcclError {
                call,
                code: state,
                msg: format!(
                    "still in progress after {timeout:?}: a rank of the communicator never joined, or NCCL cannot \
                     reach it (the communicator was aborted)"
                ),
            });
        }
        std::thread::sleep(POLL);
    }
}

/// `rank` of a communicator of `world` ranks named by the unique id `id` (bytes), initialised without blocking
/// where the library can (NCCL 2.14+): the wait for the other ranks then has `timeout` as its deadline, after which
/// the communicator is aborted, so a rank that died after the ids went out cannot leave the others hanging.
fn init(
    lib: &NcclLib,
    name: &str,
    id: &[u8],
    (rank, world): (usize, usize),
    timeout: Duration,
) -> Result<ncclComm_t, CollectiveError> {
    let id = ncclUniqueId::from_bytes(id).ok_or_else(|| {
        CollectiveError::Unsupported(format!("{name}: the communicator's first rank could not create its unique id"))
    })?;
    let mut comm: ncclComm_t = ptr::null_mut();
    let Some(init_config) = lib.ncclCommInitRankConfig else {
        // SAFETY: `comm` receives the new communicator; every rank passes the same id and world and its own rank.
        let status = unsafe { (lib.ncclCommInitRank)(&mut comm, world as c_int, id, rank as c_int) };
        lib.check(status, "ncclCommInitRank").map_err(nccl_err)?;
        return Ok(comm);
    };
    let mut config = ncclConfig_t::non_blocking();
    // SAFETY: as ncclCommInitRank, with a config NCCL reads during the call.
    let status = unsafe { init_config(&mut comm, world as c_int, id, rank as c_int, &mut config) };
    let settled = match status {
        nccl_sys::ncclSuccess | nccl_sys::ncclInProgress => settle(lib, comm, "ncclCommInitRankConfig", timeout),
        failed => lib.check(failed, "ncclCommInitRankConfig"),
    };
    if let Err(e) = settled {
        if !comm.is_null() {
            // SAFETY: the communicator this call made, released once; abort ends NCCL's threads waiting for peers.
            let aborted = unsafe { (lib.ncclCommAbort)(comm) };
            if let Err(a) = lib.check(aborted, "ncclCommAbort") {
                eprintln!("warning: {name}: {a}");
            }
        }
        return Err(nccl_err(e));
    }
    Ok(comm)
}

/// A unique id for a communicator built with [`Nccl::from_id`] (made by one of its ranks, sent to the others by
/// the caller: across nodes, over TCP).
pub fn unique_id(kind: DriverKind) -> Result<Vec<u8>, CollectiveError> {
    let lib = NcclLib::load(flavor_for(kind)?).map_err(|e| CollectiveError::Unsupported(format!("nccl: {e}")))?;
    new_id(&lib)
}

/// A communicator handle, shared by its [`Nccl`] and its [`NcclAbort`]s: every NCCL call on it holds `live`, so an
/// abort from another thread never overlaps one and none follows it.
struct Comm {
    lib: NcclLib,
    raw: ncclComm_t,
    /// False once aborted or released.
    live: Mutex<bool>,
}

// SAFETY: NCCL lets a communicator be used from any thread, one call at a time; `live` serialises the calls.
unsafe impl Send for Comm {}
// SAFETY: as Send: every use of `raw` holds `live`.
unsafe impl Sync for Comm {}

impl Comm {
    fn live(&self) -> MutexGuard<'_, bool> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `f` on the live handle, or the error of an aborted communicator.
    fn with<T>(&self, f: impl FnOnce(&NcclLib, ncclComm_t) -> Result<T, NcclError>) -> Result<T, NcclError> {
        let live = self.live();
        if !*live {
            let msg = "the communicator was aborted (a call missed its deadline, or a peer failed)".to_string();
            return Err(NcclError { call: "a call on an aborted communicator", code: nccl_sys::ncclInvalidUsage, msg });
        }
        f(&self.lib, self.raw)
    }

    /// Runs `release` on the live handle and marks it released; nothing where it was aborted already.
    fn release(&self, release: impl FnOnce(&NcclLib, ncclComm_t)) {
        let mut live = self.live();
        if std::mem::take(&mut *live) {
            release(&self.lib, self.raw);
        }
    }
}

/// Ends a communicator from any thread, as `ncclCommAbort`: its enqueued and running work stops (a kernel waiting
/// for a dead peer returns), and every later call on it fails. A no-op once it was aborted or dropped.
#[derive(Clone)]
pub struct NcclAbort {
    comm: Arc<Comm>,
    name: &'static str,
}

impl NcclAbort {
    /// Aborts the communicator; true where this call did.
    pub fn abort(&self) -> bool {
        let mut done = false;
        self.comm.release(|lib, raw| {
            // SAFETY: the live handle, released exactly once (`release` marks it).
            if let Err(e) = lib.check(unsafe { (lib.ncclCommAbort)(raw) }, "ncclCommAbort") {
                eprintln!("warning: {}: {e}", self.name);
            }
            done = true;
        });
        done
    }

    /// The error an asynchronous operation left on the communicator (a peer's connection lost, say), if any; Ok
    /// while one is still in progress and once the communicator is gone.
    pub fn async_error(&self) -> Result<(), NcclError> {
        let live = self.comm.live();
        if !*live {
            return Ok(());
        }
        match pending_state(&self.comm.lib, self.comm.raw)? {
            nccl_sys::ncclSuccess | nccl_sys::ncclInProgress => Ok(()),
            failed => self.comm.lib.check(failed, "an earlier NCCL operation (ncclCommGetAsyncError)"),
        }
    }

    /// The communicator's name (its method's).
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// The state `ncclCommGetAsyncError` reports for `comm`.
fn pending_state(lib: &NcclLib, comm: ncclComm_t) -> Result<ncclResult_t, NcclError> {
    let mut state: ncclResult_t = nccl_sys::ncclSuccess;
    // SAFETY: the caller holds a live `comm`; the call writes one status.
    lib.check(unsafe { (lib.ncclCommGetAsyncError)(comm, &mut state) }, "ncclCommGetAsyncError")?;
    Ok(state)
}

/// A communicator over all ranks of the rendezvous, running one op.
pub struct Nccl {
    comm: Arc<Comm>,
    name: &'static str,
    op: Op,
    capacity: usize,
    symm: Option<SymmFns>,
    /// Input then output staging buffer when symmetric; empty otherwise.
    staging: Vec<Staging>,
    /// How long NCCL's own work (its set-up, its connections made at a first call) may stay in progress.
    timeout: Duration,
}

// SAFETY: the communicator is `Comm`'s (Send); the staging buffers are device memory owned by it and freed in its drop.
unsafe impl Send for Nccl {}

impl Nccl {
    /// Creates the communicator. Collective: every rank calls it, with the same options.
    ///
    /// NCCL binds the communicator to the calling thread's current device, which the GPU driver selected.
    pub fn new(team: Team<'_>, opts: NcclOptions) -> Result<Nccl, CollectiveError> {
        let name = method_name(opts.op, opts.symmetric);
        let flavor = flavor_for(team.gpu.kind())?;
        let (rdv, rank, world) = (team.rdv, team.rank(), team.world());
        if opts.capacity_bytes == 0 {
            return Err(CollectiveError::BadArgs(format!("{name} capacity must be at least 1 byte")));
        }
        check_devices(name, team.ranks_per_device)?;

        // Every rank reports whether it can go on, so that one rank without a usable library fails them all
        // here instead of leaving the others waiting in NCCL's bootstrap.
        let local = open(flavor, name, opts.symmetric);
        let capacity = (opts.capacity_bytes as u64).to_le_bytes();
        let mut blob = capacity.to_vec();
        if let Err(reason) = &local {
            blob.extend_from_slice(reason.as_bytes());
        }
        let reports = rdv.all_gather(&format!("{name} load"), &blob)?;
        let (lib, symm) = local.map_err(CollectiveError::Unsupported)?;
        for (r, report) in reports.iter().enumerate() {
            if report.len() > capacity.len() {
                let reason = String::from_utf8_lossy(&report[capacity.len()..]);
                return Err(CollectiveError::Unsupported(format!("rank {r}: {reason}")));
            }
            if report[..] != capacity {
                return Err(CollectiveError::Mismatch(format!(
                    "{name}: rank {r} asked for a different capacity than rank {rank} ({} bytes)",
                    opts.capacity_bytes
                )));
            }
        }

        // Rank 0 sends an empty blob when it cannot create the id, so the others fail instead of waiting.
        let created = if rank == 0 { new_id(&lib) } else { Ok(Vec::new()) };
        let sent = created.as_deref().unwrap_or_default();
        let got = rdv.broadcast("nccl unique id", 0, sent)?;
        created?;
        let timeout = rdv.timeout();
        let raw = init(&lib, name, &got, (rank, world), timeout)?;
        let comm = Arc::new(Comm { lib, raw, live: Mutex::new(true) });
        let (op, capacity) = (opts.op, opts.capacity_bytes);
        let mut nccl = Nccl { comm, name, op, capacity, symm, staging: Vec::new(), timeout };
        if let Some(fns) = symm {
            nccl.register_staging(rdv, fns)?;
        }
        Ok(nccl)
    }

    /// `rank` of a communicator of `world` ranks named by `id` (from [`unique_id`] on one of them), for ranks that
    /// share no rendezvous (several nodes). Collective over those ranks. Runs any op through [`Nccl::enqueue`];
    /// not symmetric. NCCL itself decides whether its ranks may share a device. `timeout` bounds NCCL's own work
    /// (this set-up, and connections it makes at a first call): a rank that never joins ends it with an error.
    pub fn from_id(
        kind: DriverKind,
        name: &'static str,
        capacity_bytes: usize,
        id: &[u8],
        (rank, world): (usize, usize),
        timeout: Duration,
    ) -> Result<Nccl, CollectiveError> {
        let lib = NcclLib::load(flavor_for(kind)?).map_err(|e| CollectiveError::Unsupported(format!("{name}: {e}")))?;
        let raw = init(&lib, name, id, (rank, world), timeout)?;
        let comm = Arc::new(Comm { lib, raw, live: Mutex::new(true) });
        let (op, capacity) = (Op::AllReduce, capacity_bytes);
        Ok(Nccl { comm, name, op, capacity, symm: None, staging: Vec::new(), timeout })
    }

    /// Allocates and registers the input and output windows; on error, drop releases what was made.
    fn register_staging(&mut self, rdv: &Rendezvous, fns: SymmFns) -> Result<(), CollectiveError> {
        let mut failed = None;
        for bytes in [self.capacity, self.op.output_capacity(self.capacity, rdv.world())] {
            let mut ptr = ptr::null_mut();
            // SAFETY: ncclMemAlloc writes one pointer.
            match self.comm.lib.check(unsafe { (fns.alloc)(&mut ptr, bytes) }, "ncclMemAlloc") {
                Ok(()) => self.staging.push(Staging { ptr, bytes, win: ptr::null_mut() }),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // Registration is collective: no rank may start it unless every rank has its buffers.
        let flags = rdv.all_gather(&format!("{} staging", self.name), &[u8::from(failed.is_none())])?;
        if let Some(e) = failed {
            return Err(nccl_err(e));
        }
        if let Some(r) = flags.iter().position(|f| f[..] != [1]) {
            return Err(CollectiveError::Unsupported(format!(
                "{}: rank {r} could not allocate its staging buffers",
                self.name
            )));
        }
        let timeout = self.timeout;
        for buf in &mut self.staging {
            self.comm
                .with(|lib, comm| {
                    // SAFETY: `buf.ptr` holds `buf.bytes` from ncclMemAlloc; `buf.win` receives the window.
                    let status =
                        unsafe { (fns.register)(comm, buf.ptr, buf.bytes, &mut buf.win, NCCL_WIN_COLL_SYMMETRIC) };
                    complete(lib, comm, status, "ncclCommWindowRegister", timeout)
                })
                .map_err(nccl_err)?;
        }
        Ok(())
    }

    /// The method's name (`nccl`, `nccl_job`, ...), for as long as the program runs.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The op this instance was made for (its staging windows hold that op's sizes).
    pub fn op(&self) -> Op {
        self.op
    }

    /// Largest input, in bytes.
    pub fn capacity_bytes(&self) -> usize {
        self.capacity
    }

    /// A handle that aborts this communicator from any thread.
    pub fn abort_handle(&self) -> NcclAbort {
        NcclAbort { comm: self.comm.clone(), name: self.name }
    }

    /// The error a failed asynchronous operation left on the communicator, if any (an aborted one's, once aborted).
    fn async_error(&self) -> Result<(), NcclError> {
        self.comm
            .with(|lib, comm| lib.check(pending_state(lib, comm)?, "an earlier NCCL operation (ncclCommGetAsyncError)"))
    }
}

/// `status` of `call` on `comm`, waited for where it is still in progress (a non-blocking communicator's calls can
/// return before NCCL has, say, connected to a peer) up to `timeout`.
fn complete(
    lib: &NcclLib,
    comm: ncclComm_t,
    status: ncclResult_t,
    call: &'static str,
    timeout: Duration,
) -> Result<(), NcclError> {
    match status {
        nccl_sys::ncclInProgress => settle(lib, comm, call, timeout),
        other => lib.check(other, call),
    }
}

impl Nccl {
    /// Enqueues `call` (any op; through the staging windows when symmetric, which hold this instance's op's sizes)
    /// on `stream`.
    ///
    /// # Safety
    /// As [`collective_core::Collective::run`], with `call` checked for no more than this instance's capacity.
    pub unsafe fn enqueue(&self, call: &Call, stream: &Stream) -> Result<(), CollectiveError> {
        debug_assert!(call.capacity() <= self.capacity && (self.staging.is_empty() || call.op() == self.op));
        let (op, dtype, count, out_count) = (call.op(), call.dtype(), call.count(), call.output_count());
        let (input, output) = (call.input(), call.output());
        self.async_error().map_err(nccl_err)?;
        let staged = match self.staging.as_slice() {
            [inp, out] => Some((DevicePtr(inp.ptr as u64), DevicePtr(out.ptr as u64))),
            _ => None,
        };
        let (send, recv) = match staged {
            Some((inp, out)) => {
                // SAFETY: the caller vouches for `input`; the staging buffer holds `capacity` bytes, at least the call's.
                unsafe { stream.copy(inp, input, count * dtype.size())? };
                (inp, out)
            }
            None => (input, output),
        };
        let (send, recv) = (send.0 as usize as *const c_void, recv.0 as usize as *mut c_void);
        let handle = stream.handle() as usize as ncclStream_t;
        let dt = nccl_dtype(dtype);
        let sum = nccl_sys::ncclSum;
        self.comm
            .with(|lib, comm| {
                // SAFETY: the call was checked for no more than the capacity; the buffers are device memory of this
                // GPU and the stream is its driver's handle (CUstream / hipStream_t).
                let (status, call) = unsafe {
                    match op {
                        Op::AllReduce => {
                            ((lib.ncclAllReduce)(send, recv, count, dt, sum, comm, handle), "ncclAllReduce")
                        }
                        Op::ReduceScatter => {
                            ((lib.ncclReduceScatter)(send, recv, out_count, dt, sum, comm, handle), "ncclReduceScatter")
                        }
                        Op::AllGather => ((lib.ncclAllGather)(send, recv, count, dt, comm, handle), "ncclAllGather"),
                    }
                };
                complete(lib, comm, status, call, self.timeout)
            })
            .map_err(nccl_err)?;
        if let Some((_, out)) = staged {
            // SAFETY: as the copy in, for the output.
            unsafe { stream.copy(output, out, out_count * dtype.size())? };
        }
        Ok(())
    }
}

/// Drop only once the streams it ran on are idle: the staging buffers are freed here.
impl Drop for Nccl {
    fn drop(&mut self) {
        let warn = |r: Result<(), NcclError>| {
            if let Err(e) = r {
                eprintln!("warning: {}: {e}", self.name);
            }
        };
        // A communicator with a failed operation may never finish a collective teardown, so it is aborted; one
        // aborted already (by an abort handle) has nothing left to release.
        let broken = self.async_error().is_err();
        self.comm.release(|lib, comm| {
            if let Some(fns) = self.symm {
                for buf in self.staging.iter().filter(|b| !broken && !b.win.is_null()) {
                    // SAFETY: the window was registered on this communicator and is deregistered once.
                    warn(lib.check(unsafe { (fns.deregister)(comm, buf.win) }, "ncclCommWindowDeregister"));
                }
            }
            // SAFETY: `comm` is live and released exactly once (`release` marks it).
            if broken {
                warn(lib.check(unsafe { (lib.ncclCommAbort)(comm) }, "ncclCommAbort"));
            } else {
                warn(lib.check(unsafe { (lib.ncclCommDestroy)(comm) }, "ncclCommDestroy"));
            }
        });
        if let Some(fns) = self.symm {
            for buf in &self.staging {
                // SAFETY: from ncclMemAlloc, no longer registered (or its communicator gone), freed once.
                warn(self.comm.lib.check(unsafe { (fns.free)(buf.ptr) }, "ncclMemFree"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_gpu() -> gpu::Gpu {
        let opts =
            gpu::DriverOptions { device: None, local_rank: None, shm_prefix: format!("/arx-t{}", std::process::id()) };
        gpu::open(gpu::Backend::Host, &opts).unwrap().gpu
    }

    #[test]
    fn host_driver_is_unsupported() {
        let gpu = host_gpu();
        let rdv = ipc::Rendezvous::join(&ipc::JobId::random(), 0, 1, ipc::RendezvousOptions::default()).unwrap();
        for symmetric in [false, true] {
            for op in [Op::AllReduce, Op::ReduceScatter, Op::AllGather] {
                let opts = NcclOptions { op, symmetric, capacity_bytes: 1 << 20 };
                match Nccl::new(Team::new(&gpu, &rdv, 1), opts) {
                    Err(CollectiveError::Unsupported(msg)) => {
                        assert_eq!(msg, "nccl needs a GPU driver; the host driver has no NCCL")
                    }
                    Err(e) => panic!("expected Unsupported, got {e}"),
                    Ok(_) => panic!("nccl opened on the host driver"),
                }
            }
        }
    }

    #[test]
    fn one_gpu_per_rank() {
        assert!(check_devices("nccl", 1).is_ok());
        match check_devices("nccl_rs", 2) {
            Err(CollectiveError::Unsupported(msg)) => {
                assert!(msg.contains("one GPU per rank") && msg.contains("nccl_rs"), "{msg}")
            }
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }

    #[test]
    fn names_and_types() {
        assert_eq!(method_name(Op::AllReduce, false), "nccl");
        assert_eq!(method_name(Op::AllReduce, true), "nccl_symm");
        assert_eq!(method_name(Op::ReduceScatter, false), "nccl_rs");
        assert_eq!(method_name(Op::ReduceScatter, true), "nccl_symm_rs");
        assert_eq!(method_name(Op::AllGather, false), "nccl_ag");
        assert_eq!(method_name(Op::AllGather, true), "nccl_symm_ag");
        assert_eq!(nccl_dtype(DType::F16), 6);
        assert_eq!(nccl_dtype(DType::F32), 7);
        assert_eq!(nccl_dtype(DType::Bf16), 9);
        assert_eq!(flavor_for(DriverKind::Cuda).unwrap(), Flavor::Nccl);
        assert_eq!(flavor_for(DriverKind::Hip).unwrap(), Flavor::Rccl);
        assert!(flavor_for(DriverKind::Host).is_err());
    }
}
