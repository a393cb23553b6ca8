//! The engine behind [`crate::Communicator`] and comm-bench's `auto`: car's one-shot and two-shot and the tuned
//! symmetric-memory designs, built once, and per call the choice the tune table of the call's mode and residency
//! names.

use crate::tune::{Algorithm, Choice, LoadedTable, Mode, Residency, Tables};
use collective_core::{AddRmsNorm, Call, Collective, CollectiveError, Team};
use gpu::{DeviceBuffer, DevicePtr, Stream};
use symm::tuned::{DeferredUse, Design, PeerBuffers, SymmTuned, TunedOptions};

/// Where the fused norm's two-shot takes over from its one-shot (see [`Engine::fused`]).
pub const NORM_TWO_SHOT_BYTES: usize = 1 << 20;

pub struct Engine {
    tables: Tables,
    car_1shot: car::Car,
    car_2shot: car::Car,
    symm: SymmTuned,
    /// The unfused sequence's norm, after a design that does not carry it.
    norm: car::AddRmsNormKernel,
}

impl Engine {
    /// Builds every candidate. Collective: every rank calls it with the same tables.
    pub fn new(team: Team<'_>, capacity_bytes: usize, tables: Tables) -> Result<Engine, CollectiveError> {
        if team.gpu.kind() == gpu::DriverKind::Host {
            let stems = std::env::var(gpu::UNFIT_KERNELS_VAR).unwrap_or_default();
            let unknown = gpu::unknown_unfit_stems(&stems, &[&car::LIBRARY, &symm::LIBRARY, &symm::tuned::LIBRARY]);
            if !unknown.is_empty() {
                return Err(CollectiveError::BadArgs(format!(
                    "{} names {unknown:?}, which are no kernel's name (without its dtype suffix)",
                    gpu::UNFIT_KERNELS_VAR
                )));
            }
        }
        let car = |algo| {
            let opts = car::CarOptions { capacity_bytes, uncached: true, rule: None, variant: car::Variant::Base };
            car::Car::new(team, algo, opts)
        };
        Ok(Engine {
            tables,
            car_1shot: car(car::Algo::OneShot)?,
            car_2shot: car(car::Algo::TwoShot)?,
            symm: SymmTuned::new(team, Design::TwoShotTuned, TunedOptions::new(capacity_bytes))?,
            norm: car::AddRmsNormKernel::new(team.gpu)?,
        })
    }

    pub fn table(&self, mode: Mode, residency: Residency) -> &LoadedTable {
        self.tables.get(mode, residency)
    }

    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// The tables later calls follow (every rank sets the same ones).
    pub fn tables_mut(&mut self) -> &mut Tables {
        &mut self.tables
    }

    /// The tuned designs (their registered buffers and views).
    pub fn symm(&self) -> &SymmTuned {
        &self.symm
    }

    /// The choice for a message of `bytes` in `residency` on `stream`: the stream is asked whether it captures
    /// only when the two modes' tables disagree at this size (the query is a driver call).
    pub fn choose(&self, bytes: usize, residency: Residency, stream: &Stream) -> Result<Choice, CollectiveError> {
        let pick = |mode| self.tables.get(mode, residency).pick(bytes);
        let (eager, graph) = (pick(Mode::Eager), pick(Mode::Graph));
        Ok(if eager == graph || !stream.is_capturing()? { eager } else { graph })
    }

    /// The choice for `call` with the residual add and RMSNorm `norm` in `residency` on `stream`: the norm calls'
    /// table of the call's mode (the stream asked whether it captures only where the two modes' tables disagree),
    /// where one was found, else [`Engine::fused`].
    pub fn choose_norm(
        &self,
        call: &Call,
        norm: &AddRmsNorm,
        residency: Residency,
        stream: &Stream,
    ) -> Result<Choice, CollectiveError> {
        let pick = |mode| self.tables.norm(mode, residency).map(|t| t.pick(call.bytes()));
        Ok(match (pick(Mode::Eager), pick(Mode::Graph)) {
            (None, None) => self.fused(call, norm),
            (Some(eager), Some(graph)) if eager == graph => eager,
            (eager, graph) => {
                let (this, other) = if stream.is_capturing()? { (graph, eager) } else { (eager, graph) };
                this.or(other).expect("one mode has a table")
            }
        })
    }

