//! The rendezvous' wire formats, checked without trusting the bytes: the segment header, a slot's payload and an fd
//! datagram's header (what the fuzz targets feed).

use crate::{IpcError, Layout, FD_MAGIC, FD_MSG_LEN, MAGIC, READY, VERSION};
use std::fmt;

fn mismatch<T: PartialEq + fmt::Display>(name: &str, field: &str, found: T, want: T) -> Result<(), IpcError> {
    if found == want {
        Ok(())
    } else {
        Err(IpcError::BadSegment(format!("{name}: {field} is {found}, expected {want}")))
    }
}

/// Bytes of the header's identity fields as [`validate_header`] reads them: magic (u64), version, world (u32
/// each), slot bytes (u64), creator uid, creator pid (u32 each), ready (u64), native-endian at the segment's offsets.
pub const HEADER_FIELDS_LEN: usize = 40;

/// What a rank that attaches expects of the segment rank 0 created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectedHeader {
    pub world: usize,
    pub slot_bytes: usize,
    /// Our effective uid: the creator must be us.
    pub uid: u32,
}

/// What a valid header says beyond what was expected of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderInfo {
    pub world: usize,
    pub slot_bytes: usize,
    pub uid: u32,
    pub pid: u32,
    /// Bytes of the segment laid out for that world and slot size.
    pub len: usize,
}

/// Bytes of the segment laid out for `world` ranks with slots of `slot_bytes`.
pub fn segment_len(world: usize, slot_bytes: usize) -> Result<usize, IpcError> {
    Layout::new(world, slot_bytes).map(|l| l.len)
}

/// Checks another process's segment header: `bytes` are its [`HEADER_FIELDS_LEN`] field bytes (more are ignored),
/// `segment_len` the segment's size. Refuses a short or unpublished header, a wrong magic, version, world, slot
/// size or creator, and a size other than the layout's, in that order; `name` prefixes the error.
pub fn validate_header(
    name: &str,
    bytes: &[u8],
    segment_len: usize,
    expected: &ExpectedHeader,
) -> Result<HeaderInfo, IpcError> {
    let Some(bytes) = bytes.get(..HEADER_FIELDS_LEN) else {
        return Err(IpcError::BadSegment(format!("{name}: header of {} bytes is truncated", bytes.len())));
    };
    let u64_at = |at: usize| u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let u32_at = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    if u64_at(32) != READY {
        return Err(IpcError::BadSegment(format!("{name}: header not published (ready is {:#x})", u64_at(32))));
    }
    let layout = Layout::new(expected.world, expected.slot_bytes)?;
    mismatch(name, "magic", format!("{:#x}", u64_at(0)), format!("{MAGIC:#x}"))?;
    mismatch(name, "version", u32_at(8), VERSION)?;
    mismatch(name, "world", u32_at(12) as usize, layout.world)?;
    mismatch(name, "slot_bytes", u64_at(16) as usize, layout.slot_bytes)?;
    mismatch(name, "creator uid", u32_at(24), expected.uid)?;
    mismatch(name, "size", segment_len, layout.len)?;
    Ok(HeaderInfo {
        world: layout.world,
        slot_bytes: layout.slot_bytes,
        uid: expected.uid,
        pid: u32_at(28),
        len: layout.len,
    })
}

/// The payload of a peer's slot: `slot` is its u64 length word (native-endian) and then the data. Refuses a
/// length larger than `slot_bytes` (what the segment lays out) or than the bytes at hand; `who` prefixes the error.
pub fn slot_payload<'a>(who: &str, slot: &'a [u8], slot_bytes: usize) -> Result<&'a [u8], IpcError> {
    let Some((word, data)) = slot.split_first_chunk::<8>() else {
        return Err(IpcError::BadSegment(format!("{who}: slot of {} bytes lacks its length word", slot.len())));
    };
    let len = u64::from_ne_bytes(*word) as usize;
    if len > slot_bytes {
        return Err(IpcError::BadSegment(format!("{who} posted {len} bytes")));
    }
    data.get(..len).ok_or_else(|| IpcError::BadSegment(format!("{who} posted {len} bytes, {} at hand", data.len())))
}

/// The header of an fd-passing datagram, once [`parse_fd_header`] accepted it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdHeader {
    pub sender: usize,
    /// How many fds the sender says ride along (checked against those that came by the caller).
    pub count: usize,
    /// The sender's call sequence number.
    pub seq: u64,
}

/// Parses the datagram `received` (the bytes recvmsg returned, at most [`FD_MSG_LEN`]; `truncated` if the kernel
/// cut it) that rank `me` of `world` got: little-endian magic, sender rank, fd count, sequence number. Refuses a
/// wrong length, a cut datagram, a wrong magic, a sender outside the world and ourselves.
pub fn parse_fd_header(received: &[u8], truncated: bool, world: usize, me: usize) -> Result<FdHeader, IpcError> {
    let mut buf = [0u8; FD_MSG_LEN];
    let bytes = received.len();
    buf[..bytes.min(FD_MSG_LEN)].copy_from_slice(&received[..bytes.min(FD_MSG_LEN)]);
    let word = |at: usize, n: usize| buf[at..at + n].iter().rev().fold(0u64, |a, &b| a << 8 | b as u64);
    let (magic, sender, count, seq) = (word(0, 8), word(8, 4) as usize, word(12, 4) as usize, word(16, 8));
    if bytes != FD_MSG_LEN || truncated || magic != FD_MAGIC || sender >= world || sender == me {
        return Err(IpcError::Fd(format!("malformed datagram ({bytes} bytes, sender {sender})")));
    }
    Ok(FdHeader { sender, count, seq })
}
