//! A deadline on the work enqueued on NCCL/RCCL, as torch's NCCL watchdog: each step is followed by an event on the
//! caller's stream, and a thread that finds a step not done by its deadline, a communicator with an asynchronous
//! error (a peer's connection lost), or a peer on this host whose process is gone, ends every communicator it watches
//! (`ncclCommAbort`: kernels waiting for a dead peer return, so the caller's stream drains and its syncs come back)
//! and records why; every later call returns that failure. Without it, a peer that dies on another node, or stalls,
//! leaves the survivors' streams spinning.

use crate::Nccl;
use collective_core::{Call, Collective, CollectiveError, DType, Op, PeerProcesses, Team};
use gpu::{Gpu, Stream};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the watchdog looks: a missed deadline is acted on within this of it.
const PERIOD: Duration = Duration::from_millis(100);

/// A step enqueued and not yet seen done.
pub(crate) struct Step {
    /// Whether the step's work has completed (Err: the question itself failed, which ends the endpoint too).
    pub done: Box<dyn FnMut() -> Result<bool, String> + Send>,
    /// What was enqueued, for the failure's message (formatted only then).
    pub what: Box<dyn fmt::Display + Send>,
    pub since: Instant,
}

/// What the watchdog ends and asks, as closures over the communicators (so that its rule is tested without them).
pub(crate) struct Hooks {
    /// Ends every communicator; run once, at the first failure.
    pub end: Box<dyn Fn() + Send + Sync>,
    /// An asynchronous error a communicator holds, if any.
    pub errors: Box<dyn Fn() -> Result<(), String> + Send + Sync>,
}

struct Shared {
    steps: Mutex<Vec<Step>>,
    failure: Mutex<Option<String>>,
    stop: AtomicBool,
    hooks: Hooks,
    deadline: Duration,
    /// The peers on this host: one whose process is gone is named at once, and a late step says which are alive.
    peers: PeerProcesses,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// One look at `now`: drops the steps done; on a failed question, a peer's process gone, a communicator's error
    /// or a step past the deadline (in that order), ends everything and records why (the first failure wins;
    /// nothing is watched after it).
    fn tick(&self, now: Instant) {
        if lock(&self.failure).is_some() {
            return;
        }
        let why = {
            let mut steps = lock(&self.steps);
            let mut asked = None;
            steps.retain_mut(|s| match (s.done)() {
                Ok(done) => !done,
                Err(e) => {
                    asked.get_or_insert_with(|| format!("asking whether {} was done failed: {e}", s.what));
                    true
                }
            });
            let late =
                steps.iter().filter(|s| now.saturating_duration_since(s.since) > self.deadline).min_by_key(|s| s.since);
            let late = late.map(|s| {
                format!(
                    "{} has not completed {:.1} s after it was enqueued (the deadline is {:?}): a peer died or \
                     stalled{}",
                    s.what,
                    now.saturating_duration_since(s.since).as_secs_f64(),
                    self.deadline,
                    alive(&self.peers)
                )
            });
            let gone = || {
                let gone = self.peers.gone();
                (!gone.is_empty()).then(|| format!("ranks {gone:?} on this host exited (their processes are gone)"))
            };
            asked.or_else(gone).or_else(|| (self.hooks.errors)().err()).or(late)
        };
        if let Some(why) = why {
            self.fail(why);
        }
    }

    fn fail(&self, why: String) {
        {
            let mut failure = lock(&self.failure);
            if failure.is_some() {
                return;
            }
            *failure = Some(format!("{why}; every NCCL communicator under this watchdog was aborted"));
        }
        (self.hooks.end)();
        lock(&self.steps).clear();
    }
}

/// What a late step's message says of the peers on this host, which are all alive when it is written.
fn alive(peers: &PeerProcesses) -> String {
    let mut note = String::new();
    if !peers.ranks().is_empty() {
        note = format!(
            "; the processes of ranks {:?} on this host are alive, so the rank that did not arrive is one of them \
             stalled (before this call, or in it), or one on another host",
            peers.ranks()
        );
    }
    if !peers.hidden().is_empty() {
        note += &format!("; ranks {:?} on this host cannot be watched from here", peers.hidden());
    }
    note
}

