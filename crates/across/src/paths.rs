//! Which path an allreduce across nodes takes by size: measured on the job's own shape ([`crate::Across::tune`]),
//! kept in the tune cache beside the communicator's tables, and followed by every rank as rank 0 found it. Where
//! nothing was measured, NCCL over the whole job.

use crate::{Error, Path};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The job shape a path table was measured for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathKey {
    pub driver: String,
    pub device: String,
    pub nodes: usize,
    /// Ranks per node.
    pub local_world: usize,
    /// Ranks whose kernels share each device (several for emulated nodes on one GPU).
    pub ranks_per_device: usize,
}

impl PathKey {
    /// The cache file's name.
    pub fn file_name(&self) -> String {
        let device = allreduce::tune::file_safe(&self.device);
        let (n, l, d) = (self.nodes, self.local_world, self.ranks_per_device);
        format!("across-{}-{device}-n{n}-l{l}-d{d}.json", self.driver)
    }
}

impl fmt::Display for PathKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (n, l, d) = (self.nodes, self.local_world, self.ranks_per_device);
        write!(f, "{} on {}, {n} nodes of {l} ranks ({d} per device)", self.driver, self.device)
    }
}

/// Messages of at most `max_bytes` (the last entry: any size) take `path`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathEntry {
    pub max_bytes: Option<usize>,
    pub path: Path,
}

/// A path table as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathTable {
    pub key: PathKey,
    pub measured_on: String,
    pub entries: Vec<PathEntry>,
}

impl PathTable {
    /// The fastest path per size from `(bytes, path, time)` measurements (allreduce's one rule for tables).
    pub fn from_times(times: &[(usize, Path, f64)], key: PathKey, measured_on: String) -> Result<PathTable, Error> {
        let entries: Vec<PathEntry> = allreduce::tune::fastest_ranges(times)
            .into_iter()
            .map(|(max_bytes, path)| PathEntry { max_bytes, path })
            .collect();
        if entries.is_empty() {
            return Err(Error::BadArgs("no path was measured at any size".into()));
        }
        Ok(PathTable { key, measured_on, entries })
    }

    /// The path for a message of `bytes`: the first range that holds it.
    pub fn pick(&self, bytes: usize) -> Path {
        self.entries.iter().find(|e| e.max_bytes.is_none_or(|m| bytes <= m)).map_or(Path::Nccl, |e| e.path)
    }

    /// Refuses a table that is not ranges: empty, bounds not ascending, or a last entry that does not take every
    /// larger message.
    fn check(&self) -> Result<(), String> {
        let bounds: Vec<Option<usize>> = self.entries.iter().map(|e| e.max_bytes).collect();
        match bounds.split_last() {
            None => Err("no entries".into()),
            Some((Some(_), _)) => Err("the last entry must take every larger message (max_bytes null)".into()),
            Some((None, rest)) => {
                let rest: Option<Vec<usize>> = rest.iter().copied().collect();
                let rest = rest.ok_or("only the last entry may have no bound")?;
                if rest.windows(2).any(|w| w[0] >= w[1]) {
                    return Err(format!("bounds must ascend: {rest:?}"));
                }
                Ok(())
            }
        }
    }

    /// The table cached for `key` in `dir`, if there is one; a file there keyed otherwise or malformed is an error
    /// naming it, never silently followed.
    pub fn find(key: &PathKey, dir: &std::path::Path) -> Result<Option<PathTable>, Error> {
        let file = dir.join(key.file_name());
        if !file.is_file() {
            return Ok(None);
        }
        let bad = |why: String| Error::Setup(format!("path table {}: {why}; remove it or tune again", file.display()));
        let text = std::fs::read_to_string(&file).map_err(|e| bad(e.to_string()))?;
        let table: PathTable = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if &table.key != key {
            return Err(bad(format!("keyed {}, not {key}", table.key)));
        }
        table.check().map_err(bad)?;
        Ok(Some(table))
    }

    /// Writes the table into `dir` under its key's name.
    pub fn store(&self, dir: &std::path::Path) -> Result<(), Error> {
        Ok(allreduce::tune::store_json(&dir.join(self.key.file_name()), self)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PathKey {
        PathKey { driver: "cuda".into(), device: "NVIDIA H200".into(), nodes: 2, local_world: 4, ranks_per_device: 8 }
    }

    #[test]
    fn the_fastest_path_per_size_merged_into_ranges() {
        use Path::*;
        let times = [
            (8192, Nccl, 10.0),
            (8192, Hierarchical, 30.0),
            (65536, Nccl, 20.0),
            (65536, Hierarchical, 20.3), // a tie keeps the range going
            (1 << 20, Nccl, 90.0),
            (1 << 20, Hierarchical, 60.0),
            (1 << 24, Nccl, f64::NAN), // not measured
            (1 << 24, Hierarchical, 500.0),
        ];
        let t = PathTable::from_times(&times, key(), "test".into()).unwrap();
        let got: Vec<(Option<usize>, Path)> = t.entries.iter().map(|e| (e.max_bytes, e.path)).collect();
        assert_eq!(got, [(Some(65536), Nccl), (None, Hierarchical)]);
        assert_eq!(
            (t.pick(1), t.pick(65536), t.pick(65537), t.pick(usize::MAX)),
            (Nccl, Nccl, Hierarchical, Hierarchical)
        );
        assert!(PathTable::from_times(&[], key(), "test".into()).is_err());
    }

    #[test]
    fn a_cached_table_round_trips_and_a_wrong_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(key().file_name(), "across-cuda-NVIDIA_H200-n2-l4-d8.json");
        assert_eq!(PathTable::find(&key(), dir.path()).unwrap(), None);
        let t = PathTable::from_times(&[(64, Path::Hierarchical, 1.0)], key(), "here".into()).unwrap();
        t.store(dir.path()).unwrap();
        assert_eq!(PathTable::find(&key(), dir.path()).unwrap(), Some(t.clone()));
        assert!(std::fs::read_to_string(dir.path().join(key().file_name())).unwrap().contains("\"hierarchical\""));
        // Another job's shape under this name, and tables that are not ranges: named, not followed.
        let mut other = t.clone();
        other.key.nodes = 4;
        allreduce::tune::store_json(&dir.path().join(key().file_name()), &other).unwrap();
        assert!(PathTable::find(&key(), dir.path()).unwrap_err().to_string().contains("keyed"));
        for entries in [
            vec![],
            vec![PathEntry { max_bytes: Some(5), path: Path::Nccl }],
            vec![PathEntry { max_bytes: None, path: Path::Nccl }, PathEntry { max_bytes: None, path: Path::Nccl }],
            vec![
                PathEntry { max_bytes: Some(9), path: Path::Nccl },
                PathEntry { max_bytes: Some(9), path: Path::Hierarchical },
                PathEntry { max_bytes: None, path: Path::Nccl },
            ],
        ] {
            let bad = PathTable { entries, ..t.clone() };
            allreduce::tune::store_json(&dir.path().join(key().file_name()), &bad).unwrap();
            assert!(PathTable::find(&key(), dir.path()).is_err(), "{bad:?}");
        }
    }
}
