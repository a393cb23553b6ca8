//! [`Communicator::tune`]: every candidate measured through the communicator's own call path, for every mode and
//! every residency a call can have, checked before it is timed, and the fastest per size stored as this machine's
//! tables.

use super::Communicator;
use crate::tune::{Algorithm, Mode, Residency, TableKey, TuneTable};
use crate::Error;
use collective_core::{DType, Op};
use gpu::{DeviceBuffer, MemKind};
use measure::check;
use measure::timing::{Timer, TimingOptions};
use std::path::PathBuf;

/// What [`Communicator::tune_with`] measures.
#[derive(Clone, Debug)]
pub struct TuneRequest {
    pub dtype: DType,
    /// Element counts, each within the capacity [default: comm_bench.py's sizes up to the capacity].
    pub counts: Option<Vec<usize>>,
    /// Calls per timing (`graph` is ignored: both modes are measured).
    pub timing: TimingOptions,
}

impl TuneRequest {
    pub fn new(dtype: DType) -> TuneRequest {
        TuneRequest { dtype, counts: None, timing: TimingOptions { iters: 20, warmup: 5, repeats: 3, graph: false } }
    }
}

/// One measurement of a tune: the slowest rank's median milliseconds per call, or None where the candidate failed
/// its check (any rank, or bits that differ across ranks) and was not timed.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub mode: Mode,
    pub residency: Residency,
    pub count: usize,
    pub algorithm: Algorithm,
    pub ms: Option<f64>,
}

/// What a tune produced: the tables (and the cache files rank 0 wrote them to) and every measurement.
#[derive(Clone, Debug)]
pub struct TuneReport {
    pub tables: Vec<(TuneTable, PathBuf)>,
    pub measured: Vec<Measured>,
}

impl Communicator {
    /// [`Communicator::tune_with`] at comm_bench.py's sizes up to the capacity, 3 repeats of 20 calls.
    pub fn tune(&mut self, dtype: DType) -> Result<TuneReport, Error> {
        self.tune_with(&TuneRequest::new(dtype), &mut |_| {})
    }

    /// Measures every candidate at the requested sizes through this communicator's call path, eagerly and in graph
    /// replays, on each residency (the caller's memory, the registered buffers, caller memory registered with every
    /// peer), checks each against the float64 reference first, and stores the fastest per size as this machine's
    /// tables in the cache directory, where later communicators find them. Collective. `progress` sees each
    /// measurement as it is made (a tune takes minutes).
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
            None => measure::sizes::comm_bench_sizes(10, 24, 20, info.size_align),
        };
        if let Some(&n) = counts.iter().find(|&&n| n == 0 || n > max) {
            return Err(Error::BadArgs(format!("tune at {n} elements: sizes run from 1 to the capacity's {max}")));
        }
        let timer = Timer::new(&self.gpu)?;
        let own = [self.gpu.alloc(self.capacity, MemKind::Device)?, self.gpu.alloc(self.capacity, MemKind::Device)?];
        let shared = [
            self.gpu.alloc(self.capacity, MemKind::Ipc { uncached: false })?,
            self.gpu.alloc(self.capacity, MemKind::Ipc { uncached: false })?,
        ];
        // SAFETY: our own allocations, released below before they are freed.
        let ids =
            unsafe { [self.register(shared[0].ptr(), self.capacity)?, self.register(shared[1].ptr(), self.capacity)?] };
        let result = self.measure_all(req, &counts, &timer, &own, &shared, progress);
        timer.stream.sync()?;
        self.forget_stream(timer.stream.handle());
        for id in ids {
            // SAFETY: the timer's stream, the only one that used them, is idle.
            unsafe { self.release(id)? };
        }
        let measured = result?;
        let mut tables = Vec::new();
        for mode in Mode::ALL {
            for residency in Residency::ALL {
                let times: Vec<(usize, Algorithm, f64)> = measured
                    .iter()
                    .filter(|m| m.mode == mode && m.residency == residency)
                    .filter_map(|m| Some((m.count * dtype.size(), m.algorithm, m.ms?)))
                    .collect();
                let key = TableKey::new(info.kind, &info.name, (self.world(), self.device_shared_by), mode, residency);
                let on = format!("{key}, {dtype}, through Communicator::tune");
                let table = TuneTable::from_times(&times, key.clone(), on)?;
                let path = dir.join(key.file_name());
                if self.rank() == 0 {
                    table.store(&path)?;
                }
                tables.push((table, path));
            }
        }
        self.rdv.barrier("tune tables stored")?;
        Ok(TuneReport { tables, measured })
    }

    /// Every (mode, residency, size, candidate) measurement of a tune.
    fn measure_all(
        &mut self,
        req: &TuneRequest,
        counts: &[usize],
        timer: &Timer,
        own: &[DeviceBuffer; 2],
        shared: &[DeviceBuffer; 2],
        progress: &mut dyn FnMut(&Measured),
    ) -> Result<Vec<Measured>, Error> {
        let dtype = req.dtype;
        let mut out = Vec::new();
        for mode in Mode::ALL {
            let opts = TimingOptions { graph: mode == Mode::Graph, ..req.timing };
            for residency in Residency::ALL {
                let (i, o) = {
                    let (input, output) = self.residency_buffers(residency, own, shared);
                    (input.ptr(), output.ptr())
                };
                for &count in counts {
                    let call = self.call(Op::AllReduce, dtype, i, o, count)?;
                    for algorithm in Algorithm::CANDIDATES {
                        // A candidate that would run another's kernel at this size is that one, measured already.
                        if self.engine.runs_as(algorithm, &call) != algorithm {
                            continue;
                        }
                        let seed = check::agree_seed(&self.rdv)?;
                        let values = check::input_values(seed, self.rank(), count, dtype);
                        timer.stream.upload(
                            self.residency_buffers(residency, own, shared).0,
                            0,
                            &dtype.encode(&values),
                        )?;
                        let algo = Some(algorithm);
                        // SAFETY: buffers of `capacity` bytes (ours, the registered ones, or our registrations);
                        // every rank runs the same sequence.
                        unsafe { self.issue(call, algo, timer.stream.handle())? };
                        let mut got = vec![0u8; count * dtype.size()];
                        timer.stream.download(self.residency_buffers(residency, own, shared).1, 0, &mut got)?;
                        let want = check::reference(seed, self.world(), count, dtype, 0, count);
                        let tol = check::tolerance(dtype, self.world(), false);
                        let failed = check::agree_verdict(&self.rdv, &got, dtype, &want, tol, true, "tune")?.is_some();
                        let ms = if failed {
                            None
                        } else {
                            let t = timer.time_calls(&opts, &self.rdv, |s| {
                                // SAFETY: as above.
                                unsafe { self.issue(call, algo, s.handle()) }.map(|_| ())
                            })?;
                            Some(t.median_ms())
                        };
                        let m = Measured { mode, residency, count, algorithm, ms };
                        progress(&m);
                        out.push(m);
                    }
                }
            }
        }
        Ok(out)
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
