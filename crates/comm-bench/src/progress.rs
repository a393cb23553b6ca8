//! A progress bar over comm-bench's sweep (sizes x methods) on stderr, for a person at a terminal only: it is
//! hidden when stderr is a pipe or a file (CI logs, the launcher's per-rank pumps), so logs stay clean.

use indicatif::{ProgressBar, ProgressStyle};
use std::borrow::Cow;
use std::io::IsTerminal;

pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar of `total` steps, drawn only when `enabled` and stderr is a terminal.
    pub fn new(total: usize, enabled: bool) -> Progress {
        let bar = if enabled && std::io::stderr().is_terminal() {
            let style = ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
                .expect("the template is valid")
                .progress_chars("=> ");
            ProgressBar::new(total as u64).with_style(style)
        } else {
            ProgressBar::hidden()
        };
        Progress { bar }
    }

    /// One step done; `msg` says what ran (e.g. `car_1shot 65536`).
    pub fn inc(&self, msg: impl Into<Cow<'static, str>>) {
        self.bar.set_message(msg);
        self.bar.inc(1);
    }

    /// Runs `f` with the bar cleared, so lines printed to the terminal meanwhile are not drawn over.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    /// Removes the bar; the printed table stays.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    pub fn is_visible(&self) -> bool {
        !self.bar.is_hidden()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_unless_enabled_on_a_terminal() {
        let off = Progress::new(4, false);
        assert!(!off.is_visible());
        let on = Progress::new(4, true);
        assert_eq!(on.is_visible(), std::io::stderr().is_terminal());
        for p in [off, on] {
            p.inc("car_1shot 1024");
            assert_eq!(p.suspend(|| 7), 7);
            p.finish();
        }
    }
}
