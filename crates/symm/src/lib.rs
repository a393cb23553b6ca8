//! symm: symmetric-memory allreduce as PyTorch's `symm_mem` does it. Each rank makes one VMM allocation (data,
//! then a signal pad at its end), exports it as a file descriptor, passes it to every peer over the rendezvous'
//! Unix socket, and maps every peer's. On HIP, where a running kernel may not see a peer's store into VMM memory, the
//! signal pad is an allocation of its own that a kernel may poll ([`Team::polled`]). Barriers are torch's compare-and-swap handshake on the signal pad, signalled
//! by every block. As comm_bench.py runs them, one-shot copies the input into the symmetric buffer inside its
//! kernel (`one_shot_all_reduce_copy_out`) and two-shot and reduce-scatter take a separate, timed memcpy;
//! `symm_2shot_fused` (the copy-in ablation) is two-shot with that copy inside the kernel.
//!
//! The device kernels are `kernels/symm.cu`; the module `host` holds their Rust twins for the host driver.

mod host;
mod host_tuned;
pub mod tuned;
mod tuned_designs;
mod tuned_params;

pub use collective_core::Algo;
use collective_core::{
    Call, Collective, CollectiveError, DType, Family, LaunchRule, Op, OwnStatus, Sharing, Team, MAX_BLOCKS, MAX_RANKS,
};
use gpu::{DeviceBuffer, DevicePtr, DriverKind, Kernel, KernelLibrary, LaunchDims, Stream};
use std::collections::HashMap;
pub use tuned_params::LL_FLAG_PERIOD;

/// The kernels, as one source for NVRTC / hipRTC and as host functions.
pub static LIBRARY: KernelLibrary = KernelLibrary {
    name: "symm",
    source: include_str!("../../../kernels/symm.cu"),
    headers: collective_core::KERNEL_HEADERS,
    host: host::KERNELS,
};

/// The kernels' parameter block; layout equals `struct SymmParams` in `kernels/symm.cu`.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct SymmParams {
    pub bufs: [u64; MAX_RANKS],
    pub pads: [u64; MAX_RANKS],
    pub input: u64,
    pub output: u64,
    pub count: u64,
    pub timeout_ns: u64,
    pub rank: u32,
    pub world: u32,
    pub dtype: u32,
    pub reserved: u32,
    /// The communicator's status words (`kernels/include/arx/sync.h`), which every wait watches.
    pub status: u64,
    /// Allreduce: added to every sum after the ranks' inputs (car's `z`), or 0.
    pub bias: u64,
}

/// Bytes of one signal pad: a u32 per (channel = block, peer).
pub const PAD_BYTES: usize = MAX_BLOCKS * MAX_RANKS * 4;

/// Options for [`Symm::new`].
#[derive(Clone, Copy, Debug)]
pub struct SymmOptions {
    pub capacity_bytes: usize,
    pub rule: Option<LaunchRule>,
    /// Two-shot only: copy the input in inside the kernel (`symm_2shot_fused`) instead of a separate memcpy.
    pub fused_copy_in: bool,
}

/// The method name of `algo`, with its copy-in fused into the kernel or not; `None` where that does not exist
/// (one-shot always fuses it, reduce-scatter never does, and symm has no all-gather).
pub fn method_name(algo: Algo, fused_copy_in: bool) -> Option<&'static str> {
    match (algo, fused_copy_in) {
        (_, false) => algo.method(Family::Symm),
        (Algo::TwoShot, true) => Some("symm_2shot_fused"),
        _ => None,
    }
}

/// The default launch rule per driver (torch: up to 24 blocks of 512 threads on CUDA).
pub fn default_rule(kind: DriverKind) -> LaunchRule {
    match kind {
        DriverKind::Host => LaunchRule { threads: 1, bytes_per_block: 256 << 10, max_grid: 4 },
        DriverKind::Cuda | DriverKind::Hip => LaunchRule { threads: 512, bytes_per_block: 16 << 10, max_grid: 24 },
    }
}

/// One symmetric-memory communicator.
pub struct Symm {
    name: &'static str,
    algo: Algo,
    /// The input is copied in by the kernel (one-shot, `symm_2shot_fused`), not by a memcpy before it.
    copies_in: bool,
    capacity: usize,
    rule: LaunchRule,
    cap: usize,
    base: SymmParams,
    mine: DevicePtr,
    kernels: HashMap<DType, Kernel>,
    _peers: Vec<DeviceBuffer>,
    _buffer: DeviceBuffer,
    /// The signal pad, where it is not at the end of the buffer.
    _pad: Option<DeviceBuffer>,
    status: OwnStatus,
}

