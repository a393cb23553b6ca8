//! The methods of `allreduce_rs.Communicator` as Python sees them; the object, its lock and the checked call path
//! are `comm_core.rs`.

use crate::args::{self, Memory};
use crate::calls::{algorithm_named, GraphCapture, PreparedCall};
use crate::comm_core::{PyCommunicator, Request, State};
use crate::errors::{from_error, AllreduceError, ArgumentError};
use crate::placement::PyPlacement;
use crate::registered::{registered, RegisteredBuffer, Which};
use allreduce::{AddRmsNorm, DType, DevicePtr, Mode, Options, Residency, TuneRequest};
use collective_core::Op;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The default capacity: 32 MiB, comm_bench.py's largest bf16 message.
pub const DEFAULT_CAPACITY: usize = 32 << 20;

/// Seconds given for the argument `what`, checked as every timeout is (`deadline::seconds`).
fn seconds(what: &str, s: Option<f64>) -> PyResult<Option<Duration>> {
    s.map(|s| deadline::seconds(s).map_err(|e| ArgumentError::new_err(format!("{what}: {e}")))).transpose()
}

pub(crate) fn options(
    capacity_bytes: usize,
    backend: &str,
    timeout_s: Option<f64>,
    setup_timeout_s: Option<f64>,
    tune_dir: Option<PathBuf>,
    tune_table: Option<PathBuf>,
    device_shared_by: Option<usize>,
) -> PyResult<Options> {
    Ok(Options {
        backend: backend.parse().map_err(|e: gpu::GpuError| ArgumentError::new_err(e.to_string()))?,
        capacity_bytes,
        timeout: seconds("timeout_s", timeout_s)?,
        setup_timeout: seconds("setup_timeout_s", setup_timeout_s)?,
        tune_dir,
        tune_table,
        device_shared_by,
    })
}

fn mode_of(mode: &str) -> PyResult<Mode> {
    Mode::ALL
        .into_iter()
        .find(|m| m.name() == mode)
        .ok_or_else(|| ArgumentError::new_err(format!("mode {mode:?}: expected \"eager\" or \"graph\"")))
}

fn residency_of(residency: &str) -> PyResult<Residency> {
    residency.parse().map_err(|e: allreduce::tune::UnknownResidency| ArgumentError::new_err(e.to_string()))
}

