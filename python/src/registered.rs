//! The communicator's registered buffers as DLPack exporters (`Communicator.registered_input` / `registered_output`).

use crate::args;
use crate::comm_core::PyCommunicator;
use crate::dlpack::{self, View};
use crate::errors::CapacityError;
use allreduce::{DType, DriverKind};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

/// Which of the communicator's registered buffers.
#[derive(Clone, Copy)]
pub(crate) enum Which {
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

pub(crate) fn registered(
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
    let device = match me.reach.driver {
        DriverKind::Host => (dlpack::CPU, 0),
        DriverKind::Cuda => (dlpack::CUDA, me.reach.ordinal as i32),
        DriverKind::Hip => (dlpack::ROCM, me.reach.ordinal as i32),
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
