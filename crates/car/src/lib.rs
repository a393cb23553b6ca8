//! car: fbgemm-style custom allreduce. Each rank registers one data buffer and one flag array, both mapped by
//! every peer through classic IPC handles; the flags live in memory a running kernel may poll ([`Team::polled`]).
//! An epoch counter in device memory grows by one per call (so graph replays work and flags never need resetting);
//! a barrier is one remote release store of the epoch per peer, then relaxed local polls per peer and one acquire
//! fence. Data buffers have two halves chosen by epoch parity, which (with the entry barrier of every call) means no
//! call overwrites a half that a peer may still read. The two-shot also registers a fixed input buffer, into which
//! [`Car::enqueue`] copies a plain allreduce's input by one memcpy before the kernel, as upstream's two-shot does
//! (`car_2shot_k` in `kernels/car.cu` says why that needs no exit barrier).
//!
//! The device kernels are `kernels/car.cu`; the module `host` holds their Rust twins for the host driver.

mod host;

use collective_core::flag_tags;
use collective_core::host_sync::FLAG_SLOTS;
use collective_core::norm::{norm_dims, row_grid, NORM_LANES};
pub use collective_core::Algo;
use collective_core::{
    AddRmsNorm, Call, Collective, CollectiveError, DType, Family, LaunchRule, Op, OwnStatus, Sharing, Team, MAX_BLOCKS,
    MAX_RANKS,
};
use gpu::{DeviceBuffer, DriverKind, Kernel, KernelLibrary, LaunchDims, MemKind, Stream};
use std::collections::HashMap;

/// The kernels, as one source for NVRTC / hipRTC and as host functions.
pub static LIBRARY: KernelLibrary = KernelLibrary {
    name: "car",
    source: include_str!("../../../kernels/car.cu"),
    headers: collective_core::KERNEL_HEADERS,
    host: host::KERNELS,
};

/// The kernels' parameter block; layout equals `struct CarParams` in `kernels/car.cu`.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct CarParams {
    pub bufs: [u64; MAX_RANKS],
    pub flags: [u64; MAX_RANKS],
    pub counters: u64,
    pub input: u64,
    pub output: u64,
    pub count: u64,
    pub half_bytes: u64,
    pub timeout_ns: u64,
    pub table: u64,
    pub slot_bytes: u64,
    pub rank: u32,
    pub world: u32,
    pub dtype: u32,
    /// The kernel's epoch-flag tag ([`collective_core::flag_tags`]), set per launch.
    pub tag: u32,
    /// The communicator's status words (`kernels/include/arx/sync.h`), which every wait watches.
    pub status: u64,
    /// Allreduce: added to every sum after the ranks' inputs (car's `z`), or 0.
    pub bias: u64,
    /// The `*_norm` kernels ([`collective_core::AddRmsNorm`]): the residual, written back as `r`.
    pub residual: u64,
    pub weight: u64,
    pub hidden: u32,
    pub eps: f32,
    /// The two-shot: every rank's fixed input buffer, which [`Car::enqueue`] fills before the kernel; else zeros.
    pub inputs: [u64; MAX_RANKS],
}

/// Options for [`Car::new`].
#[derive(Clone, Copy, Debug)]
pub struct CarOptions {
    /// Largest input in bytes.
    pub capacity_bytes: usize,
    /// Ask for uncached (fine-grained) data buffers where the driver has them (ROCm); the flags are always in
    /// memory a running kernel may poll.
    pub uncached: bool,
    /// Launch shape rule; `None` takes the driver's default.
    pub rule: Option<LaunchRule>,
    /// Car itself, or one factor of it changed.
    pub variant: Variant,
}

