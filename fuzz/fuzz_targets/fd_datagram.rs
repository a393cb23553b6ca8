//! `ipc::parse_fd_header` on an arbitrary datagram, world and receiving rank: it must never panic, and a header it
//! accepts is a whole, uncut 24-byte datagram with the magic, from a peer inside the world other than us.
#![no_main]

use ipc::{parse_fd_header, FD_MSG_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((head, msg)) = data.split_first_chunk::<3>() else { return };
    let world = 1 + head[0] as usize % 16;
    let me = head[1] as usize % world;
    let truncated = head[2] & 1 == 1;
    if let Ok(h) = parse_fd_header(msg, truncated, world, me) {
        assert!(!truncated && msg.len() == FD_MSG_LEN);
        assert_eq!(msg[..8], u64::from_be_bytes(*b"ARXFDS\0\0").to_le_bytes());
        assert!(h.sender < world && h.sender != me);
        assert_eq!(h.sender as u32, u32::from_le_bytes(msg[8..12].try_into().unwrap()));
        assert_eq!(h.count as u32, u32::from_le_bytes(msg[12..16].try_into().unwrap()));
        assert_eq!(h.seq, u64::from_le_bytes(msg[16..24].try_into().unwrap()));
    }
});
