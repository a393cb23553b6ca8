//! Safe calls on cudarc's device slices and streams (feature `cudarc`): cudarc's own event tracking orders the
//! call after earlier writes of the slices and keeps them allocated until it has run, and the communicator checks
//! that the stream belongs to its device.

use crate::{AddRmsNorm, Algorithm, Communicator, Error, Op, Scalar};
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
        self.cuda_op(Op::AllReduce, input, output, stream)
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
        // SAFETY: as cuda_op, with one buffer.
        unsafe { self.all_reduce(gpu::DevicePtr(p), gpu::DevicePtr(p), count, T::DTYPE, stream.cu_stream() as u64) }
    }

    /// Enqueues a reduce-scatter of `input` into `output` (`input.len() / W` elements) on `stream`.
    pub fn reduce_scatter_cuda<T: Scalar + DeviceRepr>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<Algorithm, Error> {
        self.cuda_op(Op::ReduceScatter, input, output, stream)
    }

    /// Enqueues an all-gather of `input` into `output` (`input.len() * W` elements, rank r's from `r * input.len()`)
    /// on `stream`.
    pub fn all_gather_cuda<T: Scalar + DeviceRepr>(
        &self,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<Algorithm, Error> {
        self.cuda_op(Op::AllGather, input, output, stream)
    }

    /// `op` of `input` into `output` (as long as the op's output for the input) on `stream`.
    fn cuda_op<T: Scalar + DeviceRepr>(
        &self,
        op: Op,
        input: &CudaSlice<T>,
        output: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<Algorithm, Error> {
        self.check_cuda(stream)?;
        self.check_output_len(op, input.len(), output.len())?;
        let (i, _read) = input.device_ptr(stream);
        let (o, _write) = output.device_ptr_mut(stream);
        let call = self.call(op, T::DTYPE, gpu::DevicePtr(i), gpu::DevicePtr(o), input.len())?;
        // SAFETY: both slices are live device memory of this context (checked), held borrowed until the call is
        // enqueued, and cudarc orders their reuse and release after it; the stream is the caller's live stream.
        unsafe { self.issue(call, None, stream.cu_stream() as u64) }
    }

    /// Enqueues the allreduce followed by the residual add and RMSNorm ([`Communicator::all_reduce_add_rms_norm`])
    /// on `stream`: rows of `weight.len()` elements; `residual` (as long as `input`) becomes `r = residual + sum`,
    /// `output` gets `y = r / sqrt(mean(r^2) + eps) * weight`. Collective, as [`Communicator::all_reduce_cuda`].
    pub fn all_reduce_add_rms_norm_cuda<T: Scalar + DeviceRepr>(
        &self,
        input: &CudaSlice<T>,
        residual: &mut CudaSlice<T>,
        weight: &CudaSlice<T>,
        eps: f32,
        output: &mut CudaSlice<T>,
        stream: &CudaStream,
    ) -> Result<Algorithm, Error> {
        self.check_cuda(stream)?;
        self.check_output_len(Op::AllReduce, input.len(), output.len())?;
        let (i, _read) = input.device_ptr(stream);
        let (o, _write) = output.device_ptr_mut(stream);
        // SAFETY: as cuda_op, for the residual and weight too (checked against the input's length by
        // add_rms_norm_on).
        unsafe { self.add_rms_norm_on(i, o, input.len(), residual, weight, eps, stream) }
    }

    /// [`Communicator::all_reduce_add_rms_norm_cuda`] with `y` written over `data`.
    pub fn all_reduce_add_rms_norm_cuda_in_place<T: Scalar + DeviceRepr>(
        &self,
        data: &mut CudaSlice<T>,
        residual: &mut CudaSlice<T>,
        weight: &CudaSlice<T>,
        eps: f32,
        stream: &CudaStream,
    ) -> Result<Algorithm, Error> {
        self.check_cuda(stream)?;
        let count = data.len();
        let (p, _write) = data.device_ptr_mut(stream);
        // SAFETY: as all_reduce_add_rms_norm_cuda, with one buffer for input and output.
        unsafe { self.add_rms_norm_on(p, p, count, residual, weight, eps, stream) }
    }

    /// The norm call on `input` / `output` of `count` elements with `residual` and `weight` borrowed on `stream`.
    ///
    /// # Safety
    /// `input` and `output` are live device memory of this context of `count` elements of T, borrowed until the
    /// call is enqueued (cudarc orders their reuse after it), and `stream` the caller's checked stream.
    #[allow(clippy::too_many_arguments)]
    unsafe fn add_rms_norm_on<T: Scalar + DeviceRepr>(
        &self,
        input: u64,
        output: u64,
        count: usize,
        residual: &mut CudaSlice<T>,
        weight: &CudaSlice<T>,
        eps: f32,
        stream: &CudaStream,
    ) -> Result<Algorithm, Error> {
        if residual.len() != count {
            return Err(Error::BadArgs(format!("a residual of {} elements for an input of {count}", residual.len())));
        }
        let (r, _write) = residual.device_ptr_mut(stream);
        let (w, _read) = weight.device_ptr(stream);
        let norm = AddRmsNorm { residual: gpu::DevicePtr(r), weight: gpu::DevicePtr(w), hidden: weight.len(), eps };
        let (i, o) = (gpu::DevicePtr(input), gpu::DevicePtr(output));
        // SAFETY: the caller's contract for input and output; the residual and weight as they are, borrowed until
        // the call is enqueued, cudarc ordering their reuse after it.
        unsafe { self.all_reduce_add_rms_norm(i, o, count, T::DTYPE, norm, stream.cu_stream() as u64) }
    }
}
