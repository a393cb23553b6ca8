//! Result checks: fresh random inputs per check (like torch.rand: uniform in [0, 1), rounded to the dtype), an
//! output poisoned with NaN before the run, a float64 reference computed from every rank's input, a per-element
//! bound, and bitwise equality of the allreduce result across ranks.

use collective_core::{DType, Op};
use gpu::{DeviceBuffer, DevicePtr, Gpu, HostLaunch, Kernel, KernelFault, KernelLibrary, LaunchDims, MemKind, Stream};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

/// Byte the output is filled with before a checked run: 0xFFFF is a NaN in bf16 and fp16, 0xFFFFFFFF in fp32.
pub const POISON: u8 = 0xFF;

/// Rank `rank`'s input for the check seeded `seed`, as f32 values already rounded to `dtype`.
pub fn input_values(seed: u64, rank: usize, count: usize, dtype: DType) -> Vec<f32> {
    let mut rng = SmallRng::seed_from_u64(seed ^ (rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let raw: Vec<f32> = (0..count).map(|_| rng.random::<f32>()).collect();
    dtype.decode(&dtype.encode(&raw)).into_iter().map(|v| v as f32).collect()
}

/// Elements `[lo, hi)` of the sum of every rank's input, in float64.
pub fn reference(seed: u64, world: usize, count: usize, dtype: DType, lo: usize, hi: usize) -> Vec<f64> {
    let mut sum = vec![0f64; hi - lo];
    for r in 0..world {
        let x = input_values(seed, r, count, dtype);
        sum.iter_mut().zip(&x[lo..hi]).for_each(|(s, &v)| *s += v as f64);
    }
    sum
}

/// Largest error allowed relative to |reference|: half an ulp of the output type plus f32 accumulation; with
/// `rounds_every_add`, half an ulp per add (the inputs are non-negative, so no partial sum exceeds the total).
pub fn tolerance(dtype: DType, world: usize, rounds_every_add: bool) -> f64 {
    let half_ulp = match dtype {
        DType::Bf16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        DType::F32 => 2f64.powi(-24),
    };
    let roundings = if rounds_every_add { world.saturating_sub(1).max(1) } else { 1 };
    roundings as f64 * half_ulp + world as f64 * 2f64.powi(-23)
}

/// One rank's verdict on one run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Verdict {
    /// Elements outside the bound (NaN counts).
    pub wrong: usize,
    pub max_rel_err: f64,
    /// Index of the first wrong element, for the message.
    pub first_wrong: Option<usize>,
}

/// Compares `out` (decoded) with `reference`.
pub fn compare(out: &[f64], reference: &[f64], tol: f64) -> Verdict {
    let (mut wrong, mut max_rel, mut first) = (0, 0f64, None);
    for (i, (&o, &r)) in out.iter().zip(reference).enumerate() {
        let err = (o - r).abs();
        let rel = if r != 0.0 { err / r.abs() } else { err };
        if err.is_nan() || err > tol * r.abs() + 1e-30 {
            wrong += 1;
            first.get_or_insert(i);
        }
        if rel.is_nan() {
            max_rel = f64::INFINITY;
        } else {
            max_rel = max_rel.max(rel);
        }
    }
    Verdict { wrong, max_rel_err: max_rel, first_wrong: first }
}

/// Which part of the reference a rank's output holds.
pub fn output_range(op: Op, count: usize, world: usize, rank: usize) -> (usize, usize) {
    match op {
        Op::AllReduce => (0, count),
        Op::ReduceScatter => {
            let shard = count / world;
            (rank * shard, (rank + 1) * shard)
        }
    }
}

/// FNV-1a over the output bytes: ranks compare these to prove bitwise-identical results.
pub fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Input variants for checks of consecutive calls: rank `rank`'s element `i` of variant `k` is a small integer (at
/// most 16), so every sum over up to 8 ranks is exact in every dtype, and consecutive variants differ at every
/// element, so a call that read a peer's previous (or previous same-parity) call gets a different sum.
pub fn variant_value(rank: usize, i: usize, k: u64) -> f32 {
    ((i * 7 + rank * 13 + (k % 17) as usize * 5) % 17) as f32
}

/// Rank `rank`'s input of variant `k`, encoded.
pub fn variant_input(rank: usize, count: usize, k: u64, dtype: DType) -> Vec<u8> {
    dtype.encode(&(0..count).map(|i| variant_value(rank, i, k)).collect::<Vec<_>>())
}

/// Elements `[lo, hi)` of the sum of every rank's variant `k`, exact.
pub fn variant_sum(world: usize, lo: usize, hi: usize, k: u64) -> Vec<f64> {
    (lo..hi).map(|i| (0..world).map(|r| variant_value(r, i, k) as f64).sum()).collect()
}

/// What [`Checksum::fold`] adds for an output holding [`variant_sum`]`(world, lo, hi, k)`.
pub fn variant_checksum(world: usize, lo: usize, hi: usize, k: u64) -> u64 {
    variant_sum(world, lo, hi, k).iter().enumerate().map(|(j, &v)| v as u64 * (j as u64 % 7 + 1)).sum()
}

static CHECK_LIBRARY: KernelLibrary = KernelLibrary {
    name: "check",
    source: include_str!("../../../kernels/check.cu"),
    headers: collective_core::KERNEL_HEADERS,
    host: &[("arx_fold_bf16", fold_bf16), ("arx_fold_fp16", fold_fp16), ("arx_fold_fp32", fold_fp32)],
};

/// `FoldParams` of `kernels/check.cu`.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct FoldParams {
    data: u64,
    count: u64,
    sums: u64,
}

