//! Caller memory shared with every peer: explicit registrations ([`Communicator::register`]) and the buffers of a
//! graph capture, registered in one collective step when the capture ends ([`Communicator::end_graph_capture`]).
//! Both go through one exchange: each rank exports its ranges, every rank learns every range as a typed, versioned
//! message, checks that they describe the same calls, and maps what its peers exported.

use super::Communicator;
use crate::Error;
use collective_core::MAX_RANKS;
use gpu::{DeviceBuffer, DevicePtr, MemKind, ShareHandle, SharedRange};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Weak};
use symm::tuned::{DeferredUse, PeerView, PEER_TABLE_BYTES};

/// Caller memory every peer has mapped, for calls whose input or output lies in it.
pub(super) struct Registration {
    pub(super) id: usize,
    /// This rank's range.
    pub(super) ptr: DevicePtr,
    pub(super) bytes: usize,
    /// Every rank's address of its own range, as mapped here.
    pub(super) peers: [u64; MAX_RANKS],
    _mapped: Vec<Arc<DeviceBuffer>>,
}

/// Peers' allocations mapped here, by (rank, IPC handle): a driver maps one allocation once per context, and
/// several registrations (slices of one caching-allocator segment) share it.
#[derive(Default)]
pub(super) struct Imports(HashMap<(usize, Vec<u8>), Weak<DeviceBuffer>>);

/// Peer tables a capture's calls read their peers' buffers from: allocated before a capture begins (allocation is
/// not allowed while a stream captures), filled when it ends, kept while the communicator lives.
#[derive(Default)]
pub(super) struct PeerTables {
    chunks: Vec<DeviceBuffer>,
    /// Slots handed out so far, over all chunks.
    used: usize,
}

/// Slots per chunk of peer tables: calls one capture may defer before the rest fall back to copies.
pub const CAPTURE_SLOTS: usize = 1024;

impl PeerTables {
    fn capacity(&self) -> usize {
        self.chunks.len() * CAPTURE_SLOTS
    }

    /// The next free slot (its index and address), if any is left.
    pub(super) fn take(&mut self) -> Option<(usize, DevicePtr)> {
        if self.used == self.capacity() {
            return None;
        }
        let (chunk, offset) = self.place(self.used);
        let at = (self.used, chunk.ptr().offset(offset));
        self.used += 1;
        Some(at)
    }

    /// Slot `index`'s chunk and byte offset in it.
    fn place(&self, index: usize) -> (&DeviceBuffer, usize) {
        (&self.chunks[index / CAPTURE_SLOTS], (index % CAPTURE_SLOTS) * PEER_TABLE_BYTES)
    }
}

/// A call captured with deferred peer views.
pub(super) struct DeferredCall {
    /// The index of its peer table.
    pub(super) slot: usize,
    pub(super) bytes: usize,
    pub(super) used: DeferredUse,
    /// This rank's exports of the call's input and output (when peers use them), taken while the capture ran.
    pub(super) input: Option<SharedRange>,
    pub(super) output: Option<SharedRange>,
}

/// A graph capture in progress ([`Communicator::begin_graph_capture`]).
#[derive(Default)]
pub(super) struct Capture {
    pub(super) calls: Vec<DeferredCall>,
    /// Calls that kept a copy: of what, and why (memory a driver cannot share, slots used up).
    pub(super) fallbacks: Vec<(&'static str, String)>,
}

/// The exchange's message format; a rank that speaks another is named rather than misread.
const SHARE_VERSION: u32 = 1;

/// One range of a rank's, as its peers learn it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum RangeMsg {
    /// Use this rank's registered buffer (a deferred call that copies through it).
    Registered,
    /// This rank could not export the range (the reason).
    Refused(String),
    Ipc {
        handle: Vec<u8>,
        alloc_bytes: usize,
        offset: usize,
    },
    /// A VMM allocation, whose fd is the `fd`-th this rank passes.
    Vmm {
        fd: usize,
        alloc_bytes: usize,
        offset: usize,
    },
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct ShareMsg {
    version: u32,
    /// Per range: its bytes and where it is.
    ranges: Vec<(usize, RangeMsg)>,
}

/// Per range offered, every rank's address of it as mapped here; and the mappings, to keep alive.
type Exchanged = (Vec<[u64; MAX_RANKS]>, Vec<Arc<DeviceBuffer>>);

/// Which registered buffer a [`RangeMsg::Registered`] range stands for.
#[derive(Clone, Copy)]
enum Kind {
    Input,
    Output,
}

/// One range this rank offers: bytes, its own address, and its export.
struct Offer {
    bytes: usize,
    own: DevicePtr,
    kind: Kind,
    share: Result<Option<SharedRange>, String>,
}

impl Communicator {
    /// Registers `bytes` of the caller's device memory at `ptr` with every peer, so calls whose input (or output)
    /// lies in it read (or write) it in place on every rank, as zero-copy designs need. The allocation that holds
    /// the range is exported (its IPC handle, or the shareable handle of a VMM allocation) with the range's
    /// offset, and mapped by every peer. Collective: every rank registers a range of the same size, in the same
    /// order. Returns the registration's id, for [`Communicator::release`].
    ///
    /// # Safety
    /// The range is device memory of this communicator's device that stays allocated while the registration
    /// lives: peers keep it mapped and write into it during calls that name it.
    pub unsafe fn register(&mut self, ptr: DevicePtr, bytes: usize) -> Result<usize, Error> {
        let name = format!("registration {}", self.next_registration);
        let share = self.gpu.share_range(ptr, bytes).map(Some).map_err(|e| e.to_string());
        let offers = [Offer { bytes, own: ptr, kind: Kind::Input, share }];
        let (peers, mapped) = self.exchange(&name, offers)?;
        let id = self.next_registration;
        self.next_registration += 1;
        self.registrations.push(Registration { id, ptr, bytes, peers: peers[0], _mapped: mapped });
        Ok(id)
    }

