//! Tuned symmetric memory: the designs that close the gap to car and pass it (kernels in `kernels/symm_tuned.cu`).
//! Each rank registers four buffers, mapped by every peer: its input, its output (VMM allocations), a sync area
//! (flag-and-data packets, then epoch flags) in memory a running kernel may poll ([`Team::polled`]: VMM too, except
//! on HIP) and a staging buffer of two halves (VMM). The methods:
//! - `symm_ll`: barrier-free one-shot for small messages: data carries its own arrival flag. A call with the
//!   residual add and RMSNorm runs `symm_ll_norm`, the same packets with the norm in the kernel (blocks own rows).
//! - `symm_zc_1shot`, `symm_zc_2shot`: no copy-in; ranks read each other's registered inputs, and two-shot pushes
//!   every reduced shard straight into every peer's registered output. Epoch flags instead of the CAS handshake.
//!   With the residual add and RMSNorm: `symm_zc_1shot_norm` (blocks own rows), `symm_zc_2shot_norm` (the rows split
//!   among the ranks, r pushed, then every rank normalises every row).
//! - `symm_epoch_1shot`: car's one-shot protocol (fused copy-in to a staging half by epoch parity, one barrier) on
//!   symmetric memory, for the middle sizes where one barrier beats zero-copy's two.
//! - `symm_zc_2shot_ll`: zero-copy two-shot with one barrier: the reduced shards travel as flag-and-data packets,
//!   whose arrival also says that the sender has finished reading every input.
//! - `symm_1shot_tuned`: `symm_ll` up to [`LL_HANDOVER_GRAPH_BYTES`] in a graph capture ([`LL_HANDOVER_EAGER_BYTES`]
//!   when launched eagerly), `symm_epoch_1shot` up to [`EPOCH_MAX_BYTES`], then `symm_zc_1shot`; `symm_2shot_tuned`:
//!   `symm_ll` likewise, `symm_epoch_1shot` up to [`TWO_SHOT_EPOCH_MAX_BYTES`], then `symm_zc_2shot`. Where the
//!   thresholds and launch rules come from: docs/symm-vs-car.md, "Thresholds of the tuned designs". Every rank must
//!   issue a call the same way (all capturing or none), as they must call with the same size: ranks that disagree
//!   fail at the kernels' deadline.
//!
//! A caller whose input is elsewhere still gets a correct result: the input is copied into the registered buffer
//! (and the output out of it) on the stream.

use crate::host_tuned::{self, row_packets};
use collective_core::flag_tags::flag_tag;
use collective_core::host_sync::FLAG_SLOTS;
use collective_core::norm::{norm_dims, row_grid, NORM_LANES};
use collective_core::{
    Call, Collective, CollectiveError, DType, LaunchRule, Mode, Op, OwnStatus, Sharing, Team, LINE_BYTES, MAX_BLOCKS,
    MAX_RANKS,
};
use gpu::{DeviceBuffer, DevicePtr, DriverKind, Kernel, KernelLibrary, MemKind, Stream};

/// The kernels, as one source for NVRTC / hipRTC and as host functions.
pub static LIBRARY: KernelLibrary = KernelLibrary {
    name: "symm_tuned",
    source: include_str!("../../../kernels/symm_tuned.cu"),
    headers: collective_core::KERNEL_HEADERS,
    host: host_tuned::KERNELS,
};

pub use crate::tuned_params::{ll_flag, TunedParams, PEER_TABLE_BYTES};

pub use crate::tuned_designs::{
    ll_handover_bytes, Design, EPOCH_MAX_BYTES, LL_HANDOVER_EAGER_BYTES, LL_HANDOVER_GRAPH_BYTES, LL_MAX_BYTES,
    THREADS, TWO_SHOT_EPOCH_MAX_BYTES,
};
use crate::tuned_designs::{rule, Stem};

/// Options for [`SymmTuned::new`].
#[derive(Clone, Copy, Debug)]
pub struct TunedOptions {
    pub capacity_bytes: usize,
    /// Where the internal staging buffer and the epoch flags live (the registered input and output and the
    /// packet area are VMM memory either way).
    pub staging: Staging,
    /// One launch shape at every size instead of the design's rule (`METHOD@BLOCKSxTHREADS`); only for the
    /// designs that run one kernel.
    pub rule: Option<LaunchRule>,
    /// The epoch counters' starting value (0: the first call is epoch 1); a test starts just below the packet
    /// flags' wrap to check it.
    pub first_epoch: u64,
    /// How the zero-copy one- and two-shot take a caller's input that no peer has mapped.
    pub copy_in: CopyIn,
}

