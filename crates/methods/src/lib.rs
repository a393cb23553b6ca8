//! The registry of methods by name, for benchmarks and studies: comm-bench and the criterion benches know
//! implementations only through it and the [`Collective`] trait. A program calls `allreduce::Communicator`, which
//! picks among them itself. One typed row per method ([`Method`]): its op, the comm_bench.py column it fills, what it
//! builds ([`Kind`]) and what it allocates per rank ([`Buffers`]); names are parsed here and nowhere else.

use allreduce::Communicator;
use collective_core::{Call, Collective, CollectiveError, LaunchRule, Op, Team};
use gpu::{DeviceBuffer, Stream};
use symm::tuned::{CopyIn, Design, Staging, SymmTuned, TunedOptions};

/// What a method builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// FBGEMM-style custom allreduce (or one of its ablation variants).
    Car(car::Algo, car::Variant),
    /// torch's symmetric-memory design; `true`: two-shot with its copy-in fused into the kernel.
    Symm(symm::Algo, bool),
    /// A tuned symmetric-memory design, with its staging memory and its copy-in of a caller's input.
    Tuned(Design, Staging, CopyIn),
    /// NCCL / RCCL; `symmetric`: through NCCL's registered windows.
    Nccl { symmetric: bool },
    /// The communicator's public calls (`auto`): `Communicator::all_reduce`, as a program makes it.
    Communicator,
}

/// What a method allocates per rank, in buffers of the sweep's capacity: in all, and how many of those are the host
/// driver's IPC memory, which lives in /dev/shm (VMM memory is memfds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Buffers {
    pub capacities: usize,
    pub shm: usize,
}

impl std::ops::Add for Buffers {
    type Output = Buffers;
    fn add(self, o: Buffers) -> Buffers {
        Buffers { capacities: self.capacities + o.capacities, shm: self.shm + o.shm }
    }
}

/// Where a method appears: the default sweep, the ablation study, or nowhere but by name (a deliberately broken
/// protocol that the benchmark's checks must fail: never in a group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Default,
    Ablation,
    Broken,
}

/// One method.
#[derive(Clone, Copy, Debug)]
pub struct Method {
    pub name: &'static str,
    pub op: Op,
    /// The comm_bench.py column it fills.
    pub csv: Option<&'static str>,
    pub kind: Kind,
    pub role: Role,
}

const AR: Op = Op::AllReduce;
const RS: Op = Op::ReduceScatter;
const AG: Op = Op::AllGather;

const fn row(name: &'static str, op: Op, csv: Option<&'static str>, kind: Kind, role: Role) -> Method {
    Method { name, op, csv, kind, role }
}

const fn car_row(name: &'static str, algo: car::Algo, variant: car::Variant, role: Role) -> Method {
    row(name, algo.op(), None, Kind::Car(algo, variant), role)
}

const fn tuned_row(name: &'static str, design: Design, staging: Staging, role: Role) -> Method {
    row(name, AR, None, Kind::Tuned(design, staging, CopyIn::Cheapest), role)
}

use car::Algo::{AllGather as CarAg, OneShot as Car1, ReduceScatter as CarRs, TwoShot as Car2};
use car::Variant as V;
use Role::{Ablation, Broken, Default};

