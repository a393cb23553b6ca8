//! The ceilings every result is quoted against, measured by the same binary in the same run: the device copy
//! bandwidth (bytes read + written), an empty kernel launched eagerly and replayed from a graph (on rank 0 alone,
//! while the others wait), and the protocol's floor: car's barrier-only kernel on every rank, timed like a method;
//! and per size of a sweep with `auto`, every rank's copy of its input at once, the copy floor of a caller-buffer call.

use crate::config::SweepConfig;
use crate::BenchError;
use allreduce::Communicator;
use gpu::{DeviceBuffer, HostLaunch, KernelLibrary, LaunchDims};
use measure::timing::Timer;
use serde::{Deserialize, Serialize};

static LIBRARY: KernelLibrary = KernelLibrary {
    name: "ceilings",
    source: "extern \"C\" __global__ void arx_empty(unsigned long long unused) {}\n",
    headers: &[],
    host: &[("arx_empty", empty)],
};

fn empty(_: &HostLaunch<'_>) -> Result<(), gpu::KernelFault> {
    Ok(())
}

const LAUNCHES: u32 = 1000;
const COPIES: u32 = 10;

/// No barrier among the ranks of one node takes this long while they all run: a floor this high means the ranks that
/// share a device take turns on it (CUDA without MPS gives each process's context the whole device, one at a time).
const TAKING_TURNS_US: f64 = 1000.0;

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
    /// Prints the ceilings, and a warning where `sharing` ranks of a GPU driver `kind` share each device and the
    /// barrier floor shows them taking turns on it.
    pub fn print(&self, kind: gpu::DriverKind, sharing: usize) {
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
        if let Some(warning) = self.taking_turns(kind, sharing) {
            println!("# warning: {warning}");
        }
    }

    fn taking_turns(&self, kind: gpu::DriverKind, sharing: usize) -> Option<String> {
        let floor =
            self.barrier_us.filter(|&t| kind != gpu::DriverKind::Host && sharing > 1 && t >= TAKING_TURNS_US)?;
        let remedy = match kind {
            gpu::DriverKind::Cuda => {
                "start MPS (`nvidia-cuda-mps-control -d`) before the ranks, or give each rank a GPU"
            }
            _ => "give each rank a GPU",
        };
        Some(format!(
            "the barrier floor is {floor:.0} us with {sharing} ranks on a device: they take turns on it rather than \
             running at once, so every time below measures the turns, not the methods; {remedy}"
        ))
    }
}

/// Measures the ceilings. Collective: every rank calls it; rank 0's figures are the ones reported.
pub(crate) fn measure(cfg: &SweepConfig, comm: &Communicator, t: &Timer) -> Result<Ceilings, BenchError> {
    let (gpu, rdv) = (comm.gpu(), comm.rendezvous());
    // Well past the last-level cache (60 MB on an H200), so the copy measures memory.
    let bytes = if gpu.kind() == gpu::DriverKind::Host { 64 << 20 } else { 512 << 20 };
    let (mut copy_gbs, mut launch_us, mut replay_us) = (f64::NAN, f64::NAN, f64::NAN);
    let module = gpu.load(&LIBRARY)?;
    let kernel = module.kernel("arx_empty")?;
    let dims = LaunchDims { grid: 1, block: 32, shared_bytes: 0 };
    if rdv.rank() == 0 {
        let (src, dst) = (gpu.alloc(bytes, gpu::MemKind::Device)?, gpu.alloc(bytes, gpu::MemKind::Device)?);
        t.stream.fill(&src, 0)?;
        // SAFETY (copies and launches): two buffers of `bytes` of ours; the empty kernel touches no memory.
        let copy = |s: &gpu::Stream| (0..COPIES).try_for_each(|_| unsafe { s.copy(dst.ptr(), src.ptr(), bytes) });
        copy(&t.stream)?;
        let ms = t.elapsed_ms(|s| Ok::<_, BenchError>(copy(s)?))?;
        copy_gbs = 2.0 * bytes as f64 * COPIES as f64 / (ms * 1e-3) / 1e9;

        drop((src, dst));
        let launch = |s: &gpu::Stream| (0..LAUNCHES).try_for_each(|_| unsafe { s.launch(&kernel, dims, &0u64) });
        launch(&t.stream)?;
        launch_us = t.elapsed_ms(|s| Ok::<_, BenchError>(launch(s)?))? * 1e3 / LAUNCHES as f64;
        t.stream.begin_capture()?;
        let captured = unsafe { t.stream.launch(&kernel, dims, &0u64) };
        let graph = t.stream.end_capture()?;
        captured?;
        t.stream.replay(&graph)?;
        replay_us = t.elapsed_ms(|s| Ok::<_, BenchError>((0..LAUNCHES).try_for_each(|_| s.replay(&graph))?))? * 1e3
            / LAUNCHES as f64;
    }
    rdv.barrier("ceilings measured")?;
    let timing = cfg.timing;
    // SAFETY: the empty kernel touches no memory.
    let empty = t.time_calls(&timing, rdv, |s| Ok::<_, BenchError>(unsafe { s.launch(&kernel, dims, &0u64) }?))?;
    let empty_all_ranks_us = empty.median_ms() * 1e3;
    let opts = car::CarOptions { capacity_bytes: 256, uncached: true, rule: None, variant: car::Variant::Base };
    let floor = methods::with_team(comm, |team| car::Car::new(team, car::Algo::OneShot, opts))?;
    let barrier = t.time_calls(&timing, rdv, |s| Ok::<_, BenchError>(floor.barrier_only(1, s)?))?;
    t.stream.sync()?;
    rdv.barrier("barrier floor measured")?;
    let barrier_us = Some(barrier.median_ms() * 1e3);
    Ok(Ceilings {
        copy_bytes: bytes,
        copy_gbs,
        empty_launch_us: launch_us,
        empty_graph_replay_us: replay_us,
        empty_all_ranks_us,
        barrier_us,
    })
}

