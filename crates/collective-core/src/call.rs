//! One call's arguments, checked once where a request enters ([`Call::new`]) and taken as they are by everything
//! below: the communicator's call path, the engine, every [`crate::Collective`] and the kernels' launch.

use crate::{DType, Op, VEC_BYTES};
use gpu::DevicePtr;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Where a call's buffers live, which decides whether a design that reads its peers' buffers in place must copy
/// the input in first: the tune tables are kept per residency, since the best design on one residency is not the
/// best on another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Residency {
    /// The caller's own memory, which no peer has mapped.
    Caller,
    /// The communicator's registered buffers.
    Registered,
    /// Caller memory every peer has mapped: registered by the caller, or a graph capture's buffers registered when
    /// the capture ends.
    CallerRegistered,
}

impl Residency {
    pub const ALL: [Residency; 3] = [Residency::Caller, Residency::Registered, Residency::CallerRegistered];

    pub fn name(self) -> &'static str {
        match self {
            Residency::Caller => "caller",
            Residency::Registered => "registered",
            Residency::CallerRegistered => "caller_registered",
        }
    }

    pub fn from_name(name: &str) -> Option<Residency> {
        Residency::ALL.into_iter().find(|r| r.name() == name)
    }
}

impl fmt::Display for Residency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Residency {
    type Err = UnknownResidency;

    fn from_str(name: &str) -> Result<Residency, UnknownResidency> {
        Residency::from_name(name).ok_or_else(|| UnknownResidency(name.to_string()))
    }
}

/// A name that is no [`Residency`]'s: one message, listing the names there are, for every front end that parses one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownResidency(pub String);

impl fmt::Display for UnknownResidency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = Residency::ALL.map(Residency::name).join(", ");
        write!(f, "residency {:?}: expected one of {names}", self.0)
    }
}

impl std::error::Error for UnknownResidency {}

/// Why a call was refused before anything was enqueued; every field is data, for callers that map them.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CallError {
    #[error("count must be at least 1")]
    Empty,
    #[error("{count} elements of {dtype} overflow the address space")]
    Overflow { count: usize, dtype: DType },
    #[error("{bytes} bytes exceed the communicator's capacity_bytes={capacity}")]
    TooLarge { bytes: usize, capacity: usize },
    #[error("{what} pointer {ptr:#x} is not aligned to {align} bytes, which the kernels load at once")]
    Misaligned { what: &'static str, ptr: u64, align: usize },
    #[error("reduce_scatter needs a count that divides among {world} ranks: {count} elements do not")]
    Indivisible { count: usize, world: usize },
    #[error(
        "output {output:#x} (+{out_bytes} bytes) overlaps input {input:#x} (+{bytes}){}",
        if *op == Op::AllReduce {
            " without being the same buffer".into()
        } else {
            format!(": {op} needs disjoint buffers")
        }
    )]
    Overlap { input: u64, bytes: usize, output: u64, out_bytes: usize, op: Op },
    #[error("this call was checked for {checked_world} ranks and {checked_capacity} bytes, not for this communicator")]
    Foreign { checked_world: usize, checked_capacity: usize },
    #[error("a bias is added to an allreduce's sum; {op} takes none")]
    BiasNotAllReduce { op: Op },
    #[error(
        "bias {bias:#x} (+{bytes} bytes) overlaps the output {output:#x}: the sum is written while the bias is read"
    )]
    BiasOverlap { bias: u64, output: u64, bytes: usize },
    #[error("the residual add and RMSNorm follow an allreduce without a bias; this call is {op}{}",
        if *bias { " with a bias" } else { "" })]
    NormNotPlainAllReduce { op: Op, bias: bool },
    #[error("rows of {hidden} elements: {count} elements are not a whole number of rows{}",
        if *hidden > MAX_HIDDEN { format!(", and a row holds at most {MAX_HIDDEN}") } else { String::new() })]
    NormRows { count: usize, hidden: usize },
    #[error("eps must be positive and finite, not {eps}")]
    NormEps { eps: f32 },
    #[error(
        "a {op} split along the last dimension takes rows of {row_len} elements that divide among {world} ranks, \
         {count} elements in all"
    )]
    SplitLastDim { op: Op, count: usize, row_len: usize, world: usize },
    #[error("{what} {ptr:#x} (+{bytes} bytes) overlaps the {other} {other_ptr:#x}: the norm writes one while it reads the other")]
    NormOverlap { what: &'static str, ptr: u64, bytes: usize, other: &'static str, other_ptr: u64 },
}

