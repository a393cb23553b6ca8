//! The status words a kernel's failed wait leaves (`record_failure` in `kernels/include/arx/sync.h`): `[abort,
//! recorded, peer, what]`, `what` an `ARX_WAIT_*` kind and its detail; read by the communicator's watchdog, and by
//! `cargo xtask kernel-check`'s run of the device barrier on the host.

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flag_tags::flag_tag;

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
