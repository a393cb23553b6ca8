//! The launcher's own runs: ranks started as child processes, their output, failures, signals and the sweep of what
//! they leave (the detection of a launcher's environment is tested in `tests.rs`).

use super::*;
use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::getpid;
use std::sync::RwLock;

/// run() tests share the process; the one that signals the whole process runs alone.
static SIGNALS: RwLock<()> = RwLock::new(());

#[test]
fn pump_prefixes_every_line() {
    let mut out = Vec::new();
    pump(&b"one\ntwo\n\nlast without newline"[..], "[rank 3] ", &mut out);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "[rank 3] one\n[rank 3] two\n[rank 3] \n[rank 3] last without newline\n"
    );
}

/// A fresh directory for one test's files, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!("launch-test-{}", JobId::random()));
        std::fs::create_dir(&dir).unwrap();
        TempDir(dir)
    }
    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.0.join(file)).unwrap_or_default()
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sh(world: usize, dir: &impl AsRef<Path>, script: &str) -> LaunchOptions {
    let mut opts = LaunchOptions::new(world, "/bin/sh");
    opts.args = vec!["-c".into(), script.into()];
    opts.env = vec![("DIR".into(), dir.as_ref().display().to_string()), ("RANK".into(), "overridden".into())];
    opts.grace = Duration::from_millis(500);
    opts
}

