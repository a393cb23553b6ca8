//! `allreduce_rs.Communicator`: the Rust communicator behind a lock, with every argument checked here, in Python
//! exceptions, before the unsafe call (which checks again).

use crate::args::{self, Arg, Memory};
use crate::dlpack::{self, View};
use crate::errors::{from_error, AllreduceError, ArgumentError, CapacityError};
use allreduce::{Algorithm, Communicator, DType, DevicePtr, DriverKind, Mode, Options, Residency, TuneRequest};
use collective_core::{Op, VEC_BYTES};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

/// The default capacity: 32 MiB, comm_bench.py's largest bf16 message.
pub const DEFAULT_CAPACITY: usize = 32 << 20;

/// What a call needs behind the lock.
struct State {
    comm: Communicator,
    /// The host driver's stream for calls that force an algorithm (the slice calls bring their own).
    host_stream: Option<gpu::Stream>,
    /// Objects whose memory was registered with the peers: kept alive as long as the communicator, as
    /// `Communicator::register` requires.
    registered: Vec<Py<PyAny>>,
}

/// One rank's endpoint of an intra-node allreduce job.
///
/// Communicator.from_env(...) under a launcher, or Communicator(rank, world_size, local_rank, job_id, ...). It runs
/// all_reduce and reduce_scatter on your tensors: on a GPU driver enqueued on torch's current stream with no host
/// synchronisation (torch.cuda.graph captures it), on the host driver (numpy arrays, CPU tensors) complete on
/// return; the algorithm per size comes from a table tuned on this machine, and every algorithm gives the same
/// bits. Every call is collective. Errors are allreduce_rs.AllreduceError subclasses. End it with close() or
/// `with`.
#[pyclass(module = "allreduce_rs", name = "Communicator", frozen)]
pub struct PyCommunicator {
    /// `None` once closed. Calls take it with `try_lock`: a communicator's calls are collective and run one at a
    /// time, so a second thread is told so instead of waiting (with the GIL) on the first.
    state: Mutex<Option<State>>,
    rank: usize,
    world: usize,
    local_rank: usize,
    capacity: usize,
    driver: DriverKind,
    ordinal: usize,
    device_name: String,
    placement: allreduce::Placement,
    notes: Vec<String>,
    /// `table_source` of the eager and graph tables, fixed at construction.
    sources: [[String; 3]; 2],
    /// Live DLPack views of the registered buffers.
    views: Arc<AtomicUsize>,
}

/// Which of the communicator's registered buffers.
#[derive(Clone, Copy)]
enum Which {
    Input,
    Output,
}

/// A registered buffer of a communicator, exported through DLPack (`torch.from_dlpack(buf)`,
/// `numpy.from_dlpack(buf)` on the host driver).
#[pyclass(module = "allreduce_rs", name = "RegisteredBuffer", frozen)]
pub struct RegisteredBuffer {
    comm: Py<PyCommunicator>,
    view: View,
    which: Which,
}

/// Where one rank runs (an entry of `Placement.ranks`).
#[pyclass(module = "allreduce_rs", name = "RankDevice", frozen, get_all)]
pub struct PyRankDevice {
    rank: usize,
    local_rank: usize,
    host: String,
    ordinal: usize,
    bus_id: String,
    visible: usize,
}

/// Where every rank runs, as the ranks agreed at construction.
#[pyclass(module = "allreduce_rs", name = "Placement", frozen)]
pub struct PyPlacement {
    inner: allreduce::Placement,
}

fn options(
    capacity_bytes: usize,
    backend: &str,
    timeout_s: Option<f64>,
    setup_timeout_s: Option<f64>,
    tune_dir: Option<PathBuf>,
    tune_table: Option<PathBuf>,
) -> PyResult<Options> {
    let seconds = |what: &str, s: Option<f64>| -> PyResult<Option<Duration>> {
        s.map(|s| deadline::seconds(s).map_err(|e| ArgumentError::new_err(format!("{what}: {e}")))).transpose()
    };
    Ok(Options {
        backend: backend.parse().map_err(|e: gpu::GpuError| ArgumentError::new_err(e.to_string()))?,
        capacity_bytes,
        timeout: seconds("timeout_s", timeout_s)?,
        setup_timeout: seconds("setup_timeout_s", setup_timeout_s)?,
        tune_dir,
        tune_table,
    })
}

fn mode_of(mode: &str) -> PyResult<Mode> {
    Mode::ALL
        .into_iter()
        .find(|m| m.name() == mode)
        .ok_or_else(|| ArgumentError::new_err(format!("mode {mode:?}: expected \"eager\" or \"graph\"")))
}