/// The thread that looks at the steps: it runs until dropped.
pub(crate) struct Looker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Looker {
    /// Starts the thread; a step not done `deadline` after it was enqueued, or a process of `peers` gone, fails the
    /// endpoint.
    pub fn start(hooks: Hooks, deadline: Duration, peers: PeerProcesses) -> Result<Looker, std::io::Error> {
        let shared = Arc::new(Shared {
            steps: Mutex::default(),
            failure: Mutex::default(),
            stop: AtomicBool::new(false),
            hooks,
            deadline,
            peers,
        });
        let looking = shared.clone();
        let thread = std::thread::Builder::new().name("nccl-watchdog".into()).spawn(move || {
            while !looking.stop.load(Ordering::Acquire) {
                looking.tick(Instant::now());
                std::thread::park_timeout(PERIOD);
            }
        })?;
        Ok(Looker { shared, thread: Some(thread) })
    }

    /// Watches a step just enqueued.
    pub fn watch(&self, step: Step) {
        if lock(&self.shared.failure).is_none() {
            lock(&self.shared.steps).push(step);
        }
    }

    /// Why the endpoint failed, if it did.
    pub fn failure(&self) -> Option<String> {
        lock(&self.shared.failure).clone()
    }

    /// Looks now, on the caller's thread, as the thread does every period (what it finds, `failure` then says).
    pub fn look(&self) {
        self.shared.tick(Instant::now());
    }

    /// Ends the endpoint for `why` (a step NCCL refused to enqueue, say), as a failure the thread found would.
    pub fn fail(&self, why: String) {
        self.shared.fail(why);
    }
}

impl Drop for Looker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            if t.join().is_err() {
                eprintln!("warning: the NCCL watchdog thread panicked");
            }
        }
    }
}

/// NCCL communicators under one watchdog (an endpoint's several, or one benchmark method's): their calls go
/// through [`Watchdog::enqueue`], which follows each with an event for the watchdog's thread.
pub struct Watchdog {
    // Field order is drop order: the thread first, then the events its steps hold.
    looker: Looker,
    /// Events the thread is done with, for the next steps: making one per step would add a driver call to each.
    events: EventPool,
    gpu: Gpu,
}

type EventPool = Arc<Mutex<Vec<gpu::Event>>>;

/// A step's event, back in its pool when the watchdog lets the step go.
struct PooledEvent {
    event: Option<gpu::Event>,
    pool: EventPool,
}

impl PooledEvent {
    fn get(&self) -> &gpu::Event {
        self.event.as_ref().expect("held until dropped")
    }
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        if let Some(e) = self.event.take() {
            lock(&self.pool).push(e);
        }
    }
}

/// What a step enqueued, formatted only for a failure's message.
struct StepWhat {
    op: Op,
    count: usize,
    dtype: DType,
    on: &'static str,
}

impl fmt::Display for StepWhat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of {} elements of {} on {}", self.op, self.count, self.dtype, self.on)
    }
}

impl Watchdog {
    /// Watches the steps enqueued on `comms` (of `gpu`'s device), each given `deadline` from its enqueue, and the
    /// processes of `peers`: at the first failure it aborts every one of them, then runs `also_end` (another
    /// communicator whose kernels may wait on the same peers, say).
    pub fn start(
        gpu: &Gpu,
        comms: &[&Nccl],
        also_end: Option<Box<dyn Fn() + Send + Sync>>,
        deadline: Duration,
        peers: PeerProcesses,
    ) -> Result<Watchdog, CollectiveError> {
        let aborts: Vec<crate::NcclAbort> = comms.iter().map(|n| n.abort_handle()).collect();
        let errors = aborts.clone();
        let hooks = Hooks {
            end: Box::new(move || {
                aborts.iter().for_each(|a| {
                    a.abort();
                });
                if let Some(end) = &also_end {
                    end();
                }
            }),
            errors: Box::new(move || {
                errors.iter().try_for_each(|a| a.async_error().map_err(|e| format!("{}: {e}", a.name())))
            }),
        };
        let looker = Looker::start(hooks, deadline, peers)
            .map_err(|e| CollectiveError::Unsupported(format!("starting the NCCL watchdog thread: {e}")))?;
        Ok(Watchdog { looker, events: EventPool::default(), gpu: gpu.clone() })
    }

