//! Criterion benchmarks of every allreduce method, as a multi-process job: started by `cargo bench`, this
//! binary re-launches itself as W ranks. Rank 0 runs criterion; for every sample it broadcasts a
//! [`Command`] and all ranks time the same calls on their streams, the slowest rank's time being the sample.
//! The other ranks only follow rank 0's commands, so criterion's own arguments (filters, `--list`, baselines)
//! need no handling there. Every method is checked against the float64 reference before it is timed.

use allreduce::{Communicator, DType, Op, Options};
use allreduce_benches::{
    env_flag, methods as method_list, sizes, Command, Entry, Summary, COPY, METHODS_ENV, QUICK_ENV, RANKS_ENV,
};
use allreduce_benches::{SUMMARY_ENV, SUMMARY_SAMPLES};
use collective_core::{Call, Collective};
use comm_bench::BenchError;
use criterion::{BenchmarkId, Criterion, Throughput};
use gpu::{DeviceBuffer, DriverKind, Gpu, MemKind, Stream};
use ipc::Rendezvous;
use launch::RankInfo;
use measure::check::{agree_verdict, input_values, reference, tolerance, POISON};
use measure::timing::{Timer, TimingOptions};
use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

const OP: Op = Op::AllReduce;
const DTYPE: DType = DType::Bf16;
/// The default wait for a peer: rank 0's criterion analyses and plots between samples while the others wait
/// for its next command, which takes longer than a collective's usual patience. A rank that dies is noticed
/// at once anyway: the launcher stops the job when any rank exits.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    let result = match launch::detect() {
        Ok(Some(info)) => rank(&info),
        Ok(None) => launch_ranks(),
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allreduce-benches: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Not a rank yet: run W copies of ourselves with the same arguments (criterion's `--bench` and filters).
fn launch_ranks() -> Result<(), BenchError> {
    let world = match std::env::var(RANKS_ENV) {
        Ok(s) => s
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&w| w >= 1)
            .ok_or_else(|| BenchError::Config(format!("{RANKS_ENV}={s:?}: expected a number of ranks >= 1")))?,
        Err(_) => default_world()?,
    };
    println!("# allreduce-benches: launching {world} ranks ({RANKS_ENV} overrides)");
    launch::run(&launch::LaunchOptions {
        world,
        program: launch::self_exe()?,
        args: std::env::args_os().skip(1).collect(),
        env: Vec::new(),
        grace: Duration::from_secs(2),
        prefix_output: true,
        rank0_stderr_on_terminal: false,
    })?;
    Ok(())
}

/// comm-bench's defaults: 2 on the host driver, where ranks share the CPU cores; comm_bench.py's 8 on a GPU
/// driver (with fewer GPUs than that, run under MPS as dist/gpu_node.sh does, or set ARX_BENCH_RANKS).
fn default_world() -> Result<usize, BenchError> {
    let opened = gpu::open(
        gpu::Backend::Auto,
        &gpu::DriverOptions { device: None, local_rank: None, shm_prefix: String::new() },
    )?;
    Ok(if opened.gpu.kind() == DriverKind::Host { 2 } else { 8 })
}

fn rank(info: &RankInfo) -> Result<(), BenchError> {
    let timeout = match std::env::var_os(deadline::TIMEOUT_ENV) {
        Some(_) => deadline::timeout_from_env().map_err(BenchError::Config)?,
        None => DEFAULT_TIMEOUT,
    };
    let sizes = sizes(gpu_present()?, 512);
    let capacity = sizes.iter().max().copied().unwrap_or(1) * DTYPE.size();
    let opts = Options { capacity_bytes: capacity, timeout: Some(timeout), ..Options::default() };
    let comm = Communicator::new(info.clone(), opts)?;
    let result = Job::new(&comm).and_then(|mut job| job.run());
    if let Err(e) = &result {
        // Every peer's current or next wait fails at once, with this reason.
        comm.rendezvous().abort(&e.to_string());
    }
    result
}

fn gpu_present() -> Result<bool, BenchError> {
    Ok(default_world()? != 2)
}

