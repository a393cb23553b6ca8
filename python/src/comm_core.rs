//! The communicator object Python holds, and its checked call path: the state behind the lock, argument checks,
//! the issue of one call. The `#[pymethods]` (`comm.rs`), prepared calls and capture (`calls.rs`) and the registered
//! buffers (`registered.rs`) build on it.

use crate::args::{self, Arg};
use crate::errors::{from_error, AllreduceError, ArgumentError};
use crate::reach::Reach;
use allreduce::{Algorithm, Call, Choice, Communicator, DType, DevicePtr, DriverKind, Options};
use collective_core::{Op, VEC_BYTES};
use pyo3::prelude::*;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

/// What a call needs behind the lock.
pub(crate) struct State {
    pub(crate) comm: Communicator,
    /// The host driver's stream for calls that force an algorithm (the slice calls bring their own).
    pub(crate) host_stream: Option<gpu::Stream>,
    /// Objects whose memory was registered with the peers: kept alive as long as the communicator, as
    /// `Communicator::register` requires.
    pub(crate) registered: Vec<Py<PyAny>>,
}

/// One rank's endpoint of an intra-node allreduce job.
///
/// Communicator.from_env(...) under a launcher, or Communicator(rank, world_size, local_rank, job_id, ...). It runs
/// all_reduce, reduce_scatter and all_gather on your tensors: on a GPU driver enqueued on torch's current stream with
/// no host synchronisation (torch.cuda.graph captures it), on the host driver (numpy arrays, CPU tensors) complete on
/// return; the algorithm per size comes from a table tuned on this machine, and every algorithm gives the same
/// bits. Every call is collective. Errors are allreduce_rs.AllreduceError subclasses. End it with close() or
/// `with`.
#[pyclass(module = "allreduce_rs", name = "Communicator", frozen)]
pub struct PyCommunicator {
    /// `None` once closed. Calls take it with `try_lock`: a communicator's calls are collective and run one at a
    /// time, so a second thread is told so instead of waiting (with the GIL) on the first.
    pub(crate) state: Mutex<Option<State>>,
    pub(crate) rank: usize,
    pub(crate) local_rank: usize,
    pub(crate) capacity: usize,
    /// Its driver, device and world size, which a call's tensors are checked against.
    pub(crate) reach: Reach,
    pub(crate) device_name: String,
    pub(crate) placement: allreduce::Placement,
    pub(crate) notes: Vec<String>,
    /// Live DLPack views of the registered buffers.
    pub(crate) views: Arc<AtomicUsize>,
    /// Ends the communicator from any thread without its lock (a call may hold it, waiting for a dead peer).
    pub(crate) abort: allreduce::AbortHandle,
}