    /// Ends registration `id` ([`Communicator::register`]'s): the peers unmap it once every rank has come this
    /// far. Collective: every rank releases the same registrations in the same order.
    ///
    /// # Safety
    /// No call on the registration's memory is in flight on any stream, and no captured graph that will be replayed
    /// again reads it in place.
    pub unsafe fn release(&mut self, id: usize) -> Result<(), Error> {
        let at = self.registrations.iter().position(|r| r.id == id);
        let verdict = self.rdv.all_gather(&format!("release {id}"), &[at.is_some() as u8])?;
        if let Some(r) = verdict.iter().position(|v| v[..] != [1]) {
            return Err(Error::Mismatch(format!("release of registration {id}: rank {r} has no such registration")));
        }
        self.own.sync()?;
        self.rdv.barrier(&format!("release {id}"))?;
        self.registrations.remove(at.expect("checked on every rank"));
        Ok(())
    }

    /// Begins recording a graph capture on the caller's buffers (vLLM's graph-buffer registration): until
    /// [`Communicator::end_graph_capture`], an allreduce issued on a capturing stream whose buffers lie in no
    /// registration is captured zero-copy, reading every rank's buffers from a peer table that the end fills in.
    /// Memory a driver cannot share keeps its copy through the registered buffer, and [`Communicator::notes`] says
    /// so. Collective; call it before the stream begins capturing (it allocates).
    pub fn begin_graph_capture(&mut self) -> Result<(), Error> {
        if self.state.get_mut().capture.is_some() {
            return Err(Error::BadArgs("begin_graph_capture: a capture is already being recorded".into()));
        }
        let tables = &mut self.state.get_mut().peer_tables;
        if tables.capacity() - tables.used < CAPTURE_SLOTS {
            let chunk = self.gpu.alloc(CAPTURE_SLOTS * PEER_TABLE_BYTES, MemKind::Device)?;
            // Until the capture ends, every slot names the registered buffers: live memory whatever runs.
            let (inputs, outputs) = self.engine.symm().registered_views();
            let slot: Vec<u8> = inputs.iter().chain(&outputs).flat_map(|a| a.to_le_bytes()).collect();
            self.own.upload(&chunk, 0, &slot.repeat(CAPTURE_SLOTS))?;
            self.own.sync()?;
            tables.chunks.push(chunk);
        }
        self.rdv.barrier("begin graph capture")?;
        self.state.get_mut().capture = Some(Capture::default());
        Ok(())
    }

    /// Whether a graph capture is being recorded (between begin_graph_capture and end_graph_capture).
    pub fn recording_graph_capture(&self) -> bool {
        self.state.borrow().capture.is_some()
    }

