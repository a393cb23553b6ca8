//! `comm-bench`: launches its ranks (or runs as one, under our launcher, torchrun, mpirun, MPICH/Intel MPI or srun) and
//! sweeps.

use clap::Parser;
use comm_bench::cli::{BenchArgs, Cli, Command};
use comm_bench::BenchError;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Launch { num_ranks, command }) => launch_command(num_ranks as usize, command),
        Some(Command::Soak(args)) => soak(&args),
        Some(Command::Norm(args)) => norm(&args),
        Some(Command::Plot { files, methods, relative_to, output, read }) => {
            let opts = comm_bench::plot::PlotOptions { methods, relative_to };
            if output.is_some() && files.len() > 1 {
                Err(BenchError::Config("--output names one plot: give one file".into()))
            } else {
                files.iter().try_for_each(|p| plot(p, &opts, &read, output.as_deref()))
            }
        }
        Some(Command::Compare { files, methods, output, read }) => compare(&files, methods, &output, &read),
        None => bench(&cli.bench),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("comm-bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn launch_command(world: usize, mut command: Vec<std::ffi::OsString>) -> Result<(), BenchError> {
    let program = command.remove(0);
    let program = which(&program).ok_or_else(|| BenchError::Config(format!("{program:?}: no such program")))?;
    launch::run(&launch::LaunchOptions {
        world,
        program,
        args: command,
        env: Vec::new(),
        grace: Duration::from_secs(2),
        prefix_output: true,
        rank0_stderr_on_terminal: false,
    })?;
    Ok(())
}

