//! Tune tables: per message size, the algorithm measured fastest on one machine. A table is keyed by driver, device
//! name, world size, mode (eager launches or graph replays) and residency (where the call's buffers live, which
//! decides whether the zero-copy designs pay a copy); the communicator looks for its key in the per-user cache
//! directory, where [`crate::Communicator::tune`] and `comm-bench --tune` store what they measure, and falls back to
//! the driver's built-in set, saying which of its tables it took and why.

use crate::Error;
pub use collective_core::Mode;
use gpu::DriverKind;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

mod built_in;
use built_in::closest;
pub use built_in::{built_in, built_in_file, merge_built_in};

/// The algorithms a table chooses among, in the order `tune` measures them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    Car1Shot,
    Car2Shot,
    SymmLl,
    SymmEpoch1Shot,
    SymmZc1Shot,
    SymmZc2ShotLl,
    SymmZc2Shot,
    /// `SymmZc2Shot` whose copy-in of an input no peer maps is pushed into the shard owners' staging.
    SymmZc2ShotPush,
    /// `SymmZc2Shot` whose all-gather pulls every shard from its owner's staging into the caller's output.
    SymmZc2ShotPull,
    /// Reduce-scatter: car's first half of two-shot (the one reduce-scatter the communicator runs).
    CarReduceScatter,
    /// All-gather: car's copy-in and copies out (the one all-gather the communicator runs).
    CarAllGather,
}

impl Algorithm {
    /// The allreduce algorithms a tune table may name.
    pub const CANDIDATES: [Algorithm; 9] = [
        Algorithm::Car1Shot,
        Algorithm::Car2Shot,
        Algorithm::SymmLl,
        Algorithm::SymmEpoch1Shot,
        Algorithm::SymmZc1Shot,
        Algorithm::SymmZc2ShotLl,
        Algorithm::SymmZc2Shot,
        Algorithm::SymmZc2ShotPush,
        Algorithm::SymmZc2ShotPull,
    ];

    /// The method name comm-bench knows it by.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Car1Shot => "car_1shot",
            Algorithm::Car2Shot => "car_2shot",
            Algorithm::SymmLl => "symm_ll",
            Algorithm::SymmEpoch1Shot => "symm_epoch_1shot",
            Algorithm::SymmZc1Shot => "symm_zc_1shot",
            Algorithm::SymmZc2ShotLl => "symm_zc_2shot_ll",
            Algorithm::SymmZc2Shot => "symm_zc_2shot",
            Algorithm::SymmZc2ShotPush => "symm_zc_2shot_push",
            Algorithm::SymmZc2ShotPull => "symm_zc_2shot_pull",
            Algorithm::CarReduceScatter => "car_rs",
            Algorithm::CarAllGather => "car_ag",
        }
    }

    pub fn from_name(name: &str) -> Option<Algorithm> {
        let car_only = [Algorithm::CarReduceScatter, Algorithm::CarAllGather];
        Algorithm::CANDIDATES.into_iter().chain(car_only).find(|a| a.name() == name)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a table names for a size: an allreduce algorithm and, on a call with the residual add and RMSNorm, where
/// the norm runs: in the algorithm's kernel where its design carries it, or (`unfused`) after it, as the norm kernel
/// over its result on the same stream. On a plain call `unfused` changes nothing. A table writes it as the
/// algorithm's name, after [`Choice::UNFUSED`] for the unfused sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Choice {
    pub algorithm: Algorithm,
    pub unfused: bool,
}

impl Choice {
    /// How a table marks the unfused sequence.
    pub const UNFUSED: &'static str = "unfused:";

    /// `algorithm`, with the norm in its kernel where its design carries it.
    pub const fn of(algorithm: Algorithm) -> Choice {
        Choice { algorithm, unfused: false }
    }

    /// `algorithm`'s allreduce, then the norm kernel.
    pub const fn unfused(algorithm: Algorithm) -> Choice {
        Choice { algorithm, unfused: true }
    }

    /// The choice a table names `name`: a candidate allreduce, or one after [`Choice::UNFUSED`].
    pub fn from_name(name: &str) -> Option<Choice> {
        let (unfused, algo) = match name.strip_prefix(Choice::UNFUSED) {
            Some(algo) => (true, algo),
            None => (false, name),
        };
        let algorithm = Algorithm::from_name(algo).filter(|a| Algorithm::CANDIDATES.contains(a))?;
        Some(Choice { algorithm, unfused })
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.unfused {
            f.write_str(Choice::UNFUSED)?;
        }
        f.write_str(self.algorithm.name())
    }
}

