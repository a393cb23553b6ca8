//! One rank's part of the sweep: open the driver, join the rendezvous, agree on the configuration, build the
//! methods, then per size and method: check, time (ranks aligned by a barrier before the start event, max over
//! ranks, median of repeats), check again after the timed calls, and report.

use crate::check::{compare, fingerprint, input_values, output_range, reference, tolerance, POISON};
use crate::cli::{BenchArgs, CarMemory};
use crate::report::{Outcome, Row, Status};
use crate::{methods, BenchError};
use collective::{Collective, DType, Op};
use gpu::{DeviceBuffer, Event, Gpu, MemKind, Stream};
use ipc::{Rendezvous, RendezvousOptions};
use launch::RankInfo;
use std::time::Duration;

/// Runs this rank's part; rank 0 returns the results.
pub fn run_rank(args: &BenchArgs, info: &RankInfo) -> Result<Option<Outcome>, BenchError> {
    let timeout = match args.timeout_s {
        Some(s) => Duration::from_secs_f64(s),
        None => deadline::timeout_from_env().map_err(BenchError::Config)?,
    };
    let opened = gpu::open(args.backend, &gpu::DriverOptions { device: None, shm_prefix: info.job.shm_name("g") })?;
    let gpu = opened.gpu;
    let rdv = Rendezvous::join(&info.job, info.rank, info.world, RendezvousOptions { timeout, ..Default::default() })?;
    let result = sweep(args, &gpu, &rdv, &opened.notes);
    if let Err(e) = &result {
        rdv.abort(&e.to_string());
    }
    result
}

/// The settings every rank must share, as `key=value` lines.
fn fingerprint_config(args: &BenchArgs, gpu: &Gpu, sizes: &[usize], methods: &[String]) -> String {
    format!(
        "driver={}\nop={}\ndtype={}\nsizes={sizes:?}\nmethods={}\nnum_iters={}\nnum_warmup_iters={}\nrepeats={}\ngraph={}\n",
        gpu.kind(),
        args.op,
        args.dtype,
        methods.join(","),
        args.num_iters,
        args.num_warmup_iters,
        args.repeats,
        args.graph
    )
}

fn agree(rdv: &Rendezvous, mine: &str) -> Result<(), BenchError> {
    let root = rdv.broadcast("configuration", 0, mine.as_bytes())?;
    let root = String::from_utf8_lossy(&root);
    if let Some((a, b)) = root.lines().zip(mine.lines()).find(|(a, b)| a != b) {
        return Err(BenchError::Config(format!(
            "rank {} disagrees with rank 0: it has {b}, rank 0 has {a}",
            rdv.rank()
        )));
    }
    Ok(())
}

/// A method, or why it could not be built on some rank.
type Built = Result<Box<dyn Collective>, String>;

/// A rank's benchmark buffers (input and output at full capacity), stream and timing events.
pub(crate) struct Buffers {
    pub(crate) input: DeviceBuffer,
    pub(crate) output: DeviceBuffer,
    pub(crate) stream: Stream,
    pub(crate) start: Event,
    pub(crate) end: Event,
}

