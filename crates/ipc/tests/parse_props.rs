//! The stable-toolchain twin of `fuzz/`: random and mutated bytes into every parser of another process's bytes
//! (rendezvous header, slot length, fd datagram header), 100k inputs each; none may panic, and each may accept only
//! what is well formed (checked against an independent oracle).

use ipc::{parse_fd_header, segment_len, slot_payload, validate_header, ExpectedHeader, FD_MSG_LEN, HEADER_FIELDS_LEN};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const ITERS: usize = 100_000;
const MAGIC: u64 = u64::from_be_bytes(*b"ARXRDV\0\0");
const READY: u64 = u64::from_be_bytes(*b"ARXREADY");
const FD_MAGIC: u64 = u64::from_be_bytes(*b"ARXFDS\0\0");

/// Flips a few random bytes (or none), so inputs stay near the valid one and reach the later checks.
fn mutate(rng: &mut StdRng, bytes: &mut Vec<u8>) {
    for _ in 0..rng.random_range(0..3) {
        if !bytes.is_empty() && rng.random_bool(0.8) {
            let i = rng.random_range(0..bytes.len());
            bytes[i] = rng.random();
        } else if rng.random_bool(0.5) {
            bytes.truncate(rng.random_range(0..=bytes.len()));
        } else {
            bytes.push(rng.random());
        }
    }
}

fn header_bytes(world: u32, slot_bytes: u64, uid: u32, pid: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER_FIELDS_LEN);
    b.extend(MAGIC.to_ne_bytes());
    b.extend(1u32.to_ne_bytes());
    b.extend(world.to_ne_bytes());
    b.extend(slot_bytes.to_ne_bytes());
    b.extend(uid.to_ne_bytes());
    b.extend(pid.to_ne_bytes());
    b.extend(READY.to_ne_bytes());
    b
}

fn world_of(b: &[u8]) -> usize {
    u32::from_ne_bytes(b[12..16].try_into().unwrap()) as usize
}

fn slot_of(b: &[u8]) -> usize {
    u64::from_ne_bytes(b[16..24].try_into().unwrap()) as usize
}

#[test]
fn rendezvous_header_accepts_only_well_formed() {
    let mut rng = StdRng::seed_from_u64(1);
    let mut accepted = 0;
    for i in 0..ITERS {
        let (world, slot_bytes, uid) =
            (rng.random_range(1..=8u32), rng.random_range(0..=8192u64), rng.random_range(0..3u32));
        let mut bytes = if i % 4 == 0 {
            (0..rng.random_range(0..64)).map(|_| rng.random()).collect()
        } else {
            header_bytes(world, slot_bytes, uid, rng.random())
        };
        mutate(&mut rng, &mut bytes);
        let expected = if rng.random_bool(0.7) {
            ExpectedHeader { world: world as usize, slot_bytes: slot_bytes as usize, uid }
        } else {
            ExpectedHeader {
                world: rng.random_range(0..10),
                slot_bytes: rng.random_range(0..8192),
                uid: rng.random_range(0..3),
            }
        };
        // The segment's size: mostly the layout's, sometimes random.
        let layout_len = segment_len(expected.world, expected.slot_bytes).ok();
        let seg_len = match layout_len {
            Some(n) if rng.random_bool(0.8) => n,
            _ => rng.random_range(0..1 << 20),
        };
        let got = validate_header("x", &bytes, seg_len, &expected);
        let well_formed = bytes.len() >= HEADER_FIELDS_LEN
            && bytes[..HEADER_FIELDS_LEN]
                == header_bytes(
                    expected.world as u32,
                    expected.slot_bytes as u64,
                    expected.uid,
                    u32::from_ne_bytes(bytes[28..32].try_into().unwrap()),
                )[..]
            && layout_len == Some(seg_len);
        match got {
            Ok(info) => {
                assert!(well_formed, "accepted {bytes:?} for {expected:?} at {seg_len} bytes");
                assert_eq!(
                    (info.world, info.slot_bytes, info.uid, info.len),
                    (world_of(&bytes), slot_of(&bytes), expected.uid, seg_len)
                );
                accepted += 1;
            }
            Err(_) => assert!(!well_formed, "refused a well-formed header: {bytes:?} {expected:?} {seg_len}"),
        }
    }
    assert!(accepted > ITERS / 20, "too few inputs reached acceptance: {accepted}");
}

#[test]
fn slot_length_larger_than_the_slot_is_refused() {
    let mut rng = StdRng::seed_from_u64(2);
    let mut accepted = 0;
    for i in 0..ITERS {
        let slot_bytes = rng.random_range(0..256usize);
        let mut slot: Vec<u8> = if i % 4 == 0 {
            (0..rng.random_range(0..300)).map(|_| rng.random()).collect()
        } else {
            let len = rng.random_range(0..=slot_bytes + 2) as u64;
            let mut s = len.to_ne_bytes().to_vec();
            s.extend((0..slot_bytes).map(|_| rng.random::<u8>()));
            s
        };
        mutate(&mut rng, &mut slot);
        let oracle = (slot.len() >= 8)
            .then(|| u64::from_ne_bytes(slot[..8].try_into().unwrap()))
            .filter(|&n| n <= slot_bytes as u64 && n <= (slot.len() - 8) as u64);
        match (slot_payload("x", &slot, slot_bytes), oracle) {
            (Ok(p), Some(n)) => {
                assert_eq!(p, &slot[8..8 + n as usize]);
                accepted += 1;
            }
            (Err(_), None) => {}
            (got, want) => panic!("slot {slot:?} of {slot_bytes}: got {got:?}, oracle {want:?}"),
        }
    }
    assert!(accepted > ITERS / 4, "too few inputs reached acceptance: {accepted}");
}

#[test]
fn fd_datagram_header_accepts_only_well_formed() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut accepted = 0;
    for i in 0..ITERS {
        let world = rng.random_range(1..=8usize);
        let me = rng.random_range(0..world);
        let mut msg: Vec<u8> = if i % 4 == 0 {
            (0..rng.random_range(0..40)).map(|_| rng.random()).collect()
        } else {
            let mut m = FD_MAGIC.to_le_bytes().to_vec();
            m.extend((rng.random_range(0..world + 1) as u32).to_le_bytes());
            m.extend(rng.random::<u32>().to_le_bytes());
            m.extend(rng.random::<u64>().to_le_bytes());
            m
        };
        mutate(&mut rng, &mut msg);
        let truncated = rng.random_bool(0.1);
        let le32 = |at: usize| u32::from_le_bytes(msg[at..at + 4].try_into().unwrap()) as usize;
        let well_formed = msg.len() == FD_MSG_LEN
            && !truncated
            && msg[..8] == FD_MAGIC.to_le_bytes()
            && le32(8) < world
            && le32(8) != me;
        match parse_fd_header(&msg, truncated, world, me) {
            Ok(h) => {
                assert!(well_formed, "accepted {msg:?} (world {world}, me {me}, truncated {truncated})");
                assert_eq!((h.sender, h.count), (le32(8), le32(12)));
                assert_eq!(h.seq, u64::from_le_bytes(msg[16..24].try_into().unwrap()));
                accepted += 1;
            }
            Err(_) => assert!(!well_formed, "refused {msg:?} (world {world}, me {me})"),
        }
    }
    assert!(accepted > ITERS / 20, "too few inputs reached acceptance: {accepted}");
}