impl PyCommunicator {
    /// Builds the communicator with the interpreter detached: set-up waits for every peer (and may compile kernels).
    fn build(py: Python<'_>, info: Option<launch::RankInfo>, opts: Options) -> PyResult<PyCommunicator> {
        let comm = py
            .detach(move || match info {
                Some(info) => Communicator::new(info, opts),
                None => Communicator::from_env(opts),
            })
            .map_err(from_error)?;
        let i = comm.gpu().info().clone();
        let host_stream = match i.kind {
            DriverKind::Host => Some(comm.gpu().stream().map_err(|e| from_error(e.into()))?),
            _ => None,
        };
        let placement = comm.placement().clone();
        let rank = comm.rank();
        Ok(PyCommunicator {
            rank,
            world: comm.world(),
            local_rank: placement.ranks[rank].local_rank,
            capacity: comm.capacity_bytes(),
            driver: i.kind,
            ordinal: i.ordinal,
            device_name: i.name,
            notes: comm.notes().to_vec(),
            sources: Mode::ALL.map(|m| Residency::ALL.map(|r| comm.table_source(m, r).to_string())),
            placement,
            views: Arc::new(AtomicUsize::new(0)),
            state: Mutex::new(Some(State { comm, host_stream, registered: Vec::new() })),
        })
    }

