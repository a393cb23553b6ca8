//! `allreduce_rs.Across`: one rank's endpoint of a job over several nodes (our designs within each node, NCCL/RCCL
//! across them: `across::Across`), for tensors, its calls' tensors checked as the intra-node communicator's are.

use crate::comm::{options, DEFAULT_CAPACITY};
use crate::errors::{from_across, from_launch, AllreduceError, ArgumentError};
use crate::reach::Reach;
use across::Path;
use allreduce::DevicePtr;
use collective_core::Op;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

/// A path table as Python sees it: `[(max_bytes or None, path)]`.
type PathRows = Vec<(Option<usize>, String)>;

fn path_rows(t: &across::PathTable) -> PathRows {
    t.entries.iter().map(|e| (e.max_bytes, e.path.to_string())).collect()
}

/// Endpoints this process has set up through a store: part of their keys, so a second endpoint of the same job
/// never reads the first one's blobs (every rank sets up its endpoints in the same order, so the numbers agree).
static STORE_SETUPS: AtomicUsize = AtomicUsize::new(0);

/// How often a store is asked whether the peers' keys are there.
const STORE_POLL: Duration = Duration::from_millis(10);

/// The set-up exchange through a key-value store with torch.distributed.Store's methods (`set(key, bytes)`,
/// `check([keys]) -> bool`, `get(key) -> bytes`): each round, this rank sets its key, then waits for every peer's,
/// naming at the deadline those that never came.
struct StoreExchange {
    store: Py<PyAny>,
    prefix: String,
    rank: usize,
    world: usize,
    timeout: Duration,
    round: usize,
}

impl StoreExchange {
    fn key(&self, rank: usize) -> String {
        format!("{}/{}/{rank}", self.prefix, self.round)
    }

    fn gather(&self, py: Python<'_>, blob: &[u8]) -> Result<Vec<Vec<u8>>, across::Error> {
        let store = self.store.bind(py);
        let failed = |e: PyErr| across::Error::Setup(format!("the torch.distributed store: {e}"));
        store.call_method1(intern!(py, "set"), (self.key(self.rank), PyBytes::new(py, blob))).map_err(failed)?;
        let start = Instant::now();
        let mut missing: Vec<usize> = (0..self.world).filter(|&r| r != self.rank).collect();
        while !missing.is_empty() {
            let mut still = Vec::new();
            for &r in &missing {
                let there: bool = store
                    .call_method1(intern!(py, "check"), (vec![self.key(r)],))
                    .and_then(|b| b.extract())
                    .map_err(failed)?;
                if !there {
                    still.push(r);
                }
            }
            missing = still;
            if missing.is_empty() {
                break;
            }
            if start.elapsed() >= self.timeout {
                let what =
                    format!("set-up through the torch.distributed store ({}, round {})", self.prefix, self.round);
                let timed_out = deadline::TimedOut { what, missing, timeout: self.timeout };
                return Err(bootstrap::BootstrapError::Missing { timed_out, refused: Vec::new() }.into());
            }
            py.detach(|| std::thread::sleep(STORE_POLL));
        }
        (0..self.world)
            .map(|r| {
                let got = store.call_method1(intern!(py, "get"), (self.key(r),)).map_err(failed)?;
                let bytes = got.cast::<PyBytes>().map_err(|e| failed(e.into()))?;
                Ok(bytes.as_bytes().to_vec())
            })
            .collect()
    }
}

