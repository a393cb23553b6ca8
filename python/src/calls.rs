//! Calls issued again and again: prepared calls (checked once) and the graph-capture context manager.

use crate::comm_core::PyCommunicator;
use crate::comm_core::Request;
use crate::errors::ArgumentError;
use allreduce::{Algorithm, Choice};
use collective_core::Op;
use pyo3::prelude::*;

/// The algorithm called `name`, when given: one of the allreduce candidates, or on a call with the residual add and
/// RMSNorm (`norm`) also the unfused sequence after one (`unfused:<name>`).
pub(crate) fn algorithm_named(name: Option<&str>, norm: bool) -> PyResult<Option<Choice>> {
    name.map(|name| {
        let names: Vec<&str> = Algorithm::CANDIDATES.iter().map(|a| a.name()).collect();
        match Choice::from_name(name) {
            Some(c) if c.unfused && !norm => Err(ArgumentError::new_err(format!(
                "algorithm {name:?}: the unfused sequence is for all_reduce_add_rms_norm; here one of {}",
                names.join(", ")
            ))),
            Some(c) => Ok(c),
            None => Err(ArgumentError::new_err(format!(
                "algorithm {name:?}: not one of {}{}",
                names.join(", "),
                if norm { format!(", nor one of them after {:?}", Choice::UNFUSED) } else { String::new() }
            ))),
        }
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
    req: Request,
    /// The storages behind the tensors (`untyped_storage()`), kept so their memory cannot be freed or reused.
    _storage: Vec<Py<PyAny>>,
}

impl PreparedCall {
    pub(crate) fn new(comm: &Bound<'_, PyCommunicator>, req: Request) -> PyResult<PreparedCall> {
        let py = comm.py();
        let mut storage = Vec::new();
        for arg in std::iter::once(&req.input).chain(req.output.as_ref()).chain(req.bias.as_ref()) {
            // A torch tensor's memory belongs to its storage; a host array's to the array, held as `obj`.
            if let Ok(s) = arg.obj.bind(py).call_method0(pyo3::intern!(py, "untyped_storage")) {
                storage.push(s.unbind());
            }
        }
        Ok(PreparedCall { comm: comm.clone().unbind(), req, _storage: storage })
    }
}

#[pymethods]
impl PreparedCall {
    /// Issues the call (collective, as the call it was prepared from) and returns the tensor that holds the result.
    #[pyo3(signature = (*, stream = None))]
    fn __call__<'py>(&self, py: Python<'py>, stream: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
        let comm = self.comm.get();
        let handle = comm.reach.stream_handle(py, stream)?;
        comm.issue(py, &self.req, handle)?;
        Ok(self.req.output.as_ref().unwrap_or(&self.req.input).obj.bind(py).clone())
    }

    fn __repr__(&self) -> String {
        let what = match self.req.op {
            Op::AllReduce if self.req.output.is_none() => "all_reduce in place",
            Op::AllReduce => "all_reduce",
            op => op.name(),
        };
        let algo = self.req.algo.map_or("auto".to_string(), |a| a.to_string());
        let (count, dtype) = (self.req.input.count, self.req.input.dtype);
        format!("PreparedCall({what}, {count} elements of {dtype}, algorithm={algo})")
    }
}

/// `Communicator.graph_capture()`'s context manager.
#[pyclass(module = "allreduce_rs")]
pub struct GraphCapture {
    pub(crate) comm: Py<PyCommunicator>,
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
