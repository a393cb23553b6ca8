//! The ceilings every result is quoted against, measured by the same binary in the same run: the device copy
//! bandwidth (bytes read + written), an empty kernel launched eagerly and replayed from a graph (on rank 0 alone,
//! while the others wait), and the protocol's floor: car's barrier-only kernel on every rank, timed like a method.

use crate::cli::BenchArgs;
use crate::run::{time_calls, Buffers};
use crate::BenchError;
use gpu::{Gpu, HostLaunch, KernelLibrary, LaunchDims};
use ipc::Rendezvous;
use serde::{Deserialize, Serialize};

static LIBRARY: KernelLibrary = KernelLibrary {
    name: "ceilings",
    source: "extern \"C\" __global__ void arx_empty(unsigned long long unused) {}\n",
    host: &[("arx_empty", empty)],
};

fn empty(_: &HostLaunch<'_>) -> Result<(), String> {
    Ok(())
}

const LAUNCHES: u32 = 1000;
const COPIES: u32 = 10;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ceilings {
    /// Bytes of each timed device-to-device copy.
    pub copy_bytes: usize,
    /// Copy bandwidth counting bytes read and written.
    pub copy_gbs: f64,
    pub empty_launch_us: f64,
    pub empty_graph_replay_us: f64,
    /// The empty kernel on every rank at once, timed like a method (eager or graph as the sweep): the launch floor
    /// of any method when ranks share a GPU (under MPS their launches contend).
    pub empty_all_ranks_us: f64,
    /// car's barrier-only kernel (one block), eager or graph as the sweep; `None` where car cannot run.
    pub barrier_us: Option<f64>,
}

impl Ceilings {
    pub fn print(&self) {
        println!(
            "# ceilings: copy {:.1} GB/s ({} MB, read + written), empty kernel {:.2} us eager / {:.2} us graph replay \
             (rank 0 alone), {:.2} us on all ranks at once, barrier floor {}",
            self.copy_gbs,
            self.copy_bytes >> 20,
            self.empty_launch_us,
            self.empty_graph_replay_us,
            self.empty_all_ranks_us,
            self.barrier_us.map_or("n/a".to_string(), |t| format!("{t:.2} us"))
        );
    }
}

fn elapsed_ms(b: &Buffers, work: impl FnOnce() -> Result<(), BenchError>) -> Result<f64, BenchError> {
    b.stream.sync()?;
    b.stream.record(&b.start)?;
    work()?;
    b.stream.record(&b.end)?;
    b.end.sync()?;
    Ok(b.start.elapsed_ms(&b.end)? as f64)
}

/// Measures the ceilings. Collective: every rank calls it; rank 0's figures are the ones reported.
pub(crate) fn measure(args: &BenchArgs, gpu: &Gpu, rdv: &Rendezvous, b: &Buffers) -> Result<Ceilings, BenchError> {
    // Well past the last-level cache (60 MB on an H200), so the copy measures memory.
    let bytes = if gpu.kind() == gpu::DriverKind::Host { 64 << 20 } else { 512 << 20 };
    let (mut copy_gbs, mut launch_us, mut replay_us) = (f64::NAN, f64::NAN, f64::NAN);
    let module = gpu.load(&LIBRARY)?;
    let kernel = module.kernel("arx_empty")?;
    let dims = LaunchDims { grid: 1, block: 32, shared_bytes: 0 };
    if rdv.rank() == 0 {
        let (src, dst) = (gpu.alloc(bytes, gpu::MemKind::Device)?, gpu.alloc(bytes, gpu::MemKind::Device)?);
        b.stream.memset(src.ptr(), 0, bytes)?;
        let copy = || (0..COPIES).try_for_each(|_| b.stream.copy(dst.ptr(), src.ptr(), bytes));
        copy()?;
        let ms = elapsed_ms(b, || Ok(copy()?))?;
        copy_gbs = 2.0 * bytes as f64 * COPIES as f64 / (ms * 1e-3) / 1e9;

        drop((src, dst));
        let launch = || (0..LAUNCHES).try_for_each(|_| b.stream.launch(&kernel, dims, &0u64));
        launch()?;
        launch_us = elapsed_ms(b, || Ok(launch()?))? * 1e3 / LAUNCHES as f64;
        b.stream.begin_capture()?;
        let captured = b.stream.launch(&kernel, dims, &0u64);
        let graph = b.stream.end_capture()?;
        captured?;
        b.stream.replay(&graph)?;
        replay_us =
            elapsed_ms(b, || Ok((0..LAUNCHES).try_for_each(|_| b.stream.replay(&graph))?))? * 1e3 / LAUNCHES as f64;
    }
    rdv.barrier("ceilings measured")?;
    let (repeats, _) = time_calls(args, rdv, b, |s| Ok(s.launch(&kernel, dims, &0u64)?))?;
    let empty_all_ranks_us = median(repeats) * 1e3;
    let barrier_us = if rdv.world() <= collective::MAX_RANKS {
        let opts = car::CarOptions { capacity_bytes: 256, uncached: true, rule: None, variant: car::Variant::Base };
        let floor = car::Car::new(gpu, rdv, car::Algo::OneShot, opts)?;
        let (repeats, _) = time_calls(args, rdv, b, |s| Ok(floor.barrier_only(1, s)?))?;
        b.stream.sync()?;
        rdv.barrier("barrier floor measured")?;
        Some(median(repeats) * 1e3)
    } else {
        None
    };
    Ok(Ceilings {
        copy_bytes: bytes,
        copy_gbs,
        empty_launch_us: launch_us,
        empty_graph_replay_us: replay_us,
        empty_all_ranks_us,
        barrier_us,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
