//! Host twins of `kernels/car.cu`: the same partition, epochs, flag slots and barriers, with std atomics on the
//! shared mappings. Blocks run one after another; every rank runs them in the same order, so block b's barrier
//! only ever waits for the peers' block b, as on the device.

use crate::CarParams;
use collective::host_sync::{flag_barrier, next_epoch};
use collective::{block_range, shard_elems, shard_range, DType, HostElem};
use deadline::Deadline;
use gpu::{HostKernel, HostLaunch};
use std::time::Duration;

pub(crate) static KERNELS: &[(&str, HostKernel)] = &[
    ("car_1shot_bf16", one_shot),
    ("car_1shot_fp16", one_shot),
    ("car_1shot_fp32", one_shot),
    ("car_2shot_bf16", two_shot),
    ("car_2shot_fp16", two_shot),
    ("car_2shot_fp32", two_shot),
    ("car_rs_bf16", reduce_scatter),
    ("car_rs_fp16", reduce_scatter),
    ("car_rs_fp32", reduce_scatter),
    ("car_barrier_only", barrier_only),
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    BarrierOnly,
    OneShot,
    TwoShot,
    ReduceScatter,
}

fn barrier_only(l: &HostLaunch<'_>) -> Result<(), String> {
    run(l, Kind::BarrierOnly)
}
fn one_shot(l: &HostLaunch<'_>) -> Result<(), String> {
    run(l, Kind::OneShot)
}
fn two_shot(l: &HostLaunch<'_>) -> Result<(), String> {
    run(l, Kind::TwoShot)
}
fn reduce_scatter(l: &HostLaunch<'_>) -> Result<(), String> {
    run(l, Kind::ReduceScatter)
}

struct Call<'a> {
    p: &'a CarParams,
    dtype: DType,
    rank: usize,
    world: usize,
    deadline: Deadline,
}

impl Call<'_> {
    fn barrier(&self, block: usize, phase: usize, epoch: u64, kernel: &str) -> Result<(), String> {
        // SAFETY: flags[r] for r < world are live flag arrays, mapped at setup.
        unsafe { flag_barrier(&self.p.flags[..self.world], self.rank, block, phase, epoch, &self.deadline, kernel) }
    }

    fn copy(&self, src: u64, dst: u64, (lo, hi): (usize, usize)) {
        // SAFETY: both are buffers of at least `count` elements (input, or a registered half of capacity).
        unsafe { HostElem::copy(self.dtype, src as *const u8, dst as *mut u8, lo, hi) }
    }
}

fn run(l: &HostLaunch<'_>, kind: Kind) -> Result<(), String> {
    let p: CarParams = l.params()?;
    let call = Call {
        p: &p,
        dtype: DType::from_code(p.dtype)?,
        rank: p.rank as usize,
        world: p.world as usize,
        deadline: Deadline::after(Duration::from_nanos(p.timeout_ns)),
    };
    let (count, grid, vec, size) = (p.count as usize, l.dims.grid as usize, call.dtype.vec(), call.dtype.size());
    let name = match kind {
        Kind::BarrierOnly => "car_barrier_only",
        Kind::OneShot => "car_1shot",
        Kind::TwoShot => "car_2shot",
        Kind::ReduceScatter => "car_rs",
    };
    for b in 0..grid {
        // SAFETY: counters is this rank's array of MAX_BLOCKS u64.
        let epoch = unsafe { next_epoch(p.counters, b, grid) };
        let off = (epoch & 1) * p.half_bytes;
        let views: Vec<u64> = p.bufs[..call.world].iter().map(|&a| a + off).collect();
        let srcs: Vec<*const u8> = views.iter().map(|&a| a as *const u8).collect();
        let mine = views[call.rank];
        match kind {
            Kind::BarrierOnly => call.barrier(b, 0, epoch, name)?,
            Kind::OneShot => {
                let r = block_range(0, count, b, grid, vec);
                call.copy(p.input, mine, r);
                call.barrier(b, 0, epoch, name)?;
                // SAFETY: all views hold `count` elements, the output too.
                unsafe { HostElem::reduce(call.dtype, &srcs, r.0, r.1, (p.output as *mut u8).add(r.0 * size)) };
            }
            Kind::TwoShot | Kind::ReduceScatter => {
                let shard =
                    if kind == Kind::TwoShot { shard_elems(count, call.world, vec) } else { count / call.world };
                let sub = |s: usize| {
                    let (lo, hi) = shard_range(count, shard, s);
                    block_range(lo, hi, b, grid, vec)
                };
                for s in 0..call.world {
                    call.copy(p.input, mine, sub(s));
                }
                call.barrier(b, 0, epoch, name)?;
                let (lo, hi) = sub(call.rank);
                if kind == Kind::ReduceScatter {
                    let dst = (p.output as *mut u8).wrapping_add((lo - call.rank * shard) * size);
                    // SAFETY: the output holds `shard` elements; [lo, hi) lies in this rank's shard.
                    unsafe { HostElem::reduce(call.dtype, &srcs, lo, hi, dst) };
                    continue;
                }
                // SAFETY: in place into this rank's own shard of its own buffer.
                unsafe { HostElem::reduce(call.dtype, &srcs, lo, hi, (mine as *mut u8).add(lo * size)) };
                call.barrier(b, 1, epoch, name)?;
                for (s, &view) in views.iter().enumerate() {
                    call.copy(view, p.output, sub(s));
                }
            }
        }
    }
    Ok(())
}