pub use collective_core::{Residency, UnknownResidency};

/// The calls a table chooses for: plain allreduces, or allreduces with the residual add and RMSNorm
/// (`Call::with_add_rms_norm`), whose tables choose between the designs that carry the norm in their kernels and the
/// unfused sequence after any allreduce ([`Choice`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TableOp {
    #[default]
    AllReduce,
    AddRmsNorm,
}

impl TableOp {
    pub const ALL: [TableOp; 2] = [TableOp::AllReduce, TableOp::AddRmsNorm];

    fn is_all_reduce(&self) -> bool {
        *self == TableOp::AllReduce
    }

    /// The name of the cache files of this op's tables after the key's: norm tables are `-rms_norm`, since the tables
    /// written as `-norm` read a bare algorithm as whatever its design did with the norm then (their entries for
    /// designs that have carried the norm since would now run another kernel than the one measured).
    fn file_suffix(self) -> &'static str {
        match self {
            TableOp::AllReduce => "",
            TableOp::AddRmsNorm => "-rms_norm",
        }
    }
}

/// Which machine, job shape and call kind a table was measured for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TableKey {
    pub driver: String,
    pub device: String,
    pub world: usize,
    /// Ranks whose kernels shared each device (`Communicator::device_shared_by`): 1 where every rank has its own
    /// GPU; the world where ranks run under MPS on one GPU, where peers' buffers are local memory, not a link.
    pub ranks_per_device: usize,
    pub mode: Mode,
    pub residency: Residency,
    /// Absent in the file for plain allreduces (the tables written before norm calls had their own).
    #[serde(default, skip_serializing_if = "TableOp::is_all_reduce")]
    pub op: TableOp,
}

impl TableKey {
    pub fn new(
        driver: DriverKind,
        device: &str,
        (world, ranks_per_device): (usize, usize),
        mode: Mode,
        residency: Residency,
    ) -> TableKey {
        let (driver, device, op) = (driver.to_string(), device.to_string(), TableOp::AllReduce);
        TableKey { driver, device, world, ranks_per_device, mode, residency, op }
    }

    /// The same key for the calls of `op`.
    pub fn for_op(self, op: TableOp) -> TableKey {
        TableKey { op, ..self }
    }

    /// The cache file's name (the device name through [`file_safe`]).
    pub fn file_name(&self) -> String {
        let device = file_safe(&self.device);
        let (w, d, m, r) = (self.world, self.ranks_per_device, self.mode.name(), self.residency.name());
        format!("{}-{device}-w{w}-d{d}-{m}-{r}{}.json", self.driver, self.op.file_suffix())
    }
}

/// `name` fit for a file name: every character outside `[A-Za-z0-9.-]` becomes `_`.
pub fn file_safe(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect()
}

/// Writes `value` as JSON to `path` (its directory created), through a temporary file renamed into place, so a
/// concurrent reader never sees half of it.
pub fn store_json(path: &Path, value: &impl Serialize) -> Result<(), Error> {
    let err = |e: std::io::Error| Error::Tune(format!("writing tune table {}: {e}", path.display()));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let json = serde_json::to_string_pretty(value).expect("a table serialises");
    std::fs::write(&tmp, json).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

impl fmt::Display for TableKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (d, w, m, r) = (&self.device, self.world, self.mode.name(), self.residency.name());
        write!(f, "{} on {d}, {w} ranks ({} per device), {m}, {r} buffers", self.driver, self.ranks_per_device)?;
        if self.op == TableOp::AddRmsNorm {
            f.write_str(", allreduce + residual add + RMSNorm")?;
        }
        Ok(())
    }
}

/// One size range: messages of at most `max_bytes` (the last entry: any size) run `method` (a [`Choice`]'s name).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneEntry {
    pub max_bytes: Option<usize>,
    pub method: String,
}

/// A tune table as stored: its key (absent in a table written by hand, which a caller may name as the one table for
/// every call), a line for the reader, and the ranges.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneTable {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<TableKey>,
    pub measured_on: String,
    pub entries: Vec<TuneEntry>,
}