/// What a benchmark times.
enum Target<'a> {
    /// A plain device copy of the same bytes: the machine-speed reference.
    Copy,
    Method(Box<dyn Collective + 'a>),
}

struct Job<'a> {
    gpu: Gpu,
    rdv: &'a Rendezvous,
    sizes: Vec<usize>,
    /// Names of `targets`, kept after teardown drops the methods.
    names: Vec<String>,
    targets: Vec<Target<'a>>,
    input: DeviceBuffer,
    output: DeviceBuffer,
    /// Taken out while a call borrows the job.
    timer: Option<Timer>,
}

impl<'a> Job<'a> {
    /// Agrees on the configuration, builds every method every rank can build, and allocates like comm-bench.
    fn new(comm: &'a Communicator) -> Result<Job<'a>, BenchError> {
        let (gpu, rdv) = (comm.gpu().clone(), comm.rendezvous());
        let sizes = sizes(gpu.kind() != DriverKind::Host, gpu.info().size_align);
        let list = method_list(std::env::var(METHODS_ENV).ok().as_deref()).map_err(BenchError::Config)?;
        let config = format!("driver={}\nworld={}\nsizes={sizes:?}\nmethods={list:?}\n", gpu.kind(), rdv.world());
        let root = rdv.broadcast("configuration", 0, config.as_bytes())?;
        if let Some((a, b)) = String::from_utf8_lossy(&root).lines().zip(config.lines()).find(|(a, b)| a != b) {
            return Err(BenchError::Config(format!("rank {} has {b}, rank 0 has {a}", rdv.rank())));
        }
        let capacity = sizes.iter().max().copied().unwrap_or(1) * DTYPE.size();
        let (mut names, mut targets) = (vec![COPY.to_string()], vec![Target::Copy]);
        let opts = methods::BuildOptions { capacity_bytes: capacity, car_uncached: true };
        for name in &list {
            let m = methods::build(name, comm, &opts).map_err(|e| e.to_string());
            // Every rank learns whether every rank built it, so all skip it together.
            let ok = rdv.all_gather(&format!("{name} built"), &[m.is_ok() as u8])?;
            let m = match ok.iter().position(|v| v[..] != [1]) {
                None => m,
                Some(r) => Err(m.err().unwrap_or_else(|| format!("rank {r} could not build it"))),
            };
            match m.and_then(|m| m.supports(OP, DTYPE).map(|()| m)) {
                Ok(m) => {
                    names.push(name.to_string());
                    targets.push(Target::Method(m));
                }
                Err(reason) if rdv.rank() == 0 => println!("# skipped {name}: {reason}"),
                Err(_) => {}
            }
        }
        Ok(Job {
            input: gpu.alloc(capacity, MemKind::Device)?,
            output: gpu.alloc(capacity, MemKind::Device)?,
            timer: Some(Timer::new(&gpu)?),
            gpu,
            rdv,
            sizes,
            names,
            targets,
        })
    }

    fn run(&mut self) -> Result<(), BenchError> {
        let (rank, world) = (self.rdv.rank(), self.rdv.world());
        if rank == 0 {
            let i = self.gpu.info();
            println!(
                "# allreduce-benches: {world} ranks, {} driver ({}, {}), {DTYPE}, sizes {:?}",
                i.kind, i.name, i.arch, self.sizes
            );
        }
        // Checked once per method and size before anything is timed, so a broken method is never benchmarked.
        let (mut runnable, mut too_large) = (Vec::new(), 0);
        for s in 0..self.sizes.len() {
            for t in 0..self.targets.len() {
                // A method with a smaller size limit (symm_ll's packet area) skips the sizes above it.
                if let Target::Method(m) = &self.targets[t] {
                    if self.sizes[s] * DTYPE.size() > m.capacity_bytes() {
                        if rank == 0 {
                            println!(
                                "# skipped {} at {} elements: above its largest message",
                                self.names[t], self.sizes[s]
                            );
                        }
                        too_large += 1;
                        continue;
                    }
                }
                match self.check(t, self.sizes[s])? {
                    None => runnable.push((t, s)),
                    Some(failure) if rank == 0 => {
                        println!("# FAILED {} at {} elements, not benchmarked: {failure}", self.names[t], self.sizes[s])
                    }
                    Some(_) => {}
                }
            }
        }
        let failed = runnable.len() + too_large < self.sizes.len() * self.targets.len();
        if rank == 0 {
            let samples = self.lead(&runnable);
            self.rdv.broadcast("command", 0, &Command::Stop.encode())?;
            self.teardown()?;
            if let Ok(path) = std::env::var(SUMMARY_ENV) {
                self.write_summary(&path, &runnable, &samples)?;
            }
        } else {
            self.follow()?;
            self.teardown()?;
        }
        if failed {
            return Err(BenchError::Config(
                "some methods failed their check (see above) and were not benchmarked".into(),
            ));
        }
        Ok(())
    }

    /// Rank 0: criterion drives; each sample is one [`Command::Run`]. Returns every sample's time per call (ns).
    fn lead(&mut self, runnable: &[(usize, usize)]) -> HashMap<(usize, usize), Vec<f64>> {
        let quick = env_flag(QUICK_ENV);
        // bench links plotters with ab_glyph, so criterion's plots need a registered font too.
        comm_bench::plot::register_fonts();
        let c = Criterion::default();
        let c = if quick {
            c.warm_up_time(Duration::from_millis(300))
                .measurement_time(Duration::from_millis(1000))
                .sample_size(10)
                .nresamples(5000)
                .without_plots()
        } else {
            c.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(20)
        };
        // Command-line flags (`--quick`, `--sample-size`, filters, `--noplot`) win over the settings above.
        let mut c = c.configure_from_args();
        let mut samples: HashMap<(usize, usize), Vec<f64>> = HashMap::new();
        let mut group = c.benchmark_group(format!("allreduce-{DTYPE}-{}ranks", self.rdv.world()));
        for &(t, s) in runnable {
            let (name, count) = (self.names[t].clone(), self.sizes[s]);
            group.throughput(Throughput::Bytes((count * DTYPE.size()) as u64));
            group.bench_function(BenchmarkId::new(name, count), |b| {
                b.iter_custom(|iters| {
                    let cmd = Command::Run { method: t, size: s, iters };
                    let timed = self.rdv.broadcast("command", 0, &cmd.encode()).map_err(BenchError::from);
                    match timed.and_then(|_| self.time(t, s, iters)) {
                        Ok(d) => {
                            samples.entry((t, s)).or_default().push(d.as_nanos() as f64 / iters.max(1) as f64);
                            d
                        }
                        Err(e) => self.fatal(&e),
                    }
                })
            });
        }
        group.finish();
        c.final_summary();
        samples
    }

    /// Criterion's closures cannot return errors: abort the job (peers fail at once) and exit.
    fn fatal(&self, e: &BenchError) -> ! {
        self.rdv.abort(&e.to_string());
        eprintln!("allreduce-benches: error: {e}");
        std::process::exit(1)
    }

    /// Ranks > 0: do what rank 0 says until it says stop.
    fn follow(&mut self) -> Result<(), BenchError> {
        loop {
            let blob = self.rdv.broadcast("command", 0, &[])?;
            match Command::decode(&blob).map_err(BenchError::Config)? {
                Command::Stop => return Ok(()),
                Command::Run { method, size, iters } => {
                    if method >= self.targets.len() || size >= self.sizes.len() {
                        return Err(BenchError::Config(format!("rank 0 asked for target {method} size {size}")));
                    }
                    self.time(method, size, iters)?;
                }
            }
        }
    }

    /// Nobody unmaps a buffer while a peer's last call may still read it.
    fn teardown(&mut self) -> Result<(), BenchError> {
        if let Some(t) = &self.timer {
            t.stream.sync()?;
        }
        self.rdv.barrier("teardown")?;
        self.targets.clear();
        Ok(())
    }

    fn call(&mut self, t: usize, count: usize, stream: &Stream) -> Result<(), BenchError> {
        let (input, output) = (self.input.ptr(), self.output.ptr());
        // SAFETY: the job's own input and output, each of the largest size's bytes.
        match &mut self.targets[t] {
            Target::Copy => unsafe { stream.copy(output, input, count * DTYPE.size())? },
            Target::Method(m) => {
                let call = Call::new(OP, DTYPE, input, output, count, self.rdv.world(), m.capacity_bytes())?;
                unsafe { m.run(&call, stream)? }
            }
        }
        Ok(())
    }

    /// `iters` calls, timed like every measurement (ranks aligned, the slowest rank's time).
    fn time(&mut self, t: usize, s: usize, iters: u64) -> Result<Duration, BenchError> {
        let count = self.sizes[s];
        let opts = TimingOptions { iters: iters.max(1), warmup: 0, repeats: 1, graph: false };
        let timer = self.timer.take().expect("the job's timer is back after every call");
        let timing = timer.time_calls(&opts, self.rdv, |stream| self.call(t, count, stream));
        self.timer = Some(timer);
        Ok(Duration::from_secs_f64(timing?.median_ms() * 1e-3 * iters as f64))
    }

    /// One checked call on fresh inputs: every rank learns every rank's verdict. The copy must reproduce the
    /// input; a method, the float64 reference sum, bitwise equal on every rank.
    fn check(&mut self, t: usize, count: usize) -> Result<Option<String>, BenchError> {
        let (rank, world) = (self.rdv.rank(), self.rdv.world());
        let seed = measure::check::agree_seed(self.rdv)?;
        let values = input_values(seed, rank, count, DTYPE);
        let timer = self.timer.take().expect("the job's timer is back after every call");
        let stream = &timer.stream;
        let mut out = vec![0u8; count * DTYPE.size()];
        let done = stream
            .upload(&self.input, 0, &DTYPE.encode(&values))
            .and_then(|()| stream.fill(&self.output, POISON))
            .map_err(BenchError::from)
            .and_then(|()| self.call(t, count, stream))
            .and_then(|()| Ok(stream.download(&self.output, 0, &mut out)?));
        self.timer = Some(timer);
        done?;
        let (want, tol, bitwise) = match &self.targets[t] {
            Target::Copy => (values.iter().map(|&v| v as f64).collect(), 0.0, false),
            Target::Method(m) => {
                (reference(seed, world, count, DTYPE, 0, count), tolerance(DTYPE, world, m.rounds_every_add()), true)
            }
        };
        Ok(agree_verdict(self.rdv, &out, DTYPE, &want, tol, bitwise, "before timing")?)
    }

    /// The perf gate's input: per benchmark, the median time per call over criterion's measurement samples.
    fn write_summary(
        &self,
        path: &str,
        runnable: &[(usize, usize)],
        samples: &HashMap<(usize, usize), Vec<f64>>,
    ) -> Result<(), BenchError> {
        let entries = runnable
            .iter()
            .filter_map(|key| {
                let all = samples.get(key)?;
                // Criterion's warm-up calls come first; its last SUMMARY_SAMPLES calls are measurement samples.
                let measured = &all[all.len().saturating_sub(SUMMARY_SAMPLES)..];
                let count = self.sizes[key.1];
                Some(Entry {
                    method: self.names[key.0].clone(),
                    count,
                    bytes: count * DTYPE.size(),
                    median_ns: measure::timing::median(measured),
                    samples: measured.len(),
                })
            })
            .collect();
        let i = self.gpu.info();
        let summary = Summary {
            driver: i.kind.to_string(),
            device: i.name.clone(),
            arch: i.arch.clone(),
            world: self.rdv.world(),
            dtype: DTYPE.name().into(),
            quick: env_flag(QUICK_ENV),
            unix_time: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            entries,
        };
        let path = std::path::Path::new(path);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, serde_json::to_string_pretty(&summary).map_err(std::io::Error::other)?)?;
        println!("# wrote {}", path.display());
        Ok(())
    }
}