    /// The fused design for `call` with the residual add and RMSNorm `norm` where no table was measured: car's
    /// two-shot from [`NORM_TWO_SHOT_BYTES`] when every rank has at least two rows of its own, else car's one-shot.
    /// Measured on one H200 with 8 ranks under MPS (`results/h200-mps/norm/`): both beat the unfused sequence at
    /// every size but one token of 8192 in a graph; the fused packets beat car's one-shot only at one token
    /// (`results/h200-mps/norm/last-block`), so the rule leaves them to a tune.
    pub fn fused(&self, call: &Call, norm: &AddRmsNorm) -> Choice {
        Choice::of(if call.bytes() >= NORM_TWO_SHOT_BYTES && norm.rows(call.count()) >= 2 * call.world() {
            Algorithm::Car2Shot
        } else {
            Algorithm::Car1Shot
        })
    }

    /// Enqueues the unfused norm of `call` over its output, where an allreduce before it on `stream` wrote the sum.
    ///
    /// # Safety
    /// As [`car::AddRmsNormKernel::enqueue`].
    pub unsafe fn enqueue_norm(&self, call: &Call, stream: &Stream) -> Result<(), CollectiveError> {
        // SAFETY: the caller's contract.
        unsafe { self.norm.enqueue(call, stream) }
    }

    /// The registered input: a caller that writes its input here saves the zero-copy designs their copy-in.
    pub fn registered_input(&self) -> &DeviceBuffer {
        self.symm.registered_input().expect("the tuned designs have registered buffers")
    }

    /// The registered output, which the zero-copy two-shot's peers write into directly.
    pub fn registered_output(&self) -> &DeviceBuffer {
        self.symm.registered_output().expect("the tuned designs have registered buffers")
    }

    /// Where a call on `input` with no caller registration lives: the registered input, or the caller's memory.
    pub fn residency_of(&self, input: DevicePtr) -> Residency {
        if self.registered_input().ptr() == input {
            Residency::Registered
        } else {
            Residency::Caller
        }
    }

    /// What runs when `choice` is asked for on `call`: packets carry no more than their area, so larger messages
    /// take the zero-copy design of the same shape, and norm calls whose rows do not fit the fused packets car's fused
    /// one-shot; a design that set-up dropped (its kernels fit no block on this device: [`SymmTuned::unfit`]) runs
    /// car's of the same shape; a norm call on a design that does not carry the norm ([`SymmTuned::carries_norm`],
    /// [`car::Car::owns_rows`]) runs unfused. On a plain call, never `unfused`.
    pub fn runs_as(&self, choice: Choice, call: &Call) -> Choice {
        let bytes = call.bytes();
        let norm = call.norm().is_some();
        let unfused = norm && choice.unfused;
        let algorithm = match choice.algorithm {
            Algorithm::SymmLl if norm && !unfused && !self.symm.carries_norm(Design::Ll, call) => Algorithm::Car1Shot,
            Algorithm::SymmLl if bytes > self.symm.capacity_for(Design::Ll) => Algorithm::SymmZc1Shot,
            Algorithm::SymmZc2ShotLl if bytes > self.symm.capacity_for(Design::ZeroCopyTwoShotLl) => {
                Algorithm::SymmZc2Shot
            }
            a => a,
        };
        let algorithm = match Engine::design(algorithm) {
            Some(design) if !self.symm.runs(design) => match algorithm {
                Algorithm::SymmZc2ShotLl
                | Algorithm::SymmZc2Shot
                | Algorithm::SymmZc2ShotPush
                | Algorithm::SymmZc2ShotPull => Algorithm::Car2Shot,
                _ => Algorithm::Car1Shot,
            },
            _ => algorithm,
        };
        let carried = match (Engine::design(algorithm), algorithm) {
            (Some(design), _) => self.symm.carries_norm(design, call),
            (None, Algorithm::Car1Shot) => self.car_1shot.owns_rows(),
            (None, Algorithm::Car2Shot) => self.car_2shot.owns_rows(),
            (None, _) => false,
        };
        Choice { algorithm, unfused: unfused || (norm && !carried) }
    }