/// One factor of car's kernel changed, for the ablation study (`docs/symm-vs-car.md`); `Base` is car itself.
/// Each is its own method in the registry, named `<algo>_<suffix>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Base,
    /// Buffers in VMM allocations exported as POSIX fds (torch's mapping), not classic IPC memory; the flags too
    /// where the driver may poll VMM memory (not on HIP).
    Vmm,
    /// Torch's compare-and-swap handshake on signal pads instead of the epoch-flag barrier.
    Cas,
    /// The running sum rounded to the element type after every add, not accumulated in f32.
    RoundEveryAdd,
    /// Peer pointers read from a device array (as torch passes them), not from the kernel arguments.
    PeerTable,
    /// One-shot by push: each rank writes its input into its slot of every peer's buffer, then sums locally.
    Push,
    /// One block runs the cross-rank barrier for the whole grid, instead of every block for its own slice.
    OneBlockBarrier,
    /// Two-shot with a third (exit) barrier, as torch's two-shot has.
    ExitBarrier,
    /// A deliberately broken one-shot that copies into the same buffer half every call (no parity), so a fast rank
    /// overwrites its buffer while a slow peer still reads the previous call: what the benchmark's checks of
    /// consecutive calls must catch. Host driver only.
    BrokenSameHalf,
    /// A deliberately broken all-gather that fills output slot s with rank (rank + s) mod W's input (ring order
    /// from itself, not rank order): right on rank 0 only, which the checks of every rank's output must catch. Host
    /// driver only.
    BrokenRingOrder,
    /// A deliberately broken two-shot that keeps each shard's sum in its own rank's fixed input buffer and gathers
    /// from there (upstream's layout, without upstream's exit barrier), so a fast rank's next memcpy overwrites its
    /// sum while a slow peer still gathers it: what the benchmark's checks of consecutive calls must catch, and why
    /// car's sums go to the parity halves. Host driver only.
    BrokenSumInInput,
}

impl Variant {
    pub const ALL: [Variant; 11] = [
        Variant::Base,
        Variant::Vmm,
        Variant::Cas,
        Variant::RoundEveryAdd,
        Variant::PeerTable,
        Variant::Push,
        Variant::OneBlockBarrier,
        Variant::ExitBarrier,
        Variant::BrokenSameHalf,
        Variant::BrokenRingOrder,
        Variant::BrokenSumInInput,
    ];

    /// The method name of this variant of `algo`, or `None` where it does not apply.
    pub fn method(self, algo: Algo) -> Option<&'static str> {
        Some(match (algo, self) {
            (_, Variant::Base) => return algo.method(Family::Car),
            (Algo::OneShot, Variant::Vmm) => "car_1shot_vmm",
            (Algo::OneShot, Variant::Cas) => "car_1shot_cas",
            (Algo::OneShot, Variant::RoundEveryAdd) => "car_1shot_round",
            (Algo::OneShot, Variant::PeerTable) => "car_1shot_ptrtable",
            (Algo::OneShot, Variant::Push) => "car_1shot_push",
            (Algo::OneShot, Variant::OneBlockBarrier) => "car_1shot_oneblock",
            (Algo::TwoShot, Variant::ExitBarrier) => "car_2shot_3bar",
            (Algo::OneShot, Variant::BrokenSameHalf) => "car_1shot_broken_samehalf",
            (Algo::AllGather, Variant::BrokenRingOrder) => "car_ag_broken_ringorder",
            (Algo::TwoShot, Variant::BrokenSumInInput) => "car_2shot_broken_suminput",
            _ => return None,
        })
    }

    /// The kernel stem: the variant's own, except where only the memory changes.
    fn kernel(self, algo: Algo) -> Option<&'static str> {
        match self {
            Variant::Vmm => algo.method(Family::Car),
            _ => self.method(algo),
        }
    }
}

/// The default launch rule per driver.
pub fn default_rule(kind: DriverKind) -> LaunchRule {
    match kind {
        // One host "block" is a sequential pass; a few of them exercise the per-block protocol.
        DriverKind::Host => LaunchRule { threads: 1, bytes_per_block: 256 << 10, max_grid: 4 },
        DriverKind::Cuda | DriverKind::Hip => LaunchRule { threads: 512, bytes_per_block: 16 << 10, max_grid: 32 },
    }
}