    fn lock(&self) -> PyResult<MutexGuard<'_, Option<State>>> {
        self.state.try_lock().map_err(|e| match e {
            TryLockError::WouldBlock => AllreduceError::new_err(
                "the communicator is in use by another thread: its calls are collective and run one at a time",
            ),
            TryLockError::Poisoned(_) => {
                AllreduceError::new_err("the communicator panicked in an earlier call and is unusable")
            }
        })
    }

    /// Runs `f` on the open communicator.
    fn with<R>(&self, f: impl FnOnce(&mut State) -> PyResult<R>) -> PyResult<R> {
        match self.lock()?.as_mut() {
            Some(state) => f(state),
            None => Err(AllreduceError::new_err("the communicator is closed")),
        }
    }

    /// Refuses a tensor this communicator's driver cannot reach, or one larger than the capacity.
    fn check(&self, arg: &Arg, what: &str) -> PyResult<()> {
        let wrong_place = |there: String| {
            let here = match self.driver {
                DriverKind::Host => "host memory (numpy arrays, CPU tensors)".to_string(),
                d => format!("{d} device {} (torch device cuda:{})", self.ordinal, self.ordinal),
            };
            ArgumentError::new_err(format!(
                "{what}: {there}, but this communicator's driver ({}) reads {here}",
                self.driver
            ))
        };
        match (&arg.memory, self.driver) {
            (Memory::Host, DriverKind::Host) => {}
            (Memory::Device(d), DriverKind::Cuda | DriverKind::Hip) if *d == self.ordinal as i64 => {}
            (Memory::Host, _) => return Err(wrong_place("in host memory".into())),
            (Memory::Device(d), _) => return Err(wrong_place(format!("on torch device cuda:{d}"))),
            (Memory::Other(kind), _) => return Err(wrong_place(format!("on a torch {kind} device"))),
        }
        if arg.bytes() > self.capacity {
            return Err(CapacityError::new_err((
                format!(
                    "{what}: {} elements of {} are {} bytes, beyond the communicator's capacity_bytes={}",
                    arg.count,
                    arg.dtype,
                    arg.bytes(),
                    self.capacity
                ),
                arg.bytes(),
                self.capacity,
            )));
        }
        // Host slices are read as `&[T]`, which needs element alignment; device pointers the kernels load need 16.
        let align = if self.driver == DriverKind::Host { arg.dtype.size() } else { VEC_BYTES };
        if !arg.ptr.is_multiple_of(align as u64) {
            return Err(ArgumentError::new_err(format!(
                "{what}: address {:#x} is not aligned to {align} bytes (a view at an odd offset?): pass a copy",
                arg.ptr
            )));
        }
        Ok(())
    }

    /// An allreduce's tensors, checked: `out` is `None` for an in-place call (no `out`, or `out` is `tensor`).
    fn all_reduce_args<'py>(
        &self,
        tensor: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Arg, Option<Arg>)> {
        let input = args::describe(tensor, "tensor")?;
        self.check(&input, "tensor")?;
        let output = match out {
            None if !input.writable => {
                return Err(ArgumentError::new_err("tensor: read-only, so it cannot be reduced in place; pass out="))
            }
            None => None,
            Some(o) => {
                let o = args::describe(o, "out")?;
                self.check(&o, "out")?;
                same_shape(&input, &o, input.count, "the tensor's")?;
                if !o.writable {
                    return Err(ArgumentError::new_err("out: read-only"));
                }
                if o.ptr == input.ptr {
                    None
                } else if o.overlaps(&input) {
                    return Err(ArgumentError::new_err(
                        "out overlaps tensor without being the same memory: pass the same tensor, or disjoint ones",
                    ));
                } else {
                    Some(o)
                }
            }
        };
        Ok((input, output))
    }

    /// A reduce-scatter's input and output, checked.
    fn reduce_scatter_args<'py>(&self, input: &Bound<'py, PyAny>, out: &Bound<'py, PyAny>) -> PyResult<(Arg, Arg)> {
        let input = args::describe(input, "input")?;
        self.check(&input, "input")?;
        let output = args::describe(out, "out")?;
        self.check(&output, "out")?;
        if !input.count.is_multiple_of(self.world) {
            return Err(ArgumentError::new_err(format!(
                "input: {} elements do not divide among {} ranks",
                input.count, self.world
            )));
        }
        same_shape(&input, &output, input.count / self.world, "a shard of the input's")?;
        if !output.writable {
            return Err(ArgumentError::new_err("out: read-only"));
        }
        if output.overlaps(&input) {
            return Err(ArgumentError::new_err("out overlaps input: a reduce-scatter needs disjoint buffers"));
        }
        Ok((input, output))
    }

    /// Issues one checked call (`all_reduce_args` / `reduce_scatter_args`) on stream `handle`.
    fn issue(
        &self,
        py: Python<'_>,
        op: Op,
        algo: Option<Algorithm>,
        input: &Arg,
        output: Option<&Arg>,
        handle: u64,
    ) -> PyResult<Algorithm> {
        self.with(|state| {
            if self.driver == DriverKind::Host {
                return PyCommunicator::host_call(state, op, algo, input, output);
            }
            let out = output.map_or(input.ptr, |o| o.ptr);
            // SAFETY: checked by the *_args functions: device memory of this communicator's device holding `count`
            // elements (a shard's for a reduce-scatter's output), 16-byte aligned, identical or disjoint; alive
            // while torch holds the tensors (a PreparedCall holds their storage), whose caching allocator reuses
            // their memory only in the order of the stream they were made on (the current stream, unless the
            // caller passed another and recorded it, as for any side-stream work). That every rank makes the same
            // calls is the caller's part, as with torch.distributed.
            let (ptr, out, count, dtype) = (DevicePtr(input.ptr), DevicePtr(out), input.count, input.dtype);
            let algo = unsafe {
                match op {
                    Op::AllReduce => state.comm.all_reduce_with(algo, ptr, out, count, dtype, handle),
                    Op::ReduceScatter => state.comm.reduce_scatter(ptr, out, count, dtype, handle),
                }
            }
            .map_err(from_error)?;
            // A recorded capture's calls may read these tensors in place from every peer at each replay: kept alive
            // with the communicator, as end_graph_capture requires.
            if state.comm.recording_graph_capture() {
                state.registered.extend(std::iter::once(input).chain(output).map(|a| a.obj.clone_ref(py)));
            }
            Ok(algo)
        })
    }

    /// The stream a device call is enqueued on: `stream` (a handle, or an object with `cuda_stream`), else torch's
    /// current stream of this device. On the host driver calls run to completion on this thread and take none.
    fn stream_handle(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
        if self.driver == DriverKind::Host {
            return match stream {
                None => Ok(0),
                Some(_) => Err(ArgumentError::new_err(
                    "stream: the host driver runs each call to completion on the calling thread and takes no stream",
                )),
            };
        }
        match stream {
            Some(s) => match s.extract::<u64>() {
                Ok(h) => Ok(h),
                Err(_) => s.getattr("cuda_stream")?.extract(),
            },
            None => {
                let torch = args::torch(py)?.ok_or_else(|| {
                    ArgumentError::new_err("stream: torch is not imported, so there is no current stream to use")
                })?;
                torch.current_stream(py, self.ordinal as i64)
            }
        }
    }

    /// One call on the host driver: through the slice calls (which stage unaligned memory) or, with a forced
    /// algorithm, through the raw call on the host stream (16-byte alignment required).
    fn host_call(
        state: &mut State,
        op: Op,
        algo: Option<Algorithm>,
        input: &Arg,
        output: Option<&Arg>,
    ) -> PyResult<Algorithm> {
        let (count, dtype) = (input.count, input.dtype);
        if let Some(a) = algo {
            for (what, p) in [("tensor", input.ptr), ("out", output.map_or(input.ptr, |o| o.ptr))] {
                if !p.is_multiple_of(VEC_BYTES as u64) {
                    return Err(ArgumentError::new_err(format!(
                        "{what}: address {p:#x} is not aligned to {VEC_BYTES} bytes, which algorithm={a} needs"
                    )));
                }
            }
            let out = output.map_or(input.ptr, |o| o.ptr);
            let stream = state.host_stream.as_ref().expect("the host driver has a stream").handle();
            // SAFETY: on the host driver device memory is process memory; the arrays are alive (held by the
            // caller, or by a PreparedCall) and untouched while this thread, holding the GIL, runs the call to
            // completion.
            return unsafe {
                state.comm.all_reduce_with(algo, DevicePtr(input.ptr), DevicePtr(out), count, dtype, stream)
            }
            .map_err(from_error);
        }
        match dtype {
            DType::Bf16 => host_slices::<half::bf16>(state, op, input, output),
            DType::F16 => host_slices::<half::f16>(state, op, input, output),
            DType::F32 => host_slices::<f32>(state, op, input, output),
        }
    }
}