/// The most elements of one row of the fused residual add and RMSNorm: a row's sum of squares is one block's.
pub const MAX_HIDDEN: usize = 1 << 16;

/// The epilogue of an allreduce that serving stacks fuse after it (FlashInfer's and AITER's allreduce + RMSNorm):
/// `r = residual + sum`, written back to `residual`, then `y = r / sqrt(mean(r^2 over the row) + eps) * weight`
/// into the call's output. Rows are `hidden` elements of the call's dtype; `weight` holds `hidden`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AddRmsNorm {
    pub residual: DevicePtr,
    pub weight: DevicePtr,
    pub hidden: usize,
    pub eps: f32,
}

impl AddRmsNorm {
    /// Rows in a call of `count` elements.
    pub fn rows(&self, count: usize) -> usize {
        count / self.hidden
    }
}

/// A checked call: `count` elements of `dtype` at `input`, the result ([`Op::output_count`] elements) at `output`,
/// for `world` ranks and input buffers of `capacity` bytes. Only [`Call::new`] makes one, so holding a `Call` means
/// every rule held: at least one element, an input within the capacity, 16-byte aligned, a reduce-scatter's count
/// divisible by the world size, input and output identical (an in-place allreduce) or disjoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Call {
    op: Op,
    dtype: DType,
    count: usize,
    input: DevicePtr,
    output: DevicePtr,
    world: usize,
    capacity: usize,
    residency: Residency,
    bias: Option<DevicePtr>,
    norm: Option<AddRmsNorm>,
    /// A reduce-scatter split along the last dimension: the row length.
    last_dim: Option<usize>,
}

impl Call {
    /// Checks a request, in the order a caller most needs to hear about it.
    pub fn new(
        op: Op,
        dtype: DType,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        world: usize,
        capacity: usize,
    ) -> Result<Call, CallError> {
        if count == 0 {
            return Err(CallError::Empty);
        }
        let bytes = count.checked_mul(dtype.size()).ok_or(CallError::Overflow { count, dtype })?;
        if bytes > capacity {
            return Err(CallError::TooLarge { bytes, capacity });
        }
        for (what, p) in [("input", input), ("output", output)] {
            if !p.0.is_multiple_of(VEC_BYTES as u64) {
                return Err(CallError::Misaligned { what, ptr: p.0, align: VEC_BYTES });
            }
        }
        if op == Op::ReduceScatter && !count.is_multiple_of(world) {
            return Err(CallError::Indivisible { count, world });
        }
        let out_bytes =
            op.output_count(count, world).checked_mul(dtype.size()).ok_or(CallError::Overflow { count, dtype })?;
        let (i, o) = (input.0, output.0);
        let overlap = i < o.saturating_add(out_bytes as u64) && o < i.saturating_add(bytes as u64);
        if overlap && (i != o || op != Op::AllReduce) {
            return Err(CallError::Overlap { input: i, bytes, output: o, out_bytes, op });
        }
        Ok(Call {
            op,
            dtype,
            count,
            input,
            output,
            world,
            capacity,
            residency: Residency::Caller,
            bias: None,
            norm: None,
            last_dim: None,
        })
    }

    /// The same allreduce with `bias` (as many elements of the call's dtype as the input) added to every sum after
    /// the ranks' inputs, as car's `z`: every rank passes its own bias (the same values, or the ranks' results
    /// differ), 16-byte aligned, apart from the output.
    pub fn with_bias(self, bias: DevicePtr) -> Result<Call, CallError> {
        if self.op != Op::AllReduce {
            return Err(CallError::BiasNotAllReduce { op: self.op });
        }
        if self.norm.is_some() {
            return Err(CallError::NormNotPlainAllReduce { op: self.op, bias: true });
        }
        if !bias.0.is_multiple_of(VEC_BYTES as u64) {
            return Err(CallError::Misaligned { what: "bias", ptr: bias.0, align: VEC_BYTES });
        }
        let bytes = self.bytes() as u64;
        if bias.0 < self.output.0 + bytes && self.output.0 < bias.0 + bytes {
            return Err(CallError::BiasOverlap { bias: bias.0, output: self.output.0, bytes: bytes as usize });
        }
        Ok(Call { bias: Some(bias), ..self })
    }

    /// The bias added to every sum, if any.
    pub fn bias(&self) -> Option<DevicePtr> {
        self.bias
    }

