//! `auto`: per message size, the method a table measured on this machine says is fastest. `comm-bench --tune FILE`
//! measures the candidates and writes the table; `--tune_table FILE` hands it to `auto`. Without a table, `auto`
//! uses [`TuneTable::default`]: the table `--tune` wrote on one H200 with 8 ranks under MPS, committed as
//! results/h200-mps/tune.json.

use crate::report::{Row, Status};
use collective::{Collective, CollectiveError, DType, Op};
use gpu::{DeviceBuffer, DevicePtr, Gpu, Stream};
use ipc::Rendezvous;
use serde::{Deserialize, Serialize};
use symm::tuned::{Design, SymmTuned, TunedOptions};

/// The methods `auto` chooses among (and `--tune` measures).
pub const CANDIDATES: &[&str] =
    &["car_1shot", "car_2shot", "symm_ll", "symm_epoch_1shot", "symm_zc_1shot", "symm_zc_2shot_ll", "symm_zc_2shot"];

/// One size range: messages of at most `max_bytes` (the last entry: any size) run `method`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneEntry {
    pub max_bytes: Option<usize>,
    pub method: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneTable {
    /// Where it was measured, for the reader.
    pub measured_on: String,
    pub entries: Vec<TuneEntry>,
}

/// The built-in table, as `comm-bench --tune` measured it (graph mode).
const MEASURED_ON_H200: &str = include_str!("../../../results/h200-mps/tune.json");

impl Default for TuneTable {
    fn default() -> TuneTable {
        serde_json::from_str(MEASURED_ON_H200).expect("results/h200-mps/tune.json is a tune table (tested)")
    }
}

impl TuneTable {
    pub fn load(path: &std::path::Path) -> Result<TuneTable, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("tune table {}: {e}", path.display()))?;
        let table: TuneTable =
            serde_json::from_str(&text).map_err(|e| format!("tune table {}: {e}", path.display()))?;
        table.validate().map_err(|e| format!("tune table {}: {e}", path.display()))?;
        Ok(table)
    }

    fn validate(&self) -> Result<(), String> {
        if self.entries.is_empty() {
            return Err("no entries".into());
        }
        if let Some(e) = self.entries.iter().find(|e| !CANDIDATES.contains(&e.method.as_str())) {
            return Err(format!("{} is not one of auto's candidates {CANDIDATES:?}", e.method));
        }
        Ok(())
    }

    /// The method for a message of `bytes`: the first range that holds it, else the last.
    pub fn pick(&self, bytes: usize) -> &str {
        let hit = self.entries.iter().find(|e| e.max_bytes.is_none_or(|m| bytes <= m));
        &hit.unwrap_or(self.entries.last().expect("validated: not empty")).method
    }

    /// The fastest passed candidate per size of a sweep, neighbouring sizes with the same winner merged.
    pub fn from_rows(rows: &[Row], measured_on: String) -> Result<TuneTable, String> {
        let mut sizes: Vec<usize> = rows.iter().map(|r| r.bytes).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let mut entries: Vec<TuneEntry> = Vec::new();
        for bytes in sizes {
            let best = rows
                .iter()
                .filter(|r| r.bytes == bytes && r.status == Status::Passed && CANDIDATES.contains(&r.method.as_str()))
                .filter_map(|r| r.time_ms.map(|t| (t, &r.method)))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            let Some((_, method)) = best else { continue };
            match entries.last_mut() {
                Some(last) if &last.method == method => last.max_bytes = Some(bytes),
                _ => entries.push(TuneEntry { max_bytes: Some(bytes), method: method.clone() }),
            }
        }
        let last = entries.last_mut().ok_or("no candidate passed at any size")?;
        last.max_bytes = None;
        Ok(TuneTable { measured_on, entries })
    }
}

/// The `auto` method: car and tuned symm instances, dispatched per size.
pub struct Auto {
    table: TuneTable,
    car_1shot: car::Car,
    car_2shot: car::Car,
    symm: SymmTuned,
}

impl Auto {
    /// Builds every candidate. Collective: every rank calls it with the same table.
    pub fn new(gpu: &Gpu, rdv: &Rendezvous, capacity_bytes: usize, table: TuneTable) -> Result<Auto, CollectiveError> {
        let car = |algo| {
            car::Car::new(
                gpu,
                rdv,
                algo,
                car::CarOptions { capacity_bytes, uncached: true, rule: None, variant: car::Variant::Base },
            )
        };
        Ok(Auto {
            table,
            car_1shot: car(car::Algo::OneShot)?,
            car_2shot: car(car::Algo::TwoShot)?,
            symm: SymmTuned::new(gpu, rdv, Design::TwoShotTuned, TunedOptions::new(capacity_bytes))?,
        })
    }
}