/// How a zero-copy design gets a caller's input into its registered input, which every peer reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyIn {
    /// A device-to-device copy on the stream before the kernel (as torch's two-shot and upstream car's two-shot).
    Dma,
    /// Inside the kernel, each block its own part, before the barrier that publishes it (one launch, no memcpy
    /// node); the two-shots copy only the peers' shards and sum their own from the caller's input. The packet
    /// two-shot (`symm_zc_2shot_ll`) keeps the DMA copy.
    Fused,
    /// Each design's cheapest as measured (`docs/symm-vs-car.md`): fused for the pulled two-shot, a memcpy for the
    /// others. What the communicator and the designs' own methods run.
    Cheapest,
}

impl CopyIn {
    /// Whether `stem`'s kernel copies a caller's input in itself (`copy_from`) rather than after a memcpy.
    fn fuses(self, stem: Stem) -> bool {
        match self {
            CopyIn::Dma => false,
            CopyIn::Fused => matches!(
                stem,
                Stem::ZeroCopyOneShot
                    | Stem::ZeroCopyTwoShot
                    | Stem::ZeroCopyTwoShotPull
                    | Stem::ZeroCopyOneShotNorm
                    | Stem::ZeroCopyTwoShotNorm
            ),
            CopyIn::Cheapest => stem == Stem::ZeroCopyTwoShotPull,
        }
    }
}

/// The allocation behind the staging buffer and the epoch flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Staging {
    /// VMM allocations exported as POSIX fds, like the registered buffers.
    Vmm,
    /// Classic IPC allocations (`cuMemAlloc` / `hipExtMallocWithFlags`), car's memory.
    Ipc,
}

impl TunedOptions {
    pub fn new(capacity_bytes: usize) -> TunedOptions {
        TunedOptions { capacity_bytes, staging: Staging::Vmm, rule: None, first_epoch: 0, copy_in: CopyIn::Cheapest }
    }
}

/// The registry name of `design` with its staging memory and copy-in (a copy-in that is not the design's cheapest
/// names an ablation variant).
pub fn method_name(design: Design, staging: Staging, copy_in: CopyIn) -> Option<&'static str> {
    Some(match (design, staging) {
        _ if copy_in == CopyIn::Fused => match (design, staging) {
            (Design::ZeroCopyOneShot, Staging::Vmm) => "symm_zc_1shot_fusedcopy",
            (Design::ZeroCopyTwoShot, Staging::Vmm) => "symm_zc_2shot_fusedcopy",
            _ => return None,
        },
        (Design::ZeroCopyTwoShotPull, Staging::Vmm) if copy_in == CopyIn::Dma => "symm_zc_2shot_pull_memcpy",
        (_, Staging::Vmm) => design.method(),
        (Design::EpochOneShot, Staging::Ipc) => "symm_epoch_1shot_ipc",
        (Design::ZeroCopyOneShot, Staging::Ipc) => "symm_zc_1shot_ipc",
        (Design::ZeroCopyTwoShot, Staging::Ipc) => "symm_zc_2shot_ipc",
        (
            Design::Ll | Design::ZeroCopyTwoShotLl | Design::ZeroCopyTwoShotPush | Design::ZeroCopyTwoShotPull,
            Staging::Ipc,
        ) => return None,
        (Design::OneShotTuned, Staging::Ipc) => "symm_1shot_tuned_ipc",
        (Design::TwoShotTuned, Staging::Ipc) => "symm_2shot_tuned_ipc",
    })
}

/// One tuned symmetric-memory communicator.
pub struct SymmTuned {
    name: &'static str,
    design: Design,
    capacity: usize,
    kind: DriverKind,
    /// Per [`Stem`]: the blocks that fit beside the other ranks (None: not even one, so the stem never runs).
    caps: Vec<Option<usize>>,
    /// The launch shape asked for this communicator's own design, and the blocks of it that fit.
    fixed: Option<(LaunchRule, usize)>,
    copy_in: CopyIn,
    base: TunedParams,
    /// Per [`Stem`], per dtype in `DType::ALL` order: plain indexing on the launch path (eager calls are
    /// bound by the host's launch work).
    kernels: Vec<Kernel>,
    /// The same for the `*_table` kernels (None for the stems without one), and the blocks of each that fit.
    table_kernels: Vec<Option<Kernel>>,
    table_caps: Vec<Option<usize>>,
    /// Why each stem that never runs was dropped.
    unfit: Vec<String>,
    /// Per [`Stem`]: the epoch-flag tag its kernels (and its `*_table` kernels) store.
    tags: Vec<u32>,
    _peers: Vec<DeviceBuffer>,
    input: DeviceBuffer,
    output: DeviceBuffer,
    _sync: DeviceBuffer,
    _staging: DeviceBuffer,
    _counters: DeviceBuffer,
    status: OwnStatus,
}