impl across::Exchange for StoreExchange {
    fn all_gather(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>, across::Error> {
        self.round += 1;
        // Called with the interpreter detached (set-up runs so): the store is Python's.
        Python::attach(|py| self.gather(py, blob))
    }
}

/// torch.distributed's default store where the program imported torch and initialised a process group, else None.
fn torch_store(py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
    if crate::args::torch(py)?.is_none() {
        return Ok(None);
    }
    let dist = py.import("torch.distributed")?;
    if !dist.call_method0("is_available")?.extract::<bool>()?
        || !dist.call_method0("is_initialized")?.extract::<bool>()?
    {
        return Ok(None);
    }
    Ok(Some(py.import("torch.distributed.distributed_c10d")?.call_method0("_get_default_store")?.unbind()))
}

/// One rank's endpoint of an allreduce job over several nodes.
///
/// Across.from_env(...) under a launcher whose job spans nodes (torchrun, srun, mpirun): within each node the
/// intra-node communicator's designs, across nodes NCCL (RCCL on AMD), loaded at run time; the ids travel over TCP
/// to MASTER_ADDR:MASTER_PORT. all_reduce, reduce_scatter and all_gather on your tensors, enqueued on torch's current
/// stream. Every call is collective. A GPU driver is needed: the host driver has no NCCL. End it with close() or
/// `with`.
#[pyclass(module = "allreduce_rs", name = "Across", frozen)]
pub struct PyAcross {
    /// `None` once closed; taken with `try_lock`, as the communicator's (calls are collective, one at a time).
    inner: Mutex<Option<across::Across>>,
    reach: Reach,
    capacity: usize,
    rank: usize,
    node: usize,
    nodes: usize,
    local_rank: usize,
    local_world: usize,
    report: String,
}

fn path_named(path: Option<&str>) -> PyResult<Option<Path>> {
    match path {
        None => Ok(None),
        Some("nccl") => Ok(Some(Path::Nccl)),
        Some("hierarchical") => Ok(Some(Path::Hierarchical)),
        Some(other) => Err(ArgumentError::new_err(format!("path {other:?}: expected \"nccl\" or \"hierarchical\""))),
    }
}

impl PyAcross {
    /// Runs `f` on the open endpoint.
    fn with<R>(&self, f: impl FnOnce(&across::Across) -> Result<R, across::Error>) -> PyResult<R> {
        let guard: MutexGuard<'_, Option<across::Across>> = self.inner.try_lock().map_err(|e| match e {
            TryLockError::WouldBlock => AllreduceError::new_err(
                "the endpoint is in use by another thread: its calls are collective and run one at a time",
            ),
            TryLockError::Poisoned(_) => AllreduceError::new_err("the endpoint panicked in an earlier call"),
        })?;
        match guard.as_ref() {
            Some(a) => f(a).map_err(from_across),
            None => Err(AllreduceError::new_err("the endpoint is closed")),
        }
    }

    /// A reduce-scatter or all-gather of `input` into `out` over every rank of the job; returns `out`.
    fn issue_into<'py>(
        &self,
        py: Python<'py>,
        op: Op,
        input: &Bound<'py, PyAny>,
        out: &Bound<'py, PyAny>,
        stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (input, output) = self.reach.output_args(op, input, out)?;
        let handle = self.reach.stream_handle(py, stream)?;
        let (i, o) = (DevicePtr(input.ptr), DevicePtr(output.ptr));
        self.with(|a| {
            // SAFETY: as `Communicator.all_reduce`'s issue: tensors checked to be on this rank's device with the
            // op's sizes, alive while torch holds them and reused only in the order of the stream they were made
            // on; that every rank makes the same calls is the caller's part, as with torch.distributed.
            unsafe {
                match op {
                    Op::ReduceScatter => a.reduce_scatter(i, o, input.count, input.dtype, handle),
                    _ => a.all_gather(i, o, input.count, input.dtype, handle),
                }
            }
        })?;
        Ok(output.obj.into_bound(py))
    }
}