/// Every rank's copy of its input at one size, all ranks at once, timed as the methods are (`--report`, median of
/// the repeats): the least a caller-buffer call adds to a registered one, with the ranks' copies contending as their
/// calls' do.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CopyFloor {
    pub count: usize,
    pub time_ms: f64,
}

/// Every rank copies `count` elements from `src` into `dst` at once, timed as the methods are. Collective.
pub(crate) fn copy_floor(
    cfg: &SweepConfig,
    comm: &Communicator,
    t: &Timer,
    (dst, src): (&DeviceBuffer, &DeviceBuffer),
    count: usize,
) -> Result<CopyFloor, BenchError> {
    let bytes = count * cfg.dtype.size();
    if bytes > dst.bytes().min(src.bytes()) {
        return Err(BenchError::Config(format!("a copy floor of {bytes} bytes is larger than the sweep's buffers")));
    }
    let timing = t.time_calls(&cfg.timing, comm.rendezvous(), |s| {
        // SAFETY: two of the benchmark's own buffers, checked above to hold `bytes`.
        Ok::<_, BenchError>(unsafe { s.copy(dst.ptr(), src.ptr(), bytes) }?)
    })?;
    t.stream.sync()?;
    Ok(CopyFloor { count, time_ms: cfg.report.figure_ms(&timing) })
}

#[cfg(test)]
mod tests {
    use super::Ceilings;
    use gpu::DriverKind::{Cuda, Hip, Host};

    fn with_floor(barrier_us: Option<f64>) -> Ceilings {
        Ceilings {
            copy_bytes: 512 << 20,
            copy_gbs: 3000.0,
            empty_launch_us: 4.0,
            empty_graph_replay_us: 1.8,
            empty_all_ranks_us: 2.0,
            barrier_us,
        }
    }

    #[test]
    fn ranks_taking_turns_on_a_device_are_warned_of() {
        let turns = with_floor(Some(15763.15)).taking_turns(Cuda, 8).expect("a 15.8 ms floor with 8 ranks on a device");
        assert!(turns.contains("15763 us with 8 ranks") && turns.contains("MPS"), "{turns}");
        let hip = with_floor(Some(2500.0)).taking_turns(Hip, 2).expect("the same on HIP");
        assert!(!hip.contains("MPS"), "{hip}");
        assert_eq!(with_floor(Some(13.8)).taking_turns(Cuda, 8), None, "ranks running at once under MPS");
        assert_eq!(with_floor(Some(15763.15)).taking_turns(Cuda, 1), None, "a device per rank shares nothing");
        assert_eq!(with_floor(Some(5000.0)).taking_turns(Host, 2), None, "the host driver's ranks share no device");
        assert_eq!(with_floor(None).taking_turns(Cuda, 8), None, "no floor measured");
    }
}
