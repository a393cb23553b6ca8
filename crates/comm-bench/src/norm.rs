//! `comm-bench norm`: the allreduce followed by the residual add and RMSNorm (`Communicator::all_reduce_add_rms_norm`),
//! fused designs against the unfused sequence (our allreduce, then the norm kernel) in one run, per token count at
//! one hidden size. Every method is checked first, like every op of the sweep: fresh inputs, a poisoned output, r
//! and y against the float64 reference, the same bits on every rank and from every method; then consecutive calls
//! on changing inputs and residuals, each call's r folded into the device-side checksum (eagerly or replayed, as
//! timed); then timed on the one timing path (`measure::timing`), in rounds.

use crate::checksum::Checksum;
use crate::run::{run_checked, VARIANTS};
use crate::summary::{auto_chose_wrong, AUTO_SLOW_RATIO};
use crate::BenchError;
use allreduce::{AddRmsNorm, Algorithm, Call, Choice, Communicator, DType, Op, Options};
use clap::Args;
use gpu::MemKind;
use launch::RankInfo;
use measure::check::{
    add_rms_norm_tolerance, agree_verdict, checksum, fingerprint, input_values, variant_input, variant_sum,
    variant_value, NormCase,
};
use measure::timing::{in_rounds, median, out_of_time, Timer, TimingOptions};
use std::time::{Duration, Instant};

#[derive(Args, Debug, Clone)]
pub struct NormArgs {
    /// Elements of a row (the model's hidden size).
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..=allreduce::MAX_HIDDEN as u64))]
    pub hidden: u64,
    /// Token counts (rows), comma-separated: the size sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128,512", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub tokens: Vec<u64>,
    #[arg(short = 'd', long, default_value = "bf16", value_parser = |s: &str| s.parse::<DType>())]
    pub dtype: DType,
    /// Comma-separated: fused_1shot, fused_2shot (car's designs with the norm in their kernel), fused_ll (symm_ll's
    /// packets with the norm in their kernel; car's fused one-shot where the rows do not fit the packets),
    /// fused_zc_1shot, fused_zc_2shot (the zero-copy designs with the norm in their kernel, the caller's input copied
    /// in first), fused_zc_2shot_push (the two-shot with its rows pushed into their owners' staging), fused_zc_2shot_ll
    /// (the two-shot whose r travels as packets, where the largest share's rows fit them), fused_epoch_1shot
    /// (car's one-shot protocol on symmetric memory with the norm in its kernel), unfused (auto's allreduce, then the
    /// norm kernel), unfused:ALGO (the allreduce ALGO, then the norm kernel), auto (the communicator's choice).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fused_1shot,fused_2shot,fused_ll,fused_zc_1shot,fused_zc_2shot,fused_zc_2shot_push,\
                         fused_zc_2shot_ll,fused_epoch_1shot,unfused,auto"
    )]
    pub methods: Vec<String>,
    #[arg(long, default_value_t = 1e-5)]
    pub eps: f32,
    /// Capture the timed calls into a graph once and time its replays.
    #[arg(long)]
    pub graph: bool,
    #[arg(short = 'n', long = "num_iters", alias = "num-iters", default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub num_iters: u64,
    #[arg(short = 'w', long = "num_warmup_iters", alias = "num-warmup-iters", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub num_warmup_iters: u64,
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub repeats: u64,
    /// Times each method's consecutive-call check runs: a fault that shows once in many calls needs many.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub bursts: u64,
    /// Before each burst rank r waits r times this many microseconds, so that every burst's first calls find the ranks
    /// far apart (waits long enough to read their deadline's clock, peers whole calls ahead), not only the first
    /// burst after the single-call checks.
    #[arg(long = "skew_us", alias = "skew-us", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub skew_us: u64,
    #[arg(long = "num_ranks", alias = "num-ranks", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub num_ranks: Option<u64>,
    #[arg(long, default_value = "auto", value_parser = |s: &str| s.parse::<gpu::Backend>().map_err(|e| e.to_string()))]
    pub backend: gpu::Backend,
    #[arg(long = "timeout_s", alias = "timeout-s", allow_negative_numbers = true, value_parser = crate::config::parse_timeout)]
    pub timeout_s: Option<f64>,
    /// Seconds after which no further token count starts (counted from set-up, by rank 0's clock; the first always
    /// runs): a run under a wall-clock limit ends with the rows it measured, and says which token counts it left out.
    #[arg(long = "max_seconds", alias = "max-seconds", allow_negative_numbers = true, value_parser = crate::config::parse_timeout)]
    pub max_seconds: Option<f64>,
    /// Also write the timings to DIR/norm_benchmark.json (the rows as comm_ops_benchmark.json's: method, count,
    /// time_ms, status), for scripts/ab_table.py and the like.
    #[arg(long = "output_dir", alias = "output-dir")]
    pub output_dir: Option<std::path::PathBuf>,
}