/// One registered car communicator.
pub struct Car {
    name: &'static str,
    algo: Algo,
    variant: Variant,
    capacity: usize,
    rule: LaunchRule,
    cap: usize,
    base: CarParams,
    kernels: HashMap<DType, Kernel>,
    /// The kernels whose blocks own whole rows (car's own one-shot's and two-shot's with the residual add and RMSNorm fused, the reduce-scatter's split
    /// along the last dimension.
    /// peers, and their epoch-flag tag.
    by_rows: Option<(HashMap<DType, Kernel>, usize, u32)>,
    /// Why `by_rows` is None where this algorithm has such kernels: none of their blocks fits on this device.
    unfit: Option<String>,
    /// `car_barrier_only`, and its epoch-flag tag.
    barrier: (Kernel, u32),
    _peers: Vec<DeviceBuffer>,
    _data: DeviceBuffer,
    /// The two-shot's fixed input buffer (`base.inputs[rank]`), which a plain allreduce's input is copied into.
    fixed_input: Option<DeviceBuffer>,
    _flags: DeviceBuffer,
    _counters: DeviceBuffer,
    _table: Option<DeviceBuffer>,
    status: OwnStatus,
}

/// u64 words of a rank's counter array: epoch counters, then `Variant::OneBlockBarrier`'s arrival and release words.
const COUNTER_WORDS: usize = 2 * MAX_BLOCKS + 1;