/// Whether `pid` still runs (a zombie waiting for a reaper does not count).
fn alive(pid: i32) -> bool {
    if kill(Pid::from_raw(pid), None) == Err(Errno::ESRCH) {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z'))
}

fn pids(dir: &TempDir) -> Vec<i32> {
    dir.read("pids").lines().map(|l| l.trim().parse().unwrap()).collect()
}

/// Every rank's environment, as `env -0` wrote it to `env.<rank>`.
fn rank_envs(dir: &TempDir, world: usize) -> Vec<HashMap<String, String>> {
    let parse = |text: String| -> HashMap<String, String> {
        text.split('\0').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    (0..world).map(|r| parse(dir.read(&format!("env.{r}")))).collect()
}

#[test]
fn all_ranks_succeed_with_their_environment() {
    let _shared = SIGNALS.read().unwrap();
    let dir = TempDir::new();
    run(&sh(3, &dir, r#"env -0 > "$DIR/env.$RANK"; echo hello"#)).unwrap();
    let envs = rank_envs(&dir, 3);
    let ours = |var: &str| std::env::var(var).ok();
    for (rank, e) in envs.iter().enumerate() {
        let vars = [RANK_ENV, WORLD_ENV, LOCAL_RANK_ENV, LOCAL_WORLD_ENV].map(|v| e.get(v).map(String::as_str));
        let (r, w) = (rank.to_string(), "3".to_string());
        assert_eq!(vars, [Some(r.as_str()), Some(w.as_str()), Some(r.as_str()), Some(w.as_str())]);
        assert_eq!(e[JOB_ENV], envs[0][JOB_ENV], "one job id for all ranks");
        JobId::parse(&e[JOB_ENV]).unwrap();
        // As under torchrun: one store address for all ranks, unless our own environment named one.
        assert_eq!(e[MASTER_ADDR_ENV], ours(MASTER_ADDR_ENV).unwrap_or("127.0.0.1".into()));
        assert_eq!(e[MASTER_PORT_ENV], envs[0][MASTER_PORT_ENV]);
        assert!(e[MASTER_PORT_ENV].parse::<u16>().is_ok_and(|p| p > 0), "{}", e[MASTER_PORT_ENV]);
        // Those variables make torchrun's ranks, but ours still read as ours.
        let info = detect_from(e).unwrap().unwrap();
        assert_eq!((info.launcher, info.rank, info.world, info.local_world), (Launcher::Ours, rank, 3, Some(3)));
        assert_eq!(info.job.as_str(), e[JOB_ENV]);
    }
}

#[test]
fn callers_master_address_and_port_are_kept() {
    let _shared = SIGNALS.read().unwrap();
    let dir = TempDir::new();
    let mut opts = sh(2, &dir, r#"env -0 > "$DIR/env.$RANK""#);
    opts.env.extend([("MASTER_ADDR".into(), "10.1.2.3".into()), ("MASTER_PORT".into(), "29511".into())]);
    run(&opts).unwrap();
    for e in rank_envs(&dir, 2) {
        assert_eq!((e[MASTER_ADDR_ENV].as_str(), e[MASTER_PORT_ENV].as_str()), ("10.1.2.3", "29511"));
    }
}

#[test]
fn failing_rank_stops_the_others() {
    let _shared = SIGNALS.read().unwrap();
    let dir = TempDir::new();
    // Every rank records its pid and that of a grandchild, so we can check that neither survives.
    let script = r#"sleep 30 & echo $! >> "$DIR/pids"; echo $$ >> "$DIR/pids";
        if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi; wait"#;
    let start = Instant::now();
    let err = run(&sh(4, &dir, script)).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    match &err {
        LaunchError::RankFailed { rank: 1, status, others } => {
            assert_eq!(status, "exit code 3");
            assert!(others.iter().all(|(r, s)| *r != 1 && s.starts_with("killed by")), "{others:?}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().starts_with("rank 1 failed (exit code 3)"), "{err}");
    let pids = pids(&dir);
    assert!(pids.len() >= 2, "{pids:?}");
    let deadline = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(pids.iter().all(|&p| !alive(p)), "survivors among {pids:?}");
}

#[test]
fn rank_killed_by_signal_is_named() {
    let _shared = SIGNALS.read().unwrap();
    let dir = TempDir::new();
    let err =
        run(&sh(2, &dir, r#"echo $$ >> "$DIR/pids"; [ "$RANK" = 0 ] && kill -KILL $$; exec sleep 30"#)).unwrap_err();
    match err {
        LaunchError::RankFailed { rank: 0, status, others } => {
            assert_eq!(status, "killed by SIGKILL");
            assert_eq!(others, vec![(1, "killed by SIGTERM".to_string())]);
        }
        other => panic!("unexpected {other:?}"),
    }
    for pid in pids(&dir) {
        assert_eq!(kill(Pid::from_raw(pid), None), Err(Errno::ESRCH), "rank pid {pid} survived");
    }
}

#[test]
fn stubborn_rank_is_killed_after_grace() {
    let _shared = SIGNALS.read().unwrap();
    let dir = TempDir::new();
    // Rank 0 fails only once rank 1 ignores SIGTERM.
    let script = r#"if [ "$RANK" = 0 ]; then while [ ! -s "$DIR/pids" ]; do sleep 0.01; done; exit 1; fi
        trap '' TERM; echo $$ >> "$DIR/pids"; while :; do sleep 0.05; done"#;
    let mut opts = sh(2, &dir, script);
    opts.prefix_output = false;
    match run(&opts).unwrap_err() {
        LaunchError::RankFailed { rank: 0, status, others } => {
            assert_eq!(status, "exit code 1");
            assert_eq!(others, vec![(1, "killed by SIGKILL".to_string())]);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn segments_left_by_ranks_are_swept() {
    let _shared = SIGNALS.read().unwrap();
    let dir = TempDir::new();
    let script = r#"touch "/dev/shm/arx-$ALLREDUCE_JOB_ID-x"; echo "$ALLREDUCE_JOB_ID" > "$DIR/job""#;
    run(&sh(1, &dir, script)).unwrap();
    let job = JobId::parse(dir.read("job").trim()).unwrap();
    assert!(!Path::new(&format!("/dev/shm/arx-{job}-x")).exists());
}

#[test]
fn interrupt_stops_all_ranks() {
    let _alone = SIGNALS.write().unwrap();
    let dir = TempDir::new();
    let opts = sh(2, &dir, r#"echo $$ >> "$DIR/pids"; exec sleep 30"#);
    let signaller = std::thread::spawn({
        let pids_file = dir.0.join("pids");
        move || {
            // Both ranks are up, so run() has its handler installed.
            while std::fs::read_to_string(&pids_file).unwrap_or_default().lines().count() < 2 {
                std::thread::sleep(Duration::from_millis(10));
            }
            kill(getpid(), Signal::SIGTERM).unwrap();
        }
    });
    let start = Instant::now();
    match run(&opts) {
        Err(e @ LaunchError::Interrupted { signal: Signal::SIGTERM }) => {
            assert_eq!(e.to_string(), "interrupted by SIGTERM; all ranks were stopped");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(5));
    signaller.join().unwrap();
    for pid in pids(&dir) {
        assert_eq!(kill(Pid::from_raw(pid), None), Err(Errno::ESRCH), "rank pid {pid} survived");
    }
}

#[test]
fn bad_arguments_are_refused() {
    let dir = TempDir::new();
    for world in [0, ipc::MAX_WORLD + 1] {
        assert!(matches!(run(&sh(world, &dir, "true")), Err(LaunchError::BadArgs(_))));
    }
    let missing = LaunchOptions::new(1, "/nonexistent/program");
    assert!(matches!(run(&missing), Err(LaunchError::BadArgs(_))));
    assert!(program_exists(Path::new("sh")));
    assert!(self_exe().unwrap().is_file());
}

/// The script that [`child_launcher`] runs under our launcher as 2 ranks (rank 0's stderr given the terminal if
/// ours is one), and the directory it gives them as DIR.
const CHILD_SCRIPT_ENV: &str = "LAUNCH_TEST_CHILD_SCRIPT";
const CHILD_DIR_ENV: &str = "LAUNCH_TEST_CHILD_DIR";

/// Not a test by itself: the launcher process of the tests below, which run this binary again with
/// [`CHILD_SCRIPT_ENV`] set so that signals and stderr can be the launcher's alone. Exits 0 on success, 3 after
/// printing the error.
#[test]
fn child_launcher() {
    let (Ok(script), Some(dir)) = (std::env::var(CHILD_SCRIPT_ENV), std::env::var_os(CHILD_DIR_ENV)) else {
        return;
    };
    let mut opts = sh(2, &PathBuf::from(dir), &script);
    opts.rank0_stderr_on_terminal = true;
    let code = match run(&opts) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("launcher: {e}");
            3
        }
    };
    std::process::exit(code);
}

/// This test binary as a launcher process (see [`child_launcher`]) running `script`, its stderr piped to us.
fn spawn_launcher(dir: &TempDir, script: &str) -> Child {
    Command::new(self_exe().unwrap())
        .args(["run_tests::child_launcher", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_SCRIPT_ENV, script)
        .env(CHILD_DIR_ENV, &dir.0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits up to `limit` for the launcher to exit (killing it and failing after that); its status and stderr.
fn finish(mut launcher: Child, limit: Duration) -> (ExitStatus, String) {
    let mut stderr = launcher.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = launcher.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = launcher.kill();
            let _ = launcher.wait();
            panic!("the launcher did not exit within {limit:?}; stderr:\n{}", reader.join().unwrap());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status, reader.join().unwrap())
}

#[test]
fn launcher_stops_ranks_and_sweeps_on_every_stop_signal() {
    for signal in [Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGINT, Signal::SIGTERM] {
        let dir = TempDir::new();
        // Each rank leaves a segment of the job and a process in its group, records both pids, and waits.
        let script = r#"touch "/dev/shm/arx-$ALLREDUCE_JOB_ID-test$RANK"; echo "$ALLREDUCE_JOB_ID" > "$DIR/job"
            sleep 30 & echo $! >> "$DIR/pids"; echo $$ >> "$DIR/pids"; wait"#;
        let launcher = spawn_launcher(&dir, script);
        let deadline = Instant::now() + Duration::from_secs(10);
        while dir.read("pids").lines().count() < 4 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let pids = pids(&dir);
        assert_eq!(pids.len(), 4, "the ranks did not start");
        let job = JobId::parse(dir.read("job").trim()).unwrap();
        kill(Pid::from_raw(launcher.id() as i32), signal).unwrap();
        let (status, stderr) = finish(launcher, Duration::from_secs(5));
        assert_eq!(status.code(), Some(3), "{signal}: {stderr}");
        assert!(stderr.contains(&format!("launcher: interrupted by {signal}; all ranks were stopped")), "{stderr}");
        let deadline = Instant::now() + Duration::from_secs(2);
        while pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(pids.iter().all(|&p| !alive(p)), "{signal}: survivors among {pids:?}");
        let prefix = format!("arx-{job}-");
        let left: Vec<String> = std::fs::read_dir("/dev/shm")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|f| f.starts_with(&prefix))
            .collect();
        assert!(left.is_empty(), "{signal}: left in /dev/shm: {left:?}");
    }
}

#[test]
fn rank0_stderr_is_prefixed_unless_ours_is_a_terminal() {
    let mut opts = LaunchOptions::new(2, "true");
    assert!(pipes_stderr(&opts, 0, true) && pipes_stderr(&opts, 1, true));
    opts.rank0_stderr_on_terminal = true;
    assert!(!pipes_stderr(&opts, 0, true), "rank 0 gets the terminal");
    assert!(pipes_stderr(&opts, 1, true) && pipes_stderr(&opts, 0, false));
    opts.prefix_output = false;
    assert!(!pipes_stderr(&opts, 1, false));
    // End to end, with the launcher's stderr a pipe (whatever ours is): nothing changes.
    let dir = TempDir::new();
    let (status, stderr) = finish(spawn_launcher(&dir, r#"echo "to stderr" >&2"#), Duration::from_secs(10));
    assert!(status.success(), "{stderr}");
    for rank in 0..2 {
        assert!(stderr.lines().any(|l| l == format!("[rank {rank}] to stderr")), "{stderr}");
    }
    assert!(!stderr.lines().any(|l| l == "to stderr"), "{stderr}");
}
