//! Small blobs (an NCCL unique id, say) all-gathered among the ranks of a job over TCP, for the set-up that must
//! happen before any faster channel exists between nodes, as NCCL's own bootstrap and torch's TCPStore do: rank 0
//! listens ([`Root`]), every other rank connects and sends a hello and its blob, and once every rank has arrived
//! rank 0 sends each of them the list in rank order ([`all_gather`]).
//!
//! On the wire every message is a frame: a little-endian u32 length, then that many bytes, each kind of frame
//! capped ([`MAX_HEADER`], [`MAX_BLOB`]) so that a stray connection cannot make rank 0 allocate more. A rank sends
//! its hello (JSON: magic, protocol version, job, rank, world) and its blob; rank 0 answers with a header (JSON: the
//! list follows, or why the hello was refused, or why rank 0 gave up) and, for the list, one frame per rank's blob.
//! Rank 0 reads a hello's blob before it judges the hello, so that it never closes a connection with unread data,
//! which would reset it and lose the answer.

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use deadline::{Deadline, TimedOut, WaitError};
use launch::{MASTER_ADDR_ENV, MASTER_PORT_ENV};
use nix::poll::{poll, PollFd, PollFlags};
use serde::{Deserialize, Serialize};

/// Overrides [`MASTER_PORT_ENV`] for the bootstrap alone: rank 0 of a program that also runs torch.distributed
/// already has torch's store listening at MASTER_PORT.
pub const PORT_ENV: &str = "ALLREDUCE_BOOTSTRAP_PORT";

/// What every hello starts with, so that a stray client of another protocol is told apart from a rank.
const MAGIC: &str = "allreduce-bootstrap";
/// The protocol this crate speaks; a hello of another is refused with both versions named.
pub const PROTOCOL_VERSION: u32 = 1;

/// The largest blob a rank may send: room for hundreds of NCCL unique ids (128 bytes each), and all that a
/// connection that passed the hello's magic can make rank 0 hold.
pub const MAX_BLOB: usize = 64 << 10;
/// The longest job id a hello carries.
pub const MAX_JOB: usize = 256;
/// The largest hello or reply header (JSON); a reason in a reply is cut to fit.
pub const MAX_HEADER: usize = 16 << 10;

/// Connections accepted but not yet a rank; past this many, rank 0 leaves new ones in the listen backlog until
/// some are judged, so a flood of strays costs no more than this.
const MAX_UNJUDGED: usize = 64;
/// How long a connection may take to send its hello and blob (a rank sends both at once) before it is dropped.
const HELLO_WAIT: Duration = Duration::from_secs(5);
/// How long rank 0 waits for events in one step of its wait: the longest a deadline or a failure goes unnoticed.
const STEP: u8 = 10;
/// Pause between a rank's attempts to connect to a rank 0 that does not listen yet.
const RETRY: Duration = Duration::from_millis(50);
/// The least time rank 0 gives itself to send the list, so that a rank that arrived at the deadline still gets it.
const MIN_SEND: Duration = Duration::from_secs(1);

/// Where rank 0 is and how long the exchange may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootstrapOptions {
    /// Where the other ranks reach rank 0.
    pub addr: SocketAddr,
    /// Where rank 0 listens: `addr` itself when it is a loopback address given as one, else every interface at
    /// `addr`'s port, because a host name may resolve to a loopback address on rank 0's own host (Debian maps its
    /// hostname to 127.0.1.1) and to a reachable one everywhere else.
    pub listen: SocketAddr,
    /// How long the exchange may wait, from the call: rank 0 for every rank, the others for rank 0 and the list.
    pub timeout: Duration,
}

impl BootstrapOptions {
    /// Rank 0 at the address `addr`.
    pub fn new(addr: SocketAddr, timeout: Duration) -> BootstrapOptions {
        BootstrapOptions { addr, listen: listen_at(addr, true), timeout }
    }

    /// Rank 0 at MASTER_ADDR and MASTER_PORT (or [`PORT_ENV`]), as torchrun and our launcher set them.
    pub fn from_env(timeout: Duration) -> Result<BootstrapOptions, BootstrapError> {
        BootstrapOptions::from_vars(|var| std::env::var(var).ok(), timeout)
    }

