//! car: fbgemm-style custom allreduce. Each rank registers one data buffer and one flag array, both mapped by
//! every peer through classic IPC handles. An epoch counter in device memory grows by one per call (so graph
//! replays work and flags never need resetting); a barrier is one remote release store of the epoch per peer and
//! a local acquire load per peer. Data buffers have two halves chosen by epoch parity, which (with the entry
//! barrier of every call) means no call overwrites a half that a peer may still read.
//!
//! The device kernels are `kernels/car.cu`; [`host`] holds their Rust twins for the host driver.

mod host;

use collective::host_sync::FLAG_SLOTS;
pub use collective::Algo;
use collective::{
    check_args, check_world, resident_cap, Collective, CollectiveError, DType, Family, LaunchRule, Op, MAX_BLOCKS,
    MAX_RANKS,
};
use gpu::{DeviceBuffer, DevicePtr, DriverKind, Gpu, Kernel, KernelLibrary, LaunchDims, MemKind, Module, Stream};
use ipc::Rendezvous;
use std::collections::HashMap;

/// The kernels, as one source for NVRTC / hipRTC and as host functions.
pub static LIBRARY: KernelLibrary = KernelLibrary {
    name: "car",
    source: concat!(include_str!("../../../kernels/common.h"), include_str!("../../../kernels/car.cu")),
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
    pub rank: u32,
    pub world: u32,
    pub dtype: u32,
    pub reserved: u32,
}

/// Options for [`Car::new`].
#[derive(Clone, Copy, Debug)]
pub struct CarOptions {
    /// Largest input in bytes.
    pub capacity_bytes: usize,
    /// Ask for uncached (fine-grained) memory where the driver has it (ROCm).
    pub uncached: bool,
    /// Launch shape rule; `None` takes the driver's default.
    pub rule: Option<LaunchRule>,
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
    capacity: usize,
    rule: LaunchRule,
    cap: usize,
    base: CarParams,
    kernels: HashMap<DType, Kernel>,
    barrier: Kernel,
    _module: Module,
    _peers: Vec<DeviceBuffer>,
    _data: DeviceBuffer,
    _flags: DeviceBuffer,
    _counters: DeviceBuffer,
}

impl Car {
    /// Allocates and registers this rank's buffers and maps every peer's. Collective: every rank calls it.
    pub fn new(gpu: &Gpu, rdv: &Rendezvous, algo: Algo, opts: CarOptions) -> Result<Car, CollectiveError> {
        let name = algo.method(Family::Car);
        let (rank, world) = (rdv.rank(), rdv.world());
        check_world(name, world)?;
        if opts.capacity_bytes == 0 {
            return Err(CollectiveError::BadArgs("car capacity must be at least 1 byte".into()));
        }
        let half = opts.capacity_bytes.next_multiple_of(256);
        let kind = MemKind::Ipc { uncached: opts.uncached };
        let data = gpu.alloc(2 * half, kind)?;
        let flags = gpu.alloc(FLAG_SLOTS * 8, kind)?;
        let counters = gpu.alloc(MAX_BLOCKS * 8, MemKind::Device)?;
        let stream = gpu.stream()?;
        stream.memset(flags.ptr(), 0, flags.bytes())?;
        stream.memset(counters.ptr(), 0, counters.bytes())?;
        stream.sync()?;

        // Handles travel only after the flags are zero, so no peer can signal into an uninitialised array.
        let mut blob = (opts.capacity_bytes as u64).to_le_bytes().to_vec();
        blob.extend(gpu.ipc_export(&data)?);
        let data_handles = rdv.all_gather(&format!("{name} data handles"), &blob)?;
        let flag_handles = rdv.all_gather(&format!("{name} flag handles"), &gpu.ipc_export(&flags)?)?;
        let mut base = CarParams::zeroed_with(rank, world, half, rdv.timeout());
        let mut peers = Vec::new();
        for (r, (dh, fh)) in data_handles.iter().zip(&flag_handles).enumerate() {
            let theirs = dh.get(..8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
            if theirs != Some(opts.capacity_bytes as u64) {
                return Err(CollectiveError::Mismatch(format!(
                    "{name}: rank {r} registered {theirs:?} bytes, rank {rank} {}",
                    opts.capacity_bytes
                )));
            }
            if r == rank {
                base.bufs[r] = data.ptr().0;
                base.flags[r] = flags.ptr().0;
            } else {
                let d = gpu.ipc_import(&dh[8..], 2 * half)?;
                let f = gpu.ipc_import(fh, FLAG_SLOTS * 8)?;
                base.bufs[r] = d.ptr().0;
                base.flags[r] = f.ptr().0;
                peers.extend([d, f]);
            }
        }
        base.counters = counters.ptr().0;

        let module = gpu.load(&LIBRARY)?;
        let mut kernels = HashMap::new();
        for dtype in DType::ALL {
            kernels.insert(dtype, module.kernel(&format!("{name}_{dtype}"))?);
        }
        let barrier = module.kernel("car_barrier_only")?;
        let rule = opts.rule.unwrap_or_else(|| default_rule(gpu.kind()));
        let probe = &kernels[&DType::Bf16];
        let cap = resident_cap(probe, rule.threads, world, gpu.info().count)?;
        if cap == 0 {
            return Err(CollectiveError::Unsupported(format!(
                "{name}: not even one block of {} threads per rank fits beside {world} ranks on one device",
                rule.threads
            )));
        }
        rdv.barrier(&format!("{name} setup"))?;
        Ok(Car {
            name,
            algo,
            capacity: opts.capacity_bytes,
            rule,
            cap,
            base,
            kernels,
            barrier,
            _module: module,
            _peers: peers,
            _data: data,
            _flags: flags,
            _counters: counters,
        })
    }
}

impl Car {
    /// Enqueues the protocol's floor: the epoch update and one barrier of `grid` blocks, no data moved.
    /// Collective, like `run`.
    pub fn barrier_only(&self, grid: u32, stream: &Stream) -> Result<(), CollectiveError> {
        let grid = grid.clamp(1, self.cap as u32);
        let dims = LaunchDims { grid, block: self.rule.threads.max(self.base.world), shared_bytes: 0 };
        stream.launch(&self.barrier, dims, &self.base)?;
        Ok(())
    }
}

impl CarParams {
    fn zeroed_with(rank: usize, world: usize, half: usize, timeout: std::time::Duration) -> CarParams {
        CarParams {
            half_bytes: half as u64,
            timeout_ns: timeout.as_nanos().min(u64::MAX as u128) as u64,
            rank: rank as u32,
            world: world as u32,
            ..bytemuck::Zeroable::zeroed()
        }
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

    fn run(
        &mut self,
        op: Op,
        dtype: DType,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        stream: &Stream,
    ) -> Result<(), CollectiveError> {
        self.supports(op, dtype).map_err(CollectiveError::Unsupported)?;
        check_args(op, dtype, count, self.base.world as usize, self.capacity)?;
        let plan = self.rule.plan(count * dtype.size(), self.cap);
        let params =
            CarParams { input: input.0, output: output.0, count: count as u64, dtype: dtype.code(), ..self.base };
        let dims = LaunchDims { grid: plan.grid, block: plan.threads, shared_bytes: 0 };
        stream.launch(&self.kernels[&dtype], dims, &params)?;
        Ok(())
    }
}
