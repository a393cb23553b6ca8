//! [`Communicator::tune`]: every candidate measured through the communicator's own call path, for every mode and
//! every residency a call can have, checked before it is timed, and the fastest per size stored as this machine's
//! tables.

use super::Communicator;
use crate::tune::{Algorithm, Choice, LoadedTable, Mode, Residency, TableKey, TableOp, TableSource, TuneTable};
use crate::Error;
use collective_core::{AddRmsNorm, Call, DType, Op};
use gpu::{DeviceBuffer, MemKind};
use measure::check::{self, NormCase};
use measure::timing::{in_rounds, median, out_of_time, Timer, TimingOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The buffers a tune measures on: its own, its registered ones, and the norm calls' residual and weight.
struct TuneBuffers<'a> {
    own: &'a [DeviceBuffer; 2],
    shared: &'a [DeviceBuffer; 2],
    norm: Option<(usize, &'a [DeviceBuffer; 2])>,
}

/// What [`Communicator::tune_with`] measures.
#[derive(Clone, Debug)]
pub struct TuneRequest {
    pub dtype: DType,
    /// Element counts, each within the capacity [default: comm_bench.py's sizes and the powers of two from 1024 to
    /// 16,777,216 elements, up to the capacity].
    pub counts: Option<Vec<usize>>,
    /// Calls per timing (`graph` is ignored: both modes are measured).
    pub timing: TimingOptions,
    /// The row length at which calls with the residual add and RMSNorm are measured too, for their own tables
    /// (None: not measured). Their sizes are 1, 4, 16, ... rows, as far as the capacity and the largest count go.
    pub norm_hidden: Option<usize>,
    /// Whether plain allreduces are measured (and their tables written); false: norm calls only, whose sizes the
    /// counts still bound (a norm table re-measured without the time of the plain ones).
    pub plain: bool,
    /// The residencies measured, each for tables of its own [default: all three]; the others' tables stay as they
    /// are. A program that passes only its own tensors needs only [`Residency::Caller`]'s (a third of the time).
    pub residencies: Vec<Residency>,
    /// A time budget: once this much has passed since the tune began (by rank 0's clock, so every rank agrees), no
    /// further table is started; the tables measured whole are kept and followed, and the report names the rest
    /// ([`TuneReport::not_run`]). The first table is always measured [default: none].
    pub max_duration: Option<Duration>,
}

/// The row length norm calls are tuned at by default: a mid-sized model's hidden size.
pub const NORM_HIDDEN: usize = 4096;

/// How much slower than the fastest plain allreduce at a size an allreduce may be and still have the unfused sequence
/// measured after it on norm calls ([`Communicator::unfused_after`]).
const UNFUSED_AFTER: f64 = 0.10;

/// How far (a factor) the plain count [`near_fastest`] judges by may lie from the norm call's: comm_bench.py's sizes
/// lie closer, a sparse `--counts` may not, and then every allreduce gets the unfused sequence after it.
const NEAR: usize = 2;

/// The allreduces within [`UNFUSED_AFTER`] of the fastest of `(count, algorithm, ms)` at the count nearest `count`,
/// where that is within a factor [`NEAR`] of it (None otherwise, or without measurements): the ones worth the unfused
/// sequence after them on a norm call of `count` elements, since the norm kernel after it costs every allreduce the
/// same.
fn near_fastest(plain: &[(usize, Algorithm, f64)], count: usize) -> Option<Vec<Algorithm>> {
    let nearest = plain.iter().map(|p| p.0).min_by_key(|&c| c.abs_diff(count))?;
    if nearest.max(count) > NEAR * nearest.min(count) {
        return None;
    }
    let at = || plain.iter().filter(move |p| p.0 == nearest);
    let fastest = at().map(|p| p.2).fold(f64::INFINITY, f64::min);
    Some(at().filter(|p| p.2 <= fastest * (1.0 + UNFUSED_AFTER)).map(|p| p.1).collect())
}

/// How close (a fraction of the faster) the two fastest candidates at a size may lie before the tune times them again,
/// alternately: eager timings of several processes' launches swing by more than that from one timing to the next.
const NEAR_TIE: f64 = 0.05;

/// How many more timings each of a near tie's two candidates gets, alternated; each keeps the median of its own.
const RETIMES: usize = 2;

/// The positions in `ms` of the two fastest timed candidates, where the slower lies within [`NEAR_TIE`] of the faster.
fn near_tie(ms: &[Option<f64>]) -> Option<[usize; 2]> {
    let mut timed: Vec<(usize, f64)> = ms.iter().enumerate().filter_map(|(i, t)| Some((i, (*t)?))).collect();
    timed.sort_by(|a, b| a.1.total_cmp(&b.1));
    match timed[..] {
        [(a, fast), (b, slow), ..] if slow <= fast * (1.0 + NEAR_TIE) => Some([a, b]),
        _ => None,
    }
}

/// The bits every candidate at one size must give, each having passed its check on the same inputs (every algorithm
/// gives the same bits): those of the first that passed.
#[derive(Default)]
struct SameBits(Option<(Choice, [u64; 2])>);

impl SameBits {
    /// Refuses `choice`'s output (the fingerprints of its result and, on norm calls, of r) where it differs from the
    /// first candidate's: a broken invariant, which no table may paper over. Past the checks' bitwise verdicts
    /// every rank holds the same bits, so every rank fails alike.
    fn check(&mut self, choice: Choice, print: [u64; 2], count: usize) -> Result<(), Error> {
        match self.0 {
            None => {
                self.0 = Some((choice, print));
                Ok(())
            }
            Some((_, first)) if first == print => Ok(()),
            Some((first, _)) => Err(Error::Tune(format!(
                "at {count} elements {choice} and {first} both passed their checks on the same inputs but give \
                 different bits; every algorithm must give the same"
            ))),
        }
    }
}

/// The eps of the norm calls a tune measures (it does not change their cost).
const NORM_EPS: f32 = 1e-6;

impl TuneRequest {
    pub fn new(dtype: DType) -> TuneRequest {
        let timing = TimingOptions { iters: 20, warmup: 5, repeats: 3, graph: false };
        let residencies = Residency::ALL.to_vec();
        TuneRequest {
            dtype,
            counts: None,
            timing,
            norm_hidden: Some(NORM_HIDDEN),
            plain: true,
            residencies,
            max_duration: None,
        }
    }
}

/// One measurement of a tune: the slowest rank's milliseconds per call, the median of the rounds its size's candidates
/// were timed in, or None where the candidate failed its check (any rank, or bits that differ across ranks) and was
/// not timed.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub op: TableOp,
    pub mode: Mode,
    pub residency: Residency,
    pub count: usize,
    pub choice: Choice,
    pub ms: Option<f64>,
    /// Whether `ms` is the median of several timings: one of the two fastest at its size, within `NEAR_TIE` of each
    /// other at first, timed `RETIMES` times more, alternately with the other.
    pub retimed: bool,
}

