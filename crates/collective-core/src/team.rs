//! The set-up every custom method shares, written once: agreeing on sizes, mapping every peer's buffers, and launch
//! caps that every rank computes alike.

use crate::status::{read_words, recorded, STATUS_BYTES};
use crate::{check_world, CollectiveError};
use gpu::{DeviceBuffer, DevicePtr, DriverKind, Gpu, Kernel, MemKind};
use ipc::Rendezvous;
use std::os::fd::AsFd;
use std::time::Duration;

/// What a method is built from: this rank's device, the job's rendezvous, and how many ranks share this device
/// (from the placement the ranks agreed on, not from `world / device count`), how long a kernel waits for a peer,
/// and the status words its waits watch and record a failure in.
#[derive(Clone, Copy)]
pub struct Team<'a> {
    pub gpu: &'a Gpu,
    pub rdv: &'a Rendezvous,
    pub ranks_per_device: usize,
    pub kernel_timeout: Duration,
    /// Why atomics on peers' memory are not native here (the drivers' report), which the compare-and-swap
    /// handshakes need; `None` where no pair is known to lack them.
    pub missing_peer_atomics: Option<&'a str>,
    /// The communicator's status words (`STATUS_BYTES`, `kernels/include/arx/sync.h`); `None`: a method built on its
    /// own watches words of its own ([`Team::status`]).
    pub status: Option<DevicePtr>,
}

/// Blocks per rank that leave a multiprocessor free when `ranks_per_device` ranks share a device of `units`: the ranks'
/// grids spread one block per multiprocessor first, and a rank that lags behind its peers must still run its own
/// earlier kernels (a norm kernel that takes a whole multiprocessor, say) before it reaches the collective whose
/// blocks on every other rank spin waiting for it. With a spinning block on every multiprocessor those kernels never
/// start, and the peers wait until their deadline. None where nothing is limited: a rank alone on its device, or host
/// kernels (each runs to completion on its caller's thread). On a device with no more units than ranks, one block
/// each (the most that can still run at all).
fn spare_unit_cap(kind: DriverKind, units: usize, ranks_per_device: usize) -> Option<usize> {
    (kind != DriverKind::Host && ranks_per_device > 1).then(|| (units.saturating_sub(1) / ranks_per_device).max(1))
}

/// Zeroed status words for `gpu`'s kernels to watch. On HIP they are uncached memory, as the polled flags are: the
/// host's store of the abort word into coarse-grained memory need not reach a kernel that is already polling.
pub fn status_words(gpu: &Gpu) -> Result<DeviceBuffer, CollectiveError> {
    let kind = match gpu.kind() {
        DriverKind::Hip => MemKind::Ipc { uncached: true },
        DriverKind::Cuda | DriverKind::Host => MemKind::Device,
    };
    let buf = gpu.alloc(STATUS_BYTES, kind)?;
    let stream = gpu.stream()?;
    stream.fill(&buf, 0)?;
    stream.sync()?;
    Ok(buf)
}

/// Status words a method allocated for itself because its team had none; the kernels' address is `ptr`.
pub struct OwnStatus {
    pub ptr: u64,
    buf: Option<DeviceBuffer>,
}

impl OwnStatus {
    /// [`crate::Collective::failure`] of the method that holds these words: read where they are its own.
    pub fn failure(&self) -> Result<Option<(Vec<usize>, String)>, CollectiveError> {
        match &self.buf {
            Some(buf) => Ok(recorded(&read_words(buf, None)?)),
            None => Ok(None),
        }
    }
}

/// Every rank's copies of a set of buffers, as mapped here: `ptrs[rank][k]` is rank `rank`'s buffer `k`.
pub struct PeerMaps {
    pub ptrs: Vec<Vec<DevicePtr>>,
    /// The peers' mappings, unmapped when dropped (after every stream that may use them is idle).
    pub mapped: Vec<DeviceBuffer>,
}

