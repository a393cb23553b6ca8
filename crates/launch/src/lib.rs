//! Starting the ranks of a job: either we spawn them ([`run`]) or an external launcher did, and [`detect`]
//! reads who we are from its environment variables. Either way every rank ends up with the same
//! [`ipc::JobId`], which names all shared state of the job.
//!
//! The job id is [`JOB_ENV`] (`ALLREDUCE_JOB_ID`) whenever that is set: our launcher always sets it, and under an
//! external launcher it overrides the id derived from the launcher's job variables. MPICH/Intel MPI's Hydra exports
//! no variable that identifies the job, so under it `ALLREDUCE_JOB_ID` is required.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::hash::Hasher;
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ipc::{JobId, JOB_ENV};
use nix::sys::signal::{killpg, sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::unistd::{getuid, Pid};

mod topology;
pub use topology::{Topology, TopologyError};

pub const RANK_ENV: &str = "RANK";
pub const WORLD_ENV: &str = "WORLD_SIZE";
pub const LOCAL_RANK_ENV: &str = "LOCAL_RANK";
pub const LOCAL_WORLD_ENV: &str = "LOCAL_WORLD_SIZE";
/// Torchrun's index of this rank's node (its agent's group rank).
pub const GROUP_RANK_ENV: &str = "GROUP_RANK";
/// For tests only: the node a rank of our launcher plays, of [`NODES_ENV`] emulated nodes on one machine, so that a
/// design across nodes can be run on one host (two nodes of 4 ranks on one GPU, say). Each emulated node holds
/// consecutive ranks (node-major, as [`Topology`] requires); set both or neither.
pub const NODE_ID_ENV: &str = "ALLREDUCE_NODE_ID";
/// For tests only: how many nodes our launcher's ranks emulate (see [`NODE_ID_ENV`]).
pub const NODES_ENV: &str = "ALLREDUCE_NODES";
/// Where torch.distributed's rendezvous store listens; our launcher sets both, as torchrun does, unless set.
pub const MASTER_ADDR_ENV: &str = "MASTER_ADDR";
pub const MASTER_PORT_ENV: &str = "MASTER_PORT";

/// How often the wait loop polls children and the interrupt flag.
const POLL: Duration = Duration::from_millis(10);

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{var}: {msg}")]
    BadEnv { var: String, msg: String },
    #[error("bad arguments: {0}")]
    BadArgs(String),
    #[error("cannot locate our own executable: {0}")]
    SelfExe(io::Error),
    #[error("spawning rank {rank}: {source}")]
    Spawn { rank: usize, source: io::Error },
    #[error("rank {rank} failed ({status}){}", others_note(others))]
    RankFailed { rank: usize, status: String, others: Vec<(usize, String)> },
    #[error("removing the shared-memory segments of job {job}: {source}")]
    Sweep { job: JobId, source: io::Error },
    #[error(transparent)]
    Ipc(#[from] ipc::IpcError),
    #[error("picking a free {MASTER_PORT_ENV} on 127.0.0.1: {0}")]
    MasterPort(io::Error),
    #[error("interrupted by {signal}; all ranks were stopped")]
    Interrupted { signal: Signal },
}

fn others_note(others: &[(usize, String)]) -> String {
    let list: Vec<String> = others.iter().map(|(r, s)| format!("rank {r}: {s}")).collect();
    if list.is_empty() {
        String::new()
    } else {
        format!("; then {}", list.join(", "))
    }
}

/// Who started this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    Ours,
    Torchrun,
    Mpirun,
    /// MPICH's or Intel MPI's `mpiexec`/`mpirun`, both Hydra.
    Mpich,
    Srun,
    /// No launcher: the program gave its place itself ([`RankInfo::explicit`]).
    Explicit,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Ours => "allreduce launcher",
            Launcher::Torchrun => "torchrun",
            Launcher::Mpirun => "mpirun",
            Launcher::Mpich => "MPICH/Intel MPI (Hydra)",
            Launcher::Srun => "srun",
            Launcher::Explicit => "explicit placement",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankInfo {
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    /// Ranks of the job on this host, where the launcher says (not every launcher does, or does reliably).
    pub local_world: Option<usize>,
    /// This rank's node, numbered from 0, where the launcher says or its placement shows it ([`detect_from`] says
    /// how for each launcher); what a design across nodes groups ranks by ([`Topology::of`]).
    pub node: Option<usize>,
    /// The job's number of nodes, where the launcher says or every node's local world is known to be the same.
    pub nodes: Option<usize>,
    pub job: JobId,
    pub launcher: Launcher,
}

impl RankInfo {
    /// The ranks of the job on this host when the launcher says the job spans several hosts (fewer here than in
    /// the job); `None` for a job on one node, or where the launcher does not say.
    pub fn spans_nodes(&self) -> Option<usize> {
        self.local_world.filter(|&l| l < self.world)
    }

    /// The place of a program that knows it without a launcher; every rank must pass the same `world` and `job`.
    pub fn explicit(rank: usize, world: usize, local_rank: usize, job: JobId) -> Result<RankInfo, LaunchError> {
        if let Some((what, msg)) = misplaced([rank, world, local_rank], None, ["rank", "world", "local_rank", ""]) {
            return Err(LaunchError::BadArgs(format!("{what}: {msg}")));
        }
        let (local_world, node, nodes) = (None, None, None);
        Ok(RankInfo { rank, world, local_rank, local_world, node, nodes, job, launcher: Launcher::Explicit })
    }
}

/// Why `rank`, `world`, `local_rank` and `local_world` cannot be one rank's place, blaming one of them by its name
/// from the last argument (same order); `None` when they can.
fn misplaced(
    [rank, world, local_rank]: [usize; 3],
    local_world: Option<usize>,
    [rank_name, world_name, local_name, local_world_name]: [&str; 4],
) -> Option<(&str, String)> {
    if world == 0 {
        return Some((world_name, "world size 0".into()));
    }
    if rank >= world {
        return Some((rank_name, format!("rank {rank} >= {world_name} {world}")));
    }
    if local_rank >= world {
        return Some((local_name, format!("local rank {local_rank} >= {world_name} {world}")));
    }
    match local_world? {
        0 => Some((local_world_name, "local world size 0".into())),
        n if n > world => Some((local_world_name, format!("local world size {n} > {world_name} {world}"))),
        n if local_rank >= n => Some((local_name, format!("local rank {local_rank} >= {local_world_name} {n}"))),
        _ => None,
    }
}

/// This process's place in a job, from the environment; `None` when no launcher started it.
pub fn detect() -> Result<Option<RankInfo>, LaunchError> {
    let env = std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
    detect_from(&env.collect())
}

/// [`detect`] on an explicit environment, so it can be tested without touching the process's.
///
/// Our launcher's ranks are recognised by [`JOB_ENV`] together with `RANK` and come first, so that an outer
/// launcher's variables they inherit (ours run under `srun -n1`, say) do not count. Torchrun's ranks given an
/// explicit `ALLREDUCE_JOB_ID` therefore read as ours, which they equal in every variable we use.
///
/// The node and the number of nodes: ours run on one host, node 0 of 1 (unless a test emulates nodes with
/// [`NODE_ID_ENV`] and [`NODES_ENV`]); torchrun's node is GROUP_RANK, and its nodes WORLD_SIZE / LOCAL_WORLD_SIZE
/// where that divides; srun's are SLURM_NODEID and SLURM_STEP_TASKS_PER_NODE (checked against the step's node count);
/// OpenMPI and Hydra export no node index, so theirs is derived where the placement shows it (`consecutive_node`).
/// A value out of range or at odds with the others is [`LaunchError::BadEnv`] naming its variable.
pub fn detect_from(env: &HashMap<String, String>) -> Result<Option<RankInfo>, LaunchError> {
    let has = |v: &str| env.contains_key(v);
    let bad = |var: &str, msg: String| LaunchError::BadEnv { var: var.to_string(), msg };
    // (launcher, rank, world, local rank and local world variables, variables that identify the job)
    let (launcher, vars, job_vars): (_, [&str; 4], &[&str]) = if has(JOB_ENV) && has(RANK_ENV) {
        (Launcher::Ours, [RANK_ENV, WORLD_ENV, LOCAL_RANK_ENV, LOCAL_WORLD_ENV], &[])
    } else if has(RANK_ENV) && (has("TORCHELASTIC_RUN_ID") || (has(MASTER_ADDR_ENV) && has(MASTER_PORT_ENV))) {
        (
            Launcher::Torchrun,
            [RANK_ENV, WORLD_ENV, LOCAL_RANK_ENV, LOCAL_WORLD_ENV],
            &["TORCHELASTIC_RUN_ID", MASTER_ADDR_ENV, MASTER_PORT_ENV],
        )
    } else if has("OMPI_COMM_WORLD_RANK") {
        let vars = [
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ];
        (Launcher::Mpirun, vars, &["OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"])
    } else if has("MPI_LOCALRANKID") {
        // Hydra's own variable (PMI_RANK alone is also set by srun's PMI-2 plugin); it comes before srun's because
        // mpiexec inside a Slurm allocation hands its ranks the SLURM_* variables of its proxies.
        if !has("PMI_RANK") && has("PMI_ID") {
            let msg = "not set: Hydra's -pmi-port mode exports PMI_ID and no PMI_SIZE; run mpiexec without it".into();
            return Err(bad("PMI_RANK", msg));
        }
        (Launcher::Mpich, ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"], &[])
    } else if has("SLURM_PROCID") {
        let vars = ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"];
        (Launcher::Srun, vars, &["SLURM_JOB_ID", "SLURM_STEP_ID"])
    } else {
        return Ok(None);
    };
    let num = |var: &str| -> Result<usize, LaunchError> {
        let v = env.get(var).ok_or_else(|| bad(var, format!("not set, but the {launcher} variables are")))?;
        v.trim().parse().map_err(|_| bad(var, format!("{v:?} is not a number")))
    };
    let [rank_var, world_var, local_var, local_world_var] = vars;
    let (rank, world) = (num(rank_var)?, num(world_var)?);
    // Our launcher always sets LOCAL_RANK, but a hand-written environment may leave it out.
    let local_rank = if launcher == Launcher::Ours && !has(local_var) { rank } else { num(local_var)? };
    let slurm = match launcher {
        Launcher::Srun => Some(SlurmNodes::read(env.get(local_world_var).map(String::as_str), world, env)?),
        _ => None,
    };
    let local_world = match (&slurm, env.get(local_world_var)) {
        (Some(slurm), _) => slurm.local_world,
        (None, None) => None,
        (None, Some(_)) => Some(num(local_world_var)?),
    };
    if let Some((var, msg)) = misplaced([rank, world, local_rank], local_world, vars) {
        return Err(bad(var, msg));
    }
    let emulated = has(NODE_ID_ENV) || has(NODES_ENV);
    if emulated && launcher != Launcher::Ours {
        let var = if has(NODE_ID_ENV) { NODE_ID_ENV } else { NODES_ENV };
        return Err(bad(
            var,
            format!("set, but only our launcher's ranks emulate nodes; {launcher} says where ranks run"),
        ));
    }
    let mut place = Place { local_rank, local_world, node: None, nodes: None };
    let node_var = match launcher {
        Launcher::Ours if emulated => {
            place = emulated_node(rank, world, num(NODE_ID_ENV)?, num(NODES_ENV)?)?;
            NODE_ID_ENV
        }
        // Our launcher runs its ranks on one host; a torchrun job given ALLREDUCE_JOB_ID reads as ours (see
        // above), and where its local world says it spans nodes, it is read as torchrun's.
        Launcher::Ours if local_world.is_none_or(|l| l == world) => {
            place.nodes = Some(1);
            GROUP_RANK_ENV
        }
        Launcher::Ours | Launcher::Torchrun => {
            place.node = env.get(GROUP_RANK_ENV).map(|_| num(GROUP_RANK_ENV)).transpose()?;
            place.nodes = local_world.filter(|&l| world.is_multiple_of(l)).map(|l| world / l);
            GROUP_RANK_ENV
        }
        Launcher::Srun => {
            (place.node, place.nodes) = slurm.map_or((None, None), |s| (s.node, s.nodes));
            SLURM_NODE_ENV
        }
        // Neither exports a node index (OpenMPI's OMPI_COMM_WORLD_NODE_RANK is this process's rank on its node
        // across all jobs, not the node's): see `consecutive_node`.
        Launcher::Mpirun | Launcher::Mpich => {
            (place.node, place.nodes) = consecutive_node(rank, world, local_rank, local_world);
            local_world_var
        }
        Launcher::Explicit => unreachable!("no environment names explicit placement"),
    };
    // One node is node 0, whoever says so.
    if place.nodes == Some(1) {
        place.node = place.node.or(Some(0));
    }
    if let (Some(node), Some(nodes)) = (place.node, place.nodes) {
        if node >= nodes {
            return Err(bad(node_var, format!("node {node} >= {nodes} nodes of the job")));
        }
    }
    let job = match env.get(JOB_ENV) {
        Some(id) => JobId::parse(id).map_err(|e| bad(JOB_ENV, e.to_string()))?,
        None => derived_job(launcher, job_vars, env)?,
    };
    let Place { local_rank, local_world, node, nodes } = place;
    Ok(Some(RankInfo { rank, world, local_rank, local_world, node, nodes, job, launcher }))
}

/// Where a rank runs among the job's nodes, as [`detect_from`] reads it.
struct Place {
    local_rank: usize,
    local_world: Option<usize>,
    node: Option<usize>,
    nodes: Option<usize>,
}

/// The place of a rank of our launcher that plays node `node` of `nodes` ([`NODE_ID_ENV`]): each emulated node
/// holds `world / nodes` consecutive ranks, which replace our launcher's one-host LOCAL_RANK and LOCAL_WORLD_SIZE.
fn emulated_node(rank: usize, world: usize, node: usize, nodes: usize) -> Result<Place, LaunchError> {
    let bad = |var: &str, msg: String| LaunchError::BadEnv { var: var.to_string(), msg };
    if nodes == 0 || !world.is_multiple_of(nodes) {
        return Err(bad(NODES_ENV, format!("{nodes} nodes cannot each hold the same share of {world} ranks")));
    }
    let local_world = world / nodes;
    if node != rank / local_world {
        let msg = format!(
            "node {node}, but emulated nodes hold consecutive ranks, {local_world} each, so rank {rank} is on node {}",
            rank / local_world
        );
        return Err(bad(NODE_ID_ENV, msg));
    }
    Ok(Place { local_rank: rank % local_world, local_world: Some(local_world), node: Some(node), nodes: Some(nodes) })
}

/// The node of a launcher that exports none (OpenMPI, Hydra): `rank / local_world`, which is right exactly when
/// every node holds `local_world` consecutive ranks (mpirun's default `--map-by slot` fills one node before the next;
/// its `--map-by node` deals ranks round-robin instead). Each rank checks its own part of that, its local rank being
/// `rank % local_world` (local ranks count a node's ranks in rank order, so if every rank's holds, every node's ranks
/// are consecutive); a rank whose does not gets no node, and [`Topology::of`] refuses it rather than guess.
/// Returns (node, nodes).
fn consecutive_node(
    rank: usize,
    world: usize,
    local_rank: usize,
    local_world: Option<usize>,
) -> (Option<usize>, Option<usize>) {
    let Some(l) = local_world.filter(|&l| world.is_multiple_of(l)) else {
        return (None, None);
    };
    ((local_rank == rank % l).then_some(rank / l), Some(world / l))
}

/// Slurm's index of this task's node in the step (the same as SLURM_STEP_NODEID).
const SLURM_NODE_ENV: &str = "SLURM_NODEID";
/// Slurm's tasks per node of the step.
const SLURM_TASKS_PER_NODE_ENV: &str = "SLURM_STEP_TASKS_PER_NODE";

/// What srun says of the step's nodes.
struct SlurmNodes {
    /// The tasks on this task's node: its entry of the step's tasks per node where SLURM_NODEID says which is ours,
    /// else the count every node runs, if they all run the same.
    local_world: Option<usize>,
    nodes: Option<usize>,
    node: Option<usize>,
}

impl SlurmNodes {
    /// From the step's tasks per node (`tasks_per_node`, such as `4(x2),3`), checked against the step's task count
    /// (`world`) and node count, and SLURM_NODEID.
    fn read(tasks_per_node: Option<&str>, world: usize, env: &HashMap<String, String>) -> Result<Self, LaunchError> {
        let bad = |var: &str, msg: String| LaunchError::BadEnv { var: var.to_string(), msg };
        let num = |var: &str| -> Result<Option<usize>, LaunchError> {
            let Some(v) = env.get(var) else { return Ok(None) };
            v.trim().parse().map(Some).map_err(|_| bad(var, format!("{v:?} is not a number")))
        };
        // SLURM_NNODES is the allocation's under `srun --preserve-env`; SLURM_STEP_NUM_NODES is always the step's.
        let nodes_var = ["SLURM_STEP_NUM_NODES", "SLURM_NNODES"].into_iter().find(|v| env.contains_key(*v));
        let said = nodes_var.map(num).transpose()?.flatten();
        let node = num(SLURM_NODE_ENV)?;
        let Some(list) = tasks_per_node else {
            return Ok(SlurmNodes { local_world: None, nodes: said, node });
        };
        let counts = tasks_per_node_counts(list).map_err(|msg| bad(SLURM_TASKS_PER_NODE_ENV, msg))?;
        let total = |f: fn(&(usize, usize)) -> usize| counts.iter().try_fold(0usize, |sum, c| sum.checked_add(f(c)));
        let (Some(nodes), Some(tasks)) = (total(|&(_, repeat)| repeat), total(|&(n, repeat)| n.saturating_mul(repeat)))
        else {
            return Err(bad(SLURM_TASKS_PER_NODE_ENV, format!("{list:?} counts too many tasks")));
        };
        if tasks != world {
            return Err(bad(
                SLURM_TASKS_PER_NODE_ENV,
                format!("{list:?} counts {tasks} tasks, but the step has {world}"),
            ));
        }
        if let (Some(var), Some(said)) = (nodes_var, said) {
            if said != nodes {
                return Err(bad(var, format!("{said} nodes, but {SLURM_TASKS_PER_NODE_ENV} {list:?} lists {nodes}")));
            }
        }
        let local_world = match node {
            Some(node) => {
                let mut entries = counts.iter().flat_map(|&(n, repeat)| std::iter::repeat_n(n, repeat));
                let here = entries.nth(node);
                Some(here.ok_or_else(|| bad(SLURM_NODE_ENV, format!("node {node} >= {nodes} nodes of the step")))?)
            }
            None => counts.iter().all(|&(n, _)| n == counts[0].0).then_some(counts[0].0),
        };
        Ok(SlurmNodes { local_world, nodes: Some(nodes), node })
    }
}

/// Slurm's tasks per node (`4`, `4(x2)`, `4(x2),3`) as (tasks, nodes that run them) in node order.
fn tasks_per_node_counts(v: &str) -> Result<Vec<(usize, usize)>, String> {
    let count = |item: &str| -> Option<(usize, usize)> {
        let (n, repeat) = item.split_once("(x").unwrap_or((item, "1)"));
        let repeat = repeat.strip_suffix(')')?.parse::<usize>().ok().filter(|&r| r > 0)?;
        Some((n.parse().ok()?, repeat))
    };
    let counts: Option<Vec<(usize, usize)>> = v.trim().split(',').map(count).collect();
    counts.ok_or_else(|| format!("{v:?} is not a list of task counts such as 4(x2),3"))
}

/// A job id every rank of an external launcher computes alike: a hash of the launcher, its job variables and
/// our uid (so two users' jobs never share segment names).
fn derived_job(launcher: Launcher, vars: &[&str], env: &HashMap<String, String>) -> Result<JobId, LaunchError> {
    let set_it = format!(
        "set {JOB_ENV} to the same 16 to 64 lowercase hex digits for every rank, e.g. \
         {JOB_ENV}=$(openssl rand -hex 16) before the launcher command"
    );
    if vars.is_empty() {
        let msg = format!("not set, and {launcher} exports no variable that identifies the job: {set_it}");
        return Err(LaunchError::BadEnv { var: JOB_ENV.to_string(), msg });
    }
    if !vars.iter().any(|v| env.get(*v).is_some_and(|s| !s.is_empty())) {
        let msg =
            format!("none of {vars:?} is set, so the ranks of this {launcher} job cannot agree on a job id: {set_it}");
        return Err(LaunchError::BadEnv { var: vars[0].to_string(), msg });
    }
    let mut text = format!("{launcher}\0{}", getuid());
    for v in vars {
        text += &format!("\0{v}={}", env.get(*v).map_or("", String::as_str));
    }
    let hex: String = (0u8..2).map(|round| format!("{:016x}", fnv1a64(round, text.as_bytes()))).collect();
    JobId::parse(&hex).map_err(LaunchError::from)
}

/// FNV-1a 64, with the round number hashed first so two rounds give independent halves.
fn fnv1a64(round: u8, bytes: &[u8]) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write_u8(round);
    h.write(bytes);
    h.finish()
}

/// Our own executable, for launchers that re-run it as every rank.
pub fn self_exe() -> Result<PathBuf, LaunchError> {
    std::env::current_exe().map_err(LaunchError::SelfExe)
}

#[derive(Clone, Debug)]
pub struct LaunchOptions {
    pub world: usize,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Extra environment for every rank (the rank variables always win; MASTER_ADDR and MASTER_PORT set here or in
    /// ours are kept, otherwise every rank gets 127.0.0.1 and a port that was free).
    pub env: Vec<(String, String)>,
    /// Time between SIGTERM and SIGKILL when stopping ranks.
    pub grace: Duration,
    /// Prefix every output line with "[rank N] "; otherwise children write to our stdout/stderr directly.
    pub prefix_output: bool,
    /// When our stderr is a terminal, rank 0 writes its stderr there directly, unprefixed, so that a progress bar
    /// it draws only on a terminal shows.
    pub rank0_stderr_on_terminal: bool,
}

impl LaunchOptions {
    pub fn new(world: usize, program: impl Into<PathBuf>) -> LaunchOptions {
        let program = program.into();
        LaunchOptions {
            world,
            program,
            args: Vec::new(),
            env: Vec::new(),
            grace: Duration::from_secs(2),
            prefix_output: true,
            rank0_stderr_on_terminal: false,
        }
    }
}

/// The first of [`STOP_SIGNALS`] received while [`run`] has its handler installed; 0 until then.
static INTERRUPTED: AtomicI32 = AtomicI32::new(0);

/// How many [`run`]s are active and the handlers they replaced, so the last one out restores them.
static HANDLERS: Mutex<(usize, Vec<(Signal, SigAction)>)> = Mutex::new((0, Vec::new()));

/// Ctrl-C, kill, a closed terminal and `Ctrl-\` all end the job the same way: ranks stopped, segments swept.
const STOP_SIGNALS: [Signal; 4] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT];

extern "C" fn on_signal(sig: nix::libc::c_int) {
    let _ = INTERRUPTED.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
}

/// Our handler of [`STOP_SIGNALS`] for as long as it lives, so an interrupted launcher stops its ranks first.
struct SignalGuard;

impl SignalGuard {
    fn install() -> SignalGuard {
        let mut state = HANDLERS.lock().unwrap_or_else(|e| e.into_inner());
        if state.0 == 0 {
            INTERRUPTED.store(0, Ordering::SeqCst);
            let ours = SigAction::new(SigHandler::Handler(on_signal), SaFlags::SA_RESTART, SigSet::empty());
            // SAFETY: the handler only touches an atomic, which is async-signal-safe.
            state.1 = STOP_SIGNALS.iter().filter_map(|&s| Some((s, unsafe { sigaction(s, &ours) }.ok()?))).collect();
        }
        state.0 += 1;
        SignalGuard
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        let mut state = HANDLERS.lock().unwrap_or_else(|e| e.into_inner());
        state.0 -= 1;
        if state.0 == 0 {
            for (sig, old) in state.1.drain(..) {
                // SAFETY: reinstates exactly the disposition that was there before us.
                let _ = unsafe { sigaction(sig, &old) };
            }
        }
    }
}

/// One spawned rank: the child (until reaped), its process group and its output pumps.
struct Rank {
    child: Option<Child>,
    pgid: Pid,
    status: Option<ExitStatus>,
    pumps: Vec<JoinHandle<()>>,
}

impl Rank {
    fn signal(&self, sig: Signal) {
        if self.child.is_some() {
            // ESRCH: the group is already gone.
            let _ = killpg(self.pgid, sig);
        }
    }
}

/// Runs `opts.world` copies of `opts.program` as the ranks of a fresh job and waits for them. The first rank
/// that fails gets the others stopped (SIGTERM, after `grace` SIGKILL); no child outlives this call, and the
/// job's shared-memory segments are swept at the end whatever happened.
pub fn run(opts: &LaunchOptions) -> Result<(), LaunchError> {
    if !(1..=ipc::MAX_WORLD).contains(&opts.world) {
        return Err(LaunchError::BadArgs(format!("world {} not in 1..={}", opts.world, ipc::MAX_WORLD)));
    }
    if !program_exists(&opts.program) {
        return Err(LaunchError::BadArgs(format!("program {} not found", opts.program.display())));
    }
    let job = JobId::random();
    let master = master_env(opts)?;
    let _signals = SignalGuard::install();
    let mut ranks = Vec::with_capacity(opts.world);
    let mut outcome = None;
    for rank in 0..opts.world {
        match spawn(opts, &job, &master, rank) {
            Ok(r) => ranks.push(r),
            Err(source) => {
                outcome = Some(LaunchError::Spawn { rank, source });
                break;
            }
        }
    }
    let outcome = supervise(&mut ranks, opts.grace, outcome);
    for r in &mut ranks {
        // Whatever a rank left running in its group (which may hold our pipes open) goes with it.
        let _ = killpg(r.pgid, Signal::SIGKILL);
        for pump in r.pumps.drain(..) {
            let _ = pump.join();
        }
    }
    let swept = ipc::sweep_segments(&job);
    outcome.map_or(Ok(()), Err)?;
    swept.map(drop).map_err(|source| LaunchError::Sweep { job, source })
}

/// Reaps every rank; on the first failure (or a spawn error passed in as `outcome`, or our own interruption)
/// stops the rest. Returns what ended the job badly, if anything.
fn supervise(ranks: &mut [Rank], grace: Duration, mut outcome: Option<LaunchError>) -> Option<LaunchError> {
    let mut kill_at = outcome.is_some().then(|| stop(ranks, grace));
    let mut first_failure = None;
    while ranks.iter().any(|r| r.child.is_some()) {
        for (rank, r) in ranks.iter_mut().enumerate() {
            let Some(child) = r.child.as_mut() else {
                continue;
            };
            match child.try_wait() {
                Ok(None) => continue,
                Ok(Some(status)) => r.status = Some(status),
                // The child cannot be waited for (not ours any more); treat it as gone.
                Err(_) => {}
            }
            r.child = None;
            if r.status.is_some_and(|s| !s.success()) && outcome.is_none() && first_failure.is_none() {
                first_failure = Some(rank);
            }
        }
        if outcome.is_none() && first_failure.is_none() {
            // 0, nothing received yet, is no signal.
            if let Ok(signal) = Signal::try_from(INTERRUPTED.load(Ordering::SeqCst)) {
                outcome = Some(LaunchError::Interrupted { signal });
            }
        }
        if kill_at.is_none() && (outcome.is_some() || first_failure.is_some()) {
            kill_at = Some(stop(ranks, grace));
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            ranks.iter().for_each(|r| r.signal(Signal::SIGKILL));
        }
        std::thread::sleep(POLL);
    }
    outcome.or_else(|| {
        let rank = first_failure?;
        let describe = |r: &Rank| r.status.map_or("not waitable".to_string(), describe);
        let others = ranks
            .iter()
            .enumerate()
            .filter(|(i, r)| *i != rank && !r.status.is_some_and(|s| s.success()))
            .map(|(i, r)| (i, describe(r)))
            .collect();
        Some(LaunchError::RankFailed { rank, status: describe(&ranks[rank]), others })
    })
}

/// Sends SIGTERM to every live rank; returns when SIGKILL is due.
fn stop(ranks: &[Rank], grace: Duration) -> Instant {
    ranks.iter().for_each(|r| r.signal(Signal::SIGTERM));
    Instant::now() + grace
}

/// "exit code 3" or "killed by SIGKILL".
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => match Signal::try_from(sig) {
            Ok(s) => format!("killed by {}", s.as_str()),
            Err(_) => format!("killed by signal {sig}"),
        },
        _ => status.to_string(),
    }
}

