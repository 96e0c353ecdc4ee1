//! The progress line of a blocking wait on several units: done/total, the time waited, and the
//! slowest units still pending with where each one stands. Drawn on stderr with indicatif,
//! and only when both stdout and stderr are terminals: piped or redirected, a command prints
//! exactly what it prints without it. The text is made by pure functions ([`line`]); this
//! module never decides what a unit's state means (that is [`super::judge`]'s).

use fleet_core::UnitName;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// A wait on fewer units shows no progress line: its own lines say enough.
const MANY: usize = 2;

/// How many pending units the line names.
const NAMED: usize = 3;

/// Where a pending unit stands, slowest first: the line names the units furthest from their
/// goal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// The engine published why it cannot place the unit.
    CannotSchedule,
    /// Wanted on a machine, and on none yet.
    NotScheduled,
    /// Scheduled; its machine has not yet reported it with the registry's file.
    WaitingForMachine,
    /// Its machine reports it, on its way to the goal (starting, stopping, restarting).
    Underway,
}

impl Stage {
    fn words(self) -> &'static str {
        match self {
            Stage::CannotSchedule => "cannot be scheduled",
            Stage::NotScheduled => "not scheduled yet",
            Stage::WaitingForMachine => "waiting for its machine",
            Stage::Underway => "on its way",
        }
    }
}

/// `7s`, `1m05s`, `2h03m`.
pub fn elapsed(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// `37/100 units done, 12s; slowest: a.service (cannot be scheduled), b.service (not
/// scheduled yet), c.service (on its way), and 60 more`.
pub fn line(done: usize, total: usize, waited: Duration, pending: &[(UnitName, Stage)]) -> String {
    let mut slowest: Vec<&(UnitName, Stage)> = pending.iter().collect();
    slowest.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    let mut out = format!("{done}/{total} units done, {}", elapsed(waited));
    if slowest.is_empty() {
        return out;
    }
    let named: Vec<String> = slowest
        .iter()
        .take(NAMED)
        .map(|(name, stage)| format!("{name} ({})", stage.words()))
        .collect();
    out.push_str("; slowest: ");
    out.push_str(&named.join(", "));
    if slowest.len() > NAMED {
        out.push_str(&format!(", and {} more", slowest.len() - NAMED));
    }
    out
}

/// The progress line, or nothing (not on a terminal, or too few units).
#[derive(Debug)]
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// Nothing is ever drawn.
    pub fn hidden() -> Progress {
        Progress { bar: None }
    }

    /// A line on stderr for a wait on `total` units, if stdout and stderr are terminals.
    pub fn on_terminal(total: usize) -> Progress {
        let terminal = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
        if total < MANY || !terminal {
            return Progress::hidden();
        }
        let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("[{bar:20}] {wide_msg}") {
            bar.set_style(style.progress_chars("=> "));
        }
        Progress { bar: Some(bar) }
    }

    /// A line drawn nowhere, for the tests of the waits that draw it.
    #[cfg(test)]
    pub fn offscreen(total: usize) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::hidden());
        Progress { bar: Some(bar) }
    }

    /// Another handle on the same line, to look at it once the wait has it.
    #[cfg(test)]
    pub fn handle(&self) -> Progress {
        Progress {
            bar: self.bar.clone(),
        }
    }

    /// The line's text and count, as last shown.
    #[cfg(test)]
    pub fn shown(&self) -> Option<(u64, String)> {
        self.bar.as_ref().map(|b| (b.position(), b.message()))
    }

    pub fn is_shown(&self) -> bool {
        self.bar.is_some()
    }

    /// Redraws the line: `done` units of the total, and its text.
    pub fn show(&self, done: usize, text: String) {
        if let Some(bar) = &self.bar {
            bar.set_message(text);
            bar.set_position(done as u64);
        }
    }

    /// Runs `f` (which prints a line) with the progress line out of the way.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.bar {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    /// Clears the line for good.
    pub fn clear(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(n: &str) -> UnitName {
        n.parse().unwrap()
    }

    #[test]
    fn the_time_waited_reads_in_seconds_minutes_or_hours() {
        assert_eq!(elapsed(Duration::from_millis(7_900)), "7s");
        assert_eq!(elapsed(Duration::from_secs(65)), "1m05s");
        assert_eq!(
            elapsed(Duration::from_secs(2 * 3600 + 3 * 60 + 59)),
            "2h03m"
        );
    }

    #[test]
    fn the_line_names_the_units_furthest_from_their_goal_first() {
        let pending = [
            (unit("d.service"), Stage::Underway),
            (unit("c.service"), Stage::WaitingForMachine),
            (unit("b.service"), Stage::NotScheduled),
            (unit("z.service"), Stage::CannotSchedule),
            (unit("a.service"), Stage::Underway),
        ];
        assert_eq!(
            line(95, 100, Duration::from_secs(12), &pending),
            "95/100 units done, 12s; slowest: z.service (cannot be scheduled), \
             b.service (not scheduled yet), c.service (waiting for its machine), and 2 more"
        );
    }

    #[test]
    fn the_line_of_a_few_pending_units_names_them_all_and_of_none_only_counts() {
        let pending = [(unit("a.service"), Stage::Underway)];
        assert_eq!(
            line(1, 2, Duration::from_secs(3), &pending),
            "1/2 units done, 3s; slowest: a.service (on its way)"
        );
        assert_eq!(line(2, 2, Duration::ZERO, &[]), "2/2 units done, 0s");
    }

    #[test]
    fn a_hidden_progress_runs_what_it_suspends_and_draws_nothing() {
        let p = Progress::hidden();
        assert!(!p.is_shown());
        assert_eq!(p.suspend(|| 42), 42);
        p.show(1, "x".into());
    }
}
