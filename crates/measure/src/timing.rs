//! The one timing path of every measurement (comm-bench, its soak and ceilings, the criterion benches and
//! the communicator's tune): warm-up, then per repeat a barrier so all ranks start together, `iters` calls
//! between two events (or one replay of a graph of `iters` captured calls), and the slowest rank's time per call.

use gpu::{Event, Gpu, GpuError, Stream};
use ipc::{IpcError, Rendezvous};
use std::time::{Duration, Instant};

/// How calls are timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimingOptions {
    pub iters: u64,
    pub warmup: u64,
    pub repeats: u64,
    /// Capture `iters` calls into a graph once and time its replays.
    pub graph: bool,
}

/// A stream and the two events that bracket its timed calls.
pub struct Timer {
    pub stream: Stream,
    start: Event,
    end: Event,
}

/// What one timing gave: the slowest rank's milliseconds per call, per repeat, and rank 0's own first figure
/// (what comm_bench.py reports); and the host's side: the slowest rank's wall time per call spent issuing the calls
/// (per repeat), which is what a library adds to every eager call whether or not the device hides it.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    pub repeats_ms: Vec<f64>,
    pub rank0_ms: f64,
    pub issue_ms: Vec<f64>,
    /// Every rank's milliseconds per call (rank order), per repeat: what a caller combines otherwise than by the
    /// slowest rank (comm-bench's `--report`).
    pub ranks_ms: Vec<Vec<f64>>,
}

impl Timing {
    /// The timings of one thing taken one repeat at a time (in rounds among others) as one: every repeat in order,
    /// rank 0's own figure the first part's. `None` for no parts.
    pub fn joined(parts: Vec<Timing>) -> Option<Timing> {
        let mut parts = parts.into_iter();
        let mut all = parts.next()?;
        for part in parts {
            all.repeats_ms.extend(part.repeats_ms);
            all.issue_ms.extend(part.issue_ms);
            all.ranks_ms.extend(part.ranks_ms);
        }
        Some(all)
    }

    pub fn median_ms(&self) -> f64 {
        median(&self.repeats_ms)
    }
    pub fn median_issue_ms(&self) -> f64 {
        median(&self.issue_ms)
    }
}

impl Timer {
    pub fn new(gpu: &Gpu) -> Result<Timer, GpuError> {
        Ok(Timer { stream: gpu.stream()?, start: gpu.event()?, end: gpu.event()? })
    }

    /// Milliseconds that `work` (issued on this timer's stream) takes on this rank alone.
    pub fn elapsed_ms<E: From<GpuError>>(&self, work: impl FnOnce(&Stream) -> Result<(), E>) -> Result<f64, E> {
        self.stream.sync()?;
        self.stream.record(&self.start)?;
        work(&self.stream)?;
        self.stream.record(&self.end)?;
        self.end.sync()?;
        Ok(self.start.elapsed_ms(&self.end)? as f64)
    }

    /// Times `enqueue` on every rank. Collective: every rank calls it with the same options.
    pub fn time_calls<E: From<GpuError> + From<IpcError>>(
        &self,
        opts: &TimingOptions,
        rdv: &Rendezvous,
        mut enqueue: impl FnMut(&Stream) -> Result<(), E>,
    ) -> Result<Timing, E> {
        let stream = &self.stream;
        let graph = if opts.graph {
            stream.begin_capture()?;
            let captured = (0..opts.iters).try_for_each(|_| enqueue(stream));
            let graph = stream.end_capture()?;
            captured?;
            Some(graph)
        } else {
            None
        };
        let mut call = |n: u64| -> Result<(), E> {
            match &graph {
                Some(g) => (0..n.div_ceil(opts.iters)).try_for_each(|_| stream.replay(g))?,
                None => (0..n).try_for_each(|_| enqueue(stream))?,
            }
            Ok(())
        };
        let mut timing =
            Timing { repeats_ms: Vec::new(), rank0_ms: f64::NAN, issue_ms: Vec::new(), ranks_ms: Vec::new() };
        call(opts.warmup)?;
        for i in 0..opts.repeats {
            stream.sync()?;
            rdv.barrier("align ranks before timing")?;
            stream.record(&self.start)?;
            let issued = Instant::now();
            call(opts.iters)?;
            let issue_ms = issued.elapsed().as_secs_f64() * 1e3 / opts.iters as f64;
            stream.record(&self.end)?;
            self.end.sync()?;
            let ms = self.start.elapsed_ms(&self.end)? as f64 / opts.iters as f64;
            let all = rdv.all_gather("times", &[ms.to_le_bytes(), issue_ms.to_le_bytes()].concat())?;
            let field = |t: &[u8], k: usize| f64::from_le_bytes(t[8 * k..8 * k + 8].try_into().expect("8-byte times"));
            if i == 0 {
                timing.rank0_ms = field(&all[0], 0);
            }
            timing.repeats_ms.push(all.iter().map(|t| field(t, 0)).fold(0.0, f64::max));
            timing.issue_ms.push(all.iter().map(|t| field(t, 1)).fold(0.0, f64::max));
            timing.ranks_ms.push(all.iter().map(|t| field(t, 0)).collect());
        }
        Ok(timing)
    }
}

