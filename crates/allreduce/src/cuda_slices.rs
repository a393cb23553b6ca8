//! Safe calls on cudarc's device slices and streams (feature `cudarc`): cudarc's own event tracking orders the
//! call after earlier writes of the slices and keeps them allocated until it has run, and the communicator checks
//! that the stream belongs to its device.

use crate::{Algorithm, Communicator, Error, Scalar};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use gpu::DriverKind;

impl Communicator {
    fn check_cuda(&self, stream: &CudaStream) -> Result<(), Error> {
        let i = self.gpu().info();
        if i.kind != DriverKind::Cuda || stream.context().ordinal() != i.ordinal {
            return Err(Error::BadArgs(format!(
                "the stream is on CUDA device {}, this communicator on {} device {}",
                stream.context().ordinal(),
                i.kind,
                i.ordinal
            )));
        }
        Ok(())
    }

    /// Enqueues an allreduce of `input` into `output` (same length) on `stream`; no host synchronisation, so it
    /// may be captured into the caller's graph (with cudarc's event tracking off while capturing, as cudarc's own
    /// graphs need). Collective: every rank makes the same calls in the same order.
    pub fn all_reduce_cuda<T: Scalar + DeviceRepr>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<Algorithm, Error> {
        self.check_cuda(stream)?;
        if input.len() != output.len() {
            return Err(Error::BadArgs(format!("input of {} elements, output of {}", input.len(), output.len())));
        }
        let count = input.len();
        let (i, _read) = input.device_ptr(stream);
        let (o, _write) = output.device_ptr_mut(stream);
        // SAFETY: both slices are live device memory of this context (checked), held borrowed until the call is
        // enqueued, and cudarc orders their reuse and release after it; the stream is the caller's live stream.
        unsafe { self.all_reduce(gpu::DevicePtr(i), gpu::DevicePtr(o), count, T::DTYPE, stream.cu_stream() as u64) }
    }

    /// Enqueues an in-place allreduce of `data` on `stream`.
    pub fn all_reduce_cuda_in_place<T: Scalar + DeviceRepr>(
        &self,
        data: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<Algorithm, Error> {
        self.check_cuda(stream)?;
        let count = data.len();
        let (p, _write) = data.device_ptr_mut(stream);
        // SAFETY: as all_reduce_cuda, with one buffer.
        unsafe { self.all_reduce(gpu::DevicePtr(p), gpu::DevicePtr(p), count, T::DTYPE, stream.cu_stream() as u64) }
    }

    /// Enqueues a reduce-scatter of `input` into `output` (`input.len() / W` elements) on `stream`.
    pub fn reduce_scatter_cuda<T: Scalar + DeviceRepr>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<Algorithm, Error> {
        self.check_cuda(stream)?;
        let count = input.len();
        if output.len() * self.world() != count {
            return Err(Error::BadArgs(format!(
                "reduce-scatter of {count} elements over {} ranks needs an output of {} elements, not {}",
                self.world(),
                count / self.world(),
                output.len()
            )));
        }
        let (i, _read) = input.device_ptr(stream);
        let (o, _write) = output.device_ptr_mut(stream);
        // SAFETY: as all_reduce_cuda.
        unsafe { self.reduce_scatter(gpu::DevicePtr(i), gpu::DevicePtr(o), count, T::DTYPE, stream.cu_stream() as u64) }
    }
}
