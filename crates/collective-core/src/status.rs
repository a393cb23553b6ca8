//! The status words a kernel's failed wait leaves (`record_failure` in `kernels/include/arx/sync.h`): `[abort,
//! recorded, peer, what, waited, seen word, where, wanted word]`, `what` an `ARX_WAIT_*` kind and its detail, `waited`
//! how long the wait lasted by the device's clock; read by the communicator's watchdog, and by `cargo xtask
//! kernel-check`'s run of the device barrier on the host.

use crate::flag_tags::flag_kernel;
use gpu::{DeviceBuffer, DriverKind, Stream};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of a communicator's status words: u64 [abort, failed (1; 2 while a kernel writes the record), the rank waited
/// for, what was waited for, how long (ns), the word it last saw, where, the word it waited for]
/// (`kernels/include/arx/sync.h`).
pub const STATUS_BYTES: usize = 64;

/// The status words `status` (of [`STATUS_BYTES`]) hold now: read through `stream` (or a stream of their own, so
/// that the read does not wait behind the kernels that may write them); on the host driver, from memory.
pub fn read_words(status: &DeviceBuffer, stream: Option<&Stream>) -> gpu::Result<[u64; STATUS_BYTES / 8]> {
    let mut words = [0u64; STATUS_BYTES / 8];
    if status.bytes() < STATUS_BYTES {
        return Err(gpu::GpuError::BadArgs(format!("{} bytes of status words, not {STATUS_BYTES}", status.bytes())));
    }
    if status.gpu().kind() == DriverKind::Host {
        for (k, w) in words.iter_mut().enumerate() {
            // SAFETY: on the host driver a buffer is this process's live memory, 8-aligned and of STATUS_BYTES
            // (checked); its host kernels write these words atomically.
            *w = unsafe { &*(status.ptr().0 as *const AtomicU64).add(k) }.load(Ordering::Acquire);
        }
        return Ok(words);
    }
    let own;
    let stream = match stream {
        Some(s) => s,
        None => {
            own = status.gpu().stream()?;
            &own
        }
    };
    let mut bytes = [0u8; STATUS_BYTES];
    stream.download(status, 0, &mut bytes)?;
    for (w, b) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        *w = u64::from_le_bytes(b.try_into().expect("8 bytes"));
    }
    Ok(words)
}

/// What status words say failed: the rank a wait recorded and what it says ([`describe_record`]), or an abort
/// without a record (no rank); None while nothing failed.
pub fn recorded(words: &[u64; STATUS_BYTES / 8]) -> Option<(Vec<usize>, String)> {
    match *words {
        [_, 1, peer, what, waited, word, at, want] => {
            Some((vec![peer as usize], describe_record(what, waited, [word, at, want])))
        }
        [abort, ..] if abort != 0 => Some((Vec::new(), "the abort word was set".into())),
        _ => None,
    }
}

/// What the peer a kernel's wait recorded did (`ARX_WAIT_*` in `kernels/include/arx/sync.h`): never arrived at what
/// was waited for, or ran another kernel.
pub fn describe(what: u64) -> String {
    let never = |at: &str| format!("never arrived at {at}");
    match (what >> 8) & 0xff {
        1 => never(&format!("barrier phase {}", what & 0xff)),
        2 => never("its packets"),
        3 => never("the compare-and-swap handshake"),
        4 => never("this rank's own blocks' barrier"),
        5 => gpu::mismatch(flag_kernel((what >> 16) & 0xff), flag_kernel(what & 0xff)),
        _ => never(&format!("wait {what:#x}")),
    }
}

