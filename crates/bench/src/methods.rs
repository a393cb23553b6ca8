//! The registry of methods by name: the benchmark knows implementations only through it and the
//! [`Collective`] trait.

use crate::auto::{Auto, TuneTable};
use collective::{Collective, CollectiveError, Op};
use gpu::Gpu;
use ipc::Rendezvous;
use symm::tuned::{Design, SymmTuned, TunedOptions};

/// Every method, with the op it runs and the comm_bench.py column it fills (if any).
pub const METHODS: &[(&str, Op, Option<&str>)] = &[
    ("car_1shot", Op::AllReduce, Some("fbgemm_1shot")),
    ("symm_1shot", Op::AllReduce, Some("symm_1shot")),
    ("car_2shot", Op::AllReduce, Some("fbgemm_2shot")),
    ("symm_2shot", Op::AllReduce, Some("symm_2shot")),
    ("nccl", Op::AllReduce, Some("nccl")),
    ("auto", Op::AllReduce, None),
    ("symm_1shot_tuned", Op::AllReduce, None),
    ("symm_2shot_tuned", Op::AllReduce, None),
    ("symm_ll", Op::AllReduce, None),
    ("symm_epoch_1shot", Op::AllReduce, None),
    ("symm_zc_1shot", Op::AllReduce, None),
    ("symm_zc_2shot", Op::AllReduce, None),
    ("nccl_symm", Op::AllReduce, None),
    ("car_rs", Op::ReduceScatter, Some("fbgemm_rs")),
    ("symm_rs", Op::ReduceScatter, Some("symm_rs")),
    ("nccl_rs", Op::ReduceScatter, Some("nccl_rs")),
    ("nccl_symm_rs", Op::ReduceScatter, None),
];

/// Every method of `op`: comm_bench.py's, in its column order, then ours.
pub fn defaults(op: Op) -> Vec<&'static str> {
    METHODS.iter().filter(|m| m.1 == op).map(|m| m.0).collect()
}

/// The comm_bench.py column stems of `op`, in order.
pub fn csv_columns(op: Op) -> Vec<&'static str> {
    METHODS.iter().filter(|m| m.1 == op).filter_map(|m| m.2).collect()
}

/// The comm_bench.py column that `method` fills.
pub fn csv_column(method: &str) -> Option<&'static str> {
    METHODS.iter().find(|m| m.0 == method).and_then(|m| m.2)
}

/// The op a method runs; unknown names are refused with the list of known ones.
pub fn op_of(name: &str) -> Result<Op, String> {
    METHODS.iter().find(|m| m.0 == name).map(|m| m.1).ok_or_else(|| {
        let known: Vec<&str> = METHODS.iter().map(|m| m.0).collect();
        format!("unknown method {name:?}; known: {}", known.join(", "))
    })
}

/// How methods are built: their largest message, auto's table, and car's memory type.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    pub capacity_bytes: usize,
    pub tune: TuneTable,
    /// car's buffers and flags uncached (fine-grained; ROCm's hipDeviceMallocUncached) or coarse-grained.
    pub car_uncached: bool,
}

impl BuildOptions {
    pub fn new(capacity_bytes: usize) -> BuildOptions {
        BuildOptions { capacity_bytes, tune: TuneTable::default(), car_uncached: true }
    }
}

/// Builds a method. Collective: every rank calls it with the same arguments, in the same order.
pub fn build(
    name: &str,
    gpu: &Gpu,
    rdv: &Rendezvous,
    opts: &BuildOptions,
) -> Result<Box<dyn Collective>, CollectiveError> {
    let capacity_bytes = opts.capacity_bytes;
    let car = |algo| -> Result<Box<dyn Collective>, CollectiveError> {
        let opts = car::CarOptions { capacity_bytes, uncached: opts.car_uncached, rule: None };
        Ok(Box::new(car::Car::new(gpu, rdv, algo, opts)?))
    };
    let symm = |algo| -> Result<Box<dyn Collective>, CollectiveError> {
        let opts = symm::SymmOptions { capacity_bytes, rule: None };
        Ok(Box::new(symm::Symm::new(gpu, rdv, algo, opts)?))
    };
    let tuned = |design| -> Result<Box<dyn Collective>, CollectiveError> {
        Ok(Box::new(SymmTuned::new(gpu, rdv, design, TunedOptions { capacity_bytes })?))
    };
    match name {
        "car_1shot" => car(car::Algo::OneShot),
        "car_2shot" => car(car::Algo::TwoShot),
        "car_rs" => car(car::Algo::ReduceScatter),
        "symm_1shot" => symm(symm::Algo::OneShot),
        "symm_2shot" => symm(symm::Algo::TwoShot),
        "symm_rs" => symm(symm::Algo::ReduceScatter),
        "auto" => Ok(Box::new(Auto::new(gpu, rdv, capacity_bytes, opts.tune.clone())?)),
        "symm_1shot_tuned" => tuned(Design::OneShotTuned),
        "symm_2shot_tuned" => tuned(Design::TwoShotTuned),
        "symm_ll" => tuned(Design::Ll),
        "symm_epoch_1shot" => tuned(Design::EpochOneShot),
        "symm_zc_1shot" => tuned(Design::ZeroCopyOneShot),
        "symm_zc_2shot" => tuned(Design::ZeroCopyTwoShot),
        "nccl" | "nccl_symm" | "nccl_rs" | "nccl_symm_rs" => {
            let op = op_of(name).map_err(CollectiveError::BadArgs)?;
            let opts = rccl::NcclOptions { op, symmetric: name.contains("symm"), capacity_bytes };
            Ok(Box::new(rccl::Nccl::new(gpu, rdv, opts)?))
        }
        other => Err(CollectiveError::BadArgs(op_of(other).err().unwrap_or_default())),
    }
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
}