/// Where the table in use came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum TableSource {
    /// Measured on this machine and found in the cache directory.
    Cache(PathBuf),
    /// A file the caller named.
    File(PathBuf),
    /// The driver's built-in set (no table for this key was cached): where the set comes from, which job the
    /// table is used for, and what was measured where it differs ("its key matches" where nothing does).
    BuiltIn { what: &'static str, used_for: String, why: String },
}

impl fmt::Display for TableSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableSource::Cache(p) => write!(f, "tuned on this machine ({})", p.display()),
            TableSource::File(p) => write!(f, "{}", p.display()),
            TableSource::BuiltIn { what, used_for, why } => {
                write!(f, "built-in default: {what}; for {used_for}: {why}")
            }
        }
    }
}

/// A table ready for the launch path: ranges as algorithms, and where it came from.
#[derive(Clone, Debug)]
pub struct LoadedTable {
    pub table: TuneTable,
    pub source: TableSource,
    ranges: Vec<(usize, Choice)>,
}

impl LoadedTable {
    pub fn new(table: TuneTable, source: TableSource) -> Result<LoadedTable, Error> {
        let ranges = table.ranges().map_err(|e| Error::Tune(format!("tune table {source}: {e}")))?;
        Ok(LoadedTable { table, source, ranges })
    }

    /// The choice for a message of `bytes`: the first range that holds it.
    pub fn pick(&self, bytes: usize) -> Choice {
        self.ranges.iter().find(|r| bytes <= r.0).map_or(Choice::of(Algorithm::SymmZc2Shot), |r| r.1)
    }
}

/// How much slower than the fastest an algorithm may be and still keep its range going: a tie within noise.
pub const TIE: f64 = 0.03;

/// The fastest candidate per size from `(bytes, candidate, time)` measurements (times that are not finite left
/// out), as ranges `(max_bytes, candidate)`: neighbouring sizes with the same winner merged, a candidate within
/// [`TIE`] of the fastest keeping the range it holds, the last range opened (`None`) to every larger size. Empty
/// when nothing was measured. The one rule of every table: the communicator's designs, across's paths.
pub fn fastest_ranges<T: Copy + PartialEq>(times: &[(usize, T, f64)]) -> Vec<(Option<usize>, T)> {
    let mut sizes: Vec<usize> = times.iter().map(|t| t.0).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut ranges: Vec<(Option<usize>, T)> = Vec::new();
    for bytes in sizes {
        let best = times.iter().filter(|t| t.0 == bytes && t.2.is_finite()).min_by(|a, b| a.2.total_cmp(&b.2));
        let Some(&(_, mut winner, fastest)) = best else { continue };
        let close = |c: T| times.iter().any(|t| t.0 == bytes && t.1 == c && t.2 <= fastest * (1.0 + TIE));
        if let Some(kept) = ranges.last().map(|r| r.1).filter(|&c| close(c)) {
            winner = kept;
        }
        match ranges.last_mut() {
            Some(last) if last.1 == winner => last.0 = Some(bytes),
            _ => ranges.push((Some(bytes), winner)),
        }
    }
    if let Some(last) = ranges.last_mut() {
        last.0 = None;
    }
    ranges
}

/// One table per mode and residency for plain allreduces, and where one was found, for norm calls: what the engine
/// chooses from per call.
#[derive(Clone, Debug)]
pub struct Tables {
    /// Indexed by `[mode as usize][residency as usize]`.
    tables: [[LoadedTable; 3]; 2],
    norm: [[Option<LoadedTable>; 3]; 2],
}

impl Tables {
    /// Each table by `find(op, mode, residency)`, which may find none for norm calls (their choice then falls back
    /// to the engine's rule) but must for plain allreduces.
    pub fn try_from_fn(
        mut find: impl FnMut(TableOp, Mode, Residency) -> Result<Option<LoadedTable>, Error>,
    ) -> Result<Tables, Error> {
        let mut row = |op, mode| -> Result<[Option<LoadedTable>; 3], Error> {
            let [a, b, c] = Residency::ALL.map(|r| find(op, mode, r));
            Ok([a?, b?, c?])
        };
        let mut plain = |mode: Mode| -> Result<[LoadedTable; 3], Error> {
            let missing = |r: Residency| {
                Error::Tune(format!("no allreduce table for {} calls on {} buffers", mode.name(), r.name()))
            };
            let [a, b, c] = row(TableOp::AllReduce, mode)?;
            let [ra, rb, rc] = Residency::ALL;
            Ok([a.ok_or_else(|| missing(ra))?, b.ok_or_else(|| missing(rb))?, c.ok_or_else(|| missing(rc))?])
        };
        let tables = [plain(Mode::Eager)?, plain(Mode::Graph)?];
        let norm = [row(TableOp::AddRmsNorm, Mode::Eager)?, row(TableOp::AddRmsNorm, Mode::Graph)?];
        Ok(Tables { tables, norm })
    }

