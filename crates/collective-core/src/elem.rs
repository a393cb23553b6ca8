//! Element conversions on the host: what the host kernels compute with, and what the benchmark uses to make
//! inputs and read results. bf16 and fp16 are raw 16-bit values, as in the device kernels; f32 -> 16-bit
//! conversions round to nearest even, as the kernels' conversions do.

use crate::DType;
use half::{bf16, f16};

/// An element type as the host kernels see it: loaded to f32, accumulated in f32, stored back rounded.
pub trait Element {
    /// # Safety
    /// `p` points to at least `i + 1` elements of this type.
    unsafe fn load(p: *const u8, i: usize) -> f32;
    /// # Safety
    /// `p` points to at least `i + 1` writable elements of this type.
    unsafe fn store(p: *mut u8, i: usize, v: f32);
}

/// The host kernels' element types.
pub enum HostElem {}

macro_rules! element {
    ($name:ident, $dtype:expr, $raw:ty, $load:expr, $store:expr) => {
        pub struct $name;
        impl Element for $name {
            unsafe fn load(p: *const u8, i: usize) -> f32 {
                // SAFETY: the caller's contract; unaligned reads keep odd offsets legal.
                let raw = unsafe { (p as *const $raw).add(i).read_unaligned() };
                $load(raw)
            }
            unsafe fn store(p: *mut u8, i: usize, v: f32) {
                // SAFETY: the caller's contract.
                unsafe { (p as *mut $raw).add(i).write_unaligned($store(v)) }
            }
        }
    };
}

element!(Bf16, DType::Bf16, u16, |r| bf16::from_bits(r).to_f32(), |v| bf16::from_f32(v).to_bits());
element!(F16, DType::F16, u16, |r| f16::from_bits(r).to_f32(), |v| { f16::from_f32(v).to_bits() });
element!(F32, DType::F32, f32, |r| r, |v| v);

impl DType {
    /// Rounds `values` to this type and lays them out as the device holds them.
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; values.len() * self.size()];
        let p = out.as_mut_ptr();
        for (i, &v) in values.iter().enumerate() {
            // SAFETY: `out` holds `values.len()` elements of this type.
            unsafe {
                match self {
                    DType::Bf16 => Bf16::store(p, i, v),
                    DType::F16 => F16::store(p, i, v),
                    DType::F32 => F32::store(p, i, v),
                }
            }
        }
        out
    }

    /// Reads device-layout bytes back as f64.
    pub fn decode(self, bytes: &[u8]) -> Vec<f64> {
        let n = bytes.len() / self.size();
        let p = bytes.as_ptr();
        (0..n)
            .map(|i| {
                // SAFETY: `bytes` holds `n` elements of this type.
                let v = unsafe {
                    match self {
                        DType::Bf16 => Bf16::load(p, i),
                        DType::F16 => F16::load(p, i),
                        DType::F32 => F32::load(p, i),
                    }
                };
                v as f64
            })
            .collect()
    }
}

/// The sources of a sum, in the order the kernels add them: every rank's buffer at the addresses `srcs`, then the
/// bias at `bias` when it is not 0 (`sum_at` in `kernels/include/arx/reduce.h`).
pub fn sum_sources(srcs: impl IntoIterator<Item = u64>, bias: u64) -> Vec<*const u8> {
    srcs.into_iter().chain((bias != 0).then_some(bias)).map(|a| a as *const u8).collect()
}

impl HostElem {
    /// `dst[i - lo] = src[0][i] + src[1][i] + ...` for i in `[lo, hi)`, in rank order with f32 accumulation, the
    /// same order as the device kernels, so every driver and every rank gets the same bits.
    ///
    /// # Safety
    /// Every source addresses at least `hi` elements, `dst` at least `hi - lo`; `dst` may be the sources' element
    /// `lo` of one of them (in place), but no other overlap.
    pub unsafe fn reduce(dtype: DType, srcs: &[*const u8], lo: usize, hi: usize, dst: *mut u8) {
        // SAFETY: forwarded contract.
        unsafe {
            match dtype {
                DType::Bf16 => reduce::<Bf16, false>(srcs, lo, hi, dst),
                DType::F16 => reduce::<F16, false>(srcs, lo, hi, dst),
                DType::F32 => reduce::<F32, false>(srcs, lo, hi, dst),
            }
        }
    }

    /// As [`HostElem::reduce`], with the running sum rounded to the element type after every add (the kernels'
    /// `add<DT, true>`: the low-precision-accumulation ablation).
    ///
    /// # Safety
    /// As [`HostElem::reduce`].
    pub unsafe fn reduce_rounded(dtype: DType, srcs: &[*const u8], lo: usize, hi: usize, dst: *mut u8) {
        // SAFETY: forwarded contract.
        unsafe {
            match dtype {
                DType::Bf16 => reduce::<Bf16, true>(srcs, lo, hi, dst),
                DType::F16 => reduce::<F16, true>(srcs, lo, hi, dst),
                DType::F32 => reduce::<F32, true>(srcs, lo, hi, dst),
            }
        }
    }

    /// Copies elements `[lo, hi)` of `src` to the same place in `dst`.
    ///
    /// # Safety
    /// Both pointers address at least `hi` elements and do not overlap.
    pub unsafe fn copy(dtype: DType, src: *const u8, dst: *mut u8, lo: usize, hi: usize) {
        let s = dtype.size();
        // SAFETY: forwarded contract.
        unsafe { std::ptr::copy_nonoverlapping(src.add(lo * s), dst.add(lo * s), (hi - lo) * s) }
    }
}

/// The sum in rank order with f32 accumulation, or (`ROUND`) rounded to `E` after every add, as the kernels' `add`.
unsafe fn reduce<E: Element, const ROUND: bool>(srcs: &[*const u8], lo: usize, hi: usize, dst: *mut u8) {
    let Some((&first, rest)) = srcs.split_first() else {
        return;
    };
    let mut cell = [0u8; 4];
    for i in lo..hi {
        // SAFETY: forwarded contract; `cell` holds one element of any type.
        unsafe {
            let mut acc = E::load(first, i);
            for &p in rest {
                acc += E::load(p, i);
                if ROUND {
                    E::store(cell.as_mut_ptr(), 0, acc);
                    acc = E::load(cell.as_ptr(), 0);
                }
            }
            E::store(dst, i - lo, acc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_rounds_to_nearest_even_and_decodes() {
        // 1 + 2^-8 lies halfway between two bf16 values; nearest even is 1.0.
        let v = [1.0f32 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -2.5, 0.0];
        let back = DType::Bf16.decode(&DType::Bf16.encode(&v));
        assert_eq!(back, vec![1.0, 1.0 + 4.0 / 256.0, -2.5, 0.0]);
        let back = DType::F16.decode(&DType::F16.encode(&v));
        assert_eq!(back[2], -2.5);
        assert_eq!(DType::F32.decode(&DType::F32.encode(&v))[0], v[0] as f64);
    }

    #[test]
    fn reduce_sums_in_rank_order() {
        let a = DType::F32.encode(&[1.0, 2.0, 3.0]);
        let b = DType::F32.encode(&[10.0, 20.0, 30.0]);
        let mut out = vec![0u8; 12];
        // SAFETY: all three hold 3 f32.
        unsafe { HostElem::reduce(DType::F32, &[a.as_ptr(), b.as_ptr()], 1, 3, out.as_mut_ptr()) };
        assert_eq!(DType::F32.decode(&out), vec![22.0, 33.0, 0.0]);
    }
}