/// What a tune produced: the tables (and the cache files rank 0 wrote them to) and every measurement.
#[derive(Clone, Debug, Default)]
pub struct TuneReport {
    pub tables: Vec<(TuneTable, PathBuf)>,
    pub measured: Vec<Measured>,
    /// The (mode, residency) pairs whose tables were not measured: [`TuneRequest::max_duration`] had passed.
    pub not_run: Vec<(Mode, Residency)>,
}

impl Communicator {
    /// [`Communicator::tune_with`] at comm_bench.py's sizes and the powers of two between, 3 repeats of 20 calls.
    pub fn tune(&mut self, dtype: DType) -> Result<TuneReport, Error> {
        self.tune_with(&TuneRequest::new(dtype), &mut |_| {})
    }

    /// Measures every candidate at the requested sizes through this communicator's call path, eagerly and in graph
    /// replays, on each requested residency (the caller's memory, the registered buffers, caller memory registered with
    /// every peer), checks each against the float64 reference first, and stores the fastest per size as this machine's
    /// tables in the cache directory, where later communicators find them; this one follows them from now on (unless
    /// its options named a table file). Each mode and residency's tables are stored as soon as they are measured, so
    /// a tune stopped part-way (a job's time limit, a signal, [`TuneRequest::max_duration`]) keeps those it finished.
    /// Collective. `progress` sees each measurement as it is made (a tune takes minutes).
    pub fn tune_with(&mut self, req: &TuneRequest, progress: &mut dyn FnMut(&Measured)) -> Result<TuneReport, Error> {
        let dir = self
            .tune_dir
            .clone()
            .ok_or_else(|| Error::Tune("no cache directory: set ALLREDUCE_TUNE_DIR, XDG_CACHE_HOME or HOME".into()))?;
        if self.recording_graph_capture() {
            return Err(Error::BadArgs("tune while a graph capture is being recorded".into()));
        }
        let dtype = req.dtype;
        let info = self.gpu.info().clone();
        let max = self.capacity / dtype.size();
        let counts = match &req.counts {
            Some(c) => c.clone(),
            None => measure::sizes::tune_sizes(10, 24, 20, info.size_align).into_iter().filter(|&n| n <= max).collect(),
        };
        if let Some(&n) = counts.iter().find(|&&n| n == 0 || n > max) {
            return Err(Error::BadArgs(format!("tune at {n} elements: sizes run from 1 to the capacity's {max}")));
        }
        let residencies: Vec<Residency> = Residency::ALL.into_iter().filter(|r| req.residencies.contains(r)).collect();
        if residencies.is_empty() {
            return Err(Error::BadArgs("a tune measures at least one residency: none was asked for".into()));
        }
        // Norm calls: 1, 4, 16, ... rows, each within the capacity and the largest plain count.
        let largest = counts.iter().max().copied().unwrap_or(0);
        let norm_counts: Vec<usize> = match req.norm_hidden {
            Some(0) => return Err(Error::BadArgs("norm_hidden must be at least 1".into())),
            Some(h) => (0..).map(|e| h << (2 * e)).take_while(|&n| n <= largest.min(max)).collect(),
            None => Vec::new(),
        };
        if !req.plain && norm_counts.is_empty() {
            return Err(Error::BadArgs(format!(
                "a tune of norm calls only measures rows of norm_hidden ({:?}) up to the largest count ({largest}): \
                 none fit",
                req.norm_hidden
            )));
        }
        let sizes: Vec<(TableOp, usize)> = counts
            .iter()
            .filter(|_| req.plain)
            .map(|&c| (TableOp::AllReduce, c))
            .chain(norm_counts.iter().map(|&c| (TableOp::AddRmsNorm, c)))
            .collect();
        let timer = Timer::new(&self.gpu)?;
        let own = [self.gpu.alloc(self.capacity, MemKind::Device)?, self.gpu.alloc(self.capacity, MemKind::Device)?];
        let shared = [
            self.gpu.alloc(self.capacity, MemKind::Ipc { uncached: false })?,
            self.gpu.alloc(self.capacity, MemKind::Ipc { uncached: false })?,
        ];
        let norm_bufs = match req.norm_hidden.filter(|_| !norm_counts.is_empty()) {
            Some(h) => Some((
                h,
                [self.gpu.alloc(self.capacity, MemKind::Device)?, self.gpu.alloc(h * dtype.size(), MemKind::Device)?],
            )),
            None => None,
        };
        // SAFETY: our own allocations, released below before they are freed.
        let ids =
            unsafe { [self.register(shared[0].ptr(), self.capacity)?, self.register(shared[1].ptr(), self.capacity)?] };
        let bufs = TuneBuffers { own: &own, shared: &shared, norm: norm_bufs.as_ref().map(|(h, b)| (*h, b)) };
        // Tables only for the calls measured.
        let ops: Vec<TableOp> = TableOp::ALL
            .into_iter()
            .filter(|&op| match op {
                TableOp::AllReduce => req.plain,
                TableOp::AddRmsNorm => !norm_counts.is_empty(),
            })
            .collect();
        let mut report = TuneReport::default();
        let result =
            self.measure_all(req, &residencies, &sizes, &timer, &bufs, progress, |comm, (mode, residency), block| {
                for &op in &ops {
                    let table = comm.keep_table(req, (op, mode, residency), block, &dir)?;
                    report.tables.push(table);
                }
                report.measured.extend_from_slice(block);
                Ok(())
            });
        timer.stream.sync()?;
        self.forget_stream(timer.stream.handle());
        for id in ids {
            // SAFETY: the timer's stream, the only one that used them, is idle.
            unsafe { self.release(id)? };
        }
        report.not_run = result?;
        self.rdv.barrier("tune tables stored")?;
        Ok(report)
    }

