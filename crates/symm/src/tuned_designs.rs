//! The tuned designs and the kernels they run: which kernel a design picks per size and mode ([`Design`], the
//! hand-overs), each kernel's identity on the launch path ([`Stem`]) and its launch rule.

use collective_core::norm::NORM_LANES;
use collective_core::{LaunchRule, Mode};
use gpu::DriverKind;

/// Largest message the packet (LL) path carries.
pub const LL_MAX_BYTES: usize = 96 << 10;
/// Largest message the tuned methods send through `symm_ll` in a graph capture; above it the packets' doubled bytes
/// cost more than `symm_epoch_1shot`'s barrier.
pub const LL_HANDOVER_GRAPH_BYTES: usize = 48 << 10;
/// The same hand-over for eager launches, higher: eager kernels start further apart across ranks, and packets let the
/// early ranks' data move while the late ones launch.
pub const LL_HANDOVER_EAGER_BYTES: usize = 76 << 10;
// `Design::depends_on_mode` takes the window between them in this order, and packets carry no more than the area.
const _: () = assert!(LL_HANDOVER_GRAPH_BYTES <= LL_HANDOVER_EAGER_BYTES && LL_HANDOVER_EAGER_BYTES <= LL_MAX_BYTES);
/// Largest message `symm_1shot_tuned` sends through `symm_epoch_1shot` (one barrier); above it the zero-copy one-shot's
/// saved copy-in outweighs its second barrier.
pub const EPOCH_MAX_BYTES: usize = 640 << 10;
/// Largest message `symm_2shot_tuned` sends through `symm_epoch_1shot`; above it zero-copy two-shot, whose reads
/// scale with the shard rather than the message.
pub const TWO_SHOT_EPOCH_MAX_BYTES: usize = 256 << 10;

/// Which tuned design a method runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Design {
    Ll,
    EpochOneShot,
    ZeroCopyOneShot,
    ZeroCopyTwoShot,
    /// Zero-copy two-shot whose copy-in is pushed: every rank writes each shard of its input, wherever it lies, into
    /// the shard owner's staging, which sums locally, so every remote access is a write.
    ZeroCopyTwoShotPush,
    /// Zero-copy two-shot whose all-gather pulls: each rank copies every shard from its owner's staging into its own
    /// output, so a caller's output needs no copy-out and no peer writes it.
    ZeroCopyTwoShotPull,
    /// Zero-copy two-shot whose second phase is flag-and-data packets: one barrier.
    ZeroCopyTwoShotLl,
    /// `Ll` up to the hand-over of the call's [`Mode`], `EpochOneShot` up to [`EPOCH_MAX_BYTES`], else zero-copy one-shot.
    OneShotTuned,
    /// `Ll` up to the hand-over of the call's [`Mode`], `EpochOneShot` up to [`TWO_SHOT_EPOCH_MAX_BYTES`], else zero-copy
    /// two-shot.
    TwoShotTuned,
}

/// Largest message the tuned designs send as packets in calls issued in `mode`.
pub fn ll_handover_bytes(mode: Mode) -> usize {
    match mode {
        Mode::Eager => LL_HANDOVER_EAGER_BYTES,
        Mode::Graph => LL_HANDOVER_GRAPH_BYTES,
    }
}