    /// [`BootstrapOptions::from_env`] on an explicit environment, so it can be tested without touching the
    /// process's.
    fn from_vars(var: impl Fn(&str) -> Option<String>, timeout: Duration) -> Result<BootstrapOptions, BootstrapError> {
        let bad = |var: &str, msg: String| BootstrapError::BadEnv { var: var.to_string(), msg };
        let host = var(MASTER_ADDR_ENV).ok_or_else(|| bad(MASTER_ADDR_ENV, "not set: where rank 0 listens".into()))?;
        let port_var = if var(PORT_ENV).is_some() { PORT_ENV } else { MASTER_PORT_ENV };
        let port = var(port_var).ok_or_else(|| bad(port_var, "not set: the port rank 0 listens at".into()))?;
        let port: u16 =
            port.trim().parse().map_err(|_| bad(port_var, format!("{port:?} is not a port number (0 to 65535)")))?;
        let host = host.trim();
        // An IPv6 literal may come bracketed, as in a URL.
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        let resolved = (bare, port).to_socket_addrs().map_err(|e| bad(MASTER_ADDR_ENV, format!("{host:?}: {e}")))?;
        let addr = resolved.into_iter().next();
        let addr = addr.ok_or_else(|| bad(MASTER_ADDR_ENV, format!("{host:?} resolves to no address")))?;
        let literal = bare.parse::<IpAddr>().is_ok() || bare.eq_ignore_ascii_case("localhost");
        Ok(BootstrapOptions { addr, listen: listen_at(addr, literal), timeout })
    }
}

/// Where rank 0 listens for ranks that reach it at `addr` (see [`BootstrapOptions::listen`]).
fn listen_at(addr: SocketAddr, literal: bool) -> SocketAddr {
    match addr.ip() {
        ip if ip.is_loopback() && literal => addr,
        IpAddr::V4(_) => SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), addr.port()),
        IpAddr::V6(_) => SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), addr.port()),
    }
}

/// Why rank 0 turned a hello away. Sent to the connection it refuses, so that side fails with the same reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    #[error("the hello speaks protocol {hello}, rank 0 speaks {root}")]
    Version { root: u32, hello: u32 },
    #[error("the hello is of job {hello:?}, rank 0 gathers job {root:?}")]
    OtherJob { root: String, hello: String },
    #[error("the hello says {hello} ranks, rank 0's job has {root}")]
    OtherWorld { root: usize, hello: usize },
    #[error("rank {rank} does not connect to rank 0 in a job of {world} ranks")]
    RankOutOfRange { rank: usize, world: usize },
    #[error("rank {rank} has already joined, from {first}")]
    Duplicate { rank: usize, first: SocketAddr },
}

impl Refusal {
    /// Whether the hello is of this job (its job id) and yet at odds with it, which no waiting mends: rank 0 then
    /// gives up at once. A hello of another job is only turned away (a stray client at our port).
    fn ends_the_job(&self) -> bool {
        !matches!(self, Refusal::Version { .. } | Refusal::OtherJob { .. })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("{var}: {msg}")]
    BadEnv { var: String, msg: String },
    #[error("bad arguments: {0}")]
    BadArgs(String),
    #[error("rank 0 cannot listen at {listen}: {source}{}", in_use_hint(source))]
    Listen { listen: SocketAddr, source: io::Error },
    /// Rank 0's wait ended with ranks that never arrived (named in `timed_out`, with rank 0's address), and the
    /// connections it turned away meanwhile.
    #[error("{timed_out}{}", refused_note(refused))]
    Missing { timed_out: TimedOut, refused: Vec<String> },
    /// Rank 0 turned away a hello of this job that no waiting mends.
    #[error("bootstrap at {addr}: refused {peer}: {refusal}")]
    Conflict { addr: SocketAddr, peer: SocketAddr, refusal: Refusal },
    #[error(
        "bootstrap at {addr}: rank {rank} (from {peer}) {reason} before every rank had arrived (missing: {missing:?})"
    )]
    Lost { addr: SocketAddr, rank: usize, peer: SocketAddr, reason: String, missing: Vec<usize> },
    #[error("bootstrap at {addr}: sending the list to rank {rank} at {peer}: {source}")]
    Send { addr: SocketAddr, rank: usize, peer: SocketAddr, source: io::Error },
    /// A rank other than 0 could not connect to rank 0 before its deadline.
    #[error("rank {rank} could not reach rank 0 at {addr} in {waited:?}: {source}")]
    Connect { rank: usize, addr: SocketAddr, waited: Duration, source: io::Error },
    #[error("rank 0 at {addr} refused rank {rank}: {refusal}")]
    Refused { addr: SocketAddr, rank: usize, refusal: Refusal },
    /// Rank 0 gave up and said why (ranks that never came, a conflict, a rank that left).
    #[error("rank 0 at {addr} gave up: {reason}")]
    Aborted { addr: SocketAddr, reason: String },
    #[error(
        "rank {rank} connected to rank 0 at {addr}, but the list did not come within {waited:?} (rank 0 names the \
         ranks it waited for)"
    )]
    NoReply { rank: usize, addr: SocketAddr, waited: Duration },
    #[error("rank {rank} talking to rank 0 at {addr}: {msg}")]
    Protocol { rank: usize, addr: SocketAddr, msg: String },
}

