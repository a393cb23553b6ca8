//! `ipc::slot_payload` on an arbitrary slot (length word + data) and slot size: it must never panic, and a payload
//! it hands out is exactly the announced length, within the slot size and within the bytes at hand.
#![no_main]

use ipc::slot_payload;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((head, slot)) = data.split_first_chunk::<4>() else { return };
    let slot_bytes = u32::from_le_bytes(*head) as usize % (1 << 16);
    if let Ok(payload) = slot_payload("fuzz", slot, slot_bytes) {
        let len = u64::from_ne_bytes(slot[..8].try_into().unwrap());
        assert_eq!(payload.len() as u64, len);
        assert!(payload.len() <= slot_bytes && payload.len() + 8 <= slot.len());
        assert_eq!(payload, &slot[8..8 + payload.len()]);
    }
});