impl Collective for Auto {
    fn name(&self) -> &str {
        "auto"
    }

    fn op(&self) -> Op {
        Op::AllReduce
    }

    fn capacity_bytes(&self) -> usize {
        self.symm.capacity_bytes()
    }

    fn registered_input(&self) -> Option<&DeviceBuffer> {
        self.symm.registered_input()
    }

    fn registered_output(&self) -> Option<&DeviceBuffer> {
        self.symm.registered_output()
    }

    fn run(
        &mut self,
        op: Op,
        dtype: DType,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        stream: &Stream,
    ) -> Result<(), CollectiveError> {
        self.supports(op, dtype).map_err(CollectiveError::Unsupported)?;
        match self.table.pick(count * dtype.size()) {
            "car_1shot" => self.car_1shot.run(op, dtype, input, output, count, stream),
            "car_2shot" => self.car_2shot.run(op, dtype, input, output, count, stream),
            "symm_ll" if count * dtype.size() <= symm::tuned::LL_MAX_BYTES => {
                self.symm.run_design(Design::Ll, dtype, input, output, count, stream)
            }
            "symm_epoch_1shot" => self.symm.run_design(Design::EpochOneShot, dtype, input, output, count, stream),
            "symm_zc_2shot_ll" if count * dtype.size() <= self.symm.capacity_for(Design::ZeroCopyTwoShotLl) => {
                self.symm.run_design(Design::ZeroCopyTwoShotLl, dtype, input, output, count, stream)
            }
            "symm_ll" | "symm_zc_1shot" => {
                self.symm.run_design(Design::ZeroCopyOneShot, dtype, input, output, count, stream)
            }
            _ => self.symm.run_design(Design::ZeroCopyTwoShot, dtype, input, output, count, stream),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{BenchArgs, Cli};
    use clap::Parser;

    fn args() -> BenchArgs {
        Cli::try_parse_from(["comm-bench"]).unwrap().bench
    }

    #[test]
    fn picks_by_range_and_falls_through_to_the_last() {
        let e = |max_bytes: Option<usize>, m: &str| TuneEntry { max_bytes, method: m.into() };
        let t = TuneTable {
            measured_on: "test".into(),
            entries: vec![e(Some(1000), "symm_ll"), e(Some(5000), "symm_epoch_1shot"), e(Some(9000), "car_2shot")],
        };
        assert_eq!(t.pick(16), "symm_ll");
        assert_eq!(t.pick(1000), "symm_ll");
        assert_eq!(t.pick(1001), "symm_epoch_1shot");
        assert_eq!(t.pick(9000), "car_2shot");
        assert_eq!(t.pick(1 << 30), "car_2shot", "past the last range: the last entry");
    }

    #[test]
    fn the_built_in_table_is_the_committed_measurement() {
        let t = TuneTable::default();
        t.validate().unwrap();
        assert!(t.measured_on.contains("H200"), "{}", t.measured_on);
        assert_eq!(t.entries.last().unwrap().max_bytes, None, "the last range takes every larger message");
        let bounds: Vec<usize> = t.entries.iter().filter_map(|e| e.max_bytes).collect();
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "ranges ascend: {bounds:?}");
    }

    #[test]
    fn from_rows_takes_the_fastest_passed_candidate_and_merges_ranges() {
        let a = args();
        let row = |m: &str, n: usize, t: f64, ok: bool| {
            let s = if ok { Status::Passed } else { Status::Failed("x".into()) };
            let r = Row::new(m, &a, n, 8, s);
            if ok {
                r.timed(vec![t], t)
            } else {
                r
            }
        };
        let rows = vec![
            row("car_1shot", 1024, 0.008, true),
            row("symm_ll", 1024, 0.007, true),
            row("symm_ll", 2048, 0.001, false),
            row("car_1shot", 2048, 0.009, true),
            row("car_1shot", 4096, 0.010, true),
            row("symm_zc_2shot", 4096, 0.011, true),
            row("symm_zc_2shot", 8192, 0.012, true),
            row("symm_2shot", 8192, 0.001, true),
        ];
        let t = TuneTable::from_rows(&rows, "test".into()).unwrap();
        let got: Vec<(Option<usize>, &str)> = t.entries.iter().map(|e| (e.max_bytes, e.method.as_str())).collect();
        assert_eq!(got, vec![(Some(2048), "symm_ll"), (Some(8192), "car_1shot"), (None, "symm_zc_2shot")]);
        assert!(TuneTable { measured_on: String::new(), entries: vec![] }.validate().is_err());
    }
}