fn in_use_hint(e: &io::Error) -> String {
    if e.kind() == io::ErrorKind::AddrInUse {
        format!(" (torch.distributed's store may hold {MASTER_PORT_ENV}: give the bootstrap its own with {PORT_ENV})")
    } else {
        String::new()
    }
}

fn refused_note(refused: &[String]) -> String {
    if refused.is_empty() {
        String::new()
    } else {
        format!("; meanwhile turned away: {}", refused.join("; "))
    }
}

/// Every rank's `blob`, in rank order, on every rank of a job of `world` ranks named `job` (every rank passes the
/// same `world` and `job`). Rank 0 listens at `opts.listen`; the others connect to `opts.addr`, retrying until
/// the deadline, as rank 0 may start later.
pub fn all_gather(
    opts: &BootstrapOptions,
    rank: usize,
    world: usize,
    job: &str,
    blob: &[u8],
) -> Result<Vec<Vec<u8>>, BootstrapError> {
    check_args(rank, world, job, blob)?;
    match (rank, world) {
        (_, 1) => Ok(vec![blob.to_vec()]),
        (0, _) => Root::bind(opts)?.all_gather(world, job, blob),
        _ => join(opts, rank, world, job, blob),
    }
}

fn check_args(rank: usize, world: usize, job: &str, blob: &[u8]) -> Result<(), BootstrapError> {
    let bad = |msg: String| Err(BootstrapError::BadArgs(msg));
    if rank >= world {
        return bad(format!("rank {rank} of a world of {world}"));
    }
    if job.len() > MAX_JOB {
        return bad(format!("a job id of {} bytes (at most {MAX_JOB})", job.len()));
    }
    if blob.len() > MAX_BLOB {
        return bad(format!("a blob of {} bytes (at most {MAX_BLOB})", blob.len()));
    }
    Ok(())
}

/// Rank 0's side of the exchange, listening from [`Root::bind`] on, so that a caller can learn the port the OS chose
/// for port 0 before the others are told where to connect.
pub struct Root {
    listener: TcpListener,
    /// Where the ranks reach us, with the port we are bound to: what errors name.
    addr: SocketAddr,
    timeout: Duration,
}

impl Root {
    /// Listens at `opts.listen`; at port 0, at one the OS chooses, which [`Root::addr`] then gives.
    pub fn bind(opts: &BootstrapOptions) -> Result<Root, BootstrapError> {
        let listen_err = |source| BootstrapError::Listen { listen: opts.listen, source };
        let listener = TcpListener::bind(opts.listen).map_err(listen_err)?;
        let port = listener.local_addr().map_err(listen_err)?.port();
        listener.set_nonblocking(true).map_err(listen_err)?;
        Ok(Root { listener, addr: SocketAddr::new(opts.addr.ip(), port), timeout: opts.timeout })
    }