impl Design {
    pub fn method(self) -> &'static str {
        match self {
            Design::Ll => "symm_ll",
            Design::EpochOneShot => "symm_epoch_1shot",
            Design::ZeroCopyOneShot => "symm_zc_1shot",
            Design::ZeroCopyTwoShot => "symm_zc_2shot",
            Design::ZeroCopyTwoShotPush => "symm_zc_2shot_push",
            Design::ZeroCopyTwoShotPull => "symm_zc_2shot_pull",
            Design::ZeroCopyTwoShotLl => "symm_zc_2shot_ll",
            Design::OneShotTuned => "symm_1shot_tuned",
            Design::TwoShotTuned => "symm_2shot_tuned",
        }
    }

    /// Whether a kernel this design may pick reads its peers' buffers in place (the zero-copy designs), so that a call
    /// captured on unregistered buffers needs their addresses in a peer table.
    pub fn reads_peers(self) -> bool {
        self.stems().iter().any(|stem| stem.reads_peers())
    }

    /// Whether the kernel for a message of `bytes` depends on how the call is issued.
    pub(crate) fn depends_on_mode(self, bytes: usize) -> bool {
        matches!(self, Design::OneShotTuned | Design::TwoShotTuned)
            && bytes > LL_HANDOVER_GRAPH_BYTES
            && bytes <= LL_HANDOVER_EAGER_BYTES
    }

    /// Every kernel [`Design::kernel`] may pick, at any size and in either mode.
    pub(crate) fn stems(self) -> &'static [Stem] {
        match self {
            Design::Ll => &[Stem::Ll],
            Design::EpochOneShot => &[Stem::EpochOneShot],
            Design::ZeroCopyOneShot => &[Stem::ZeroCopyOneShot],
            Design::ZeroCopyTwoShot => &[Stem::ZeroCopyTwoShot],
            Design::ZeroCopyTwoShotPush => &[Stem::ZeroCopyTwoShotPush],
            Design::ZeroCopyTwoShotPull => &[Stem::ZeroCopyTwoShotPull],
            Design::ZeroCopyTwoShotLl => &[Stem::ZeroCopyTwoShotLl],
            Design::OneShotTuned => &[Stem::Ll, Stem::EpochOneShot, Stem::ZeroCopyOneShot],
            Design::TwoShotTuned => &[Stem::Ll, Stem::EpochOneShot, Stem::ZeroCopyTwoShot],
        }
    }

    /// The kernel for a message of `bytes` issued in `mode`.
    pub(crate) fn kernel(self, bytes: usize, mode: Mode) -> Stem {
        match self {
            Design::Ll => Stem::Ll,
            Design::EpochOneShot => Stem::EpochOneShot,
            Design::ZeroCopyOneShot => Stem::ZeroCopyOneShot,
            Design::ZeroCopyTwoShot => Stem::ZeroCopyTwoShot,
            Design::ZeroCopyTwoShotPush => Stem::ZeroCopyTwoShotPush,
            Design::ZeroCopyTwoShotPull => Stem::ZeroCopyTwoShotPull,
            Design::ZeroCopyTwoShotLl => Stem::ZeroCopyTwoShotLl,
            Design::OneShotTuned | Design::TwoShotTuned if bytes <= ll_handover_bytes(mode) => Stem::Ll,
            Design::OneShotTuned if bytes <= EPOCH_MAX_BYTES => Stem::EpochOneShot,
            Design::OneShotTuned => Stem::ZeroCopyOneShot,
            Design::TwoShotTuned if bytes <= TWO_SHOT_EPOCH_MAX_BYTES => Stem::EpochOneShot,
            Design::TwoShotTuned => Stem::ZeroCopyTwoShot,
        }
    }
}

/// The kernels of the library, each instantiated for every dtype; the discriminant indexes the communicator's
/// tables, so the launch path compares no names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stem {
    Ll,
    EpochOneShot,
    ZeroCopyOneShot,
    ZeroCopyTwoShot,
    /// `ZeroCopyTwoShot` with the input (`copy_from`) pushed into the shard owners' staging.
    ZeroCopyTwoShotPush,
    /// `ZeroCopyTwoShot` gathering by pulling from the shard owners' staging into this rank's output.
    ZeroCopyTwoShotPull,
    ZeroCopyTwoShotLl,
    /// `Ll` with the residual add and RMSNorm: blocks of [`NORM_LANES`] threads own whole rows.
    LlNorm,
    /// `ZeroCopyOneShot` with the residual add and RMSNorm, likewise.
    ZeroCopyOneShotNorm,
    /// `ZeroCopyTwoShot` with the residual add and RMSNorm: the rows split among the ranks, r pushed to every rank.
    ZeroCopyTwoShotNorm,
    /// `EpochOneShot` with the residual add and RMSNorm, likewise.
    EpochOneShotNorm,
    /// `ZeroCopyTwoShotNorm` with the input pushed into the share owners' staging, as `ZeroCopyTwoShotPush`.
    ZeroCopyTwoShotPushNorm,
    /// `ZeroCopyTwoShotLl` with the residual add and RMSNorm: the rows split among the ranks, r sent as packets.
    ZeroCopyTwoShotLlNorm,
}

impl Stem {
    pub(crate) const ALL: [Stem; 13] = [
        Stem::Ll,
        Stem::EpochOneShot,
        Stem::ZeroCopyOneShot,
        Stem::ZeroCopyTwoShot,
        Stem::ZeroCopyTwoShotPush,
        Stem::ZeroCopyTwoShotPull,
        Stem::ZeroCopyTwoShotLl,
        Stem::LlNorm,
        Stem::ZeroCopyOneShotNorm,
        Stem::ZeroCopyTwoShotNorm,
        Stem::EpochOneShotNorm,
        Stem::ZeroCopyTwoShotPushNorm,
        Stem::ZeroCopyTwoShotLlNorm,
    ];

