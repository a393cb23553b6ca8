//! The host twin of `kernels/include/arx/norm.h`: the residual add and RMSNorm that follow an allreduce, row by row,
//! in the kernels' one fixed order (the sum rounded to the element type, the residual added in f32 and rounded; a
//! row's sum of squares as [`NORM_LANES`] fused multiply-add chains, lane `l` over the elements of 16-byte vectors
//! `l, l + LANES, ...` in order,
//! then halved pairwise), so every rank, design and driver gets the same bits, fused or not.

use crate::elem::{Bf16, Element, F16, F32};
use crate::{AddRmsNorm, DType, MAX_BLOCKS};
use gpu::LaunchDims;

/// Partial sums of a row's squares (the threads of a norm block on the device).
pub const NORM_LANES: usize = 512;

/// Blocks for a kernel whose blocks own whole rows and wait for their peers: a block per row, as many as fit
/// (`cap`, every rank's blocks resident at once).
pub fn row_grid(rows: usize, cap: usize) -> u32 {
    rows.clamp(1, cap.min(MAX_BLOCKS)) as u32
}

/// `grid` blocks of one thread per lane of the norm's canonical order.
pub fn norm_dims(grid: u32) -> LaunchDims {
    LaunchDims { grid, block: NORM_LANES as u32, shared_bytes: 0 }
}

/// Rows `[lo, hi)` of `rows` that block `b` of `grid` takes (`row_range` in `kernels/include/arx/norm.h`).
pub fn row_range((lo, hi): (usize, usize), b: usize, grid: usize) -> (usize, usize) {
    let per = (hi - lo).div_ceil(grid);
    let first = (lo + b * per).min(hi);
    (first, (first + per).min(hi))
}

/// Rows `[lo, hi)` of `r = round(round(sum of srcs) + residual)`, into `r_dst` at the same elements; the sources
/// in rank order, as every sum.
///
/// # Safety
/// Every source, `residual` and `r_dst` address at least `hi * hidden` elements of `dtype`; `r_dst` may be one of
/// the sources or the residual (each element is read before it is written), no other overlap.
pub unsafe fn add_residual(
    dtype: DType,
    srcs: &[*const u8],
    residual: *const u8,
    r_dst: *mut u8,
    hidden: usize,
    (lo, hi): (usize, usize),
) {
    // SAFETY: forwarded contract.
    unsafe {
        match dtype {
            DType::Bf16 => add_residual_as::<Bf16>(srcs, residual, r_dst, lo * hidden, hi * hidden),
            DType::F16 => add_residual_as::<F16>(srcs, residual, r_dst, lo * hidden, hi * hidden),
            DType::F32 => add_residual_as::<F32>(srcs, residual, r_dst, lo * hidden, hi * hidden),
        }
    }
}

/// The whole epilogue of rows `[lo, hi)` of a sum over `srcs`: r into `norm.residual`, then y from it into `out`
/// (`add_rms_norm_row` in norm.h: the one-shot designs' and the unfused kernel's).
///
/// # Safety
/// As [`add_residual`] with the residual as `r_dst`, then [`rms_norm`] without `r_copy`.
pub unsafe fn add_rms_norm(dtype: DType, srcs: &[*const u8], norm: &AddRmsNorm, out: *mut u8, rows: (usize, usize)) {
    let residual = norm.residual.0 as *mut u8;
    // SAFETY: forwarded contract.
    unsafe {
        add_residual(dtype, srcs, residual, residual, norm.hidden, rows);
        rms_norm(dtype, residual, None, out, norm, rows);
    }
}

/// Rows `[lo, hi)` of `y = r / sqrt(mean(r^2) + eps) * weight` from the rows of `r_src` into `out`, copying them to
/// `r_copy` as well when it is given (the two-shot's gather of the peers' rows into the residual).
///
/// # Safety
/// `r_src`, `out` and `r_copy` address at least `hi * norm.hidden` elements, `norm.weight` `norm.hidden`; `out` may
/// be `r_src` (a row is read whole before it is written), no other overlap.
pub unsafe fn rms_norm(
    dtype: DType,
    r_src: *const u8,
    r_copy: Option<*mut u8>,
    out: *mut u8,
    norm: &AddRmsNorm,
    (lo, hi): (usize, usize),
) {
    let weight = norm.weight.0 as *const u8;
    for row in lo..hi {
        let base = row * norm.hidden;
        // SAFETY: forwarded contract.
        unsafe {
            match dtype {
                DType::Bf16 => rms_norm_row::<Bf16>(r_src, r_copy, weight, out, base, norm, dtype.vec()),
                DType::F16 => rms_norm_row::<F16>(r_src, r_copy, weight, out, base, norm, dtype.vec()),
                DType::F32 => rms_norm_row::<F32>(r_src, r_copy, weight, out, base, norm, dtype.vec()),
            }
        }
    }
}

