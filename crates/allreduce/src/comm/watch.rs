//! A dead or stuck peer, noticed and named: the status words every kernel's waits watch (this communicator's device
//! memory, `kernels/include/arx/sync.h`), a watchdog thread that reads them and watches the peers' processes, the
//! failure the next call returns (the communicator is then poisoned), and the abort any thread may set, as
//! `ncclCommAbort`. No wait traps, so the process's GPU context outlives a failed call.

use collective_core::status::{read_words, recorded};
use collective_core::PeerProcesses;
use gpu::{DeviceBuffer, DriverKind, Gpu};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the watchdog reads the status words and looks for the peers' processes: a dead peer is reported well
/// within 2 s, and the poll costs one 32-byte read on a stream of its own.
const WATCH_PERIOD: Duration = Duration::from_millis(100);

/// Why a communicator stopped: the ranks that did not arrive (empty for an abort) and what was waited for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub ranks: Vec<usize>,
    pub what: String,
}

/// The state the communicator, its watchdog and its abort handles share.
struct Shared {
    gpu: Gpu,
    status: DeviceBuffer,
    failure: Mutex<Option<Failure>>,
    /// Whether `failure` is set: what every call reads first, without the lock.
    failed: AtomicBool,
    stop: AtomicBool,
    /// The peers' processes the watchdog watches.
    peers: PeerProcesses,
}

/// Ends a communicator from any thread, as `ncclCommAbort`: every wait of its kernels ends (those running and those
/// enqueued), and every later call returns [`crate::Error::Peer`].
#[derive(Clone)]
pub struct AbortHandle(Arc<Shared>);

impl AbortHandle {
    pub fn abort(&self) {
        self.0.fail(Failure { ranks: Vec::new(), what: "aborted by the caller".into() });
    }
}

/// The watchdog and the status words of one communicator.
pub(super) struct Watch {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Shared {
    /// Records `failure` (the first one wins) and sets the abort word, which ends every wait of this rank.
    fn fail(&self, failure: Failure) {
        let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            *f = Some(failure);
        }
        self.failed.store(true, Ordering::Release);
        drop(f);
        if let Err(e) = self.set_abort() {
            eprintln!("warning: allreduce communicator: setting the abort word: {e}");
        }
    }

    fn set_abort(&self) -> gpu::Result<()> {
        if self.gpu.kind() == DriverKind::Host {
            // SAFETY: on the host driver the status words are this process's live memory, 8-aligned; the host
            // kernels read them atomically.
            unsafe { &*(self.status.ptr().0 as *const AtomicU64) }.store(1, Ordering::Release);
            return Ok(());
        }
        // A stream of its own, so the store does not wait behind the kernels it is meant to end.
        let stream = self.gpu.stream()?;
        stream.upload(&self.status, 0, &1u64.to_le_bytes())?;
        stream.sync()
    }

    /// What the status words say failed, recorded as this communicator's failure.
    fn look(&self, stream: Option<&gpu::Stream>) {
        match read_words(&self.status, stream) {
            Ok(words) => {
                if let Some((ranks, what)) = recorded(&words) {
                    self.fail(Failure { ranks, what });
                }
            }
            Err(e) => eprintln!("warning: allreduce communicator: reading the status words: {e}"),
        }
    }

    fn failure(&self) -> Option<Failure> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.failure.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Watch {
    /// Zeroed status words, and a watchdog over them and over the processes of `peers`.
    pub(super) fn start(gpu: &Gpu, peers: PeerProcesses) -> Result<Watch, crate::Error> {
        let status = collective_core::status_words(gpu)?;
        let stream = gpu.stream()?;
        let shared = Arc::new(Shared {
            gpu: gpu.clone(),
            status,
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            peers,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("allreduce-watchdog".into())
            .spawn(move || watchdog(&s, stream))
            .map_err(|e| crate::Error::Unsupported(format!("starting the watchdog thread: {e}")))?;
        Ok(Watch { shared, thread: Some(thread) })
    }

    /// The status words' device address, for the kernels.
    pub(super) fn status(&self) -> gpu::DevicePtr {
        self.shared.status.ptr()
    }

    /// The peers' processes the watchdog watches.
    pub(super) fn peers(&self) -> &PeerProcesses {
        &self.shared.peers
    }

    pub(super) fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.shared.clone())
    }

    /// The failure that poisoned the communicator, if one did.
    pub(super) fn failure(&self) -> Option<Failure> {
        self.shared.failure()
    }

    /// Reads the status words now (the watchdog reads them every [`WATCH_PERIOD`]) and returns any failure.
    pub(super) fn check(&self) -> Option<Failure> {
        self.shared.look(None);
        self.failure()
    }

    /// Records a failure a host kernel returned (the host driver's waits return theirs rather than record it).
    pub(super) fn fail(&self, failure: Failure) {
        self.shared.fail(failure);
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Until stopped or failed: the status words, then whether every watched peer's process still exists.
fn watchdog(shared: &Shared, stream: gpu::Stream) {
    while !shared.stop.load(Ordering::Acquire) && shared.failure().is_none() {
        shared.look(Some(&stream));
        let gone = shared.peers.gone();
        if !gone.is_empty() {
            shared.fail(Failure { ranks: gone, what: "exited (its process is gone)".into() });
        }
        std::thread::sleep(WATCH_PERIOD);
    }
}