    /// The table of `op` in `mode` and `residency` from that block's measurements `block`: stored in `dir` (by rank
    /// 0) and followed from now on, unless the caller named the tables.
    fn keep_table(
        &mut self,
        req: &TuneRequest,
        (op, mode, residency): (TableOp, Mode, Residency),
        block: &[Measured],
        dir: &Path,
    ) -> Result<(TuneTable, PathBuf), Error> {
        let dtype = req.dtype;
        let times: Vec<(usize, Choice, f64)> = block
            .iter()
            .filter(|m| m.op == op)
            .filter_map(|m| Some((m.count * dtype.size(), m.choice, m.ms?)))
            .collect();
        let info = self.gpu.info();
        let key =
            TableKey::new(info.kind, &info.name, (self.world(), self.device_shared_by), mode, residency).for_op(op);
        let rows = req.norm_hidden.filter(|_| op == TableOp::AddRmsNorm);
        let at = rows.map_or(String::new(), |h| format!(", rows of {h}"));
        let on = format!("{key}, {dtype}{at}, through Communicator::tune");
        let table = TuneTable::from_times(&times, key.clone(), on)?;
        let path = dir.join(key.file_name());
        if self.rank() == 0 {
            table.store(&path)?;
        }
        // Followed from now on, unless the caller named the tables: every rank built it from the same measurements
        // (each the slowest rank's), as the set-up's agreement checks for cached ones.
        if !self.named_tables {
            let loaded = LoadedTable::new(table.clone(), TableSource::Cache(path.clone()))?;
            self.engine.tables_mut().set(op, mode, residency, loaded);
        }
        Ok((table, path))
    }

