//! The drivers' built-in tune tables, and which table of a set a call follows when none has its key.

use super::{TableKey, TuneTable};
use crate::Error;
use gpu::DriverKind;

/// The built-in sets, one per driver: every table `Communicator::tune` measured there (mode x residency), keyed.
const BUILT_IN_CUDA: &str = include_str!("../../tables/cuda.json");
const BUILT_IN_HIP: &str = include_str!("../../tables/hip.json");
const BUILT_IN_HOST: &str = include_str!("../../tables/host.json");

/// The driver's built-in set as its file in the source tree holds it (`crates/allreduce/tables/DRIVER.json`).
fn built_in_text(driver: DriverKind) -> &'static str {
    match driver {
        DriverKind::Cuda => BUILT_IN_CUDA,
        DriverKind::Hip => BUILT_IN_HIP,
        DriverKind::Host => BUILT_IN_HOST,
    }
}

/// The text of a built-in set's file (what `cargo xtask tables` writes): pretty JSON and a final newline.
pub fn built_in_file(set: &[TuneTable]) -> String {
    serde_json::to_string_pretty(set).expect("tables serialise") + "\n"
}

/// Puts freshly tuned tables into a driver's built-in set (`cargo xtask tables`): each replaces the table of its key
/// or joins the set. Refused before any change: a table without a key (a built-in set is chosen from by key) or of
/// another driver. Returns each table's key and whether it replaced one.
pub fn merge_built_in(
    set: &mut Vec<TuneTable>,
    tuned: Vec<TuneTable>,
    driver: DriverKind,
) -> Result<Vec<(TableKey, bool)>, Error> {
    let mut keys = Vec::new();
    for t in &tuned {
        let key = t.key.clone().ok_or_else(|| {
            Error::Tune(format!("a table measured on {} has no key: a built-in set needs one", t.measured_on))
        })?;
        if key.driver != driver.to_string() {
            return Err(Error::Tune(format!("the table for {key} is not of the {driver} driver's set")));
        }
        keys.push(key);
    }
    let mut merged = Vec::new();
    for (t, key) in tuned.into_iter().zip(keys) {
        let replaced = match set.iter_mut().find(|old| old.key.as_ref() == Some(&key)) {
            Some(old) => {
                *old = t;
                true
            }
            None => {
                set.push(t);
                false
            }
        };
        merged.push((key, replaced));
    }
    Ok(merged)
}

/// The driver's built-in tables and a line saying where they come from.
pub fn built_in(driver: DriverKind) -> (Vec<TuneTable>, &'static str) {
    let text = built_in_text(driver);
    let what = match driver {
        DriverKind::Cuda => {
            "cuda: measured under MPS (a proxy for NVLink). On one H100 under the spare-multiprocessor cap, on the \
             current kernels, each size's candidates timed in rounds: caller, registered and caller-registered \
             buffers with 2 to 8 ranks (results/h100-mps/s40); on earlier kernels the calls with the residual add \
             and RMSNorm with 8 ranks (results/h100-mps/s34). On one H200 with 2, 3, 4, 6 and 8 ranks, all on \
             earlier kernels: caller buffers with 3, 4, 6 and 8 ranks and registered with 8 under the cap, the \
             rest and the norm calls (8 ranks only) before it"
        }
        DriverKind::Hip => "hip: car_1shot / car_2shot from the user's 8x MI300X comm_bench.py table",
        DriverKind::Host => "host: measured with 2 and 3 ranks on 2 shared cores (results/host-tune)",
    };
    (serde_json::from_str(text).expect("the built-in tables parse (tested)"), what)
}