    /// Ends the recording begun by [`Communicator::begin_graph_capture`], once the caller's capture has ended:
    /// every rank exports the buffers of its deferred calls, maps its peers', and fills each call's peer table,
    /// so every replay reads and writes the program's own tensors in place. Ranks that captured different calls
    /// fail here, on every rank, before any replay. Returns how many calls were registered. Collective.
    ///
    /// # Safety
    /// The buffers of the captured calls stay allocated while the communicator lives (peers keep them mapped and
    /// replays write into them); no replay of the graph runs before this returns.
    pub unsafe fn end_graph_capture(&mut self) -> Result<usize, Error> {
        let capture = self
            .state
            .get_mut()
            .capture
            .take()
            .ok_or_else(|| Error::BadArgs("end_graph_capture without begin_graph_capture".into()))?;
        // One note per kind of copy kept, with its count and the first reason.
        for what in ["input", "output", "input and output"] {
            let why: Vec<&String> = capture.fallbacks.iter().filter(|f| f.0 == what).map(|f| &f.1).collect();
            if let Some(first) = why.first() {
                let n = why.len();
                self.notes.push(format!(
                    "graph capture: {n} call(s) copy their {what} through the registered buffers; the first: {first}"
                ));
            }
        }
        let mut offers = Vec::new();
        let mut slots = Vec::new();
        let calls = capture.calls.len();
        for call in capture.calls {
            let offer = |view: PeerView, range: Option<SharedRange>, own, kind| {
                let share = match view {
                    PeerView::Caller(_) => range.map(Some).ok_or_else(|| "the capture exported nothing".to_string()),
                    PeerView::Registered => Ok(None),
                };
                Offer { bytes: call.bytes, own, kind, share }
            };
            offers.push(offer(call.used.input, call.input, call.used.own_input, Kind::Input));
            let output = call.used.output.unwrap_or(PeerView::Registered);
            offers.push(offer(output, call.output, call.used.own_output, Kind::Output));
            slots.push(call.slot);
        }
        let (peers, mapped) = self.exchange("graph capture", offers)?;
        for (k, &slot) in slots.iter().enumerate() {
            let table: Vec<u8> = peers[2 * k].iter().chain(&peers[2 * k + 1]).flat_map(|a| a.to_le_bytes()).collect();
            let (chunk, offset) = self.state.get_mut().peer_tables.place(slot);
            self.own.upload(chunk, offset, &table)?;
        }
        self.own.sync()?;
        // Kept for as long as the communicator: the graph may be replayed at any time.
        self.capture_mappings.extend(mapped);
        self.rdv.barrier("graph capture registered")?;
        Ok(calls)
    }

    /// Exports, exchanges and maps `offers` (the same number, of the same sizes, on every rank): per offer, every
    /// rank's address of its range as mapped here, and the mappings to keep alive.
    fn exchange(&mut self, name: &str, offers: impl IntoIterator<Item = Offer>) -> Result<Exchanged, Error> {
        let offers: Vec<Offer> = offers.into_iter().collect();
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut ranges = Vec::new();
        for o in &offers {
            let msg = match &o.share {
                Err(e) => RangeMsg::Refused(e.clone()),
                Ok(None) => RangeMsg::Registered,
                Ok(Some(r)) => match &r.handle {
                    ShareHandle::Ipc(h) => {
                        RangeMsg::Ipc { handle: h.clone(), alloc_bytes: r.alloc_bytes, offset: r.offset }
                    }
                    ShareHandle::Vmm(fd) => {
                        fds.push(fd.try_clone().map_err(|e| Error::Unsupported(format!("{name}: dup: {e}")))?);
                        RangeMsg::Vmm { fd: fds.len() - 1, alloc_bytes: r.alloc_bytes, offset: r.offset }
                    }
                },
            };
            ranges.push((o.bytes, msg));
        }
        let mine = ShareMsg { version: SHARE_VERSION, ranges };
        let all = self.rdv.all_gather(&format!("{name} ranges"), &serde_json::to_vec(&mine).expect("serialises"))?;
        let msgs = decode_all(name, &all, &mine)?;
        let counts: Vec<usize> =
            msgs.iter().map(|m| m.ranges.iter().filter(|r| matches!(r.1, RangeMsg::Vmm { .. })).count()).collect();
        let mut peer_fds = self.all_gather_fds_padded(name, fds, &counts)?;
        let (inputs, outputs) = self.engine.symm().registered_views();
        let me = self.rank();
        let mut out = Vec::new();
        let mut mapped = Vec::new();
        for (k, offer) in offers.iter().enumerate() {
            let mut peers = [0u64; MAX_RANKS];
            for (r, m) in msgs.iter().enumerate() {
                peers[r] = if r == me {
                    offer.own.0
                } else {
                    match &m.ranges[k].1 {
                        RangeMsg::Registered => match offer.kind {
                            Kind::Input => inputs[r],
                            Kind::Output => outputs[r],
                        },
                        RangeMsg::Refused(e) => unreachable!("refused ranges fail decode_all: {e}"),
                        RangeMsg::Ipc { handle, alloc_bytes, offset } => {
                            let buf = self.import_ipc(r, handle, *alloc_bytes)?;
                            let at = buf.ptr().0 + *offset as u64;
                            mapped.push(buf);
                            at
                        }
                        RangeMsg::Vmm { fd, alloc_bytes, offset } => {
                            let fd = peer_fds[r][*fd].take().expect("each fd is used once");
                            let buf = Arc::new(self.gpu.vmm_import_fd(fd, *alloc_bytes)?);
                            let at = buf.ptr().0 + *offset as u64;
                            mapped.push(buf);
                            at
                        }
                    }
                };
            }
            out.push(peers);
        }
        self.rdv.barrier(&format!("{name} mapped"))?;
        Ok((out, mapped))
    }

