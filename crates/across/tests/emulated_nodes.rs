//! A job over several nodes (real ones under a launcher whose job spans them, else emulated on one machine): the launcher's ranks split into nodes of consecutive ranks,
//! each node with its own rendezvous, and NCCL told that every rank is a host of its own (`NCCL_HOSTID`), so it
//! accepts ranks that share a GPU and talks over its socket transport. On a GPU driver (`ARX_TEST_BACKEND=cuda`,
//! `ARX_TEST_RANKS=8`, `ARX_TEST_NODES=2`): allreduce by both paths, reduce-scatter and all-gather at comm_bench.py's
//! sizes, against float64 and bitwise equal on every rank. On the host driver (CI): every rank is told at set-up,
//! over the bootstrap, that the job cannot run, and why.

use across::{Across, Path};
use allreduce::{DType, Options};
use gpu::MemKind;
use measure::check::{compare, fingerprint, input_values, reference, tolerance};

/// `ARX_TEST_BACKEND`, else auto: on a machine without a GPU that is the host driver, whose refusal then travels
/// through the bootstrap's set-up exchange.
fn backend() -> gpu::Backend {
    std::env::var("ARX_TEST_BACKEND").map_or(gpu::Backend::Auto, |b| b.parse().expect("ARX_TEST_BACKEND"))
}

fn env_or(var: &str, default: usize) -> usize {
    std::env::var(var).map_or(default, |v| v.parse().expect(var))
}

/// Runs `body` as every rank of a job, this test binary started again by the project's launcher.
fn as_job(test: &str, world: usize, body: impl FnOnce(launch::RankInfo)) {
    if let Some(info) = launch::detect().unwrap() {
        body(info);
        return;
    }
    let mut opts = launch::LaunchOptions::new(world, launch::self_exe().unwrap());
    opts.args = ["--exact", test, "--nocapture", "--test-threads", "1"].map(Into::into).to_vec();
    launch::run(&opts).unwrap();
}

/// `info` as rank `info.rank` of `nodes` emulated nodes of consecutive ranks.
fn emulated(mut info: launch::RankInfo, nodes: usize) -> launch::RankInfo {
    let local_world = info.world / nodes;
    (info.local_rank, info.local_world) = (info.rank % local_world, Some(local_world));
    (info.node, info.nodes) = (Some(info.rank / local_world), Some(nodes));
    // Each rank a host of its own for NCCL (set before any thread of this process reads the environment).
    std::env::set_var("NCCL_HOSTID", format!("arx-emulated-rank-{}", info.rank));
    info
}