    pub fn get(&self, mode: Mode, residency: Residency) -> &LoadedTable {
        &self.tables[mode as usize][residency as usize]
    }

    /// Makes `table` the one calls of `op` in `mode` on buffers in `residency` follow.
    pub fn set(&mut self, op: TableOp, mode: Mode, residency: Residency, table: LoadedTable) {
        let (m, r) = (mode as usize, residency as usize);
        match op {
            TableOp::AllReduce => self.tables[m][r] = table,
            TableOp::AddRmsNorm => self.norm[m][r] = Some(table),
        }
    }

    /// The norm calls' table of `mode` and `residency`, if one was found.
    pub fn norm(&self, mode: Mode, residency: Residency) -> Option<&LoadedTable> {
        self.norm[mode as usize][residency as usize].as_ref()
    }

    /// Every table found, with its calls, mode and residency.
    pub fn iter(&self) -> impl Iterator<Item = (TableOp, Mode, Residency, &LoadedTable)> {
        let all = Mode::ALL.into_iter().flat_map(|m| Residency::ALL.into_iter().map(move |r| (m, r)));
        let plain = all.clone().map(move |(m, r)| (TableOp::AllReduce, m, r, self.get(m, r)));
        plain.chain(all.filter_map(move |(m, r)| Some((TableOp::AddRmsNorm, m, r, self.norm(m, r)?))))
    }
}

/// The per-user directory tables are cached in: `$ALLREDUCE_TUNE_DIR`, else `$XDG_CACHE_HOME/allreduce-rs/tune`,
/// else `$HOME/.cache/allreduce-rs/tune`.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |v: &str| std::env::var_os(v).filter(|s| !s.is_empty()).map(PathBuf::from);
    var("ALLREDUCE_TUNE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("allreduce-rs/tune")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/allreduce-rs/tune")))
}

/// A file of tune tables as stored: one table, or a set of keyed tables (what `comm-bench --tune` writes).
#[derive(Deserialize)]
#[serde(untagged)]
enum Stored {
    One(TuneTable),
    Set(Vec<TuneTable>),
}

impl TuneTable {
    pub fn load(path: &Path) -> Result<TuneTable, Error> {
        match TuneTable::load_set(path)?.as_slice() {
            [one] => Ok(one.clone()),
            set => Err(Error::Tune(format!("{} holds {} tables, not one", path.display(), set.len()))),
        }
    }