    /// Where the other ranks reach this rank 0.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Rank 0's [`all_gather`]: waits until every other rank has sent a hello of this job and its blob, then sends
    /// each of them the list. Ends at once on a conflict or a rank that leaves, and at the deadline naming the ranks
    /// that never arrived; either way every rank still connected is told why.
    pub fn all_gather(self, world: usize, job: &str, blob: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        check_args(0, world, job, blob)?;
        let end = Instant::now() + self.timeout;
        let deadline = Deadline::after(self.timeout);
        let state = RefCell::new(Gather::new(&self, world, job, blob));
        let what = format!("bootstrap of job {job:?}: rank 0 at {}", self.addr);
        let waited = deadline::wait_all(
            &what,
            1..world,
            &deadline,
            |r| state.borrow().blobs[r].is_some(),
            || {
                let mut state = state.borrow_mut();
                state.step();
                state.failure.as_ref().map(ToString::to_string)
            },
        );
        let mut state = state.into_inner();
        let failure = match (waited, state.failure.take()) {
            (_, Some(failure)) => failure,
            (Ok(()), None) => return state.send_list(end),
            (Err(WaitError::TimedOut(timed_out)), None) => {
                BootstrapError::Missing { timed_out, refused: std::mem::take(&mut state.refused) }
            }
            // Only `step` aborts the wait, and it records why.
            (Err(e @ WaitError::Aborted { .. }), None) => {
                BootstrapError::Aborted { addr: self.addr, reason: e.to_string() }
            }
        };
        state.abort(&failure.to_string());
        Err(failure)
    }
}

/// A connection that is not a rank yet: its hello, then its blob, read as they come.
struct Unjudged {
    stream: TcpStream,
    peer: SocketAddr,
    since: Instant,
    /// The frame being read: its length prefix, then its bytes; never more than the frame needs.
    buf: Vec<u8>,
    hello: Option<Hello>,
}

/// What became of a connection in one step.
enum Outcome {
    Pending,
    /// Not a rank of any job of ours: dropped, and the reason logged.
    Dropped(String),
    Refused(Refusal),
    Joined {
        rank: usize,
        blob: Vec<u8>,
    },
}

/// Rank 0's state while it waits.
struct Gather<'a> {
    root: &'a Root,
    world: usize,
    job: &'a str,
    unjudged: Vec<Unjudged>,
    /// Each rank's blob once it arrived; rank 0's from the start.
    blobs: Vec<Option<Vec<u8>>>,
    /// Each rank's connection once it arrived, kept to send the list on and watched for leaving.
    joined: Vec<Option<(TcpStream, SocketAddr)>>,
    /// The connections turned away, for the error if ranks never come.
    refused: Vec<String>,
    failure: Option<BootstrapError>,
}