/// The slice calls on `input` / `output` as `[T]`.
fn host_slices<T: allreduce::Scalar>(
    state: &mut State,
    op: Op,
    input: &Arg,
    output: Option<&Arg>,
) -> PyResult<Algorithm> {
    // SAFETY: the checks made these host memory of `count` elements of T, element-aligned, non-null (at least one
    // element), alive (held by the caller, or by a PreparedCall), distinct or identical (never partly overlapping),
    // and writable where written; nothing else runs while this thread holds the GIL through the call.
    let result = unsafe {
        match (op, output) {
            (Op::AllReduce, None) => {
                state.comm.all_reduce_host_in_place(std::slice::from_raw_parts_mut(input.ptr as *mut T, input.count))
            }
            (Op::AllReduce, Some(o)) => state.comm.all_reduce_host(
                std::slice::from_raw_parts(input.ptr as *const T, input.count),
                std::slice::from_raw_parts_mut(o.ptr as *mut T, o.count),
            ),
            (Op::ReduceScatter, Some(o)) => state.comm.reduce_scatter_host(
                std::slice::from_raw_parts(input.ptr as *const T, input.count),
                std::slice::from_raw_parts_mut(o.ptr as *mut T, o.count),
            ),
            (Op::ReduceScatter, None) => unreachable!("reduce_scatter always has an output"),
        }
    };
    result.map_err(from_error)
}