    /// Every (mode, residency, size, candidate) measurement of a tune, handed to `done` a (mode, residency) block at a
    /// time, as each is finished; a block not started because `req.max_duration` had passed is returned.
    #[allow(clippy::too_many_arguments)] // the tune's set-up, passed down once
    fn measure_all(
        &mut self,
        req: &TuneRequest,
        residencies: &[Residency],
        sizes: &[(TableOp, usize)],
        timer: &Timer,
        bufs: &TuneBuffers<'_>,
        progress: &mut dyn FnMut(&Measured),
        mut done: impl FnMut(&mut Communicator, (Mode, Residency), &[Measured]) -> Result<(), Error>,
    ) -> Result<Vec<(Mode, Residency)>, Error> {
        let dtype = req.dtype;
        let started = Instant::now();
        let mut not_run = Vec::new();
        for mode in Mode::ALL {
            let opts = TimingOptions { graph: mode == Mode::Graph, ..req.timing };
            for &residency in residencies {
                let first_block = (mode, residency) == (Mode::ALL[0], residencies[0]);
                if !not_run.is_empty() || !first_block && out_of_time(&self.rdv, req.max_duration, started)? {
                    not_run.push((mode, residency));
                    continue;
                }
                let mut out = Vec::new();
                let (input, output) = self.residency_buffers(residency, bufs.own, bufs.shared);
                let (i, o) = (input.ptr(), output.ptr());
                for &(op, count) in sizes {
                    let norm = match (op, bufs.norm) {
                        (TableOp::AddRmsNorm, Some((hidden, [residual, weight]))) => Some((
                            AddRmsNorm { residual: residual.ptr(), weight: weight.ptr(), hidden, eps: NORM_EPS },
                            residual,
                            weight,
                        )),
                        _ => None,
                    };
                    let plain = self.call(Op::AllReduce, dtype, i, o, count)?;
                    let call = match &norm {
                        Some((n, _, _)) => plain.with_add_rms_norm(*n)?,
                        None => plain,
                    };
                    // Norm calls: every design with the norm in its kernel, and the unfused sequence after the
                    // allreduces that can win it.
                    let after = match norm {
                        Some(_) => self.unfused_after(&out, (mode, residency), count, dtype),
                        None => Vec::new(),
                    };
                    let choices = Algorithm::CANDIDATES.map(Choice::of).into_iter().chain(after);
                    // Fresh inputs per size, the same for every candidate: the float64 reference is computed once
                    // (at the largest sizes it took longer than the timing), and every candidate that passes its
                    // check must give the bits of the first that did.
                    let seed = check::agree_seed(&self.rdv)?;
                    let x = dtype.encode(&check::input_values(seed, self.rank(), count, dtype));
                    let (sum, case) = match &norm {
                        Some((n, _, weight)) => {
                            let case = NormCase::new(seed, self.world(), count, n.hidden, dtype, n.eps);
                            timer.stream.upload(weight, 0, &dtype.encode(&case.weight))?;
                            (Vec::new(), Some(case))
                        }
                        None => (check::reference(seed, self.world(), count, dtype, 0, count), None),
                    };
                    let mut bits = SameBits::default();
                    let first = out.len();
                    let mut passed = Vec::new();
                    for choice in choices {
                        // A candidate that would run another's kernel on this call is that one, measured already.
                        if self.engine.runs_as(choice, &call) != choice {
                            continue;
                        }
                        let (input, output) = self.residency_buffers(residency, bufs.own, bufs.shared);
                        timer.stream.upload(input, 0, &x)?;
                        // The norm writes r back into the residual: each candidate starts from the case's.
                        if let (Some(case), Some((_, residual, _))) = (&case, &norm) {
                            timer.stream.upload(residual, 0, &dtype.encode(&case.residual))?;
                        }
                        // SAFETY: buffers of `capacity` bytes (ours, the registered ones, or our registrations; the
                        // norm's residual and weight ours); every rank runs the same sequence.
                        unsafe { self.issue_as(call, choice, timer.stream.handle())? };
                        let mut got = vec![0u8; count * dtype.size()];
                        timer.stream.download(output, 0, &mut got)?;
                        let mut r = Vec::new();
                        let failed = match (&case, &norm) {
                            (Some(case), Some((_, residual, _))) => {
                                r = vec![0u8; count * dtype.size()];
                                timer.stream.download(residual, 0, &mut r)?;
                                let tol = check::add_rms_norm_tolerance(dtype, self.world());
                                let rdv = &self.rdv;
                                let r_bad = check::agree_verdict(rdv, &r, dtype, &case.want_r, tol, true, "tune r")?;
                                let y_bad = check::agree_verdict(rdv, &got, dtype, &case.want_y, tol, true, "tune y")?;
                                // Past both verdicts every rank holds the same bits, so every rank judges alike.
                                r_bad.is_some() || y_bad.is_some() || case.twin_difference(dtype, &r, &got).is_some()
                            }
                            _ => {
                                let tol = check::tolerance(dtype, self.world(), false);
                                check::agree_verdict(&self.rdv, &got, dtype, &sum, tol, true, "tune")?.is_some()
                            }
                        };
                        let m = Measured { op, mode, residency, count, choice, ms: None, retimed: false };
                        if failed {
                            progress(&m);
                        } else {
                            bits.check(choice, [check::fingerprint(&got), check::fingerprint(&r)], count)?;
                            passed.push(out.len());
                        }
                        out.push(m);
                    }
                    // The checked candidates timed in rounds, one repeat each a round; every rank passed the same
                    // ones (the verdicts are agreed), so every rank times alike.
                    let one = TimingOptions { repeats: 1, ..opts };
                    // SAFETY: as above (the norm's residual takes each call's sum, as a model's does).
                    let rounds = in_rounds(passed.len(), opts.repeats as usize, |k| unsafe {
                        self.time_choice(call, out[passed[k]].choice, &one, timer)
                    })?;
                    for (&i, timings) in passed.iter().zip(&rounds) {
                        out[i].ms = Some(median(timings));
                        progress(&out[i]);
                    }
                    // Every rank holds the same times (each the slowest rank's), so every rank re-times alike.
                    if let Some(pair) = near_tie(&out[first..].iter().map(|m| m.ms).collect::<Vec<_>>()) {
                        let pair = pair.map(|i| first + i);
                        // SAFETY: as above.
                        let more = in_rounds(2, RETIMES, |k| unsafe {
                            self.time_choice(call, out[pair[k]].choice, &opts, timer)
                        })?;
                        for (&i, mut timings) in pair.iter().zip(more) {
                            let m = &mut out[i];
                            timings.push(m.ms.expect("near_tie picks timed ones"));
                            (m.ms, m.retimed) = (Some(median(&timings)), true);
                            progress(m);
                        }
                    }
                }
                done(self, (mode, residency), &out)?;
            }
        }
        Ok(not_run)
    }