impl<'a> Gather<'a> {
    fn new(root: &'a Root, world: usize, job: &'a str, blob: &[u8]) -> Gather<'a> {
        let mut blobs = vec![None; world];
        blobs[0] = Some(blob.to_vec());
        let joined = (0..world).map(|_| None).collect();
        Gather { root, world, job, unjudged: Vec::new(), blobs, joined, refused: Vec::new(), failure: None }
    }

    /// Waits up to [`STEP`] ms for new connections or bytes, and handles what came.
    fn step(&mut self) {
        let listening = self.unjudged.len() < MAX_UNJUDGED;
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd> = Vec::new();
            if listening {
                fds.push(PollFd::new(self.root.listener.as_fd(), PollFlags::POLLIN));
            }
            fds.extend(self.unjudged.iter().map(|c| PollFd::new(c.stream.as_fd(), PollFlags::POLLIN)));
            fds.extend(self.joined.iter().flatten().map(|(s, _)| PollFd::new(s.as_fd(), PollFlags::POLLIN)));
            // EINTR and the like: nothing is ready this step.
            if poll(&mut fds, STEP).is_err() {
                return;
            }
            fds.iter().map(|f| f.revents().is_some_and(|r| !r.is_empty())).collect()
        };
        let (listener_ready, ready) = if listening { (ready[0], &ready[1..]) } else { (false, &ready[..]) };
        let (unjudged_ready, joined_ready) = ready.split_at(self.unjudged.len());
        self.watch_joined(joined_ready);
        // One at a time, each settled before the next is judged, so two hellos of one rank are never both taken.
        let mut readable = unjudged_ready.to_vec();
        let mut i = 0;
        while i < self.unjudged.len() {
            match self.advance(i, readable[i]) {
                Outcome::Pending => i += 1,
                outcome => {
                    readable.swap_remove(i);
                    let conn = self.unjudged.swap_remove(i);
                    self.settle(conn, outcome);
                }
            }
        }
        if listener_ready {
            self.accept();
        }
    }

    /// Takes new connections while fewer than [`MAX_UNJUDGED`] wait to be judged.
    fn accept(&mut self) {
        while self.unjudged.len() < MAX_UNJUDGED {
            match self.root.listener.accept() {
                Ok((stream, peer)) => {
                    if let Err(e) = stream.set_nonblocking(true) {
                        self.log(peer, &format!("dropped: {e}"));
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    self.unjudged.push(Unjudged { stream, peer, since: Instant::now(), buf: Vec::new(), hello: None });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                // A connection that was reset before we took it, or out of descriptors: the next step retries.
                Err(e) => {
                    eprintln!("warning: bootstrap at {}: accepting a connection: {e}", self.root.addr);
                    return;
                }
            }
        }
    }

    /// Reads what connection `i` sent, if `readable`, and judges it once its hello and blob are in.
    fn advance(&mut self, i: usize, readable: bool) -> Outcome {
        let conn = &mut self.unjudged[i];
        if conn.since.elapsed() > HELLO_WAIT {
            return Outcome::Dropped(format!("no hello and blob within {HELLO_WAIT:?}"));
        }
        if !readable {
            return Outcome::Pending;
        }
        loop {
            let max = if conn.hello.is_none() { MAX_HEADER } else { MAX_BLOB };
            let frame = match read_frame_part(&mut conn.stream, &mut conn.buf, max) {
                Ok(Some(frame)) => frame,
                Ok(None) => return Outcome::Pending,
                Err(reason) => return Outcome::Dropped(reason),
            };
            match conn.hello.take() {
                None => match parse_hello(&frame) {
                    Ok(hello) => conn.hello = Some(hello),
                    Err(outcome) => return outcome,
                },
                Some(hello) => {
                    return match self.judge(&hello) {
                        Ok(()) => Outcome::Joined { rank: hello.rank, blob: frame },
                        Err(refusal) => Outcome::Refused(refusal),
                    };
                }
            }
        }
    }

    /// Whether a hello of protocol [`PROTOCOL_VERSION`] is a rank of this job that has not arrived yet.
    fn judge(&self, hello: &Hello) -> Result<(), Refusal> {
        if hello.job != self.job {
            return Err(Refusal::OtherJob { root: self.job.to_string(), hello: hello.job.clone() });
        }
        if hello.world != self.world {
            return Err(Refusal::OtherWorld { root: self.world, hello: hello.world });
        }
        if hello.rank == 0 {
            return Err(Refusal::Duplicate { rank: 0, first: self.root.addr });
        }
        if hello.rank >= self.world {
            return Err(Refusal::RankOutOfRange { rank: hello.rank, world: self.world });
        }
        match &self.joined[hello.rank] {
            Some((_, first)) => Err(Refusal::Duplicate { rank: hello.rank, first: *first }),
            None => Ok(()),
        }
    }

    /// What a judged connection comes to: a rank, or refused (told why, and the job ended when the hello is of it),
    /// or dropped.
    fn settle(&mut self, conn: Unjudged, outcome: Outcome) {
        let Unjudged { mut stream, peer, .. } = conn;
        match outcome {
            Outcome::Pending => {}
            Outcome::Dropped(reason) => self.log(peer, &format!("dropped: {reason}")),
            Outcome::Refused(refusal) => {
                self.log(peer, &format!("refused: {refusal}"));
                // Best effort: a header this small fits the socket's buffer; the connection closes either way.
                let _ = stream.write_all(&header(&Reply::Refused(refusal.clone())));
                if refusal.ends_the_job() {
                    if self.failure.is_none() {
                        self.failure = Some(BootstrapError::Conflict { addr: self.root.addr, peer, refusal });
                    }
                } else {
                    self.refused.push(format!("{peer} ({refusal})"));
                }
            }
            Outcome::Joined { rank, blob } => {
                self.blobs[rank] = Some(blob);
                self.joined[rank] = Some((stream, peer));
            }
        }
    }

    /// A rank that arrived sends nothing more: a readable connection has closed, failed, or speaks out of turn,
    /// and the job cannot complete without it.
    fn watch_joined(&mut self, ready: &[bool]) {
        let ranks: Vec<usize> = (0..self.world).filter(|&r| self.joined[r].is_some()).collect();
        for (&rank, _) in ranks.iter().zip(ready).filter(|(_, &ready)| ready) {
            let Some((stream, peer)) = &mut self.joined[rank] else { continue };
            let reason = match stream.read(&mut [0u8; 1]) {
                Ok(0) => "closed its connection".to_string(),
                Ok(_) => "sent more than its hello and blob".to_string(),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => format!("failed ({e})"),
            };
            let peer = *peer;
            self.joined[rank] = None;
            self.blobs[rank] = None;
            if self.failure.is_none() {
                let missing = (0..self.world).filter(|&r| self.blobs[r].is_none()).collect();
                self.failure = Some(BootstrapError::Lost { addr: self.root.addr, rank, peer, reason, missing });
            }
        }
    }

    /// Sends every rank the list; the first rank that could not be sent it is the error (the others still get it).
    fn send_list(mut self, end: Instant) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let blobs: Vec<Vec<u8>> = self.blobs.into_iter().flatten().collect();
        let mut reply = header(&Reply::List { world: self.world });
        blobs.iter().for_each(|b| frame(&mut reply, b));
        let mut failed = None;
        for (rank, joined) in self.joined.iter_mut().enumerate() {
            let Some((stream, peer)) = joined else { continue };
            let timeout = end.saturating_duration_since(Instant::now()).max(MIN_SEND);
            let sent = stream
                .set_nonblocking(false)
                .and_then(|()| stream.set_write_timeout(Some(timeout)))
                .and_then(|()| stream.write_all(&reply));
            if let Err(source) = sent {
                failed = failed.or(Some(BootstrapError::Send { addr: self.root.addr, rank, peer: *peer, source }));
            }
        }
        failed.map_or(Ok(blobs), Err)
    }

    /// Tells every rank that arrived why rank 0 gives up (best effort: they fail on their own deadline otherwise).
    fn abort(&mut self, reason: &str) {
        let reason: String = reason.chars().take(MAX_HEADER / 2).collect();
        let reply = header(&Reply::Aborted(reason));
        for (stream, _) in self.joined.iter_mut().flatten() {
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_write_timeout(Some(MIN_SEND));
            let _ = stream.write_all(&reply);
        }
    }

    fn log(&self, peer: SocketAddr, what: &str) {
        eprintln!("warning: bootstrap at {}: connection from {peer}: {what}", self.root.addr);
    }
}