/// The table of `set` closest to `key`, and a sentence saying what was measured where it differs from what runs.
/// Closeness, in order: the residency (a table of another residency picks designs for copies the call does not
/// pay, or skips ones it does), the mode, the nearest world size, the nearest sharing of a device, then the device
/// itself (so a set may hold several devices' tables of one shape, and each device takes its own). Only tables
/// of the key's calls count (norm calls never follow a plain allreduce's table, nor the reverse): None without one.
pub(super) fn closest<'a>(set: &'a [TuneTable], key: &TableKey) -> Option<(&'a TuneTable, String)> {
    let keyed = set.iter().filter_map(|t| Some((t, t.key.as_ref().filter(|k| k.op == key.op)?)));
    let (table, k) = keyed.min_by_key(|(_, k)| {
        let world = k.world.abs_diff(key.world);
        let sharing = k.ranks_per_device.abs_diff(key.ranks_per_device);
        (k.residency != key.residency, k.mode != key.mode, world, sharing, k.device != key.device)
    })?;
    let mut differs = Vec::new();
    if k.driver != key.driver {
        differs.push(format!("measured on the {} driver, not {}", k.driver, key.driver));
    }
    if k.device != key.device {
        differs.push(format!("measured on {}, not {}", k.device, key.device));
    }
    if k.world != key.world {
        differs.push(format!("measured with {} ranks, not {}", k.world, key.world));
    }
    if k.ranks_per_device != key.ranks_per_device {
        let (a, b) = (k.ranks_per_device, key.ranks_per_device);
        differs.push(format!("measured with {a} rank(s) per device, used with {b}"));
    }
    if k.mode != key.mode {
        differs.push(format!("measured {}, used {}", k.mode.name(), key.mode.name()));
    }
    if k.residency != key.residency {
        differs.push(format!("measured on {} buffers, used on {}", k.residency.name(), key.residency.name()));
    }
    let why = if differs.is_empty() { "its key matches".to_string() } else { differs.join("; ") };
    Some((table, why))
}

#[cfg(test)]
mod tests {
    use super::super::tests::table;
    use super::super::{LoadedTable, Mode, Residency, TableSource};
    use super::*;

    #[test]
    fn built_in_files_are_as_cargo_xtask_tables_writes_them() {
        for d in DriverKind::ALL {
            assert!(built_in_file(&built_in(d).0) == built_in_text(d), "{d}: rewrite with `cargo xtask tables`");
        }
    }

    #[test]
    fn merging_replaces_the_table_of_a_key_adds_a_new_key_and_refuses_unkeyed_or_foreign_tables() {
        let keyed = |world, method: &str, driver| TuneTable {
            key: Some(TableKey::new(driver, "dev", (world, world), Mode::Eager, Residency::Caller)),
            ..table(&[(None, method)])
        };
        let mut set = vec![keyed(2, "car_1shot", DriverKind::Cuda), keyed(4, "car_1shot", DriverKind::Cuda)];
        let tuned = vec![keyed(4, "symm_zc_1shot", DriverKind::Cuda), keyed(8, "car_2shot", DriverKind::Cuda)];
        let merged = merge_built_in(&mut set, tuned, DriverKind::Cuda).unwrap();
        assert_eq!(
            merged.iter().map(|(k, replaced)| (k.world, *replaced)).collect::<Vec<_>>(),
            [(4, true), (8, false)]
        );
        let methods: Vec<_> =
            set.iter().map(|t| (t.key.as_ref().unwrap().world, t.entries[0].method.as_str())).collect();
        assert_eq!(methods, [(2, "car_1shot"), (4, "symm_zc_1shot"), (8, "car_2shot")]);
        for (bad, why) in
            [(table(&[(None, "car_1shot")]), "has no key"), (keyed(2, "car_1shot", DriverKind::Hip), "not of")]
        {
            let before = set.clone();
            let tuned = vec![keyed(16, "car_1shot", DriverKind::Cuda), bad];
            let e = merge_built_in(&mut set, tuned, DriverKind::Cuda).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
            assert_eq!(set, before, "nothing merged before the refusal");
        }
    }

    #[test]
    fn every_built_in_table_is_valid_and_keyed_for_its_driver() {
        for d in DriverKind::ALL {
            let (set, what) = built_in(d);
            assert!(what.starts_with(&d.to_string()), "{what}");
            assert!(!set.is_empty(), "{d}");
            for t in set {
                let key = t.key.clone().unwrap_or_else(|| panic!("{d}: a built-in table without a key"));
                assert_eq!(key.driver, d.to_string());
                LoadedTable::new(t, TableSource::BuiltIn { what, used_for: String::new(), why: String::new() })
                    .unwrap();
            }
        }
    }