/// Every method: comm_bench.py's, in its column order, then ours, then the ablation variants.
pub const METHODS: &[Method] = &[
    row("car_1shot", AR, Some("fbgemm_1shot"), Kind::Car(Car1, V::Base), Default),
    row("symm_1shot", AR, Some("symm_1shot"), Kind::Symm(symm::Algo::OneShot, false), Default),
    row("car_2shot", AR, Some("fbgemm_2shot"), Kind::Car(Car2, V::Base), Default),
    row("symm_2shot", AR, Some("symm_2shot"), Kind::Symm(symm::Algo::TwoShot, false), Default),
    row("nccl", AR, Some("nccl"), Kind::Nccl { symmetric: false }, Default),
    row("auto", AR, None, Kind::Communicator, Default),
    tuned_row("symm_1shot_tuned", Design::OneShotTuned, Staging::Vmm, Default),
    tuned_row("symm_2shot_tuned", Design::TwoShotTuned, Staging::Vmm, Default),
    tuned_row("symm_ll", Design::Ll, Staging::Vmm, Default),
    tuned_row("symm_epoch_1shot", Design::EpochOneShot, Staging::Vmm, Default),
    tuned_row("symm_zc_1shot", Design::ZeroCopyOneShot, Staging::Vmm, Default),
    tuned_row("symm_zc_2shot", Design::ZeroCopyTwoShot, Staging::Vmm, Default),
    tuned_row("symm_zc_2shot_push", Design::ZeroCopyTwoShotPush, Staging::Vmm, Default),
    tuned_row("symm_zc_2shot_pull", Design::ZeroCopyTwoShotPull, Staging::Vmm, Default),
    tuned_row("symm_zc_2shot_ll", Design::ZeroCopyTwoShotLl, Staging::Vmm, Default),
    row("nccl_symm", AR, None, Kind::Nccl { symmetric: true }, Default),
    row("car_rs", RS, Some("fbgemm_rs"), Kind::Car(CarRs, V::Base), Default),
    row("symm_rs", RS, Some("symm_rs"), Kind::Symm(symm::Algo::ReduceScatter, false), Default),
    row("nccl_rs", RS, Some("nccl_rs"), Kind::Nccl { symmetric: false }, Default),
    row("nccl_symm_rs", RS, None, Kind::Nccl { symmetric: true }, Default),
    row("car_ag", AG, Some("fbgemm_ag"), Kind::Car(CarAg, V::Base), Default),
    row("nccl_ag", AG, Some("nccl_ag"), Kind::Nccl { symmetric: false }, Default),
    row("nccl_symm_ag", AG, None, Kind::Nccl { symmetric: true }, Default),
    // car's ablation variants, each one factor of car changed.
    car_row("car_1shot_vmm", Car1, V::Vmm, Ablation),
    car_row("car_1shot_cas", Car1, V::Cas, Ablation),
    car_row("car_1shot_round", Car1, V::RoundEveryAdd, Ablation),
    car_row("car_1shot_ptrtable", Car1, V::PeerTable, Ablation),
    car_row("car_1shot_push", Car1, V::Push, Ablation),
    car_row("car_1shot_oneblock", Car1, V::OneBlockBarrier, Ablation),
    car_row("car_2shot_3bar", Car2, V::ExitBarrier, Ablation),
    // torch's two-shot with its copy-in fused into the kernel instead of a separate memcpy.
    row("symm_2shot_fused", AR, None, Kind::Symm(symm::Algo::TwoShot, true), Ablation),
    // The tuned designs with their staging buffer and flags in classic IPC memory.
    tuned_row("symm_epoch_1shot_ipc", Design::EpochOneShot, Staging::Ipc, Ablation),
    tuned_row("symm_zc_1shot_ipc", Design::ZeroCopyOneShot, Staging::Ipc, Ablation),
    tuned_row("symm_zc_2shot_ipc", Design::ZeroCopyTwoShot, Staging::Ipc, Ablation),
    tuned_row("symm_1shot_tuned_ipc", Design::OneShotTuned, Staging::Ipc, Ablation),
    tuned_row("symm_2shot_tuned_ipc", Design::TwoShotTuned, Staging::Ipc, Ablation),
    // The zero-copy designs with a caller's input copied in inside the kernel rather than by a memcpy before it.
    row(
        "symm_zc_1shot_fusedcopy",
        AR,
        None,
        Kind::Tuned(Design::ZeroCopyOneShot, Staging::Vmm, CopyIn::Fused),
        Ablation,
    ),
    row(
        "symm_zc_2shot_fusedcopy",
        AR,
        None,
        Kind::Tuned(Design::ZeroCopyTwoShot, Staging::Vmm, CopyIn::Fused),
        Ablation,
    ),
    // The pulled two-shot, which fuses its copy-in, with a memcpy of the whole input before the kernel instead.
    row(
        "symm_zc_2shot_pull_memcpy",
        AR,
        None,
        Kind::Tuned(Design::ZeroCopyTwoShotPull, Staging::Vmm, CopyIn::Dma),
        Ablation,
    ),
    // Host driver only: must fail the benchmark's checks of consecutive calls, and of every rank's gather.
    car_row("car_1shot_broken_samehalf", Car1, V::BrokenSameHalf, Broken),
    car_row("car_ag_broken_ringorder", CarAg, V::BrokenRingOrder, Broken),
    car_row("car_2shot_broken_suminput", Car2, V::BrokenSumInInput, Broken),
];

