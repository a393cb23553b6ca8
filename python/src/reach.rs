//! Where a communicator's calls may reach (its driver, device and world size), and the checks of a call's tensors
//! that depend on nothing else: shared by the intra-node `Communicator` and `Across`.

use crate::args::{self, Arg, Memory};
use crate::errors::ArgumentError;
use allreduce::DriverKind;
use collective_core::Op;
use pyo3::prelude::*;

/// A communicator's driver, device and world size.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reach {
    pub(crate) driver: DriverKind,
    pub(crate) ordinal: usize,
    pub(crate) world: usize,
}

impl Reach {
    /// Refuses a tensor this communicator's driver cannot reach. The call's own rules (capacity, alignment of device
    /// memory, divisibility, overlap) are [`Communicator::call`]'s, checked once when the call is built.
    pub(crate) fn check_place(&self, arg: &Arg, what: &str) -> PyResult<()> {
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
        // Host memory is read as `&[T]`, which needs element alignment (the library stages what is not 16-aligned).
        let align = arg.dtype.size();
        if self.driver == DriverKind::Host && !arg.ptr.is_multiple_of(align as u64) {
            return Err(ArgumentError::new_err(format!(
                "{what}: address {:#x} is not aligned to {align} bytes (a view at an odd offset?): pass a copy",
                arg.ptr
            )));
        }
        Ok(())
    }

    /// On the host driver the arrays become Rust slices, which must not alias unless they are one (a device call's
    /// overlap is its [`allreduce::Call`]'s to refuse).
    fn refuse_aliasing_slices(&self, input: &Arg, output: &Arg, what: &str) -> PyResult<()> {
        if self.driver == DriverKind::Host && output.overlaps(input) {
            return Err(ArgumentError::new_err(format!("out overlaps {what} without being the same memory")));
        }
        Ok(())
    }

    /// An allreduce's tensors, checked: `out` is `None` for an in-place call (no `out`, or `out` is `tensor`).
    pub(crate) fn all_reduce_args<'py>(
        &self,
        tensor: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Arg, Option<Arg>)> {
        let input = args::describe(tensor, "tensor")?;
        self.check_place(&input, "tensor")?;
        let output = match out {
            None if !input.writable => {
                return Err(ArgumentError::new_err("tensor: read-only, so it cannot be reduced in place; pass out="))
            }
            None => None,
            Some(o) => {
                let o = args::describe(o, "out")?;
                self.check_place(&o, "out")?;
                same_shape(&input, &o, input.count, "the tensor's")?;
                if !o.writable {
                    return Err(ArgumentError::new_err("out: read-only"));
                }
                if o.ptr == input.ptr {
                    None
                } else {
                    self.refuse_aliasing_slices(&input, &o, "tensor")?;
                    Some(o)
                }
            }
        };
        Ok((input, output))
    }

    /// The input and output of a reduce-scatter or an all-gather, checked: `out` holds the op's output count of the
    /// input's dtype.
    pub(crate) fn output_args<'py>(
        &self,
        op: Op,
        input: &Bound<'py, PyAny>,
        out: &Bound<'py, PyAny>,
    ) -> PyResult<(Arg, Arg)> {
        let input = args::describe(input, "input")?;
        self.check_place(&input, "input")?;
        let output = args::describe(out, "out")?;
        self.check_place(&output, "out")?;
        // A reduce-scatter's count that does not divide has no shard shape: the call refuses it, saying so.
        if op != Op::ReduceScatter || input.count.is_multiple_of(self.world) {
            let whose = if op == Op::ReduceScatter { "a shard of the input's" } else { "the world's inputs'" };
            same_shape(&input, &output, op.output_count(input.count, self.world), whose)?;
        }
        if !output.writable {
            return Err(ArgumentError::new_err("out: read-only"));
        }
        self.refuse_aliasing_slices(&input, &output, "input")?;
        Ok((input, output))
    }

    /// The stream a device call is enqueued on: `stream` (a handle, or an object with `cuda_stream`), else torch's
    /// current stream of this device. On the host driver calls run to completion on this thread and take none.
    pub(crate) fn stream_handle(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
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
}

/// Refuses an output whose dtype or element count is not the call's.
pub(crate) fn same_shape(input: &Arg, out: &Arg, want: usize, whose: &str) -> PyResult<()> {
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