fn sweep(args: &BenchArgs, gpu: &Gpu, rdv: &Rendezvous, notes: &[String]) -> Result<Option<Outcome>, BenchError> {
    let (rank, world) = (rdv.rank(), rdv.world());
    let sizes = args.sizes(gpu.info().size_align);
    let names = args.method_names();
    let tune = args.tune_table().map_err(BenchError::Config)?;
    let table = serde_json::to_string(&tune).map_err(|e| BenchError::Config(e.to_string()))?;
    let config = fingerprint_config(args, gpu, &sizes, &names);
    agree(rdv, &format!("{config}car_memory={:?}\ntune_table={table}\n", args.car_memory))?;
    let capacity = sizes.iter().max().copied().unwrap_or(1) * args.dtype.size();
    if rank == 0 {
        let i = gpu.info();
        println!(
            "# comm-bench: {} ranks, {} driver ({}, {}), {} {}, {} sizes",
            world,
            i.kind,
            i.name,
            i.arch,
            args.op,
            args.dtype,
            sizes.len()
        );
        notes.iter().for_each(|n| println!("# passed over {n}"));
    }

    let build =
        methods::BuildOptions { capacity_bytes: capacity, tune, car_uncached: args.car_memory == CarMemory::Uncached };
    let mut built: Vec<(String, Built)> = Vec::new();
    for name in &names {
        let m = methods::build(name, gpu, rdv, &build).map_err(|e| e.to_string());
        // Every rank learns whether every rank built it, so all skip it together.
        let ok = rdv.all_gather(&format!("{name} built"), &[m.is_ok() as u8])?;
        let m = match ok.iter().position(|v| v[..] != [1]) {
            None => m,
            Some(r) => Err(m.err().unwrap_or_else(|| format!("rank {r} could not build it"))),
        };
        built.push((name.clone(), m));
    }

    let bufs = Buffers {
        input: gpu.alloc(capacity, MemKind::Device)?,
        output: gpu.alloc(capacity, MemKind::Device)?,
        stream: gpu.stream()?,
        start: gpu.event()?,
        end: gpu.event()?,
    };
    let ceilings = crate::ceilings::measure(args, gpu, rdv, &bufs)?;
    if rank == 0 {
        ceilings.print();
        crate::report::print_header();
    }
    let mut rows = Vec::new();
    let progress = crate::progress::Progress::new(sizes.len() * built.len(), rank == 0);
    for &count in &sizes {
        for (name, method) in built.iter_mut() {
            let row = match method {
                Err(reason) => Row::new(name, args, count, world, Status::Skipped(reason.clone())),
                Ok(m) => measure(args, rdv, &bufs, name, m.as_mut(), count)?,
            };
            if rank == 0 {
                progress.suspend(|| row.print());
                progress.inc(format!("{name} {count}"));
            }
            rows.push(row);
        }
    }
    progress.finish();
    bufs.stream.sync()?;
    // Nobody unmaps a buffer while a peer's last call may still read it.
    rdv.barrier("teardown")?;
    drop(built);
    let i = gpu.info();
    Ok((rank == 0).then(|| Outcome::new(i, world, args, ceilings, rows)))
}

fn measure(
    args: &BenchArgs,
    rdv: &Rendezvous,
    b: &Buffers,
    name: &str,
    m: &mut dyn Collective,
    count: usize,
) -> Result<Row, BenchError> {
    let (op, dtype, world) = (args.op, args.dtype, rdv.world());
    // The name asked for (a launch shape included), not only the method's own.
    let row = |status| Row::new(name, args, count, world, status);
    if let Err(reason) = m.supports(op, dtype) {
        return Ok(row(Status::Skipped(reason)));
    }
    if op == Op::ReduceScatter && !count.is_multiple_of(world) {
        return Ok(row(Status::Skipped(format!("{count} elements do not split into {world} equal shards"))));
    }
    if args.graph && !m.capturable() {
        return Ok(row(Status::Skipped("cannot be captured into a graph".into())));
    }
    if count * dtype.size() > m.capacity_bytes() {
        return Ok(row(Status::Skipped(format!("above the method's largest message ({} bytes)", m.capacity_bytes()))));
    }
    let seed = u64::from_le_bytes(
        rdv.broadcast("check seed", 0, &rand::random::<u64>().to_le_bytes())?
            .try_into()
            .map_err(|_| BenchError::Config("bad seed".into()))?,
    );
    let values = input_values(seed, rdv.rank(), count, dtype);
    // A method with registered buffers reads its input and writes its output there (no copies, as with tensors
    // allocated in symmetric memory); the others take the benchmark's own buffers.
    let input = m.registered_input().map_or(b.input.ptr(), |r| r.ptr());
    let output = m.registered_output().map_or(b.output.ptr(), |r| r.ptr());
    b.stream.upload(m.registered_input().unwrap_or(&b.input), 0, &dtype.encode(&values))?;
    let (lo, hi) = output_range(op, count, world, rdv.rank());
    let out_bytes = (hi - lo) * dtype.size();
    b.stream.memset(output, POISON, out_bytes)?;
    m.run(op, dtype, input, output, count, &b.stream)?;
    let want = reference(seed, world, count, dtype, lo, hi);
    let tol = tolerance(dtype, world, m.rounds_every_add());
    let verify = |m: &dyn Collective, when| {
        let out = m.registered_output().unwrap_or(&b.output);
        verify(rdv, &b.stream, out, op, dtype, &want, tol, when)
    };
    if let Some(failure) = verify(m, "before timing")? {
        return Ok(row(Status::Failed(failure)));
    }

    let (repeats, rank0) = time_calls(args, rdv, b, |s| Ok(m.run(op, dtype, input, output, count, s)?))?;
    if let Some(failure) = verify(m, "after the timed calls")? {
        return Ok(row(Status::Failed(failure)));
    }
    Ok(row(Status::Passed).timed(repeats, rank0))
}