impl Car {
    /// Allocates and registers this rank's buffers and maps every peer's. Collective: every rank calls it.
    pub fn new(team: Team<'_>, algo: Algo, opts: CarOptions) -> Result<Car, CollectiveError> {
        let variant = opts.variant;
        let name = variant.method(algo).ok_or_else(|| {
            CollectiveError::BadArgs(format!("car variant {variant:?} does not apply to car's {algo:?}"))
        })?;
        let (gpu, rank, world) = (team.gpu, team.rank(), team.world());
        let broken = matches!(variant, Variant::BrokenSameHalf | Variant::BrokenRingOrder | Variant::BrokenSumInInput);
        if broken && gpu.kind() != DriverKind::Host {
            return Err(CollectiveError::Unsupported(format!(
                "{name}: a deliberately broken protocol for testing the checks; host driver only"
            )));
        }
        if variant == Variant::Cas {
            team.require_peer_atomics(name)?;
        }
        team.agree_capacity(name, opts.capacity_bytes)?;
        let slot = opts.capacity_bytes.next_multiple_of(256);
        // Push keeps one slot per source in each half.
        let half = if variant == Variant::Push { world * slot } else { slot };
        let counters = gpu.alloc(COUNTER_WORDS * 8, MemKind::Device)?;
        // Only the data (and the two-shot's input buffer) follow the variant and `uncached`: the flags are polled
        // memory whatever they say.
        let sharing = if variant == Variant::Vmm { Sharing::Vmm } else { Sharing::Ipc };
        let shared = |bytes| match sharing {
            Sharing::Vmm => gpu.vmm_create(bytes),
            Sharing::Ipc => gpu.alloc(bytes, MemKind::Ipc { uncached: opts.uncached }),
        };
        let data = shared(2 * half)?;
        // The two-shot's input goes to a buffer of its own, outside the halves, so that its memcpy can precede the
        // kernel (which alone knows the epoch, hence the half) and still be captured in a graph.
        let fixed_input = if algo == Algo::TwoShot { Some(shared(slot)?) } else { None };
        // Zeroed before its handle travels, so no peer can signal into an uninitialised array.
        let (flags, flag_sharing) = team.polled(FLAG_SLOTS * 8, sharing)?;
        let stream = gpu.stream()?;
        stream.fill(&counters, 0)?;
        stream.sync()?;
        let mut shares = vec![(&data, sharing), (&flags, flag_sharing)];
        shares.extend(fixed_input.as_ref().map(|b| (b, sharing)));
        let peers = team.exchange(name, &shares)?;
        let status = team.status()?;
        let mut base = CarParams::zeroed_with(rank, world, half, team.timeout_ns());
        base.status = status.ptr;
        base.bufs = peers.column(0);
        base.flags = peers.column(1);
        if fixed_input.is_some() {
            base.inputs = peers.column(2);
        }
        base.counters = counters.ptr().0;
        base.slot_bytes = slot as u64;
        let table = if variant == Variant::PeerTable {
            let mut words = vec![0u64; 3 * MAX_RANKS];
            for r in 0..world {
                words[r] = base.bufs[r];
                words[MAX_RANKS + r] = base.bufs[r] + half as u64;
                words[2 * MAX_RANKS + r] = base.flags[r];
            }
            let t = gpu.alloc(words.len() * 8, MemKind::Device)?;
            stream.upload(&t, 0, bytemuck::cast_slice(&words))?;
            stream.sync()?;
            base.table = t.ptr().0;
            Some(t)
        } else {
            None
        };

        let module = gpu.load(&LIBRARY)?;
        let stem = variant.kernel(algo).expect("the method exists, so does its kernel");
        let kernels = per_dtype(&module, stem)?;
        base.tag = tag_of(stem)?;
        let barrier = (module.kernel("car_barrier_only")?, tag_of("car_barrier_only")?);
        let rule = opts.rule.unwrap_or_else(|| default_rule(gpu.kind()));
        let cap = team.required_cap(name, kernels.values(), rule.threads)?;
        let rows_stem = match (variant, algo) {
            (Variant::Base, Algo::OneShot | Algo::TwoShot) => Some(format!("{stem}_norm")),
            (Variant::Base, Algo::ReduceScatter) => Some(format!("{stem}_cols")),
            _ => None,
        };
        // Kernels that own whole rows where they fit: a device that fits none of their blocks runs row calls
        // another way (the engine's unfused sequence) or refuses them.
        let (mut by_rows, mut unfit) = (None, None);
        if let Some(rows_stem) = rows_stem {
            let kernels = per_dtype(&module, &rows_stem)?;
            match team.resident_cap(&format!("{name} {rows_stem}"), kernels.values(), NORM_LANES as u32)? {
                Some(cap) => by_rows = Some((kernels, cap, tag_of(&rows_stem)?)),
                None => unfit = Some(team.unfit(&rows_stem, NORM_LANES as u32)),
            }
        }
        if let Some(asked) = opts.rule {
            asked.check_requested(name, cap, world)?;
        }
        team.rdv.barrier(&format!("{name} setup"))?;
        Ok(Car {
            name,
            algo,
            variant,
            capacity: opts.capacity_bytes,
            rule,
            cap,
            base,
            kernels,
            by_rows,
            unfit,
            barrier,
            _peers: peers.mapped,
            _data: data,
            fixed_input,
            _flags: flags,
            _counters: counters,
            _table: table,
            status,
        })
    }
}

/// The epoch-flag tag of the kernel `stem` ([`collective_core::flag_tags`]).
fn tag_of(stem: &str) -> Result<u32, CollectiveError> {
    flag_tags::flag_tag(stem).ok_or_else(|| CollectiveError::BadArgs(format!("{stem} has no epoch-flag tag")))
}

/// The kernels `{stem}_{dtype}` of every element type.
fn per_dtype(module: &gpu::Module, stem: &str) -> Result<HashMap<DType, Kernel>, CollectiveError> {
    let mut kernels = HashMap::new();
    for dtype in DType::ALL {
        kernels.insert(dtype, module.kernel(&format!("{stem}_{dtype}"))?);
    }
    Ok(kernels)
}

