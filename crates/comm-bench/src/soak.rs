//! The soak: many back-to-back calls with random methods, sizes and dtypes, every result checked exactly.
//! Calls go out in batches with no synchronisation between them (so consecutive calls of different shapes race
//! each other if a protocol lets them), each into its own output; inputs are small integers, so every sum is exact
//! in every dtype and the expected output is known without a reference run.

use crate::BenchError;
use allreduce::{Communicator, DType, Op, Options};
use clap::Args;
use collective_core::{Call, Collective};
use gpu::MemKind;
use launch::RankInfo;
use measure::check::variant_value;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::time::{Duration, Instant};

#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    /// Calls in all.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub calls: u64,
    /// Largest element count of a call (the default reaches the zero-copy designs' sizes, above 640 KiB, in every
    /// dtype).
    #[arg(long = "max_count", alias = "max-count", default_value_t = 1 << 19, value_parser = clap::value_parser!(u64).range(1..=(1u64 << 26)))]
    pub max_count: u64,
    /// Calls issued back to back before the results are read.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub batch: u64,
    /// Seed of the call sequence (all ranks draw the same sequence) [default: random].
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long = "num_ranks", alias = "num-ranks", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub num_ranks: Option<u64>,
    #[arg(long, default_value = "auto", value_parser = |s: &str| s.parse::<gpu::Backend>().map_err(|e| e.to_string()))]
    pub backend: gpu::Backend,
    /// Comma-separated methods or groups, as comm-bench's [default: every car and symm method, tuned ones included].
    #[arg(long, value_delimiter = ',')]
    pub methods: Option<Vec<String>>,
    /// Stop issuing calls after this many seconds, and say how many ran.
    #[arg(long = "max_seconds", alias = "max-seconds", default_value_t = 900.0, allow_negative_numbers = true, value_parser = crate::config::parse_timeout)]
    pub max_seconds: f64,
    #[arg(long = "timeout_s", alias = "timeout-s", allow_negative_numbers = true, value_parser = crate::config::parse_timeout)]
    pub timeout_s: Option<f64>,
}

/// The default methods: every car and symm method of the registry, tuned designs, ablation variants and
/// IPC-staged ones included (NCCL has its own tests; the broken variants are there to fail).
fn default_methods() -> Vec<String> {
    let ops = [Op::AllReduce, Op::ReduceScatter];
    let all = ops.into_iter().flat_map(methods::defaults).chain(methods::ablations());
    all.filter(|m| !m.starts_with("nccl")).map(str::to_string).collect()
}

struct Drawn {
    method: usize,
    dtype: DType,
    count: usize,
}

/// One rank's soak; rank 0 prints the summary.
pub fn run_rank(args: &SoakArgs, info: &RankInfo) -> Result<(), BenchError> {
    let timeout = match args.timeout_s {
        Some(s) => Duration::from_secs_f64(s),
        None => deadline::timeout_from_env().map_err(BenchError::Config)?,
    };
    let capacity = args.max_count as usize * DType::F32.size();
    let opts =
        Options { backend: args.backend, capacity_bytes: capacity, timeout: Some(timeout), ..Options::default() };
    let comm = Communicator::new(info.clone(), opts)?;
    let result = soak(args, &comm);
    if let Err(e) = &result {
        comm.rendezvous().abort(&e.to_string());
    }
    result
}