/// Bytes of a rank's packet area: two parities, a slot per source.
fn packet_bytes(ll_packets: usize) -> usize {
    2 * MAX_RANKS * ll_packets * 8
}

impl SymmTuned {
    /// Creates, exchanges and maps the registered buffers. Collective: every rank calls it.
    pub fn new(team: Team<'_>, design: Design, opts: TunedOptions) -> Result<SymmTuned, CollectiveError> {
        let name = method_name(design, opts.staging, opts.copy_in).ok_or_else(|| {
            let (staging, copy_in) = (opts.staging, opts.copy_in);
            CollectiveError::BadArgs(format!(
                "{design:?} has no variant with {staging:?} staging and {copy_in:?} copy-in"
            ))
        })?;
        let (gpu, rank, world) = (team.gpu, team.rank(), team.world());
        team.agree_capacity(name, opts.capacity_bytes)?;
        if opts.rule.is_some() && matches!(design, Design::OneShotTuned | Design::TwoShotTuned) {
            return Err(CollectiveError::BadArgs(format!(
                "{name}: picks a kernel and a launch shape per size; a fixed shape applies to one kernel's designs"
            )));
        }
        let data = opts.capacity_bytes.next_multiple_of(256);
        let ll_packets = LL_MAX_BYTES.min(data).div_ceil(4);
        let ipc = opts.staging == Staging::Ipc;
        // A staging half holds a message, or the pushed two-shot's slots: a shard of whole lines per rank, up to a
        // line per rank more than the message.
        let half = data + MAX_RANKS * LINE_BYTES;
        // The sync area: packets, then (VMM staging) the epoch flags; with IPC staging the flags follow the staging
        // halves in the IPC allocation.
        let flags_at = if ipc { 2 * half } else { packet_bytes(ll_packets) };
        let sync_bytes = packet_bytes(ll_packets) + if ipc { 0 } else { FLAG_SLOTS * 8 };
        let staging_bytes = 2 * half + if ipc { FLAG_SLOTS * 8 } else { 0 };
        let (input, output) = (gpu.vmm_create(data)?, gpu.vmm_create(data)?);
        let (sync, sync_sharing) = team.polled(sync_bytes, Sharing::Vmm)?;
        let (staging, staging_sharing) = if ipc {
            (gpu.alloc(staging_bytes, MemKind::Ipc { uncached: true })?, Sharing::Ipc)
        } else {
            (gpu.vmm_create(staging_bytes)?, Sharing::Vmm)
        };
        // The per-block epoch counters, then symm_ll_norm's per-row packet counters (a row takes a packet at least;
        // zero between calls).
        let counters = gpu.alloc(MAX_BLOCKS * 8 + ll_packets * 4, MemKind::Device)?;
        let stream = gpu.stream()?;
        if ipc {
            // SAFETY: the flags are the last FLAG_SLOTS words of our own staging allocation, not yet shared.
            unsafe { stream.memset(staging.ptr().offset(flags_at), 0, FLAG_SLOTS * 8)? };
        }
        let mut words = opts.first_epoch.to_le_bytes().repeat(MAX_BLOCKS);
        words.resize(MAX_BLOCKS * 8 + ll_packets * 4, 0);
        stream.upload(&counters, 0, &words)?;
        stream.sync()?;
        let bufs =
            [(&input, Sharing::Vmm), (&output, Sharing::Vmm), (&sync, sync_sharing), (&staging, staging_sharing)];
        let peers = team.exchange(name, &bufs)?;
        let status = team.status()?;
        let mut base = TunedParams {
            status: status.ptr,
            inputs: peers.column(0),
            outputs: peers.column(1),
            packets: peers.column(2),
            staging: peers.column(3),
            counters: counters.ptr().0,
            ll_packets: ll_packets as u64,
            half_bytes: half as u64,
            timeout_ns: team.timeout_ns(),
            rank: rank as u32,
            world: world as u32,
            ..bytemuck::Zeroable::zeroed()
        };
        for r in 0..world {
            base.flags[r] = if ipc { base.staging[r] } else { base.packets[r] } + flags_at as u64;
        }
        let module = gpu.load(&LIBRARY)?;
        let (mut kernels, mut caps, mut table_kernels, mut table_caps, mut unfit) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let tags = Stem::ALL
            .map(|stem| flag_tag(stem.name()).ok_or_else(|| format!("{} has no epoch-flag tag", stem.name())))
            .into_iter()
            .collect::<Result<Vec<u32>, String>>()
            .map_err(CollectiveError::BadArgs)?;
        for stem in Stem::ALL {
            let first = kernels.len();
            for dtype in DType::ALL {
                kernels.push(module.kernel(&format!("{}_{dtype}", stem.name()))?);
            }
            let threads = stem.threads(gpu.kind());
            let cap = team.resident_cap(&format!("{name} {}", stem.name()), &kernels[first..], threads)?;
            if cap.is_none() {
                unfit.push(team.unfit(stem.name(), threads));
            }
            caps.push(cap);
            let Some(table) = stem.table_name() else {
                table_kernels.extend(DType::ALL.map(|_| None));
                table_caps.push(None);
                continue;
            };
            for dtype in DType::ALL {
                table_kernels.push(Some(module.kernel(&format!("{table}_{dtype}"))?));
            }
            let of_stem = table_kernels[first..].iter().flatten();
            let table_cap = team.resident_cap(&format!("{name} {table}"), of_stem, threads)?;
            if table_cap.is_none() {
                unfit.push(team.unfit(table, threads));
            }
            table_caps.push(table_cap);
        }
        let fixed = match opts.rule {
            Some(asked) => {
                if gpu.kind() != DriverKind::Host && asked.threads > THREADS {
                    return Err(CollectiveError::Unsupported(format!(
                        "{name}: blocks of {} threads asked; its kernels are compiled for at most {THREADS}",
                        asked.threads
                    )));
                }
                let first = design.kernel(0, Mode::Eager) as usize * DType::ALL.len();
                let cap = team.required_cap(name, &kernels[first..first + DType::ALL.len()], asked.threads)?;
                asked.check_requested(name, cap, world)?;
                Some((asked, cap))
            }
            None => None,
        };
        // Every flag and packet is zero before anyone writes one.
        team.rdv.barrier(&format!("{name} setup"))?;
        Ok(SymmTuned {
            name,
            design,
            copy_in: opts.copy_in,
            capacity: opts.capacity_bytes,
            kind: gpu.kind(),
            caps,
            fixed,
            base,
            kernels,
            table_kernels,
            table_caps,
            unfit,
            tags,
            _peers: peers.mapped,
            input,
            output,
            _sync: sync,
            _staging: staging,
            _counters: counters,
            status,
        })
    }
}

