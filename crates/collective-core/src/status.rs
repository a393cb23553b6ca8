//! The status words a kernel's failed wait leaves (`record_failure` in `kernels/include/arx/sync.h`): `[abort,
//! recorded, peer, what, waited, seen word, where, wanted word]`, `what` an `ARX_WAIT_*` kind and its detail, `waited`
//! how long the wait lasted by the device's clock; read by the communicator's watchdog, and by `cargo xtask
//! kernel-check`'s run of the device barrier on the host.

use crate::flag_tags::flag_kernel;

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