    /// The kernel's name in `kernels/symm_tuned.cu`, without the dtype suffix.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stem::Ll => "symm_ll",
            Stem::EpochOneShot => "symm_epoch_1shot",
            Stem::ZeroCopyOneShot => "symm_zc_1shot",
            Stem::ZeroCopyTwoShot => "symm_zc_2shot",
            Stem::ZeroCopyTwoShotPush => "symm_zc_2shot_push",
            Stem::ZeroCopyTwoShotPull => "symm_zc_2shot_pull",
            Stem::ZeroCopyTwoShotLl => "symm_zc_2shot_ll",
            Stem::LlNorm => "symm_ll_norm",
            Stem::ZeroCopyOneShotNorm => "symm_zc_1shot_norm",
            Stem::EpochOneShotNorm => "symm_epoch_1shot_norm",
            Stem::ZeroCopyTwoShotPushNorm => "symm_zc_2shot_push_norm",
            Stem::ZeroCopyTwoShotLlNorm => "symm_zc_2shot_ll_norm",
            Stem::ZeroCopyTwoShotNorm => "symm_zc_2shot_norm",
        }
    }

    /// Threads of every block: the norm's lanes, or the launch rule's.
    pub(crate) fn threads(self, kind: DriverKind) -> u32 {
        match self {
            Stem::LlNorm
            | Stem::ZeroCopyOneShotNorm
            | Stem::ZeroCopyTwoShotNorm
            | Stem::EpochOneShotNorm
            | Stem::ZeroCopyTwoShotPushNorm
            | Stem::ZeroCopyTwoShotLlNorm => NORM_LANES as u32,
            _ => rule(kind, self, 0).threads,
        }
    }

    /// Whether the kernel reads its peers' inputs (and so has a `*_table` variant).
    pub(crate) fn reads_peers(self) -> bool {
        self.table_name().is_some()
    }

    /// The kernel's variant that reads every rank's buffers from a peer table: the ones that touch peers' inputs
    /// or outputs.
    pub(crate) fn table_name(self) -> Option<&'static str> {
        match self {
            Stem::Ll | Stem::EpochOneShot | Stem::LlNorm | Stem::EpochOneShotNorm => None,
            Stem::ZeroCopyOneShot => Some("symm_zc_1shot_table"),
            Stem::ZeroCopyOneShotNorm => Some("symm_zc_1shot_norm_table"),
            Stem::ZeroCopyTwoShotNorm => Some("symm_zc_2shot_norm_table"),
            Stem::ZeroCopyTwoShot => Some("symm_zc_2shot_table"),
            Stem::ZeroCopyTwoShotPush => Some("symm_zc_2shot_push_table"),
            Stem::ZeroCopyTwoShotPull => Some("symm_zc_2shot_pull_table"),
            Stem::ZeroCopyTwoShotPushNorm => Some("symm_zc_2shot_push_norm_table"),
            Stem::ZeroCopyTwoShotLl => Some("symm_zc_2shot_ll_table"),
            Stem::ZeroCopyTwoShotLlNorm => Some("symm_zc_2shot_ll_norm_table"),
        }
    }
}

/// Threads of a tuned design's blocks on a GPU: its kernels are compiled for blocks of at most this many
/// (`ARX_TUNED_THREADS`, their launch bound), so a forced launch shape may not ask for more.
pub const THREADS: u32 = 512;

/// Where the zero-copy designs' launch rule moves to larger blocks of work and a larger grid.
const LARGE_BYTES: usize = 2 << 20;

