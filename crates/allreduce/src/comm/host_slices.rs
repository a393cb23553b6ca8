//! The safe calls on host slices (the host driver, where device memory is this process's memory): each checks
//! the slices into a call and runs it to completion on the calling thread before it returns; slices not 16-byte
//! aligned are staged through an aligned buffer.

use super::Communicator;
use crate::{Algorithm, Error, Scalar};
use collective_core::{AddRmsNorm, Op, VEC_BYTES};
use gpu::{DevicePtr, DriverKind, MemKind};

impl Communicator {
    /// Allreduces host slices on the host driver, where device memory is this process's memory; the call is
    /// complete when it returns. Slices not aligned to 16 bytes are staged through an aligned buffer.
    pub fn all_reduce_host<T: Scalar>(&self, input: &[T], output: &mut [T]) -> Result<Algorithm, Error> {
        let out = (output.as_mut_ptr(), output.len());
        self.host_call(Op::AllReduce, input.as_ptr(), input.len(), Some(out))
    }

    /// In-place allreduce of a host slice on the host driver.
    pub fn all_reduce_host_in_place<T: Scalar>(&self, data: &mut [T]) -> Result<Algorithm, Error> {
        self.host_call(Op::AllReduce, data.as_mut_ptr(), data.len(), None)
    }

    /// [`Communicator::all_reduce_add_rms_norm`] on host slices on the host driver: rows of `weight.len()`
    /// elements; `residual` (as long as `input`) becomes `r`, `output` gets `y`. Every slice 16-byte aligned.
    pub fn all_reduce_add_rms_norm_host<T: Scalar>(
        &self,
        input: &[T],
        residual: &mut [T],
        weight: &[T],
        eps: f32,
        output: &mut [T],
    ) -> Result<Algorithm, Error> {
        self.host_only()?;
        let (n, hidden) = (input.len(), weight.len());
        if residual.len() != n || output.len() != n {
            return Err(Error::BadArgs(format!(
                "input, residual and output must be as long: {n}, {} and {}",
                residual.len(),
                output.len()
            )));
        }
        let ptr = |p: *const T| DevicePtr(p as u64);
        let norm = AddRmsNorm { residual: ptr(residual.as_ptr()), weight: ptr(weight.as_ptr()), hidden, eps };
        let call = self.call(Op::AllReduce, T::DTYPE, ptr(input.as_ptr()), ptr(output.as_ptr()), n)?;
        let call = call.with_add_rms_norm(norm)?;
        // SAFETY: on the host driver these addresses are the borrowed slices, live for this function, which returns
        // only after the host stream has run the call on this thread.
        unsafe { self.issue(call, None, self.own.handle()) }
    }

    /// Reduce-scatter of host slices on the host driver: `output` holds `input.len() / W` elements.
    pub fn reduce_scatter_host<T: Scalar>(&self, input: &[T], output: &mut [T]) -> Result<Algorithm, Error> {
        let out = (output.as_mut_ptr(), output.len());
        self.host_call(Op::ReduceScatter, input.as_ptr(), input.len(), Some(out))
    }

    /// All-gather of host slices on the host driver: `output` holds `input.len() * W` elements.
    pub fn all_gather_host<T: Scalar>(&self, input: &[T], output: &mut [T]) -> Result<Algorithm, Error> {
        let out = (output.as_mut_ptr(), output.len());
        self.host_call(Op::AllGather, input.as_ptr(), input.len(), Some(out))
    }

    /// An output of `out_len` elements is the one `op` on `count` elements writes (a reduce-scatter whose count does
    /// not divide has none: the call's own check says why).
    pub(crate) fn check_output_len(&self, op: Op, count: usize, out_len: usize) -> Result<(), Error> {
        let out_count = op.output_count(count, self.world());
        if (op != Op::ReduceScatter || count.is_multiple_of(self.world())) && out_len != out_count {
            return Err(Error::BadArgs(format!(
                "{op} of {count} elements needs an output of {out_count}, not {out_len}"
            )));
        }
        Ok(())
    }

    /// One host-driver call on slices the public wrappers borrowed (`output` None: in place, `input` then comes
    /// from a mutable borrow).
    fn host_call<T: Scalar>(
        &self,
        op: Op,
        input: *const T,
        count: usize,
        output: Option<(*mut T, usize)>,
    ) -> Result<Algorithm, Error> {
        self.host_only()?;
        let dtype = T::DTYPE;
        let (out_ptr, out_len) = output.unwrap_or((input as *mut T, count));
        self.check_output_len(op, count, out_len)?;
        let out_count = op.output_count(count, self.world());
        let (in_dev, out_dev) = (DevicePtr(input as u64), DevicePtr(out_ptr as u64));
        let own = self.own.handle();
        if in_dev.0.is_multiple_of(VEC_BYTES as u64) && out_dev.0.is_multiple_of(VEC_BYTES as u64) {
            let call = self.call(op, dtype, in_dev, out_dev, count)?;
            // SAFETY: on the host driver these addresses are the borrowed slices, live for this function, which
            // returns only after the host stream has run the call on this thread.
            return unsafe { self.issue(call, None, own) };
        }
        // Staged: the scratch holds an input of the capacity and the op's largest output, so the call's own check
        // bounds it (grown when an all-gather first needs more than an allreduce).
        let in_bytes = self.capacity.next_multiple_of(VEC_BYTES);
        let need = in_bytes + op.output_capacity(self.capacity, self.world());
        let mut state = self.state.borrow_mut();
        if state.scratch.as_ref().is_none_or(|s| s.bytes() < need) {
            state.scratch = Some(self.gpu.alloc(need, MemKind::Device)?);
        }
        let scratch = state.scratch.as_ref().expect("allocated above");
        let s_in = scratch.ptr();
        let s_out = if output.is_none() { s_in } else { s_in.offset(in_bytes) };
        let call = self.call(op, dtype, s_in, s_out, count)?;
        // SAFETY: the wrappers borrowed `count` elements at `input`.
        let src = unsafe { std::slice::from_raw_parts(input as *const u8, call.bytes()) };
        self.own.upload(scratch, 0, src)?;
        drop(state);
        // SAFETY: our scratch, of the capacity; the host stream runs the call before `issue` returns.
        let algo = unsafe { self.issue(call, None, own)? };
        let state = self.state.borrow();
        let scratch = state.scratch.as_ref().expect("allocated above");
        // SAFETY: `out_ptr` is the output slice (or, in place, the mutably borrowed data), `out_count` elements.
        let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr as *mut u8, out_count * dtype.size()) };
        self.own.download(scratch, (s_out.0 - s_in.0) as usize, dst)?;
        Ok(algo)
    }

    /// Refuses host slices on a device driver.
    fn host_only(&self) -> Result<(), Error> {
        if self.gpu.kind() != DriverKind::Host {
            return Err(Error::Unsupported(format!(
                "host slices are device memory only on the host driver; this communicator runs on {}",
                self.gpu.kind()
            )));
        }
        Ok(())
    }
}