/// Resolves a program name through PATH, as a shell would.
fn which(program: &std::ffi::OsStr) -> Option<std::path::PathBuf> {
    let p = std::path::Path::new(program);
    if p.components().count() > 1 {
        return p.exists().then(|| p.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(p)).find(|c| c.is_file())
}

fn read_run(path: &Path, read: &comm_bench::cli::ReadArgs) -> Result<comm_bench::runs::Run, BenchError> {
    comm_bench::runs::load(path, read.report, read.world as usize).map_err(BenchError::Config)
}

fn plot(
    file: &Path,
    opts: &comm_bench::plot::PlotOptions,
    read: &comm_bench::cli::ReadArgs,
    output: Option<&Path>,
) -> Result<(), BenchError> {
    let run = read_run(file, read)?;
    let stem = match output {
        Some(o) => o.to_path_buf(),
        None => file.parent().unwrap_or(Path::new(".")).join("comm_ops_benchmark"),
    };
    let (svg, png) = comm_bench::plot::plot_runs(&[run], opts, &stem).map_err(BenchError::Config)?;
    println!("plotted {} and {}", svg.display(), png.display());
    Ok(())
}

fn compare(
    files: &[PathBuf],
    methods: Option<Vec<String>>,
    output: &Path,
    read: &comm_bench::cli::ReadArgs,
) -> Result<(), BenchError> {
    let runs = files.iter().map(|f| read_run(f, read)).collect::<Result<Vec<_>, _>>()?;
    for other in &runs[1..] {
        print!("{}", comm_bench::compare::render(&runs[0], other, methods.as_deref()).map_err(BenchError::Config)?);
    }
    let opts = comm_bench::plot::PlotOptions { methods, relative_to: None };
    let (svg, png) = comm_bench::plot::plot_runs(&runs, &opts, output).map_err(BenchError::Config)?;
    println!("# plotted {} and {}", svg.display(), png.display());
    Ok(())
}

fn soak(args: &comm_bench::soak::SoakArgs) -> Result<(), BenchError> {
    match launch::detect()? {
        Some(info) => comm_bench::soak::run_rank(args, &info),
        None => relaunch(world(args.num_ranks, driver_kind(args.backend)?)),
    }
}

fn norm(args: &comm_bench::norm::NormArgs) -> Result<(), BenchError> {
    args.validate()?;
    let info = launch::detect()?;
    if let (true, Some(dir)) = (info.as_ref().is_none_or(|i| i.rank == 0), &args.output_dir) {
        comm_bench::paths::writable_dir(dir).map_err(BenchError::Config)?;
    }
    match info {
        Some(info) => comm_bench::norm::run_rank(args, &info),
        None => relaunch(world(args.num_ranks, driver_kind(args.backend)?)),
    }
}

/// Starts this program again as the ranks of a job, with the same arguments.
fn relaunch(world: usize) -> Result<(), BenchError> {
    launch::run(&launch::LaunchOptions {
        world,
        program: launch::self_exe()?,
        args: std::env::args_os().skip(1).collect(),
        env: Vec::new(),
        grace: Duration::from_secs(2),
        prefix_output: true,
        // Rank 0's progress bar over the sweep shows when we run at a terminal.
        rank0_stderr_on_terminal: true,
    })?;
    Ok(())
}

fn bench(args: &BenchArgs) -> Result<(), BenchError> {
    args.validate().map_err(BenchError::Config)?;
    let info = launch::detect()?;
    // Checked once, before any rank starts (or by rank 0 under another launcher): ranks probing one path at once
    // would race on the probe file.
    if info.as_ref().is_none_or(|i| i.rank == 0) {
        if args.export_csv {
            comm_bench::paths::writable_dir(&args.output_dir).map_err(BenchError::Config)?;
        }
        if let Some(tune) = &args.tune {
            comm_bench::paths::writable_file(tune).map_err(BenchError::Config)?;
        }
    }
    let Some(info) = info else {
        let (cfg, kind) = (args.config(), driver_kind(args.backend)?);
        let world = world(args.num_ranks, kind);
        if kind == gpu::DriverKind::Host {
            let need = comm_bench::memory::estimate(&cfg.methods, cfg.op, cfg.dtype, cfg.capacity_bytes(), world);
            comm_bench::memory::check(need).map_err(BenchError::Config)?;
        }
        return relaunch(world);
    };
    if let Some(path) = &args.tune {
        return comm_bench::tune::tune_rank(&args.config(), &info, path);
    }
    let Some(outcome) = comm_bench::run::run_rank(&args.config(), &info)? else {
        return Ok(());
    };
    print!("{}", comm_bench::summary::render(&outcome));
    if args.export_csv {
        let (csv, json) = outcome.export(&args.output_dir, args.op).map_err(BenchError::Config)?;
        println!("# wrote {} and {}", csv.display(), json.display());
        match comm_bench::plot::plot(&outcome, &args.output_dir) {
            Ok((svg, png)) => println!("# plotted {} and {}", svg.display(), png.display()),
            Err(e) => println!("# no plot: {e}"),
        }
    }
    let failed = outcome.rows.iter().filter(|r| matches!(r.status, comm_bench::report::Status::Failed(_))).count();
    if failed > 0 {
        return Err(BenchError::Config(format!("{failed} measurement(s) failed their check")));
    }
    if !comm_bench::summary::measured_any(&outcome) {
        return Err(BenchError::Config("nothing could be measured: every method was left out or skipped".into()));
    }
    Ok(())
}

/// The driver a job on `backend` gets: `auto` is resolved by opening it here, as each rank will.
fn driver_kind(backend: gpu::Backend) -> Result<gpu::DriverKind, BenchError> {
    Ok(match backend {
        gpu::Backend::Host => gpu::DriverKind::Host,
        gpu::Backend::Cuda => gpu::DriverKind::Cuda,
        gpu::Backend::Hip => gpu::DriverKind::Hip,
        gpu::Backend::Auto => {
            let opts = gpu::DriverOptions { device: None, local_rank: None, shm_prefix: String::new() };
            gpu::open(backend, &opts)?.gpu.kind()
        }
    })
}

/// `--num_ranks`, else comm_bench.py's 8 ranks on a GPU driver and 2 on the host driver, where ranks share the CPU
/// cores.
fn world(num_ranks: Option<u64>, kind: gpu::DriverKind) -> usize {
    num_ranks.map_or_else(
        || {
            let world = if kind == gpu::DriverKind::Host { 2 } else { 8 };
            println!("# {kind} driver: launching {world} ranks (--num_ranks overrides)");
            world
        },
        |n| n as usize,
    )
}
