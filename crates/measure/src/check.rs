//! Result checks: fresh random inputs per check (like torch.rand: uniform in [0, 1), rounded to the dtype), an
//! output poisoned with NaN before the run, a float64 reference computed from every rank's input, a per-element
//! bound (none for all-gather, which only moves elements), and bitwise equality across ranks of a result every rank
//! holds whole (allreduce, all-gather).

use collective_core::{AddRmsNorm, DType, Op};
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

/// The float64 reference of an allreduce followed by the residual add and RMSNorm (`collective_core::AddRmsNorm`):
/// `r = sum + residual`, `y = r / sqrt(mean(r^2 over the row) + eps) * weight`, rows of `weight.len()` elements.
pub fn add_rms_norm_reference(sum: &[f64], residual: &[f32], weight: &[f32], eps: f32) -> (Vec<f64>, Vec<f64>) {
    let r: Vec<f64> = sum.iter().zip(residual).map(|(&s, &x)| s + x as f64).collect();
    let mut y = Vec::with_capacity(r.len());
    for row in r.chunks(weight.len()) {
        let mean = row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64;
        let inv = 1.0 / (mean + eps as f64).sqrt();
        y.extend(row.iter().zip(weight).map(|(&v, &w)| v * inv * w as f64));
    }
    (r, y)
}

/// The bound of [`add_rms_norm_reference`]'s results relative to |reference| for non-negative inputs (no
/// cancellation): `r` is rounded twice (the sum, then with the residual), `y` carries r's error through the mean
/// and the product, then its own rounding.
pub fn add_rms_norm_tolerance(dtype: DType, world: usize) -> f64 {
    6.0 * tolerance(dtype, world + 1, false)
}

/// A norm call's own inputs beside every rank's `input_values(seed, rank, ..)`, the same on every rank, and the
/// float64 reference of its results.
pub struct NormCase {
    /// The residual (the values a rank `world` would hold), rounded to the dtype.
    pub residual: Vec<f32>,
    /// `hidden` weights near 1, as a model's (near 0, y would fall among fp16's subnormals), rounded to the dtype.
    pub weight: Vec<f32>,
    pub want_r: Vec<f64>,
    pub want_y: Vec<f64>,
    /// The bits of r and y that the host twin (`collective_core::norm`) gives on the same inputs: every design on
    /// every driver must give these, so a kernel whose order drifts from the canonical one is caught on the GPU too.
    pub twin_r: Vec<u8>,
    pub twin_y: Vec<u8>,
}

impl NormCase {
    pub fn new(seed: u64, world: usize, count: usize, hidden: usize, dtype: DType, eps: f32) -> NormCase {
        let residual = input_values(seed, world, count, dtype);
        let weight: Vec<f32> = input_values(seed, world + 1, hidden, dtype).iter().map(|v| v + 0.5).collect();
        let weight = dtype.decode(&dtype.encode(&weight)).into_iter().map(|v| v as f32).collect::<Vec<f32>>();
        let sum = reference(seed, world, count, dtype, 0, count);
        let (want_r, want_y) = add_rms_norm_reference(&sum, &residual, &weight, eps);
        let (twin_r, twin_y) = twin_bits(seed, world, dtype, &residual, &weight, eps);
        NormCase { residual, weight, want_r, want_y, twin_r, twin_y }
    }

    /// Where `r` and `y` (one call's results, encoded) differ from the host twin's bits, if they do.
    pub fn twin_difference(&self, dtype: DType, r: &[u8], y: &[u8]) -> Option<String> {
        [("r", r, &self.twin_r), ("y", y, &self.twin_y)].into_iter().find_map(|(part, got, want)| {
            let (i, got, want) = first_difference(dtype, got, want)?;
            Some(format!(
                "{part}[{i}] is {got:e} where the host twin's canonical order gives {want:e} (the kernels' norm order \
                 differs from collective_core::norm's)"
            ))
        })
    }
}

/// The first element at which `got` and `want` (encoded `dtype`) differ in their bits, and both values there.
pub fn first_difference(dtype: DType, got: &[u8], want: &[u8]) -> Option<(usize, f64, f64)> {
    let n = dtype.size();
    let i = got.chunks(n).zip(want.chunks(n)).position(|(g, w)| g != w)?;
    Some((i, dtype.decode(&got[i * n..][..n])[0], dtype.decode(&want[i * n..][..n])[0]))
}