impl Method {
    /// What it allocates per rank. `auto` is the communicator's own, counted once per sweep
    /// ([`communicator_buffers`]); NCCL's are NCCL's.
    pub fn buffers(&self) -> Buffers {
        match self.kind {
            // Two halves (car's data buffer and its flags' allocation rounded to it: counted as two capacities), and
            // the two-shot's fixed input buffer, which its memcpy fills before the kernel.
            Kind::Car(car::Algo::TwoShot, _) => Buffers { capacities: 3, shm: 3 },
            Kind::Car(..) => Buffers { capacities: 2, shm: 2 },
            Kind::Symm(..) => Buffers { capacities: 1, shm: 0 },
            // Registered input and output, two staging halves; the IPC-staged ones keep the halves in /dev/shm.
            Kind::Tuned(_, Staging::Vmm, _) => Buffers { capacities: 4, shm: 0 },
            Kind::Tuned(_, Staging::Ipc, _) => Buffers { capacities: 4, shm: 2 },
            Kind::Nccl { .. } | Kind::Communicator => Buffers::default(),
        }
    }
}

/// What every communicator allocates per rank, as `Communicator::new` builds it: its engine (car's one-shot and
/// two-shot, the tuned designs), its reduce-scatter and its all-gather (car's).
pub fn communicator_buffers() -> Buffers {
    ["car_1shot", "car_2shot", "symm_2shot_tuned", "car_rs", "car_ag"]
        .into_iter()
        .map(|m| lookup(m).expect("registered").buffers())
        .fold(Buffers::default(), |a, b| a + b)
}

/// The row of a method name without a launch shape.
pub fn lookup(name: &str) -> Option<&'static Method> {
    METHODS.iter().find(|m| m.name == name)
}

/// The ablation variants: all allreduce, none in the default sweep.
pub fn ablations() -> impl Iterator<Item = &'static str> {
    METHODS.iter().filter(|m| m.role == Role::Ablation).map(|m| m.name)
}

/// What the variants are compared with.
const BASELINES: &[&str] = &[
    "car_1shot",
    "car_2shot",
    "symm_1shot",
    "symm_2shot",
    "symm_epoch_1shot",
    "symm_zc_1shot",
    "symm_zc_2shot",
    "symm_zc_2shot_push",
    "symm_zc_2shot_pull",
    "symm_zc_2shot_ll",
    "symm_ll",
];

/// car's ablation variants, torch's fused two-shot and the zero-copy designs' fused copy-in (the ablation study's
/// variants).
const VARIANTS: &[&str] = &[
    "car_1shot_vmm",
    "car_1shot_cas",
    "car_1shot_round",
    "car_1shot_ptrtable",
    "car_1shot_push",
    "car_1shot_oneblock",
    "car_2shot_3bar",
    "symm_2shot_fused",
    "symm_zc_1shot_fusedcopy",
    "symm_zc_2shot_fusedcopy",
    "symm_zc_2shot_pull_memcpy",
];

/// The staging comparison: car on VMM memory and by push, the tuned designs on VMM and on IPC staging.
const STAGING: &[&str] = &[
    "car_1shot",
    "car_1shot_vmm",
    "car_1shot_push",
    "symm_epoch_1shot",
    "symm_zc_1shot",
    "symm_zc_2shot",
    "symm_1shot_tuned",
    "symm_2shot_tuned",
    "symm_epoch_1shot_ipc",
    "symm_zc_1shot_ipc",
    "symm_zc_2shot_ipc",
    "symm_1shot_tuned_ipc",
    "symm_2shot_tuned_ipc",
];

/// The launch-shape sweep (`METHOD@BLOCKSxTHREADS`).
const SHAPES: &[&str] = &[
    "car_1shot",
    "car_1shot@1x512",
    "car_1shot@4x512",
    "car_1shot@16x512",
    "car_1shot@64x512",
    "car_1shot@16x128",
    "car_1shot@16x1024",
    "car_2shot",
    "car_2shot@8x512",
    "car_2shot@64x512",
    "symm_1shot@4x512",
    "symm_1shot@64x512",
];