fn soak(args: &SoakArgs, comm: &Communicator) -> Result<(), BenchError> {
    let (gpu, rdv) = (comm.gpu(), comm.rendezvous());
    let (rank, world) = (rdv.rank(), rdv.world());
    let names: Vec<String> = match &args.methods {
        Some(m) => methods::expand(m),
        None => default_methods(),
    };
    let max = args.max_count as usize;
    let capacity = max * DType::F32.size();
    let build = methods::BuildOptions { capacity_bytes: capacity, car_uncached: true };
    let mut built: Vec<(Op, Box<dyn Collective>)> = Vec::new();
    for name in &names {
        let op = methods::op_of(name).map_err(BenchError::Config)?;
        built.push((op, methods::build(name, comm, &build)?));
    }
    let seed = match args.seed {
        Some(s) => s,
        None => measure::check::agree_seed(rdv)?,
    };
    let mut rng = SmallRng::seed_from_u64(seed);
    let batch = args.batch as usize;
    let inputs = gpu.alloc(batch * capacity, MemKind::Device)?;
    let outputs = gpu.alloc(batch * capacity, MemKind::Device)?;
    let stream = gpu.stream()?;
    let start = Instant::now();
    let (mut done, mut per_method) = (0u64, vec![0u64; built.len()]);
    let budget = Duration::from_secs_f64(args.max_seconds);
    let mut next_report = Instant::now() + Duration::from_secs(30);
    // Every rank stops after the same batch: rank 0's clock decides.
    while done < args.calls {
        let over = start.elapsed() > budget;
        if rdv.broadcast("soak budget", 0, &[u8::from(over)])? == [1] {
            break;
        }
        if rank == 0 && Instant::now() > next_report {
            println!("soak: {done} of {} calls checked ({:.0} s)", args.calls, start.elapsed().as_secs_f64());
            next_report = Instant::now() + Duration::from_secs(30);
        }
        let n = (args.calls - done).min(batch as u64) as usize;
        let calls: Vec<Drawn> = (0..n)
            .map(|_| {
                let method = rng.random_range(0..built.len());
                let dtype = DType::ALL[rng.random_range(0..3)];
                // Within the method's own limit too (symm_ll's packet area is smaller than --max_count).
                let most = max.min(built[method].1.capacity_bytes() / dtype.size()).max(1);
                let mut count = rng.random_range(1..=most);
                if built[method].0 == Op::ReduceScatter {
                    count = (count / world).max(1) * world;
                    if count > most {
                        count -= world;
                    }
                }
                Drawn { method, dtype, count: count.max(1) }
            })
            .collect();
        if calls.iter().any(|c| c.count == 0) {
            return Err(BenchError::Config(format!("--max_count {max} is below the world size {world}")));
        }
        for (k, c) in calls.iter().enumerate() {
            let x: Vec<f32> = (0..c.count).map(|i| variant_value(rank, i, done + k as u64)).collect();
            stream.upload(&inputs, k * capacity, &c.dtype.encode(&x))?;
            stream.upload(&outputs, k * capacity, &vec![0xFF; c.count * c.dtype.size()])?;
        }
        for (k, c) in calls.iter().enumerate() {
            let (op, m) = &mut built[c.method];
            let (input, output) = (inputs.ptr().offset(k * capacity), outputs.ptr().offset(k * capacity));
            let call = Call::new(*op, c.dtype, input, output, c.count, world, m.capacity_bytes())?;
            // SAFETY: slot k of our input and output arrays, `capacity` bytes each; the stream is synced below.
            unsafe { m.run(&call, &stream)? };
            per_method[c.method] += 1;
        }
        stream.sync()?;
        for (k, c) in calls.iter().enumerate() {
            let op = built[c.method].0;
            let shard = op.output_count(c.count, world);
            let lo = if op == Op::ReduceScatter { rank * shard } else { 0 };
            let mut out = vec![0u8; shard * c.dtype.size()];
            stream.download(&outputs, k * capacity, &mut out)?;
            let got = c.dtype.decode(&out);
            let call = done + k as u64;
            if let Some(i) =
                (0..shard).find(|&j| got[j] != (0..world).map(|r| variant_value(r, lo + j, call) as f64).sum::<f64>())
            {
                return Err(BenchError::Config(format!(
                    "soak call {call} ({} {} x {}): rank {rank} element {i} is {}, expected {}",
                    names[c.method],
                    c.count,
                    c.dtype,
                    got[i],
                    (0..world).map(|r| variant_value(r, lo + i, call) as f64).sum::<f64>()
                )));
            }
        }
        done += n as u64;
    }
    stream.sync()?;
    rdv.barrier("soak teardown")?;
    if rank == 0 {
        let counts: Vec<String> = names.iter().zip(&per_method).map(|(n, c)| format!("{n} {c}")).collect();
        println!(
            "soak: {done} calls checked exactly on every rank{} ({world} ranks, {} driver, seed {seed}, up to {max} elements, batches of {batch}): {} in {:.1} s, no wrong result, no hang",
            if done < args.calls { format!(" (of {} asked: --max_seconds reached)", args.calls) } else { String::new() },
            gpu.kind(),
            counts.join(", "),
            start.elapsed().as_secs_f64()
        );
    }
    drop(built);
    Ok(())
}