    /// A peer's IPC allocation, mapped once however many ranges name it.
    fn import_ipc(&mut self, rank: usize, handle: &[u8], bytes: usize) -> Result<Arc<DeviceBuffer>, Error> {
        let key = (rank, handle.to_vec());
        if let Some(buf) = self.imports.0.get(&key).and_then(Weak::upgrade) {
            return Ok(buf);
        }
        let buf = Arc::new(self.gpu.ipc_import(handle, bytes)?);
        self.imports.0.retain(|_, w| w.strong_count() > 0);
        self.imports.0.insert(key, Arc::downgrade(&buf));
        Ok(buf)
    }

    /// Every peer's fds when ranks pass different numbers (`counts`, by rank): rounds of at most `MAX_FDS`, each
    /// rank padding its round with /dev/null, which the receivers drop.
    fn all_gather_fds_padded(
        &self,
        name: &str,
        fds: Vec<OwnedFd>,
        counts: &[usize],
    ) -> Result<Vec<Vec<Option<OwnedFd>>>, Error> {
        let most = counts.iter().copied().max().unwrap_or(0);
        let mut got: Vec<Vec<Option<OwnedFd>>> = counts.iter().map(|_| Vec::new()).collect();
        let null = std::fs::File::open("/dev/null").map_err(|e| Error::Unsupported(format!("/dev/null: {e}")))?;
        for (round, lo) in (0..most).step_by(ipc::MAX_FDS).enumerate() {
            let hi = (lo + ipc::MAX_FDS).min(most);
            let mine: Vec<_> = (lo..hi).map(|i| fds.get(i).map_or_else(|| null.as_fd(), |f| f.as_fd())).collect();
            let all = self.rdv.all_gather_fds(&format!("{name} fds {round}"), &mine)?;
            for (r, fds) in all.into_iter().enumerate() {
                let real = counts[r].saturating_sub(lo);
                got[r].extend(fds.into_iter().enumerate().map(|(i, fd)| (i < real).then_some(fd)));
            }
        }
        Ok(got)
    }
}

/// Every rank's message, checked: our version, no refusal, and the same ranges (count and sizes) as ours.
fn decode_all(name: &str, all: &[Vec<u8>], mine: &ShareMsg) -> Result<Vec<ShareMsg>, Error> {
    let mut msgs = Vec::new();
    for (r, blob) in all.iter().enumerate() {
        let m: ShareMsg = serde_json::from_slice(blob)
            .map_err(|e| Error::Mismatch(format!("{name}: rank {r} sent an unreadable message ({e})")))?;
        if m.version != SHARE_VERSION {
            return Err(Error::Mismatch(format!(
                "{name}: rank {r} speaks version {} of the exchange, this rank {SHARE_VERSION}",
                m.version
            )));
        }
        if let Some((_, RangeMsg::Refused(e))) = m.ranges.iter().find(|x| matches!(x.1, RangeMsg::Refused(_))) {
            return Err(Error::Unsupported(format!("{name}: rank {r} cannot share its buffer: {e}")));
        }
        let sizes = |m: &ShareMsg| m.ranges.iter().map(|x| x.0).collect::<Vec<_>>();
        if sizes(&m) != sizes(mine) {
            return Err(Error::Mismatch(format!(
                "{name}: rank {r} has {} ranges of {:?} bytes, this rank {} of {:?} (ranks made different calls)",
                m.ranges.len(),
                sizes(&m),
                mine.ranges.len(),
                sizes(mine)
            )));
        }
        msgs.push(m);
    }
    Ok(msgs)
}
