//! The tuned kernels' parameter block and packet flags, shared by the launch path (`tuned.rs`) and the host twins
//! (`host_tuned.rs`).

use collective_core::MAX_RANKS;

/// How many epochs the packet flags take to wrap: epoch `LL_FLAG_PERIOD` has epoch 0's flag again.
pub const LL_FLAG_PERIOD: u64 = 0xffff_ffff;

/// The packet flag of an epoch, in a packet's high word: `epoch mod (2^32 - 1) + 1`, never 0, so a zeroed slot never
/// reads as data; each area is zeroed by the last call that uses it before the flags wrap (the kernels' `ll_clean`).
pub fn ll_flag(epoch: u64) -> u64 {
    (epoch % LL_FLAG_PERIOD + 1) << 32
}

/// The kernels' parameter block; layout equals `struct TunedParams` in `kernels/symm_tuned.cu`.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct TunedParams {
    pub inputs: [u64; MAX_RANKS],
    pub outputs: [u64; MAX_RANKS],
    pub packets: [u64; MAX_RANKS],
    pub flags: [u64; MAX_RANKS],
    pub staging: [u64; MAX_RANKS],
    pub counters: u64,
    pub count: u64,
    pub ll_packets: u64,
    pub half_bytes: u64,
    pub timeout_ns: u64,
    pub rank: u32,
    pub world: u32,
    pub dtype: u32,
    /// The kernel's epoch-flag tag ([`collective_core::flag_tags`]), set per launch.
    pub tag: u32,
    /// The `*_table` kernels read every rank's input and output from here: u64 [inputs; MAX_RANKS][outputs; MAX_RANKS].
    pub peer_table: u64,
    /// Zero-copy one- and two-shot: a caller's input that the kernel copies into the registered one first (0: none).
    pub copy_from: u64,
    /// The communicator's status words (`kernels/include/arx/sync.h`), which every wait watches.
    pub status: u64,
    /// Allreduce: added to every sum after the ranks' inputs (car's `z`), or 0.
    pub bias: u64,
    /// `symm_ll_norm` ([`collective_core::AddRmsNorm`]): the residual, written back as `r`.
    pub residual: u64,
    pub weight: u64,
    pub hidden: u32,
    pub eps: f32,
}

/// Bytes of one peer table (see [`TunedParams::peer_table`]).
pub const PEER_TABLE_BYTES: usize = 2 * MAX_RANKS * 8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packet_flags_are_never_zero_and_wrap_once_per_period() {
        const P: u64 = 0xffff_ffff;
        for e in [0, 1, 2, P - 3, P - 2, P - 1, P, P + 1, 1 << 32, (1 << 32) + 1, u64::MAX - 2] {
            assert_ne!(ll_flag(e), 0, "epoch {e}");
            assert_eq!(ll_flag(e) & 0xffff_ffff, 0, "the flag lives in the high word");
        }
        // The flag the old encoding (the epoch's low 32 bits) gave epoch 2^32: zero, which a fresh slot holds.
        assert_eq!((1u64 << 32) & 0xffff_ffff, 0);
        let wraps: Vec<u64> = (P - 5..P + 5).filter(|&e| ll_flag(e + 2) <= ll_flag(e)).collect();
        assert_eq!(wraps, [P - 2, P - 1], "both areas are cleaned by the last call that uses each before the wrap");
    }
}
