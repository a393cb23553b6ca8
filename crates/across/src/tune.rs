//! [`Across::tune`]: both allreduce paths timed on the job's own shape, the fastest per size kept as the path table.

use crate::{Across, Error, Path, PathTable};
use allreduce::DType;
use gpu::{DeviceBuffer, MemKind, Stream};
use measure::timing::{in_rounds, median, Timer};

/// The paths a tune times, in this order each round.
const PATHS: [Path; 2] = [Path::Nccl, Path::Hierarchical];

impl Across {
    /// Times both allreduce paths at each of `counts` (rounded up to a multiple of a node's ranks) on `dtype`, in
    /// `repeats` rounds of one timing of each path ([`in_rounds`]): per timing every rank starts together (a job-wide
    /// all-gather, waited for), times `iters` calls, and the slowest rank's time per call counts (every rank
    /// all-gathers every rank's); the median of the rounds per size and path.
    /// The fastest path per size becomes the table every later call without a path follows, stored by rank 0 in
    /// the tune cache for later jobs of this shape. Collective: every rank calls it with the same arguments.
    pub fn tune(&mut self, dtype: DType, counts: &[usize], iters: u64, repeats: u64) -> Result<PathTable, Error> {
        let l = self.topology.local_world();
        let counts: Vec<usize> = counts.iter().map(|&c| c.max(1).next_multiple_of(l)).collect();
        let largest = counts.iter().max().copied().unwrap_or(0) * dtype.size();
        if counts.is_empty() || iters == 0 || repeats == 0 {
            return Err(Error::BadArgs("tune needs at least one count, one call and one repeat".into()));
        }
        if largest > self.capacity {
            return Err(Error::BadArgs(format!("tune: {largest} bytes exceed the capacity of {}", self.capacity)));
        }
        let gpu = self.local.gpu().clone();
        let timer = Timer::new(&gpu)?;
        let data = gpu.alloc(largest, MemKind::Device)?;
        timer.stream.fill(&data, 0)?;
        let world = self.topology.world();
        let (mine, everyone) = (gpu.alloc(4, MemKind::Device)?, gpu.alloc(4 * world, MemKind::Device)?);
        let mut times = Vec::new();
        for &count in &counts {
            let run = |s: &Stream, path: Path, n: u64| -> Result<(), Error> {
                for _ in 0..n {
                    // SAFETY: our own buffer of `largest` bytes on this device, in place; every rank makes the
                    // same calls on the timer's stream.
                    unsafe { self.all_reduce(data.ptr(), data.ptr(), count, dtype, s.handle(), Some(path))? };
                }
                Ok(())
            };
            for path in PATHS {
                run(&timer.stream, path, 2)?;
            }
            let rounds = in_rounds(PATHS.len(), repeats as usize, |k| {
                self.gather_f32(0.0, &mine, &everyone, &timer.stream)?;
                let ms = timer.elapsed_ms(|s| run(s, PATHS[k], iters))? / iters as f64;
                let all = self.gather_f32(ms as f32, &mine, &everyone, &timer.stream)?;
                Ok::<_, Error>(all.into_iter().fold(0.0, f64::max))
            })?;
            for (path, slowest) in PATHS.into_iter().zip(&rounds) {
                times.push((count * dtype.size(), path, median(slowest)));
            }
        }
        let key = self.path_key.clone();
        let on = format!("{key}, {dtype}, {iters} calls x {repeats} repeats, through Across::tune");
        let table = PathTable::from_times(&times, key, on)?;
        if self.topology.rank() == 0 {
            if let Some(dir) = &self.tune_dir {
                table.store(dir)?;
            }
        }
        self.paths = Some(table.clone());
        Ok(table)
    }

    /// Every rank's `value`, in rank order, through the whole job's NCCL, waited for (so it is also a barrier).
    fn gather_f32(
        &self,
        value: f32,
        mine: &DeviceBuffer,
        everyone: &DeviceBuffer,
        stream: &Stream,
    ) -> Result<Vec<f64>, Error> {
        stream.upload(mine, 0, &value.to_le_bytes())?;
        // SAFETY: 4 bytes in, 4 per rank out, our own buffers; every rank makes the same calls.
        unsafe { self.all_gather(mine.ptr(), everyone.ptr(), 1, DType::F32, stream.handle())? };
        let mut bytes = vec![0u8; 4 * self.topology.world()];
        stream.download(everyone, 0, &mut bytes)?;
        Ok(bytes.chunks_exact(4).map(|b| f64::from(f32::from_le_bytes(b.try_into().expect("4 bytes")))).collect())
    }
}