/// Where the peers find one call's buffers: where the input and output lie in a buffer the caller registered with
/// every peer, every rank's address of that buffer at the same offset; or, for a call captured into a graph before
/// its buffers are registered, the peer table the kernel will read them from. The default (nothing): buffers
/// known only to this rank, which the designs that read peers' inputs (or write peers' outputs) reach through the
/// registered buffers, with copies.
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerBuffers {
    pub inputs: Option<[u64; MAX_RANKS]>,
    pub outputs: Option<[u64; MAX_RANKS]>,
    pub deferred: Option<Deferred>,
}

/// A call whose peers' addresses are filled in later (a graph capture on the caller's buffers): the device table
/// of [`PEER_TABLE_BYTES`] the kernel reads them from, and whether this rank's input and output can be shared
/// (when not, the call copies through the registered buffer, and peers are told to use that).
#[derive(Clone, Copy, Debug)]
pub struct Deferred {
    pub table: DevicePtr,
    pub input_shareable: bool,
    pub output_shareable: bool,
}

/// Where the peers of a deferred call find one of this rank's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerView {
    /// The caller's range at this address, once every peer has mapped it.
    Caller(DevicePtr),
    /// This rank's registered buffer (the call copies through it).
    Registered,
}

/// What a deferred call left to fill in: its input's view, its output's when peers write it, and this rank's own
/// addresses, which its own table entries hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeferredUse {
    pub input: PeerView,
    pub output: Option<PeerView>,
    pub own_input: DevicePtr,
    pub own_output: DevicePtr,
}