#[test]
fn emulated_nodes_run_every_collective_exactly() {
    let (world, nodes) = (env_or("ARX_TEST_RANKS", 4), env_or("ARX_TEST_NODES", 2));
    as_job("emulated_nodes_run_every_collective_exactly", world, |info| {
        // Under a launcher whose job spans real nodes (srun -N2, torchrun on two hosts) those are the nodes.
        let real = info.nodes.is_some_and(|n| n > 1) && std::env::var("ARX_TEST_NODES").is_err();
        let info = if real { info } else { emulated(info, nodes) };
        let (world, nodes) = (info.world, info.nodes.unwrap_or(nodes));
        let (rank, job) = (info.rank, info.job.clone());
        let capacity = 8 << 20;
        // A tune directory of this job's own, shared by its ranks.
        let tune_dir = std::env::temp_dir().join(format!("arx-across-tune-{}", job.as_str()));
        let opts = Options {
            backend: backend(),
            capacity_bytes: capacity,
            tune_dir: Some(tune_dir.clone()),
            ..Options::default()
        };
        let (info_again, opts_again) = (info.clone(), opts.clone());
        let across = match Across::new(info, opts) {
            Err(e) if e.to_string().contains("host driver") => {
                // The host driver: refused at set-up on every rank, saying why (rank 0's reason, through the
                // bootstrap, where auto resolved to it).
                let msg = e.to_string();
                assert!(msg.contains("NCCL/RCCL"), "{msg}");
                if backend() == gpu::Backend::Auto {
                    assert!(msg.starts_with("rank 0 cannot run NCCL/RCCL across nodes"), "{msg}");
                }
                return;
            }
            built => built.unwrap(),
        };
        let l = across.topology().local_world();
        let gpu = across.local().gpu().clone();
        let stream = gpu.stream().unwrap();
        let [input, output] = [0; 2].map(|_| gpu.alloc(capacity * world, MemKind::Device).unwrap());
        let (print_buf, gathered) =
            (gpu.alloc(8, MemKind::Device).unwrap(), gpu.alloc(8 * world, MemKind::Device).unwrap());
        let mut checked = 0;
        for dtype in [DType::Bf16, DType::F32] {
            let mut counts = measure::sizes::comm_bench_sizes(10, 22, 8, 256);
            counts.extend([world * 3 + 1, 1000 * l]);
            counts.retain(|&n| n * dtype.size() <= capacity);
            for (k, &count) in counts.iter().enumerate() {
                let seed = {
                    let mut h = std::hash::DefaultHasher::new();
                    std::hash::Hash::hash(&(job.as_str(), dtype.name(), k), &mut h);
                    std::hash::Hasher::finish(&h)
                };
                let x = dtype.encode(&input_values(seed, rank, count, dtype));
                let want = reference(seed, world, count, dtype, 0, count);
                let tol = tolerance(dtype, world, true);
                let paths: &[Path] =
                    if count.is_multiple_of(l) { &[Path::Nccl, Path::Hierarchical] } else { &[Path::Nccl] };
                let mut bits = Vec::new();
                for &path in paths {
                    stream.upload(&input, 0, &x).unwrap();
                    stream.fill(&output, 0xFF).unwrap();
                    // SAFETY: our own buffers of capacity * world bytes; every rank makes the same calls.
                    unsafe { across.all_reduce(input.ptr(), output.ptr(), count, dtype, stream.handle(), Some(path)) }
                        .unwrap();
                    let mut got = vec![0u8; count * dtype.size()];
                    stream.download(&output, 0, &mut got).unwrap();
                    // A node's wait that ended at its deadline would leave a wrong result and say why here.
                    across.local().check().unwrap();
                    let v = compare(&dtype.decode(&got), &want, tol);
                    assert_eq!(v.wrong, 0, "{dtype} x {count} {path}: {v:?}");
                    bits.push((path, fingerprint(&got)));
                    checked += 1;
                }
                // Each path's result is the same on every rank: all-gathered fingerprints.
                for (path, print) in bits {
                    stream.upload(&print_buf, 0, &print.to_le_bytes()).unwrap();
                    // SAFETY: 8 bytes in, 8 per rank out; every rank makes the same calls.
                    unsafe { across.all_gather(print_buf.ptr(), gathered.ptr(), 2, DType::F32, stream.handle()) }
                        .unwrap();
                    let mut all = vec![0u8; 8 * world];
                    stream.download(&gathered, 0, &mut all).unwrap();
                    for r in 0..world {
                        assert_eq!(all[8 * r..8 * r + 8], print.to_le_bytes(), "{dtype} x {count} {path}: rank {r}");
                    }
                }
                if count.is_multiple_of(world) {
                    stream.upload(&input, 0, &x).unwrap();
                    stream.fill(&output, 0xFF).unwrap();
                    // SAFETY: as above; the output holds count / world elements.
                    unsafe { across.reduce_scatter(input.ptr(), output.ptr(), count, dtype, stream.handle()) }.unwrap();
                    let shard = count / world;
                    let mut got = vec![0u8; shard * dtype.size()];
                    stream.download(&output, 0, &mut got).unwrap();
                    let want = &want[rank * shard..(rank + 1) * shard];
                    let v = compare(&dtype.decode(&got), want, tol);
                    assert_eq!(v.wrong, 0, "reduce_scatter {dtype} x {count}: {v:?}");
                    checked += 1;
                }
                stream.upload(&input, 0, &x).unwrap();
                stream.fill(&output, 0xFF).unwrap();
                // SAFETY: as above; the output holds count * world elements.
                unsafe { across.all_gather(input.ptr(), output.ptr(), count, dtype, stream.handle()) }.unwrap();
                let mut got = vec![0u8; count * world * dtype.size()];
                stream.download(&output, 0, &mut got).unwrap();
                for r in 0..world {
                    let theirs = dtype.encode(&input_values(seed, r, count, dtype));
                    let slot = &got[r * theirs.len()..(r + 1) * theirs.len()];
                    assert!(slot == theirs.as_slice(), "all_gather {dtype} x {count}: rank {r}'s slot");
                }
                checked += 1;
            }
        }
        stream.sync().unwrap();
        if rank == 0 {
            print!("{across}");
            println!("emulated nodes: {nodes} x {l} ranks, {checked} results checked on every rank, the same bits everywhere");
        }
        // The path table: both paths timed, the fastest per size followed by calls without a path, stored by rank
        // 0 and followed by every rank of the next endpoint of this shape.
        let mut across = across;
        let counts = [1024 * l, 65536 * l, 1 << 20];
        let table = across.tune(DType::Bf16, &counts, 5, 2).unwrap();
        for &count in &counts {
            let want = match table.pick(count * 2) {
                Path::Hierarchical if count.is_multiple_of(l) => Path::Hierarchical,
                _ => Path::Nccl,
            };
            // SAFETY: as above.
            let took =
                unsafe { across.all_reduce(input.ptr(), output.ptr(), count, DType::Bf16, stream.handle(), None) };
            assert_eq!(took.unwrap(), want, "{count} elements with {table:?}");
        }
        stream.sync().unwrap();
        drop(across);
        let again = Across::new(info_again, opts_again).unwrap();
        assert_eq!(again.path_table(), Some(&table), "rank {rank}: the next endpoint's table");
        if rank == 0 {
            println!("path table: {:?}", table.entries);
            std::fs::remove_dir_all(&tune_dir).unwrap();
        }
    });
}