/// `norm_benchmark.json`: the run and one row per method and token count.
#[derive(serde::Serialize)]
struct NormReport {
    world: usize,
    dtype: String,
    hidden: usize,
    graph: bool,
    rows: Vec<NormRow>,
    /// Token counts `--max_seconds` left out.
    not_run: Vec<u64>,
}

#[derive(serde::Serialize)]
struct NormRow {
    method: String,
    /// What ran: the design, and whether the norm kernel followed it.
    ran: String,
    tokens: u64,
    count: usize,
    time_ms: f64,
    /// Always "passed": a method that fails its checks ends the run.
    status: &'static str,
}

/// How a method issues the call.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Way {
    Fused(Algorithm),
    /// The allreduce, then the norm kernel: the allreduce the tables pick, or the one named (`unfused:ALGO`).
    Unfused(Option<Algorithm>),
    Auto,
}

fn way(name: &str) -> Result<Way, BenchError> {
    Ok(match name {
        "fused_1shot" => Way::Fused(Algorithm::Car1Shot),
        "fused_2shot" => Way::Fused(Algorithm::Car2Shot),
        "fused_ll" => Way::Fused(Algorithm::SymmLl),
        "fused_zc_1shot" => Way::Fused(Algorithm::SymmZc1Shot),
        "fused_zc_2shot" => Way::Fused(Algorithm::SymmZc2Shot),
        "fused_zc_2shot_push" => Way::Fused(Algorithm::SymmZc2ShotPush),
        "fused_zc_2shot_ll" => Way::Fused(Algorithm::SymmZc2ShotLl),
        "fused_epoch_1shot" => Way::Fused(Algorithm::SymmEpoch1Shot),
        "unfused" => Way::Unfused(None),
        "auto" => Way::Auto,
        _ => match name.strip_prefix(Choice::UNFUSED).map(Algorithm::from_name) {
            Some(Some(a)) if Algorithm::CANDIDATES.contains(&a) => Way::Unfused(Some(a)),
            _ => {
                return Err(BenchError::Config(format!(
                    "unknown norm method {name:?}; known: fused_1shot, fused_2shot, fused_ll, fused_zc_1shot, \
                     fused_zc_2shot, fused_zc_2shot_push, fused_zc_2shot_ll, fused_epoch_1shot, unfused, auto, and \
                     unfused:ALGO with ALGO an allreduce ({})",
                    Algorithm::CANDIDATES.map(Algorithm::name).join(", ")
                )))
            }
        },
    })
}

impl NormArgs {
    pub fn validate(&self) -> Result<(), BenchError> {
        self.methods.iter().try_for_each(|m| way(m).map(|_| ()))
    }
}

/// One rank's sweep; rank 0 prints the table.
pub fn run_rank(args: &NormArgs, info: &RankInfo) -> Result<(), BenchError> {
    let started = Instant::now();
    let timeout = match args.timeout_s {
        Some(s) => Duration::from_secs_f64(s),
        None => deadline::timeout_from_env().map_err(BenchError::Config)?,
    };
    let hidden = args.hidden as usize;
    let most = args.tokens.iter().max().copied().unwrap_or(1) as usize;
    let capacity = (most * hidden * args.dtype.size()).next_multiple_of(4096);
    let opts =
        Options { backend: args.backend, capacity_bytes: capacity, timeout: Some(timeout), ..Options::default() };
    let comm = Communicator::new(info.clone(), opts)?;
    let result = sweep(args, &comm, capacity, started);
    if let Err(e) = &result {
        comm.rendezvous().abort(&e.to_string());
    }
    result
}