impl PeerMaps {
    /// Rank by rank, buffer `k`'s addresses, padded with zeros to `N` ranks (a kernel parameter block's array).
    pub fn column<const N: usize>(&self, k: usize) -> [u64; N] {
        let mut out = [0u64; N];
        self.ptrs.iter().zip(out.iter_mut()).for_each(|(p, o)| *o = p[k].0);
        out
    }
}

/// How a buffer travels to the peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// A VMM allocation whose POSIX fd travels over the rendezvous socket.
    Vmm,
    /// A classic IPC allocation whose handle travels through the rendezvous segment.
    Ipc,
}

impl<'a> Team<'a> {
    pub fn new(gpu: &'a Gpu, rdv: &'a Rendezvous, ranks_per_device: usize) -> Team<'a> {
        Team {
            gpu,
            rdv,
            ranks_per_device: ranks_per_device.max(1),
            kernel_timeout: rdv.timeout(),
            missing_peer_atomics: None,
            status: None,
        }
    }

    /// The same team, whose kernels watch (and record their failures in) the status words at `status`, of
    /// [`STATUS_BYTES`], zeroed, live as long as any method built from it.
    pub fn with_status(self, status: DevicePtr) -> Team<'a> {
        Team { status: Some(status), ..self }
    }

    /// The status words a method's kernels watch: the team's, or zeroed ones of the method's own (kept with it).
    pub fn status(&self) -> Result<OwnStatus, CollectiveError> {
        if let Some(p) = self.status {
            return Ok(OwnStatus { ptr: p.0, buf: None });
        }
        let buf = status_words(self.gpu)?;
        Ok(OwnStatus { ptr: buf.ptr().0, buf: Some(buf) })
    }

    /// The same team, told that atomics on peers' memory are not native (`reason`).
    pub fn with_missing_peer_atomics(self, reason: Option<&'a str>) -> Team<'a> {
        Team { missing_peer_atomics: reason, ..self }
    }

    /// Refuses a method whose barrier is a compare-and-swap on peers' memory where those atomics are not native.
    pub fn require_peer_atomics(&self, name: &str) -> Result<(), CollectiveError> {
        match self.missing_peer_atomics {
            Some(reason) => Err(CollectiveError::Unsupported(format!(
                "{name}: its handshake is a compare-and-swap on peers' memory, and {reason}"
            ))),
            None => Ok(()),
        }
    }

    /// The same team with kernels that wait `timeout` for a peer (set-up's own waits keep the rendezvous's).
    pub fn with_kernel_timeout(self, timeout: Duration) -> Team<'a> {
        Team { kernel_timeout: timeout, ..self }
    }

    pub fn rank(&self) -> usize {
        self.rdv.rank()
    }

    pub fn world(&self) -> usize {
        self.rdv.world()
    }

    /// The kernels' per-wait deadline, in nanoseconds.
    pub fn timeout_ns(&self) -> u64 {
        self.kernel_timeout.as_nanos().min(u64::MAX as u128) as u64
    }

    /// Refuses a world the custom kernels cannot address or an empty capacity, and checks that every rank asked
    /// for the same capacity (a peer would otherwise read past a buffer).
    pub fn agree_capacity(&self, name: &str, capacity_bytes: usize) -> Result<(), CollectiveError> {
        check_world(name, self.world())?;
        if capacity_bytes == 0 {
            return Err(CollectiveError::BadArgs(format!("{name}: capacity must be at least 1 byte")));
        }
        let mine = (capacity_bytes as u64).to_le_bytes();
        let all = self.rdv.all_gather(&format!("{name} capacity"), &mine)?;
        if let Some(r) = all.iter().position(|c| c[..] != mine) {
            return Err(CollectiveError::Mismatch(format!(
                "{name}: rank {r} asked for a different capacity than rank {} ({capacity_bytes} bytes)",
                self.rank()
            )));
        }
        Ok(())
    }

    /// Blocks of any of `kernels` (of `threads` threads; a kernel's dtype variants, which differ in registers) one
    /// rank may launch so that the blocks of every rank sharing a device are resident at once: the least occupancy
    /// of the kernels on this device over the ranks that share it, and no more than `spare_unit_cap` allows; then
    /// the minimum over all ranks, so that no block ever waits for a peer block (or a block of its own grid, or a
    /// lagging peer's earlier kernel) that cannot run. None where some rank fits not even one block (every rank gets
    /// the same answer), so the caller can do without these kernels.
    pub fn resident_cap<'k>(
        &self,
        name: &str,
        kernels: impl IntoIterator<Item = &'k Kernel>,
        threads: u32,
    ) -> Result<Option<usize>, CollectiveError> {
        let mut least: Option<usize> = None;
        for kernel in kernels {
            let blocks = kernel.max_resident_blocks(threads, 0)?;
            least = Some(least.map_or(blocks, |l| l.min(blocks)));
        }
        let local = (least.unwrap_or(0) / self.ranks_per_device).min(self.spare_unit_cap().unwrap_or(usize::MAX));
        let all = self.rdv.all_gather(&format!("{name} resident blocks"), &(local as u64).to_le_bytes())?;
        let cap = all.iter().map(|b| u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as usize).min();
        Ok(cap.filter(|&c| c > 0))
    }

    /// `spare_unit_cap` on this team's device.
    fn spare_unit_cap(&self) -> Option<usize> {
        spare_unit_cap(self.gpu.kind(), self.gpu.info().multiprocessors, self.ranks_per_device)
    }

    /// What that cap does to this team's grids, where it applies: a note for the communicator to show, since it
    /// shapes every figure measured with ranks sharing a device.
    pub fn spare_unit_note(&self) -> Option<String> {
        self.spare_unit_cap().map(|cap| {
            format!(
                "{} ranks share a device of {} multiprocessors: each rank's grids are capped at {cap} blocks, so that \
                 together they leave one free for a lagging rank's kernels",
                self.ranks_per_device,
                self.gpu.info().multiprocessors
            )
        })
    }

    /// [`Team::resident_cap`] of kernels the caller cannot do without: none fitting is an error.
    pub fn required_cap<'k>(
        &self,
        name: &str,
        kernels: impl IntoIterator<Item = &'k Kernel>,
        threads: u32,
    ) -> Result<usize, CollectiveError> {
        self.resident_cap(name, kernels, threads)?
            .ok_or_else(|| CollectiveError::Unsupported(self.unfit(name, threads)))
    }

    /// Why kernels of `name` with blocks of `threads` threads cannot run on this team's devices.
    pub fn unfit(&self, name: &str, threads: u32) -> String {
        format!(
            "{name}: not even one block of {threads} thread(s) per rank fits beside the {} ranks that share a device",
            self.ranks_per_device
        )
    }

    /// How memory that a peer's running kernel polls (flags, packets) travels, where other memory would travel as
    /// `usual`: on HIP it is fine-grained uncached IPC memory, because a peer's store into coarse-grained memory
    /// (`hipMalloc`, `hipMemCreate`) need not reach a kernel that is already polling it; elsewhere `usual`.
    pub fn polled_sharing(&self, usual: Sharing) -> Sharing {
        match self.gpu.kind() {
            DriverKind::Hip => Sharing::Ipc,
            DriverKind::Cuda | DriverKind::Host => usual,
        }
    }

    /// `bytes` of zeroed memory that a peer's running kernel polls, and how it travels ([`Team::polled_sharing`]).
    pub fn polled(&self, bytes: usize, usual: Sharing) -> Result<(DeviceBuffer, Sharing), CollectiveError> {
        let sharing = self.polled_sharing(usual);
        let buf = match sharing {
            Sharing::Ipc => self.gpu.alloc(bytes, MemKind::Ipc { uncached: true })?,
            Sharing::Vmm => self.gpu.vmm_create(bytes)?,
        };
        let stream = self.gpu.stream()?;
        stream.fill(&buf, 0)?;
        stream.sync()?;
        Ok((buf, sharing))
    }

    /// Hands `bufs` to every peer, each the way its [`Sharing`] says, and maps theirs. Collective: every rank passes
    /// the same number of buffers of the same sizes and sharings.
    pub fn exchange(&self, name: &str, bufs: &[(&DeviceBuffer, Sharing)]) -> Result<PeerMaps, CollectiveError> {
        let (rank, gpu) = (self.rank(), self.gpu);
        // Every peer's mapping of buffer k: (rank, k, mapping).
        let mut theirs: Vec<(usize, usize, DeviceBuffer)> = Vec::new();
        let vmm: Vec<usize> = (0..bufs.len()).filter(|&k| bufs[k].1 == Sharing::Vmm).collect();
        if !vmm.is_empty() {
            let fds = vmm.iter().map(|&k| gpu.vmm_export_fd(bufs[k].0)).collect::<Result<Vec<_>, _>>()?;
            let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
            let all = self.rdv.all_gather_fds(&format!("{name} buffers"), &borrowed)?;
            for (r, fds) in all.into_iter().enumerate().filter(|(r, _)| *r != rank) {
                if fds.len() != vmm.len() {
                    return Err(CollectiveError::Mismatch(format!(
                        "{name}: rank {r} sent {} buffer handles, not {}",
                        fds.len(),
                        vmm.len()
                    )));
                }
                for (fd, &k) in fds.into_iter().zip(&vmm) {
                    theirs.push((r, k, gpu.vmm_import_fd(fd, bufs[k].0.bytes())?));
                }
            }
        }
        for (k, &(b, _)) in bufs.iter().enumerate().filter(|(_, (_, s))| *s == Sharing::Ipc) {
            let handles = self.rdv.all_gather(&format!("{name} handle {k}"), &gpu.ipc_export(b)?)?;
            for (r, h) in handles.iter().enumerate().filter(|(r, _)| *r != rank) {
                theirs.push((r, k, gpu.ipc_import(h, b.bytes())?));
            }
        }
        theirs.sort_by_key(|&(r, k, _)| (r, k));
        let ptrs = (0..self.world())
            .map(|r| {
                if r == rank {
                    bufs.iter().map(|(b, _)| b.ptr()).collect()
                } else {
                    theirs.iter().filter(|t| t.0 == r).map(|t| t.2.ptr()).collect()
                }
            })
            .collect();
        Ok(PeerMaps { ptrs, mapped: theirs.into_iter().map(|t| t.2).collect() })
    }
}

#[cfg(test)]
mod tests {
    use super::spare_unit_cap;
    use gpu::DriverKind;

    #[test]
    fn shared_devices_keep_a_multiprocessor_free() {
        // 8 ranks on 132 SMs: 16 blocks each, 128 in all; 4 ranks: 32 each (128); 2 ranks: 65 each (130).
        for (units, ranks, cap) in [(132, 8, 16), (132, 4, 32), (132, 2, 65), (132, 3, 43), (304, 8, 37)] {
            for kind in [DriverKind::Cuda, DriverKind::Hip] {
                assert_eq!(spare_unit_cap(kind, units, ranks), Some(cap), "{units} units, {ranks} ranks");
            }
            assert!(cap * ranks < units, "every rank's grid together leaves a unit free");
        }
        assert_eq!(spare_unit_cap(DriverKind::Cuda, 132, 1), None, "a rank alone on its device");
        assert_eq!(spare_unit_cap(DriverKind::Host, 2, 8), None, "host kernels never wait for a unit");
        assert_eq!(spare_unit_cap(DriverKind::Cuda, 8, 8), Some(1), "no unit to spare: one block each");
    }
}