impl SymmTuned {
    /// Largest message `design` takes: the packet designs are bounded by the packet area (`symm_zc_2shot_ll`
    /// carries one shard, a multiple of 128 bytes, per source).
    pub fn capacity_for(&self, design: Design) -> usize {
        match design {
            Design::Ll => self.capacity.min(LL_MAX_BYTES),
            Design::ZeroCopyTwoShotLl => {
                let per_source = (self.base.ll_packets as usize * 4) / LINE_BYTES * LINE_BYTES;
                self.capacity.min(per_source * self.base.world as usize)
            }
            _ => self.capacity,
        }
    }

    /// The kernel that carries `call`'s residual add and RMSNorm on `design`, if it has one: `symm_ll_norm` where the
    /// call's rows fit the packet area (each row from a packet of its own, so up to a packet more per row than the
    /// bytes), `symm_zc_1shot_norm`, `symm_zc_2shot_norm`, `symm_epoch_1shot_norm`, `symm_zc_2shot_push_norm` where
    /// its slots fit a staging half, and `symm_zc_2shot_ll_norm` where the largest share's rows fit a source's packets.
    /// None also where that kernel fits on this device not even one block.
    fn norm_stem(&self, design: Design, call: &Call) -> Option<Stem> {
        let norm = call.norm()?;
        let stem = match design {
            Design::Ll => {
                let packets = norm.rows(call.count()) * row_packets(norm.hidden, call.dtype().size());
                let fits = call.bytes() <= self.capacity_for(design) && packets <= self.base.ll_packets as usize;
                fits.then_some(Stem::LlNorm)
            }
            Design::ZeroCopyOneShot => Some(Stem::ZeroCopyOneShotNorm),
            Design::ZeroCopyTwoShot => Some(Stem::ZeroCopyTwoShotNorm),
            Design::EpochOneShot => Some(Stem::EpochOneShotNorm),
            Design::ZeroCopyTwoShotLl => {
                let packets =
                    norm.rows(call.count()).div_ceil(call.world()) * row_packets(norm.hidden, call.dtype().size());
                (packets <= self.base.ll_packets as usize).then_some(Stem::ZeroCopyTwoShotLlNorm)
            }
            Design::ZeroCopyTwoShotPush => {
                // Slots of the largest share's rows per rank: up to a row per rank more than the message.
                let slots = call.count() + (call.world() - 1) * norm.hidden;
                (slots * call.dtype().size() <= self.base.half_bytes as usize).then_some(Stem::ZeroCopyTwoShotPushNorm)
            }
            _ => None,
        };
        stem.filter(|&stem| self.fits(stem))
    }

    /// Whether `design` carries `call`'s residual add and RMSNorm in its kernel (see [`SymmTuned::run_design`]).
    pub fn carries_norm(&self, design: Design, call: &Call) -> bool {
        self.norm_stem(design, call).is_some()
    }

    /// Whether at least one block of `stem`, and of its `*_table` variant where it has one, fits beside the peers.
    fn fits(&self, stem: Stem) -> bool {
        let s = stem as usize;
        self.caps[s].is_some() && (stem.table_name().is_none() || self.table_caps[s].is_some())
    }

    /// Whether every kernel of `design`'s plain calls fits on this device (set-up drops those that do not; see
    /// [`SymmTuned::unfit`]).
    pub fn runs(&self, design: Design) -> bool {
        design.stems().iter().all(|&stem| self.fits(stem))
    }

    /// Why set-up dropped each kernel that this device fits not even one block of (empty where every one fits).
    pub fn unfit(&self) -> &[String] {
        &self.unfit
    }