    /// The same allreduce followed by the residual add and RMSNorm of `norm` ([`AddRmsNorm`]): the call's count is
    /// a whole number of rows of `norm.hidden` elements, `eps` positive and finite, the residual (as many elements
    /// as the input) and the weight (`hidden` elements) 16-byte aligned; the residual, which is written, overlaps
    /// none of input, output and weight, and the weight does not overlap the output. The output may be the input.
    pub fn with_add_rms_norm(self, norm: AddRmsNorm) -> Result<Call, CallError> {
        if self.op != Op::AllReduce || self.bias.is_some() {
            return Err(CallError::NormNotPlainAllReduce { op: self.op, bias: self.bias.is_some() });
        }
        let (count, hidden) = (self.count, norm.hidden);
        if hidden == 0 || hidden > MAX_HIDDEN || !count.is_multiple_of(hidden) {
            return Err(CallError::NormRows { count, hidden });
        }
        if !(norm.eps.is_finite() && norm.eps > 0.0) {
            return Err(CallError::NormEps { eps: norm.eps });
        }
        for (what, p) in [("residual", norm.residual), ("weight", norm.weight)] {
            if !p.0.is_multiple_of(VEC_BYTES as u64) {
                return Err(CallError::Misaligned { what, ptr: p.0, align: VEC_BYTES });
            }
        }
        let bytes = self.bytes();
        let weight_bytes = hidden * self.dtype.size();
        let pairs = [
            ("residual", norm.residual, bytes, "input", self.input, bytes),
            ("residual", norm.residual, bytes, "output", self.output, bytes),
            ("residual", norm.residual, bytes, "weight", norm.weight, weight_bytes),
            ("weight", norm.weight, weight_bytes, "output", self.output, bytes),
        ];
        for (what, p, n, other, q, m) in pairs {
            if p.0 < q.0.saturating_add(m as u64) && q.0 < p.0.saturating_add(n as u64) {
                return Err(CallError::NormOverlap { what, ptr: p.0, bytes: n, other, other_ptr: q.0 });
            }
        }
        Ok(Call { norm: Some(norm), ..self })
    }

    /// The same reduce-scatter split along the last dimension (car's `split_last_dim`): the input is rows of
    /// `row_len` elements, and rank r receives columns `[r * row_len / W, (r + 1) * row_len / W)` of every row,
    /// densely (rows x row_len / W). `row_len` divides the count and is divisible by the world size.
    pub fn with_split_last_dim(self, row_len: usize) -> Result<Call, CallError> {
        let (op, count, world) = (self.op, self.count, self.world);
        if op != Op::ReduceScatter || row_len == 0 || !count.is_multiple_of(row_len) || !row_len.is_multiple_of(world) {
            return Err(CallError::SplitLastDim { op, count, row_len, world });
        }
        Ok(Call { last_dim: Some(row_len), ..self })
    }

    /// The row length of a reduce-scatter split along the last dimension, if it is one.
    pub fn split_last_dim(&self) -> Option<usize> {
        self.last_dim
    }

    /// The residual add and RMSNorm that follow the sum, if any.
    pub fn norm(&self) -> Option<AddRmsNorm> {
        self.norm
    }

    /// The plain allreduce of this call (its epilogue left to a kernel of its own: the unfused sequence).
    pub fn without_norm(self) -> Call {
        Call { norm: None, ..self }
    }

    /// The same call on buffers that live in `residency` (the caller's memory unless said otherwise).
    pub fn in_residency(self, residency: Residency) -> Call {
        Call { residency, ..self }
    }

    /// Refuses a call checked for another communicator (another world size or a larger capacity).
    pub fn checked_for(&self, world: usize, capacity: usize) -> Result<(), CallError> {
        if self.world == world && self.capacity <= capacity {
            Ok(())
        } else {
            Err(CallError::Foreign { checked_world: self.world, checked_capacity: self.capacity })
        }
    }

    pub fn op(&self) -> Op {
        self.op
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Elements of the input.
    pub fn count(&self) -> usize {
        self.count
    }
    /// Bytes of the input (no more than the capacity checked).
    pub fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }
    /// Elements of the output on this rank.
    pub fn output_count(&self) -> usize {
        self.op.output_count(self.count, self.world)
    }
    pub fn input(&self) -> DevicePtr {
        self.input
    }
    pub fn output(&self) -> DevicePtr {
        self.output
    }
    pub fn in_place(&self) -> bool {
        self.input == self.output
    }
    pub fn world(&self) -> usize {
        self.world
    }
    /// The capacity the call was checked against: every collective it is given to holds at least this much.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    pub fn residency(&self) -> Residency {
        self.residency
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: DevicePtr = DevicePtr(0x10000);

