use super::*;
use std::thread::{self, JoinHandle};

const LONG: Duration = Duration::from_secs(20);
const SHORT: Duration = Duration::from_secs(1);

/// Rank 0 bound to an OS-chosen port on loopback, and the options that reach it.
fn root(timeout: Duration) -> (Root, BootstrapOptions) {
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let root = Root::bind(&BootstrapOptions::new(loopback, timeout)).unwrap();
    let opts = BootstrapOptions::new(root.addr(), timeout);
    (root, opts)
}

/// A loopback address where nothing listens (a port that was free a moment ago).
fn nobody_listens() -> SocketAddr {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap().local_addr().unwrap()
}

/// Rank `rank` of `world` as a thread.
fn rank(
    opts: &BootstrapOptions,
    rank: usize,
    world: usize,
    job: &str,
    blob: Vec<u8>,
) -> JoinHandle<Result<Vec<Vec<u8>>, BootstrapError>> {
    let (opts, job) = (opts.clone(), job.to_string());
    thread::spawn(move || all_gather(&opts, rank, world, &job, &blob))
}

fn random_blob(len: usize) -> Vec<u8> {
    (0..len).map(|_| rand::random()).collect()
}

/// Sends `bytes` to rank 0 as a stray client would, and reads what comes back until rank 0 closes.
fn stray(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    // Either may fail once rank 0 has dropped us, having read enough to know we are no rank.
    let _ = s.write_all(bytes);
    // Rank 0 sees the end of what we send at once, rather than after its wait for a hello.
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    answer
}

/// A hello as JSON text in a frame, followed by a blob frame.
fn raw_hello(json: &str, blob: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame(&mut out, json.as_bytes());
    frame(&mut out, blob);
    out
}

