//! Every cross-process wait in this workspace goes through [`wait_all`]: it spins briefly, then yields, then
//! sleeps (so 8 ranks on 2 cores still make progress), and when its [`Deadline`] passes it returns a
//! [`TimedOut`] that names the ranks that did not arrive.

use std::time::{Duration, Instant};

/// The default for every wait: long enough for a slow CI machine, short enough that a dead peer is noticed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Environment variable that overrides [`DEFAULT_TIMEOUT`], in seconds (fractions allowed).
pub const TIMEOUT_ENV: &str = "ALLREDUCE_TIMEOUT_S";

/// How long set-up (cold kernel compiles on every rank, buffer exchange) may wait for a peer, in seconds.
pub const SETUP_TIMEOUT_ENV: &str = "ALLREDUCE_SETUP_TIMEOUT_S";

/// A timeout of `v` seconds: a finite number in (0, 86400]. Every timeout in the workspace goes through here.
pub fn seconds(v: f64) -> Result<Duration, String> {
    if v.is_finite() && v > 0.0 && v <= 86_400.0 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(format!("{v} is not a number of seconds in (0, 86400]"))
    }
}

/// A timeout given in seconds as text, checked as [`seconds`].
pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    let v = s.trim().parse::<f64>().map_err(|_| format!("{s:?} is not a number of seconds in (0, 86400]"))?;
    seconds(v).map_err(|_| format!("{s:?} is not a number of seconds in (0, 86400]"))
}

/// The seconds in environment variable `var`, if it is set.
pub fn seconds_from_env(var: &str) -> Result<Option<Duration>, String> {
    match std::env::var(var) {
        Ok(s) => parse_seconds(&s).map(Some).map_err(|e| format!("{var}: {e}")),
        Err(_) => Ok(None),
    }
}

/// The timeout from [`TIMEOUT_ENV`], else [`DEFAULT_TIMEOUT`].
pub fn timeout_from_env() -> Result<Duration, String> {
    Ok(seconds_from_env(TIMEOUT_ENV)?.unwrap_or(DEFAULT_TIMEOUT))
}

/// A point in time after which a wait gives up.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    end: Instant,
    timeout: Duration,
    /// The address of a word that ends every wait on this deadline once it is not zero (a communicator's abort
    /// word, which a kernel's wait watches as well); 0: none.
    abort_word: u64,
}

impl Deadline {
    pub fn after(timeout: Duration) -> Self {
        Deadline { end: Instant::now() + timeout, timeout, abort_word: 0 }
    }

    /// The same deadline, also ended by the word at `abort_word` becoming non-zero.
    ///
    /// # Safety
    /// `abort_word` is the address of a live, 8-byte aligned u64, changed by anyone else only atomically, for as
    /// long as a wait uses this deadline.
    pub unsafe fn watching(self, abort_word: u64) -> Deadline {
        Deadline { abort_word, ..self }
    }

