//! The registry of methods by name, for benchmarks and studies: comm-bench knows implementations only through it and
//! the [`Collective`] trait. A program calls [`crate::Communicator`], which picks among them itself.

use crate::engine::Engine;
use crate::tune::Tables;
use collective_core::{Collective, CollectiveError, LaunchRule, Op, Team};
use symm::tuned::{Design, Staging, SymmTuned, TunedOptions};

/// Every method, with the op it runs and the comm_bench.py column it fills (if any).
pub const METHODS: &[(&str, Op, Option<&str>)] = &[
    ("car_1shot", Op::AllReduce, Some("fbgemm_1shot")),
    ("symm_1shot", Op::AllReduce, Some("symm_1shot")),
    ("car_2shot", Op::AllReduce, Some("fbgemm_2shot")),
    ("symm_2shot", Op::AllReduce, Some("symm_2shot")),
    ("nccl", Op::AllReduce, Some("nccl")),
    ("auto", Op::AllReduce, None),
    ("communicator", Op::AllReduce, None),
    ("symm_1shot_tuned", Op::AllReduce, None),
    ("symm_2shot_tuned", Op::AllReduce, None),
    ("symm_ll", Op::AllReduce, None),
    ("symm_epoch_1shot", Op::AllReduce, None),
    ("symm_zc_1shot", Op::AllReduce, None),
    ("symm_zc_2shot", Op::AllReduce, None),
    ("symm_zc_2shot_ll", Op::AllReduce, None),
    ("nccl_symm", Op::AllReduce, None),
    ("car_rs", Op::ReduceScatter, Some("fbgemm_rs")),
    ("symm_rs", Op::ReduceScatter, Some("symm_rs")),
    ("nccl_rs", Op::ReduceScatter, Some("nccl_rs")),
    ("nccl_symm_rs", Op::ReduceScatter, None),
];

/// car's ablation variants (`car::Variant`), each one factor of car changed.
pub const CAR_VARIANTS: &[&str] = &[
    "car_1shot_vmm",
    "car_1shot_cas",
    "car_1shot_round",
    "car_1shot_ptrtable",
    "car_1shot_push",
    "car_1shot_oneblock",
    "car_2shot_3bar",
];

/// torch's symm variants: two-shot with its copy-in fused into the kernel instead of a separate memcpy.
pub const SYMM_VARIANTS: &[&str] = &["symm_2shot_fused"];

/// The tuned designs with their staging buffer and flags in classic IPC memory (`symm::tuned::Staging::Ipc`).
pub const IPC_STAGED: &[&str] =
    &["symm_epoch_1shot_ipc", "symm_zc_1shot_ipc", "symm_zc_2shot_ipc", "symm_1shot_tuned_ipc", "symm_2shot_tuned_ipc"];

/// Deliberately broken protocols (host driver only), which the benchmark's checks must fail: never in a group.
pub const BROKEN: &[&str] = &["car_1shot_broken_samehalf"];

/// The ablation variants: all allreduce, none in the default sweep.
pub const ABLATIONS: &[&[&str]] = &[CAR_VARIANTS, SYMM_VARIANTS, IPC_STAGED];

/// What the variants are compared with.
const BASELINES: &[&str] = &[
    "car_1shot",
    "car_2shot",
    "symm_1shot",
    "symm_2shot",
    "symm_epoch_1shot",
    "symm_zc_1shot",
    "symm_zc_2shot",
    "symm_zc_2shot_ll",
    "symm_ll",
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
pub const GROUPS: &[(&str, &[&[&str]])] = &[
    ("ablation", &[BASELINES, CAR_VARIANTS, SYMM_VARIANTS]),
    ("staging", &[STAGING, IPC_STAGED]),
    ("shapes", &[SHAPES]),
];

fn is_ablation(name: &str) -> bool {
    ABLATIONS.iter().any(|list| list.contains(&name)) || BROKEN.contains(&name)
}

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

/// Every method of `op`: comm_bench.py's, in its column order, then ours.
pub fn defaults(op: Op) -> Vec<&'static str> {
    METHODS.iter().filter(|m| m.1 == op).map(|m| m.0).collect()
}