#[pymethods]
impl PyCommunicator {
    /// A communicator at an explicit place, without a launcher. Collective: every rank of the job calls it with
    /// the same world_size, job_id (16 to 64 lowercase hex digits; see new_job_id()) and options.
    #[new]
    #[pyo3(signature = (rank, world_size, local_rank, job_id, *, capacity_bytes = DEFAULT_CAPACITY, backend = "auto",
                        timeout_s = None, setup_timeout_s = None, tune_dir = None, tune_table = None),
                  text_signature = "(rank, world_size, local_rank, job_id, *, capacity_bytes=33554432, backend='auto', \
                                    timeout_s=None, setup_timeout_s=None, tune_dir=None, tune_table=None)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        rank: usize,
        world_size: usize,
        local_rank: usize,
        job_id: &str,
        capacity_bytes: usize,
        backend: &str,
        timeout_s: Option<f64>,
        setup_timeout_s: Option<f64>,
        tune_dir: Option<PathBuf>,
        tune_table: Option<PathBuf>,
    ) -> PyResult<PyCommunicator> {
        let job = ipc::JobId::parse(job_id).map_err(|e| ArgumentError::new_err(format!("job_id: {e}")))?;
        let info = launch::RankInfo::explicit(rank, world_size, local_rank, job).map_err(crate::errors::from_launch)?;
        let opts = options(capacity_bytes, backend, timeout_s, setup_timeout_s, tune_dir, tune_table)?;
        PyCommunicator::build(py, Some(info), opts)
    }

    /// This rank's communicator, its place read from the launcher's environment (python -m allreduce_rs.launch,
    /// comm-bench launch, torchrun, OpenMPI's mpirun, srun, MPICH / Intel MPI with ALLREDUCE_JOB_ID). Collective.
    #[staticmethod]
    #[pyo3(signature = (capacity_bytes = DEFAULT_CAPACITY, backend = "auto", timeout_s = None, setup_timeout_s = None,
                        tune_dir = None, tune_table = None),
                  text_signature = "(capacity_bytes=33554432, backend='auto', timeout_s=None, setup_timeout_s=None, \
                                    tune_dir=None, tune_table=None)")]
    fn from_env(
        py: Python<'_>,
        capacity_bytes: usize,
        backend: &str,
        timeout_s: Option<f64>,
        setup_timeout_s: Option<f64>,
        tune_dir: Option<PathBuf>,
        tune_table: Option<PathBuf>,
    ) -> PyResult<PyCommunicator> {
        let opts = options(capacity_bytes, backend, timeout_s, setup_timeout_s, tune_dir, tune_table)?;
        PyCommunicator::build(py, None, opts)
    }

    /// Allreduces `tensor` in place, or into `out`; returns the tensor that holds the sum.
    #[pyo3(signature = (tensor, out = None, *, stream = None, algorithm = None))]
    fn all_reduce<'py>(
        &self,
        py: Python<'py>,
        tensor: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        stream: Option<&Bound<'py, PyAny>>,
        algorithm: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let algo = algorithm_named(algorithm)?;
        let (input, output) = self.all_reduce_args(tensor, out)?;
        let handle = self.stream_handle(py, stream)?;
        self.issue(py, Op::AllReduce, algo, &input, output.as_ref(), handle)?;
        Ok(output.map_or(input.obj, |o| o.obj).into_bound(py))
    }

    /// Reduce-scatter: rank r receives elements [r * n / W, (r + 1) * n / W) of the sum of every rank's `input`
    /// (n elements, divisible by the world size) in `out` (n / W elements); returns `out`.
    #[pyo3(signature = (input, out, *, stream = None))]
    fn reduce_scatter<'py>(
        &self,
        py: Python<'py>,
        input: &Bound<'py, PyAny>,
        out: &Bound<'py, PyAny>,
        stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (input, output) = self.reduce_scatter_args(input, out)?;
        let handle = self.stream_handle(py, stream)?;
        self.issue(py, Op::ReduceScatter, None, &input, Some(&output), handle)?;
        Ok(output.obj.into_bound(py))
    }

    /// all_reduce(tensor, out, algorithm=...) checked once and bound: the returned PreparedCall issues it with
    /// `call()` (or `call(stream=...)`), reading no tensor attribute again, for a hot loop that reduces the same
    /// buffers each step. It keeps the tensors' storage alive and always reduces the memory they had when prepared.
    #[pyo3(signature = (tensor, out = None, *, algorithm = None))]
    fn prepare_all_reduce(
        slf: &Bound<'_, Self>,
        tensor: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        algorithm: Option<&str>,
    ) -> PyResult<PreparedCall> {
        let algo = algorithm_named(algorithm)?;
        let (input, output) = slf.get().all_reduce_args(tensor, out)?;
        PreparedCall::new(slf, Op::AllReduce, algo, input, output)
    }

    /// reduce_scatter(input, out) checked once and bound, as prepare_all_reduce.
    fn prepare_reduce_scatter(
        slf: &Bound<'_, Self>,
        input: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<PreparedCall> {
        let (input, output) = slf.get().reduce_scatter_args(input, out)?;
        PreparedCall::new(slf, Op::ReduceScatter, None, input, Some(output))
    }

    /// Registers the memory of `tensor` (a CUDA / ROCm tensor of this device) with every peer, so calls on tensors
    /// inside it read and write it in place on every rank. Collective: every rank registers a tensor of the same
    /// size, in the same order. The tensor is kept alive as long as the communicator. Returns the registration's
    /// index.
    fn register(&self, py: Python<'_>, tensor: &Bound<'_, PyAny>) -> PyResult<usize> {
        let arg = args::describe(tensor, "tensor")?;
        let on_device = matches!(arg.memory, Memory::Device(_));
        if on_device {
            self.check(&arg, "tensor")?;
        }
        let (ptr, bytes) = (DevicePtr(arg.ptr), arg.bytes());
        self.with(|state| {
            let comm = &mut state.comm;
            // SAFETY: the memory is this device's (checked; the host driver refuses what it cannot share, with the
            // reason) and stays allocated while the communicator lives: the tensor is kept below.
            let index = py.detach(move || unsafe { comm.register(ptr, bytes) }).map_err(from_error)?;
            state.registered.push(tensor.clone().unbind());
            Ok(index)
        })
    }

    /// The registered input buffer as a DLPack exporter of `count` elements of `dtype` (default: the whole buffer):
    /// `torch.from_dlpack(comm.registered_input(torch.bfloat16))`. Writing the input there saves the zero-copy
    /// algorithms their copy-in; pass the tensor (from its start) to all_reduce.
    #[pyo3(signature = (dtype = None, count = None))]
    fn registered_input(
        slf: &Bound<'_, Self>,
        dtype: Option<&Bound<'_, PyAny>>,
        count: Option<usize>,
    ) -> PyResult<RegisteredBuffer> {
        registered(slf, Which::Input, dtype, count)
    }

    /// The registered output buffer, which the zero-copy two-shot's peers write into directly; as
    /// registered_input.
    #[pyo3(signature = (dtype = None, count = None))]
    fn registered_output(
        slf: &Bound<'_, Self>,
        dtype: Option<&Bound<'_, PyAny>>,
        count: Option<usize>,
    ) -> PyResult<RegisteredBuffer> {
        registered(slf, Which::Output, dtype, count)
    }

    /// Measures every algorithm on this machine (eager and graph, on your tensors, on the registered buffers and on
    /// registered tensors), checked first, and stores the fastest per size in the tune cache, where later
    /// communicators find them. `counts`: the element counts to measure [default: comm_bench.py's sizes up to the
    /// capacity]. Collective. Returns the files written.
    #[pyo3(signature = (dtype = None, counts = None))]
    fn tune(
        &self,
        py: Python<'_>,
        dtype: Option<&Bound<'_, PyAny>>,
        counts: Option<Vec<usize>>,
    ) -> PyResult<Vec<PathBuf>> {
        let mut req = TuneRequest::new(dtype.map_or(Ok(DType::Bf16), args::dtype_of)?);
        req.counts = counts;
        self.with(|state| {
            let comm = &mut state.comm;
            let report = py.detach(move || comm.tune_with(&req)).map_err(from_error)?;
            Ok(report.tables.into_iter().map(|t| t.1).collect())
        })
    }

    /// Waits until every rank has called it (host-side, through the rendezvous; not ordered with any stream).
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.with(|state| {
            let comm = &mut state.comm;
            py.detach(move || comm.rendezvous().barrier("allreduce_rs barrier")).map_err(|e| from_error(e.into()))
        })
    }

    /// Every rank's `data` (at most 64 KiB), in rank order: small host messages for tests and timing, not a
    /// data path.
    fn all_gather_bytes<'py>(&self, py: Python<'py>, data: &[u8]) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let all = self.with(|state| {
            let comm = &mut state.comm;
            py.detach(move || comm.rendezvous().all_gather("allreduce_rs all_gather_bytes", data))
                .map_err(|e| from_error(e.into()))
        })?;
        Ok(all.iter().map(|b| PyBytes::new(py, b)).collect())
    }

    /// Where the table came from that calls issued in `mode` ("eager" or "graph") on buffers in `residency`
    /// ("caller": your own tensors; "registered": the registered buffers; "caller_registered": tensors shared with
    /// `register` or by a graph capture) follow.
    #[pyo3(signature = (mode = "eager", residency = "caller"))]
    fn table_source(&self, mode: &str, residency: &str) -> PyResult<String> {
        let r = Residency::from_name(residency).ok_or_else(|| {
            ArgumentError::new_err(format!(
                "residency {residency:?}: expected \"caller\", \"registered\" or \"caller_registered\""
            ))
        })?;
        Ok(self.sources[mode_of(mode)? as usize][r as usize].clone())
    }

    /// Begins recording a CUDA graph capture on your own tensors (use `graph_capture()` around
    /// `torch.cuda.graph`): calls captured until `end_graph_capture` read every rank's tensors in place at replay,
    /// once the end has shared them. Collective; call it before the capture begins.
    fn begin_graph_capture(&self, py: Python<'_>) -> PyResult<()> {
        self.with(|state| {
            let comm = &mut state.comm;
            py.detach(move || comm.begin_graph_capture()).map_err(from_error)
        })
    }

    /// Ends the recording once the capture has ended: every rank shares and maps the captured calls' tensors (which
    /// the communicator keeps alive from then on). Collective; returns how many calls were registered. Replay the
    /// graph only after it returns.
    fn end_graph_capture(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(|state| {
            let comm = &mut state.comm;
            // SAFETY: the captured calls' tensors are held in `state.registered` (issue keeps them while a capture
            // is recorded), so their memory stays allocated while the communicator lives; the caller replays only
            // after this returns (documented).
            py.detach(move || unsafe { comm.end_graph_capture() }).map_err(from_error)
        })
    }

    /// A context manager for `with comm.graph_capture(): with torch.cuda.graph(g): ...`: begins recording on
    /// entry and registers the captured tensors on exit, so every replay runs zero-copy on them.
    fn graph_capture(slf: &Bound<'_, Self>) -> GraphCapture {
        GraphCapture { comm: slf.clone().unbind() }
    }

    /// Ends the communicator: a barrier with every peer (they may still read this rank's buffers), then its
    /// buffers are unmapped. Refused while tensors made from registered_input/registered_output are alive.
    /// Collective; later calls raise AllreduceError.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let views = self.views.load(Ordering::SeqCst);
        if views > 0 {
            return Err(AllreduceError::new_err(format!(
                "{views} tensor(s) made from the registered buffers are still alive: delete them before close()"
            )));
        }
        let taken = self.lock()?.take();
        if let Some(State { comm, host_stream, registered }) = taken {
            drop(registered);
            py.detach(move || {
                drop(host_stream);
                drop(comm);
            });
        }
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py)
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }
    /// The number of ranks.
    #[getter]
    fn world_size(&self) -> usize {
        self.world
    }
    /// This rank's index on its host.
    #[getter]
    fn local_rank(&self) -> usize {
        self.local_rank
    }
    /// The largest message in bytes.
    #[getter]
    fn capacity_bytes(&self) -> usize {
        self.capacity
    }
    /// The driver in use: "host", "cuda" or "hip".
    #[getter]
    fn backend(&self) -> String {
        self.driver.to_string()
    }
    /// The device ordinal (torch's `cuda:N` index) on GPU drivers; 0 on the host driver.
    #[getter]
    fn device(&self) -> usize {
        self.ordinal
    }
    /// The device's name.
    #[getter]
    fn device_name(&self) -> &str {
        &self.device_name
    }
    /// The algorithm the last call ran (None before the first).
    #[getter]
    fn last_algorithm(&self) -> PyResult<Option<&'static str>> {
        self.with(|state| Ok(state.comm.last_algorithm().map(Algorithm::name)))
    }
    /// What set-up decided on the caller's behalf (drivers passed over, built-in tables in use).
    #[getter]
    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }
    /// Where every rank runs.
    #[getter]
    fn placement(&self) -> PyPlacement {
        PyPlacement { inner: self.placement.clone() }
    }
    /// Whether close() has run.
    #[getter]
    fn closed(&self) -> bool {
        self.state.try_lock().map(|g| g.is_none()).unwrap_or(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "<allreduce_rs.Communicator rank {} of {} on {} device {} ({}), capacity {} bytes>",
            self.rank, self.world, self.driver, self.ordinal, self.device_name, self.capacity
        )
    }
}

