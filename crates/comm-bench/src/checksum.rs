//! A device-side checksum of outputs: each call's output folded in by a small kernel on the same stream (so it works
//! inside a graph capture too), the total read once at the end; a call that read a peer's previous call, or a torn
//! packet, folds a different sum than [`measure::check::checksum`] predicts.

use crate::BenchError;
use collective_core::DType;
use gpu::{DeviceBuffer, DevicePtr, Gpu, HostLaunch, Kernel, KernelFault, KernelLibrary, LaunchDims, MemKind, Stream};

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

/// The checksum's device words and its kernels.
pub struct Checksum {
    sums: DeviceBuffer,
    kernels: Vec<Kernel>,
}

impl Checksum {
    pub fn new(gpu: &Gpu) -> Result<Checksum, BenchError> {
        let module = gpu.load(&CHECK_LIBRARY)?;
        let kernels = DType::ALL.iter().map(|d| module.kernel(&format!("arx_fold_{d}"))).collect::<Result<_, _>>()?;
        Ok(Checksum { sums: gpu.alloc(FOLD_BLOCKS * 8, MemKind::Device)?, kernels })
    }

    /// Sets the total to zero.
    pub fn reset(&self, stream: &Stream) -> Result<(), BenchError> {
        Ok(stream.fill(&self.sums, 0)?)
    }

    /// Enqueues the fold of the first `count` elements of `buf` into the total.
    pub fn fold(&self, stream: &Stream, buf: &DeviceBuffer, count: usize, dtype: DType) -> Result<(), BenchError> {
        if count * dtype.size() > buf.bytes() {
            return Err(BenchError::Config(format!("fold of {count} {dtype} overruns {} bytes", buf.bytes())));
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
    ) -> Result<(), BenchError> {
        let params = FoldParams { data: data.0, count: count as u64, sums: self.sums.ptr().0 };
        let dims = LaunchDims { grid: FOLD_BLOCKS as u32, block: FOLD_THREADS, shared_bytes: 0 };
        let d = DType::ALL.iter().position(|&t| t == dtype).expect("every dtype is in ALL");
        // SAFETY: the caller's contract for `data`; `sums` is FOLD_BLOCKS words of ours.
        unsafe { stream.launch(&self.kernels[d], dims, &params)? };
        Ok(())
    }

    /// The total so far (waits for the stream).
    pub fn total(&self, stream: &Stream) -> Result<u64, BenchError> {
        let mut words = vec![0u8; FOLD_BLOCKS * 8];
        stream.download(&self.sums, 0, &mut words)?;
        Ok(words.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))).fold(0, u64::wrapping_add))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use measure::check::{checksum, variant_sum};

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
            assert_eq!(c.total(&stream).unwrap(), 2 * checksum(&variant_sum(world, 0, n, 1)));
            let mut off = want.clone();
            off[4321] += 1.0;
            stream.upload(&buf, 0, &dtype.encode(&off)).unwrap();
            c.reset(&stream).unwrap();
            c.fold(&stream, &buf, n, dtype).unwrap();
            assert_ne!(c.total(&stream).unwrap(), checksum(&variant_sum(world, 0, n, 1)));
            assert!(c.fold(&stream, &buf, n + 1, dtype).is_err());
        }
    }
}