    fn call(op: Op, dtype: DType, input: u64, output: u64, count: usize) -> Result<Call, CallError> {
        Call::new(op, dtype, DevicePtr(input), DevicePtr(output), count, 4, 1024)
    }

    #[test]
    fn every_rule_refuses_with_its_own_error() {
        let ar = Op::AllReduce;
        assert_eq!(call(ar, DType::Bf16, P.0, P.0, 0), Err(CallError::Empty));
        assert!(matches!(call(ar, DType::F32, P.0, P.0, usize::MAX), Err(CallError::Overflow { .. })));
        assert_eq!(call(ar, DType::Bf16, P.0, P.0, 513), Err(CallError::TooLarge { bytes: 1026, capacity: 1024 }));
        assert!(call(ar, DType::Bf16, P.0, P.0, 512).is_ok());
        assert!(matches!(call(ar, DType::F32, P.0 + 8, P.0, 4), Err(CallError::Misaligned { what: "input", .. })));
        assert!(matches!(call(ar, DType::F32, P.0, P.0 + 4, 4), Err(CallError::Misaligned { what: "output", .. })));
        let rs = Op::ReduceScatter;
        assert_eq!(call(rs, DType::F32, P.0, P.0 + 512, 9), Err(CallError::Indivisible { count: 9, world: 4 }));
        assert!(call(rs, DType::F32, P.0, P.0 + 64, 16).is_ok(), "a shard of 4 f32 right after 64 input bytes");
        assert!(matches!(call(rs, DType::F32, P.0, P.0, 16), Err(CallError::Overlap { .. })), "never in place");
        assert!(matches!(call(ar, DType::F32, P.0, P.0 + 16, 8), Err(CallError::Overlap { .. })));
        assert!(call(ar, DType::F32, P.0, P.0 + 32, 8).is_ok());
        // All-gather: the capacity bounds the input, the overlap is with the world's outputs, never in place.
        let ag = Op::AllGather;
        assert!(call(ag, DType::Bf16, P.0, P.0 + 4096, 512).is_ok(), "1024 input bytes, 4096 output bytes");
        assert!(matches!(call(ag, DType::Bf16, P.0, P.0 + 4096, 513), Err(CallError::TooLarge { bytes: 1026, .. })));
        assert!(matches!(call(ag, DType::F32, P.0, P.0, 4), Err(CallError::Overlap { .. })), "never in place");
        let below = call(ag, DType::F32, P.0 + 48, P.0, 4);
        assert!(matches!(below, Err(CallError::Overlap { out_bytes: 64, .. })), "4 ranks' 16 bytes reach the input");
        assert!(call(ag, DType::F32, P.0 + 64, P.0, 4).is_ok());
        let e = below.unwrap_err().to_string();
        assert!(e.ends_with(": all_gather needs disjoint buffers"), "{e}");
    }

    #[test]
    fn a_bias_is_checked_too() {
        let c = call(Op::AllReduce, DType::F32, P.0, P.0, 16).unwrap();
        assert_eq!(c.with_bias(DevicePtr(P.0 + 64)).unwrap().bias(), Some(DevicePtr(P.0 + 64)));
        assert!(matches!(c.with_bias(DevicePtr(P.0 + 48)), Err(CallError::BiasOverlap { .. })));
        assert!(matches!(c.with_bias(DevicePtr(P.0 + 72)), Err(CallError::Misaligned { what: "bias", .. })));
        let rs = call(Op::ReduceScatter, DType::F32, P.0, P.0 + 64, 16).unwrap();
        assert!(matches!(rs.with_bias(DevicePtr(P.0 + 4096)), Err(CallError::BiasNotAllReduce { .. })));
        assert_eq!(c.bias(), None);
    }

