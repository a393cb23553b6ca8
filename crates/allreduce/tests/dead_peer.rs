//! A dead or stuck peer: the survivors' next calls fail with `Error::Peer` naming it, well before the deadline, the
//! communicator stays failed, the process's device still works, and the survivors go on with a new communicator;
//! `abort` ends a waiting call at once from another thread. On the host driver by default; `ARX_TEST_BACKEND=cuda`
//! runs them on a GPU (where no kernel may trap: a trap would end the survivors' device context).

use allreduce::{Communicator, DType, DevicePtr, Error, Options};
use gpu::MemKind;
use measure::check::{compare, input_values, reference, tolerance};
use std::time::{Duration, Instant};

mod common;
use common::{as_job, backend, ranks};

/// The deadline the kernels would wait for: the failures below must come long before it.
const TIMEOUT: Duration = Duration::from_secs(10);

fn comm(info: launch::RankInfo) -> Communicator {
    let opts = Options { backend: backend(), capacity_bytes: 1 << 16, timeout: Some(TIMEOUT), ..Options::default() };
    Communicator::new(info, opts).unwrap()
}

/// One allreduce of `count` f32 on `buf`, in place, run to completion; then what the communicator says of it.
fn all_reduce(comm: &Communicator, buf: DevicePtr, count: usize, stream: &gpu::Stream) -> Result<(), Error> {
    // SAFETY: `buf` is a live buffer of ours of at least `count` f32; the stream is synchronised before returning.
    unsafe { comm.all_reduce(buf, buf, count, DType::F32, stream.handle())? };
    stream.sync()?;
    comm.check()
}

/// The same job id with one more digit: the survivors' new communicator, which every survivor derives alike.
fn next_job(job: &ipc::JobId) -> ipc::JobId {
    let id = job.as_str();
    ipc::JobId::parse(&format!("{}{}", &id[..id.len().min(63)], if id.ends_with('2') { '3' } else { '2' })).unwrap()
}

/// Set in the process that stands in for the victim rank: the launcher's rank process spawns it (so that a rank
/// killed with a signal is not taken by the launcher for a failed job) and waits for it.
const VICTIM_ENV: &str = "ARX_TEST_VICTIM";

