//! Rendezvous of the ranks of one job on one host: a POSIX shared-memory segment with per-rank control words
//! and slots (barrier, all-gather, broadcast, abort), plus fd passing over abstract Unix datagram sockets.
//!
//! Everything a job creates is named after its [`JobId`], so [`sweep_segments`] can remove what a killed run
//! left behind, and every wait goes through [`deadline::wait_all`], so a dead peer becomes an error naming it.

mod wire;

pub use wire::{
    parse_fd_header, segment_len, slot_payload, validate_header, ExpectedHeader, FdHeader, HeaderInfo,
    HEADER_FIELDS_LEN,
};

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::env::VarError;
use std::ffi::c_void;
use std::fmt;
use std::io::{self, IoSlice, IoSliceMut};
use std::num::NonZeroUsize;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use deadline::{wait_all, Backoff, Deadline, TimedOut, WaitError, DEFAULT_TIMEOUT};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::mman::{mmap, munmap, shm_open, shm_unlink, MapFlags, ProtFlags};
use nix::sys::socket::{
    bind, recvmsg, sendmsg, setsockopt, socket, sockopt, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType, UnixAddr, UnixCredentials,
};
use nix::sys::stat::{fstat, FileStat, Mode};
use nix::unistd::{ftruncate, geteuid, getpid};
use rand::TryRng;

/// Environment variable through which a launcher hands every rank the same job id.
pub const JOB_ENV: &str = "ALLREDUCE_JOB_ID";

/// Largest world a segment is laid out for; more ranks than this on one host is a configuration error.
pub const MAX_WORLD: usize = 1024;

/// Largest slot a segment is laid out for, so a typo cannot ask for terabytes of shared memory.
pub const MAX_SLOT_BYTES: usize = 1 << 30;

/// Most fds one datagram can carry (the kernel's SCM_MAX_FD).
pub const MAX_FDS: usize = 253;

const MAGIC: u64 = u64::from_be_bytes(*b"ARXRDV\0\0");
const VERSION: u32 = 1;
const READY: u64 = u64::from_be_bytes(*b"ARXREADY");
/// Abort word value while the first aborting rank writes its reason.
const ABORT_CLAIMED: u64 = u64::MAX;
const REASON_BYTES: usize = 256;
const FD_MAGIC: u64 = u64::from_be_bytes(*b"ARXFDS\0\0");
/// Datagram header: magic, sender rank, fd count, call sequence number.
pub const FD_MSG_LEN: usize = 24;

/// Errors of the rendezvous; each says what was attempted and, for waits, which ranks did not show up.
#[derive(Debug, thiserror::Error)]
pub enum IpcError {
    #[error("{call}: {source}")]
    Sys { call: String, source: Errno },
    #[error(transparent)]
    Wait(#[from] WaitError),
    #[error("bad segment: {0}")]
    BadSegment(String),
    #[error(
        "{name} already exists: a killed run of this job left it (see sweep_segments) or another job uses the same id"
    )]
    Exists { name: String },
    #[error("bad job id {0}")]
    BadJobId(String),
    #[error("blob of {len} bytes does not fit a slot of {max} bytes")]
    BlobTooLarge { len: usize, max: usize },
    #[error("bad arguments: {0}")]
    BadArgs(String),
    #[error("{what}: aborted by rank {rank}: {reason}")]
    Aborted { what: String, rank: usize, reason: String },
    #[error("fd passing: {0}")]
    Fd(String),
}

fn sys(call: impl Into<String>) -> impl FnOnce(Errno) -> IpcError {
    let call = call.into();
    move |source| IpcError::Sys { call, source }
}

/// The id every name of a job derives from: lowercase hex, 16 to 64 digits.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JobId(String);

