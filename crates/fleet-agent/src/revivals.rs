//! Spacing the restarts of a unit that keeps failing after it started.
//!
//! The agent starts a desired-launched unit that systemd shows `failed`. A start job of a
//! `Type=simple` unit succeeds as soon as its process is forked, so a unit that exits at once
//! fails again right after, and was started again at once: four starts in 50 ms, until
//! systemd's own start limit refused the job (issue 16). Such a restart succeeded, so the
//! retry backoff of failed tasks never applied.
//!
//! A restart of a failed unit opens a window (the retry backoff: growing, jittered, from
//! `backoff_min` to `backoff_max`); while it is open, that unit, if failed, waits. The first
//! restart after a failure is immediate. A unit seen not failed once its window has passed
//! starts afresh: a unit that crashes once a day is restarted at once every time.
//!
//! Pure bookkeeping on the caller's `now`; the agent does the rest.

use fleet_core::{ActiveState, Backoff, UnitName};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

use crate::plan::{Reason, Task, TaskKind};

#[derive(Debug)]
struct Window {
    until: Instant,
    backoff: Backoff,
}

/// The open (and recently closed) restart windows of failing units.
#[derive(Debug)]
pub struct Revivals {
    windows: BTreeMap<UnitName, Window>,
    min: Duration,
    max: Duration,
}

impl Revivals {
    pub fn new(min: Duration, max: Duration) -> Revivals {
        Revivals {
            windows: BTreeMap::new(),
            min,
            max,
        }
    }

    /// The failed units that must wait for their window to close. Forgets the units that
    /// are not failed and whose window has closed.
    pub fn holding(&mut self, now: Instant, failed: impl Fn(&UnitName) -> bool) -> Vec<UnitName> {
        self.windows.retain(|n, w| w.until > now || failed(n));
        self.windows
            .iter()
            .filter(|(n, w)| w.until > now && failed(n))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// `unit` was just restarted after it failed: opens its next window, returned.
    pub fn restarted(&mut self, unit: &UnitName, now: Instant) -> Duration {
        let (min, max) = (self.min, self.max);
        let window = self.windows.entry(unit.clone()).or_insert_with(|| Window {
            until: now,
            backoff: Backoff::new(min, max),
        });
        let delay = window.backoff.next_delay();
        window.until = now + delay;
        delay
    }

    /// When the next open window closes: the agent wakes then, a unit may be waiting.
    pub fn next_close(&self, now: Instant) -> Option<Instant> {
        self.windows
            .values()
            .map(|w| w.until)
            .filter(|u| *u > now)
            .min()
    }

    /// Keeps only the units `keep` says (the others' schedule changed: a fresh chance).
    pub fn retain(&mut self, mut keep: impl FnMut(&UnitName) -> bool) {
        self.windows.retain(|n, _| keep(n));
    }
}

/// Whether `task` starts a unit because systemd shows it failed.
pub fn is_revival(task: &Task) -> bool {
    task.kind == TaskKind::Start
        && matches!(&task.reason, Reason::DesiredLaunched { active }
            if *active == ActiveState::Failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> UnitName {
        s.parse().unwrap()
    }

    const MIN: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(60);

    #[test]
    fn a_unit_failing_again_within_its_window_waits_and_the_window_grows() {
        let mut r = Revivals::new(MIN, MAX);
        let (a, t0) = (name("a.service"), Instant::now());
        assert!(
            r.holding(t0, |_| true).is_empty(),
            "no window before a restart"
        );
        let first = r.restarted(&a, t0);
        assert!(first >= MIN);
        assert_eq!(
            r.holding(t0 + first / 2, |_| true),
            std::slice::from_ref(&a)
        );
        assert_eq!(r.next_close(t0), Some(t0 + first));
        assert!(r.holding(t0 + first, |_| true).is_empty(), "closed");
        let second = r.restarted(&a, t0 + first);
        assert!(second >= MIN && second <= 3 * first, "{first:?} {second:?}");
    }

    #[test]
    fn a_running_unit_is_not_held_and_is_forgotten_once_its_window_closed() {
        let mut r = Revivals::new(MIN, MAX);
        let (a, t0) = (name("a.service"), Instant::now());
        let delay = r.restarted(&a, t0);
        assert!(
            r.holding(t0, |_| false).is_empty(),
            "running: nothing to hold"
        );
        assert!(r.next_close(t0).is_some(), "still open");
        assert!(r.holding(t0 + delay, |_| false).is_empty());
        assert_eq!(r.next_close(t0), None, "forgotten");
        // Its next failure starts from the smallest window again.
        assert!(r.restarted(&a, t0 + delay) <= 3 * MIN);
    }

    #[test]
    fn only_a_start_of_a_failed_unit_is_a_revival() {
        let task = |kind, active: &str| Task {
            kind,
            unit: name("a.service"),
            reason: Reason::DesiredLaunched {
                active: fleet_core::ActiveState::parse(active),
            },
        };
        assert!(is_revival(&task(TaskKind::Start, "failed")));
        assert!(!is_revival(&task(TaskKind::Start, "inactive")));
        assert!(!is_revival(&task(TaskKind::Stop, "failed")));
        let after_load = Task {
            kind: TaskKind::Start,
            unit: name("a.service"),
            reason: Reason::LaunchAfterLoad,
        };
        assert!(!is_revival(&after_load));
    }
}