impl Symm {
    /// Creates, exchanges and maps the symmetric buffers. Collective: every rank calls it.
    pub fn new(team: Team<'_>, algo: Algo, opts: SymmOptions) -> Result<Symm, CollectiveError> {
        let name = method_name(algo, opts.fused_copy_in).ok_or_else(|| {
            let fused = if opts.fused_copy_in { " with the copy-in fused" } else { "" };
            CollectiveError::BadArgs(format!("symm has no {algo:?}{fused}"))
        })?;
        let (gpu, rank, world) = (team.gpu, team.rank(), team.world());
        team.require_peer_atomics(name)?;
        team.agree_capacity(name, opts.capacity_bytes)?;
        let data_bytes = opts.capacity_bytes.next_multiple_of(256);
        // Torch's layout (the pad at the end of the buffer) where VMM memory may be polled, else a pad of its own.
        let inline = team.polled_sharing(Sharing::Vmm) == Sharing::Vmm;
        let buffer = gpu.vmm_create(data_bytes + if inline { PAD_BYTES } else { 0 })?;
        let (pad, peers) = if inline {
            let stream = gpu.stream()?;
            // SAFETY: the pad is the last PAD_BYTES of our own allocation, which no peer has mapped yet.
            unsafe { stream.memset(buffer.ptr().offset(data_bytes), 0, PAD_BYTES)? };
            stream.sync()?;
            (None, team.exchange(name, &[(&buffer, Sharing::Vmm)])?)
        } else {
            let (pad, sharing) = team.polled(PAD_BYTES, Sharing::Vmm)?;
            let peers = team.exchange(name, &[(&buffer, Sharing::Vmm), (&pad, sharing)])?;
            (Some(pad), peers)
        };
        let status = team.status()?;
        let mut base = SymmParams {
            timeout_ns: team.timeout_ns(),
            status: status.ptr,
            rank: rank as u32,
            world: world as u32,
            ..bytemuck::Zeroable::zeroed()
        };
        for (r, ptrs) in peers.ptrs.iter().enumerate() {
            base.bufs[r] = ptrs[0].0;
            base.pads[r] = if inline { ptrs[0].offset(data_bytes).0 } else { ptrs[1].0 };
        }

        let module = gpu.load(&LIBRARY)?;
        let mut kernels = HashMap::new();
        for dtype in DType::ALL {
            kernels.insert(dtype, module.kernel(&format!("{name}_{dtype}"))?);
        }
        let rule = opts.rule.unwrap_or_else(|| default_rule(gpu.kind()));
        let cap = team.required_cap(name, kernels.values(), rule.threads)?;
        if let Some(asked) = opts.rule {
            asked.check_requested(name, cap, world)?;
        }
        // Every pad is zero before anyone signals.
        team.rdv.barrier(&format!("{name} setup"))?;
        Ok(Symm {
            name,
            algo,
            copies_in: algo == Algo::OneShot || opts.fused_copy_in,
            capacity: opts.capacity_bytes,
            rule,
            cap,
            mine: buffer.ptr(),
            base,
            kernels,
            _peers: peers.mapped,
            _buffer: buffer,
            _pad: pad,
            status,
        })
    }
}

impl Collective for Symm {
    fn name(&self) -> &str {
        self.name
    }

    fn op(&self) -> Op {
        self.algo.op()
    }

    fn capacity_bytes(&self) -> usize {
        self.capacity
    }

    fn failure(&self) -> Result<Option<(Vec<usize>, String)>, CollectiveError> {
        self.status.failure()
    }

    unsafe fn run(&mut self, call: &Call, stream: &Stream) -> Result<(), CollectiveError> {
        debug_assert!(call.capacity() <= self.capacity && call.op() == self.algo.op(), "run's contract");
        let (dtype, bytes) = (call.dtype(), call.bytes());
        // SAFETY (both): the caller vouches for the call's input and output (this function's contract); the
        // symmetric buffers are ours, of at least the capacity the call was checked for.
        if !self.copies_in {
            unsafe { stream.copy(self.mine, call.input(), bytes)? };
        }
        let plan = self.rule.plan(bytes, self.cap);
        let (input, output, count) = (call.input().0, call.output().0, call.count() as u64);
        let bias = call.bias().map_or(0, |b| b.0);
        let params = SymmParams { input, output, count, dtype: dtype.code(), bias, ..self.base };
        let dims = LaunchDims { grid: plan.grid, block: plan.threads, shared_bytes: 0 };
        unsafe { stream.launch(&self.kernels[&dtype], dims, &params)? };
        Ok(())
    }
}