    /// The slowest rank's median milliseconds per call of `choice` on `call`, in `opts`' mode.
    ///
    /// # Safety
    /// `call`'s buffers hold its elements (and a norm call's residual and weight theirs) whenever `timer`'s stream
    /// runs it, and every rank times the same call and choice at once.
    unsafe fn time_choice(
        &self,
        call: Call,
        choice: Choice,
        opts: &TimingOptions,
        timer: &Timer,
    ) -> Result<f64, Error> {
        let t = timer.time_calls(opts, &self.rdv, |s| {
            // SAFETY: the caller's contract.
            unsafe { self.issue_as(call, choice, s.handle()) }.map(|_| ())
        })?;
        Ok(t.median_ms())
    }

    /// The unfused sequences a tune measures on norm calls of `count` elements of `dtype` in `mode` and `residency`:
    /// after the allreduces [`near_fastest`] finds among the plain ones `measured`; where it finds none, after every
    /// allreduce, or, where this tune measured no plain calls (norm calls only), after the one this communicator's
    /// table picks. The same on every rank (the measurements are).
    fn unfused_after(
        &self,
        measured: &[Measured],
        (mode, residency): (Mode, Residency),
        count: usize,
        dtype: DType,
    ) -> Vec<Choice> {
        let here = |m: &&Measured| m.op == TableOp::AllReduce && m.mode == mode && m.residency == residency;
        let plain: Vec<_> =
            measured.iter().filter(here).filter_map(|m| Some((m.count, m.choice.algorithm, m.ms?))).collect();
        let after = near_fastest(&plain, count).unwrap_or_else(|| {
            if plain.is_empty() {
                vec![self.engine.table(mode, residency).pick(count * dtype.size()).algorithm]
            } else {
                Algorithm::CANDIDATES.to_vec()
            }
        });
        after.into_iter().map(Choice::unfused).collect()
    }