impl JobId {
    /// A fresh id of 32 hex digits, unguessable so other jobs cannot collide with it.
    pub fn random() -> JobId {
        let mut bytes = [0u8; 16];
        rand::rngs::SysRng.try_fill_bytes(&mut bytes).expect("the OS random source failed");
        JobId(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    pub fn parse(s: &str) -> Result<JobId, IpcError> {
        let hex = s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
        if hex && (16..=64).contains(&s.len()) {
            Ok(JobId(s.to_string()))
        } else {
            Err(IpcError::BadJobId(format!("{s:?}: expected 16 to 64 lowercase hex digits")))
        }
    }

    /// The id a launcher put into [`JOB_ENV`], if any.
    pub fn from_env() -> Result<Option<JobId>, IpcError> {
        match std::env::var(JOB_ENV) {
            Ok(s) => JobId::parse(&s).map(Some).map_err(|e| IpcError::BadJobId(format!("in {JOB_ENV}: {e}"))),
            Err(VarError::NotPresent) => Ok(None),
            Err(VarError::NotUnicode(s)) => Err(IpcError::BadJobId(format!("in {JOB_ENV}: {s:?} is not unicode"))),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name of one shared-memory segment of this job; every segment is named so, for [`sweep_segments`].
    pub fn shm_name(&self, suffix: &str) -> String {
        format!("/arx-{}-{suffix}", self.0)
    }

    /// Abstract-namespace socket address of `rank`, so nothing lands on disk.
    fn socket_addr(&self, rank: usize) -> Result<UnixAddr, IpcError> {
        let name = format!("arx-{}-fd{rank}", self.0);
        UnixAddr::new_abstract(name.as_bytes()).map_err(sys(format!("socket address @{name}")))
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Unlinks every `/dev/shm/arx-<job>-*` (what a SIGKILLed rank left behind); returns the names removed.
pub fn sweep_segments(job: &JobId) -> io::Result<Vec<String>> {
    let prefix = format!("arx-{}-", job.0);
    let mut removed = Vec::new();
    let dir = match std::fs::read_dir("/dev/shm") {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(removed),
        dir => dir?,
    };
    for entry in dir {
        let file = entry?.file_name();
        let Some(file) = file.to_str().filter(|f| f.starts_with(&prefix)) else {
            continue;
        };
        let name = format!("/{file}");
        match shm_unlink(name.as_str()) {
            Ok(()) => removed.push(name),
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    removed.sort();
    Ok(removed)
}

#[derive(Clone, Debug)]
pub struct RendezvousOptions {
    /// Largest blob one rank can contribute to [`Rendezvous::all_gather`] or [`Rendezvous::broadcast`].
    pub slot_bytes: usize,
    /// How long any one wait may take before it fails naming the missing ranks.
    pub timeout: Duration,
}

impl Default for RendezvousOptions {
    fn default() -> Self {
        RendezvousOptions { slot_bytes: 64 << 10, timeout: deadline::timeout_from_env().unwrap_or(DEFAULT_TIMEOUT) }
    }
}

/// Start of the segment. All fields are atomics so that ranks attaching while rank 0 still writes them never
/// race non-atomically; `ready` (Release, written last) publishes the rest.
#[repr(C, align(64))]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    world: AtomicU32,
    slot_bytes: AtomicU64,
    uid: AtomicU32,
    pid: AtomicU32,
    ready: AtomicU64,
    /// Set by rank 0 once it unlinked the name, so later drops do not unlink a newer segment of that name.
    unlinked: AtomicU64,
    /// 0, [`ABORT_CLAIMED`], or 1 + the aborting rank (Release, after `reason`).
    abort: AtomicU64,
    reason_len: AtomicU64,
    reason: [AtomicU8; REASON_BYTES],
}

/// One control word alone on its cache line, so polling a peer's word does not slow down its writes.
#[repr(C, align(64))]
struct Line(AtomicU64);

#[repr(C)]
struct Ctrl {
    attached: Line,
    arrived: Line,
    posted: Line,
    consumed: Line,
}

/// Offsets of the segment: header, `world` control blocks, `world` slots (length word + data).
#[derive(Clone, Copy, Debug)]
struct Layout {
    world: usize,
    slot_bytes: usize,
    slot_stride: usize,
    ctrl_off: usize,
    slots_off: usize,
    len: usize,
}

impl Layout {
    fn new(world: usize, slot_bytes: usize) -> Result<Layout, IpcError> {
        if !(1..=MAX_SLOT_BYTES).contains(&slot_bytes) {
            return Err(IpcError::BadArgs(format!("slot_bytes {slot_bytes} not in 1..={MAX_SLOT_BYTES}")));
        }
        let slot_stride = (8 + slot_bytes).next_multiple_of(64);
        let ctrl_off = size_of::<Header>();
        let slots_off = ctrl_off + world * size_of::<Ctrl>();
        Ok(Layout { world, slot_bytes, slot_stride, ctrl_off, slots_off, len: slots_off + world * slot_stride })
    }
}

/// A mapping of the segment; unmapped on drop, and unlinked too once we know it is this job's.
struct Segment {
    ptr: NonNull<c_void>,
    len: usize,
    name: String,
    /// Whether the segment is known to be ours (created, or validated), so dropping it may unlink the name.
    owned: bool,
}

// SAFETY: the mapping is process-shared memory touched only through atomics and the protocol's slot
// ownership; nothing in it is tied to the thread that mapped it.
unsafe impl Send for Segment {}

impl Segment {
    fn map(fd: &OwnedFd, name: &str, len: usize) -> Result<Segment, IpcError> {
        let size = NonZeroUsize::new(len).ok_or_else(|| IpcError::BadSegment(format!("{name}: size 0")))?;
        let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
        // SAFETY: a fresh shared mapping at an address of the kernel's choosing aliases no Rust object.
        let ptr =
            unsafe { mmap(None, size, prot, MapFlags::MAP_SHARED, fd, 0) }.map_err(sys(format!("mmap({name})")))?;
        Ok(Segment { ptr, len, name: name.to_string(), owned: false })
    }

    /// Only valid once the mapping is known to be at least a header long (checked before every call).
    fn header(&self) -> &Header {
        debug_assert!(self.len >= size_of::<Header>());
        // SAFETY: the mapping is page aligned, at least a header long, lives as long as `self`, and a Header
        // is only atomics, for which any bit pattern is valid and concurrent access from other processes is fine.
        unsafe { self.ptr.cast::<Header>().as_ref() }
    }

    fn unlink(&self) {
        // ENOENT: a peer or a sweep got there first, which is fine.
        let _ = shm_unlink(self.name.as_str());
        self.header().unlinked.store(1, Ordering::Release);
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.owned && self.header().unlinked.load(Ordering::Acquire) == 0 {
            self.unlink();
        }
        // SAFETY: ptr/len are the mapping made in `map`, and no reference into it outlives `self`.
        let _ = unsafe { munmap(self.ptr, self.len) };
    }
}

/// Retries `attempt` until it yields; a timeout says that `rank` never did `what` said.
fn retry<T>(
    what: &str,
    rank: usize,
    deadline: &Deadline,
    mut attempt: impl FnMut() -> Result<Option<T>, IpcError>,
) -> Result<T, IpcError> {
    let mut backoff = Backoff::new();
    loop {
        if let Some(v) = attempt()? {
            return Ok(v);
        }
        if deadline.expired() {
            let timeout = deadline.timeout();
            return Err(WaitError::from(TimedOut { what: what.to_string(), missing: vec![rank], timeout }).into());
        }
        backoff.snooze();
    }
}

/// The ranks of one job, attached to one segment and bound to one socket each.
pub struct Rendezvous {
    seg: Segment,
    layout: Layout,
    rank: usize,
    timeout: Cell<Duration>,
    sock: OwnedFd,
    peers: Vec<UnixAddr>,
    barrier_gen: Cell<u64>,
    data_gen: Cell<u64>,
    fd_seq: Cell<u64>,
    /// Fds received per (call sequence, sender), including those of calls we have not reached yet.
    inbox: RefCell<HashMap<(u64, usize), Vec<OwnedFd>>>,
}

impl Rendezvous {
    /// Attaches rank `rank` of `world` to the job's segment; returns once every rank attached (the segment
    /// name is then unlinked, so a later SIGKILL leaves nothing behind).
    pub fn join(job: &JobId, rank: usize, world: usize, opts: RendezvousOptions) -> Result<Rendezvous, IpcError> {
        if !(1..=MAX_WORLD).contains(&world) {
            return Err(IpcError::BadArgs(format!("world {world} not in 1..={MAX_WORLD}")));
        }
        if rank >= world {
            return Err(IpcError::BadArgs(format!("rank {rank} >= world {world}")));
        }
        let layout = Layout::new(world, opts.slot_bytes)?;
        let deadline = Deadline::after(opts.timeout);
        let label = format!("join (rank {rank} of {world})");
        let name = job.shm_name("rdv");
        let peers = (0..world).map(|r| job.socket_addr(r)).collect::<Result<Vec<_>, _>>()?;
        // Bound before we count as attached, so once join returns every peer can send to us.
        let sock = bind_socket(&peers[rank])?;
        let seg = if rank == 0 { create(&name, &layout)? } else { attach(&name, &layout, &label, &deadline)? };
        let rdv = Rendezvous {
            seg,
            layout,
            rank,
            timeout: Cell::new(opts.timeout),
            sock,
            peers,
            barrier_gen: Cell::new(0),
            data_gen: Cell::new(0),
            fd_seq: Cell::new(0),
            inbox: RefCell::new(HashMap::new()),
        };
        rdv.ctrl(rank).attached.0.store(1, Ordering::Release);
        rdv.wait(&label, &deadline, rdv.others(), |r| rdv.ctrl(r).attached.0.load(Ordering::Acquire) != 0)?;
        if rank == 0 {
            rdv.seg.unlink();
        }
        Ok(rdv)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.layout.world
    }

    pub fn timeout(&self) -> Duration {
        self.timeout.get()
    }

    /// Changes how long each later wait may take (set-up, with its cold kernel compiles, waits longer than calls).
    pub fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout);
    }

    /// Returns once every rank called `barrier` as often as we did.
    pub fn barrier(&self, what: &str) -> Result<(), IpcError> {
        let g = self.barrier_gen.get() + 1;
        self.barrier_gen.set(g);
        self.ctrl(self.rank).arrived.0.store(g, Ordering::Release);
        let deadline = Deadline::after(self.timeout.get());
        self.wait(&self.label("barrier", what), &deadline, self.others(), |r| {
            self.ctrl(r).arrived.0.load(Ordering::Acquire) >= g
        })
    }

    /// Every rank's blob, indexed by rank (ours included).
    pub fn all_gather(&self, what: &str, blob: &[u8]) -> Result<Vec<Vec<u8>>, IpcError> {
        let all: Vec<usize> = (0..self.world()).collect();
        self.exchange(&self.label("all_gather", what), Some(blob), &all)
    }

    /// `root`'s blob on every rank; the blobs of the other ranks are ignored.
    pub fn broadcast(&self, what: &str, root: usize, blob: &[u8]) -> Result<Vec<u8>, IpcError> {
        if root >= self.world() {
            return Err(IpcError::BadArgs(format!("broadcast root {root} >= world {}", self.world())));
        }
        let mine = (root == self.rank).then_some(blob);
        let mut got = self.exchange(&self.label("broadcast", what), mine, &[root])?;
        Ok(got.remove(0))
    }

    /// Every peer's fds, indexed by rank (our own entry is empty); every rank must pass the same number.
    pub fn all_gather_fds(&self, what: &str, fds: &[BorrowedFd<'_>]) -> Result<Vec<Vec<OwnedFd>>, IpcError> {
        if fds.len() > MAX_FDS {
            return Err(IpcError::BadArgs(format!("{} fds, at most {MAX_FDS} fit one datagram", fds.len())));
        }
        let seq = self.fd_seq.get() + 1;
        self.fd_seq.set(seq);
        let label = self.label("all_gather_fds", what);
        let mut msg = [0u8; FD_MSG_LEN];
        msg[..8].copy_from_slice(&FD_MAGIC.to_le_bytes());
        msg[8..12].copy_from_slice(&(self.rank as u32).to_le_bytes());
        msg[12..16].copy_from_slice(&(fds.len() as u32).to_le_bytes());
        msg[16..].copy_from_slice(&seq.to_le_bytes());
        let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
        let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS], UnixCredentials);
        let mut sent = vec![false; self.world()];
        sent[self.rank] = true;
        let mut failure = None;
        // A peer counts once we delivered to it and got its datagram; sends are non-blocking and retried
        // here, so full receive queues (net.unix.max_dgram_qlen) cannot deadlock two senders.
        let mut progress = |r: usize| -> Result<bool, IpcError> {
            for (p, done) in sent.iter_mut().enumerate().filter(|(_, done)| !**done) {
                *done = self.try_send(p, &msg, &raw)?;
            }
            self.drain(&mut cmsg)?;
            Ok(sent[r] && self.inbox.borrow().contains_key(&(seq, r)))
        };
        self.wait(&label, &Deadline::after(self.timeout.get()), self.others(), |r| {
            failure.is_some() || progress(r).unwrap_or_else(|e| failure.replace(e).is_none())
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        let mut inbox = self.inbox.borrow_mut();
        (0..self.world())
            .map(|r| {
                let got = inbox.remove(&(seq, r)).unwrap_or_default();
                if r != self.rank && got.len() != fds.len() {
                    return Err(IpcError::Fd(format!(
                        "{label}: rank {r} sent {} fd(s), we sent {}; every rank must pass the same number",
                        got.len(),
                        fds.len()
                    )));
                }
                Ok(got)
            })
            .collect()
    }

    /// Marks the job aborted by this rank: every peer's current or next wait fails at once with
    /// [`IpcError::Aborted`]. Only the first abort's reason is kept.
    pub fn abort(&self, reason: &str) {
        let h = self.seg.header();
        if h.abort.compare_exchange(0, ABORT_CLAIMED, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return;
        }
        let mut n = reason.len().min(REASON_BYTES);
        while !reason.is_char_boundary(n) {
            n -= 1;
        }
        for (dst, &b) in h.reason.iter().zip(&reason.as_bytes()[..n]) {
            dst.store(b, Ordering::Relaxed);
        }
        h.reason_len.store(n as u64, Ordering::Relaxed);
        h.abort.store(self.rank as u64 + 1, Ordering::Release);
    }

    /// The aborting rank and its reason, once an abort is published.
    fn aborted(&self) -> Option<(usize, String)> {
        let h = self.seg.header();
        let v = h.abort.load(Ordering::Acquire);
        if v == 0 || v == ABORT_CLAIMED {
            return None;
        }
        let n = (h.reason_len.load(Ordering::Relaxed) as usize).min(REASON_BYTES);
        let bytes: Vec<u8> = h.reason[..n].iter().map(|b| b.load(Ordering::Relaxed)).collect();
        Some((v as usize - 1, String::from_utf8_lossy(&bytes).into_owned()))
    }

    fn label(&self, op: &str, what: &str) -> String {
        format!("{op} '{what}' (rank {} of {})", self.rank, self.world())
    }

    fn others(&self) -> impl Iterator<Item = usize> {
        let me = self.rank;
        (0..self.world()).filter(move |&r| r != me)
    }

    fn ctrl(&self, rank: usize) -> &Ctrl {
        assert!(rank < self.layout.world);
        // SAFETY: the segment was checked to be `layout.len` long, the control blocks lie inside it at
        // 64-byte aligned offsets, and a Ctrl is only atomics (see `Segment::header`).
        unsafe { &*self.seg.ptr.as_ptr().cast::<u8>().add(self.layout.ctrl_off).cast::<Ctrl>().add(rank) }
    }

    /// Start of `rank`'s slot: a u64 length, then `slot_bytes` of data. Written only by `rank`, between
    /// every peer's `consumed` of the previous generation and its own `posted`; read only in between
    /// `posted` and `consumed`, so plain copies never race.
    fn slot(&self, rank: usize) -> *mut u8 {
        assert!(rank < self.layout.world);
        // SAFETY: in bounds of the mapping, checked to be `layout.len` long.
        unsafe { self.seg.ptr.as_ptr().cast::<u8>().add(self.layout.slots_off + rank * self.layout.slot_stride) }
    }

    /// Waits until `arrived` holds for all `ranks`, failing at once if any rank aborted.
    fn wait(
        &self,
        label: &str,
        deadline: &Deadline,
        ranks: impl IntoIterator<Item = usize>,
        arrived: impl FnMut(usize) -> bool,
    ) -> Result<(), IpcError> {
        let by = Cell::new(0);
        let aborted = || {
            self.aborted().map(|(rank, reason)| {
                by.set(rank);
                reason
            })
        };
        wait_all(label, ranks, deadline, arrived, aborted).map_err(|e| match e {
            WaitError::Aborted { what, reason } => IpcError::Aborted { what, rank: by.get(), reason },
            e => e.into(),
        })
    }

    /// One generation of the slot protocol: publish `mine` (if any) in our slot, then copy out the slots of
    /// `sources` (ours straight from `mine`).
    fn exchange(&self, label: &str, mine: Option<&[u8]>, sources: &[usize]) -> Result<Vec<Vec<u8>>, IpcError> {
        let max = self.layout.slot_bytes;
        if let Some(blob) = mine.filter(|b| b.len() > max) {
            return Err(IpcError::BlobTooLarge { len: blob.len(), max });
        }
        let g = self.data_gen.get() + 1;
        self.data_gen.set(g);
        let deadline = Deadline::after(self.timeout.get());
        if let Some(blob) = mine {
            self.wait(label, &deadline, self.others(), |r| self.ctrl(r).consumed.0.load(Ordering::Acquire) >= g - 1)?;
            let p = self.slot(self.rank);
            // SAFETY: our own slot, which no peer reads now (see `slot`); the blob fits (checked above).
            unsafe {
                p.cast::<u64>().write(blob.len() as u64);
                std::ptr::copy_nonoverlapping(blob.as_ptr(), p.add(8), blob.len());
            }
        }
        self.ctrl(self.rank).posted.0.store(g, Ordering::Release);
        let peers = sources.iter().copied().filter(|&r| r != self.rank);
        self.wait(label, &deadline, peers, |r| self.ctrl(r).posted.0.load(Ordering::Acquire) >= g)?;
        let out = sources
            .iter()
            .map(|&r| if r == self.rank { Ok(mine.unwrap_or_default().to_vec()) } else { self.read_slot(r) })
            .collect();
        self.ctrl(self.rank).consumed.0.store(g, Ordering::Release);
        out
    }

    fn read_slot(&self, rank: usize) -> Result<Vec<u8>, IpcError> {
        let max = self.layout.slot_bytes;
        // SAFETY: `rank` posted this generation and will not write again before we store `consumed`; its length
        // word and `slot_bytes` of data lie in the mapping.
        let slot = unsafe { std::slice::from_raw_parts(self.slot(rank), 8 + max) };
        Ok(slot_payload(&format!("{}: rank {rank}", self.seg.name), slot, max)?.to_vec())
    }

    /// Sends our datagram to `peer`; false when its receive queue is full for now.
    fn try_send(&self, peer: usize, msg: &[u8], fds: &[RawFd]) -> Result<bool, IpcError> {
        let rights = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
        let iov = [IoSlice::new(msg)];
        match sendmsg(self.sock.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), Some(&self.peers[peer])) {
            Ok(_) => Ok(true),
            Err(Errno::EAGAIN | Errno::EINTR) => Ok(false),
            Err(Errno::ECONNREFUSED) => Err(IpcError::Fd(format!("rank {peer}'s socket is gone (did it exit?)"))),
            Err(e) => Err(sys(format!("sendmsg(to rank {peer})"))(e)),
        }
    }

    /// Moves every queued datagram into the inbox, refusing any that is malformed or not from our user.
    fn drain(&self, cmsg: &mut [u8]) -> Result<(), IpcError> {
        let uid = geteuid().as_raw();
        loop {
            let mut buf = [0u8; FD_MSG_LEN];
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg = match recvmsg::<()>(self.sock.as_raw_fd(), &mut iov, Some(cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
                Ok(msg) => msg,
                Err(Errno::EAGAIN) => return Ok(()),
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(sys("recvmsg")(e)),
            };
            let (mut fds, mut sender_uid) = (Vec::new(), None);
            let cmsgs = msg.cmsgs().map_err(|_| IpcError::Fd("control data truncated".into()))?;
            for c in cmsgs {
                match c {
                    // SAFETY: the kernel just installed these fds in our table; nobody else owns them.
                    ControlMessageOwned::ScmRights(raw) => {
                        fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }))
                    }
                    ControlMessageOwned::ScmCredentials(c) => sender_uid = Some(c.uid()),
                    _ => {}
                }
            }
            let (bytes, truncated) = (msg.bytes, msg.flags.contains(MsgFlags::MSG_TRUNC));
            if sender_uid != Some(uid) {
                return Err(IpcError::Fd(format!("refused a datagram from uid {sender_uid:?}, we are uid {uid}")));
            }
            let FdHeader { sender, count, seq } =
                parse_fd_header(&buf[..bytes.min(FD_MSG_LEN)], truncated, self.world(), self.rank)?;
            if count != fds.len() {
                return Err(IpcError::Fd(format!("rank {sender} announced {count} fd(s) but {} came", fds.len())));
            }
            if self.inbox.borrow_mut().insert((seq, sender), fds).is_some() {
                return Err(IpcError::Fd(format!("rank {sender} sent call {seq} twice")));
            }
        }
    }
}

fn bind_socket(addr: &UnixAddr) -> Result<OwnedFd, IpcError> {
    let flags = SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK;
    let sock = socket(AddressFamily::Unix, SockType::Datagram, flags, None).map_err(sys("socket(AF_UNIX)"))?;
    setsockopt(&sock, sockopt::PassCred, &true).map_err(sys("setsockopt(SO_PASSCRED)"))?;
    bind(sock.as_raw_fd(), addr).map_err(sys(format!("bind({addr})")))?;
    Ok(sock)
}

/// Rank 0: creates the segment exclusively, lays out the header and publishes it with `ready`.
fn create(name: &str, layout: &Layout) -> Result<Segment, IpcError> {
    let flags = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR;
    let fd = shm_open(name, flags, Mode::S_IRUSR | Mode::S_IWUSR).map_err(|e| match e {
        Errno::EEXIST => IpcError::Exists { name: name.to_string() },
        e => sys(format!("shm_open({name}, O_CREAT|O_EXCL)"))(e),
    })?;
    let sized = ftruncate(&fd, layout.len as i64).map_err(sys(format!("ftruncate({name})")));
    let mut seg = match sized.and_then(|()| Segment::map(&fd, name, layout.len)) {
        Ok(seg) => seg,
        Err(e) => {
            let _ = shm_unlink(name);
            return Err(e);
        }
    };
    seg.owned = true;
    let h = seg.header();
    h.magic.store(MAGIC, Ordering::Relaxed);
    h.version.store(VERSION, Ordering::Relaxed);
    h.world.store(layout.world as u32, Ordering::Relaxed);
    h.slot_bytes.store(layout.slot_bytes as u64, Ordering::Relaxed);
    h.uid.store(geteuid().as_raw(), Ordering::Relaxed);
    h.pid.store(getpid().as_raw() as u32, Ordering::Relaxed);
    h.ready.store(READY, Ordering::Release);
    Ok(seg)
}

/// The header's identity fields (relaxed loads, after `ready` was seen with acquire) as [`validate_header`] reads them.
fn header_fields(h: &Header) -> [u8; HEADER_FIELDS_LEN] {
    let mut out = [0u8; HEADER_FIELDS_LEN];
    out[0..8].copy_from_slice(&h.magic.load(Ordering::Relaxed).to_ne_bytes());
    out[8..12].copy_from_slice(&h.version.load(Ordering::Relaxed).to_ne_bytes());
    out[12..16].copy_from_slice(&h.world.load(Ordering::Relaxed).to_ne_bytes());
    out[16..24].copy_from_slice(&h.slot_bytes.load(Ordering::Relaxed).to_ne_bytes());
    out[24..28].copy_from_slice(&h.uid.load(Ordering::Relaxed).to_ne_bytes());
    out[28..32].copy_from_slice(&h.pid.load(Ordering::Relaxed).to_ne_bytes());
    out[32..40].copy_from_slice(&h.ready.load(Ordering::Relaxed).to_ne_bytes());
    out
}
const _: () = assert!(std::mem::offset_of!(Header, ready) + 8 == HEADER_FIELDS_LEN);

/// Ranks > 0: opens the segment rank 0 creates, checks that it is ours and matches our layout.
fn attach(name: &str, layout: &Layout, label: &str, deadline: &Deadline) -> Result<Segment, IpcError> {
    let fd = retry(&format!("{label}: rank 0 never created {name}"), 0, deadline, || {
        match shm_open(name, OFlag::O_RDWR, Mode::empty()) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(sys(format!("shm_open({name})"))(e)),
        }
    })?;
    let stat = |fd: &OwnedFd| fstat(fd).map_err(sys(format!("fstat({name})")));
    let check_owner = |st: &FileStat| {
        let uid = geteuid().as_raw();
        if st.st_uid != uid {
            return Err(IpcError::BadSegment(format!("{name}: owner is uid {}, we are uid {uid}", st.st_uid)));
        }
        if st.st_mode & 0o077 != 0 {
            return Err(IpcError::BadSegment(format!(
                "{name}: mode {:o} gives group/other access",
                st.st_mode & 0o777
            )));
        }
        Ok(())
    };
    check_owner(&stat(&fd)?)?;
    // Rank 0 sizes the segment right after creating it; until then it is empty.
    let size = retry(&format!("{label}: rank 0 never sized {name}"), 0, deadline, || {
        Ok(Some(stat(&fd)?.st_size as usize).filter(|&s| s > 0))
    })?;
    if size < size_of::<Header>() {
        return Err(IpcError::BadSegment(format!("{name}: size is {size} bytes, smaller than a header")));
    }
    let mut seg = Segment::map(&fd, name, size)?;
    let h = seg.header();
    retry(&format!("{label}: rank 0 never initialized {name}"), 0, deadline, || {
        Ok((h.ready.load(Ordering::Acquire) == READY).then_some(()))
    })?;
    let expected = ExpectedHeader { world: layout.world, slot_bytes: layout.slot_bytes, uid: geteuid().as_raw() };
    validate_header(name, &header_fields(h), size, &expected)?;
    seg.owned = true;
    Ok(seg)
}

#[cfg(test)]
mod tests;