/// Refuses an output whose dtype or element count is not the call's.
fn same_shape(input: &Arg, out: &Arg, want: usize, whose: &str) -> PyResult<()> {
    if out.dtype != input.dtype {
        return Err(ArgumentError::new_err(format!(
            "out: dtype {} differs from the input's {}",
            out.dtype, input.dtype
        )));
    }
    if out.count != want {
        return Err(ArgumentError::new_err(format!("out: {} elements, not {whose} {want}", out.count)));
    }
    Ok(())
}

fn registered(
    slf: &Bound<'_, PyCommunicator>,
    which: Which,
    dtype: Option<&Bound<'_, PyAny>>,
    count: Option<usize>,
) -> PyResult<RegisteredBuffer> {
    let me = slf.get();
    let dtype = dtype.map_or(Ok(DType::Bf16), args::dtype_of)?;
    let (ptr, bytes) = me.with(|state| {
        let buf = match which {
            Which::Input => state.comm.registered_input(),
            Which::Output => state.comm.registered_output(),
        };
        Ok((buf.ptr().0, buf.bytes()))
    })?;
    let fits = bytes / dtype.size();
    let count = count.unwrap_or(fits);
    if count == 0 || count > fits {
        return Err(CapacityError::new_err((
            format!("count={count}: the registered buffer holds 1 to {fits} elements of {dtype}"),
            count * dtype.size(),
            bytes,
        )));
    }
    let device = match me.driver {
        DriverKind::Host => (dlpack::CPU, 0),
        DriverKind::Cuda => (dlpack::CUDA, me.ordinal as i32),
        DriverKind::Hip => (dlpack::ROCM, me.ordinal as i32),
    };
    Ok(RegisteredBuffer { comm: slf.clone().unbind(), view: View { ptr, count, dtype, device }, which })
}

