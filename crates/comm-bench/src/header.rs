//! The run header rank 0 prints before anything is measured: what ran where, with which build and settings, the
//! tune table `auto` follows, and each method left out with its reason (once, rather than a skipped row per size).

use crate::config::SweepConfig;
use crate::report::{Provenance, Unavailable};
use allreduce::Communicator;
use allreduce::Residency;
use gpu::DriverKind;

/// comm-bench's version and the commit it was built from (build.rs; `unknown` outside a git checkout).
pub fn tool_version() -> String {
    format!("comm-bench {} (commit {})", env!("CARGO_PKG_VERSION"), env!("COMM_BENCH_COMMIT"))
}

/// This machine's name, as `hostname` prints it.
pub fn host_name() -> String {
    nix::unistd::gethostname().map_or_else(|_| "unknown".into(), |h| h.to_string_lossy().into_owned())
}

/// What identifies a run besides its settings; the collective library's version where an NCCL method is asked
/// for on a driver that has one.
pub fn provenance(driver: DriverKind, methods: &[String]) -> Provenance {
    let flavor = match driver {
        DriverKind::Cuda => Some(nccl_sys::Flavor::Nccl),
        DriverKind::Hip => Some(nccl_sys::Flavor::Rccl),
        DriverKind::Host => None,
    };
    let library = flavor.filter(|_| methods.iter().any(|m| m.starts_with("nccl"))).map(|f| {
        nccl_sys::NcclLib::load(f).map_or_else(
            |e| format!("{f}: not loaded ({e})"),
            |lib| {
                let (major, minor, patch) = lib.version();
                format!("{f} {major}.{minor}.{patch} ({})", lib.library())
            },
        )
    });
    Provenance { host: host_name(), tool: tool_version(), library }
}

/// Prints the header; `counts` is the sweep's (smallest, largest) element count.
pub fn print(
    cfg: &SweepConfig,
    comm: &Communicator,
    provenance: &Provenance,
    sizes: usize,
    counts: (usize, usize),
    unavailable: &[Unavailable],
) {
    let i = comm.gpu().info();
    let t = &cfg.timing;
    println!("# {} on {}", provenance.tool, provenance.host);
    println!(
        "# {} ranks, {} driver ({}; {}, {}, {} device(s) visible){}",
        comm.world(),
        i.kind,
        i.driver_version,
        i.name,
        i.arch,
        i.count,
        provenance.library.as_deref().map_or(String::new(), |l| format!(", {l}"))
    );
    println!(
        "# {} {}, {} sizes from {} to {} elements, {} mode",
        cfg.op,
        cfg.dtype,
        sizes,
        counts.0,
        counts.1,
        cfg.mode().name()
    );
    println!(
        "# {} timed calls after {} warm-up, {} repeat(s), median reported; ranks' times combined: {} (--report)",
        t.iters,
        t.warmup,
        t.repeats,
        cfg.report.name()
    );
    print!("{}", comm.placement());
    for residency in [Residency::Caller, Residency::Registered] {
        println!("# auto on {residency} buffers follows {}", comm.table_source(cfg.mode(), residency));
    }
    comm.notes().iter().for_each(|n| println!("# {n}"));
    for u in unavailable {
        println!("# not run: {}: {}", u.method, u.reason);
    }
}