/// Launch rules per kernel, driver and message size.
pub(crate) fn rule(kind: DriverKind, kernel: Stem, bytes: usize) -> LaunchRule {
    match (kind, kernel) {
        (DriverKind::Host, _) => LaunchRule { threads: 1, bytes_per_block: 256 << 10, max_grid: 4 },
        // One packet (4 bytes) per thread: a single pass, so no thread waits for peers twice.
        (_, Stem::Ll) => LaunchRule { threads: THREADS, bytes_per_block: 2 << 10, max_grid: 64 },
        (_, Stem::ZeroCopyTwoShotLl) => LaunchRule { threads: THREADS, bytes_per_block: 8 << 10, max_grid: 32 },
        // Few blocks, whatever the size: every extra block is one more waiter at the barrier, and the launch-shape
        // sweep found 16 as fast as car's one block per 16 KiB at every size the tuned one-shot sends here.
        (_, Stem::EpochOneShot) if bytes <= 160 << 10 => {
            LaunchRule { threads: THREADS, bytes_per_block: 1 << 10, max_grid: 16 }
        }
        (_, Stem::EpochOneShot) if bytes <= EPOCH_MAX_BYTES => {
            LaunchRule { threads: THREADS, bytes_per_block: 16 << 10, max_grid: 16 }
        }
        // Past 2 MiB, up to twice the blocks (a copy or sum of a large message is bound by how many SMs move it; the
        // resident cap still keeps every rank's blocks on the device); the two pieces meet at 32 blocks.
        _ if bytes > LARGE_BYTES => LaunchRule { threads: THREADS, bytes_per_block: 64 << 10, max_grid: 64 },
        _ => LaunchRule { threads: THREADS, bytes_per_block: 16 << 10, max_grid: 32 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems_index_their_tables_and_designs_pick_by_size() {
        for (i, stem) in Stem::ALL.into_iter().enumerate() {
            assert_eq!(stem as usize, i, "{stem:?}: Stem::ALL is in discriminant order");
        }
        let source = include_str!("../../../kernels/symm_tuned.cu");
        for stem in Stem::ALL {
            for name in std::iter::once(stem.name()).chain(stem.table_name()) {
                let entry = format!("ARX_INSTANTIATE_BOUNDED({name}, TunedParams, ARX_TUNED_THREADS)");
                assert!(source.contains(&entry), "{name} has no kernel compiled for blocks of THREADS");
            }
        }
        let (_, portability) = collective_core::KERNEL_HEADERS.iter().find(|(n, _)| *n == "arx/portability.h").unwrap();
        assert!(
            portability.contains(&format!("#define ARX_TUNED_THREADS {THREADS}\n")),
            "THREADS == ARX_TUNED_THREADS"
        );
        assert_eq!(NORM_LANES as u32, THREADS, "a norm design's row blocks are tuned blocks too");
        for mode in [Mode::Eager, Mode::Graph] {
            let handover = ll_handover_bytes(mode);
            for design in [Design::OneShotTuned, Design::TwoShotTuned] {
                assert_eq!(design.kernel(handover, mode), Stem::Ll, "{design:?} {mode:?}");
                assert_eq!(design.kernel(handover + 1, mode), Stem::EpochOneShot, "{design:?} {mode:?}");
            }
            assert_eq!(Design::OneShotTuned.kernel(EPOCH_MAX_BYTES + 1, mode), Stem::ZeroCopyOneShot);
            assert_eq!(Design::TwoShotTuned.kernel(TWO_SHOT_EPOCH_MAX_BYTES, mode), Stem::EpochOneShot);
            assert_eq!(Design::TwoShotTuned.kernel(TWO_SHOT_EPOCH_MAX_BYTES + 1, mode), Stem::ZeroCopyTwoShot);
            assert_eq!(Design::ZeroCopyTwoShotLl.kernel(1, mode), Stem::ZeroCopyTwoShotLl);
            assert_eq!(Design::Ll.kernel(LL_MAX_BYTES, mode), Stem::Ll);
        }
        let zero_copy = [Design::ZeroCopyOneShot, Design::ZeroCopyTwoShotPush, Design::ZeroCopyTwoShotPull];
        assert!(zero_copy.iter().all(|d| d.reads_peers()) && !Design::Ll.reads_peers());
        assert!(!Design::EpochOneShot.reads_peers(), "the epoch one-shot reads its peers' staging, not their buffers");
    }

    #[test]
    fn large_messages_take_up_to_twice_the_blocks_without_a_step_at_the_seam() {
        let grid = |bytes| rule(DriverKind::Cuda, Stem::ZeroCopyTwoShotPull, bytes).plan(bytes, 1000).grid;
        assert_eq!([grid(1 << 20), grid(LARGE_BYTES), grid(LARGE_BYTES + 1)], [32, 32, 33]);
        assert_eq!([grid(4 << 20), grid(32 << 20)], [64, 64]);
        assert_eq!(rule(DriverKind::Cuda, Stem::ZeroCopyOneShot, 32 << 20).plan(32 << 20, 16).grid, 16, "resident cap");
    }

    #[test]
    fn only_sizes_between_the_two_handovers_ask_how_the_call_is_issued() {
        for design in [Design::OneShotTuned, Design::TwoShotTuned] {
            for bytes in [1, LL_HANDOVER_GRAPH_BYTES, LL_HANDOVER_EAGER_BYTES, EPOCH_MAX_BYTES] {
                let differs = design.kernel(bytes, Mode::Eager) != design.kernel(bytes, Mode::Graph);
                assert_eq!(design.depends_on_mode(bytes), differs, "{design:?} at {bytes} bytes");
            }
            assert!(design.depends_on_mode(LL_HANDOVER_GRAPH_BYTES + 1));
        }
        assert!(!Design::EpochOneShot.depends_on_mode(LL_HANDOVER_GRAPH_BYTES + 1));
    }
}
