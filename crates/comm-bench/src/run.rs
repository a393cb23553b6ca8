//! One rank's part of the sweep: a communicator (driver, rendezvous, placement, tune tables), agreement on the
//! configuration, the methods built from the registry (`auto`: the communicator's own public calls), then per size:
//! every method checked, then timed in rounds (ranks aligned by a barrier before the start event, max over ranks,
//! median of repeats, one repeat of each method a round), each checked again after its last round, and reported.

use crate::checksum::Checksum;
use crate::config::SweepConfig;
use crate::report::{Outcome, Row, RunNotes, Status, Unavailable};
use crate::BenchError;
use allreduce::{Communicator, DType, Op, Options, Residency};
use collective_core::{Call, Collective};
use gpu::{DeviceBuffer, DevicePtr, DriverKind, MemKind, Stream};
use ipc::Rendezvous;
use launch::RankInfo;
use measure::check::{agree_seed, agree_verdict, checksum, input_values, variant_input, Expected, POISON};
use measure::timing::{in_rounds, out_of_time, Timer, Timing, TimingOptions};
use std::time::{Duration, Instant};

/// Runs this rank's part; rank 0 returns the results.
pub fn run_rank(cfg: &SweepConfig, info: &RankInfo) -> Result<Option<Outcome>, BenchError> {
    let started = Instant::now();
    let comm = Communicator::new(info.clone(), options(cfg)?)?;
    let result = sweep(cfg, &comm, started);
    if let Err(e) = &result {
        comm.rendezvous().abort(&e.to_string());
    }
    result
}

/// The communicator a sweep (or a tune) runs on.
pub(crate) fn options(cfg: &SweepConfig) -> Result<Options, BenchError> {
    let timeout = match cfg.timeout {
        Some(t) => t,
        None => deadline::timeout_from_env().map_err(BenchError::Config)?,
    };
    Ok(Options {
        backend: cfg.backend,
        capacity_bytes: cfg.capacity_bytes(),
        timeout: Some(timeout),
        setup_timeout: cfg.setup_timeout,
        tune_dir: None,
        tune_table: cfg.tune_table.clone(),
        device_shared_by: cfg.device_shared_by,
    })
}

/// Input variants the calls after the first check rotate among: consecutive calls always see different data.
pub(crate) const VARIANTS: usize = 3;

/// A rank's benchmark buffers (input and input variants at full capacity, the output at the op's), its timer and
/// its device-side checksum.
struct Buffers {
    input: DeviceBuffer,
    output: DeviceBuffer,
    variants: Vec<DeviceBuffer>,
    checksum: Checksum,
    timer: Timer,
}

/// What every method's checks at one size share, made once per size rather than per method and way (the float64
/// reference of a large size costs more CPU than timing every method there): the input, fresh for each size and the
/// same for every method, and the expected outputs, each made when first asked for. It keeps little beyond that, as
/// the host driver's buffers are host memory too.
struct SizeChecks {
    op: Op,
    dtype: DType,
    world: usize,
    rank: usize,
    count: usize,
    seed: u64,
    input: Vec<u8>,
    /// The seeded input's expected output, for kernels that round once and for those that round every add.
    seeded: [Option<Expected>; 2],
    /// The checksum of each input variant's expected output.
    variant_sums: [Option<u64>; VARIANTS],
    /// The expected output of the variant last asked for (the timed calls end on the same one for most methods).
    last_variant: Option<(usize, Expected)>,
}

impl SizeChecks {
    /// Collective: every rank agrees on the size's seed.
    fn new(cfg: &SweepConfig, rdv: &Rendezvous, count: usize) -> Result<SizeChecks, BenchError> {
        let (dtype, rank) = (cfg.dtype, rdv.rank());
        let seed = agree_seed(rdv)?;
        Ok(SizeChecks {
            op: cfg.op,
            dtype,
            world: rdv.world(),
            rank,
            count,
            seed,
            input: dtype.encode(&input_values(seed, rank, count, dtype)),
            seeded: [None, None],
            variant_sums: [None; VARIANTS],
            last_variant: None,
        })
    }

    fn seeded(&mut self, rounds_every_add: bool) -> &Expected {
        let (op, seed, world, count, dtype, rank) = (self.op, self.seed, self.world, self.count, self.dtype, self.rank);
        self.seeded[usize::from(rounds_every_add)]
            .get_or_insert_with(|| Expected::seeded(op, seed, world, count, dtype, rank, rounds_every_add))
    }