    /// Whether the watched word says abort.
    pub fn aborted(&self) -> bool {
        // SAFETY: `watching`'s contract; AtomicU64 has u64's layout.
        self.abort_word != 0
            && unsafe { &*(self.abort_word as *const std::sync::atomic::AtomicU64) }
                .load(std::sync::atomic::Ordering::Acquire)
                != 0
    }
    pub fn expired(&self) -> bool {
        Instant::now() >= self.end
    }
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// Spin, then yield, then sleep with growing pauses (capped at 160 us so wake-up latency stays small). While it
/// sleeps, the thread's timer slack is 1 us (Linux's default, 50 us, would add up to that to every pause, so a wait
/// whose peer came would sleep on); the caller's own slack is back when the backoff is dropped.
#[derive(Default)]
pub struct Backoff {
    step: u32,
    /// Whether the first sleep has set the thread's timer slack.
    precise: bool,
    /// The thread's timer slack before that, to restore.
    restore: Option<u64>,
}

impl Backoff {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn snooze(&mut self) {
        const SPINS: u32 = 64;
        const YIELDS: u32 = 64;
        if self.step < SPINS {
            std::hint::spin_loop();
        } else if self.step < SPINS + YIELDS {
            std::thread::yield_now();
        } else {
            if !std::mem::replace(&mut self.precise, true) {
                // Best effort (a slack that cannot be read is left alone): without it wake-ups are only later.
                let old = nix::sys::prctl::get_timerslack().ok().and_then(|s| u64::try_from(s).ok());
                self.restore = old.filter(|&s| s != PRECISE_SLACK_NS);
                if self.restore.is_some() {
                    let _ = nix::sys::prctl::set_timerslack(PRECISE_SLACK_NS);
                }
            }
            let k = (self.step - SPINS - YIELDS).min(4);
            std::thread::sleep(Duration::from_micros(10 << k));
        }
        self.step = self.step.saturating_add(1);
    }
}

/// The timer slack of a thread while it sleeps in a wait.
const PRECISE_SLACK_NS: u64 = 1_000;

impl Drop for Backoff {
    fn drop(&mut self) {
        if let Some(slack) = self.restore {
            let _ = nix::sys::prctl::set_timerslack(slack);
        }
    }
}

/// A wait that ran out of time, naming the ranks that never arrived.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: timed out after {timeout:?} waiting for rank(s) {missing:?}")]
pub struct TimedOut {
    pub what: String,
    pub missing: Vec<usize>,
    pub timeout: Duration,
}

/// What a wait ended with when it did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    #[error(transparent)]
    TimedOut(#[from] TimedOut),
    /// A peer said it gave up; waiting longer is pointless.
    #[error("{what}: aborted: {reason}")]
    Aborted { what: String, reason: String },
}

/// Waits until `arrived(r)` holds for every rank in `ranks`. Ranks that arrived are not polled again.
/// `aborted` is polled too, so a peer's failure ends the wait at once instead of at the deadline.
pub fn wait_all(
    what: &str,
    ranks: impl IntoIterator<Item = usize>,
    deadline: &Deadline,
    mut arrived: impl FnMut(usize) -> bool,
    mut aborted: impl FnMut() -> Option<String>,
) -> Result<(), WaitError> {
    let mut pending: Vec<usize> = ranks.into_iter().collect();
    let mut backoff = Backoff::new();
    loop {
        pending.retain(|&r| !arrived(r));
        if pending.is_empty() {
            return Ok(());
        }
        if let Some(reason) = aborted() {
            return Err(WaitError::Aborted { what: what.to_string(), reason });
        }
        if deadline.aborted() {
            let reason = "the communicator was aborted".to_string();
            return Err(WaitError::Aborted { what: what.to_string(), reason });
        }
        if deadline.expired() {
            return Err(TimedOut { what: what.to_string(), missing: pending, timeout: deadline.timeout() }.into());
        }
        backoff.snooze();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// Past its spins and yields a backoff sleeps with a 1 us timer slack, and gives the thread its own back.
    #[test]
    fn a_sleeping_backoff_sleeps_precisely_and_gives_the_slack_back() {
        use nix::sys::prctl::{get_timerslack, set_timerslack};
        set_timerslack(50_000).unwrap();
        let mut b = Backoff::new();
        for _ in 0..128 {
            b.snooze();
        }
        assert_eq!(get_timerslack().unwrap(), 50_000, "no sleep yet");
        b.snooze();
        assert_eq!(get_timerslack().unwrap() as u64, PRECISE_SLACK_NS);
        drop(b);
        assert_eq!(get_timerslack().unwrap(), 50_000);
    }

    #[test]
    fn names_missing_ranks() {
        let d = Deadline::after(Duration::from_millis(20));
        let err = wait_all("barrier", 0..4, &d, |r| r % 2 == 0, || None).unwrap_err();
        match err {
            WaitError::TimedOut(t) => {
                assert_eq!(t.missing, vec![1, 3]);
                assert!(t.to_string().contains("[1, 3]"), "{t}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn returns_when_flag_set_by_another_thread() {
        let flag = Arc::new(AtomicBool::new(false));
        let f2 = flag.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            f2.store(true, Ordering::Release);
        });
        let d = Deadline::after(Duration::from_secs(5));
        wait_all("flag", [7], &d, |_| flag.load(Ordering::Acquire), || None).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn abort_ends_wait_early() {
        let d = Deadline::after(Duration::from_secs(60));
        let err = wait_all("x", [0], &d, |_| false, || Some("rank 2 failed".into())).unwrap_err();
        assert!(matches!(err, WaitError::Aborted { .. }));
        assert!(err.to_string().contains("rank 2 failed"));
    }
}