/// The methods of `op` that fill comm_bench.py's columns, in its column order.
pub fn csv_methods(op: Op) -> Vec<&'static str> {
    METHODS.iter().filter(|m| m.1 == op && m.2.is_some()).map(|m| m.0).collect()
}

/// The comm_bench.py column stems of `op`, in order.
pub fn csv_columns(op: Op) -> Vec<&'static str> {
    METHODS.iter().filter(|m| m.1 == op).filter_map(|m| m.2).collect()
}

/// The comm_bench.py column that `method` fills.
pub fn csv_column(method: &str) -> Option<&'static str> {
    METHODS.iter().find(|m| m.0 == method).and_then(|m| m.2)
}

/// The op a method runs; unknown names (and shapes on methods that take none) are refused with what is known.
pub fn op_of(name: &str) -> Result<Op, String> {
    let (base, shape) = split_shape(name)?;
    if shape.is_some() && !takes_shape(base) {
        return Err(format!("{name}: launch shapes (@BLOCKSxTHREADS) apply to car_* and {} only", SHAPED.join(", ")));
    }
    if is_ablation(base) {
        return Ok(Op::AllReduce);
    }
    METHODS.iter().find(|m| m.0 == base).map(|m| m.1).ok_or_else(|| {
        let known: Vec<&str> =
            METHODS.iter().map(|m| m.0).chain(ABLATIONS.iter().flat_map(|l| l.iter().copied())).collect();
        let groups: Vec<&str> = GROUPS.iter().map(|g| g.0).collect();
        format!(
            "unknown method {name:?}; known: {}; groups: {}; car_* and one-kernel symm methods take @BLOCKSxTHREADS",
            known.join(", "),
            groups.join(", ")
        )
    })
}

/// Whether a method has one launch rule, which `@GRIDxTHREADS` replaces (the tuned `symm_1shot_tuned`,
/// `symm_2shot_tuned` and `auto` pick a kernel per size, so they take none).
fn takes_shape(base: &str) -> bool {
    base.starts_with("car_") || SHAPED.contains(&base)
}

/// The symm methods, besides car's, that run one kernel and so take a launch shape.
const SHAPED: &[&str] = &[
    "symm_1shot",
    "symm_2shot",
    "symm_2shot_fused",
    "symm_rs",
    "symm_ll",
    "symm_epoch_1shot",
    "symm_zc_1shot",
    "symm_zc_2shot",
    "symm_zc_2shot_ll",
];

/// How methods are built: their largest message, auto's tables (eager, graph), and car's memory type.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    pub capacity_bytes: usize,
    pub tables: Tables,
    /// car's buffers and flags uncached (fine-grained; ROCm's hipDeviceMallocUncached) or coarse-grained.
    pub car_uncached: bool,
}