/// `--methods` keywords, each standing for the methods of its lists: the ablation study (the variants and what
/// they are compared with), the staging comparison and the launch-shape sweep.
pub const GROUPS: &[(&str, &[&[&str]])] =
    &[("ablation", &[BASELINES, VARIANTS]), ("staging", &[STAGING]), ("shapes", &[SHAPES])];

/// `names` with every group keyword replaced by its methods (first mention kept).
pub fn expand(names: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in names {
        let members = GROUPS
            .iter()
            .find(|g| g.0 == n)
            .map_or_else(|| vec![n.clone()], |g| g.1.iter().flat_map(|l| l.iter()).map(|m| m.to_string()).collect());
        for m in members {
            if !out.contains(&m) {
                out.push(m);
            }
        }
    }
    out
}

/// A method name and the launch shape asked for with `@GRIDxTHREADS`, if any.
fn split_shape(name: &str) -> Result<(&str, Option<LaunchRule>), String> {
    match name.split_once('@') {
        None => Ok((name, None)),
        Some((base, shape)) => Ok((base, Some(LaunchRule::parse_fixed(shape)?))),
    }
}

/// Every method of `op` in the default sweep: comm_bench.py's, in its column order, then ours.
pub fn defaults(op: Op) -> Vec<&'static str> {
    METHODS.iter().filter(|m| m.op == op && m.role == Role::Default).map(|m| m.name).collect()
}

/// The methods of `op` that fill comm_bench.py's columns, in its column order.
pub fn csv_methods(op: Op) -> Vec<&'static str> {
    METHODS.iter().filter(|m| m.op == op && m.csv.is_some()).map(|m| m.name).collect()
}

/// The comm_bench.py column stems of `op`, in order.
pub fn csv_columns(op: Op) -> Vec<&'static str> {
    METHODS.iter().filter(|m| m.op == op).filter_map(|m| m.csv).collect()
}

/// The comm_bench.py column that `method` fills.
pub fn csv_column(method: &str) -> Option<&'static str> {
    lookup(method).and_then(|m| m.csv)
}

/// A method name parsed: its row and the launch shape asked for, if any. Unknown names (and shapes on methods that
/// take none) are refused with what is known.
pub fn parse(name: &str) -> Result<(&'static Method, Option<LaunchRule>), String> {
    let (base, shape) = split_shape(name)?;
    let m = lookup(base).ok_or_else(|| {
        let known: Vec<&str> = METHODS.iter().map(|m| m.name).collect();
        let groups: Vec<&str> = GROUPS.iter().map(|g| g.0).collect();
        format!(
            "unknown method {name:?}; known: {}; groups: {}; car_* and one-kernel symm methods take @BLOCKSxTHREADS",
            known.join(", "),
            groups.join(", ")
        )
    })?;
    if shape.is_some() && !takes_shape(m) {
        let shaped: Vec<&str> = METHODS.iter().filter(|m| takes_shape(m)).map(|m| m.name).collect();
        return Err(format!("{name}: launch shapes (@BLOCKSxTHREADS) apply to {} only", shaped.join(", ")));
    }
    Ok((m, shape))
}

/// The op a method runs.
pub fn op_of(name: &str) -> Result<Op, String> {
    parse(name).map(|(m, _)| m.op)
}

/// The memory a method needs per rank (by name; shapes ignored, unknown names none).
pub fn buffers_of(name: &str) -> Buffers {
    parse(name).map(|(m, _)| m.buffers()).unwrap_or_default()
}

/// Whether a method has one launch rule, which `@GRIDxTHREADS` replaces (the tuned `symm_1shot_tuned`,
/// `symm_2shot_tuned` and `auto` pick a kernel per size, so they take none).
fn takes_shape(m: &Method) -> bool {
    match m.kind {
        Kind::Car(..) | Kind::Symm(..) => true,
        Kind::Tuned(design, Staging::Vmm, _) => !matches!(design, Design::OneShotTuned | Design::TwoShotTuned),
        _ => false,
    }
}

/// How methods are built: their largest message and car's memory type.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    pub capacity_bytes: usize,
    /// car's buffers and flags uncached (fine-grained; ROCm's hipDeviceMallocUncached) or coarse-grained.
    pub car_uncached: bool,
}