/// One element rounded to `E` and back.
fn round<E: Element>(v: f32) -> f32 {
    let mut cell = [0u8; 4];
    // SAFETY: `cell` holds one element of any type.
    unsafe {
        E::store(cell.as_mut_ptr(), 0, v);
        E::load(cell.as_ptr(), 0)
    }
}

unsafe fn add_residual_as<E: Element>(srcs: &[*const u8], residual: *const u8, r_dst: *mut u8, lo: usize, hi: usize) {
    for i in lo..hi {
        // SAFETY: forwarded contract.
        unsafe {
            let sum = srcs.iter().skip(1).fold(E::load(srcs[0], i), |acc, &p| acc + E::load(p, i));
            E::store(r_dst, i, round::<E>(sum) + E::load(residual, i));
        }
    }
}

unsafe fn rms_norm_row<E: Element>(
    r_src: *const u8,
    r_copy: Option<*mut u8>,
    weight: *const u8,
    out: *mut u8,
    base: usize,
    &AddRmsNorm { hidden, eps, .. }: &AddRmsNorm,
    vec: usize,
) {
    let mut lanes = [0f32; NORM_LANES];
    for j in 0..hidden {
        // SAFETY: forwarded contract.
        let v = unsafe { E::load(r_src, base + j) };
        if let Some(dst) = r_copy {
            // SAFETY: forwarded contract.
            unsafe { E::store(dst, base + j, v) };
        }
        let lane = (j / vec) % NORM_LANES;
        lanes[lane] = v.mul_add(v, lanes[lane]);
    }
    let mut s = NORM_LANES / 2;
    while s > 0 {
        for l in 0..s {
            lanes[l] += lanes[l + s];
        }
        s /= 2;
    }
    let inv = 1.0 / (lanes[0] / hidden as f32 + eps).sqrt();
    let rows = r_copy.map_or(r_src, |p| p as *const u8);
    for j in 0..hidden {
        // SAFETY: forwarded contract.
        unsafe { E::store(out, base + j, E::load(rows, base + j) * inv * E::load(weight, j)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu::DevicePtr;

    #[test]
    fn a_row_is_normalised_against_a_float64_reference() {
        let (hidden, rows) = (300, 3);
        let x: Vec<f32> = (0..hidden * rows).map(|i| ((i * 37 % 101) as f32 - 50.0) / 16.0).collect();
        let res: Vec<f32> = (0..hidden * rows).map(|i| ((i * 13 % 29) as f32 - 14.0) / 8.0).collect();
        let w: Vec<f32> = (0..hidden).map(|j| 0.5 + (j % 7) as f32 / 8.0).collect();
        let (xb, mut rb, wb) = (DType::F32.encode(&x), DType::F32.encode(&res), DType::F32.encode(&w));
        let mut out = vec![0u8; xb.len()];
        let norm = AddRmsNorm {
            residual: DevicePtr(rb.as_ptr() as u64),
            weight: DevicePtr(wb.as_ptr() as u64),
            hidden,
            eps: 1e-5,
        };
        // SAFETY: every buffer holds rows * hidden f32 (the weight hidden).
        unsafe {
            add_residual(DType::F32, &[xb.as_ptr(), xb.as_ptr()], rb.as_ptr(), rb.as_mut_ptr(), hidden, (0, rows));
            rms_norm(DType::F32, rb.as_ptr(), None, out.as_mut_ptr(), &norm, (0, rows));
        }
        let (r, y) = (DType::F32.decode(&rb), DType::F32.decode(&out));
        for row in 0..rows {
            let span = row * hidden..(row + 1) * hidden;
            let r64: Vec<f64> = span.clone().map(|i| 2.0 * x[i] as f64 + res[i] as f64).collect();
            let inv = 1.0 / (r64.iter().map(|v| v * v).sum::<f64>() / hidden as f64 + 1e-5).sqrt();
            for (k, i) in span.enumerate() {
                assert!((r[i] - r64[k]).abs() <= 1e-6 * r64[k].abs().max(1.0), "r[{i}]");
                let want = r64[k] * inv * w[k % hidden] as f64;
                assert!((y[i] - want).abs() <= 1e-5 * want.abs().max(1.0), "y[{i}] {} vs {want}", y[i]);
            }
        }
    }
}
