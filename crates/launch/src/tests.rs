use super::*;
use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::getpid;
use std::sync::RwLock;

/// run() tests share the process; the one that signals the whole process runs alone.
static SIGNALS: RwLock<()> = RwLock::new(());

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn bad_var(r: Result<Option<RankInfo>, LaunchError>) -> String {
    match r {
        Err(LaunchError::BadEnv { var, .. }) => var,
        other => panic!("expected BadEnv, got {other:?}"),
    }
}

#[test]
fn detects_our_launcher() {
    let job = JobId::random();
    let e = env(&[("RANK", "2"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "2"), (JOB_ENV, job.as_str())]);
    let info = detect_from(&e).unwrap().unwrap();
    assert_eq!(info, RankInfo { rank: 2, world: 4, local_rank: 2, job, launcher: Launcher::Ours });
    assert_eq!(info.launcher.to_string(), "allreduce launcher");
    let mut e = e;
    e.insert(JOB_ENV.into(), "NOT-HEX".into());
    assert_eq!(bad_var(detect_from(&e)), JOB_ENV);
}

/// A launcher, its variables ("R" stands for the rank), and the variable that holds the rank.
type Case = (Launcher, Vec<(&'static str, &'static str)>, &'static str);

#[test]
fn detects_external_launchers_with_agreeing_job_ids() {
    let cases: [Case; 4] = [
        (Launcher::Torchrun, vec![("WORLD_SIZE", "4"), ("LOCAL_RANK", "R"), ("TORCHELASTIC_RUN_ID", "x")], "RANK"),
        (
            Launcher::Torchrun,
            vec![("WORLD_SIZE", "4"), ("LOCAL_RANK", "R"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "29500")],
            "RANK",
        ),
        (
            Launcher::Mpirun,
            vec![("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_LOCAL_RANK", "R"), ("PMIX_NAMESPACE", "p")],
            "OMPI_COMM_WORLD_RANK",
        ),
        (
            Launcher::Srun,
            vec![("SLURM_NTASKS", "4"), ("SLURM_LOCALID", "R"), ("SLURM_JOB_ID", "7"), ("SLURM_STEP_ID", "0")],
            "SLURM_PROCID",
        ),
    ];
    let mut jobs = Vec::new();
    for (launcher, vars, rank_var) in cases {
        let infos: Vec<RankInfo> = (0..4)
            .map(|rank| {
                let r = rank.to_string();
                let mut e = env(&vars);
                e.values_mut().filter(|v| *v == "R").for_each(|v| *v = r.clone());
                e.insert(rank_var.into(), r);
                detect_from(&e).unwrap().unwrap()
            })
            .collect();
        for (rank, info) in infos.iter().enumerate() {
            assert_eq!((info.rank, info.world, info.local_rank, info.launcher), (rank, 4, rank, launcher));
            assert_eq!(info.job, infos[0].job, "ranks must agree on the job id");
        }
        assert_eq!(infos[0].job.as_str().len(), 32);
        jobs.push(infos[0].job.clone());
    }
    jobs.dedup();
    assert_eq!(jobs.len(), 4, "different jobs get different ids");
    let other = env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4"), ("SLURM_LOCALID", "0"), ("SLURM_JOB_ID", "8")]);
    assert_ne!(detect_from(&other).unwrap().unwrap().job, jobs[3]);
}

#[test]
fn inconsistent_environments_name_the_variable() {
    assert_eq!(detect_from(&env(&[("RANK", "0"), ("WORLD_SIZE", "2")])).unwrap(), None, "no launcher");
    assert_eq!(detect_from(&HashMap::new()).unwrap(), None);
    let torch = |rank: &str, world: &str, local: &str| {
        env(&[("RANK", rank), ("WORLD_SIZE", world), ("LOCAL_RANK", local), ("TORCHELASTIC_RUN_ID", "x")])
    };
    assert_eq!(bad_var(detect_from(&torch("4", "4", "0"))), "RANK");
    assert_eq!(bad_var(detect_from(&torch("0", "0", "0"))), "WORLD_SIZE");
    assert_eq!(bad_var(detect_from(&torch("0", "four", "0"))), "WORLD_SIZE");
    assert_eq!(bad_var(detect_from(&torch("0", "4", "-1"))), "LOCAL_RANK");
    let no_job =
        env(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1"), ("OMPI_COMM_WORLD_LOCAL_RANK", "0")]);
    assert_eq!(bad_var(detect_from(&no_job)), "OMPI_MCA_ess_base_jobid");
    let no_size = env(&[("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0"), ("SLURM_JOB_ID", "1")]);
    assert_eq!(bad_var(detect_from(&no_size)), "SLURM_NTASKS");
}

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

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sh(world: usize, dir: &TempDir, script: &str) -> LaunchOptions {
    let mut opts = LaunchOptions::new(world, "/bin/sh");
    opts.args = vec!["-c".into(), script.into()];
    opts.env = vec![("DIR".into(), dir.0.display().to_string()), ("RANK".into(), "overridden".into())];
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

#[test]
fn all_ranks_succeed_with_their_environment() {
    let _shared = SIGNALS.read().unwrap();
    let dir = TempDir::new();
    let script =
        r#"echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $ALLREDUCE_JOB_ID" > "$DIR/out.$RANK"; echo hello"#;
    run(&sh(3, &dir, script)).unwrap();
    let lines: Vec<Vec<String>> =
        (0..3).map(|r| dir.read(&format!("out.{r}")).split_whitespace().map(String::from).collect()).collect();
    for (r, l) in lines.iter().enumerate() {
        assert_eq!(l[..4], [r.to_string(), "3".into(), r.to_string(), "3".into()]);
        assert_eq!(l[4], lines[0][4], "one job id for all ranks");
        JobId::parse(&l[4]).unwrap();
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
    assert!(matches!(run(&opts), Err(LaunchError::Interrupted)));
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