    /// Why set-up dropped each kernel that this device fits not even one block of, and what runs instead.
    pub fn unfit(&self) -> Vec<String> {
        let designs = self.symm.unfit().iter().map(|why| format!("{why}: the designs that need it run car's"));
        let car = [&self.car_1shot, &self.car_2shot].into_iter().filter_map(|c| c.unfit());
        designs.chain(car.map(|why| format!("{why}: the norm runs after the allreduce"))).collect()
    }

    /// The tuned design of `algorithm`; None for car's.
    fn design(algorithm: Algorithm) -> Option<Design> {
        Some(match algorithm {
            Algorithm::SymmLl => Design::Ll,
            Algorithm::SymmZc1Shot => Design::ZeroCopyOneShot,
            Algorithm::SymmEpoch1Shot => Design::EpochOneShot,
            Algorithm::SymmZc2ShotLl => Design::ZeroCopyTwoShotLl,
            Algorithm::SymmZc2Shot => Design::ZeroCopyTwoShot,
            Algorithm::SymmZc2ShotPush => Design::ZeroCopyTwoShotPush,
            Algorithm::SymmZc2ShotPull => Design::ZeroCopyTwoShotPull,
            Algorithm::Car1Shot | Algorithm::Car2Shot | Algorithm::CarReduceScatter | Algorithm::CarAllGather => {
                return None
            }
        })
    }

    /// Whether `choice` on `call` reads its peers' buffers in place (the zero-copy designs), so that a call captured
    /// on unregistered buffers needs their addresses deferred to a peer table.
    pub fn reads_peer_buffers(&self, choice: Choice, call: &Call) -> bool {
        Engine::design(self.runs_as(choice, call).algorithm).is_some_and(Design::reads_peers)
    }

    /// Runs `choice` (of an allreduce candidate) on `call`, as [`Engine::runs_as`] says; with `peers.deferred`,
    /// what its peer table must hold (None: the algorithm reads no peer's buffers in place, so the table is unused).
    ///
    /// # Safety
    /// As [`SymmTuned::run_design`], with `call` checked for no more than the engine's capacity.
    pub unsafe fn run(
        &self,
        choice: Choice,
        call: &Call,
        peers: &PeerBuffers,
        stream: &Stream,
    ) -> Result<Option<DeferredUse>, CollectiveError> {
        let runs = self.runs_as(choice, call);
        if runs.unfused {
            // The unfused sequence: the allreduce, then the norm over its result, in stream order.
            // SAFETY: the caller's contract, for both.
            let used = unsafe { self.run(Choice::of(runs.algorithm), &call.without_norm(), peers, stream)? };
            unsafe { self.enqueue_norm(call, stream)? };
            return Ok(used);
        }
        let design = match runs.algorithm {
            // SAFETY (both car arms): the caller's contract.
            Algorithm::Car1Shot => return unsafe { self.car_1shot.enqueue(call, stream) }.map(|_| None),
            Algorithm::Car2Shot => return unsafe { self.car_2shot.enqueue(call, stream) }.map(|_| None),
            a => Engine::design(a).ok_or_else(|| CollectiveError::BadArgs(format!("{a} is not an allreduce")))?,
        };
        // SAFETY: the caller's contract; runs_as keeps the packet designs within their areas (a norm call on the
        // packets within the fused kernel's) and norm calls on the designs that carry the norm.
        unsafe { self.symm.run_design(design, call, peers, stream) }
    }
}
