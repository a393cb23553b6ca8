//! `comm-bench --tune FILE`: the library's own tune ([`allreduce::Communicator::tune_with`]) at the sweep's sizes
//! (comm_bench.py's with the powers of two between, or `--counts`) and timing, every mode and residency, plain
//! allreduces (not with `--tune_norm_only`) and (rows of `--tune_hidden`, up to the largest size) norm calls; rank 0
//! prints each measurement and the tables, writes them to FILE as one set (what `--tune_table` reads), and the
//! library caches each under its key as soon as it is finished (`--max_seconds`: no table starts past it, and the
//! last line names those not measured).

use crate::config::SweepConfig;
use crate::BenchError;
use allreduce::{Communicator, TuneRequest, TuneTable};
use launch::RankInfo;
use std::path::Path;

/// Runs this rank's part of a tune.
pub fn tune_rank(cfg: &SweepConfig, info: &RankInfo, path: &Path) -> Result<(), BenchError> {
    let mut comm = Communicator::new(info.clone(), crate::run::options(cfg)?)?;
    let counts = cfg.tune_counts(comm.gpu().info().size_align);
    allreduce::agree(comm.rendezvous(), "configuration", &cfg.fingerprint(comm.gpu().kind(), &counts))?;
    let req = TuneRequest {
        counts: Some(counts),
        timing: cfg.timing,
        norm_hidden: cfg.tune_hidden,
        dtype: cfg.dtype,
        plain: !cfg.tune_norm_only,
        residencies: cfg.tune_residencies.clone(),
        max_duration: cfg.max_duration,
    };
    let rank0 = comm.rank() == 0;
    if rank0 {
        println!(
            "# {:>5} {:>17} {:>5} {:>10} {:>26} {:>10}",
            "mode", "residency", "call", "count", "algorithm", "time(us)"
        );
    }
    // Each measurement as it is made, on rank 0: a tune takes minutes.
    let mut print = |m: &allreduce::Measured| {
        if rank0 {
            let t = m.ms.map_or_else(|| "failed".to_string(), |ms| format!("{:.2}", ms * 1e3));
            // A near tie's two candidates are printed again with the median of their alternated timings.
            let again = if m.retimed { " (re-timed)" } else { "" };
            let call = if m.op == allreduce::tune::TableOp::AddRmsNorm { "norm" } else { "plain" };
            let (mode, residency) = (m.mode.name(), m.residency.name());
            println!(
                "  {mode:>5} {residency:>17} {call:>5} {:>10} {:>26} {t:>10}{again}",
                m.count,
                m.choice.to_string()
            );
        }
    };
    let report = match comm.tune_with(&req, &mut print) {
        Ok(r) => r,
        Err(e) => {
            comm.rendezvous().abort(&e.to_string());
            return Err(e.into());
        }
    };
    if !rank0 {
        return Ok(());
    }
    let tables: Vec<&TuneTable> = report.tables.iter().map(|t| &t.0).collect();
    for (table, cached) in &report.tables {
        println!("# {} (cached as {}):", table.measured_on, cached.display());
        print!("{}", crate::report::tune_table_text(table));
    }
    let json = serde_json::to_string_pretty(&tables).expect("tables serialise");
    crate::paths::write(path, json).map_err(BenchError::Config)?;
    println!("# wrote the {} tune tables to {}", tables.len(), path.display());
    if !report.not_run.is_empty() {
        let skipped: Vec<String> =
            report.not_run.iter().map(|(mode, residency)| format!("{} {}", mode.name(), residency.name())).collect();
        println!("# Not run: the tables of {}: --max_seconds was reached first", skipped.join(", "));
    }
    Ok(())
}