fn program_exists(program: &Path) -> bool {
    if program.components().count() > 1 {
        return program.is_file();
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| dir.join(program).is_file())
}

/// MASTER_ADDR and MASTER_PORT for every rank, so torch.distributed runs under us as under torchrun; those that
/// our environment or `opts.env` sets are left to it.
fn master_env(opts: &LaunchOptions) -> Result<Vec<(&'static str, String)>, LaunchError> {
    let set = |var: &str| std::env::var_os(var).is_some() || opts.env.iter().any(|(k, _)| k == var);
    let mut env = Vec::new();
    if !set(MASTER_ADDR_ENV) {
        env.push((MASTER_ADDR_ENV, Ipv4Addr::LOCALHOST.to_string()));
    }
    if !set(MASTER_PORT_ENV) {
        // Free now; rank 0's store binds it moments later, which is all torchrun's own choice guarantees too.
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr());
        env.push((MASTER_PORT_ENV, port.map_err(LaunchError::MasterPort)?.port().to_string()));
    }
    Ok(env)
}

/// Whether `rank`'s stderr goes through a prefixing pump rather than straight to ours.
fn pipes_stderr(opts: &LaunchOptions, rank: usize, our_stderr_is_terminal: bool) -> bool {
    opts.prefix_output && !(rank == 0 && opts.rank0_stderr_on_terminal && our_stderr_is_terminal)
}