/// Times `enqueue` the way every method is timed: eagerly, or captured once into a graph of `num_iters` calls and
/// replayed; warm-up, then per repeat a barrier (ranks start together), `num_iters` calls between two events, and
/// the slowest rank's time per call. Returns every repeat's figure (ms) and rank 0's first.
pub(crate) fn time_calls(
    args: &BenchArgs,
    rdv: &Rendezvous,
    b: &Buffers,
    mut enqueue: impl FnMut(&Stream) -> Result<(), BenchError>,
) -> Result<(Vec<f64>, f64), BenchError> {
    let graph = if args.graph {
        b.stream.begin_capture()?;
        let captured = (0..args.num_iters).try_for_each(|_| enqueue(&b.stream));
        let graph = b.stream.end_capture()?;
        captured?;
        Some(graph)
    } else {
        None
    };
    let mut call = |n: u64| -> Result<(), BenchError> {
        match &graph {
            Some(g) => (0..n.div_ceil(args.num_iters)).try_for_each(|_| b.stream.replay(g))?,
            None => (0..n).try_for_each(|_| enqueue(&b.stream))?,
        }
        Ok(())
    };
    let mut repeats = Vec::new();
    let mut rank0 = f64::NAN;
    call(args.num_warmup_iters)?;
    for i in 0..args.repeats {
        b.stream.sync()?;
        rdv.barrier("align ranks before timing")?;
        b.stream.record(&b.start)?;
        call(args.num_iters)?;
        b.stream.record(&b.end)?;
        b.end.sync()?;
        let ms = b.start.elapsed_ms(&b.end)? as f64 / args.num_iters as f64;
        let all = rdv.all_gather("times", &ms.to_le_bytes())?;
        let times: Vec<f64> = all.iter().map(|t| f64::from_le_bytes(t[..8].try_into().expect("8 bytes"))).collect();
        if i == 0 {
            rank0 = times[0];
        }
        repeats.push(times.iter().copied().fold(0.0, f64::max));
    }
    Ok((repeats, rank0))
}

/// Downloads and checks this rank's output; every rank learns every rank's verdict, so all agree.
#[allow(clippy::too_many_arguments)]
fn verify(
    rdv: &Rendezvous,
    stream: &Stream,
    output: &DeviceBuffer,
    op: Op,
    dtype: DType,
    want: &[f64],
    tol: f64,
    when: &str,
) -> Result<Option<String>, BenchError> {
    let mut out = vec![0u8; want.len() * dtype.size()];
    stream.download(output, 0, &mut out)?;
    let v = compare(&dtype.decode(&out), want, tol);
    let mut blob = (v.wrong as u64).to_le_bytes().to_vec();
    blob.extend(fingerprint(&out).to_le_bytes());
    blob.extend(v.max_rel_err.to_le_bytes());
    blob.extend((v.first_wrong.map_or(u64::MAX, |i| i as u64)).to_le_bytes());
    let all = rdv.all_gather(&format!("check {when}"), &blob)?;
    let field = |r: &[u8], k: usize| u64::from_le_bytes(r[8 * k..8 * k + 8].try_into().expect("8 bytes"));
    for (r, blob) in all.iter().enumerate() {
        let wrong = field(blob, 0);
        if wrong > 0 {
            return Ok(Some(format!(
                "{when}: rank {r} has {wrong} wrong element(s), first at output index {}, max rel err {:.3e}",
                field(blob, 3),
                f64::from_bits(field(blob, 2))
            )));
        }
    }
    if op == Op::AllReduce {
        if let Some(r) = all.iter().position(|blob| field(blob, 1) != field(&all[0], 1)) {
            return Ok(Some(format!("{when}: rank {r}'s result differs bitwise from rank 0's")));
        }
    }
    Ok(None)
}
