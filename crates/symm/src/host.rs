//! Host twins of `kernels/symm.cu`: torch's compare-and-swap handshake on the shared signal pads, one channel per
//! block, with std atomics (`collective_core::host_sync::cas_barrier`). Blocks run one after another in the same order
//! on every rank.

use crate::SymmParams;
use collective_core::host_sync::cas_barrier;
use collective_core::{block_range, shard_elems, shard_range, sum_sources, DType, HostElem};
use deadline::Deadline;
use gpu::{HostKernel, HostLaunch, KernelFault};
use std::time::Duration;

pub(crate) static KERNELS: &[(&str, HostKernel)] = &[
    ("symm_1shot_bf16", one_shot),
    ("symm_1shot_fp16", one_shot),
    ("symm_1shot_fp32", one_shot),
    ("symm_2shot_bf16", two_shot),
    ("symm_2shot_fp16", two_shot),
    ("symm_2shot_fp32", two_shot),
    ("symm_2shot_fused_bf16", two_shot_fused),
    ("symm_2shot_fused_fp16", two_shot_fused),
    ("symm_2shot_fused_fp32", two_shot_fused),
    ("symm_rs_bf16", reduce_scatter),
    ("symm_rs_fp16", reduce_scatter),
    ("symm_rs_fp32", reduce_scatter),
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum SymmKernel {
    OneShot,
    TwoShot,
    /// Two-shot with the copy-in inside the kernel: block b copies its part of every shard before it signals.
    TwoShotFused,
    ReduceScatter,
}

fn one_shot(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, SymmKernel::OneShot)
}
fn two_shot(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, SymmKernel::TwoShot)
}
fn two_shot_fused(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, SymmKernel::TwoShotFused)
}
fn reduce_scatter(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    run(l, SymmKernel::ReduceScatter)
}

fn barrier(p: &SymmParams, channel: usize, deadline: &Deadline, what: &str) -> Result<(), KernelFault> {
    // SAFETY: pads[r] for r < world are live signal pads, mapped at setup.
    unsafe { cas_barrier(&p.pads[..p.world as usize], p.rank as usize, channel, deadline, what) }
}

fn run(l: &HostLaunch<'_>, kind: SymmKernel) -> Result<(), KernelFault> {
    let p: SymmParams = l.params()?;
    let dtype = DType::from_code(p.dtype)?;
    // SAFETY: the status words are the communicator's (or the method's own) live memory, process memory on the host
    // driver, which others change only with atomic stores.
    let deadline = unsafe { Deadline::after(Duration::from_nanos(p.timeout_ns)).watching(p.status) };
    let (count, grid, vec, size) = (p.count as usize, l.dims.grid as usize, dtype.vec(), dtype.size());
    let (rank, world) = (p.rank as usize, p.world as usize);
    let srcs = sum_sources(p.bufs[..world].iter().copied(), p.bias);
    let name = match kind {
        SymmKernel::OneShot => "symm_1shot",
        SymmKernel::TwoShot => "symm_2shot",
        SymmKernel::TwoShotFused => "symm_2shot_fused",
        SymmKernel::ReduceScatter => "symm_rs",
    };
    for b in 0..grid {
        let what = |n: usize| format!("{name} rank {rank} block {b} barrier {n}");
        if kind == SymmKernel::OneShot {
            let (lo, hi) = block_range(0, count, b, grid, vec);
            // SAFETY: the input and this rank's buffer hold `count` elements.
            unsafe { HostElem::copy(dtype, p.input as *const u8, p.bufs[rank] as *mut u8, lo, hi) };
        }
        if kind == SymmKernel::TwoShotFused {
            let shard = shard_elems(count, world, vec);
            for s in 0..world {
                let (lo, hi) = shard_range(count, shard, s);
                let (lo, hi) = block_range(lo, hi, b, grid, vec);
                // SAFETY: as above; the previous call's exit barrier means no peer still reads this buffer.
                unsafe { HostElem::copy(dtype, p.input as *const u8, p.bufs[rank] as *mut u8, lo, hi) };
            }
        }
        barrier(&p, b, &deadline, &what(0))?;
        match kind {
            SymmKernel::OneShot => {
                let (lo, hi) = block_range(0, count, b, grid, vec);
                // SAFETY: every buffer holds `count` elements, the output too.
                unsafe { HostElem::reduce(dtype, &srcs, lo, hi, (p.output as *mut u8).add(lo * size)) };
            }
            SymmKernel::TwoShot | SymmKernel::TwoShotFused => {
                let shard = shard_elems(count, world, vec);
                let sub = |s: usize| {
                    let (lo, hi) = shard_range(count, shard, s);
                    block_range(lo, hi, b, grid, vec)
                };
                let (lo, hi) = sub(rank);
                // SAFETY: in place into this rank's own shard of its own buffer.
                unsafe { HostElem::reduce(dtype, &srcs, lo, hi, (p.bufs[rank] as *mut u8).add(lo * size)) };
                barrier(&p, b, &deadline, &what(1))?;
                for s in 0..world {
                    let (lo, hi) = sub(s);
                    // SAFETY: buffers and output hold `count` elements; peer s finished its shard (barrier 1).
                    unsafe { HostElem::copy(dtype, p.bufs[s] as *const u8, p.output as *mut u8, lo, hi) };
                }
            }
            SymmKernel::ReduceScatter => {
                let shard = count / world;
                let (lo, hi) = shard_range(count, shard, rank);
                let (lo, hi) = block_range(lo, hi, b, grid, vec);
                let dst = (p.output as *mut u8).wrapping_add((lo - rank * shard) * size);
                // SAFETY: the output holds `shard` elements; [lo, hi) lies in this rank's shard.
                unsafe { HostElem::reduce(dtype, &srcs, lo, hi, dst) };
            }
        }
        let last = if matches!(kind, SymmKernel::TwoShot | SymmKernel::TwoShotFused) { 2 } else { 1 };
        barrier(&p, b, &deadline, &what(last))?;
    }
    Ok(())
}
