use super::*;
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::stat::fchmod;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::time::Instant;

fn opts(timeout_ms: u64) -> RendezvousOptions {
    RendezvousOptions { slot_bytes: 4096, timeout: Duration::from_millis(timeout_ms) }
}

/// Runs `f(rank)` on one thread per rank and returns the results by rank.
fn ranks<T: Send>(world: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|r| {
                let f = &f;
                s.spawn(move || f(r))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn leftovers(job: &JobId) -> Vec<String> {
    let prefix = format!("arx-{job}-");
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

fn assert_clean(job: &JobId) {
    assert_eq!(leftovers(job), Vec::<String>::new(), "segments left behind");
}

fn blob(seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let len = rng.random_range(0..=4096);
    (0..len).map(|_| rng.random()).collect()
}

#[test]
fn collectives_for_all_world_sizes() {
    for world in [1, 2, 3, 4, 8] {
        let job = JobId::random();
        ranks(world, |rank| {
            let rdv = Rendezvous::join(&job, rank, world, opts(10_000)).unwrap();
            assert_eq!((rdv.rank(), rdv.world()), (rank, world));
            rdv.barrier("start").unwrap();
            let seed = |r: usize| (world * 100 + r) as u64;
            let got = rdv.all_gather("blobs", &blob(seed(rank))).unwrap();
            assert_eq!(got, (0..world).map(|r| blob(seed(r))).collect::<Vec<_>>());
            let root = world - 1;
            let b = rdv.broadcast("bcast", root, &blob(seed(rank) + 7)).unwrap();
            assert_eq!(b, blob(seed(root) + 7));
            rdv.barrier("end").unwrap();
        });
        assert_clean(&job);
    }
}

#[test]
fn back_to_back_all_gathers_never_overwrite_a_slot_in_use() {
    let (job, world) = (JobId::random(), 4);
    ranks(world, |rank| {
        let rdv = Rendezvous::join(&job, rank, world, opts(10_000)).unwrap();
        let make = |i: usize, r: usize| vec![(i * 31 + r) as u8; (i * 37 + r * 11) % 4097];
        for i in 0..300 {
            let got = rdv.all_gather("loop", &make(i, rank)).unwrap();
            for (r, b) in got.iter().enumerate() {
                assert_eq!(b, &make(i, r), "iteration {i}, rank {r}");
            }
            if i % 50 == 0 {
                assert_eq!(rdv.broadcast("b", i % world, &make(i, rank)).unwrap(), make(i, i % world));
            }
        }
        assert!(matches!(rdv.all_gather("big", &[0; 4097]), Err(IpcError::BlobTooLarge { len: 4097, max: 4096 })));
    });
    assert_clean(&job);
}

#[test]
fn missing_rank_is_named_within_the_timeout() {
    let job = JobId::random();
    let start = Instant::now();
    let errs = ranks(2, |rank| Rendezvous::join(&job, rank, 3, opts(300)).err().unwrap().to_string());
    assert!(start.elapsed() < Duration::from_secs(3));
    for (rank, e) in errs.iter().enumerate() {
        assert!(e.contains(&format!("join (rank {rank} of 3)")) && e.contains("waiting for rank(s) [2]"), "{e}");
    }
    assert_clean(&job);
}

#[test]
fn missing_rank_zero_never_created_the_segment() {
    let job = JobId::random();
    let e = Rendezvous::join(&job, 1, 2, opts(300)).err().unwrap().to_string();
    assert!(e.contains("rank 0 never created") && e.contains("[0]"), "{e}");
    assert_clean(&job);
}

#[test]
fn barrier_timeout_names_missing_ranks() {
    let (job, world) = (JobId::random(), 4);
    let errs = ranks(world, |rank| {
        let rdv = Rendezvous::join(&job, rank, world, opts(300)).unwrap();
        if rank < 2 {
            Some(rdv.barrier("setup").unwrap_err().to_string())
        } else {
            None
        }
    });
    assert_eq!(
        errs[1].as_deref(),
        Some("barrier 'setup' (rank 1 of 4): timed out after 300ms waiting for rank(s) [2, 3]")
    );
    assert_clean(&job);
}

#[test]
fn abort_fails_peers_fast() {
    let (job, world) = (JobId::random(), 3);
    let start = Instant::now();
    let errs = ranks(world, |rank| {
        let rdv = Rendezvous::join(&job, rank, world, opts(20_000)).unwrap();
        if rank == 2 {
            rdv.abort("out of memory");
            rdv.abort("second abort is ignored");
            return None;
        }
        Some(rdv.barrier("work").unwrap_err())
    });
    assert!(start.elapsed() < Duration::from_secs(5));
    for e in errs.into_iter().flatten() {
        match &e {
            IpcError::Aborted { rank: 2, reason, .. } if reason == "out of memory" => {}
            other => panic!("unexpected {other:?}"),
        }
        assert!(e.to_string().contains("aborted by rank 2: out of memory"), "{e}");
    }
    assert_clean(&job);
}

/// Creates `/arx-<job>-rdv` by hand as rank 0 would for world 2, then lets `tweak` spoil it.
fn fake_segment(job: &JobId, tweak: impl FnOnce(&OwnedFd, &Header)) {
    let layout = Layout::new(2, 4096).unwrap();
    let name = job.shm_name("rdv");
    let fd = shm_open(name.as_str(), OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR, Mode::S_IRWXU).unwrap();
    ftruncate(&fd, layout.len as i64).unwrap();
    let seg = Segment::map(&fd, &name, layout.len).unwrap();
    let h = seg.header();
    h.magic.store(MAGIC, Ordering::Relaxed);
    h.version.store(VERSION, Ordering::Relaxed);
    h.world.store(2, Ordering::Relaxed);
    h.slot_bytes.store(4096, Ordering::Relaxed);
    h.uid.store(geteuid().as_raw(), Ordering::Relaxed);
    tweak(&fd, h);
    h.ready.store(READY, Ordering::Release);
}

#[test]
fn spoiled_segments_are_refused() {
    type Tweak = fn(&OwnedFd, &Header);
    let cases: [(&str, Tweak); 4] = [
        ("magic is 0x1, expected", |_, h| h.magic.store(1, Ordering::Relaxed)),
        ("version is 9, expected 1", |_, h| h.version.store(9, Ordering::Relaxed)),
        ("world is 3, expected 2", |_, h| h.world.store(3, Ordering::Relaxed)),
        ("mode 644 gives group/other access", |fd, _| fchmod(fd, Mode::from_bits_truncate(0o644)).unwrap()),
    ];
    for (want, tweak) in cases {
        let job = JobId::random();
        fake_segment(&job, tweak);
        let e = Rendezvous::join(&job, 1, 2, opts(2_000)).err().unwrap();
        assert!(matches!(e, IpcError::BadSegment(_)) && e.to_string().contains(want), "{want}: {e}");
        assert_eq!(sweep_segments(&job).unwrap(), vec![job.shm_name("rdv")], "a foreign segment is left alone");
        assert_clean(&job);
    }
}

#[test]
fn existing_segment_fails_rank_zero_clearly() {
    let job = JobId::random();
    fake_segment(&job, |_, _| {});
    let e = Rendezvous::join(&job, 0, 1, opts(300)).err().unwrap();
    assert!(matches!(e, IpcError::Exists { .. }) && e.to_string().contains("already exists"), "{e}");
    sweep_segments(&job).unwrap();
    assert_clean(&job);
}

#[test]
fn bad_arguments_are_refused() {
    let job = JobId::random();
    for (rank, world) in [(0, 0), (1, 1), (0, MAX_WORLD + 1)] {
        let e = Rendezvous::join(&job, rank, world, opts(300)).err().unwrap();
        assert!(matches!(e, IpcError::BadArgs(_)), "{e}");
    }
    let zero = RendezvousOptions { slot_bytes: 0, ..opts(300) };
    assert!(matches!(Rendezvous::join(&job, 0, 1, zero), Err(IpcError::BadArgs(_))));
    assert_clean(&job);
}

#[test]
fn fds_reach_every_peer() {
    for world in [1, 2, 4] {
        let job = JobId::random();
        ranks(world, |rank| {
            let rdv = Rendezvous::join(&job, rank, world, opts(10_000)).unwrap();
            for call in 0..3 {
                let fd = memfd_create(c"arx-test", MFdFlags::MFD_CLOEXEC).unwrap();
                File::from(fd.try_clone().unwrap()).write_all(format!("rank {rank} call {call}").as_bytes()).unwrap();
                let got = rdv.all_gather_fds("memfd", &[fd.as_fd()]).unwrap();
                for (r, fds) in got.into_iter().enumerate() {
                    if r == rank {
                        assert!(fds.is_empty());
                        continue;
                    }
                    let [fd] = <[OwnedFd; 1]>::try_from(fds).unwrap();
                    // pread: every receiver shares the sender's file offset (one open file description).
                    let mut buf = [0u8; 64];
                    let n = File::from(fd).read_at(&mut buf, 0).unwrap();
                    assert_eq!(&buf[..n], format!("rank {r} call {call}").as_bytes());
                }
            }
            let none = rdv.all_gather_fds("empty", &[]).unwrap();
            assert!(none.iter().all(Vec::is_empty));
        });
        assert_clean(&job);
    }
}

#[test]
fn fd_timeout_names_silent_peer() {
    let (job, world) = (JobId::random(), 3);
    let done = std::sync::Barrier::new(world);
    let errs = ranks(world, |rank| {
        let rdv = Rendezvous::join(&job, rank, world, opts(300)).unwrap();
        let e = (rank != 2).then(|| rdv.all_gather_fds("x", &[]).unwrap_err().to_string());
        // Rank 2 stays alive (socket bound) but silent until the others gave up.
        done.wait();
        e
    });
    let e = errs[0].as_deref().unwrap();
    assert!(e.contains("all_gather_fds 'x' (rank 0 of 3)") && e.contains("[2]"), "{e}");
}

#[test]
fn sweep_removes_only_this_jobs_segments() {
    let (job, other) = (JobId::random(), JobId::random());
    let names = [job.shm_name("a"), job.shm_name("b"), other.shm_name("a")];
    for n in &names {
        shm_open(n.as_str(), OFlag::O_CREAT | OFlag::O_RDWR, Mode::S_IRWXU).unwrap();
    }
    assert_eq!(sweep_segments(&job).unwrap(), names[..2].to_vec());
    assert_clean(&job);
    assert_eq!(leftovers(&other).len(), 1);
    assert_eq!(sweep_segments(&other).unwrap(), names[2..].to_vec());
    assert_eq!(sweep_segments(&job).unwrap(), Vec::<String>::new());
}

#[test]
fn job_ids_are_validated() {
    let id = JobId::random();
    assert_eq!(id.as_str().len(), 32);
    assert_eq!(JobId::parse(id.as_str()).unwrap(), id);
    assert_ne!(JobId::random(), id);
    assert_eq!(id.shm_name("rdv"), format!("/arx-{id}-rdv"));
    let long = "a".repeat(65);
    for bad in ["", "0123456789abcde", "0123456789ABCDEF", "0123456789abcdeg", "../../etc/passwd0000", &long] {
        assert!(matches!(JobId::parse(bad), Err(IpcError::BadJobId(_))), "{bad:?}");
    }
    assert!(JobId::parse(&"f".repeat(64)).is_ok());
}