impl PyCommunicator {
    /// Builds the communicator with the interpreter detached: set-up waits for every peer (and may compile kernels).
    pub(crate) fn build(py: Python<'_>, info: Option<launch::RankInfo>, opts: Options) -> PyResult<PyCommunicator> {
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
            local_rank: placement.ranks[rank].local_rank,
            capacity: comm.capacity_bytes(),
            reach: Reach { driver: i.kind, ordinal: i.ordinal, world: comm.world() },
            device_name: i.name,
            notes: comm.notes().to_vec(),
            placement,
            views: Arc::new(AtomicUsize::new(0)),
            abort: comm.abort_handle(),
            state: Mutex::new(Some(State { comm, host_stream, registered: Vec::new() })),
        })
    }

    pub(crate) fn lock(&self) -> PyResult<MutexGuard<'_, Option<State>>> {
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
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut State) -> PyResult<R>) -> PyResult<R> {
        match self.lock()?.as_mut() {
            Some(state) => f(state),
            None => Err(AllreduceError::new_err("the communicator is closed")),
        }
    }

    /// The request `all_reduce_args` / `output_args` describe, with the communicator's checked call built
    /// once (through [`Communicator::call`], as every Rust caller's).
    pub(crate) fn request(
        &self,
        op: Op,
        algo: Option<Choice>,
        input: Arg,
        output: Option<Arg>,
        bias: Option<Arg>,
    ) -> PyResult<Request> {
        let (i, o) = (DevicePtr(input.ptr), DevicePtr(output.as_ref().map_or(input.ptr, |o| o.ptr)));
        // Host arrays that are not 16-byte aligned go through the slice calls, which stage them and check the call
        // they make then (they take no bias); everything else is checked here, once.
        let aligned = [i, o].iter().all(|p| p.0.is_multiple_of(VEC_BYTES as u64));
        let call = if self.reach.driver == DriverKind::Host && algo.is_none() && bias.is_none() && !aligned {
            None
        } else {
            let call = self.with(|state| state.comm.call(op, input.dtype, i, o, input.count).map_err(from_error))?;
            Some(match &bias {
                Some(b) => call.with_bias(DevicePtr(b.ptr)).map_err(|e| from_error(e.into()))?,
                None => call,
            })
        };
        Ok(Request { op, algo, input, output, bias, call })
    }

    /// The bias of an allreduce (`bias=`), checked: on this communicator's device, the tensor's dtype and size.
    pub(crate) fn bias_arg(&self, input: &Arg, bias: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Arg>> {
        let Some(b) = bias else { return Ok(None) };
        let b = args::describe(b, "bias")?;
        self.reach.check_place(&b, "bias")?;
        if b.dtype != input.dtype || b.count != input.count {
            return Err(ArgumentError::new_err(format!(
                "bias: {} elements of {}, not the tensor's {} of {}",
                b.count, b.dtype, input.count, input.dtype
            )));
        }
        Ok(Some(b))
    }

    /// A reduce-scatter or all-gather of `input` into `out`, checked and issued on `stream`; returns `out`.
    pub(crate) fn issue_into<'py>(
        &self,
        py: Python<'py>,
        op: Op,
        input: &Bound<'py, PyAny>,
        out: &Bound<'py, PyAny>,
        stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (input, output) = self.reach.output_args(op, input, out)?;
        let handle = self.reach.stream_handle(py, stream)?;
        let req = self.request(op, None, input, Some(output), None)?;
        self.issue(py, &req, handle)?;
        Ok(req.output.expect("given above").obj.into_bound(py))
    }

    /// Issues a request on stream `handle` (ignored on the host driver, which runs it on this thread).
    pub(crate) fn issue(&self, py: Python<'_>, req: &Request, handle: u64) -> PyResult<Algorithm> {
        self.with(|state| {
            let Some(call) = req.call else {
                let (input, output) = (&req.input, req.output.as_ref());
                return match input.dtype {
                    DType::Bf16 => host_slices::<half::bf16>(state, req.op, input, output),
                    DType::F16 => host_slices::<half::f16>(state, req.op, input, output),
                    DType::F32 => host_slices::<f32>(state, req.op, input, output),
                };
            };
            let handle = match &state.host_stream {
                Some(s) => s.handle(),
                None => handle,
            };
            // SAFETY: the call was checked by the communicator (capacity, alignment, overlap) on memory that the
            // *_args functions found on this communicator's device (on the host driver: process memory, run to
            // completion on this thread, which holds the GIL); it is alive while torch holds the tensors (a
            // PreparedCall holds their storage), whose caching allocator reuses their memory only in the order of
            // the stream they were made on (the current stream, unless the caller passed another and recorded it,
            // as for any side-stream work). That every rank makes the same calls is the caller's part, as with
            // torch.distributed.
            let issued = match req.algo {
                // SAFETY (both arms): as above.
                Some(choice) => unsafe { state.comm.issue_as(call, choice, handle) }.map(|c| c.algorithm),
                None => unsafe { state.comm.issue(call, None, handle) },
            };
            let algo = issued.map_err(from_error)?;
            // A recorded capture's calls may read these tensors in place from every peer at each replay: kept alive
            // with the communicator, as end_graph_capture requires.
            if state.comm.recording_graph_capture() {
                let objs = std::iter::once(&req.input).chain(&req.output).chain(&req.bias).map(|a| a.obj.clone_ref(py));
                state.registered.extend(objs);
            }
            Ok(algo)
        })
    }
}

/// One call as Python asked for it: its tensors, the algorithm forced, and the communicator's checked call (`None`
/// for the host driver's slice calls on unaligned arrays, which stage them and check the call they make).
pub(crate) struct Request {
    pub(crate) op: Op,
    pub(crate) algo: Option<Choice>,
    pub(crate) input: Arg,
    pub(crate) output: Option<Arg>,
    /// An allreduce's bias, added to every sum after the ranks' inputs.
    pub(crate) bias: Option<Arg>,
    pub(crate) call: Option<Call>,
}

/// The slice calls on `input` / `output` as `[T]`.
pub(crate) fn host_slices<T: allreduce::Scalar>(
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
            (_, None) => unreachable!("only an allreduce runs in place"),
            (op, Some(o)) => {
                let x = std::slice::from_raw_parts(input.ptr as *const T, input.count);
                let y = std::slice::from_raw_parts_mut(o.ptr as *mut T, o.count);
                match op {
                    Op::AllReduce => state.comm.all_reduce_host(x, y),
                    Op::ReduceScatter => state.comm.reduce_scatter_host(x, y),
                    Op::AllGather => state.comm.all_gather_host(x, y),
                }
            }
        }
    };
    result.map_err(from_error)
}