/// Builds a method. Collective: every rank calls it with the same arguments, in the same order.
pub fn build(name: &str, team: Team<'_>, opts: &BuildOptions) -> Result<Box<dyn Collective>, CollectiveError> {
    let capacity_bytes = opts.capacity_bytes;
    op_of(name).map_err(CollectiveError::BadArgs)?;
    let (base, rule) = split_shape(name).map_err(CollectiveError::BadArgs)?;
    let car_variant = |algo, variant| -> Result<Box<dyn Collective>, CollectiveError> {
        let opts = car::CarOptions { capacity_bytes, uncached: opts.car_uncached, rule, variant };
        Ok(Box::new(car::Car::new(team, algo, opts)?))
    };
    let car = |algo| car_variant(algo, car::Variant::Base);
    let symm_variant = |algo, fused_copy_in| -> Result<Box<dyn Collective>, CollectiveError> {
        let opts = symm::SymmOptions { capacity_bytes, rule, fused_copy_in };
        Ok(Box::new(symm::Symm::new(team, algo, opts)?))
    };
    let symm = |algo| symm_variant(algo, false);
    let tuned_on = |design, staging| -> Result<Box<dyn Collective>, CollectiveError> {
        Ok(Box::new(SymmTuned::new(team, design, TunedOptions { capacity_bytes, staging, rule, first_epoch: 0 })?))
    };
    let tuned = |design| tuned_on(design, Staging::Vmm);
    if let Some((algo, variant)) = car_ablation(base) {
        return car_variant(algo, variant);
    }
    match base {
        "car_1shot" => car(car::Algo::OneShot),
        "car_2shot" => car(car::Algo::TwoShot),
        "car_rs" => car(car::Algo::ReduceScatter),
        "symm_1shot" => symm(symm::Algo::OneShot),
        "symm_2shot" => symm(symm::Algo::TwoShot),
        "symm_2shot_fused" => symm_variant(symm::Algo::TwoShot, true),
        "symm_rs" => symm(symm::Algo::ReduceScatter),
        "auto" => Ok(Box::new(Engine::new(team, capacity_bytes, opts.tables.clone())?)),
        "symm_1shot_tuned" => tuned(Design::OneShotTuned),
        "symm_2shot_tuned" => tuned(Design::TwoShotTuned),
        "symm_ll" => tuned(Design::Ll),
        "symm_epoch_1shot" => tuned(Design::EpochOneShot),
        "symm_zc_1shot" => tuned(Design::ZeroCopyOneShot),
        "symm_zc_2shot" => tuned(Design::ZeroCopyTwoShot),
        "symm_zc_2shot_ll" => tuned(Design::ZeroCopyTwoShotLl),
        "symm_epoch_1shot_ipc" => tuned_on(Design::EpochOneShot, Staging::Ipc),
        "symm_zc_1shot_ipc" => tuned_on(Design::ZeroCopyOneShot, Staging::Ipc),
        "symm_zc_2shot_ipc" => tuned_on(Design::ZeroCopyTwoShot, Staging::Ipc),
        "symm_1shot_tuned_ipc" => tuned_on(Design::OneShotTuned, Staging::Ipc),
        "symm_2shot_tuned_ipc" => tuned_on(Design::TwoShotTuned, Staging::Ipc),
        "nccl" | "nccl_symm" | "nccl_rs" | "nccl_symm_rs" => {
            let op = op_of(name).map_err(CollectiveError::BadArgs)?;
            let opts = nccl::NcclOptions { op, symmetric: name.contains("symm"), capacity_bytes };
            Ok(Box::new(nccl::Nccl::new(team, opts)?))
        }
        "communicator" => Err(CollectiveError::BadArgs(
            "communicator is a Communicator's own call path: time it through Communicator::split".into(),
        )),
        other => Err(CollectiveError::BadArgs(op_of(other).err().unwrap_or_default())),
    }
}

/// The car variant an ablation name stands for.
fn car_ablation(name: &str) -> Option<(car::Algo, car::Variant)> {
    [car::Algo::OneShot, car::Algo::TwoShot].into_iter().find_map(|algo| {
        car::Variant::ALL
            .into_iter()
            .filter(|&v| v != car::Variant::Base)
            .find(|v| v.method(algo) == Some(name))
            .map(|v| (algo, v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_match_comm_bench_py() {
        assert_eq!(csv_columns(Op::AllReduce), ["fbgemm_1shot", "symm_1shot", "fbgemm_2shot", "symm_2shot", "nccl"]);
        assert_eq!(csv_columns(Op::ReduceScatter), ["fbgemm_rs", "symm_rs", "nccl_rs"]);
        assert!(op_of("car_9shot").unwrap_err().contains("car_1shot"));
    }

    #[test]
    fn ablations_shapes_and_groups_resolve() {
        for name in ABLATIONS.iter().flat_map(|l| l.iter()) {
            assert_eq!(op_of(name), Ok(Op::AllReduce), "{name}");
            assert!(!defaults(Op::AllReduce).contains(name));
        }
        for name in CAR_VARIANTS {
            assert!(car_ablation(name).is_some(), "{name} has no car variant");
        }
        assert_eq!(symm::method_name(symm::Algo::TwoShot, true), Some(SYMM_VARIANTS[0]));
        assert!(expand(&["ablation".into()]).contains(&SYMM_VARIANTS[0].to_string()));
        for (group, lists) in GROUPS {
            for m in lists.iter().flat_map(|l| l.iter()) {
                assert!(op_of(m).is_ok(), "{group}: {m}");
            }
        }
        assert_eq!(op_of("car_rs@8x256"), Ok(Op::ReduceScatter));
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
}