/// r and y of the call [`NormCase::new`] describes, encoded, as the host twin computes them from every rank's input.
fn twin_bits(seed: u64, world: usize, dtype: DType, residual: &[f32], weight: &[f32], eps: f32) -> (Vec<u8>, Vec<u8>) {
    let (count, hidden) = (residual.len(), weight.len());
    let inputs: Vec<Vec<u8>> = (0..world).map(|r| dtype.encode(&input_values(seed, r, count, dtype))).collect();
    let srcs: Vec<*const u8> = inputs.iter().map(|x| x.as_ptr()).collect();
    let (mut r, w, mut y) = (dtype.encode(residual), dtype.encode(weight), vec![0u8; count * dtype.size()]);
    let norm = AddRmsNorm {
        residual: gpu::DevicePtr(r.as_mut_ptr() as u64),
        weight: gpu::DevicePtr(w.as_ptr() as u64),
        hidden,
        eps,
    };
    // SAFETY: every input, r and y hold `count` elements of `dtype`, the weight `hidden`; y overlaps nothing.
    unsafe { collective_core::norm::add_rms_norm(dtype, &srcs, &norm, y.as_mut_ptr(), (0, count / hidden)) };
    (r, y)
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

/// Which elements of the inputs a rank's output is made of: summed, or for all-gather, those of every rank.
pub fn output_range(op: Op, count: usize, world: usize, rank: usize) -> (usize, usize) {
    match op {
        Op::AllReduce | Op::AllGather => (0, count),
        Op::ReduceScatter => {
            let shard = count / world;
            (rank * shard, (rank + 1) * shard)
        }
    }
}

/// What a rank's output must hold after one checked call: its values in float64, the bound [`compare`] holds them
/// to, and whether every rank's output must have the same bits (not a reduce-scatter's, whose ranks hold different
/// shards).
#[derive(Clone, Debug, PartialEq)]
pub struct Expected {
    pub values: Vec<f64>,
    pub tol: f64,
    pub bitwise: bool,
}

impl Expected {
    /// Rank `rank`'s output of `op` on the inputs of the check seeded `seed`: its part of the sum of every rank's
    /// input, within [`tolerance`], or for all-gather every rank's input in rank order, exact.
    pub fn seeded(
        op: Op,
        seed: u64,
        world: usize,
        count: usize,
        dtype: DType,
        rank: usize,
        rounds_every_add: bool,
    ) -> Expected {
        let (lo, hi) = output_range(op, count, world, rank);
        let (values, tol) = match op {
            Op::AllGather => {
                let all = (0..world).flat_map(|r| input_values(seed, r, count, dtype)).map(f64::from).collect();
                (all, 0.0)
            }
            _ => (reference(seed, world, count, dtype, lo, hi), tolerance(dtype, world, rounds_every_add)),
        };
        Expected { values, tol, bitwise: op != Op::ReduceScatter }
    }

    /// Rank `rank`'s output of `op` on every rank's input variant `k` ([`variant_input`]): exact for every op.
    pub fn variant(op: Op, world: usize, count: usize, rank: usize, k: u64) -> Expected {
        let (lo, hi) = output_range(op, count, world, rank);
        let values = match op {
            Op::AllGather => (0..world).flat_map(|r| (lo..hi).map(move |i| variant_value(r, i, k) as f64)).collect(),
            _ => variant_sum(world, lo, hi, k),
        };
        Expected { values, tol: 0.0, bitwise: op != Op::ReduceScatter }
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

/// What comm-bench's device-side checksum adds for an output holding `values` (whole numbers, as every
/// [`Expected::variant`]'s are).
pub fn checksum(values: &[f64]) -> u64 {
    values.iter().enumerate().map(|(j, &v)| v as u64 * (j as u64 % 7 + 1)).sum()
}

/// A fresh random seed every rank shares (rank 0 draws it).
pub fn agree_seed(rdv: &ipc::Rendezvous) -> Result<u64, ipc::IpcError> {
    let got = rdv.broadcast("seed", 0, &rand::random::<u64>().to_le_bytes())?;
    Ok(u64::from_le_bytes(got.try_into().map_err(|_| ipc::IpcError::BadArgs("malformed seed".into()))?))
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
) -> Result<Option<String>, ipc::IpcError> {
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
    fn the_host_twins_norm_bits_are_within_the_bound_and_an_order_that_drifts_from_them_is_named() {
        let (world, hidden, rows, eps) = (3, 4096, 4, 1e-5);
        let seed = rand::random::<u64>();
        let case = NormCase::new(seed, world, rows * hidden, hidden, DType::F32, eps);
        let tol = add_rms_norm_tolerance(DType::F32, world);
        let (r, y) = (DType::F32.decode(&case.twin_r), DType::F32.decode(&case.twin_y));
        assert_eq!(compare(&r, &case.want_r, tol).wrong, 0, "seed {seed}");
        assert_eq!(compare(&y, &case.want_y, tol).wrong, 0, "seed {seed}");
        assert_eq!(case.twin_difference(DType::F32, &case.twin_r, &case.twin_y), None);
        // One element off by an ulp is named.
        let mut off = case.twin_y.clone();
        off[4 * 77] ^= 1;
        let said = case.twin_difference(DType::F32, &case.twin_r, &off).expect("an ulp off");
        assert!(said.starts_with("y[77] is"), "{said}");
        // A norm within the bound but of another order (the squares summed in one chain) is caught.
        let drifted: Vec<f32> = r
            .chunks(hidden)
            .flat_map(|row| {
                let squares = row.iter().fold(0f32, |acc, &v| (v as f32).mul_add(v as f32, acc));
                let inv = 1.0 / (squares / hidden as f32 + eps).sqrt();
                row.iter().zip(&case.weight).map(move |(&v, &w)| v as f32 * inv * w).collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(compare(&DType::F32.decode(&DType::F32.encode(&drifted)), &case.want_y, tol).wrong, 0);
        let said = case.twin_difference(DType::F32, &case.twin_r, &DType::F32.encode(&drifted));
        assert!(said.is_some_and(|s| s.starts_with("y[")), "seed {seed}: one chain gave the canonical bits");
    }

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
        assert_eq!(checksum(&variant_sum(2, 0, 2, 0)), 13 + 2 * 10);
    }

    #[test]
    fn reduce_scatter_ranges_tile_the_input() {
        assert_eq!(output_range(Op::ReduceScatter, 12, 3, 2), (8, 12));
        assert_eq!(output_range(Op::AllReduce, 12, 3, 2), (0, 12));
        assert_ne!(fingerprint(b"ab"), fingerprint(b"ba"));
    }

    /// All-gather's expected output is every rank's input in rank order, exact and the same on every rank; a gather
    /// that put one rank's input in another's slot is wrong from that slot on.
    #[test]
    fn all_gather_expects_every_input_in_rank_order_exactly() {
        let (seed, world, n) = (5, 3, 100);
        let want = Expected::seeded(Op::AllGather, seed, world, n, DType::Bf16, 1, false);
        assert_eq!((want.values.len(), want.tol, want.bitwise), (world * n, 0.0, true));
        let inputs: Vec<Vec<f64>> =
            (0..world).map(|r| input_values(seed, r, n, DType::Bf16).into_iter().map(f64::from).collect()).collect();
        assert_eq!(want.values, inputs.concat());
        assert_eq!(want, Expected::seeded(Op::AllGather, seed, world, n, DType::Bf16, 2, false), "every rank's");
        assert_eq!(compare(&inputs.concat(), &want.values, want.tol).wrong, 0);
        let rotated = [&inputs[1][..], &inputs[2][..], &inputs[0][..]].concat();
        assert_eq!(compare(&rotated, &want.values, want.tol).first_wrong, Some(0));
        let mut one_off = inputs.concat();
        one_off[n + 7] = DType::Bf16.decode(&DType::Bf16.encode(&[one_off[n + 7] as f32 * 1.01]))[0];
        assert_eq!(
            compare(&one_off, &want.values, want.tol).first_wrong,
            Some(n + 7),
            "exact: any difference is wrong"
        );
        let v = Expected::variant(Op::AllGather, world, n, 0, 2);
        assert_eq!(v.values[n + 4], variant_value(1, 4, 2) as f64);
        let rs = Expected::variant(Op::ReduceScatter, world, 3 * n, 1, 2);
        assert_eq!((rs.values, rs.bitwise), (variant_sum(world, n, 2 * n, 2), false));
    }
}