    fn expected_variant(&self, k: usize) -> Expected {
        Expected::variant(self.op, self.world, self.count, self.rank, k as u64)
    }

    /// The checksum of variant `k`'s expected output.
    fn variant_sum(&mut self, k: usize) -> u64 {
        match self.variant_sums[k] {
            Some(sum) => sum,
            None => *self.variant_sums[k].insert(checksum(&self.expected_variant(k).values)),
        }
    }

    /// Variant `k`'s expected output.
    fn variant(&mut self, k: usize) -> &Expected {
        if self.last_variant.as_ref().is_none_or(|(last, _)| *last != k) {
            self.last_variant = Some((k, self.expected_variant(k)));
        }
        &self.last_variant.as_ref().expect("just set").1
    }
}

/// The sweep on `comm`; `started` is when set-up began, which `--max_seconds` counts from.
fn sweep(cfg: &SweepConfig, comm: &Communicator, started: Instant) -> Result<Option<Outcome>, BenchError> {
    let gpu = comm.gpu().clone();
    let (rank, world) = (comm.rank(), comm.world());
    let sizes = cfg.counts(gpu.info().size_align);
    let names = &cfg.methods;
    allreduce::agree(comm.rendezvous(), "configuration", &cfg.fingerprint(gpu.kind(), &sizes))?;
    let capacity = sizes.iter().max().copied().unwrap_or(1) * cfg.dtype.size();
    // Every communicator is up (the configuration was agreed), so free memory already holds every rank's engine.
    if let Some((free, total)) = gpu.memory()? {
        let ranks = comm.placement().ranks_per_device;
        let need = crate::memory::device_need(names, cfg.op, capacity, world, ranks);
        crate::memory::check_device(need, free, total, ranks).map_err(BenchError::Config)?;
    }

    let build = methods::BuildOptions { capacity_bytes: capacity, car_uncached: cfg.car_uncached };
    let mut built: Vec<(String, Box<dyn Collective + '_>)> = Vec::new();
    let mut unavailable = Vec::new();
    for name in names {
        let m = methods::build(name, comm, &build).map_err(|e| e.to_string());
        let m = m.and_then(|m| usable(m.as_ref(), cfg).map(|()| m));
        // Every rank learns whether every rank can run it, so all leave it out together.
        let ok = comm.rendezvous().all_gather(&format!("{name} built"), &[m.is_ok() as u8])?;
        match (ok.iter().position(|v| v[..] != [1]), m) {
            (None, Ok(m)) => built.push((name.clone(), m)),
            (_, Err(reason)) => unavailable.push(Unavailable { method: name.clone(), reason }),
            (Some(r), Ok(_)) => {
                unavailable.push(Unavailable { method: name.clone(), reason: format!("rank {r} could not build it") })
            }
        }
    }
    let provenance = crate::header::provenance(gpu.kind(), names);
    if rank == 0 {
        let counts = (sizes.first().copied().unwrap_or(0), sizes.last().copied().unwrap_or(0));
        crate::header::print(cfg, comm, &provenance, sizes.len(), counts, &unavailable);
    }
    if built.is_empty() {
        return Err(BenchError::Config("none of the methods asked for can run here (the header says why)".into()));
    }

    let bufs = Buffers {
        input: gpu.alloc(capacity, MemKind::Device)?,
        output: gpu.alloc(cfg.op.output_capacity(capacity, world), MemKind::Device)?,
        variants: (0..VARIANTS).map(|_| gpu.alloc(capacity, MemKind::Device)).collect::<Result<_, _>>()?,
        checksum: Checksum::new(&gpu)?,
        timer: Timer::new(&gpu)?,
    };
    let ceilings = crate::ceilings::measure(cfg, comm, &bufs.timer)?;
    if rank == 0 {
        let sharing = comm.placement().ranks_per_device;
        ceilings.print(gpu.kind(), sharing);
        crate::report::print_header();
    }
    let mut rows = Vec::new();
    let mut not_run = Vec::new();
    // `auto`'s caller-buffer bound needs the copy floor of every size (the summary's last block).
    let bound =
        built.iter().any(|(name, _)| methods::lookup(name).is_some_and(|m| m.kind == methods::Kind::Communicator));
    let mut copy_floor = Vec::new();
    let rows_a_size = built.iter().map(|(_, m)| buffer_kinds(m.as_ref()).len()).sum::<usize>();
    let progress = crate::progress::Progress::new(sizes.len() * rows_a_size, rank == 0);
    for (i, &count) in sizes.iter().enumerate() {
        if i > 0 && out_of_time(comm.rendezvous(), cfg.max_duration, started)? {
            not_run = sizes[i..].to_vec();
            break;
        }
        let here = measure_size(cfg, comm.rendezvous(), &bufs, count, &mut built, &progress)?;
        if rank == 0 {
            progress.suspend(|| here.iter().for_each(Row::print));
        }
        rows.extend(here);
        if bound {
            let buffers = (&bufs.input, &bufs.variants[0]);
            copy_floor.push(crate::ceilings::copy_floor(cfg, comm, &bufs.timer, buffers, count)?);
        }
    }
    progress.finish();
    bufs.timer.stream.sync()?;
    // Nobody unmaps a buffer while a peer's last call may still read it.
    comm.rendezvous().barrier("teardown")?;
    drop(built);
    let tune_table = [Residency::Caller, Residency::Registered]
        .map(|r| format!("{r}: {}", comm.table_source(cfg.mode(), r)))
        .join("; ");
    let notes = RunNotes { tune_table, ceilings, unavailable, provenance, not_run, copy_floor };
    Ok((rank == 0).then(|| Outcome::new(gpu.info(), world, cfg, notes, rows)))
}

/// Every method at one size, each with registered buffers on them (a caller that allocated its tensors there: the
/// `+reg` row) and on the benchmark's own buffers (what a caller with ordinary tensors gets: the plain row): all
/// checked first, then those that passed timed in rounds (each one repeat a round, in turn), so that a slow spell of
/// the device falls on every method alike and `auto`'s ratio to the fastest compares like with like; each checked
/// again after its last round. The rows in method order.
fn measure_size(
    cfg: &SweepConfig,
    rdv: &Rendezvous,
    b: &Buffers,
    count: usize,
    built: &mut [(String, Box<dyn Collective + '_>)],
    progress: &crate::progress::Progress,
) -> Result<Vec<Row>, BenchError> {
    let mut checks = SizeChecks::new(cfg, rdv, count)?;
    let mut ways = Vec::new();
    for (i, (name, m)) in built.iter_mut().enumerate() {
        for &registered in buffer_kinds(m.as_ref()) {
            let label = if registered { format!("{name}+reg") } else { name.to_string() };
            let way = check(cfg, rdv, b, &mut checks, i, label, m.as_mut(), registered)?;
            if let Way::Done(row) = &way {
                progress.inc(format!("{} {count}", row.method));
            }
            ways.push(way);
        }
    }
    let ready: Vec<usize> = (0..ways.len()).filter(|&k| matches!(ways[k], Way::Timing(_))).collect();
    let rounds = cfg.timing.repeats as usize;
    in_rounds(ready.len(), rounds, |k| {
        let Way::Timing(checked) = &mut ways[ready[k]] else { unreachable!("timed until its last round") };
        let m = built[checked.method].1.as_mut();
        if let Some(row) = time_round(cfg, rdv, b, &mut checks, checked, m, rounds)? {
            progress.inc(format!("{} {count}", row.method));
            ways[ready[k]] = Way::Done(row);
        }
        Ok::<_, BenchError>(())
    })?;
    let row = |w| match w {
        Way::Done(row) => row,
        Way::Timing(_) => unreachable!("every round ran"),
    };
    Ok(ways.into_iter().map(row).collect())
}

/// The buffers `m` is timed on, as `registered` flags: its registered ones first where it has them, then the
/// benchmark's own.
fn buffer_kinds(m: &dyn Collective) -> &'static [bool] {
    if m.registered_input().is_some() {
        &[true, false]
    } else {
        &[false]
    }
}

/// A method on one kind of buffer at one size: checked and between its rounds of timing, or done (skipped, failed, or
/// timed and checked again).
enum Way {
    Timing(Checked),
    Done(Row),
}

/// A method on one kind of buffer whose checks before timing passed.
struct Checked {
    /// Its index among the built methods.
    method: usize,
    /// Its row's name: the method's, with `+reg` on its registered buffers.
    label: String,
    registered: bool,
    input: DevicePtr,
    output: DevicePtr,
    /// One checked call per input variant, as a program that prepares its calls.
    calls: Vec<Call>,
    /// The variant a registered input holds through the timed calls: the last checked call's.
    kept: usize,
    /// Calls issued so far, which picks the next one's variant.
    issued: u64,
    timings: Vec<Timing>,
}

/// The variant of call number `c`.
fn variant(c: u64) -> usize {
    (c % VARIANTS as u64) as usize
}

/// Checks `m` on `registered` buffers or the benchmark's own: one call on fresh inputs against the float64 reference,
/// then a burst of consecutive checked calls. What is left to time, or the row of a method skipped or failed.
#[allow(clippy::too_many_arguments)]
fn check(
    cfg: &SweepConfig,
    rdv: &Rendezvous,
    b: &Buffers,
    checks: &mut SizeChecks,
    method: usize,
    label: String,
    m: &mut dyn Collective,
    registered: bool,
) -> Result<Way, BenchError> {
    let (op, dtype, world, count) = (cfg.op, cfg.dtype, rdv.world(), checks.count);
    // The name asked for (a launch shape included), not only the method's own.
    let row = |status| Way::Done(Row::new(&label, cfg, count, world, status));
    if op == Op::ReduceScatter && !count.is_multiple_of(world) {
        return Ok(row(Status::Skipped(format!("{count} elements do not split into {world} equal shards"))));
    }
    if count * dtype.size() > m.capacity_bytes() {
        return Ok(row(Status::Skipped(format!("above the method's largest message ({} bytes)", m.capacity_bytes()))));
    }
    // Registered: the input is written into the method's registered buffer and the output read from its registered
    // output (no copies, as with tensors allocated in symmetric memory); otherwise the benchmark's own buffers.
    let in_buf = |m: &dyn Collective| pick(m.registered_input(), &b.input, registered).ptr();
    let (input, output) = (in_buf(m), pick(m.registered_output(), &b.output, registered).ptr());
    let stream = &b.timer.stream;
    stream.upload(pick(m.registered_input(), &b.input, registered), 0, &checks.input)?;
    stream.fill(pick(m.registered_output(), &b.output, registered), POISON)?;
    let capacity = m.capacity_bytes();
    let call = |input| Call::new(op, dtype, input, output, count, world, capacity);
    // SAFETY: the benchmark's own buffers (or the method's registered ones), sized for the sweep's largest call.
    unsafe { m.run(&call(input)?, stream)? };
    let rank = rdv.rank();
    let want = checks.seeded(m.rounds_every_add());
    let verdict =
        verify_output(rdv, stream, pick(m.registered_output(), &b.output, registered), dtype, want, "before timing");
    if let Some(failure) = verdict? {
        return Ok(row(Status::Failed(failure)));
    }

    // Consecutive calls: inputs that change from call to call (small integers, so every sum is exact), every
    // call's output folded into a device-side checksum, eagerly or replayed as the timed calls are. A call that read
    // a peer's previous call, or a torn packet, folds a different sum.
    for (k, v) in b.variants.iter().enumerate() {
        stream.upload(v, 0, &variant_input(rank, count, k as u64, dtype))?;
    }
    let calls = cfg.timing.warmup.max(2 * VARIANTS as u64);
    let way = Checked {
        method,
        label,
        registered,
        input,
        output,
        // A registered input is one buffer: each checked call copies its variant in first (after the previous call's
        // kernel ended, which every design's protocol makes safe).
        calls: b.variants.iter().map(|v| call(if registered { input } else { v.ptr() })).collect::<Result<_, _>>()?,
        kept: variant(calls - 1),
        issued: calls,
        timings: Vec::new(),
    };
    b.checksum.reset(stream)?;
    let replays = run_checked(stream, cfg.timing.graph, rank, cfg.skew_us, &format!("{count} elements"), |s| {
        // SAFETY: the benchmark's own buffers or the method's registered ones, sized for the sweep's largest call.
        (0..calls).try_for_each(|c| unsafe { issue(cfg, b, &way, m, s, c, true, true) })
    })?;
    let per_variant: Vec<u64> = (0..VARIANTS).map(|k| checks.variant_sum(k)).collect();
    let want_total = (0..calls).map(|c| per_variant[variant(c)]).fold(0u64, u64::wrapping_add).wrapping_mul(replays);
    let got_total = b.checksum.total(stream)?;
    // A wait that ended without its peer leaves wrong outputs too: say so, with what it saw, before the checksums.
    let failure = match m.failure()? {
        Some((ranks, what)) if !ranks.is_empty() => format!("peer rank(s) {ranks:?} {what}"),
        Some((_, what)) => what,
        None => String::new(),
    };
    let failed = |way: &Checked, what| Way::Done(Row::new(&way.label, cfg, count, world, Status::Failed(what)));
    let failures = rdv.all_gather("checked calls' waits", failure.as_bytes())?;
    if let Some((r, f)) = failures.iter().enumerate().find(|(_, f)| !f.is_empty()) {
        let n = calls * replays;
        let f = String::from_utf8_lossy(f);
        return Ok(failed(&way, format!("{n} consecutive checked calls: rank {r}'s wait ended: {f}")));
    }
    let sums = rdv.all_gather("checked calls", &[u8::from(got_total == want_total)])?;
    if let Some(r) = sums.iter().position(|v| v[..] != [1]) {
        let n = calls * replays;
        return Ok(failed(
            &way,
            format!(
                "{n} consecutive checked calls: rank {r}'s device-side checksum of its outputs is wrong (a stale or \
                 torn read of a peer's data)"
            ),
        ));
    }
    Ok(Way::Timing(way))
}

/// Issues call number `c` of `way` on `s`, its variant copied into a registered input first where `copy_in`, its
/// output folded into the checksum where `fold`.
///
/// # Safety
/// `way`'s buffers are the benchmark's own or `m`'s registered ones, sized for the sweep's largest call, and `s` is
/// the benchmark's stream.
#[allow(clippy::too_many_arguments)]
unsafe fn issue(
    cfg: &SweepConfig,
    b: &Buffers,
    way: &Checked,
    m: &mut dyn Collective,
    s: &Stream,
    c: u64,
    copy_in: bool,
    fold: bool,
) -> Result<(), BenchError> {
    let count = way.calls[0].count();
    // SAFETY: the caller's contract.
    unsafe {
        if way.registered && copy_in {
            s.copy(way.input, b.variants[variant(c)].ptr(), count * cfg.dtype.size())?;
        }
        m.run(&way.calls[variant(c)], s)?;
        if fold {
            b.checksum.fold_at(s, way.output, cfg.op.output_count(count, way.calls[0].world()), cfg.dtype)?;
        }
    }
    Ok(())
}

/// One round of `way`'s timing: one repeat of the timed calls, rotating among the variants (a registered input holds
/// the last checked call's, put back first, since the methods timed since may have written it). After its last
/// round, its output is checked again: its row, timed or failed.
fn time_round(
    cfg: &SweepConfig,
    rdv: &Rendezvous,
    b: &Buffers,
    checks: &mut SizeChecks,
    way: &mut Checked,
    m: &mut dyn Collective,
    rounds: usize,
) -> Result<Option<Row>, BenchError> {
    let stream = &b.timer.stream;
    if way.registered {
        let bytes = checks.count * cfg.dtype.size();
        // SAFETY: the registered input and a variant, both of at least the sweep's largest call.
        unsafe { stream.copy(way.input, b.variants[way.kept].ptr(), bytes)? };
    }
    let once = TimingOptions { repeats: 1, ..cfg.timing };
    let mut c = way.issued;
    let t = b.timer.time_calls(&once, rdv, |s| {
        c += 1;
        // SAFETY: as the checked calls.
        unsafe { issue(cfg, b, way, m, s, c, false, false) }
    })?;
    way.issued = c;
    way.timings.push(t);
    if way.timings.len() < rounds {
        return Ok(None);
    }
    let last = if way.registered { way.kept } else { variant(way.issued) };
    let output = pick(m.registered_output(), &b.output, way.registered);
    let verdict = verify_output(rdv, stream, output, cfg.dtype, checks.variant(last), "after the timed calls")?;
    let row = |status| Row::new(&way.label, cfg, checks.count, rdv.world(), status);
    Ok(Some(match verdict {
        Some(failure) => row(Status::Failed(failure)),
        None => {
            let timing = Timing::joined(std::mem::take(&mut way.timings)).expect("one timing a round");
            let mut passed = row(Status::Passed).timed(timing, cfg.report);
            passed.ran = m.last_design();
            passed
        }
    }))
}

/// Past this, a rank's enqueueing of its consecutive checked calls is reported, while it lasts: far longer than
/// launches take, far shorter than the waits' deadline, so a peer that times out waiting for this rank's host shows it
/// before the run is stopped.
const SLOW_ENQUEUE: Duration = Duration::from_millis(50);

/// Runs consecutive checked calls (`calls` enqueues them) as the timed ones run: eagerly, or captured once and the
/// graph replayed twice; rank `rank` is held back `rank` x `skew_us` microseconds first (`--skew_us`), so that they
/// start with the ranks far apart and lower ranks' first calls wait long for higher ones. On a GPU, enqueueing that
/// takes longer than [`SLOW_ENQUEUE`] is reported, with `what` the calls are. Returns how many times the calls ran.
pub(crate) fn run_checked(
    stream: &Stream,
    graph: bool,
    rank: usize,
    skew_us: u64,
    what: &str,
    calls: impl FnOnce(&Stream) -> Result<(), BenchError>,
) -> Result<u64, BenchError> {
    let hold_back = || std::thread::sleep(Duration::from_micros(skew_us * rank as u64));
    // The host driver runs each kernel as it is enqueued: only a GPU's enqueueing is judged.
    let judged = stream.gpu().kind() != DriverKind::Host;
    let report = |line: String| eprintln!("rank {rank}, {what}: {line}");
    if !graph {
        hold_back();
        watch_enqueue(judged, SLOW_ENQUEUE, report, || calls(stream))?;
        return Ok(1);
    }
    stream.begin_capture()?;
    let captured = calls(stream);
    let graph = stream.end_capture()?;
    captured?;
    hold_back();
    watch_enqueue(judged, SLOW_ENQUEUE, report, || (0..2).try_for_each(|_| stream.replay(&graph)))?;
    Ok(2)
}

/// Runs `enqueue`; where `judged`, a watcher reports (through `report`) once it has lasted `slow`, and how long it
/// took in all once it ends: a host stuck in the enqueueing is named while its peers still wait for it.
fn watch_enqueue<T>(judged: bool, slow: Duration, report: impl Fn(String) + Sync, enqueue: impl FnOnce() -> T) -> T {
    if !judged {
        return enqueue();
    }
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let started = Instant::now();
    let report = &report;
    std::thread::scope(|s| {
        s.spawn(move || {
            if finished.recv_timeout(slow) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                report(format!("enqueueing the consecutive checked calls has taken {:?} so far", started.elapsed()));
                let _ = finished.recv();
                report(format!("enqueueing the consecutive checked calls took {:?}", started.elapsed()));
            }
        });
        let out = enqueue();
        drop(done);
        out
    })
}

/// Whether a method can run this sweep at all, whatever the size: its op, dtype and mode.
fn usable(m: &dyn Collective, cfg: &SweepConfig) -> Result<(), String> {
    m.supports(cfg.op, cfg.dtype)?;
    if cfg.timing.graph && !m.capturable() {
        return Err("cannot be captured into a graph".into());
    }
    Ok(())
}

/// The method's registered buffer when asked for and there is one, else the benchmark's own.
fn pick<'a>(registered: Option<&'a DeviceBuffer>, own: &'a DeviceBuffer, use_registered: bool) -> &'a DeviceBuffer {
    registered.filter(|_| use_registered).unwrap_or(own)
}

/// Downloads and checks this rank's output; every rank learns every rank's verdict, so all agree.
fn verify_output(
    rdv: &Rendezvous,
    stream: &Stream,
    output: &DeviceBuffer,
    dtype: DType,
    want: &Expected,
    when: &str,
) -> Result<Option<String>, BenchError> {
    let mut out = vec![0u8; want.values.len() * dtype.size()];
    stream.download(output, 0, &mut out)?;
    Ok(agree_verdict(rdv, &out, dtype, &want.values, want.tol, want.bitwise, when)?)
}

#[cfg(test)]
mod tests {
    use super::watch_enqueue;
    use std::sync::Mutex;
    use std::time::Duration;

    #[test]
    fn a_slow_enqueue_is_reported_while_it_lasts_and_a_quick_one_never() {
        let lines = Mutex::new(Vec::new());
        let report = |l: String| lines.lock().unwrap().push(l);
        let seen_during = watch_enqueue(true, Duration::from_millis(20), report, || {
            std::thread::sleep(Duration::from_millis(500));
            lines.lock().unwrap().len()
        });
        assert_eq!(seen_during, 1, "reported before the enqueueing ended");
        let lines = lines.into_inner().unwrap();
        assert!(lines[0].contains("has taken") && lines[1].contains("took"), "{lines:?}");
        let quiet = Mutex::new(Vec::new());
        let n = watch_enqueue(true, Duration::from_secs(5), |l: String| quiet.lock().unwrap().push(l), || 7);
        assert_eq!((n, quiet.into_inner().unwrap().len()), (7, 0));
        let unjudged = watch_enqueue(false, Duration::ZERO, |_: String| panic!("not judged"), || 3);
        assert_eq!(unjudged, 3);
    }
}