/// The token counts' sweep on `comm`; `started` is when set-up began, which `--max_seconds` counts from.
fn sweep(args: &NormArgs, comm: &Communicator, capacity: usize, started: Instant) -> Result<(), BenchError> {
    let (gpu, rdv) = (comm.gpu(), comm.rendezvous());
    let (rank, world, dtype, hidden) = (comm.rank(), comm.world(), args.dtype, args.hidden as usize);
    let ways: Vec<Way> = args.methods.iter().map(|m| way(m)).collect::<Result<_, _>>()?;
    let [input, output, residual, weight] = [0; 4].map(|_| gpu.alloc(capacity, MemKind::Device));
    let (input, output, residual, weight) = (input?, output?, residual?, weight?);
    let alloc = || gpu.alloc(capacity, MemKind::Device);
    let variants: Vec<_> = (0..2 * VARIANTS).map(|_| alloc()).collect::<Result<_, _>>()?;
    let (variant_inputs, variant_residuals) = variants.split_at(VARIANTS);
    // One checksum per call of the consecutive calls, so a wrong one names its call.
    let sums: Vec<Checksum> = (0..2 * VARIANTS).map(|_| Checksum::new(gpu)).collect::<Result<_, _>>()?;
    // Each consecutive call's r, kept so that a wrong one can be shown element by element.
    let kept: Vec<_> = (0..2 * VARIANTS).map(|_| alloc()).collect::<Result<_, _>>()?;
    let timer = Timer::new(gpu)?;
    let stream = &timer.stream;
    let timing = TimingOptions {
        iters: args.num_iters,
        warmup: args.num_warmup_iters,
        repeats: args.repeats,
        graph: args.graph,
    };
    if rank == 0 {
        let mode = if args.graph { "graph replays" } else { "eager" };
        println!("# allreduce + residual add + RMSNorm: {world} ranks, {} driver, {dtype}, hidden {hidden}, {mode}; us per call (slowest rank, median of {}), each method checked first", gpu.kind(), args.repeats);
        println!("{:>8} {:>10} {:<46} {:>10} {:>12}", "tokens", "bytes", "method", "us", "vs unfused");
    }
    // Token counts where auto was timed against another method, and those where it chose wrong: more than
    // AUTO_SLOW_RATIO slower than the fastest of them while running another design.
    let (mut judged, mut slow) = (0, 0);
    let mut report = NormReport {
        world,
        dtype: dtype.to_string(),
        hidden,
        graph: args.graph,
        rows: Vec::new(),
        not_run: Vec::new(),
    };
    let budget = args.max_seconds.map(Duration::from_secs_f64);
    for (i, &tokens) in args.tokens.iter().enumerate() {
        if i > 0 && out_of_time(rdv, budget, started)? {
            report.not_run = args.tokens[i..].to_vec();
            break;
        }
        let count = tokens as usize * hidden;
        let norm = AddRmsNorm { residual: residual.ptr(), weight: weight.ptr(), hidden, eps: args.eps };
        let on = |x: gpu::DevicePtr| -> Result<Call, BenchError> {
            Ok(comm.call(Op::AllReduce, dtype, x, output.ptr(), count)?.with_add_rms_norm(norm)?)
        };
        let call = on(input.ptr())?;
        // What ran: the algorithm, and whether the norm ran after it.
        let issue_on = |w: Way, call: Call, s: &gpu::Stream| -> Result<Choice, BenchError> {
            // SAFETY: our own buffers of `capacity` bytes, live for the sweep; every rank issues the same calls.
            Ok(unsafe {
                match w {
                    Way::Fused(a) => comm.issue_as(call, Choice::of(a), s.handle())?,
                    Way::Unfused(a) => Choice::unfused(comm.issue_unfused(call, a, s.handle())?),
                    Way::Auto => {
                        comm.issue(call, None, s.handle())?;
                        comm.last_choice().expect("a call ran")
                    }
                }
            })
        };
        let issue = |w: Way, s: &gpu::Stream| issue_on(w, call, s);
        // Checks: fresh inputs for every method, the same for all of them, so the bits must agree.
        let seed = measure::check::agree_seed(rdv)?;
        let x = dtype.encode(&input_values(seed, rank, count, dtype));
        let case = NormCase::new(seed, world, count, hidden, dtype, args.eps);
        let (res, want_r, want_y) = (&case.residual, &case.want_r, &case.want_y);
        stream.upload(&weight, 0, &dtype.encode(&case.weight))?;
        let tol = add_rms_norm_tolerance(dtype, world);
        let mut prints = Vec::new();
        let mut ran = Vec::new();
        for (name, &wy) in args.methods.iter().zip(&ways) {
            stream.upload(&input, 0, &x)?;
            stream.upload(&residual, 0, &dtype.encode(res))?;
            stream.fill(&output, measure::check::POISON)?;
            ran.push(issue(wy, stream)?);
            stream.sync()?;
            let (mut y, mut r) = (vec![0u8; count * dtype.size()], vec![0u8; count * dtype.size()]);
            stream.download(&output, 0, &mut y)?;
            stream.download(&residual, 0, &mut r)?;
            for (part, got, want) in [("r", &r, want_r), ("y", &y, want_y)] {
                let when = format!("{name} {tokens}x{hidden}: {part}");
                if let Some(failed) = agree_verdict(rdv, got, dtype, want, tol, true, &when)? {
                    return Err(BenchError::Config(failed));
                }
            }
            // Every rank holds the same bits now, so every rank judges them alike: the host twin's canonical order.
            if let Some(differs) = case.twin_difference(dtype, &r, &y) {
                return Err(BenchError::Config(format!("{name} {tokens}x{hidden}: {differs}")));
            }
            prints.push((name, fingerprint(&r), fingerprint(&y)));
        }
        if let Some(p) = prints.iter().find(|p| (p.1, p.2) != (prints[0].1, prints[0].2)) {
            return Err(BenchError::Config(format!("{tokens}x{hidden}: {} and {} differ bitwise", p.0, prints[0].0)));
        }
        // Consecutive calls: variant k's inputs and residual (small integers, the residual the same on every rank,
        // so r = residual + sum is exact), the residual reset from its variant before each call, r folded after it.
        let bytes = count * dtype.size();
        for k in 0..VARIANTS {
            stream.upload(&variant_inputs[k], 0, &variant_input(rank, count, k as u64, dtype))?;
            let res: Vec<f32> = (0..count).map(|i| variant_value(world, i, k as u64)).collect();
            stream.upload(&variant_residuals[k], 0, &dtype.encode(&res))?;
        }
        let calls: Vec<Call> = variant_inputs.iter().map(|v| on(v.ptr())).collect::<Result<_, _>>()?;
        // r of variant k: the residual is the inputs of a rank past the last.
        let per_variant: Vec<u64> =
            (0..VARIANTS as u64).map(|k| checksum(&variant_sum(world + 1, 0, count, k))).collect();
        for (name, &wy) in args.methods.iter().zip(&ways) {
            let burst = |s: &gpu::Stream| -> Result<(), BenchError> {
                for (c, sum) in sums.iter().enumerate() {
                    let k = c % VARIANTS;
                    // SAFETY: our own buffers of `capacity` bytes, each holding `count` elements.
                    unsafe { s.copy(residual.ptr(), variant_residuals[k].ptr(), bytes)? };
                    issue_on(wy, calls[k], s)?;
                    sum.fold(s, &residual, count, dtype)?;
                    // SAFETY: as the copy above.
                    unsafe { s.copy(kept[c].ptr(), residual.ptr(), bytes)? };
                }
                Ok(())
            };
            // Every burst runs, so a fault that persists (every later burst wrong) tells itself from a one-off.
            let mut failed = Vec::new();
            for round in 1..=args.bursts {
                sums.iter().try_for_each(|sum| sum.reset(stream))?;
                let replays = run_checked(stream, args.graph, rank, args.skew_us, &format!("burst {round}"), burst)?;
                // A bit per call whose checksum of r is wrong here, and what is wrong in the first such call's r.
                let mut wrong = 0u64;
                let mut shown = String::new();
                for (c, sum) in sums.iter().enumerate() {
                    if sum.total(stream)? == per_variant[c % VARIANTS].wrapping_mul(replays) {
                        continue;
                    }
                    wrong |= 1 << c;
                    if shown.is_empty() {
                        let mut r = vec![0u8; bytes];
                        stream.download(&kept[c], 0, &mut r)?;
                        shown =
                            describe_wrong_r(&dtype.decode(&r), world, (c % VARIANTS) as u64, 4 / dtype.size(), hidden);
                        eprintln!("rank {rank}, burst {round}, call {c}: {shown}");
                    }
                }
                // A wait that ended without its peer leaves its output unwritten and says why in the status words:
                // read them now, or a wrong r would be reported without its cause.
                comm.check().map_err(|e| {
                    BenchError::Config(format!("{name} {tokens}x{hidden}, burst {round}, rank {rank}: {e}"))
                })?;
                let verdicts = rdv.all_gather("norm burst", &wrong.to_le_bytes())?;
                let wrong: Vec<String> = verdicts
                    .iter()
                    .enumerate()
                    .filter_map(|(r, v)| {
                        let bits = u64::from_le_bytes(v[..8].try_into().expect("8 bytes"));
                        let calls: Vec<usize> = (0..2 * VARIANTS).filter(|c| bits >> c & 1 == 1).collect();
                        (bits != 0).then(|| format!("rank {r} at calls {calls:?}"))
                    })
                    .collect();
                if !wrong.is_empty() {
                    failed.push(format!("burst {round}: {}", wrong.join(", ")));
                }
            }
            if !failed.is_empty() {
                let listed = failed.len().min(8);
                return Err(BenchError::Config(format!(
                    "{name} {tokens}x{hidden}: {} consecutive calls{}: the checksum of r is wrong in {} of {} bursts \
                     (a stale or torn read, or a row normalised before its sums were in): {}{}",
                    2 * VARIANTS,
                    if args.graph { ", replayed 2 times" } else { "" },
                    failed.len(),
                    args.bursts,
                    failed[..listed].join("; "),
                    if listed < failed.len() { "; ..." } else { "" }
                )));
            }
        }
        // In rounds, each way one repeat a round, so that a slow spell of the device falls on fused and unfused alike.
        let once = TimingOptions { repeats: 1, ..timing };
        let rounds = in_rounds(ways.len(), timing.repeats as usize, |k| {
            Ok::<_, BenchError>(timer.time_calls(&once, rdv, |s| issue(ways[k], s).map(|_| ()))?.median_ms())
        })?;
        let times: Vec<f64> = rounds.iter().map(|r| median(r) * 1e3).collect();
        let unfused = ways.iter().position(|&w| w == Way::Unfused(None)).map(|k| times[k]);
        if rank == 0 {
            for ((name, us), algo) in args.methods.iter().zip(&times).zip(&ran) {
                let vs = unfused.map_or(String::new(), |u| format!("{:.2}x", u / us));
                // What ran, where the name does not say it (a fused design whose rows exceed it stands in, or that
                // does not carry the norm; auto's choice).
                let label = match way(name)? {
                    Way::Fused(a) if Choice::of(a) == *algo => name.clone(),
                    Way::Unfused(Some(a)) if Choice::unfused(a) == *algo => name.clone(),
                    Way::Unfused(None) => format!("{name} ({})", algo.algorithm),
                    _ => format!("{name} ({algo})"),
                };
                println!("{tokens:>8} {:>10} {label:<46} {us:>10.2} {vs:>12}", count * dtype.size());
                let (method, ran, time_ms) = (name.clone(), algo.to_string(), us / 1e3);
                report.rows.push(NormRow { method, ran, tokens, count, time_ms, status: "passed" });
            }
            let auto = ways.iter().position(|&w| w == Way::Auto);
            let best = (0..ways.len()).filter(|&k| ways[k] != Way::Auto).min_by(|&a, &b| times[a].total_cmp(&times[b]));
            if let (Some(auto), Some(best)) = (auto, best) {
                let ratio = times[auto] / times[best];
                let wrong = auto_chose_wrong(ratio, ran[auto] == ran[best]);
                judged += 1;
                slow += usize::from(wrong);
                let flag = match (wrong, ratio > AUTO_SLOW_RATIO) {
                    (true, _) => "  <- auto chose wrong",
                    (false, true) => "  (auto ran that design itself: two timings of one design)",
                    (false, false) => "",
                };
                let name = &args.methods[best];
                println!("{:>8} auto / the fastest other method ({name}): {ratio:.2}x{flag}", "#");
            }
        }
    }
    if rank == 0 && judged > 0 {
        println!("# auto: {slow} of {judged} token counts above {AUTO_SLOW_RATIO}x the fastest other method");
    }
    if rank == 0 && !report.not_run.is_empty() {
        println!("# Not run: tokens {:?}: --max_seconds was reached first", report.not_run);
    }
    if let (0, Some(dir)) = (rank, &args.output_dir) {
        let json = dir.join("norm_benchmark.json");
        let text = serde_json::to_string_pretty(&report).map_err(|e| BenchError::Config(e.to_string()))?;
        crate::paths::write(&json, text).map_err(BenchError::Config)?;
        println!("# wrote {}", json.display());
    }
    stream.sync()?;
    rdv.barrier("norm sweep teardown")?;
    Ok(())
}