/// NCCL's set-up has a deadline: rank 0 of a two-rank communicator whose rank 1 never comes (a rank that died after
/// the ids went out) gets an error when the set-up timeout ends, not a hang, and its device still works after.
/// One process, no launcher. The host driver has no NCCL: there the id itself is refused.
#[test]
fn nccl_set_up_without_its_peer_ends_at_the_deadline_and_the_device_lives_on() {
    let opts = gpu::DriverOptions { device: None, local_rank: Some(0), shm_prefix: ipc::JobId::random().shm_name("n") };
    let gpu = gpu::open(backend(), &opts).unwrap().gpu;
    let id = match nccl::unique_id(gpu.kind()) {
        Err(e) if gpu.kind() == gpu::DriverKind::Host => {
            assert!(e.to_string().contains("host driver has no NCCL"), "{e}");
            return;
        }
        id => id.unwrap(),
    };
    let timeout = std::time::Duration::from_secs(3);
    let start = std::time::Instant::now();
    let err = match nccl::Nccl::from_id(gpu.kind(), "nccl_job", 1 << 20, &id, (0, 2), timeout) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a two-rank NCCL communicator came up with one rank"),
    };
    let took = start.elapsed();
    assert!(err.contains("never joined") && err.contains("ncclCommInitRankConfig"), "{err}");
    assert!(took >= timeout && took < timeout * 4, "the set-up ended after {took:?}, its deadline {timeout:?}");
    let stream = gpu.stream().unwrap();
    let buf = gpu.alloc(4096, MemKind::Device).unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    stream.upload(&buf, 0, &data).unwrap();
    let mut back = vec![0u8; 4096];
    stream.download(&buf, 0, &mut back).unwrap();
    assert_eq!(back, data, "the device after NCCL's aborted set-up");
    println!("nccl set-up without its peer: {err} (after {took:?})");
}

/// A rank that dies on another node after set-up (no NCCL teardown, no goodbye): the survivors' NCCL step ends
/// instead of spinning (the watchdog aborts the NCCL communicators at NCCL's own error for the lost peer, or at the
/// set-up deadline, which its steps get), their stream drains, `check` and every later call return the failure, and the device still
/// works. On a GPU driver only (the host driver has no NCCL: refused at set-up).
#[test]
fn a_peer_that_dies_on_another_node_ends_the_survivors_nccl_steps_and_the_device_lives_on() {
    let (world, nodes) = (env_or("ARX_TEST_RANKS", 4), env_or("ARX_TEST_NODES", 2));
    as_job("a_peer_that_dies_on_another_node_ends_the_survivors_nccl_steps_and_the_device_lives_on", world, |info| {
        let info = emulated(info, nodes);
        let (rank, world) = (info.rank, info.world);
        let timeout = std::time::Duration::from_secs(20);
        let opts =
            Options { backend: backend(), capacity_bytes: 1 << 20, setup_timeout: Some(timeout), ..Options::default() };
        let across = match Across::new(info, opts) {
            Err(e) if e.to_string().contains("host driver") => return,
            built => built.unwrap(),
        };
        if rank == world - 1 {
            // Dies on the last node, releasing nothing.
            std::process::exit(0);
        }
        let gpu = across.local().gpu().clone();
        let stream = gpu.stream().unwrap();
        let buf = gpu.alloc(1 << 20, MemKind::Device).unwrap();
        let count = 4096;
        let start = std::time::Instant::now();
        // SAFETY: our own buffer of 1 MiB on this device; every survivor makes the same call.
        let issued =
            unsafe { across.all_reduce(buf.ptr(), buf.ptr(), count, DType::Bf16, stream.handle(), Some(Path::Nccl)) };
        // Refused at once where the loss is already known (NCCL's report, or a local peer's exit on the dead rank's
        // node); else the sync returns once the watchdog aborted.
        if let Err(e) = &issued {
            println!("rank {rank}: the call was refused: {e}");
        } else {
            let _ = stream.sync();
        }
        let took = start.elapsed();
        let err = across.check().expect_err("a step with a dead peer cannot have completed").to_string();
        let names_the_loss = |e: &str| e.contains("aborted") || e.contains("exited");
        assert!(names_the_loss(&err), "rank {rank}: {err}");
        assert!(took < timeout + std::time::Duration::from_secs(10), "rank {rank}: ended after {took:?}");
        // SAFETY: as above.
        let again = unsafe { across.all_reduce(buf.ptr(), buf.ptr(), count, DType::Bf16, stream.handle(), None) };
        assert!(names_the_loss(&again.unwrap_err().to_string()), "rank {rank}: a later call");
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 13 % 251) as u8).collect();
        let probe = gpu.stream().unwrap();
        probe.upload(&buf, 0, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        probe.download(&buf, 0, &mut back).unwrap();
        assert_eq!(back, data, "rank {rank}: the device after the abort");
        println!("rank {rank}: the dead peer's step ended after {took:?}: {err}");
    });
}