    /// The kernel `design` runs for `bytes` on `stream`: asking whether the stream captures costs a driver call,
    /// so only the sizes whose kernel depends on it ask.
    pub fn kernel_for(&self, design: Design, bytes: usize, stream: &Stream) -> Result<&'static str, CollectiveError> {
        let mode = if design.depends_on_mode(bytes) { Mode::of(stream)? } else { Mode::Eager };
        Ok(design.kernel(bytes, mode).name())
    }

    /// Every rank's registered input and output, as a peer table holds them (the views of [`PeerView::Registered`]).
    pub fn registered_views(&self) -> ([u64; MAX_RANKS], [u64; MAX_RANKS]) {
        (self.base.inputs, self.base.outputs)
    }

    /// This rank's packet area (u64 slots: 2 parities x `MAX_RANKS` sources x the slots per source) and its bytes,
    /// where peers store packets during calls: for tests that plant packets which no call may read as data.
    pub fn packet_area(&self) -> (DevicePtr, usize) {
        (DevicePtr(self.base.packets[self.base.rank as usize]), packet_bytes(self.base.ll_packets as usize))
    }

    /// Runs any of the designs on `call` (what `auto` picks per size), as `Collective::run` runs its own; a call with
    /// the residual add and RMSNorm only on a design that [carries it](SymmTuned::carries_norm).
    /// Kernels that read only this rank's input (packets, the epoch one-shot) read the caller's input in place;
    /// the zero-copy kernels read every peer's input, so an input outside a registered buffer is copied in first
    /// (likewise for two-shot's output, which every peer writes). With `peers.deferred`, the zero-copy kernels read
    /// every rank's buffers from its table instead, and the call returns what the table must be filled with.
    ///
    /// # Safety
    /// As [`Collective::run`], with `call` checked for no more than this communicator's capacity and of no more
    /// bytes than [`SymmTuned::capacity_for`] `design` (the packet designs' areas are smaller than the buffers); in
    /// addition, `peers.inputs` / `outputs`, when given, are every rank's mapping of a buffer that every rank
    /// passes, at the same offset, to this same call; `peers.deferred`'s table
    /// is device memory of [`PEER_TABLE_BYTES`] that holds, whenever the stream runs the call, every rank's views
    /// of this call's buffers (as each rank's [`DeferredUse`] says), or at least addresses of live buffers of
    /// `count` elements.
    pub unsafe fn run_design(
        &self,
        design: Design,
        call: &Call,
        peers: &PeerBuffers,
        stream: &Stream,
    ) -> Result<Option<DeferredUse>, CollectiveError> {
        let fits = call.capacity() <= self.capacity && call.bytes() <= self.capacity_for(design);
        debug_assert!(fits && call.op() == Op::AllReduce, "the contract");
        let (dtype, count, bytes) = (call.dtype(), call.count(), call.bytes());
        let mode = if design.depends_on_mode(bytes) { Mode::of(stream)? } else { Mode::Eager };
        let bias = call.bias().map_or(0, |b| b.0);
        let mut params = TunedParams { count: count as u64, dtype: dtype.code(), bias, ..self.base };
        let stem = match (call.norm(), self.norm_stem(design, call)) {
            (None, _) => design.kernel(bytes, mode),
            (Some(norm), Some(stem)) => {
                let (residual, weight) = (norm.residual.0, norm.weight.0);
                params = TunedParams { residual, weight, hidden: norm.hidden as u32, eps: norm.eps, ..params };
                stem
            }
            (Some(_), None) => {
                let what = format!("{} does not carry the residual add and RMSNorm of this call", design.method());
                return Err(CollectiveError::BadArgs(what));
            }
        };
        if !self.fits(stem) {
            let what = format!("{} does not run on this device: {}", design.method(), self.unfit.join("; "));
            return Err(CollectiveError::Unsupported(what));
        }
        let s = stem as usize;
        params.tag = self.tags[s];
        // Blocks of the norm's lanes; the fused packets spread their exchange over a packet per thread where the
        // cap allows (and at least a block per row), the zero-copy one-shot's blocks own rows.
        let dims = |cap| match call.norm() {
            Some(norm) if stem == Stem::LlNorm => {
                let packets = norm.rows(count) * row_packets(norm.hidden, dtype.size());
                norm_dims(row_grid(norm.rows(count).max(packets.div_ceil(NORM_LANES)), cap))
            }
            Some(norm) => norm_dims(row_grid(norm.rows(count), cap)),
            None => rule(self.kind, stem, bytes).plan(bytes, cap).dims(),
        };
        let own_dims = match (self.fixed, call.norm()) {
            (Some((asked, cap)), None) if design == self.design => asked.plan(bytes, cap).dims(),
            _ => dims(self.caps[s].expect("the stem fits")),
        };
        let me = self.base.rank as usize;
        let (input, output) = (call.input(), call.output());
        let reads_peers = stem.reads_peers();
        let pushes = matches!(stem, Stem::ZeroCopyTwoShotPush | Stem::ZeroCopyTwoShotPushNorm);
        let writes_peers = pushes || matches!(stem, Stem::ZeroCopyTwoShot | Stem::ZeroCopyTwoShotNorm);
        // The pulled two-shot writes its output only in its own shard before its last barrier (the one range of its
        // input no peer reads), so its output may be its input.
        let pulls = stem == Stem::ZeroCopyTwoShotPull;
        let deferred = peers.deferred.filter(|_| reads_peers);
        // Peers read a zero-copy input while this rank writes its output: in place, the output goes elsewhere.
        let in_place = input == output;
        let mut copy_out = false;
        let (mut input_view, mut output_view) = (PeerView::Registered, None);
        if pushes {
            // Pushed wherever the input lies (no peer reads it), so that ranks whose inputs lie in different places
            // still run one protocol.
            params.copy_from = input.0;
        } else if !reads_peers {
            params.inputs[me] = input.0;
        } else if let (Some(p), false) = (peers.inputs, in_place) {
            params.inputs = p;
        } else if deferred.is_some_and(|d| d.input_shareable && !in_place) && input != self.input.ptr() {
            params.inputs[me] = input.0;
            input_view = PeerView::Caller(input);
        } else if input != self.input.ptr() {
            if self.copy_in.fuses(stem) {
                params.copy_from = input.0;
            } else {
                // SAFETY: `input` holds `count` elements (the caller's contract), our registered input `capacity`.
                unsafe { stream.copy(self.input.ptr(), input, bytes)? };
            }
        }
        if writes_peers {
            output_view = Some(PeerView::Registered);
            match peers.outputs {
                _ if output == self.output.ptr() => {}
                Some(p) => params.outputs = p,
                _ if deferred.is_some_and(|d| d.output_shareable) => {
                    params.outputs[me] = output.0;
                    output_view = Some(PeerView::Caller(output));
                }
                _ => copy_out = true,
            }
        } else if reads_peers && !pulls && in_place && params.inputs[me] == output.0 {
            copy_out = true;
        } else {
            params.outputs[me] = output.0;
        }
        let d = DType::ALL.iter().position(|&t| t == dtype).expect("every dtype is in ALL");
        let used = DeferredUse {
            input: input_view,
            output: output_view,
            own_input: DevicePtr(params.inputs[me]),
            own_output: DevicePtr(params.outputs[me]),
        };
        let kernel = match deferred {
            Some(def) => {
                params.peer_table = def.table.0;
                let k = self.table_kernels[s * DType::ALL.len() + d].as_ref().expect("zero-copy stems have one");
                (k, dims(self.table_caps[s].expect("the stem fits")))
            }
            None => (&self.kernels[s * DType::ALL.len() + d], own_dims),
        };
        // SAFETY: every address in `params` is the caller's (its contract) or this communicator's own memory
        // mapped on every rank, each of at least the capacity the call was checked for; the peer table holds such addresses
        // whenever the stream runs the call (the contract).
        unsafe { stream.launch(kernel.0, kernel.1, &params)? };
        if copy_out {
            // SAFETY: as the copy in.
            unsafe { stream.copy(output, self.output.ptr(), bytes)? };
        }
        Ok(deferred.map(|_| used))
    }
}

impl Collective for SymmTuned {
    fn name(&self) -> &str {
        self.name
    }

    fn op(&self) -> Op {
        Op::AllReduce
    }

    fn supports(&self, op: Op, _dtype: DType) -> Result<(), String> {
        if op != Op::AllReduce {
            return Err(format!("{} runs {}, not {op}", self.name, Op::AllReduce));
        }
        match self.runs(self.design) {
            true => Ok(()),
            false => Err(format!("does not run on this device: {}", self.unfit.join("; "))),
        }
    }

    fn capacity_bytes(&self) -> usize {
        self.capacity_for(self.design)
    }

    fn registered_input(&self) -> Option<&DeviceBuffer> {
        Some(&self.input)
    }

    fn registered_output(&self) -> Option<&DeviceBuffer> {
        Some(&self.output)
    }

    fn failure(&self) -> Result<Option<(Vec<usize>, String)>, CollectiveError> {
        self.status.failure()
    }

    unsafe fn run(&mut self, call: &Call, stream: &Stream) -> Result<(), CollectiveError> {
        // SAFETY: the caller's contract is run_design's, without registered peer buffers.
        unsafe { self.run_design(self.design, call, &PeerBuffers::default(), stream) }.map(|_| ())
    }
}
