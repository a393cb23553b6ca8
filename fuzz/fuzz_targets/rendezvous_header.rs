//! `ipc::validate_header` on arbitrary header bytes and expectations: it must never panic, and whatever it
//! accepts must be a published header of the right magic, version, world, slot size, creator and segment size.
#![no_main]

use ipc::{validate_header, ExpectedHeader, HEADER_FIELDS_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((head, header)) = data.split_first_chunk::<17>() else { return };
    let world = 1 + head[0] as usize % 16;
    let slot_bytes = u32::from_le_bytes(head[1..5].try_into().unwrap()) as usize % (1 << 21);
    let uid = u32::from_le_bytes(head[5..9].try_into().unwrap());
    let segment_len = u64::from_le_bytes(head[9..17].try_into().unwrap()) as usize;
    let expected = ExpectedHeader { world, slot_bytes, uid };
    if let Ok(info) = validate_header("fuzz", header, segment_len, &expected) {
        let u64_at = |at: usize| u64::from_ne_bytes(header[at..at + 8].try_into().unwrap());
        let u32_at = |at: usize| u32::from_ne_bytes(header[at..at + 4].try_into().unwrap());
        assert!(header.len() >= HEADER_FIELDS_LEN);
        assert_eq!(u64_at(0), u64::from_be_bytes(*b"ARXRDV\0\0"));
        assert_eq!(u32_at(8), 1);
        assert_eq!(u32_at(12) as usize, world);
        assert_eq!(u64_at(16) as usize, slot_bytes);
        assert_eq!(u32_at(24), uid);
        assert_eq!(u64_at(32), u64::from_be_bytes(*b"ARXREADY"));
        assert_eq!((info.world, info.slot_bytes, info.uid, info.len), (world, slot_bytes, uid, segment_len));
    }
});