const FOLD_BLOCKS: usize = 32;
const FOLD_THREADS: u32 = 256;

fn fold_bf16(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    fold_host(l, DType::Bf16)
}
fn fold_fp16(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    fold_host(l, DType::F16)
}
fn fold_fp32(l: &HostLaunch<'_>) -> Result<(), KernelFault> {
    fold_host(l, DType::F32)
}

/// The host twin of `arx_fold`: the same per-element terms, all added to block 0's word (only the total is read).
fn fold_host(l: &HostLaunch<'_>, dtype: DType) -> Result<(), KernelFault> {
    let p: FoldParams = l.params()?;
    // SAFETY: the launch's contract: `data` holds `count` elements, `sums` FOLD_BLOCKS words of this rank's.
    let bytes = unsafe { std::slice::from_raw_parts(p.data as *const u8, p.count as usize * dtype.size()) };
    let total: u64 = dtype
        .decode(bytes)
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let x = if (0.0..4294967296.0).contains(&v) { v as u64 } else { ((v as f32).to_bits() as u64) << 20 };
            x.wrapping_mul(i as u64 % 7 + 1)
        })
        .fold(0u64, u64::wrapping_add);
    // SAFETY: as above.
    unsafe { *(p.sums as *mut u64) = (*(p.sums as *mut u64)).wrapping_add(total) };
    Ok(())
}

/// A device-side checksum of outputs: each call's output folded in by a small kernel on the same stream (so it
/// works inside a graph capture too), the total read once at the end.
pub struct Checksum {
    sums: DeviceBuffer,
    kernels: Vec<Kernel>,
}

impl Checksum {
    pub fn new(gpu: &Gpu) -> Result<Checksum, crate::Error> {
        let module = gpu.load(&CHECK_LIBRARY)?;
        let kernels = DType::ALL.iter().map(|d| module.kernel(&format!("arx_fold_{d}"))).collect::<Result<_, _>>()?;
        Ok(Checksum { sums: gpu.alloc(FOLD_BLOCKS * 8, MemKind::Device)?, kernels })
    }

    /// Sets the total to zero.
    pub fn reset(&self, stream: &Stream) -> Result<(), crate::Error> {
        Ok(stream.fill(&self.sums, 0)?)
    }

    /// Enqueues the fold of the first `count` elements of `buf` into the total.
    pub fn fold(&self, stream: &Stream, buf: &DeviceBuffer, count: usize, dtype: DType) -> Result<(), crate::Error> {
        if count * dtype.size() > buf.bytes() {
            return Err(crate::Error::BadArgs(format!("fold of {count} {dtype} overruns {} bytes", buf.bytes())));
        }
        // SAFETY: `buf` holds `count` elements (checked), live while borrowed.
        unsafe { self.fold_at(stream, buf.ptr(), count, dtype) }
    }

