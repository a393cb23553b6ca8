//! `cargo xtask tables`: freshly tuned tables (`comm-bench --tune` files, or the tune cache's) into a driver's
//! built-in set, `crates/allreduce/tables/DRIVER.json`, which `auto` follows where this machine has tuned none.

use allreduce::tune::{built_in_file, merge_built_in};
use allreduce::{DriverKind, TuneTable};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The driver whose built-in set takes the tables: cuda, hip or host.
    #[arg(long, value_parser = str::parse::<DriverKind>)]
    driver: DriverKind,
    /// Files of tune tables (one table or a set each, as `comm-bench --tune` writes), each keyed for that driver.
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

pub fn run(args: &Args) -> Result<(), String> {
    let path = crate::root().join("crates/allreduce/tables").join(format!("{}.json", args.driver));
    let mut set = TuneTable::load_set(&path).map_err(|e| e.to_string())?;
    let mut tuned = Vec::new();
    for file in &args.files {
        tuned.extend(TuneTable::load_set(file).map_err(|e| e.to_string())?);
    }
    let merged = merge_built_in(&mut set, tuned, args.driver).map_err(|e| e.to_string())?;
    std::fs::write(&path, built_in_file(&set)).map_err(|e| format!("writing {}: {e}", path.display()))?;
    for (key, replaced) in merged {
        println!("{} {key}", if replaced { "replaced" } else { "added" });
    }
    println!(
        "{} tables in {}; say where the new ones were measured in the {} line of crates/allreduce/src/tune/built_in.rs",
        set.len(),
        path.display(),
        args.driver
    );
    Ok(())
}
