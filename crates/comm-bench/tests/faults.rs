//! Faults injected into a running comm-bench job on the host driver: a rank killed (SIGKILL) or stopped (SIGSTOP)
//! at a random point of a sweep. Every other rank must give up within the deadline naming the lost rank, the
//! launcher must exit non-zero, and nothing may be left behind: no process, no /dev/shm segment.

use rand::RngExt;
use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_comm-bench");
/// The tests watch /dev/shm and the process table as a whole, so they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn shm_segments() -> HashSet<String> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return HashSet::new() };
    dir.filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("arx-"))
        .collect()
}

/// Pids whose parent is `parent`.
fn children(parent: u32) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()) {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // The command name may hold spaces; fields after the closing parenthesis are fixed.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { continue };
        let ppid: u32 = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        if ppid == parent {
            out.push(pid);
        }
    }
    out
}

fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie has exited; only its parent's wait is missing (our PID 1 may never reap orphans).
        Ok(stat) => stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()) != Some("Z"),
        Err(_) => false,
    }
}

/// A running host-driver job of `world` ranks with `args`: the launcher, its ranks' pids, and the prefix of this
/// job's /dev/shm segments (other test runs on the machine may hold segments of their own meanwhile).
fn launch_job(world: usize, args: &[&str]) -> (std::process::Child, Vec<i32>, String) {
    let job = Command::new(BIN)
        .args(["--backend", "host", "--num_ranks", &world.to_string()])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut ranks = Vec::new();
    while ranks.len() < world && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
        ranks = children(job.id());
    }
    assert_eq!(ranks.len(), world, "the launcher did not start {world} ranks");
    let environ = std::fs::read(format!("/proc/{}/environ", ranks[0])).unwrap_or_default();
    let job_id = environ
        .split(|&b| b == 0)
        .find_map(|v| v.strip_prefix(b"ALLREDUCE_JOB_ID="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .expect("a rank's environment names its job");
    (job, ranks, format!("arx-{job_id}-"))
}

fn inject(signal: nix::sys::signal::Signal) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let before = shm_segments();
    let world = 4;
    let args = [
        "--timeout_s",
        "3",
        "--setup_timeout_s",
        "3",
        "--counts",
        "1000,65536,300000",
        "--num_iters",
        "50",
        "--repeats",
        "1000",
    ];
    let (job, ranks, ours) = launch_job(world, &args);
    // Somewhere in setup, the ceilings or the sweep.
    std::thread::sleep(Duration::from_millis(rand::rng().random_range(100..1500)));
    let victim = ranks[rand::rng().random_range(0..world)];
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(victim), signal).unwrap();
    let injected = Instant::now();
    let out = job.wait_with_output().unwrap();
    let took = injected.elapsed();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the job must fail");
    assert!(took < Duration::from_secs(10), "the job took {took:?} to end after {signal}");
    assert!(text.contains("failed") && text.contains("rank"), "the error must name a rank:\n{text}");
    if signal == nix::sys::signal::Signal::SIGKILL {
        assert!(text.contains("SIGKILL"), "the dead rank's fate must be named:\n{text}");
    } else {
        assert!(text.contains("timed out"), "the peers of a stopped rank time out:\n{text}");
    }
    for pid in ranks {
        assert!(!alive(pid), "rank process {pid} outlived the job");
    }
    let left: Vec<String> = shm_segments().difference(&before).filter(|n| n.starts_with(&ours)).cloned().collect();
    assert!(left.is_empty(), "left in /dev/shm: {left:?}\n{text}");
}

#[test]
fn a_killed_rank_ends_the_job_cleanly() {
    for _ in 0..3 {
        inject(nix::sys::signal::Signal::SIGKILL);
    }
}

#[test]
fn a_stopped_rank_ends_the_job_cleanly() {
    for _ in 0..2 {
        inject(nix::sys::signal::Signal::SIGSTOP);
    }
}

/// A closed terminal (SIGHUP), `Ctrl-\` (SIGQUIT), Ctrl-C (SIGINT) and kill (SIGTERM) sent to comm-bench itself: the
/// launcher stops its ranks, names the signal, exits non-zero and leaves none of this job's /dev/shm segments.
#[test]
fn every_stop_signal_to_comm_bench_leaves_nothing_behind() {
    use nix::sys::signal::Signal;
    for signal in [Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGINT, Signal::SIGTERM] {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let args =
            ["--counts", "1000,65536", "--num_iters", "50", "--repeats", "1000", "--methods", "car_1shot,symm_1shot"];
        let (job, ranks, ours) = launch_job(3, &args);
        let start = Instant::now();
        // Into the sweep, where every rank holds its segments.
        while !shm_segments().iter().any(|n| n.starts_with(&ours)) && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(job.id() as i32), signal).unwrap();
        let out = job.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{signal}: the job must fail");
        assert!(text.contains(&format!("interrupted by {signal}")), "{signal} must be named:\n{text}");
        for pid in ranks {
            assert!(!alive(pid), "{signal}: rank process {pid} outlived the job");
        }
        let left: Vec<String> = shm_segments().into_iter().filter(|n| n.starts_with(&ours)).collect();
        assert!(left.is_empty(), "{signal}: left in /dev/shm: {left:?}\n{text}");
    }
}