    /// The input and output a tune measures `residency` on.
    fn residency_buffers<'a>(
        &'a self,
        residency: Residency,
        own: &'a [DeviceBuffer; 2],
        shared: &'a [DeviceBuffer; 2],
    ) -> (&'a DeviceBuffer, &'a DeviceBuffer) {
        match residency {
            Residency::Caller => (&own[0], &own[1]),
            Residency::Registered => (self.registered_input(), self.registered_output()),
            Residency::CallerRegistered => (&shared[0], &shared[1]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_of_one_size_must_give_the_first_ones_bits() {
        let mut bits = SameBits::default();
        let [car, ll] = [Algorithm::Car1Shot, Algorithm::SymmLl].map(Choice::of);
        bits.check(car, [1, 2], 1024).unwrap();
        bits.check(ll, [1, 2], 1024).unwrap();
        let e = bits.check(Choice::unfused(Algorithm::SymmLl), [1, 3], 1024).unwrap_err().to_string();
        assert!(e.contains("at 1024 elements") && e.contains(&car.to_string()) && e.contains("different bits"), "{e}");
    }

    #[test]
    fn only_the_two_fastest_within_five_percent_are_timed_again() {
        assert_eq!(near_tie(&[Some(12.0), Some(10.4), None, Some(10.0)]), Some([3, 1]));
        assert_eq!(near_tie(&[Some(10.0), Some(10.0)]), Some([0, 1]));
        // 5.1% apart: the two fastest keep their first timings.
        assert_eq!(near_tie(&[Some(10.0), Some(10.51), Some(11.0)]), None);
        assert_eq!(near_tie(&[Some(10.0), None, None]), None);
        assert_eq!(near_tie(&[]), None);
    }

    #[test]
    fn the_unfused_sequence_follows_the_allreduces_near_the_fastest_at_the_nearest_count() {
        use Algorithm::*;
        let plain = [(1024, Car1Shot, 10.0), (1024, SymmLl, 5.0), (8192, Car1Shot, 20.0), (8192, SymmZc2Shot, 21.0)];
        let plain = [&plain[..], &[(8192, SymmLl, 30.0), (8192, Car2Shot, 22.5)]].concat();
        assert_eq!(near_fastest(&plain, 1000), Some(vec![SymmLl]));
        // 6000 is nearer 8192 than 1024; 22.5 is past 10% of 20, 21 within it.
        assert_eq!(near_fastest(&plain, 6000), Some(vec![Car1Shot, SymmZc2Shot]));
        assert_eq!(near_fastest(&plain, 16384), Some(vec![Car1Shot, SymmZc2Shot]));
        // Nothing measured within a factor 2: no judgement.
        assert_eq!((near_fastest(&plain, 16385), near_fastest(&plain, 511)), (None, None));
        assert_eq!(near_fastest(&[], 64), None);
    }
}