/// Runs the rank `victim` of the job as a child of its launcher-started process, which ends it with `signal` after
/// `calls` calls; every other rank loops calls until one fails, which must name the victim within `within` of that
/// call's start. Then the survivors build a communicator of their own and allreduce exactly.
fn a_peer_dies(test: &str, world: usize, signal: nix::sys::signal::Signal, timeout: Duration, within: Duration) {
    const VICTIM: usize = 1;
    const CALLS: usize = 20;
    as_job(test, world, |info| {
        if info.rank == VICTIM && std::env::var_os(VICTIM_ENV).is_none() {
            let mut child = std::process::Command::new(launch::self_exe().unwrap())
                .args(["--exact", test, "--nocapture", "--test-threads", "1"])
                .env(VICTIM_ENV, "1")
                .spawn()
                .unwrap();
            if signal == nix::sys::signal::Signal::SIGSTOP {
                // Stopped, it never dies by itself: once the survivors are past the deadline, end it.
                std::thread::sleep(timeout + Duration::from_secs(3));
                child.kill().unwrap();
            }
            child.wait().unwrap();
            return;
        }
        let (world, job, local) = (info.world, info.job.clone(), info.local_rank);
        let opts =
            Options { backend: backend(), capacity_bytes: 1 << 16, timeout: Some(timeout), ..Options::default() };
        let comm = Communicator::new(info, opts.clone()).unwrap();
        let rank = comm.rank();
        let gpu = comm.gpu().clone();
        let stream = gpu.stream().unwrap();
        let buf = gpu.alloc(1 << 16, MemKind::Device).unwrap();
        let mut calls = 0;
        let (failed, took) = loop {
            if rank == VICTIM && calls == CALLS {
                nix::sys::signal::raise(signal).unwrap();
            }
            let start = Instant::now();
            match all_reduce(&comm, buf.ptr(), 4096, &stream) {
                Ok(()) => calls += 1,
                Err(e) => break (e, start.elapsed()),
            }
            assert!(calls <= CALLS + 1000, "rank {rank}: calls went on without rank {VICTIM}");
        };
        assert!(matches!(&failed, Error::Peer { ranks, .. } if ranks == &[VICTIM]), "rank {rank}: {failed}");
        assert!(took < within, "rank {rank}: the failing call took {took:?} (at most {within:?})");
        if signal == nix::sys::signal::Signal::SIGSTOP {
            // Only the deadline finds a stopped peer: the error says how long the wait lasted (a host kernel's wait
            // "timed out after", a device kernel's record "after waiting").
            let text = failed.to_string();
            let waited = text.contains("timed out after") || text.contains("after waiting");
            assert!(text.contains("never arrived") && waited, "rank {rank}: {text}");
        }
        // Failed for good: the next call says the same, and starts nothing.
        let again = all_reduce(&comm, buf.ptr(), 4096, &stream).unwrap_err();
        assert_eq!(again.to_string(), failed.to_string());
        // The device is as usable as before.
        let mine = input_values(7, rank, 4096, DType::F32);
        stream.upload(&buf, 0, &DType::F32.encode(&mine)).unwrap();
        let mut back = vec![0u8; 4096 * 4];
        stream.download(&buf, 0, &mut back).unwrap();
        assert_eq!(DType::F32.decode(&back), mine.iter().map(|&v| v as f64).collect::<Vec<_>>());
        drop(comm);
        // The survivors go on among themselves, renumbered in order.
        let new_rank = rank - usize::from(rank > VICTIM);
        let new_job = next_job(&job);
        let info =
            launch::RankInfo::explicit(new_rank, world - 1, local - usize::from(local > VICTIM), new_job.clone());
        let survivors = Communicator::new(info.unwrap(), opts).unwrap();
        let gpu = survivors.gpu().clone();
        let (stream, buf) = (gpu.stream().unwrap(), gpu.alloc(1 << 16, MemKind::Device).unwrap());
        let mine = input_values(7, new_rank, 4096, DType::F32);
        stream.upload(&buf, 0, &DType::F32.encode(&mine)).unwrap();
        all_reduce(&survivors, buf.ptr(), 4096, &stream).unwrap();
        stream.download(&buf, 0, &mut back).unwrap();
        let want = reference(7, world - 1, 4096, DType::F32, 0, 4096);
        assert_eq!(compare(&DType::F32.decode(&back), &want, tolerance(DType::F32, world - 1, false)).wrong, 0);
        drop((buf, stream));
        drop(survivors);
        // Nothing of the survivors' job is left in /dev/shm once its last rank is done.
        if new_rank == 0 {
            std::thread::sleep(Duration::from_millis(200));
            let prefix = format!("arx-{}-", new_job.as_str());
            let left: Vec<_> = std::fs::read_dir("/dev/shm")
                .unwrap()
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(&prefix))
                .collect();
            assert!(left.is_empty(), "left in /dev/shm: {left:?}");
        }
    });
}

#[test]
fn a_killed_peer_is_named_within_2_s_and_the_survivors_carry_on() {
    let test = "a_killed_peer_is_named_within_2_s_and_the_survivors_carry_on";
    a_peer_dies(test, ranks(4), nix::sys::signal::Signal::SIGKILL, TIMEOUT, Duration::from_secs(2));
}

#[test]
fn a_stopped_peer_is_named_at_the_deadline() {
    // A stopped process still exists: only the kernels' deadline finds it.
    let timeout = Duration::from_secs(2);
    let test = "a_stopped_peer_is_named_at_the_deadline";
    a_peer_dies(test, ranks(3), nix::sys::signal::Signal::SIGSTOP, timeout, timeout + Duration::from_secs(2));
}

#[test]
fn abort_ends_a_waiting_call_at_once() {
    as_job("abort_ends_a_waiting_call_at_once", ranks(2), |info| {
        let comm = comm(info);
        let gpu = comm.gpu().clone();
        let stream = gpu.stream().unwrap();
        let buf = gpu.alloc(1 << 16, MemKind::Device).unwrap();
        if comm.rank() == 0 {
            // Rank 0 calls alone: nobody comes, and another thread aborts the wait.
            let handle = comm.abort_handle();
            let aborter = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                handle.abort();
            });
            let start = Instant::now();
            let failed = all_reduce(&comm, buf.ptr(), 4096, &stream).unwrap_err();
            let took = start.elapsed();
            aborter.join().unwrap();
            assert!(matches!(&failed, Error::Peer { ranks, what } if ranks.is_empty() && what.contains("abort")));
            assert!(took < Duration::from_secs(2), "the abort took {took:?} to end the call");
            assert!(comm.check().is_err(), "aborted for good");
        }
        // Rank 1 never calls: it waits here until rank 0 is done, then ends its side too (no teardown barrier).
        comm.rendezvous().barrier("abort seen").unwrap();
        comm.abort_handle().abort();
    });
}