/// A rank's hello: who it is, in which job.
#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    magic: String,
    version: u32,
    job: String,
    rank: usize,
    world: usize,
}

/// Rank 0's answer to a hello.
#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    /// The list follows: `world` frames, each rank's blob in rank order.
    List {
        world: usize,
    },
    Refused(Refusal),
    Aborted(String),
}

/// A hello read from a frame, or what becomes of a connection that sent something else: dropped when it is no
/// hello, refused when it is one of another protocol version. The magic and version are read first, apart, so
/// that a hello of another version is told both rather than dropped as garbage.
fn parse_hello(frame: &[u8]) -> Result<Hello, Outcome> {
    #[derive(Deserialize)]
    struct Probe {
        magic: String,
        version: u32,
    }
    let probe: Probe = serde_json::from_slice(frame).map_err(|e| Outcome::Dropped(format!("not a hello: {e}")))?;
    if probe.magic != MAGIC {
        return Err(Outcome::Dropped(format!("not a hello: magic {:?}", probe.magic)));
    }
    if probe.version != PROTOCOL_VERSION {
        return Err(Outcome::Refused(Refusal::Version { root: PROTOCOL_VERSION, hello: probe.version }));
    }
    serde_json::from_slice(frame).map_err(|e| Outcome::Dropped(format!("a garbled hello: {e}")))
}

/// Appends a frame of `payload` to `out`.
fn frame(out: &mut Vec<u8>, payload: &[u8]) {
    // Every payload is capped far below 4 GiB (MAX_HEADER, MAX_BLOB, and checked arguments).
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
}

/// A reply header as a frame.
fn header(reply: &Reply) -> Vec<u8> {
    let mut out = Vec::new();
    // A Reply holds strings and integers only, which always serialize.
    frame(&mut out, &serde_json::to_vec(reply).unwrap_or_default());
    out
}