/// A recorded failure: what the peer did; for a wait that ended at its deadline, how long it lasted (a wait cut short
/// tells itself from a peer that never came) and what it read last, `seen` = [the word, where (a packet's slot), the
/// word it waited for]: a lost packet's slot holding an older call's packet was never written this call, one holding
/// anything else was overwritten.
pub fn describe_record(what: u64, waited_ns: u64, seen: [u64; 3]) -> String {
    if waited_ns == 0 {
        return describe(what);
    }
    let [word, at, want] = seen;
    let read = match (what >> 8) & 0xff {
        2 => match (word >> 32, want >> 32) {
            (0, _) => format!("its packet slot {at} was empty"),
            (got, want) => match got.checked_sub(want) {
                Some(ahead) => format!("its packet slot {at} held a packet flagged {ahead} call(s) ahead"),
                None => format!("its packet slot {at} held a packet flagged {} call(s) before", want - got),
            },
        },
        1 => format!("the flag it polled said epoch {} (waited for {want})", word >> 8),
        4 => format!("the counter it polled said epoch {word} (waited for {want})"),
        _ => return format!("{} (after waiting {:.3} s)", describe(what), waited_ns as f64 * 1e-9),
    };
    format!("{} (after waiting {:.3} s; {read})", describe(what), waited_ns as f64 * 1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flag_tags::flag_tag;

    #[test]
    fn a_timed_out_wait_says_how_long_it_waited_and_what_it_read() {
        let flag = |call: u64| (call + 1) << 32;
        let packets = |seen| describe_record(0x200, 10_000_000_000, seen);
        assert_eq!(
            packets([flag(5) | 7, 12, flag(7)]),
            "never arrived at its packets (after waiting 10.000 s; its packet slot 12 held a packet flagged 2 call(s) before)"
        );
        assert!(packets([0, 3, flag(7)]).ends_with("its packet slot 3 was empty)"));
        assert!(packets([flag(8), 3, flag(7)]).ends_with("flagged 1 call(s) ahead)"));
        assert_eq!(
            describe_record(0x101, 2_500_000, [41 << 8 | 3, 0, 42]),
            "never arrived at barrier phase 1 (after waiting 0.003 s; the flag it polled said epoch 41 (waited for 42))"
        );
        assert_eq!(
            describe_record(0x300, 1_000_000_000, [0; 3]),
            "never arrived at the compare-and-swap handshake (after waiting 1.000 s)"
        );
        // A peer met in another kernel: judged at once, no wait.
        assert_eq!(describe_record(0x101, 0, [0; 3]), "never arrived at barrier phase 1");
    }

    #[test]
    fn records_are_read_as_the_kernels_leave_them() {
        assert_eq!(recorded(&[0; 8]), None);
        // A record being written (2) is not read yet; the abort without a record names no rank.
        assert_eq!(recorded(&[1, 2, 3, 0x200, 5, 0, 0, 0]), Some((Vec::new(), "the abort word was set".into())));
        let (ranks, what) = recorded(&[1, 1, 7, 0x200, 10_000_000_000, 6 << 32, 12, 8 << 32]).expect("a record");
        assert_eq!(ranks, vec![7]);
        assert!(what.ends_with("its packet slot 12 held a packet flagged 2 call(s) before)"), "{what}");
    }

    #[test]
    fn every_wait_kind_is_named() {
        assert_eq!(describe(0x101), "never arrived at barrier phase 1");
        assert_eq!(describe(0x200), "never arrived at its packets");
        assert_eq!(describe(0x300), "never arrived at the compare-and-swap handshake");
        assert_eq!(describe(0x400), "never arrived at this rank's own blocks' barrier");
        let (zc2, epoch) = (flag_tag("symm_zc_2shot").unwrap(), flag_tag("symm_epoch_1shot").unwrap());
        let what = describe(u64::from(zc2) << 16 | 0x500 | u64::from(epoch));
        assert!(what.starts_with("ran symm_epoch_1shot where this rank ran symm_zc_2shot"), "{what}");
        let source = include_str!("../../../kernels/include/arx/sync.h");
        for (name, code) in
            [("FLAGS", 0x100), ("PACKETS", 0x200), ("CAS", 0x300), ("BLOCKS", 0x400), ("MISMATCH", 0x500)]
        {
            assert!(source.contains(&format!("#define ARX_WAIT_{name} {code:#x}u")), "ARX_WAIT_{name}");
        }
    }
}
