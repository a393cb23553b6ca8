//! Which kernel wrote an epoch flag. Every flag a barrier stores is `(epoch << TAG_BITS) | tag`, the tag naming the
//! kernel (`TunedParams::tag`, `CarParams::tag`), so a barrier that meets a peer at its own epoch from another
//! kernel fails naming both (`ARX_WAIT_MISMATCH` in `kernels/include/arx/sync.h`), instead of passing and reading
//! buffers the peer never wrote: ranks that chose different designs for one call (inputs registered on some ranks
//! and not on others, say) share one flag array, and would otherwise return wrong sums in silence.

/// Low bits of a flag that hold the tag (`ARX_TAG_BITS`).
pub const TAG_BITS: u32 = 8;

/// Every kernel that stores epoch flags, its tag its index + 1 (0: a slot never written). A `*_table` kernel runs its
/// stem's protocol and carries its stem's tag.
const FLAG_KERNELS: &[&str] = &[
    "car_1shot",
    "car_2shot",
    "car_rs",
    "car_rs_cols",
    "car_ag",
    "car_1shot_norm",
    "car_2shot_norm",
    "car_barrier_only",
    "car_1shot_round",
    "car_1shot_ptrtable",
    "car_1shot_push",
    "car_1shot_oneblock",
    "car_1shot_cas",
    "car_2shot_3bar",
    "car_1shot_broken_samehalf",
    "car_ag_broken_ringorder",
    "car_2shot_broken_suminput",
    "symm_ll",
    "symm_ll_norm",
    "symm_epoch_1shot",
    "symm_epoch_1shot_norm",
    "symm_zc_1shot",
    "symm_zc_1shot_norm",
    "symm_zc_2shot",
    "symm_zc_2shot_norm",
    "symm_zc_2shot_pull",
    "symm_zc_2shot_push",
    "symm_zc_2shot_push_norm",
    "symm_zc_2shot_ll",
    "symm_zc_2shot_ll_norm",
];
const _: () = assert!(FLAG_KERNELS.len() < 1 << TAG_BITS);

/// The tag of the kernel stem `kernel` (without its dtype suffix), if it stores epoch flags.
pub fn flag_tag(kernel: &str) -> Option<u32> {
    FLAG_KERNELS.iter().position(|&k| k == kernel).map(|i| i as u32 + 1)
}

/// The kernel of `tag`, for an error's message.
pub fn flag_kernel(tag: u64) -> &'static str {
    match tag as usize {
        t @ 1.. if t <= FLAG_KERNELS.len() => FLAG_KERNELS[t - 1],
        _ => "a kernel without a tag",
    }
}

/// The flag a barrier of `tag`'s kernel stores at `epoch`.
pub fn flag_word(epoch: u64, tag: u32) -> u64 {
    (epoch << TAG_BITS) | u64::from(tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_name_their_kernels_and_agree_with_the_kernels() {
        for (i, &k) in FLAG_KERNELS.iter().enumerate() {
            let tag = flag_tag(k).unwrap();
            assert_eq!((tag as usize, flag_kernel(u64::from(tag))), (i + 1, k));
        }
        assert_eq!((flag_tag("symm_zc_2shot_table"), flag_kernel(0)), (None, "a kernel without a tag"));
        assert_eq!(flag_word(3, 5) >> TAG_BITS, 3);
        assert_eq!(flag_word(3, 5) & 0xff, 5);
        let sync = include_str!("../../../kernels/include/arx/sync.h");
        assert!(sync.contains(&format!("#define ARX_TAG_BITS {TAG_BITS}")), "ARX_TAG_BITS");
    }
}