impl Car {
    /// Enqueues the protocol's floor: the epoch update and one barrier of `grid` blocks, no data moved.
    /// Collective, like `run`.
    pub fn barrier_only(&self, grid: u32, stream: &Stream) -> Result<(), CollectiveError> {
        let grid = grid.clamp(1, self.cap as u32);
        let dims = LaunchDims { grid, block: self.rule.threads.max(self.base.world), shared_bytes: 0 };
        // SAFETY: the barrier kernel touches only this communicator's flags and counters, live while `self` is.
        unsafe { stream.launch(&self.barrier.0, dims, &CarParams { tag: self.barrier.1, ..self.base })? };
        Ok(())
    }
}

impl CarParams {
    fn zeroed_with(rank: usize, world: usize, half: usize, timeout_ns: u64) -> CarParams {
        CarParams {
            half_bytes: half as u64,
            timeout_ns,
            rank: rank as u32,
            world: world as u32,
            ..bytemuck::Zeroable::zeroed()
        }
    }
}

impl Car {
    /// Whether calls by rows (the residual add and RMSNorm, the split along the last dimension) run here.
    pub fn owns_rows(&self) -> bool {
        self.by_rows.is_some()
    }

    /// What set-up dropped: kernels that this device fits not even one block of.
    pub fn unfit(&self) -> Option<&str> {
        self.unfit.as_deref()
    }

    /// Enqueues `call` on `stream` ([`Collective::run`] without the exclusive borrow, for a caller that shares
    /// the method, as the communicator's engine does).
    ///
    /// # Safety
    /// As [`Collective::run`].
    pub unsafe fn enqueue(&self, call: &Call, stream: &Stream) -> Result<(), CollectiveError> {
        debug_assert!(call.capacity() <= self.capacity && call.op() == self.algo.op(), "run's contract");
        let dtype = call.dtype();
        let (input, output, count) = (call.input().0, call.output().0, call.count() as u64);
        let bias = call.bias().map_or(0, |b| b.0);
        let params = CarParams { input, output, count, dtype: dtype.code(), bias, ..self.base };
        let by_rows = || {
            self.by_rows.as_ref().ok_or_else(|| {
                CollectiveError::Unsupported(match &self.unfit {
                    Some(why) => why.clone(),
                    None => format!("{} has no kernels that own whole rows", self.name),
                })
            })
        };
        // A block per row (per row of a rank's shard, two-shot), as many as fit.
        let (kernel, params, dims) = match (call.norm(), call.split_last_dim()) {
            (Some(norm), _) => {
                let (kernels, cap, tag) = by_rows()?;
                let rows = norm.rows(call.count());
                let rows = if self.algo == Algo::TwoShot { rows.div_ceil(call.world()) } else { rows };
                let params = CarParams { tag: *tag, ..with_norm(params, &norm) };
                (&kernels[&dtype], params, norm_dims(row_grid(rows, *cap)))
            }
            (None, Some(row_len)) => {
                let (kernels, cap, tag) = by_rows()?;
                let params = CarParams { hidden: row_len as u32, tag: *tag, ..params };
                (&kernels[&dtype], params, norm_dims(row_grid(call.count() / row_len, *cap)))
            }
            (None, None) => (&self.kernels[&dtype], params, self.rule.plan(call.bytes(), self.cap).dims()),
        };
        if let (None, Some(fixed)) = (call.norm(), &self.fixed_input) {
            // SAFETY: the destination is this communicator's fixed input buffer, of at least the capacity the call
            // was checked for, live while `self` is; the source is the caller's (this function's contract). No peer
            // reads the buffer while the copy runs: peers read it only between barriers 0 and 1 of a call; this
            // rank's previous kernel, which the copy follows (a Car's calls run one after another, as its device-side
            // epochs already require), passed barrier 1 only once every peer had signalled it, after its reads; and
            // no peer reads this call's input before this rank's kernel, after the copy, signals barrier 0
            // (`car_2shot_k` in kernels/car.cu).
            unsafe { stream.copy(fixed.ptr(), call.input(), call.bytes())? };
        }
        // SAFETY: the caller vouches for the call's buffers (this function's contract); the rest of `params` is
        // this communicator's own memory, of at least the capacity the call was checked for.
        unsafe { stream.launch(kernel, dims, &params)? };
        Ok(())
    }
}