#[pymethods]
impl PyCommunicator {
    /// A communicator at an explicit place, without a launcher. Collective: every rank of the job calls it with
    /// the same world_size, job_id (16 to 64 lowercase hex digits; see new_job_id()) and options.
    #[new]
    #[pyo3(signature = (rank, world_size, local_rank, job_id, *, capacity_bytes = DEFAULT_CAPACITY, backend = "auto",
                        timeout_s = None, setup_timeout_s = None, tune_dir = None, tune_table = None,
                        device_shared_by = None),
                  text_signature = "(rank, world_size, local_rank, job_id, *, capacity_bytes=33554432, backend='auto', \
                                    timeout_s=None, setup_timeout_s=None, tune_dir=None, tune_table=None, \
                                    device_shared_by=None)")]
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
        device_shared_by: Option<usize>,
    ) -> PyResult<PyCommunicator> {
        let job = ipc::JobId::parse(job_id).map_err(|e| ArgumentError::new_err(format!("job_id: {e}")))?;
        let info = launch::RankInfo::explicit(rank, world_size, local_rank, job).map_err(crate::errors::from_launch)?;
        let opts =
            options(capacity_bytes, backend, timeout_s, setup_timeout_s, tune_dir, tune_table, device_shared_by)?;
        PyCommunicator::build(py, Some(info), opts)
    }

    /// This rank's communicator, its place read from the launcher's environment (python -m allreduce_rs.launch,
    /// comm-bench launch, torchrun, OpenMPI's mpirun, srun, MPICH / Intel MPI with ALLREDUCE_JOB_ID). Collective.
    #[staticmethod]
    #[pyo3(signature = (capacity_bytes = DEFAULT_CAPACITY, backend = "auto", timeout_s = None, setup_timeout_s = None,
                        tune_dir = None, tune_table = None, device_shared_by = None),
                  text_signature = "(capacity_bytes=33554432, backend='auto', timeout_s=None, setup_timeout_s=None, \
                                    tune_dir=None, tune_table=None, device_shared_by=None)")]
    #[allow(clippy::too_many_arguments)]
    fn from_env(
        py: Python<'_>,
        capacity_bytes: usize,
        backend: &str,
        timeout_s: Option<f64>,
        setup_timeout_s: Option<f64>,
        tune_dir: Option<PathBuf>,
        tune_table: Option<PathBuf>,
        device_shared_by: Option<usize>,
    ) -> PyResult<PyCommunicator> {
        let opts =
            options(capacity_bytes, backend, timeout_s, setup_timeout_s, tune_dir, tune_table, device_shared_by)?;
        PyCommunicator::build(py, None, opts)
    }

    /// Allreduces `tensor` in place, or into `out`; returns the tensor that holds the sum. `bias` (the tensor's size
    /// and dtype, the same values on every rank, apart from `out`) is added to every sum after the ranks' inputs,
    /// in the kernel, as FBGEMM car's `z`.
    #[pyo3(signature = (tensor, out = None, *, bias = None, stream = None, algorithm = None))]
    fn all_reduce<'py>(
        &self,
        py: Python<'py>,
        tensor: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        bias: Option<&Bound<'py, PyAny>>,
        stream: Option<&Bound<'py, PyAny>>,
        algorithm: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let algo = algorithm_named(algorithm, false)?;
        let (input, output) = self.reach.all_reduce_args(tensor, out)?;
        let bias = self.bias_arg(&input, bias)?;
        let handle = self.reach.stream_handle(py, stream)?;
        let req = self.request(Op::AllReduce, algo, input, output, bias)?;
        self.issue(py, &req, handle)?;
        Ok(req.output.map_or(req.input.obj, |o| o.obj).into_bound(py))
    }

    /// Allreduce followed by the residual add and RMSNorm, as serving stacks fuse them after a row-parallel layer:
    /// `r = residual + sum over ranks of tensor` (written back into `residual`), then per row of `weight.numel()`
    /// elements `y = r / sqrt(mean(r^2) + eps) * weight` into `out` (default: `tensor`). Every rank and every
    /// algorithm gives the same bits, fused or not. Returns `(y, residual)`.
    #[pyo3(signature = (tensor, residual, weight, eps = 1e-6, *, out = None, stream = None, algorithm = None))]
    #[allow(clippy::too_many_arguments)]
    fn all_reduce_add_rms_norm<'py>(
        &self,
        py: Python<'py>,
        tensor: &Bound<'py, PyAny>,
        residual: &Bound<'py, PyAny>,
        weight: &Bound<'py, PyAny>,
        eps: f32,
        out: Option<&Bound<'py, PyAny>>,
        stream: Option<&Bound<'py, PyAny>>,
        algorithm: Option<&str>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let algo = algorithm_named(algorithm, true)?;
        let (input, output) = self.reach.all_reduce_args(tensor, out)?;
        let (res, w) = (args::describe(residual, "residual")?, args::describe(weight, "weight")?);
        for (arg, what) in [(&res, "residual"), (&w, "weight")] {
            self.reach.check_place(arg, what)?;
            if arg.dtype != input.dtype {
                return Err(ArgumentError::new_err(format!("{what}: {}, not the tensor's {}", arg.dtype, input.dtype)));
            }
        }
        if res.count != input.count || !res.writable {
            return Err(ArgumentError::new_err(format!(
                "residual: a writable tensor of the tensor's {} elements, not {}{}",
                input.count,
                res.count,
                if res.writable { "" } else { " read-only ones" }
            )));
        }
        let norm = AddRmsNorm { residual: DevicePtr(res.ptr), weight: DevicePtr(w.ptr), hidden: w.count, eps };
        let handle = self.reach.stream_handle(py, stream)?;
        let (i, o) = (DevicePtr(input.ptr), DevicePtr(output.as_ref().map_or(input.ptr, |o| o.ptr)));
        let call = self.with(|state| {
            let call = state.comm.call(Op::AllReduce, input.dtype, i, o, input.count).map_err(from_error)?;
            call.with_add_rms_norm(norm).map_err(|e| from_error(e.into()))
        })?;
        let req = Request { op: Op::AllReduce, algo, input, output, bias: None, call: Some(call) };
        self.issue(py, &req, handle)?;
        Ok((req.output.map_or(req.input.obj, |o| o.obj).into_bound(py), res.obj.into_bound(py)))
    }

    /// Reduce-scatter: rank r receives elements [r * n / W, (r + 1) * n / W) of the sum of every rank's `input`
    /// (n elements, divisible by the world size) in `out` (n / W elements); returns `out`.
    ///
    /// With `split_last_dim`, the last dimension is split instead (car's `split_last_dim`): `input` of shape
    /// `[..., N]`, N divisible by the world size, gives rank r the columns `[r * N / W, (r + 1) * N / W)` of every
    /// row in `out` (`numel / W` elements, densely: shape `[..., N / W]`), inside the kernel.
    #[pyo3(signature = (input, out, *, split_last_dim = false, stream = None))]
    fn reduce_scatter<'py>(
        &self,
        py: Python<'py>,
        input: &Bound<'py, PyAny>,
        out: &Bound<'py, PyAny>,
        split_last_dim: bool,
        stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if !split_last_dim {
            return self.issue_into(py, Op::ReduceScatter, input, out, stream);
        }
        let row_len: usize = input.getattr("shape")?.get_item(-1)?.extract()?;
        let (input, output) = self.reach.output_args(Op::ReduceScatter, input, out)?;
        let handle = self.reach.stream_handle(py, stream)?;
        let (i, o) = (DevicePtr(input.ptr), DevicePtr(output.ptr));
        let call = self.with(|state| {
            let call = state.comm.call(Op::ReduceScatter, input.dtype, i, o, input.count).map_err(from_error)?;
            call.with_split_last_dim(row_len).map_err(|e| from_error(e.into()))
        })?;
        let req =
            Request { op: Op::ReduceScatter, algo: None, input, output: Some(output), bias: None, call: Some(call) };
        self.issue(py, &req, handle)?;
        Ok(req.output.expect("given above").obj.into_bound(py))
    }

    /// All-gather: every rank receives every rank's `input` (n elements) in rank order in `out` (W * n elements of
    /// the same dtype, rank r's from element r * n); returns `out`.
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

    /// all_reduce(tensor, out, algorithm=...) checked once and bound: the returned PreparedCall issues it with
    /// `call()` (or `call(stream=...)`), reading no tensor attribute again, for a hot loop that reduces the same
    /// buffers each step. It keeps the tensors' storage alive and always reduces the memory they had when prepared.
    #[pyo3(signature = (tensor, out = None, *, bias = None, algorithm = None))]
    fn prepare_all_reduce(
        slf: &Bound<'_, Self>,
        tensor: &Bound<'_, PyAny>,
        out: Option<&Bound<'_, PyAny>>,
        bias: Option<&Bound<'_, PyAny>>,
        algorithm: Option<&str>,
    ) -> PyResult<PreparedCall> {
        let algo = algorithm_named(algorithm, false)?;
        let (input, output) = slf.get().reach.all_reduce_args(tensor, out)?;
        let bias = slf.get().bias_arg(&input, bias)?;
        PreparedCall::new(slf, slf.get().request(Op::AllReduce, algo, input, output, bias)?)
    }

    /// reduce_scatter(input, out) checked once and bound, as prepare_all_reduce.
    fn prepare_reduce_scatter(
        slf: &Bound<'_, Self>,
        input: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<PreparedCall> {
        let (input, output) = slf.get().reach.output_args(Op::ReduceScatter, input, out)?;
        PreparedCall::new(slf, slf.get().request(Op::ReduceScatter, None, input, Some(output), None)?)
    }

    /// Registers the memory of `tensor` (a CUDA / ROCm tensor of this device) with every peer, so calls on tensors
    /// inside it read and write it in place on every rank. Collective: every rank registers a tensor of the same
    /// size, in the same order. The tensor is kept alive as long as the communicator. Returns the registration's
    /// index.
    fn register(&self, py: Python<'_>, tensor: &Bound<'_, PyAny>) -> PyResult<usize> {
        let arg = args::describe(tensor, "tensor")?;
        let on_device = matches!(arg.memory, Memory::Device(_));
        if on_device {
            self.reach.check_place(&arg, "tensor")?;
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
    /// communicators find them; this one follows them at once (unless `tune_table` named a file). `counts`: the
    /// element counts to measure [default: comm_bench.py's sizes and the powers of two from 1024 to 16,777,216, up
    /// to the capacity]. Calls with the residual add and RMSNorm get tables of their own, measured at rows of
    /// `norm_hidden` elements (your model's hidden size; 0: not measured); `norm_only` measures those alone.
    /// `residencies`: which of "caller", "registered" and "caller_registered" are measured [default: all]; the
    /// others' tables stay as they are. `max_seconds`: no table is started once this many seconds have passed (by
    /// rank 0's clock); the tables finished are kept. Each table is stored as it is finished. Collective. Returns the
    /// files written.
    #[pyo3(signature = (dtype = None, counts = None, norm_hidden = allreduce::NORM_HIDDEN, norm_only = false,
                        residencies = None, max_seconds = None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn tune(
        &self,
        py: Python<'_>,
        dtype: Option<&Bound<'_, PyAny>>,
        counts: Option<Vec<usize>>,
        norm_hidden: usize,
        norm_only: bool,
        residencies: Option<Vec<String>>,
        max_seconds: Option<f64>,
    ) -> PyResult<Vec<PathBuf>> {
        let mut req = TuneRequest::new(dtype.map_or(Ok(DType::Bf16), args::dtype_of)?);
        req.max_duration = seconds("max_seconds", max_seconds)?;
        req.counts = counts;
        req.norm_hidden = Some(norm_hidden).filter(|&h| h > 0);
        req.plain = !norm_only;
        if let Some(names) = residencies {
            req.residencies = names.iter().map(|r| residency_of(r)).collect::<PyResult<_>>()?;
        }
        self.with(|state| {
            let comm = &mut state.comm;
            let report = py.detach(move || comm.tune_with(&req, &mut |_| {})).map_err(from_error)?;
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
        let r = residency_of(residency)?;
        let mode = mode_of(mode)?;
        self.with(|state| Ok(state.comm.table_source(mode, r).to_string()))
    }

    /// Begins recording a CUDA graph capture on your own tensors (use `graph_capture()` around
    /// `torch.cuda.graph`): calls captured until `end_graph_capture` read every rank's tensors in place at replay,
    /// once the end has shared them. Collective; call it before the capture begins.
    pub(crate) fn begin_graph_capture(&self, py: Python<'_>) -> PyResult<()> {
        self.with(|state| {
            let comm = &mut state.comm;
            py.detach(move || comm.begin_graph_capture()).map_err(from_error)
        })
    }

    /// Ends the recording once the capture has ended: every rank shares and maps the captured calls' tensors (which
    /// the communicator keeps alive from then on). Collective; returns how many calls were registered. Replay the
    /// graph only after it returns.
    pub(crate) fn end_graph_capture(&self, py: Python<'_>) -> PyResult<usize> {
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
    /// Ends the communicator from any thread, at once, as ncclCommAbort: every wait of its kernels ends (those
    /// running and those enqueued, their results undefined), and every later call raises PeerError. Then close()
    /// it (no peer barrier is waited for) and build a new one, with a new job id, to go on.
    fn abort(&self) {
        self.abort.abort();
    }

    /// Raises PeerError naming the ranks that did not arrive if any call so far failed (for a program that looks
    /// after a graph replay; the next call raises it anyway). Synchronise the stream first to see its last calls.
    fn check(&self) -> PyResult<()> {
        self.with(|state| state.comm.check().map_err(from_error))
    }

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
        self.reach.world
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
        self.reach.driver.to_string()
    }
    /// The device ordinal (torch's `cuda:N` index) on GPU drivers; 0 on the host driver.
    #[getter]
    fn device(&self) -> usize {
        self.reach.ordinal
    }
    /// The device's name.
    #[getter]
    fn device_name(&self) -> &str {
        &self.device_name
    }
    /// The algorithm the last call ran (None before the first); after a call with the residual add and RMSNorm,
    /// `unfused:<algorithm>` where the norm ran after its allreduce.
    #[getter]
    fn last_algorithm(&self) -> PyResult<Option<String>> {
        self.with(|state| Ok(state.comm.last_choice().map(|c| c.to_string())))
    }
    /// What set-up decided on the caller's behalf (drivers passed over, built-in tables in use, kernels the device
    /// fits no block of, dropped, and what runs instead).
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
            self.rank, self.reach.world, self.reach.driver, self.reach.ordinal, self.device_name, self.capacity
        )
    }
}