#[pymethods]
impl RegisteredBuffer {
    /// A DLPack capsule of the buffer (the DLPack protocol; `torch.from_dlpack(buf)` calls it). The tensor made
    /// from it keeps the communicator alive, and close() refuses while it lives. The buffer is shared by
    /// reference: `copy=True` is refused; `stream` is accepted and needs nothing (no work of ours is pending on
    /// the buffer other than the caller's own calls, ordered by the caller's streams).
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__(
        slf: &Bound<'_, Self>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        if stream.is_some_and(|s| s.extract::<i64>().is_err()) {
            return Err(PyBufferError::new_err("stream: DLPack passes a stream as an integer"));
        }
        let me = slf.get();
        let comm = me.comm.get();
        comm.with(|_| Ok(()))?;
        if copy == Some(true) {
            return Err(PyBufferError::new_err("copy=True: a registered buffer is exported by reference only"));
        }
        if let Some(d) = dl_device.filter(|&d| d != me.view.device) {
            return Err(PyBufferError::new_err(format!(
                "dl_device={d:?}: the buffer is on DLPack device {:?}",
                me.view.device
            )));
        }
        let versioned = max_version.is_some_and(|v| v.0 >= 1);
        dlpack::capsule(slf.py(), &me.view, slf.clone().into_any().unbind(), comm.views.clone(), versioned)
    }

    /// (DLPack device type, device id): (1, 0) for host memory, (2, N) for CUDA device N, (10, N) for ROCm.
    fn __dlpack_device__(&self) -> (i32, i32) {
        self.view.device
    }

    /// The buffer's address.
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.view.ptr
    }
    /// Its elements.
    #[getter]
    fn count(&self) -> usize {
        self.view.count
    }
    /// Its bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.view.count * self.view.dtype.size()
    }
    /// Its dtype: "bf16", "fp16" or "fp32".
    #[getter]
    fn dtype(&self) -> &'static str {
        self.view.dtype.name()
    }

    fn __repr__(&self) -> String {
        let which = match self.which {
            Which::Input => "input",
            Which::Output => "output",
        };
        format!(
            "<allreduce_rs.RegisteredBuffer {which}: {} x {} at {:#x}, DLPack device {:?}>",
            self.view.count, self.view.dtype, self.view.ptr, self.view.device
        )
    }
}