/// What is wrong in r of a consecutive call of variant `k` (the residual and every rank's input that variant's,
/// so r holds whole numbers): how many elements, the first few, and which ranks' inputs of which other variant
/// (a call before or after) account for every wrong element of the first wrong packet (`per` elements), if any do.
fn describe_wrong_r(got: &[f64], world: usize, k: u64, per: usize, hidden: usize) -> String {
    let want = variant_sum(world + 1, 0, got.len(), k);
    let bad: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
    let Some(&first) = bad.first() else { return "r is right element by element (only its checksum was wrong)".into() };
    let firsts: Vec<String> = bad.iter().take(4).map(|&i| format!("[{i}] {} for {}", got[i], want[i])).collect();
    let packet: Vec<usize> = (first / per * per..(first / per + 1) * per).filter(|&i| i < got.len()).collect();
    let diff = |i: usize| got[i] - want[i];
    let mut fits = Vec::new();
    for v in (0..VARIANTS as u64).filter(|&v| v != k) {
        let swapped = |ranks: &[usize], i: usize| -> f64 {
            ranks.iter().map(|&q| (variant_value(q, i, v) - variant_value(q, i, k)) as f64).sum()
        };
        for q in 0..world {
            if packet.iter().all(|&i| diff(i) == swapped(&[q], i)) {
                fits.push(format!("rank {q}'s input of variant {v}"));
            }
        }
        let all: Vec<usize> = (0..world).collect();
        if packet.iter().all(|&i| diff(i) == swapped(&all, i)) {
            fits.push(format!("every rank's input of variant {v}"));
        }
    }
    for q in 0..world {
        if packet.iter().all(|&i| diff(i) == -(variant_value(q, i, k) as f64)) {
            fits.push(format!("rank {q}'s input missing"));
        }
    }
    format!(
        "{} of {} elements of r wrong (variant {k}), from element {first} (row {}), first {}; the first wrong packet \
         is explained by {}",
        bad.len(),
        got.len(),
        first / hidden,
        firsts.join(", "),
        if fits.is_empty() { "no single rank's other variant".to_string() } else { fits.join(" or ") }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_r_is_described_by_the_input_that_explains_it() {
        let (world, hidden, k) = (4, 64, 1u64);
        let want = variant_sum(world + 1, 0, 4 * hidden, k);
        assert!(describe_wrong_r(&want, world, k, 2, hidden).contains("right element by element"));
        // Packet 40 (elements 80 and 81, row 1) carries rank 2's input of the call before (variant 0).
        let mut got = want.clone();
        for i in [80, 81] {
            got[i] += (variant_value(2, i, 0) - variant_value(2, i, k)) as f64;
        }
        let told = describe_wrong_r(&got, world, k, 2, hidden);
        assert!(told.contains("of 256 elements of r wrong (variant 1), from element 80 (row 1)"), "{told}");
        assert!(told.contains("rank 2's input of variant 0"), "{told}");
        // A sum that never reached the output: r is the residual plus whatever the output held before.
        let mut stale = want.clone();
        stale[7] = variant_value(world, 7, k) as f64 + 0.75;
        let told = describe_wrong_r(&stale, world, k, 2, hidden);
        assert!(told.starts_with("1 of 256") && told.contains("no single rank's other variant"), "{told}");
    }
}