fn spawn(opts: &LaunchOptions, job: &JobId, master: &[(&str, String)], rank: usize) -> io::Result<Rank> {
    let mut cmd = Command::new(&opts.program);
    let world = opts.world.to_string();
    cmd.args(&opts.args)
        .envs(master.iter().map(|(k, v)| (k, v)))
        .envs(opts.env.iter().map(|(k, v)| (k, v)))
        .env(RANK_ENV, rank.to_string())
        .env(WORLD_ENV, &world)
        .env(LOCAL_RANK_ENV, rank.to_string())
        .env(LOCAL_WORLD_ENV, &world)
        .env(JOB_ENV, job.as_str())
        // Its own group, so stopping a rank also stops whatever it started.
        .process_group(0);
    if rank > 0 {
        cmd.stdin(Stdio::null());
    }
    if opts.prefix_output {
        cmd.stdout(Stdio::piped());
    }
    if pipes_stderr(opts, rank, io::stderr().is_terminal()) {
        cmd.stderr(Stdio::piped());
    }
    // SAFETY: prctl is async-signal-safe. Dying with us covers the case where we are SIGKILLed ourselves.
    unsafe {
        cmd.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from));
    }
    let mut child = cmd.spawn()?;
    let prefix = format!("[rank {rank}] ");
    let mut pumps = Vec::new();
    if let Some(out) = child.stdout.take() {
        let prefix = prefix.clone();
        pumps.push(std::thread::spawn(move || pump(out, &prefix, io::stdout())));
    }
    if let Some(err) = child.stderr.take() {
        pumps.push(std::thread::spawn(move || pump(err, &prefix, io::stderr())));
    }
    let pgid = Pid::from_raw(child.id() as i32);
    Ok(Rank { child: Some(child), pgid, status: None, pumps })
}

/// Copies `src` to `dst` line by line, each line prefixed and written in one piece so ranks do not interleave
/// within a line. Stops quietly when either side closes.
fn pump(src: impl Read, prefix: &str, mut dst: impl Write) {
    let mut src = BufReader::new(src);
    let mut line = prefix.as_bytes().to_vec();
    while matches!(src.read_until(b'\n', &mut line), Ok(n) if n > 0) {
        if !line.ends_with(b"\n") {
            line.push(b'\n');
        }
        if dst.write_all(&line).is_err() {
            return;
        }
        line.truncate(prefix.len());
    }
}

#[cfg(test)]
mod run_tests;
#[cfg(test)]
mod tests;