    #[test]
    fn a_norm_is_checked_too() {
        let norm = |residual: u64, weight: u64, hidden: usize, eps: f32| AddRmsNorm {
            residual: DevicePtr(residual),
            weight: DevicePtr(weight),
            hidden,
            eps,
        };
        // 16 f32 in place at P: 4 rows of 4; the residual right after, then the weight.
        let c = call(Op::AllReduce, DType::F32, P.0, P.0, 16).unwrap();
        let ok = norm(P.0 + 64, P.0 + 128, 4, 1e-6);
        assert_eq!(c.with_add_rms_norm(ok).unwrap().norm(), Some(ok));
        assert_eq!(c.with_add_rms_norm(ok).unwrap().without_norm(), c);
        assert_eq!(ok.rows(16), 4);
        assert!(matches!(c.with_add_rms_norm(norm(P.0 + 64, P.0 + 128, 3, 1e-6)), Err(CallError::NormRows { .. })));
        assert!(matches!(c.with_add_rms_norm(norm(P.0 + 64, P.0 + 128, 0, 1e-6)), Err(CallError::NormRows { .. })));
        let e = Call::new(Op::AllReduce, DType::Bf16, P, P, 2 * (MAX_HIDDEN + 1), 4, 1 << 20).unwrap();
        let e = e.with_add_rms_norm(norm(1 << 24, 1 << 25, MAX_HIDDEN + 1, 1e-6)).unwrap_err();
        assert!(e.to_string().contains("at most 65536"), "{e}");
        for eps in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert!(matches!(c.with_add_rms_norm(norm(P.0 + 64, P.0 + 128, 4, eps)), Err(CallError::NormEps { .. })));
        }
        let bad = c.with_add_rms_norm(norm(P.0 + 72, P.0 + 128, 4, 1e-6));
        assert!(matches!(bad, Err(CallError::Misaligned { what: "residual", .. })));
        let bad = c.with_add_rms_norm(norm(P.0 + 64, P.0 + 136, 4, 1e-6));
        assert!(matches!(bad, Err(CallError::Misaligned { what: "weight", .. })));
        let bad = c.with_add_rms_norm(norm(P.0 + 48, P.0 + 128, 4, 1e-6));
        assert!(matches!(bad, Err(CallError::NormOverlap { what: "residual", other: "input", .. })));
        let bad = c.with_add_rms_norm(norm(P.0 + 64, P.0 + 112, 4, 1e-6));
        assert!(matches!(bad, Err(CallError::NormOverlap { what: "residual", other: "weight", .. })));
        let bad = c.with_add_rms_norm(norm(P.0 + 64, P.0 + 48, 4, 1e-6));
        assert!(matches!(bad, Err(CallError::NormOverlap { what: "weight", other: "output", .. })));
        let out_of_place = call(Op::AllReduce, DType::F32, P.0, P.0 + 256, 16).unwrap();
        let bad = out_of_place.with_add_rms_norm(norm(P.0 + 256, P.0 + 128, 4, 1e-6));
        assert!(matches!(bad, Err(CallError::NormOverlap { what: "residual", other: "output", .. })));
        let with_bias = c.with_bias(DevicePtr(P.0 + 512)).unwrap();
        assert!(matches!(with_bias.with_add_rms_norm(ok), Err(CallError::NormNotPlainAllReduce { bias: true, .. })));
        let rs = call(Op::ReduceScatter, DType::F32, P.0, P.0 + 64, 16).unwrap();
        assert!(matches!(rs.with_add_rms_norm(ok), Err(CallError::NormNotPlainAllReduce { bias: false, .. })));
    }

    #[test]
    fn a_split_along_the_last_dimension_is_checked() {
        // 24 f32 to 4 ranks: rows of 8 (2 columns each) pass, rows of 6 do not divide among 4, rows of 5 not the count.
        let rs = call(Op::ReduceScatter, DType::F32, P.0, P.0 + 128, 24).unwrap();
        assert_eq!(rs.with_split_last_dim(8).unwrap().split_last_dim(), Some(8));
        assert_eq!(rs.split_last_dim(), None);
        for bad in [6, 5, 0] {
            assert!(matches!(rs.with_split_last_dim(bad), Err(CallError::SplitLastDim { .. })), "{bad}");
        }
        let ar = call(Op::AllReduce, DType::F32, P.0, P.0, 24).unwrap();
        assert!(matches!(ar.with_split_last_dim(8), Err(CallError::SplitLastDim { op: Op::AllReduce, .. })));
    }

    #[test]
    fn a_call_keeps_what_it_was_checked_for() {
        let c = call(Op::ReduceScatter, DType::Bf16, P.0, P.0 + 4096, 64).unwrap();
        assert_eq!((c.bytes(), c.output_count(), c.residency()), (128, 16, Residency::Caller));
        assert_eq!(c.in_residency(Residency::Registered).residency(), Residency::Registered);
        assert!(c.checked_for(4, 1024).is_ok() && c.checked_for(4, 4096).is_ok());
        assert!(c.checked_for(4, 512).is_err() && c.checked_for(3, 1024).is_err());
        let g = call(Op::AllGather, DType::Bf16, P.0, P.0 + 4096, 64).unwrap();
        assert_eq!((g.bytes(), g.output_count()), (128, 256));
    }
}