/// Whether `budget` has passed since `started` by rank 0's clock, told to every rank, so that a sweep or a tune
/// that checks between its steps stops after the same step on every rank. No budget: never.
pub fn out_of_time(rdv: &Rendezvous, budget: Option<Duration>, started: Instant) -> Result<bool, IpcError> {
    let Some(budget) = budget else { return Ok(false) };
    Ok(rdv.broadcast("time budget", 0, &[u8::from(started.elapsed() > budget)])? == [1])
}

/// Each of `n` candidates timed `rounds` times by `time(candidate)`, round by round (every candidate once, in turn,
/// then the next round): a slow spell of the device (its clocks, another process's kernels under MPS) then falls on
/// every candidate alike, not on whichever was being timed through it. Each candidate's timings, in order.
pub fn in_rounds<T, E>(n: usize, rounds: usize, mut time: impl FnMut(usize) -> Result<T, E>) -> Result<Vec<Vec<T>>, E> {
    let mut all: Vec<Vec<T>> = (0..n).map(|_| Vec::with_capacity(rounds)).collect();
    for _ in 0..rounds {
        for (i, timings) in all.iter_mut().enumerate() {
            timings.push(time(i)?);
        }
    }
    Ok(all)
}

/// Median of `v` (the mean of the two middle values for an even count; NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::{in_rounds, median, Timing};

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn timings_taken_in_rounds_join_in_order_with_the_first_rank_0_figure() {
        let part = |ms: f64| Timing {
            repeats_ms: vec![ms],
            rank0_ms: ms - 0.5,
            issue_ms: vec![ms / 10.0],
            ranks_ms: vec![vec![ms - 0.5, ms]],
        };
        let all = Timing::joined(vec![part(3.0), part(1.0), part(2.0)]).unwrap();
        assert_eq!(all.repeats_ms, [3.0, 1.0, 2.0]);
        assert_eq!(all.rank0_ms, 2.5);
        assert_eq!(all.issue_ms, [0.3, 0.1, 0.2]);
        assert_eq!(all.ranks_ms, [[2.5, 3.0], [0.5, 1.0], [1.5, 2.0]]);
        assert_eq!(all.median_ms(), 2.0);
        assert!(Timing::joined(Vec::new()).is_none());
    }

    #[test]
    fn candidates_are_timed_in_rounds_so_a_slow_spell_falls_on_each_alike() {
        // Three candidates that take 10, 11 and 12, on a device 5 slower through the first three timings: timed one
        // after another, the first would take the whole spell (15) and lose to both.
        let truth = [10.0, 11.0, 12.0];
        let mut order = Vec::new();
        let all = in_rounds(3, 3, |i| {
            order.push(i);
            Ok::<_, ()>(truth[i] + if order.len() <= 3 { 5.0 } else { 0.0 })
        })
        .unwrap();
        assert_eq!(order, [0, 1, 2, 0, 1, 2, 0, 1, 2]);
        assert_eq!(all.iter().map(|t| median(t)).collect::<Vec<_>>(), truth);
        // A failed timing ends the rounds there.
        let mut calls = 0;
        let e = in_rounds(2, 3, |i| {
            calls += 1;
            if i == 1 {
                Err("lost")
            } else {
                Ok(1.0)
            }
        });
        assert_eq!((e, calls), (Err("lost"), 2));
    }
}