#[pymethods]
impl PyPlacement {
    /// The most ranks any one device carries (8 for 8 ranks on one GPU under MPS).
    #[getter]
    fn ranks_per_device(&self) -> usize {
        self.inner.ranks_per_device
    }
    /// Every rank's device, in rank order.
    #[getter]
    fn ranks(&self) -> Vec<PyRankDevice> {
        self.inner
            .ranks
            .iter()
            .map(|d| PyRankDevice {
                rank: d.rank,
                local_rank: d.local_rank,
                host: d.host.clone(),
                ordinal: d.ordinal,
                bus_id: d.bus_id.clone(),
                visible: d.visible,
            })
            .collect()
    }
    fn __str__(&self) -> String {
        self.inner.to_string()
    }
    fn __repr__(&self) -> String {
        format!(
            "<allreduce_rs.Placement {} rank(s), at most {} per device>",
            self.inner.ranks.len(),
            self.inner.ranks_per_device
        )
    }
}

#[pymethods]
impl PyRankDevice {
    fn __repr__(&self) -> String {
        format!(
            "RankDevice(rank={}, local_rank={}, host={:?}, ordinal={}, bus_id={:?}, visible={})",
            self.rank, self.local_rank, self.host, self.ordinal, self.bus_id, self.visible
        )
    }
}

/// The algorithm called `name`, when given: one of the allreduce candidates.
fn algorithm_named(name: Option<&str>) -> PyResult<Option<Algorithm>> {
    name.map(|name| {
        Algorithm::from_name(name).filter(|a| Algorithm::CANDIDATES.contains(a)).ok_or_else(|| {
            let names: Vec<&str> = Algorithm::CANDIDATES.iter().map(|a| a.name()).collect();
            ArgumentError::new_err(format!("algorithm {name:?}: not one of {}", names.join(", ")))
        })
    })
    .transpose()
}

/// One all_reduce or reduce_scatter, checked once by Communicator.prepare_all_reduce / prepare_reduce_scatter;
/// `call()` issues it again (on torch's current stream, or `stream=`) and returns the output tensor. Holding the
/// tensors' storage, it reduces the memory they had when prepared even if a tensor is later re-pointed
/// (`set_`, `resize_`, `.data =`).
#[pyclass(module = "allreduce_rs", name = "PreparedCall", frozen)]
pub struct PreparedCall {
    comm: Py<PyCommunicator>,
    op: Op,
    algo: Option<Algorithm>,
    input: Arg,
    output: Option<Arg>,
    /// The storages behind the tensors (`untyped_storage()`), kept so their memory cannot be freed or reused.
    _storage: Vec<Py<PyAny>>,
}

impl PreparedCall {
    fn new(
        comm: &Bound<'_, PyCommunicator>,
        op: Op,
        algo: Option<Algorithm>,
        input: Arg,
        output: Option<Arg>,
    ) -> PyResult<PreparedCall> {
        let py = comm.py();
        let mut storage = Vec::new();
        for arg in std::iter::once(&input).chain(output.as_ref()) {
            // A torch tensor's memory belongs to its storage; a host array's to the array, held as `obj`.
            if let Ok(s) = arg.obj.bind(py).call_method0(pyo3::intern!(py, "untyped_storage")) {
                storage.push(s.unbind());
            }
        }
        Ok(PreparedCall { comm: comm.clone().unbind(), op, algo, input, output, _storage: storage })
    }
}

#[pymethods]
impl PreparedCall {
    /// Issues the call (collective, as the call it was prepared from) and returns the tensor that holds the result.
    #[pyo3(signature = (*, stream = None))]
    fn __call__<'py>(&self, py: Python<'py>, stream: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
        let comm = self.comm.get();
        let handle = comm.stream_handle(py, stream)?;
        comm.issue(py, self.op, self.algo, &self.input, self.output.as_ref(), handle)?;
        Ok(self.output.as_ref().unwrap_or(&self.input).obj.bind(py).clone())
    }

    fn __repr__(&self) -> String {
        let what = match self.op {
            Op::AllReduce if self.output.is_none() => "all_reduce in place",
            Op::AllReduce => "all_reduce",
            Op::ReduceScatter => "reduce_scatter",
        };
        let algo = self.algo.map_or("auto".to_string(), |a| a.name().to_string());
        format!("PreparedCall({what}, {} elements of {}, algorithm={algo})", self.input.count, self.input.dtype)
    }
}

/// `Communicator.graph_capture()`'s context manager.
#[pyclass(module = "allreduce_rs")]
pub struct GraphCapture {
    comm: Py<PyCommunicator>,
}

#[pymethods]
impl GraphCapture {
    fn __enter__(&self, py: Python<'_>) -> PyResult<()> {
        self.comm.get().begin_graph_capture(py)
    }

    /// Ends the recording on every rank even when the body raised (the peers are waiting in theirs); the body's
    /// exception, if any, is the one that propagates.
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let ended = self.comm.get().end_graph_capture(py);
        match exc_type {
            Some(_) => Ok(false),
            None => ended.map(|_| false),
        }
    }
}