    /// Enqueues the fold of `count` elements at `data`.
    ///
    /// # Safety
    /// `data` is device memory of this stream's driver holding `count` elements of `dtype`, live until the stream
    /// has run the fold.
    pub unsafe fn fold_at(
        &self,
        stream: &Stream,
        data: DevicePtr,
        count: usize,
        dtype: DType,
    ) -> Result<(), crate::Error> {
        let params = FoldParams { data: data.0, count: count as u64, sums: self.sums.ptr().0 };
        let dims = LaunchDims { grid: FOLD_BLOCKS as u32, block: FOLD_THREADS, shared_bytes: 0 };
        let d = DType::ALL.iter().position(|&t| t == dtype).expect("every dtype is in ALL");
        // SAFETY: the caller's contract for `data`; `sums` is FOLD_BLOCKS words of ours.
        unsafe { stream.launch(&self.kernels[d], dims, &params)? };
        Ok(())
    }

    /// The total so far (waits for the stream).
    pub fn total(&self, stream: &Stream) -> Result<u64, crate::Error> {
        let mut words = vec![0u8; FOLD_BLOCKS * 8];
        stream.download(&self.sums, 0, &mut words)?;
        Ok(words.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))).fold(0, u64::wrapping_add))
    }
}

/// Every rank's verdict on its output `out` against `want` within `tol` (and, with `bitwise`, the same bits as
/// rank 0's), gathered so all ranks agree; `None` when all passed, else what failed, named by rank. Collective.
pub fn agree_verdict(
    rdv: &ipc::Rendezvous,
    out: &[u8],
    dtype: DType,
    want: &[f64],
    tol: f64,
    bitwise: bool,
    when: &str,
) -> Result<Option<String>, crate::Error> {
    let v = compare(&dtype.decode(out), want, tol);
    let mut blob = (v.wrong as u64).to_le_bytes().to_vec();
    blob.extend(fingerprint(out).to_le_bytes());
    blob.extend(v.max_rel_err.to_le_bytes());
    blob.extend((v.first_wrong.map_or(u64::MAX, |i| i as u64)).to_le_bytes());
    let all = rdv.all_gather(&format!("check {when}"), &blob)?;
    let field = |r: &[u8], k: usize| u64::from_le_bytes(r[8 * k..8 * k + 8].try_into().expect("8-byte fields"));
    for (r, blob) in all.iter().enumerate() {
        let wrong = field(blob, 0);
        if wrong > 0 {
            return Ok(Some(format!(
                "{when}: rank {r} has {wrong} wrong element(s), first at output index {}, max rel err {:.3e}",
                field(blob, 3),
                f64::from_bits(field(blob, 2))
            )));
        }
    }
    if let Some(r) = all.iter().position(|blob| bitwise && field(blob, 1) != field(&all[0], 1)) {
        return Ok(Some(format!("{when}: rank {r}'s result differs bitwise from rank 0's")));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_fresh_per_seed_and_rank_and_exact_in_dtype() {
        let a = input_values(1, 0, 64, DType::Bf16);
        assert_ne!(a, input_values(2, 0, 64, DType::Bf16));
        assert_ne!(a, input_values(1, 1, 64, DType::Bf16));
        assert!(a.iter().all(|&v| (0.0..1.0).contains(&v)));
        let enc = DType::Bf16.encode(&a);
        assert_eq!(DType::Bf16.decode(&enc), a.iter().map(|&v| v as f64).collect::<Vec<_>>());
    }

    #[test]
    fn compare_catches_missing_peer_nan_and_passes_rounding() {
        let (seed, world, n) = (7, 4, 1000);
        let r = reference(seed, world, n, DType::Bf16, 0, n);
        let rounded: Vec<f64> =
            DType::Bf16.decode(&DType::Bf16.encode(&r.iter().map(|&v| v as f32).collect::<Vec<_>>()));
        let tol = tolerance(DType::Bf16, world, false);
        assert_eq!(compare(&rounded, &r, tol).wrong, 0);
        let missing = reference(seed, world - 1, n, DType::Bf16, 0, n);
        assert!(compare(&missing, &r, tol).wrong > n / 2);
        let mut nan = rounded.clone();
        nan[3] = f64::NAN;
        let v = compare(&nan, &r, tol);
        assert_eq!((v.wrong, v.first_wrong), (1, Some(3)));
        let mut off = rounded;
        off[999] *= 1.01;
        assert_eq!(compare(&off, &r, tol).first_wrong, Some(999));
    }

    #[test]
    fn rounding_every_add_gets_its_own_bound_and_still_catches_a_missing_peer() {
        let (seed, world, n) = (11, 8, 4000);
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| input_values(seed, r, n, DType::Bf16)).collect();
        let round = |v: f32| DType::Bf16.decode(&DType::Bf16.encode(&[v]))[0] as f32;
        let out: Vec<f64> =
            (0..n).map(|i| inputs[1..].iter().fold(inputs[0][i], |acc, x| round(acc + x[i])) as f64).collect();
        let r = reference(seed, world, n, DType::Bf16, 0, n);
        assert_eq!(compare(&out, &r, tolerance(DType::Bf16, world, true)).wrong, 0);
        assert!(compare(&out, &r, tolerance(DType::Bf16, world, false)).wrong > 0, "the f32 bound is tighter");
        let missing = reference(seed, world - 1, n, DType::Bf16, 0, n);
        assert!(compare(&missing, &r, tolerance(DType::Bf16, world, true)).wrong > n / 2);
    }

    #[test]
    fn variants_are_exact_and_differ_call_to_call() {
        for k in 0..4u64 {
            for i in 0..200 {
                assert_ne!(variant_value(1, i, k), variant_value(1, i, k + 1), "k {k} i {i}");
                assert_ne!(variant_value(1, i, k), variant_value(1, i, k + 2), "k {k} i {i}");
            }
        }
        let n = 4099;
        let x = DType::Bf16.decode(&variant_input(3, n, 2, DType::Bf16));
        assert!(x.iter().enumerate().all(|(i, &v)| v == variant_value(3, i, 2) as f64));
        // Element 0: 0 + 13, weight 1; element 1: 7 + (7 + 13) % 17 = 10, weight 2.
        assert_eq!(variant_checksum(2, 0, 2, 0), 13 + 2 * 10);
    }

    #[test]
    fn the_checksum_kernel_folds_what_the_host_predicts_and_sees_one_wrong_element() {
        let opts = gpu::DriverOptions { device: None, local_rank: None, shm_prefix: String::new() };
        let gpu = gpu::open(gpu::Backend::Host, &opts).unwrap().gpu;
        let stream = gpu.stream().unwrap();
        let c = Checksum::new(&gpu).unwrap();
        for dtype in DType::ALL {
            let (world, n) = (3, 5000);
            let want: Vec<f32> = variant_sum(world, 0, n, 1).iter().map(|&v| v as f32).collect();
            let buf = gpu.alloc(n * dtype.size(), MemKind::Device).unwrap();
            stream.upload(&buf, 0, &dtype.encode(&want)).unwrap();
            c.reset(&stream).unwrap();
            c.fold(&stream, &buf, n, dtype).unwrap();
            c.fold(&stream, &buf, n, dtype).unwrap();
            assert_eq!(c.total(&stream).unwrap(), 2 * variant_checksum(world, 0, n, 1));
            let mut off = want.clone();
            off[4321] += 1.0;
            stream.upload(&buf, 0, &dtype.encode(&off)).unwrap();
            c.reset(&stream).unwrap();
            c.fold(&stream, &buf, n, dtype).unwrap();
            assert_ne!(c.total(&stream).unwrap(), variant_checksum(world, 0, n, 1));
            assert!(c.fold(&stream, &buf, n + 1, dtype).is_err());
        }
    }

    #[test]
    fn reduce_scatter_ranges_tile_the_input() {
        assert_eq!(output_range(Op::ReduceScatter, 12, 3, 2), (8, 12));
        assert_eq!(output_range(Op::AllReduce, 12, 3, 2), (0, 12));
        assert_ne!(fingerprint(b"ab"), fingerprint(b"ba"));
    }
}