    /// The tables of a file holding one table or a set, each checked.
    pub fn load_set(path: &Path) -> Result<Vec<TuneTable>, Error> {
        let err = |e: String| Error::Tune(format!("tune table {}: {e}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let set = match serde_json::from_str(&text).map_err(|e| err(e.to_string()))? {
            Stored::One(t) => vec![t],
            Stored::Set(s) if s.is_empty() => return Err(err("an empty set".into())),
            Stored::Set(s) => s,
        };
        for t in &set {
            t.ranges().map_err(err)?;
        }
        Ok(set)
    }

    /// The table of a set for `key`: a set of one unkeyed table is that table for every key; otherwise the
    /// closest keyed one, and why it was taken.
    pub fn pick(set: &[TuneTable], key: &TableKey) -> Option<(TuneTable, String)> {
        if let [one] = set {
            if one.key.is_none() {
                return Some((one.clone(), "one table for every call".into()));
            }
        }
        closest(set, key).map(|(t, why)| (t.clone(), why))
    }

    /// Writes the table to `path` (its directory created), through a temporary file so a concurrent reader never
    /// sees half of it.
    pub fn store(&self, path: &Path) -> Result<(), Error> {
        store_json(path, self)
    }

    /// The ranges as choices, checked: not empty, known allreduce methods (the unfused sequence only where the table
    /// is not keyed for plain calls), bounds ascending, the last open.
    fn ranges(&self) -> Result<Vec<(usize, Choice)>, String> {
        if self.entries.is_empty() {
            return Err("no entries".into());
        }
        let plain = self.key.as_ref().is_some_and(|k| k.op == TableOp::AllReduce);
        let mut out = Vec::new();
        for (i, e) in self.entries.iter().enumerate() {
            let choice = Choice::from_name(&e.method).ok_or_else(|| {
                let known = Algorithm::CANDIDATES.map(|a| a.name());
                format!("{} is not one of {known:?}, nor one of them after {:?}", e.method, Choice::UNFUSED)
            })?;
            if plain && choice.unfused {
                return Err(format!("{}: a table of plain allreduces has no norm to leave unfused", e.method));
            }
            let bound = match e.max_bytes {
                Some(b) => b,
                None if i + 1 == self.entries.len() => usize::MAX,
                None => return Err(format!("entry {i} has no bound but is not the last")),
            };
            if out.last().is_some_and(|&(prev, _)| prev >= bound) {
                return Err(format!("bounds must ascend: {bound} after {}", out.last().expect("checked").0));
            }
            out.push((bound, choice));
        }
        if out.last().expect("not empty").0 != usize::MAX {
            return Err("the last entry must take every larger message (max_bytes null)".into());
        }
        Ok(out)
    }

    /// The fastest choice per size from `(bytes, choice, time)` measurements, neighbouring sizes with the same
    /// winner merged, the last range opened to every larger size; checked as a loaded table is.
    pub fn from_times(times: &[(usize, Choice, f64)], key: TableKey, measured_on: String) -> Result<TuneTable, Error> {
        let candidates: Vec<_> =
            times.iter().copied().filter(|t| Algorithm::CANDIDATES.contains(&t.1.algorithm)).collect();
        let entries = fastest_ranges(&candidates)
            .into_iter()
            .map(|(max_bytes, choice)| TuneEntry { max_bytes, method: choice.to_string() })
            .collect::<Vec<_>>();
        if entries.is_empty() {
            return Err(Error::Tune("no candidate was measured at any size".into()));
        }
        let table = TuneTable { key: Some(key), measured_on, entries };
        table.ranges().map_err(|e| Error::Tune(format!("the table measured for {}: {e}", table.measured_on)))?;
        Ok(table)
    }

    /// The table for `key`: the cached one if there is one, else the closest of the driver's built-in set of the
    /// key's calls; None when neither has one.
    pub fn find(key: &TableKey, driver: DriverKind, dir: Option<&Path>) -> Result<Option<LoadedTable>, Error> {
        if let Some(path) = dir.map(|d| d.join(key.file_name())).filter(|p| p.is_file()) {
            let table = TuneTable::load(&path)?;
            if table.key.as_ref() != Some(key) {
                return Err(Error::Tune(format!(
                    "tune table {} is keyed {:?}, not {key:?}; remove it or tune again",
                    path.display(),
                    table.key
                )));
            }
            return LoadedTable::new(table, TableSource::Cache(path)).map(Some);
        }
        let (set, what) = built_in(driver);
        let Some((table, why)) = TuneTable::pick(&set, key) else { return Ok(None) };
        LoadedTable::new(table, TableSource::BuiltIn { what, used_for: key.to_string(), why }).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn table(entries: &[(Option<usize>, &str)]) -> TuneTable {
        let entries = entries.iter().map(|&(max_bytes, m)| TuneEntry { max_bytes, method: m.into() }).collect();
        TuneTable { key: None, measured_on: "test".into(), entries }
    }

    #[test]
    fn picks_by_range_and_refuses_malformed_tables() {
        let t = table(&[(Some(1000), "symm_ll"), (Some(5000), "symm_epoch_1shot"), (None, "car_2shot")]);
        let l = LoadedTable::new(t, TableSource::BuiltIn { what: "test", used_for: String::new(), why: String::new() })
            .unwrap();
        assert_eq!(l.pick(16), Choice::of(Algorithm::SymmLl));
        assert_eq!(l.pick(1000), Choice::of(Algorithm::SymmLl));
        assert_eq!(l.pick(1001), Choice::of(Algorithm::SymmEpoch1Shot));
        assert_eq!(l.pick(1 << 30), Choice::of(Algorithm::Car2Shot));
        for bad in [
            table(&[]),
            table(&[(Some(10), "car_9shot"), (None, "car_1shot")]),
            table(&[(Some(10), "car_rs"), (None, "car_1shot")]),
            table(&[(Some(10), "unfused:car_rs"), (None, "car_1shot")]),
            table(&[(Some(10), "unfused:"), (None, "car_1shot")]),
            table(&[(Some(10), "unfused:unfused:car_1shot"), (None, "car_1shot")]),
            table(&[(Some(10), "car_1shot"), (Some(5), "car_2shot"), (None, "car_1shot")]),
            table(&[(None, "car_1shot"), (None, "car_2shot")]),
            table(&[(Some(10), "car_1shot")]),
        ] {
            assert!(
                LoadedTable::new(
                    bad.clone(),
                    TableSource::BuiltIn { what: "t", used_for: String::new(), why: String::new() }
                )
                .is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_choice_is_named_by_its_algorithm_and_the_unfused_sequence_after_unfused() {
        for algorithm in Algorithm::CANDIDATES {
            for choice in [Choice::of(algorithm), Choice::unfused(algorithm)] {
                assert_eq!(Choice::from_name(&choice.to_string()), Some(choice));
            }
        }
        assert_eq!(Choice::unfused(Algorithm::SymmZc2Shot).to_string(), "unfused:symm_zc_2shot");
        for bad in ["car_rs", "unfused:car_ag", "unfused", "fused:car_1shot", "unfused: car_1shot"] {
            assert_eq!(Choice::from_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_file_holds_one_table_or_a_set() {
        let dir = tempfile::tempdir().unwrap();
        let one = dir.path().join("one.json");
        std::fs::write(&one, serde_json::to_string(&table(&[(None, "car_2shot")])).unwrap()).unwrap();
        let key = TableKey::new(DriverKind::Host, "h", (2, 2), Mode::Graph, Residency::Registered);
        let (t, why) = TuneTable::pick(&TuneTable::load_set(&one).unwrap(), &key).unwrap();
        assert_eq!((t.entries[0].method.as_str(), why.as_str()), ("car_2shot", "one table for every call"));
        let set = dir.path().join("set.json");
        let mut a = table(&[(None, "car_1shot")]);
        a.key = Some(TableKey { residency: Residency::Caller, ..key.clone() });
        let mut b = table(&[(None, "symm_zc_2shot")]);
        b.key = Some(key.clone());
        std::fs::write(&set, serde_json::to_string(&[a, b]).unwrap()).unwrap();
        let loaded = TuneTable::load_set(&set).unwrap();
        assert_eq!(TuneTable::pick(&loaded, &key).unwrap().0.entries[0].method, "symm_zc_2shot");
        assert!(TuneTable::load(&set).unwrap_err().to_string().contains("holds 2 tables"));
        std::fs::write(&set, "[]").unwrap();
        assert!(TuneTable::load_set(&set).is_err());
    }

    #[test]
    fn from_times_takes_the_fastest_and_merges_ranges() {
        use Algorithm::*;
        let key = TableKey::new(DriverKind::Host, "host (2 cores)", (2, 2), Mode::Eager, Residency::Caller);
        let times = [
            (2048, Car1Shot, 8.0),
            (2048, SymmLl, 7.0),
            (4096, SymmLl, f64::NAN),
            (4096, Car1Shot, 9.0),
            (8192, Car1Shot, 10.0),
            (8192, SymmZc2Shot, 11.0),
            (16384, SymmZc2Shot, 12.0),
            // Within the tie margin of the incumbent: it keeps the range.
            (32768, Car2Shot, 20.0),
            (32768, SymmZc2Shot, 20.5),
            (65536, Car2Shot, 30.0),
            (65536, SymmZc2Shot, 40.0),
        ];
        let times = times.map(|(bytes, algo, ms)| (bytes, Choice::of(algo), ms));
        let t = TuneTable::from_times(&times, key.clone(), "test".into()).unwrap();
        let got: Vec<(Option<usize>, &str)> = t.entries.iter().map(|e| (e.max_bytes, e.method.as_str())).collect();
        let want =
            [(Some(2048), "symm_ll"), (Some(8192), "car_1shot"), (Some(32768), "symm_zc_2shot"), (None, "car_2shot")];
        assert_eq!(got, want);
        assert_eq!(t.key, Some(key));
    }

    #[test]
    fn cache_round_trip_by_key_and_fallback_to_built_in() {
        let dir = tempfile::tempdir().unwrap();
        let key = TableKey::new(DriverKind::Host, "host (2 cores)", (3, 3), Mode::Graph, Residency::CallerRegistered);
        assert_eq!(key.file_name(), "host-host__2_cores_-w3-d3-graph-caller_registered.json");
        let found = TuneTable::find(&key, DriverKind::Host, Some(dir.path())).unwrap().unwrap();
        assert!(matches!(found.source, TableSource::BuiltIn { .. }));
        let mut t =
            TuneTable::from_times(&[(64, Choice::of(Algorithm::Car2Shot), 1.0)], key.clone(), "here".into()).unwrap();
        t.store(&dir.path().join(key.file_name())).unwrap();
        let found = TuneTable::find(&key, DriverKind::Host, Some(dir.path())).unwrap().unwrap();
        assert_eq!(found.source, TableSource::Cache(dir.path().join(key.file_name())));
        assert_eq!(found.pick(1 << 20), Choice::of(Algorithm::Car2Shot));
        // A file under the right name with another key is refused, not silently followed.
        t.key = Some(TableKey { world: 4, ..key.clone() });
        t.store(&dir.path().join(key.file_name())).unwrap();
        assert!(TuneTable::find(&key, DriverKind::Host, Some(dir.path())).unwrap_err().to_string().contains("keyed"));
    }

    #[test]
    fn norm_calls_have_tables_of_their_own_and_never_borrow_a_plain_one() {
        let dir = tempfile::tempdir().unwrap();
        let plain = TableKey::new(DriverKind::Host, "host (2 cores)", (3, 3), Mode::Eager, Residency::Caller);
        let norm = plain.clone().for_op(TableOp::AddRmsNorm);
        // Not the `-norm` files of the tables that named no unfused sequence (see TableOp::file_suffix).
        assert_eq!(norm.file_name(), "host-host__2_cores_-w3-d3-eager-caller-rms_norm.json");
        assert!(norm.to_string().ends_with("residual add + RMSNorm"), "{norm}");
        // A plain key's file reads as before (no `op`); a norm key's says so.
        let plain_json = serde_json::to_string(&plain).unwrap();
        assert!(!plain_json.contains("op"), "{plain_json}");
        assert_eq!(serde_json::from_str::<TableKey>(&plain_json).unwrap(), plain);
        let norm_json = serde_json::to_string(&norm).unwrap();
        assert!(norm_json.contains("\"op\":\"add_rms_norm\""), "{norm_json}");
        // The host's built-in set has plain tables only: a norm key finds none there, so the engine's rule runs.
        assert!(TuneTable::find(&norm, DriverKind::Host, Some(dir.path())).unwrap().is_none());
        let mut set =
            vec![TuneTable::from_times(&[(64, Choice::of(Algorithm::Car1Shot), 1.0)], plain.clone(), "p".into())
                .unwrap()];
        assert!(TuneTable::pick(&set, &norm).is_none());
        // With one of each, each key takes its own, whatever else is closer.
        let other = TableKey { world: 8, ..norm.clone() };
        set.push(
            TuneTable::from_times(&[(64, Choice::unfused(Algorithm::SymmZc2Shot), 1.0)], other, "n".into()).unwrap(),
        );
        assert_eq!(TuneTable::pick(&set, &plain).unwrap().0.entries[0].method, "car_1shot");
        let (t, why) = TuneTable::pick(&set, &norm).unwrap();
        let (t, why) = (t.entries[0].method.as_str(), why.as_str());
        assert_eq!((t, why), ("unfused:symm_zc_2shot", "measured with 8 ranks, not 3"));
        // A norm table cached under its name is found there.
        let times = [(64, Choice::of(Algorithm::SymmLl), 1.0), (4096, Choice::unfused(Algorithm::SymmLl), 1.0)];
        let t = TuneTable::from_times(&times, norm.clone(), "here".into()).unwrap();
        t.store(&dir.path().join(norm.file_name())).unwrap();
        let found = TuneTable::find(&norm, DriverKind::Host, Some(dir.path())).unwrap().unwrap();
        assert_eq!(
            (found.pick(64), found.pick(65)),
            (Choice::of(Algorithm::SymmLl), Choice::unfused(Algorithm::SymmLl))
        );
        // A plain table cannot name the unfused sequence: it has no norm.
        let err = TuneTable::from_times(&times, plain, "p".into()).unwrap_err().to_string();
        assert!(err.contains("no norm to leave unfused"), "{err}");
    }
}