/// `params` with the norm's buffers and shape.
fn with_norm(params: CarParams, norm: &AddRmsNorm) -> CarParams {
    let (residual, weight, hidden, eps) = (norm.residual.0, norm.weight.0, norm.hidden as u32, norm.eps);
    CarParams { residual, weight, hidden, eps, ..params }
}

/// The unfused sequence's second kernel: the residual add and RMSNorm of an allreduce's result, on its own stream
/// order after the allreduce (no peers involved).
pub struct AddRmsNormKernel {
    kernels: HashMap<DType, Kernel>,
}

/// Blocks of the unfused norm: a block per row up to here (it waits for no peer, so its blocks need not all be
/// resident at once).
const NORM_GRID: usize = 1024;

impl AddRmsNormKernel {
    pub fn new(gpu: &gpu::Gpu) -> Result<AddRmsNormKernel, CollectiveError> {
        Ok(AddRmsNormKernel { kernels: per_dtype(&gpu.load(&LIBRARY)?, "car_add_rms_norm")? })
    }

    /// Enqueues the norm of `call`'s epilogue over the call's output, in place there (the allreduce before it has
    /// written the sum into the output).
    ///
    /// # Safety
    /// `call` (with its norm) describes live device memory of this device for as long as the stream runs it.
    pub unsafe fn enqueue(&self, call: &Call, stream: &Stream) -> Result<(), CollectiveError> {
        let norm = call.norm().ok_or_else(|| CollectiveError::BadArgs("a call without a norm".into()))?;
        let (output, count, dtype) = (call.output().0, call.count() as u64, call.dtype());
        let base = CarParams { input: output, output, count, dtype: dtype.code(), ..bytemuck::Zeroable::zeroed() };
        let grid = norm.rows(call.count()).clamp(1, NORM_GRID) as u32;
        // SAFETY: the caller's contract; the kernel touches the call's output, residual and weight only.
        unsafe { stream.launch(&self.kernels[&dtype], norm_dims(grid), &with_norm(base, &norm))? };
        Ok(())
    }
}

impl Collective for Car {
    fn name(&self) -> &str {
        self.name
    }

    fn op(&self) -> Op {
        self.algo.op()
    }

    fn capacity_bytes(&self) -> usize {
        self.capacity
    }

    fn rounds_every_add(&self) -> bool {
        self.variant == Variant::RoundEveryAdd
    }

    fn failure(&self) -> Result<Option<(Vec<usize>, String)>, CollectiveError> {
        self.status.failure()
    }

    unsafe fn run(&mut self, call: &Call, stream: &Stream) -> Result<(), CollectiveError> {
        // SAFETY: the caller's contract.
        unsafe { self.enqueue(call, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel a car instance launches stores flags carrying a tag of its own: the variants' kernels, the row
    /// kernels and the barrier's (set-up refuses a kernel without one).
    #[test]
    fn every_kernel_has_an_epoch_flag_tag() {
        let algos = [Algo::OneShot, Algo::TwoShot, Algo::ReduceScatter, Algo::AllGather];
        let stems = Variant::ALL.into_iter().flat_map(|v| algos.map(|a| v.kernel(a))).flatten();
        let rows = ["car_1shot_norm", "car_2shot_norm", "car_rs_cols", "car_barrier_only"];
        for stem in stems.chain(rows) {
            assert!(tag_of(stem).is_ok_and(|t| t > 0), "{stem}");
        }
        assert!(tag_of("car_1shot_nope").is_err());
    }
}
