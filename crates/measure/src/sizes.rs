//! comm_bench.py's message sizes: `torch.logspace(min, max, steps, base=2)`, each truncated to an integer and
//! rounded up to a multiple of 512 elements on HIP, 256 elsewhere.

/// The element counts of the sweep.
pub fn comm_bench_sizes(min_exp: u32, max_exp: u32, steps: usize, align: usize) -> Vec<usize> {
    let (lo, hi) = (min_exp as f64, max_exp as f64);
    (0..steps)
        .map(|i| {
            let x = if steps == 1 { lo } else { lo + (hi - lo) * i as f64 / (steps - 1) as f64 };
            (2f64.powf(x) as usize).next_multiple_of(align)
        })
        .collect()
}

/// The sizes a tune measures: comm_bench.py's, and the powers of two between them (the sizes programs mostly send:
/// hidden size times tokens), so that a table's size ranges end at measured sizes where users' messages lie, not
/// halfway between two comm_bench.py sizes.
pub fn tune_sizes(min_exp: u32, max_exp: u32, steps: usize, align: usize) -> Vec<usize> {
    let powers = (min_exp..=max_exp).map(|e| (1usize << e).next_multiple_of(align));
    let mut sizes: Vec<usize> = comm_bench_sizes(min_exp, max_exp, steps, align).into_iter().chain(powers).collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The N column of the user's table (MI300X, HIP alignment), and the CUDA list for the same exponents.
    #[test]
    fn equals_comm_bench_py() {
        let hip = [
            1024, 2048, 3072, 5120, 8192, 13312, 22016, 36864, 60928, 101888, 169472, 282112, 470016, 783360, 1305600,
            2175488, 3624960, 6041088, 10067456, 16777216,
        ];
        assert_eq!(comm_bench_sizes(10, 24, 20, 512), hip);
        let cuda = comm_bench_sizes(10, 24, 20, 256);
        assert_eq!(cuda.len(), 20);
        assert_eq!((cuda[0], cuda[1], cuda[19]), (1024, 1792, 16777216));
        assert!(cuda.iter().all(|n| n % 256 == 0));
        assert_eq!(comm_bench_sizes(12, 12, 1, 256), vec![4096]);
    }

    #[test]
    fn a_tune_measures_comm_bench_sizes_and_the_powers_of_two() {
        let tune = tune_sizes(10, 24, 20, 256);
        let cb = comm_bench_sizes(10, 24, 20, 256);
        assert!(cb.iter().all(|n| tune.contains(n)));
        assert!((10..=24).all(|e| tune.contains(&(1 << e))));
        assert!(tune.windows(2).all(|w| w[0] < w[1]));
        // 1024 and 16,777,216 are both: 20 + 15 - 2.
        assert_eq!(tune.len(), 33);
    }
}