/// The refusal in rank 0's answer to a stray client.
fn refusal(answer: &[u8]) -> Refusal {
    match serde_json::from_slice(&read_frame(&mut &answer[..], MAX_HEADER).unwrap()).unwrap() {
        Reply::Refused(refusal) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn ranks_exchange_blobs_in_rank_order() {
    for world in [1, 2, 5] {
        // Sizes from empty to the cap, NCCL's unique id (128 bytes) among them.
        let blobs: Vec<Vec<u8>> = (0..world).map(|r| random_blob([128, 0, 7, MAX_BLOB, 1000][r])).collect();
        let (root, opts) = root(LONG);
        let others: Vec<_> = (1..world).map(|r| rank(&opts, r, world, "job-a", blobs[r].clone())).collect();
        let gathered = if world == 1 {
            all_gather(&opts, 0, 1, "job-a", &blobs[0]).unwrap()
        } else {
            root.all_gather(world, "job-a", &blobs[0]).unwrap()
        };
        assert_eq!(gathered, blobs, "rank 0 of {world}");
        for (r, t) in others.into_iter().enumerate() {
            assert_eq!(t.join().unwrap().unwrap(), blobs, "rank {} of {world}", r + 1);
        }
    }
}

/// Ranks that start before rank 0 listens keep trying until it does.
#[test]
fn ranks_wait_for_a_late_rank_0() {
    let opts = BootstrapOptions::new(nobody_listens(), LONG);
    let blobs: Vec<Vec<u8>> = (0..3).map(|_| random_blob(128)).collect();
    let others: Vec<_> = (1..3).map(|r| rank(&opts, r, 3, "late", blobs[r].clone())).collect();
    thread::sleep(Duration::from_millis(300));
    assert_eq!(all_gather(&opts, 0, 3, "late", &blobs[0]).unwrap(), blobs);
    for t in others {
        assert_eq!(t.join().unwrap().unwrap(), blobs);
    }
}

#[test]
fn a_rank_that_never_connects_is_named_by_rank_0() {
    let (root, _) = root(SHORT);
    let addr = root.addr();
    // Rank 1 waits longer than rank 0, so that it hears rank 0's verdict rather than ending first.
    let one = rank(&BootstrapOptions::new(addr, LONG), 1, 3, "job", vec![1]);
    let start = Instant::now();
    let e = root.all_gather(3, "job", &[0]).unwrap_err();
    assert!(start.elapsed() < SHORT * 3, "rank 0 gave up after {:?}", start.elapsed());
    match &e {
        BootstrapError::Missing { timed_out, refused } => {
            assert_eq!((&timed_out.missing, refused.is_empty()), (&vec![2], true));
        }
        other => panic!("expected Missing, got {other:?}"),
    }
    let msg = e.to_string();
    assert!(msg.contains(&addr.to_string()) && msg.contains("[2]"), "{msg}");
    // Rank 1, which did arrive, is told why rather than left to its own deadline.
    match one.join().unwrap() {
        Err(BootstrapError::Aborted { addr: a, reason }) => assert!(a == addr && reason.contains("[2]"), "{reason}"),
        other => panic!("expected Aborted, got {other:?}"),
    }
}

#[test]
fn a_rank_whose_rank_0_never_listens_names_the_address() {
    let addr = nobody_listens();
    let start = Instant::now();
    let e = all_gather(&BootstrapOptions::new(addr, SHORT), 2, 4, "job", &[2]).unwrap_err();
    assert!(start.elapsed() >= SHORT && start.elapsed() < SHORT * 3, "gave up after {:?}", start.elapsed());
    assert!(matches!(&e, BootstrapError::Connect { rank: 2, addr: a, .. } if *a == addr), "{e:?}");
    assert!(e.to_string().starts_with(&format!("rank 2 could not reach rank 0 at {addr} in 1s: ")), "{e}");
}

#[test]
fn a_hello_of_another_job_is_refused_and_the_job_goes_on() {
    let (root, opts) = root(LONG);
    let addr = root.addr();
    let zero = thread::spawn(move || root.all_gather(2, "ours", b"zero"));
    // Another job's rank 1 at our port: told so, and rank 0 keeps waiting for ours.
    match rank(&opts, 1, 2, "theirs", b"x".to_vec()).join().unwrap() {
        Err(BootstrapError::Refused { addr: a, rank: 1, refusal }) => {
            assert_eq!(a, addr);
            assert_eq!(refusal, Refusal::OtherJob { root: "ours".into(), hello: "theirs".into() });
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    let expected = vec![b"zero".to_vec(), b"one".to_vec()];
    assert_eq!(rank(&opts, 1, 2, "ours", b"one".to_vec()).join().unwrap().unwrap(), expected);
    assert_eq!(zero.join().unwrap().unwrap(), expected);
}

#[test]
fn a_duplicate_rank_ends_the_job() {
    let (root, opts) = root(LONG);
    let addr = root.addr();
    let start = Instant::now();
    let zero = thread::spawn(move || root.all_gather(3, "job", &[0]));
    let first = rank(&opts, 1, 3, "job", vec![1]);
    // The first rank 1 joins (rank 0 waits for rank 2 meanwhile) before the second says it is rank 1 too.
    thread::sleep(Duration::from_millis(500));
    let second = rank(&opts, 1, 3, "job", vec![11]).join().unwrap();
    assert!(
        matches!(second, Err(BootstrapError::Refused { refusal: Refusal::Duplicate { rank: 1, .. }, .. })),
        "{second:?}"
    );
    let e = zero.join().unwrap().unwrap_err();
    match &e {
        BootstrapError::Conflict { addr: a, refusal: Refusal::Duplicate { rank: 1, first }, .. } => {
            assert_eq!((*a, first.ip()), (addr, addr.ip()));
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert!(start.elapsed() < LONG / 2, "a conflict ends the wait at once, not at the deadline");
    match first.join().unwrap() {
        Err(BootstrapError::Aborted { reason, .. }) => {
            assert!(reason.contains("rank 1 has already joined"), "{reason}")
        }
        other => panic!("expected Aborted, got {other:?}"),
    }
}

#[test]
fn hellos_at_odds_with_the_job_are_refused() {
    let hello = |rank: usize, world: usize| {
        format!(r#"{{"magic":"{MAGIC}","version":{PROTOCOL_VERSION},"job":"job","rank":{rank},"world":{world}}}"#)
    };
    let cases = [
        (hello(1, 4), Refusal::OtherWorld { root: 3, hello: 4 }),
        (hello(3, 3), Refusal::RankOutOfRange { rank: 3, world: 3 }),
        // Rank 0 itself is the first rank 0 (its address is filled in below).
        (hello(0, 3), Refusal::Duplicate { rank: 0, first: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)) }),
    ];
    for (json, mut expected) in cases {
        let (root, _) = root(LONG);
        let addr = root.addr();
        if let Refusal::Duplicate { first, .. } = &mut expected {
            *first = addr;
        }
        let zero = thread::spawn(move || root.all_gather(3, "job", &[0]));
        assert_eq!(refusal(&stray(addr, &raw_hello(&json, &[9]))), expected);
        match zero.join().unwrap() {
            Err(BootstrapError::Conflict { refusal, .. }) => assert_eq!(refusal, expected),
            other => panic!("{json}: expected Conflict, got {other:?}"),
        }
    }
    // Another protocol version is only turned away: told both versions, and named if ranks then never come.
    let (root, _) = root(SHORT);
    let addr = root.addr();
    let zero = thread::spawn(move || root.all_gather(2, "job", &[0]));
    // Its hello alone: rank 0 refuses without reading further, and what it left unread would reset the connection.
    let mut newer = Vec::new();
    frame(&mut newer, format!(r#"{{"magic":"{MAGIC}","version":99,"something":"else"}}"#).as_bytes());
    assert_eq!(refusal(&stray(addr, &newer)), Refusal::Version { root: PROTOCOL_VERSION, hello: 99 });
    let e = zero.join().unwrap().unwrap_err();
    assert!(matches!(&e, BootstrapError::Missing { refused, .. } if refused.len() == 1), "{e:?}");
    assert!(e.to_string().contains("speaks protocol 99"), "{e}");
}

/// A hello of rank 1 of "job" followed by a blob frame one byte over the cap.
fn oversized_blob() -> Vec<u8> {
    let mut out = Vec::new();
    frame(&mut out, format!(r#"{{"magic":"{MAGIC}","version":1,"job":"job","rank":1,"world":2}}"#).as_bytes());
    out.extend_from_slice(&(MAX_BLOB as u32 + 1).to_le_bytes());
    out
}

#[test]
fn garbage_connections_are_dropped_and_do_not_count() {
    let (root, opts) = root(LONG);
    let addr = root.addr();
    let zero = thread::spawn(move || root.all_gather(2, "job", b"0"));
    let huge = |len: u32| len.to_le_bytes().to_vec();
    let strays: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        huge(u32::MAX),
        huge(MAX_HEADER as u32 + 1),
        raw_hello("not json at all", b""),
        raw_hello(r#"{"magic":"something else","version":1}"#, b""),
        raw_hello(&format!(r#"{{"magic":"{MAGIC}","version":{PROTOCOL_VERSION},"rank":"one"}}"#), b""),
        // A good hello whose blob frame is over the cap.
        oversized_blob(),
        Vec::new(),
    ];
    for bytes in &strays {
        // Rank 0 closes each without an answer.
        assert_eq!(stray(addr, bytes), b"", "{:?}", String::from_utf8_lossy(bytes));
    }
    // A half-sent hello that stays open does not hold the job up either.
    let mut lingering = TcpStream::connect(addr).unwrap();
    lingering.write_all(&[10, 0]).unwrap();
    let expected = vec![b"0".to_vec(), b"1".to_vec()];
    assert_eq!(rank(&opts, 1, 2, "job", b"1".to_vec()).join().unwrap().unwrap(), expected);
    assert_eq!(zero.join().unwrap().unwrap(), expected);
}

#[test]
fn a_rank_that_leaves_ends_the_job_at_once() {
    let (root, _) = root(LONG);
    let addr = root.addr();
    let start = Instant::now();
    let zero = thread::spawn(move || root.all_gather(3, "job", &[0]));
    let hello = format!(r#"{{"magic":"{MAGIC}","version":{PROTOCOL_VERSION},"job":"job","rank":2,"world":3}}"#);
    let mut two = TcpStream::connect(addr).unwrap();
    two.write_all(&raw_hello(&hello, &[2])).unwrap();
    thread::sleep(Duration::from_millis(300));
    drop(two);
    match zero.join().unwrap() {
        Err(BootstrapError::Lost { rank: 2, missing, reason, .. }) => {
            assert_eq!((missing, reason.as_str()), (vec![1, 2], "closed its connection"));
        }
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(start.elapsed() < LONG / 2);
}

#[test]
fn bad_arguments_are_refused() {
    let opts = BootstrapOptions::new(nobody_listens(), SHORT);
    for (rank, world, job, blob) in [
        (0, 0, "job".to_string(), vec![]),
        (3, 3, "job".to_string(), vec![]),
        (1, 2, "j".repeat(MAX_JOB + 1), vec![]),
        (1, 2, "job".to_string(), vec![0; MAX_BLOB + 1]),
    ] {
        let e = all_gather(&opts, rank, world, &job, &blob).unwrap_err();
        assert!(matches!(e, BootstrapError::BadArgs(_)), "{e:?}");
    }
}

#[test]
fn options_from_the_environment() {
    let from = |pairs: &[(&str, &str)]| {
        let vars: std::collections::HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        BootstrapOptions::from_vars(|v| vars.get(v).cloned(), SHORT)
    };
    let opts = from(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")]).unwrap();
    let at = |ip: &str, port: u16| SocketAddr::new(ip.parse().unwrap(), port);
    assert_eq!(opts, BootstrapOptions { addr: at("127.0.0.1", 29500), listen: at("127.0.0.1", 29500), timeout: SHORT });
    // A loopback address given as one is listened at; any other, at every interface.
    let opts = from(&[("MASTER_ADDR", "10.1.2.3"), ("MASTER_PORT", "29500"), (PORT_ENV, "29600")]).unwrap();
    assert_eq!((opts.addr, opts.listen), (at("10.1.2.3", 29600), at("0.0.0.0", 29600)));
    let opts = from(&[("MASTER_ADDR", "[::1]"), ("MASTER_PORT", "1")]).unwrap();
    assert_eq!((opts.addr, opts.listen), (at("::1", 1), at("::1", 1)));
    let opts = from(&[("MASTER_ADDR", "fd00::1"), ("MASTER_PORT", "1")]).unwrap();
    assert_eq!(opts.listen, at("::", 1));
    assert!(from(&[("MASTER_ADDR", "localhost"), ("MASTER_PORT", "1")]).unwrap().listen.ip().is_loopback());

    let bad_var = |pairs: &[(&str, &str)]| match from(pairs) {
        Err(BootstrapError::BadEnv { var, .. }) => var,
        other => panic!("expected BadEnv, got {other:?}"),
    };
    assert_eq!(bad_var(&[("MASTER_PORT", "1")]), "MASTER_ADDR");
    assert_eq!(bad_var(&[("MASTER_ADDR", "127.0.0.1")]), "MASTER_PORT");
    assert_eq!(bad_var(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "65536")]), "MASTER_PORT");
    assert_eq!(bad_var(&[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "1"), (PORT_ENV, "x")]), PORT_ENV);
}

#[test]
fn a_port_in_use_says_how_to_get_another() {
    let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let e = Root::bind(&BootstrapOptions::new(taken.local_addr().unwrap(), SHORT)).err().unwrap();
    assert!(matches!(e, BootstrapError::Listen { .. }), "{e:?}");
    assert!(e.to_string().contains(PORT_ENV), "{e}");
}