    #[test]
    fn the_closest_table_is_by_residency_then_mode_then_world_and_says_why() {
        let keyed = |world, mode, residency, method: &str| {
            let mut t = table(&[(None, method)]);
            t.key = Some(TableKey::new(DriverKind::Cuda, "GPU A", (world, 1), mode, residency));
            t
        };
        let set = [
            keyed(8, Mode::Eager, Residency::Caller, "car_1shot"),
            keyed(8, Mode::Eager, Residency::Registered, "symm_zc_2shot"),
            keyed(4, Mode::Graph, Residency::Registered, "symm_ll"),
        ];
        let key = |world, mode, residency| TableKey::new(DriverKind::Cuda, "GPU A", (world, 1), mode, residency);
        let (t, why) = TuneTable::pick(&set, &key(8, Mode::Eager, Residency::Caller)).unwrap();
        assert_eq!((t.entries[0].method.as_str(), why.as_str()), ("car_1shot", "its key matches"));
        // The residency outranks the mode: caller buffers in a graph take the eager caller table.
        let (t, why) = TuneTable::pick(&set, &key(8, Mode::Graph, Residency::Caller)).unwrap();
        assert_eq!(t.entries[0].method, "car_1shot");
        assert_eq!(why, "measured eager, used graph");
        // The mode outranks the world size.
        let (t, why) = TuneTable::pick(&set, &key(8, Mode::Graph, Residency::Registered)).unwrap();
        assert_eq!(t.entries[0].method, "symm_ll");
        assert_eq!(why, "measured with 4 ranks, not 8");
        // No table of the residency: the other's, said.
        let mut other = key(3, Mode::Eager, Residency::CallerRegistered);
        other.device = "GPU B".into();
        let (_, why) = TuneTable::pick(&set, &other).unwrap();
        for part in
            ["measured on GPU A, not GPU B", "measured with 8 ranks, not 3", "buffers, used on caller_registered"]
        {
            assert!(why.contains(part), "{why}");
        }
    }

    #[test]
    fn a_table_of_the_same_world_is_preferred_by_its_sharing_of_a_device_and_says_so() {
        let keyed = |shape, method: &str| {
            let mut t = table(&[(None, method)]);
            t.key = Some(TableKey::new(DriverKind::Cuda, "GPU A", shape, Mode::Eager, Residency::Caller));
            t
        };
        // Measured under MPS (every rank on one GPU) and with a GPU per rank.
        let set = [keyed((2, 2), "car_1shot"), keyed((2, 1), "symm_ll"), keyed((8, 8), "car_2shot")];
        let key = |shape| TableKey::new(DriverKind::Cuda, "GPU A", shape, Mode::Eager, Residency::Caller);
        let (t, why) = TuneTable::pick(&set, &key((2, 1))).unwrap();
        assert_eq!((t.entries[0].method.as_str(), why.as_str()), ("symm_ll", "its key matches"));
        assert_eq!(TuneTable::pick(&set, &key((2, 2))).unwrap().0.entries[0].method, "car_1shot");
        // The world size outranks the sharing: 8 GPUs take the 8-rank table measured under MPS, and say so.
        let (t, why) = TuneTable::pick(&set, &key((8, 1))).unwrap();
        assert_eq!(t.entries[0].method, "car_2shot");
        assert_eq!(why, "measured with 8 rank(s) per device, used with 1");
        assert_ne!(key((2, 1)).file_name(), key((2, 2)).file_name());
    }

    #[test]
    fn of_tables_of_one_shape_each_device_takes_its_own_and_others_the_first() {
        let keyed = |device: &str, world, method: &str| {
            let mut t = table(&[(None, method)]);
            t.key = Some(TableKey::new(DriverKind::Cuda, device, (world, world), Mode::Eager, Residency::Caller));
            t
        };
        let set = [keyed("GPU A", 8, "car_1shot"), keyed("GPU B", 8, "car_2shot"), keyed("GPU A", 4, "symm_ll")];
        let key = |device: &str, world| {
            TableKey::new(DriverKind::Cuda, device, (world, world), Mode::Eager, Residency::Caller)
        };
        let pick = |device, world| TuneTable::pick(&set, &key(device, world)).unwrap();
        assert_eq!(
            (pick("GPU A", 8).0.entries[0].method.as_str(), pick("GPU A", 8).1.as_str()),
            ("car_1shot", "its key matches")
        );
        assert_eq!(
            (pick("GPU B", 8).0.entries[0].method.as_str(), pick("GPU B", 8).1.as_str()),
            ("car_2shot", "its key matches")
        );
        // The device ranks last: GPU B with 4 ranks takes GPU A's 4-rank table, and a third device the first of 8.
        let (t, why) = pick("GPU B", 4);
        assert_eq!((t.entries[0].method.as_str(), why.as_str()), ("symm_ll", "measured on GPU A, not GPU B"));
        assert_eq!(pick("GPU C", 8).0.entries[0].method, "car_1shot");
    }
}