/// Reads from a non-blocking stream what the frame in `buf` still needs, never past it; the frame once complete.
/// Err: why the connection is dropped (closed, failed, or a frame longer than `max`).
fn read_frame_part(stream: &mut TcpStream, buf: &mut Vec<u8>, max: usize) -> Result<Option<Vec<u8>>, String> {
    let mut chunk = [0u8; 4096];
    loop {
        let need = match buf.len() {
            n if n < 4 => 4 - n,
            n => {
                let len = frame_len(&buf[..4]);
                if len > max {
                    return Err(format!("a frame of {len} bytes (at most {max} here)"));
                }
                if n == 4 + len {
                    let frame = buf.split_off(4);
                    buf.clear();
                    return Ok(Some(frame));
                }
                4 + len - n
            }
        };
        match stream.read(&mut chunk[..need.min(4096)]) {
            Ok(0) => return Err(format!("closed after {} bytes of a frame", buf.len())),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn frame_len(prefix: &[u8]) -> usize {
    let mut len = [0u8; 4];
    len.copy_from_slice(prefix);
    u32::from_le_bytes(len) as usize
}

/// A rank other than 0: connects (retrying until the deadline), sends its hello and blob, reads the list.
fn join(
    opts: &BootstrapOptions,
    rank: usize,
    world: usize,
    job: &str,
    blob: &[u8],
) -> Result<Vec<Vec<u8>>, BootstrapError> {
    let (addr, timeout) = (opts.addr, opts.timeout);
    let end = Instant::now() + timeout;
    let deadline = Deadline::after(timeout);
    let left = || end.saturating_duration_since(Instant::now());
    let mut stream = None;
    let mut last = None;
    let what = format!("rank {rank} connecting to rank 0 at {addr}");
    let connected = deadline::wait_all(
        &what,
        [0],
        &deadline,
        |_| match TcpStream::connect_timeout(&addr, left().clamp(Duration::from_millis(1), RETRY * 20)) {
            Ok(s) => {
                stream = Some(s);
                true
            }
            Err(e) => {
                last = Some(e);
                std::thread::sleep(RETRY.min(left()));
                false
            }
        },
        || None,
    );
    let (Ok(()), Some(stream)) = (connected, stream) else {
        let source = last.unwrap_or_else(|| io::ErrorKind::TimedOut.into());
        return Err(BootstrapError::Connect { rank, addr, waited: timeout, source });
    };
    let protocol = |msg: String| BootstrapError::Protocol { rank, addr, msg };
    let io_err = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => BootstrapError::NoReply { rank, addr, waited: timeout },
        io::ErrorKind::UnexpectedEof => protocol("rank 0 closed the connection without an answer".into()),
        _ => protocol(e.to_string()),
    };
    let _ = stream.set_nodelay(true);
    let hello = Hello { magic: MAGIC.into(), version: PROTOCOL_VERSION, job: job.into(), rank, world };
    let mut out = Vec::new();
    // A Hello holds strings and integers only, which always serialize.
    frame(&mut out, &serde_json::to_vec(&hello).unwrap_or_default());
    frame(&mut out, blob);
    stream.set_write_timeout(Some(left().max(Duration::from_millis(1)))).map_err(io_err)?;
    (&stream).write_all(&out).map_err(io_err)?;

    let mut input = Timed { stream: &stream, end };
    let head = read_frame(&mut input, MAX_HEADER).map_err(io_err)?;
    let reply: Reply = serde_json::from_slice(&head).map_err(|e| protocol(format!("a garbled reply: {e}")))?;
    match reply {
        Reply::Refused(refusal) => Err(BootstrapError::Refused { addr, rank, refusal }),
        Reply::Aborted(reason) => Err(BootstrapError::Aborted { addr, reason }),
        Reply::List { world: listed } if listed != world => {
            Err(protocol(format!("a list of {listed} ranks for a job of {world}")))
        }
        Reply::List { .. } => {
            let blobs = (0..world).map(|_| read_frame(&mut input, MAX_BLOB)).collect::<io::Result<Vec<_>>>();
            let blobs = blobs.map_err(io_err)?;
            if blobs[rank] != blob {
                return Err(protocol(format!("the list holds another blob as rank {rank}'s")));
            }
            Ok(blobs)
        }
    }
}

/// One frame from a blocking stream; InvalidData when it is longer than `max`.
fn read_frame(input: &mut impl Read, max: usize) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    input.read_exact(&mut len)?;
    let len = frame_len(&len);
    if len > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a frame of {len} bytes (at most {max})")));
    }
    let mut frame = vec![0u8; len];
    input.read_exact(&mut frame)?;
    Ok(frame)
}

/// A stream whose every read waits at most until `end`, so reading a whole frame keeps the deadline.
struct Timed<'a> {
    stream: &'a TcpStream,
    end: Instant,
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

#[cfg(test)]
mod tests;