    /// Enqueues `call` on `nccl` (one of the watched communicators) on `stream`, then an event after it for the
    /// thread (not in a capture: a graph's replays are the caller's to wait for). A call NCCL refuses to enqueue
    /// (its own state: a peer lost) ends every watched communicator as a late step would. After a failure, every
    /// call returns it ([`CollectiveError::Aborted`]) without enqueueing anything.
    ///
    /// # Safety
    /// As [`Nccl::enqueue`].
    pub unsafe fn enqueue(&self, nccl: &Nccl, call: &Call, stream: &Stream) -> Result<(), CollectiveError> {
        self.failed()?;
        let what = StepWhat { op: call.op(), count: call.count(), dtype: call.dtype(), on: nccl.name() };
        // SAFETY: the caller's contract.
        if let Err(e) = unsafe { nccl.enqueue(call, stream) } {
            self.looker.fail(format!("{what} could not be enqueued: {e}"));
            return self.failed();
        }
        if !stream.is_capturing()? {
            let pooled = lock(&self.events).pop();
            let event =
                PooledEvent { event: Some(pooled.map_or_else(|| self.gpu.event(), Ok)?), pool: self.events.clone() };
            stream.record(event.get())?;
            let done = Box::new(move || event.get().query().map_err(|e| e.to_string()));
            self.looker.watch(Step { done, what: Box::new(what), since: Instant::now() });
        }
        Ok(())
    }

    /// The failure already recorded, without looking again: what every call checks first.
    pub fn failed(&self) -> Result<(), CollectiveError> {
        self.looker.failure().map_or(Ok(()), |why| Err(CollectiveError::Aborted(why)))
    }

    /// Looks now, on the caller's thread, as the thread does every period, and returns what [`Watchdog::failed`]
    /// then says.
    pub fn check(&self) -> Result<(), CollectiveError> {
        self.looker.look();
        self.failed()
    }
}

/// [`Nccl`] under a watchdog of its own, as a benchmark method: a step not done `deadline` after its enqueue, or an
/// asynchronous error, aborts it, and its later calls fail with why.
pub struct WatchedNccl {
    // Field order is drop order: the watchdog's thread stops before the communicator goes.
    watchdog: Watchdog,
    nccl: Nccl,
}

impl WatchedNccl {
    /// As [`Nccl::new`], watched, with the processes of the team's peers on this host. Collective: every rank calls
    /// it.
    pub fn new(team: Team<'_>, opts: crate::NcclOptions, deadline: Duration) -> Result<WatchedNccl, CollectiveError> {
        let nccl = Nccl::new(team, opts)?;
        let peers = PeerProcesses::gather(team.rdv)?;
        Ok(WatchedNccl { watchdog: Watchdog::start(team.gpu, &[&nccl], None, deadline, peers)?, nccl })
    }
}

impl Collective for WatchedNccl {
    fn name(&self) -> &str {
        self.nccl.name()
    }

    fn op(&self) -> Op {
        self.nccl.op()
    }

    fn capacity_bytes(&self) -> usize {
        self.nccl.capacity_bytes()
    }

