//! The detection of every launcher's environment: ranks, nodes and job ids (the launcher's own runs are tested in
//! `run_tests.rs`).

use super::*;
use std::collections::HashSet;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The variable a detection error names, and its message.
fn bad_env(r: Result<Option<RankInfo>, LaunchError>) -> (String, String) {
    match r {
        Err(LaunchError::BadEnv { var, msg }) => (var, msg),
        other => panic!("expected BadEnv, got {other:?}"),
    }
}

fn bad_var(r: Result<Option<RankInfo>, LaunchError>) -> String {
    bad_env(r).0
}

#[test]
fn detects_our_launcher() {
    let job = JobId::random();
    let e = env(&[("RANK", "2"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "2"), (JOB_ENV, job.as_str())]);
    let info = detect_from(&e).unwrap().unwrap();
    let (node, nodes) = (Some(0), Some(1));
    let expected = RankInfo {
        rank: 2,
        world: 4,
        local_rank: 2,
        local_world: None,
        node,
        nodes,
        job: job.clone(),
        launcher: Launcher::Ours,
    };
    assert_eq!(info, expected);
    assert_eq!(info.launcher.to_string(), "allreduce launcher");
    let mut e = e;
    e.insert(LOCAL_WORLD_ENV.into(), "4".into());
    assert_eq!(detect_from(&e).unwrap().unwrap().local_world, Some(4));
    // An outer launcher's variables, inherited by our ranks, do not count.
    e.extend(env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1"), ("PMI_RANK", "0"), ("MPI_LOCALRANKID", "0")]));
    assert_eq!(detect_from(&e).unwrap().unwrap().launcher, Launcher::Ours);
    e.insert(LOCAL_WORLD_ENV.into(), "two".into());
    assert_eq!(bad_var(detect_from(&e)), LOCAL_WORLD_ENV);
    e.insert(LOCAL_WORLD_ENV.into(), "4".into());
    e.insert(JOB_ENV.into(), "NOT-HEX".into());
    assert_eq!(bad_var(detect_from(&e)), JOB_ENV);
}

/// A launcher, its variables ("R" stands for the rank), the variable that holds the rank, and the local world.
type Case = (Launcher, Vec<(&'static str, &'static str)>, &'static str, Option<usize>);

const MPICH_JOB: &str = "0123456789abcdef0123456789abcdef";
const INTEL_JOB: &str = "fedcba9876543210fedcba9876543210";

#[test]
fn detects_external_launchers_with_agreeing_job_ids() {
    let cases: [Case; 7] = [
        (
            Launcher::Torchrun,
            vec![("WORLD_SIZE", "4"), ("LOCAL_RANK", "R"), ("LOCAL_WORLD_SIZE", "4"), ("TORCHELASTIC_RUN_ID", "x")],
            "RANK",
            Some(4),
        ),
        (
            Launcher::Torchrun,
            vec![("WORLD_SIZE", "4"), ("LOCAL_RANK", "R"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "29500")],
            "RANK",
            None,
        ),
        (
            Launcher::Mpirun,
            vec![
                ("OMPI_COMM_WORLD_SIZE", "4"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "R"),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
                ("PMIX_NAMESPACE", "p"),
            ],
            "OMPI_COMM_WORLD_RANK",
            Some(4),
        ),
        (
            Launcher::Srun,
            vec![
                ("SLURM_NTASKS", "4"),
                ("SLURM_LOCALID", "R"),
                ("SLURM_STEP_TASKS_PER_NODE", "4"),
                ("SLURM_JOB_ID", "7"),
                ("SLURM_STEP_ID", "0"),
            ],
            "SLURM_PROCID",
            Some(4),
        ),
        // MPICH's mpiexec as Hydra sets it up by default, given a job id; PMI_FD differs between ranks.
        (
            Launcher::Mpich,
            vec![
                ("PMI_SIZE", "4"),
                ("PMI_FD", "R"),
                ("MPI_LOCALRANKID", "R"),
                ("MPI_LOCALNRANKS", "4"),
                ("PMI_HOSTNAME", "node1"),
                (JOB_ENV, MPICH_JOB),
            ],
            "PMI_RANK",
            Some(4),
        ),
        // Intel MPI's mpirun (Hydra too), inside a Slurm allocation whose variables its ranks inherit.
        (
            Launcher::Mpich,
            vec![
                ("PMI_SIZE", "4"),
                ("PMI_FD", "R"),
                ("MPI_LOCALRANKID", "R"),
                ("MPI_LOCALNRANKS", "4"),
                ("I_MPI_ROOT", "/opt/intel/oneapi/mpi/latest"),
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "1"),
                ("SLURM_LOCALID", "0"),
                ("SLURM_JOB_ID", "9"),
                (JOB_ENV, INTEL_JOB),
            ],
            "PMI_RANK",
            Some(4),
        ),
        // srun's PMI-2 plugin sets PMI_RANK too, but not Hydra's MPI_LOCALRANKID; nodes of different task counts.
        (
            Launcher::Srun,
            vec![
                ("SLURM_NTASKS", "6"),
                ("SLURM_LOCALID", "R"),
                ("SLURM_STEP_TASKS_PER_NODE", "4,2"),
                ("PMI_RANK", "R"),
                ("PMI_SIZE", "6"),
                ("SLURM_JOB_ID", "7"),
                ("SLURM_STEP_ID", "1"),
            ],
            "SLURM_PROCID",
            None,
        ),
    ];
    let mut jobs = Vec::new();
    for (launcher, vars, rank_var, local_world) in cases {
        let infos: Vec<RankInfo> = (0..4)
            .map(|rank| {
                let r = rank.to_string();
                let mut e = env(&vars);
                e.values_mut().filter(|v| *v == "R").for_each(|v| *v = r.clone());
                e.insert(rank_var.into(), r);
                detect_from(&e).unwrap().unwrap()
            })
            .collect();
        let world = if vars.contains(&("SLURM_NTASKS", "6")) { 6 } else { 4 };
        for (rank, info) in infos.iter().enumerate() {
            assert_eq!(
                (info.rank, info.world, info.local_rank, info.local_world, info.launcher),
                (rank, world, rank, local_world, launcher)
            );
            assert_eq!(info.job, infos[0].job, "ranks must agree on the job id");
        }
        assert_eq!(infos[0].job.as_str().len(), 32);
        jobs.push(infos[0].job.clone());
    }
    assert_eq!((jobs[4].as_str(), jobs[5].as_str()), (MPICH_JOB, INTEL_JOB));
    assert_eq!(jobs.iter().collect::<HashSet<_>>().len(), jobs.len(), "different jobs get different ids");
    let other = env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4"), ("SLURM_LOCALID", "0"), ("SLURM_JOB_ID", "8")]);
    assert_ne!(detect_from(&other).unwrap().unwrap().job, jobs[3]);
    assert_eq!(Launcher::Mpich.to_string(), "MPICH/Intel MPI (Hydra)");
}

#[test]
fn a_job_over_several_nodes_is_known_from_every_launcher() {
    let torchrun = [("RANK", "5"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "4")];
    let torchrun =
        [&torchrun[..], &[("TORCHELASTIC_RUN_ID", "r"), ("MASTER_ADDR", "a"), ("MASTER_PORT", "1")]].concat();
    let mpirun = [
        ("OMPI_COMM_WORLD_RANK", "5"),
        ("OMPI_COMM_WORLD_SIZE", "8"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ("OMPI_MCA_ess_base_jobid", "7"),
    ];
    let hydra = [("PMI_RANK", "5"), ("PMI_SIZE", "8"), ("MPI_LOCALRANKID", "1"), ("MPI_LOCALNRANKS", "4")];
    let hydra = [&hydra[..], &[("ALLREDUCE_JOB_ID", "0123456789abcdef")]].concat();
    let srun =
        [("SLURM_PROCID", "5"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "1"), ("SLURM_STEP_TASKS_PER_NODE", "4(x2)")];
    let srun = [&srun[..], &[("SLURM_JOB_ID", "9"), ("SLURM_STEP_ID", "0")]].concat();
    for pairs in [&torchrun[..], &mpirun, &hydra, &srun] {
        let info = detect_from(&env(pairs)).unwrap().unwrap();
        assert_eq!(info.spans_nodes(), Some(4), "{pairs:?}");
    }
    let one_node = [("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "4")];
    let one_node = [&one_node[..], &[("ALLREDUCE_JOB_ID", "0123456789abcdef")]].concat();
    assert_eq!(detect_from(&env(&one_node)).unwrap().unwrap().spans_nodes(), None);
}

/// The environment of rank `rank` of a job of 2 nodes of 4 ranks under each launcher, ranks placed node-major; the
/// launcher's variables first, then (for ours) the emulation override.
fn two_nodes_of_four(launcher: Launcher, rank: usize) -> HashMap<String, String> {
    let (r, local, node) = (rank.to_string(), (rank % 4).to_string(), (rank / 4).to_string());
    let pairs: Vec<(&str, &str)> = match launcher {
        Launcher::Torchrun => vec![
            ("RANK", &r),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", &local),
            ("LOCAL_WORLD_SIZE", "4"),
            ("GROUP_RANK", &node),
            ("TORCHELASTIC_RUN_ID", "run"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
        ],
        Launcher::Srun => vec![
            ("SLURM_PROCID", &r),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", &local),
            ("SLURM_NODEID", &node),
            ("SLURM_NNODES", "2"),
            ("SLURM_STEP_TASKS_PER_NODE", "4(x2)"),
            ("SLURM_JOB_ID", "7"),
            ("SLURM_STEP_ID", "0"),
        ],
        Launcher::Mpirun => vec![
            ("OMPI_COMM_WORLD_RANK", &r),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", &local),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            // This process's rank on its node across all jobs: not the node's index, and not read.
            ("OMPI_COMM_WORLD_NODE_RANK", &local),
            ("PMIX_NAMESPACE", "p"),
        ],
        Launcher::Mpich => vec![
            ("PMI_RANK", &r),
            ("PMI_SIZE", "8"),
            ("MPI_LOCALRANKID", &local),
            ("MPI_LOCALNRANKS", "4"),
            (JOB_ENV, MPICH_JOB),
        ],
        // As our launcher sets them (one host), with the override a test adds.
        Launcher::Ours => vec![
            ("RANK", &r),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", &r),
            ("LOCAL_WORLD_SIZE", "8"),
            (JOB_ENV, MPICH_JOB),
            (NODE_ID_ENV, &node),
            (NODES_ENV, "2"),
        ],
        Launcher::Explicit => unreachable!("no environment"),
    };
    env(&pairs)
}

const LAUNCHERS: [Launcher; 5] =
    [Launcher::Torchrun, Launcher::Srun, Launcher::Mpirun, Launcher::Mpich, Launcher::Ours];

#[test]
fn every_launcher_places_ranks_on_nodes() {
    for launcher in LAUNCHERS {
        for rank in 0..8 {
            let info = detect_from(&two_nodes_of_four(launcher, rank)).unwrap().unwrap();
            let what = format!("{launcher}, rank {rank}");
            assert_eq!(info.launcher, launcher, "{what}");
            assert_eq!(
                (info.rank, info.world, info.local_rank, info.local_world, info.node, info.nodes),
                (rank, 8, rank % 4, Some(4), Some(rank / 4), Some(2)),
                "{what}"
            );
            assert_eq!(info.spans_nodes(), Some(4), "{what}");
            let topo = Topology::of(&info).unwrap();
            assert_eq!(topo, Topology::new(rank, 8, 2, rank / 4, rank % 4).unwrap(), "{what}");
            assert_eq!(
                topo.to_string(),
                format!("rank {rank} of 8: local rank {} of 4 on node {} of 2", rank % 4, rank / 4)
            );
        }
        let info = detect_from(&two_nodes_of_four(launcher, 5)).unwrap().unwrap();
        let topo = Topology::of(&info).unwrap();
        assert_eq!((topo.node_group(), topo.rail()), (vec![4, 5, 6, 7], vec![1, 5]), "{launcher}");
    }
}

#[test]
fn one_node_is_node_zero_of_one() {
    let job = JobId::random();
    let ours = env(&[
        ("RANK", "2"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "2"),
        ("LOCAL_WORLD_SIZE", "4"),
        (JOB_ENV, job.as_str()),
    ]);
    let torchrun = env(&[
        ("RANK", "2"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "2"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("TORCHELASTIC_RUN_ID", "r"),
    ]);
    let srun = env(&[
        ("SLURM_PROCID", "2"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_LOCALID", "2"),
        ("SLURM_STEP_TASKS_PER_NODE", "4"),
        ("SLURM_JOB_ID", "1"),
    ]);
    let ompi = env(&[
        ("OMPI_COMM_WORLD_RANK", "2"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ("PMIX_NAMESPACE", "p"),
    ]);
    for e in [ours, torchrun, srun, ompi] {
        let info = detect_from(&e).unwrap().unwrap();
        assert_eq!((info.node, info.nodes, info.spans_nodes()), (Some(0), Some(1), None), "{e:?}");
        let topo = Topology::of(&info).unwrap();
        assert_eq!((topo.node_group(), topo.rail()), (vec![0, 1, 2, 3], vec![2]));
    }
    // An outer torchrun's node, inherited by our launcher's ranks, does not count: ours run on one host.
    let mut nested = env(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")]);
    nested.extend(env(&[(JOB_ENV, job.as_str()), ("GROUP_RANK", "3")]));
    assert_eq!(detect_from(&nested).unwrap().unwrap().node, Some(0));
    // A torchrun job given ALLREDUCE_JOB_ID reads as ours, and where it spans nodes, as torchrun's.
    let mut torchrun = two_nodes_of_four(Launcher::Torchrun, 6);
    torchrun.insert(JOB_ENV.into(), job.to_string());
    let info = detect_from(&torchrun).unwrap().unwrap();
    assert_eq!((info.launcher, info.node, info.nodes), (Launcher::Ours, Some(1), Some(2)));
}

#[test]
fn nodes_only_where_the_launcher_shows_them() {
    // torchrun without GROUP_RANK (a hand-written environment) knows the nodes but not which is ours; one whose
    // local world does not divide the world has nodes of different sizes, and no count.
    let mut torchrun = two_nodes_of_four(Launcher::Torchrun, 5);
    torchrun.remove("GROUP_RANK");
    let info = detect_from(&torchrun).unwrap().unwrap();
    assert_eq!((info.node, info.nodes), (None, Some(2)));
    let e = Topology::of(&info).unwrap_err();
    assert!(matches!(e, TopologyError::Unknown { what: "this rank's node", .. }), "{e}");
    assert!(e.to_string().contains("GROUP_RANK"), "{e}");
    torchrun.extend(env(&[("WORLD_SIZE", "7"), ("GROUP_RANK", "1")]));
    let info = detect_from(&torchrun).unwrap().unwrap();
    assert_eq!((info.node, info.nodes), (Some(1), None));
    assert!(matches!(Topology::of(&info), Err(TopologyError::Unknown { what: "the number of nodes", .. })));

    // srun with nodes of different task counts: SLURM_NODEID says which entry is ours; a topology refuses them.
    let srun = |rank: &str, local: &str, node: Option<&str>| {
        let mut e = env(&[
            ("SLURM_PROCID", rank),
            ("SLURM_NTASKS", "6"),
            ("SLURM_LOCALID", local),
            ("SLURM_STEP_TASKS_PER_NODE", "4,2"),
            ("SLURM_JOB_ID", "7"),
        ]);
        e.extend(node.map(|n| (SLURM_NODE_ENV.to_string(), n.to_string())));
        detect_from(&e).unwrap().unwrap()
    };
    let info = srun("5", "1", Some("1"));
    assert_eq!((info.local_world, info.node, info.nodes, info.spans_nodes()), (Some(2), Some(1), Some(2), Some(2)));
    let e = Topology::of(&info).unwrap_err();
    assert_eq!(e, TopologyError::NotUniform { world: 6, nodes: 2, local_world: Some(2) });
    assert_eq!(e.to_string(), "6 ranks on 2 nodes (2 on this one): every node must run the same number of ranks");
    assert_eq!(srun("1", "1", Some("0")).local_world, Some(4));
    let info = srun("5", "1", None);
    assert_eq!((info.local_world, info.node, info.nodes), (None, None, Some(2)));
    // srun without its tasks per node: the count from SLURM_NNODES, no local world.
    let bare = env(&[
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "1"),
        ("SLURM_NNODES", "2"),
        ("SLURM_JOB_ID", "7"),
    ]);
    let info = detect_from(&bare).unwrap().unwrap();
    assert_eq!((info.local_world, info.node, info.nodes), (None, Some(1), Some(2)));
    assert!(matches!(Topology::of(&info), Err(TopologyError::Unknown { what: "the ranks on this node", .. })));

    // OpenMPI and Hydra: the node is derived only where the rank's local rank shows node-major placement.
    // `mpirun --map-by node` deals ranks round-robin: rank 1 is local rank 0 of the second node.
    for launcher in [Launcher::Mpirun, Launcher::Mpich] {
        let mut cyclic = two_nodes_of_four(launcher, 1);
        let local_var = if launcher == Launcher::Mpirun { "OMPI_COMM_WORLD_LOCAL_RANK" } else { "MPI_LOCALRANKID" };
        cyclic.insert(local_var.into(), "0".into());
        let info = detect_from(&cyclic).unwrap().unwrap();
        assert_eq!((info.local_rank, info.node, info.nodes), (0, None, Some(2)), "{launcher}");
        let e = Topology::of(&info).unwrap_err();
        assert!(e.to_string().contains("exports no node index") && e.to_string().contains("consecutive"), "{e}");
        // A local size that does not divide the world: nodes of different sizes.
        let size_var = if launcher == Launcher::Mpirun { "OMPI_COMM_WORLD_LOCAL_SIZE" } else { "MPI_LOCALNRANKS" };
        let mut uneven = two_nodes_of_four(launcher, 1);
        uneven.insert(size_var.into(), "3".into());
        let info = detect_from(&uneven).unwrap().unwrap();
        assert_eq!((info.local_world, info.node, info.nodes), (Some(3), None, None), "{launcher}");
    }
}

#[test]
fn inconsistent_node_variables_name_the_variable() {
    let with = |launcher: Launcher, rank: usize, pairs: &[(&str, &str)]| {
        let mut e = two_nodes_of_four(launcher, rank);
        for (k, v) in pairs {
            match *v {
                "-" => e.remove(*k),
                v => e.insert(k.to_string(), v.to_string()),
            };
        }
        detect_from(&e)
    };
    let torchrun = Launcher::Torchrun;
    assert_eq!(
        bad_env(with(torchrun, 5, &[("GROUP_RANK", "2")])),
        ("GROUP_RANK".into(), "node 2 >= 2 nodes of the job".into())
    );
    assert_eq!(bad_var(with(torchrun, 5, &[("GROUP_RANK", "one")])), "GROUP_RANK");

    let srun = Launcher::Srun;
    assert_eq!(bad_var(with(srun, 5, &[("SLURM_NODEID", "2")])), "SLURM_NODEID");
    assert_eq!(bad_var(with(srun, 5, &[("SLURM_NODEID", "x")])), "SLURM_NODEID");
    assert_eq!(
        bad_env(with(srun, 5, &[("SLURM_NNODES", "3")])),
        ("SLURM_NNODES".into(), "3 nodes, but SLURM_STEP_TASKS_PER_NODE \"4(x2)\" lists 2".into())
    );
    // The step's own count wins over SLURM_NNODES, which `srun --preserve-env` leaves at the allocation's.
    let info = with(srun, 5, &[("SLURM_NNODES", "5"), ("SLURM_STEP_NUM_NODES", "2")]).unwrap().unwrap();
    assert_eq!((info.node, info.nodes), (Some(1), Some(2)));
    assert_eq!(bad_var(with(srun, 5, &[("SLURM_STEP_NUM_NODES", "3")])), "SLURM_STEP_NUM_NODES");
    let (var, msg) = bad_env(with(srun, 5, &[("SLURM_STEP_TASKS_PER_NODE", "4(x3)")]));
    assert_eq!(
        (var.as_str(), msg.as_str()),
        ("SLURM_STEP_TASKS_PER_NODE", "\"4(x3)\" counts 12 tasks, but the step has 8")
    );
    for garbled in ["4(x0)", "4(x2", "99999999999999999999(x2)", "9223372036854775807(x3)"] {
        assert_eq!(
            bad_var(with(srun, 5, &[("SLURM_STEP_TASKS_PER_NODE", garbled)])),
            "SLURM_STEP_TASKS_PER_NODE",
            "{garbled}"
        );
    }

    let ours = Launcher::Ours;
    assert_eq!(bad_var(with(ours, 5, &[(NODES_ENV, "-")])), NODES_ENV);
    assert_eq!(bad_var(with(ours, 5, &[(NODE_ID_ENV, "-")])), NODE_ID_ENV);
    for nodes in ["3", "0", "16", "two"] {
        assert_eq!(bad_var(with(ours, 5, &[(NODES_ENV, nodes)])), NODES_ENV, "{nodes} nodes");
    }
    let (var, msg) = bad_env(with(ours, 5, &[(NODE_ID_ENV, "0")]));
    assert_eq!(var, NODE_ID_ENV);
    assert!(msg.contains("consecutive") && msg.contains("rank 5 is on node 1"), "{msg}");
    assert_eq!(bad_var(with(ours, 5, &[(NODE_ID_ENV, "2")])), NODE_ID_ENV);
    // Only our launcher's ranks emulate nodes: under another launcher the override is an error, not ignored.
    let (var, msg) = bad_env(with(torchrun, 5, &[(NODE_ID_ENV, "1"), (NODES_ENV, "2")]));
    assert_eq!(var, NODE_ID_ENV);
    assert!(msg.contains("torchrun says where ranks run"), "{msg}");
    assert_eq!(bad_var(with(Launcher::Mpirun, 5, &[(NODES_ENV, "2")])), NODES_ENV);
}

#[test]
fn topologies_that_are_not_node_major_or_uniform_are_refused() {
    // torchrun and srun say each rank's node; a rank not where node-major placement puts it is refused.
    let mut torchrun = two_nodes_of_four(Launcher::Torchrun, 1);
    torchrun.insert("GROUP_RANK".into(), "1".into());
    torchrun.insert("LOCAL_RANK".into(), "0".into());
    let e = Topology::of(&detect_from(&torchrun).unwrap().unwrap()).unwrap_err();
    assert_eq!(e, TopologyError::NotNodeMajor { rank: 1, node: 1, local_rank: 0, local_world: 4 });
    assert!(
        e.to_string()
            .starts_with("rank 1 is local rank 0 on node 1, but ranks placed node-major, 4 per node, put rank 4 there"),
        "{e}"
    );
    // `srun --distribution=cyclic`: rank 1 is the first task of the second node.
    let mut cyclic = two_nodes_of_four(Launcher::Srun, 1);
    cyclic.extend(env(&[("SLURM_NODEID", "1"), ("SLURM_LOCALID", "0")]));
    let e = Topology::of(&detect_from(&cyclic).unwrap().unwrap()).unwrap_err();
    assert!(matches!(e, TopologyError::NotNodeMajor { rank: 1, node: 1, .. }), "{e}");
    assert!(e.to_string().contains("--distribution=block"), "{e}");

    let new = Topology::new;
    assert!(matches!(new(1, 8, 2, 1, 0), Err(TopologyError::NotNodeMajor { .. })));
    assert_eq!(new(0, 8, 3, 0, 0), Err(TopologyError::NotUniform { world: 8, nodes: 3, local_world: None }));
    for (args, what) in [
        ((8, 8, 2, 1, 3), "rank"),
        ((0, 0, 1, 0, 0), "rank"),
        ((0, 8, 2, 2, 0), "node"),
        ((0, 8, 0, 0, 0), "node"),
        ((3, 8, 2, 0, 4), "local rank"),
    ] {
        let (rank, world, nodes, node, local_rank) = args;
        match new(rank, world, nodes, node, local_rank) {
            Err(e @ TopologyError::OutOfRange { .. }) => {
                assert!(e.to_string().starts_with(&format!("{what} ")), "{args:?}: {e}")
            }
            other => panic!("{args:?}: {other:?}"),
        }
    }
    assert_eq!(new(8, 8, 2, 1, 0).unwrap_err().to_string(), "rank 8 is out of range: the job's ranks number 8");
    // A place that says nothing of nodes cannot be decomposed.
    let info = RankInfo::explicit(0, 2, 0, JobId::random()).unwrap();
    let e = Topology::of(&info).unwrap_err();
    assert!(e.to_string().starts_with("explicit placement does not say the number of nodes"), "{e}");
}

#[test]
fn explicit_job_id_overrides_the_derived_one() {
    let job = JobId::random();
    let ompi = [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_LOCAL_RANK", "1")];
    let srun = [("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "1")];
    for (launcher, vars) in [(Launcher::Mpirun, &ompi[..]), (Launcher::Srun, &srun[..])] {
        // With no job variable of the launcher's at all, and with one.
        let mut e = env(vars);
        e.insert(JOB_ENV.into(), job.to_string());
        for _ in 0..2 {
            let info = detect_from(&e).unwrap().unwrap();
            assert_eq!((info.launcher, &info.job), (launcher, &job));
            e.extend(env(&[("PMIX_NAMESPACE", "p"), ("SLURM_JOB_ID", "7")]));
        }
        e.insert(JOB_ENV.into(), "xyz".into());
        assert_eq!(bad_var(detect_from(&e)), JOB_ENV);
    }
}

#[test]
fn inconsistent_environments_name_the_variable() {
    assert_eq!(detect_from(&env(&[("RANK", "0"), ("WORLD_SIZE", "2")])).unwrap(), None, "no launcher");
    assert_eq!(detect_from(&HashMap::new()).unwrap(), None);
    // A job id exported in the shell makes no rank of a program started without a launcher.
    assert_eq!(detect_from(&env(&[(JOB_ENV, MPICH_JOB)])).unwrap(), None);
    let torch = |rank: &str, world: &str, local: &str| {
        env(&[("RANK", rank), ("WORLD_SIZE", world), ("LOCAL_RANK", local), ("TORCHELASTIC_RUN_ID", "x")])
    };
    assert_eq!(bad_var(detect_from(&torch("4", "4", "0"))), "RANK");
    assert_eq!(bad_var(detect_from(&torch("0", "0", "0"))), "WORLD_SIZE");
    assert_eq!(bad_var(detect_from(&torch("0", "four", "0"))), "WORLD_SIZE");
    assert_eq!(bad_var(detect_from(&torch("0", "4", "-1"))), "LOCAL_RANK");
    let mut local = torch("0", "4", "2");
    local.insert(LOCAL_WORLD_ENV.into(), "2".into());
    assert_eq!(bad_env(detect_from(&local)), ("LOCAL_RANK".into(), "local rank 2 >= LOCAL_WORLD_SIZE 2".into()));
    local.insert(LOCAL_WORLD_ENV.into(), "8".into());
    assert_eq!(bad_var(detect_from(&local)), LOCAL_WORLD_ENV);

    let ompi = [("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1"), ("OMPI_COMM_WORLD_LOCAL_RANK", "0")];
    let (var, msg) = bad_env(detect_from(&env(&ompi)));
    assert_eq!(var, "OMPI_MCA_ess_base_jobid");
    assert!(msg.contains(&format!("set {JOB_ENV}")), "{msg}");
    let mut garbled = env(&ompi);
    garbled.extend(env(&[("OMPI_COMM_WORLD_LOCAL_SIZE", ""), ("PMIX_NAMESPACE", "p")]));
    assert_eq!(bad_var(detect_from(&garbled)), "OMPI_COMM_WORLD_LOCAL_SIZE");

    let no_size = env(&[("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0"), ("SLURM_JOB_ID", "1")]);
    assert_eq!(bad_var(detect_from(&no_size)), "SLURM_NTASKS");
    let slurm = |per_node: &str| {
        let mut e = env(&[("SLURM_PROCID", "3"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "3"), ("SLURM_JOB_ID", "1")]);
        e.insert("SLURM_STEP_TASKS_PER_NODE".into(), per_node.into());
        detect_from(&e)
    };
    assert_eq!(slurm("4(x2)").unwrap().unwrap().local_world, Some(4));
    assert_eq!(slurm("4,4").unwrap().unwrap().local_world, Some(4));
    assert_eq!(slurm("4(x1),2(x2)").unwrap().unwrap().local_world, None);
    for garbled in ["", "4(x", "4(2)", "four", "4,,4"] {
        assert_eq!(bad_var(slurm(garbled)), "SLURM_STEP_TASKS_PER_NODE", "{garbled:?}");
    }
    assert_eq!(bad_var(slurm("2(x4)")), "SLURM_LOCALID", "local rank 3 >= 2 tasks on its node");
}

#[test]
fn mpich_needs_its_variables_and_an_explicit_job_id() {
    let mpich = |pairs: &[(&str, &str)]| {
        let mut e = env(&[("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("MPI_LOCALRANKID", "1"), ("MPI_LOCALNRANKS", "2")]);
        e.insert(JOB_ENV.into(), MPICH_JOB.into());
        for (k, v) in pairs {
            match *v {
                "-" => e.remove(*k),
                v => e.insert(k.to_string(), v.to_string()),
            };
        }
        detect_from(&e)
    };
    assert_eq!(mpich(&[]).unwrap().unwrap().local_world, Some(2));
    assert_eq!(mpich(&[("MPI_LOCALNRANKS", "-")]).unwrap().unwrap().local_world, None);
    let (var, msg) = bad_env(mpich(&[(JOB_ENV, "-")]));
    assert_eq!(var, JOB_ENV);
    assert!(msg.contains("MPICH/Intel MPI (Hydra) exports no variable") && msg.contains("openssl rand"), "{msg}");
    assert_eq!(bad_env(mpich(&[("PMI_SIZE", "-")])).0, "PMI_SIZE");
    assert_eq!(bad_env(mpich(&[("PMI_RANK", "-")])).0, "PMI_RANK");
    assert_eq!(bad_env(mpich(&[("PMI_RANK", "x1")])).0, "PMI_RANK");
    assert_eq!(bad_env(mpich(&[("PMI_SIZE", "1")])).0, "PMI_RANK");
    assert_eq!(bad_env(mpich(&[("MPI_LOCALRANKID", " ")])).0, "MPI_LOCALRANKID");
    assert_eq!(bad_env(mpich(&[("MPI_LOCALNRANKS", "1")])).0, "MPI_LOCALRANKID");
    assert_eq!(bad_env(mpich(&[("MPI_LOCALNRANKS", "0")])).0, "MPI_LOCALNRANKS");
    assert_eq!(bad_env(mpich(&[(JOB_ENV, "0123")])).0, JOB_ENV);
    // Hydra's -pmi-port mode: PMI_PORT and PMI_ID instead of PMI_FD, PMI_RANK and PMI_SIZE.
    let (var, msg) = bad_env(mpich(&[("PMI_RANK", "-"), ("PMI_SIZE", "-"), ("PMI_ID", "1"), ("PMI_PORT", "h:1")]));
    assert_eq!(var, "PMI_RANK");
    assert!(msg.contains("-pmi-port"), "{msg}");
}

#[test]
fn explicit_places_are_checked() {
    let job = JobId::random();
    let info = RankInfo::explicit(1, 2, 1, job.clone()).unwrap();
    let (local_world, node, nodes) = (None, None, None);
    let expected =
        RankInfo { rank: 1, world: 2, local_rank: 1, local_world, node, nodes, job, launcher: Launcher::Explicit };
    assert!(matches!(Topology::of(&info), Err(TopologyError::Unknown { launcher: Launcher::Explicit, .. })));
    assert_eq!(info, expected);
    for (rank, world, local_rank, blamed) in [(0, 0, 0, "world: "), (2, 2, 0, "rank: "), (0, 2, 2, "local_rank: ")] {
        match RankInfo::explicit(rank, world, local_rank, JobId::random()) {
            Err(LaunchError::BadArgs(msg)) => assert!(msg.starts_with(blamed), "{msg}"),
            other => panic!("unexpected {other:?}"),
        }
    }
}