#[pymethods]
impl PyAcross {
    /// This rank's endpoint, its place and its job's nodes read from the launcher's environment. Collective: every
    /// rank of the job calls it with the same options. The set-up blobs (NCCL's ids) go through `store` (an object
    /// with torch.distributed.Store's `set`, `check` and `get`), else torch.distributed's default store when a
    /// process group is initialised, else over TCP at MASTER_ADDR:MASTER_PORT.
    #[staticmethod]
    #[pyo3(signature = (capacity_bytes = DEFAULT_CAPACITY, backend = "auto", timeout_s = None, setup_timeout_s = None,
                        store = None),
                  text_signature = "(capacity_bytes=33554432, backend='auto', timeout_s=None, setup_timeout_s=None, \
                                    store=None)")]
    fn from_env(
        py: Python<'_>,
        capacity_bytes: usize,
        backend: &str,
        timeout_s: Option<f64>,
        setup_timeout_s: Option<f64>,
        store: Option<Py<PyAny>>,
    ) -> PyResult<PyAcross> {
        let opts = options(capacity_bytes, backend, timeout_s, setup_timeout_s, None, None, None)?;
        let store = match store {
            Some(s) => Some(s),
            None => torch_store(py)?,
        };
        let a = match store {
            None => py.detach(move || across::Across::from_env(opts)),
            Some(store) => {
                let info = launch::detect()
                    .map_err(from_launch)?
                    .ok_or_else(|| from_across(allreduce::Error::NoLauncher.into()))?;
                let timeout = opts.timeouts().map_err(|e| from_across(e.into()))?.1;
                let n = STORE_SETUPS.fetch_add(1, Ordering::SeqCst);
                let prefix = format!("allreduce_rs/across/{}/{n}", info.job.as_str());
                let mut exchange =
                    StoreExchange { store, prefix, rank: info.rank, world: info.world, timeout, round: 0 };
                py.detach(move || across::Across::with_exchange(info, opts, &mut exchange))
            }
        }
        .map_err(from_across)?;
        let (t, i) = (a.topology(), a.local().gpu().info());
        Ok(PyAcross {
            reach: Reach { driver: i.kind, ordinal: i.ordinal, world: t.world() },
            capacity: capacity_bytes,
            rank: t.rank(),
            node: t.node(),
            nodes: t.nodes(),
            local_rank: t.local_rank(),
            local_world: t.local_world(),
            report: a.to_string(),
            inner: Mutex::new(Some(a)),
        })
    }

    /// Allreduces `tensor` over every rank of the job, in place or into `out`; returns the tensor that holds the
    /// sum. `path`: "nccl" (NCCL over the whole job) or "hierarchical" (reduce-scatter in the node, the shard across
    /// nodes over NCCL, all-gather in the node; the element count must divide by the node's ranks); default: the
    /// path table's for the size (see tune), NCCL without one.
    #[pyo3(signature = (tensor, out = None, *, path = None, stream = None))]
    fn all_reduce<'py>(
        &self,
        py: Python<'py>,
        tensor: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        path: Option<&str>,
        stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let path = path_named(path)?;
        let (input, output) = self.reach.all_reduce_args(tensor, out)?;
        let handle = self.reach.stream_handle(py, stream)?;
        let (i, o) = (DevicePtr(input.ptr), DevicePtr(output.as_ref().map_or(input.ptr, |o| o.ptr)));
        // SAFETY: as in `issue_into`.
        self.with(|a| unsafe { a.all_reduce(i, o, input.count, input.dtype, handle, path) })?;
        Ok(output.map_or(input.obj, |o| o.obj).into_bound(py))
    }

    /// Reduce-scatter over every rank of the job: rank r receives elements [r * n / W, (r + 1) * n / W) of the sum
    /// of every rank's `input` (n elements, divisible by the world size) in `out`; returns `out`.
    #[pyo3(signature = (input, out, *, stream = None))]
    fn reduce_scatter<'py>(
        &self,
        py: Python<'py>,
        input: &Bound<'py, PyAny>,
        out: &Bound<'py, PyAny>,
        stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.issue_into(py, Op::ReduceScatter, input, out, stream)
    }

    /// All-gather over every rank of the job: `out` receives every rank's `input` in rank order; returns `out`.
    #[pyo3(signature = (input, out, *, stream = None))]
    fn all_gather<'py>(
        &self,
        py: Python<'py>,
        input: &Bound<'py, PyAny>,
        out: &Bound<'py, PyAny>,
        stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.issue_into(py, Op::AllGather, input, out, stream)
    }

    /// Raises the error that ended this endpoint, if any: a wait in this node's kernels (a peer named), or an NCCL
    /// step past its deadline (the set-up one, from its enqueue) or a communicator's error (the watchdog aborted the
    /// NCCL communicators); for programs that want to look after a graph replay or before trusting a result.
    fn check(&self) -> PyResult<()> {
        self.with(|a| a.check())
    }

    /// Times both paths at `counts` elements of `dtype` (default: 4**5 to 4**11 elements, as far as the capacity
    /// allows), `iters` calls per repeat, the slowest rank's median of `repeats`, and makes the fastest per size the
    /// path of every later all_reduce without `path=`; rank 0 stores the table in the tune cache, where later
    /// endpoints of this job's shape find it. Collective. Returns the table as `[(max_bytes or None, path)]`.
    #[pyo3(signature = (dtype = None, counts = None, iters = 20, repeats = 3))]
    fn tune(
        &self,
        py: Python<'_>,
        dtype: Option<&Bound<'_, PyAny>>,
        counts: Option<Vec<usize>>,
        iters: u64,
        repeats: u64,
    ) -> PyResult<PathRows> {
        let dtype = dtype.map(crate::args::dtype_of).transpose()?.unwrap_or(allreduce::DType::Bf16);
        let counts = counts
            .unwrap_or_else(|| (5..=11).map(|e| 4usize.pow(e)).filter(|c| c * dtype.size() <= self.capacity).collect());
        let mut guard = self.inner.try_lock().map_err(|_| AllreduceError::new_err("the endpoint is in use"))?;
        let a = guard.as_mut().ok_or_else(|| AllreduceError::new_err("the endpoint is closed"))?;
        let table = py.detach(|| a.tune(dtype, &counts, iters, repeats)).map_err(from_across)?;
        Ok(path_rows(&table))
    }

    /// The path table every rank follows (`[(max_bytes or None, path)]`), or None: then every all_reduce without
    /// `path=` takes NCCL over the whole job.
    #[getter]
    fn path_table(&self) -> PyResult<Option<PathRows>> {
        self.with(|a| Ok(a.path_table().map(path_rows)))
    }

    /// The path the last all_reduce took ("nccl" or "hierarchical"), or None before the first.
    #[getter]
    fn last_path(&self) -> PyResult<Option<String>> {
        self.with(|a| Ok(a.last_path().map(|p| p.to_string())))
    }

    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    #[getter]
    fn world_size(&self) -> usize {
        self.reach.world
    }

    /// This rank's node, of `nodes`.
    #[getter]
    fn node(&self) -> usize {
        self.node
    }

    #[getter]
    fn nodes(&self) -> usize {
        self.nodes
    }

    /// This rank's place in its node, of `local_world_size`.
    #[getter]
    fn local_rank(&self) -> usize {
        self.local_rank
    }

    #[getter]
    fn local_world_size(&self) -> usize {
        self.local_world
    }

    /// The placement report: the nodes, this rank's node group and rail, its node's devices.
    fn placement(&self) -> String {
        self.report.clone()
    }

    /// Releases the endpoint (its node's communicator and NCCL's); later calls raise. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self.inner.try_lock().map_err(|_| AllreduceError::new_err("the endpoint is in use"))?.take();
        py.detach(move || drop(taken));
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py)
    }

    fn __repr__(&self) -> String {
        let (r, w, n, ns, d, o) =
            (self.rank, self.reach.world, self.node, self.nodes, self.reach.driver, self.reach.ordinal);
        format!("<allreduce_rs.Across rank {r} of {w}, node {n} of {ns}, on {d} device {o}>")
    }
}