/// Builds a method on `comm`'s device and ranks (`auto`: `comm`'s own calls). Collective: every rank calls it with
/// the same arguments, in the same order.
pub fn build<'a>(
    name: &str,
    comm: &'a Communicator,
    opts: &BuildOptions,
) -> Result<Box<dyn Collective + 'a>, CollectiveError> {
    let (m, rule) = parse(name).map_err(CollectiveError::BadArgs)?;
    with_team(comm, |team| build_kind(m, rule, team, comm, opts))
}

/// `f` given the team methods are built from on `comm`'s device and ranks (and told what its placement lacks).
pub fn with_team<R>(comm: &Communicator, f: impl FnOnce(Team<'_>) -> R) -> R {
    let why = comm.placement().missing_peer_atomics();
    f(Team::new(comm.gpu(), comm.rendezvous(), comm.device_shared_by()).with_missing_peer_atomics(why.as_deref()))
}

fn build_kind<'a>(
    m: &Method,
    rule: Option<LaunchRule>,
    team: Team<'_>,
    comm: &'a Communicator,
    opts: &BuildOptions,
) -> Result<Box<dyn Collective + 'a>, CollectiveError> {
    let capacity_bytes = opts.capacity_bytes;
    Ok(match m.kind {
        Kind::Car(algo, variant) => {
            let car_opts = car::CarOptions { capacity_bytes, uncached: opts.car_uncached, rule, variant };
            Box::new(car::Car::new(team, algo, car_opts)?)
        }
        Kind::Symm(algo, fused_copy_in) => {
            Box::new(symm::Symm::new(team, algo, symm::SymmOptions { capacity_bytes, rule, fused_copy_in })?)
        }
        Kind::Tuned(design, staging, copy_in) => {
            let tuned_opts = TunedOptions { capacity_bytes, staging, rule, first_epoch: 0, copy_in };
            Box::new(SymmTuned::new(team, design, tuned_opts)?)
        }
        // Under a watchdog, as torch runs NCCL (its steps get the set-up deadline, as across's): a stalled or lost
        // peer ends the run with an error, not a hang.
        Kind::Nccl { symmetric } => {
            let opts = nccl::NcclOptions { op: m.op, symmetric, capacity_bytes };
            Box::new(nccl::WatchedNccl::new(team, opts, comm.setup_timeout())?)
        }
        Kind::Communicator => Box::new(Public(comm)),
    })
}

/// The communicator's public allreduce as a method: each run is `Communicator::all_reduce` on the caller's stream,
/// checks included, as a program calls it.
struct Public<'a>(&'a Communicator);