    unsafe fn run(&mut self, call: &Call, stream: &Stream) -> Result<(), CollectiveError> {
        // SAFETY: the caller's contract.
        unsafe { self.watchdog.enqueue(&self.nccl, call, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A watchdog's shared state without its thread, and how often it ended everything.
    fn shared(deadline: Duration, error: Option<&'static str>) -> (Arc<Shared>, Arc<AtomicUsize>) {
        shared_with(deadline, error, PeerProcesses::default())
    }

    fn shared_with(
        deadline: Duration,
        error: Option<&'static str>,
        peers: PeerProcesses,
    ) -> (Arc<Shared>, Arc<AtomicUsize>) {
        let ended = Arc::new(AtomicUsize::new(0));
        let count = ended.clone();
        let hooks = Hooks {
            end: Box::new(move || {
                count.fetch_add(1, Ordering::SeqCst);
            }),
            errors: Box::new(move || error.map_or(Ok(()), |e| Err(e.to_string()))),
        };
        let shared = Shared {
            steps: Mutex::default(),
            failure: Mutex::default(),
            stop: AtomicBool::new(false),
            hooks,
            deadline,
            peers,
        };
        (Arc::new(shared), ended)
    }

    /// A step that is done after `polls` questions (never, for `usize::MAX`).
    fn step(what: &str, since: Instant, polls: usize) -> Step {
        let mut asked = 0;
        let done = move || {
            asked += 1;
            Ok(asked > polls)
        };
        Step { done: Box::new(done), what: Box::new(what.to_string()), since }
    }

    #[test]
    fn steps_done_in_time_are_let_go_and_a_late_one_ends_everything_once_naming_it() {
        let (s, ended) = shared(Duration::from_secs(10), None);
        let t0 = Instant::now();
        lock(&s.steps).push(step("ncclAllReduce on nccl_job", t0, 1));
        lock(&s.steps).push(step("ncclAllReduce on nccl_rail", t0 + Duration::from_secs(1), usize::MAX));
        s.tick(t0 + Duration::from_secs(5));
        assert_eq!((lock(&s.steps).len(), lock(&s.failure).clone()), (2, None), "nothing late yet");
        s.tick(t0 + Duration::from_secs(10));
        assert_eq!(lock(&s.steps).len(), 1, "the first step was done at its second question");
        s.tick(t0 + Duration::from_millis(11_500));
        let why = lock(&s.failure).clone().expect("the rail step is past its deadline");
        assert!(why.starts_with("ncclAllReduce on nccl_rail has not completed 10.5 s"), "{why}");
        assert!(why.ends_with("aborted"), "{why}");
        assert!(lock(&s.steps).is_empty());
        s.tick(t0 + Duration::from_secs(60));
        s.fail("again".into());
        assert_eq!(ended.load(Ordering::SeqCst), 1, "ended once");
        assert!(lock(&s.failure).clone().unwrap().contains("nccl_rail"), "the first failure stays");
    }

    #[test]
    fn a_communicator_error_or_a_failed_question_ends_everything_at_once() {
        let (s, ended) = shared(Duration::from_secs(10), Some("ncclRemoteError: a peer's connection closed"));
        s.tick(Instant::now());
        assert!(lock(&s.failure).clone().unwrap().starts_with("ncclRemoteError"));
        assert_eq!(ended.load(Ordering::SeqCst), 1);
        let (s, ended) = shared(Duration::from_secs(10), None);
        let broken = Step {
            done: Box::new(|| Err("cuEventQuery failed".into())),
            what: Box::new("ncclAllGather on nccl_job"),
            since: Instant::now(),
        };
        lock(&s.steps).push(broken);
        s.tick(Instant::now());
        let why = lock(&s.failure).clone().unwrap();
        assert!(why.contains("ncclAllGather on nccl_job was done failed: cuEventQuery failed"), "{why}");
        assert_eq!(ended.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_look_finds_a_communicator_error_before_the_thread_does_and_a_refused_step_ends_everything() {
        let (broken, ended) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let (is_broken, count) = (broken.clone(), ended.clone());
        let hooks = Hooks {
            end: Box::new(move || {
                count.fetch_add(1, Ordering::SeqCst);
            }),
            errors: Box::new(move || match is_broken.load(Ordering::SeqCst) {
                true => Err("ncclRemoteError: a peer's connection closed".into()),
                false => Ok(()),
            }),
        };
        let w = Looker::start(hooks, Duration::from_secs(60), PeerProcesses::default()).unwrap();
        w.look();
        assert_eq!(w.failure(), None);
        broken.store(true, Ordering::SeqCst);
        w.look();
        let why = w.failure().expect("the error, found by this look rather than at the thread's next period");
        assert!(why.starts_with("ncclRemoteError") && why.ends_with("aborted"), "{why}");
        assert_eq!(ended.load(Ordering::SeqCst), 1);
        let (s, ended) = shared(Duration::from_secs(10), None);
        let w = Looker { shared: s, thread: None };
        w.fail("ncclAllReduce of 8 elements could not be enqueued: ncclRemoteError".into());
        assert!(w.failure().unwrap().contains("could not be enqueued"), "a refused step ends the endpoint");
        w.fail("again".into());
        assert_eq!(ended.load(Ordering::SeqCst), 1, "ended once");
    }

    #[test]
    fn the_thread_acts_within_a_period_of_the_deadline_and_stops_when_dropped() {
        let ended = Arc::new(AtomicUsize::new(0));
        let count = ended.clone();
        let hooks = Hooks {
            end: Box::new(move || {
                count.fetch_add(1, Ordering::SeqCst);
            }),
            errors: Box::new(|| Ok(())),
        };
        let w = Looker::start(hooks, Duration::from_millis(200), PeerProcesses::default()).unwrap();
        let t0 = Instant::now();
        w.watch(step("ncclAllReduce on nccl_job", t0, usize::MAX));
        while w.failure().is_none() {
            assert!(t0.elapsed() < Duration::from_secs(5), "no failure after 5 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(200) && took < Duration::from_millis(200) + 3 * PERIOD, "{took:?}");
        assert_eq!(ended.load(Ordering::SeqCst), 1);
        w.watch(step("after the failure", Instant::now(), usize::MAX));
        let start = Instant::now();
        drop(w);
        assert!(start.elapsed() < PERIOD, "dropping unparks the thread at once");
    }

    #[test]
    fn a_peer_whose_process_is_gone_is_named_at_once_and_a_late_step_names_the_live_ones() {
        let me = std::process::id() as i32;
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("spawn sleep");
        // Rank 0 is this process, 1 the child, 2 another process of this host (this one again), 3 on another host.
        let peers = PeerProcesses::visible(&[me, child.id() as i32, me, me], &["a", "a", "a", "b"], 0);
        let (s, ended) = shared_with(Duration::from_secs(10), None, peers.clone());
        let t0 = Instant::now();
        lock(&s.steps).push(step("ncclAllReduce on nccl_job", t0, usize::MAX));
        s.tick(t0 + Duration::from_secs(1));
        assert_eq!(lock(&s.failure).clone(), None, "every peer alive, nothing late");
        child.kill().expect("kill the child");
        child.wait().expect("reap it");
        s.tick(t0 + Duration::from_secs(2));
        let why = lock(&s.failure).clone().expect("the child's process is gone");
        assert!(why.starts_with("ranks [1] on this host exited"), "{why}");
        assert_eq!(ended.load(Ordering::SeqCst), 1);
        // With every peer alive, the deadline's message says which are.
        let alive = PeerProcesses::visible(&[me, me, i32::MAX, me], &["a", "a", "a", "b"], 0);
        let (s, _) = shared_with(Duration::from_secs(10), None, alive);
        lock(&s.steps).push(step("ncclAllReduce on nccl_job", t0, usize::MAX));
        s.tick(t0 + Duration::from_secs(11));
        let why = lock(&s.failure).clone().expect("late");
        assert!(why.contains("the processes of ranks [1] on this host are alive"), "{why}");
        assert!(why.contains("ranks [2] on this host cannot be watched from here"), "{why}");
    }
}