impl Collective for Public<'_> {
    fn name(&self) -> &str {
        "auto"
    }

    fn op(&self) -> Op {
        Op::AllReduce
    }

    fn capacity_bytes(&self) -> usize {
        self.0.capacity_bytes()
    }

    fn registered_input(&self) -> Option<&DeviceBuffer> {
        Some(self.0.registered_input())
    }

    fn registered_output(&self) -> Option<&DeviceBuffer> {
        Some(self.0.registered_output())
    }

    fn last_design(&self) -> Option<String> {
        self.0.last_choice().map(|c| c.to_string())
    }

    fn failure(&self) -> Result<Option<(Vec<usize>, String)>, CollectiveError> {
        match self.0.check() {
            Err(allreduce::Error::Peer { ranks, what }) => Ok(Some((ranks, what))),
            _ => Ok(None),
        }
    }

    unsafe fn run(&mut self, call: &Call, stream: &Stream) -> Result<(), CollectiveError> {
        let (input, output, count, dtype) = (call.input(), call.output(), call.count(), call.dtype());
        // SAFETY: the caller's contract; `stream` is a live stream of the communicator's device.
        unsafe { self.0.all_reduce(input, output, count, dtype, stream.handle()) }.map(|_| ()).map_err(|e| match e {
            allreduce::Error::Collective(c) => c,
            allreduce::Error::Call(c) => CollectiveError::Call(c),
            allreduce::Error::Gpu(g) => CollectiveError::Gpu(g),
            allreduce::Error::Ipc(i) => CollectiveError::Ipc(i),
            allreduce::Error::Mismatch(m) => CollectiveError::Mismatch(m),
            allreduce::Error::Unsupported(u) => CollectiveError::Unsupported(u),
            other => CollectiveError::BadArgs(other.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_match_comm_bench_py() {
        assert_eq!(csv_columns(Op::AllReduce), ["fbgemm_1shot", "symm_1shot", "fbgemm_2shot", "symm_2shot", "nccl"]);
        assert_eq!(csv_columns(Op::ReduceScatter), ["fbgemm_rs", "symm_rs", "nccl_rs"]);
        assert_eq!(csv_columns(Op::AllGather), ["fbgemm_ag", "nccl_ag"]);
        assert!(op_of("car_9shot").unwrap_err().contains("car_1shot"));
    }

    /// The names here are the ones the crates give their own variants, one row each.
    #[test]
    fn every_row_is_named_as_its_crate_names_it_once() {
        for (i, m) in METHODS.iter().enumerate() {
            assert!(METHODS[..i].iter().all(|o| o.name != m.name), "{} twice", m.name);
            let own = match m.kind {
                Kind::Car(algo, variant) => variant.method(algo),
                Kind::Symm(algo, fused) => symm::method_name(algo, fused),
                Kind::Tuned(design, staging, copy_in) => symm::tuned::method_name(design, staging, copy_in),
                Kind::Nccl { .. } | Kind::Communicator => Some(m.name),
            };
            assert_eq!(own, Some(m.name), "{m:?}");
        }
        for algo in [Car1, Car2, CarRs, CarAg] {
            for v in car::Variant::ALL {
                if let Some(name) = v.method(algo) {
                    assert!(lookup(name).is_some(), "car's {name} has no row");
                }
            }
        }
    }

    #[test]
    fn ablations_shapes_and_groups_resolve() {
        for name in ablations() {
            assert_eq!(op_of(name), Ok(Op::AllReduce), "{name}");
            assert!(!defaults(Op::AllReduce).contains(&name));
        }
        assert!(expand(&["ablation".into()]).contains(&"symm_2shot_fused".to_string()));
        for (group, lists) in GROUPS {
            for m in lists.iter().flat_map(|l| l.iter()) {
                assert!(op_of(m).is_ok(), "{group}: {m}");
                assert_ne!(parse(m).unwrap().0.role, Role::Broken, "{group}: {m}");
            }
        }
        assert_eq!(op_of("car_rs@8x256"), Ok(Op::ReduceScatter));
        assert_eq!(op_of("car_ag@8x256"), Ok(Op::AllGather));
        assert_eq!(op_of("symm_ll@8x256"), Ok(Op::AllReduce));
        assert!(op_of("symm_1shot_tuned@8x256").unwrap_err().contains("launch shapes"));
        assert!(op_of("auto@8x256").unwrap_err().contains("launch shapes"));
        assert!(op_of("car_1shot@8x100").unwrap_err().contains("multiple of 32"));
        assert_eq!(csv_column("car_1shot@8x512"), None);
        let e = expand(&["car_1shot".into(), "shapes".into()]);
        assert_eq!(e[0], "car_1shot");
        assert_eq!(e.iter().filter(|m| *m == "car_1shot").count(), 1);
        assert!(e.contains(&"car_1shot@64x512".to_string()));
    }

    #[test]
    fn buffers_count_what_each_builds() {
        // Communicator::new: car's one-shot, two-shot, reduce-scatter and all-gather (two IPC halves each, and the
        // two-shot's fixed input buffer) and the tuned designs' four buffers.
        assert_eq!(communicator_buffers(), Buffers { capacities: 13, shm: 9 });
        assert_eq!(buffers_of("car_1shot@16x512"), Buffers { capacities: 2, shm: 2 });
        assert_eq!(buffers_of("car_2shot@8x512"), Buffers { capacities: 3, shm: 3 });
        assert_eq!(buffers_of("car_2shot_3bar"), Buffers { capacities: 3, shm: 3 });
        assert_eq!(buffers_of("symm_zc_2shot_ipc"), Buffers { capacities: 4, shm: 2 });
        assert_eq!(buffers_of("symm_2shot_fused"), Buffers { capacities: 1, shm: 0 });
        assert_eq!(buffers_of("auto"), Buffers::default());
        assert_eq!(lookup("communicator").map(|m| m.name), None, "auto is the communicator's own calls");
    }
}
