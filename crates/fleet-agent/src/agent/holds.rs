//! Which units wait, and until when: the one place the agent's holds on units are kept.
//!
//! - A unit whose last task failed waits for its retry: its own jittered backoff, from
//!   `backoff_min` to `backoff_max`, growing with each failure, cleared by a task that works.
//! - A failed unit the agent restarted lately waits while its restart window is open
//!   ([`Revivals`]): a unit that exits at once is not restarted in a tight loop.
//! - Either hold ends as soon as what is asked of the unit changes (a fixed version, another
//!   desired state, no longer scheduled here): a fresh chance.
//!
//! Pure bookkeeping on the caller's `now`: it decides when, the agent decides what to try.
//! The other reasons a unit is left alone (a foreign file, a refused alias, a lease in doubt)
//! are facts of one pass, found again on the next; they are not held here.

use fleet_core::{ActiveState, Backoff, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info};

use crate::plan::{CurrentUnit, Task};
use crate::revivals::{self, Revivals};

/// A failed unit's next chance, and the backoff that spaces its chances.
#[derive(Debug, Clone)]
struct Retry {
    until: Instant,
    backoff: Backoff,
}

/// The holds on this machine's units.
#[derive(Debug)]
pub(super) struct Holds {
    retries: BTreeMap<UnitName, Retry>,
    revivals: Revivals,
    min: Duration,
    max: Duration,
}

impl Holds {
    /// Holds whose backoffs run from `min` to `max`.
    pub(super) fn new(min: Duration, max: Duration) -> Holds {
        Holds {
            retries: BTreeMap::new(),
            revivals: Revivals::new(min, max),
            min,
            max,
        }
    }

    /// The units that must wait at `now`: a retry not yet due, or a failed unit (as `units`
    /// shows it) in an open restart window. Forgets the windows that no longer matter.
    pub(super) fn waiting(
        &mut self,
        now: Instant,
        units: &BTreeMap<UnitName, CurrentUnit>,
    ) -> BTreeSet<UnitName> {
        let mut waiting: BTreeSet<UnitName> = self
            .retries
            .iter()
            .filter(|(_, r)| r.until > now)
            .map(|(n, _)| n.clone())
            .collect();
        waiting.extend(self.revivals.holding(now, |name| {
            units
                .get(name)
                .and_then(|u| u.systemd.as_ref())
                .is_some_and(|s| s.active_state() == ActiveState::Failed)
        }));
        waiting
    }

    /// What a plan's tasks came to at `now`: a unit with a failed task waits longer, one whose
    /// tasks all worked is free, and a failed unit restarted opens its next window.
    pub(super) fn record(
        &mut self,
        planned: &[Task],
        failed: impl Fn(&UnitName) -> bool,
        now: Instant,
    ) {
        let touched: BTreeSet<&UnitName> = planned.iter().map(|t| &t.unit).collect();
        for unit in touched {
            if failed(unit) {
                self.fail(unit, now);
            } else {
                self.retries.remove(unit);
            }
        }
        for task in planned.iter().filter(|t| revivals::is_revival(t)) {
            if !failed(&task.unit) {
                let wait = self.revivals.restarted(&task.unit, now);
                debug!(unit = %task.unit, next_restart_after = ?wait, "restarted a failed unit");
            }
        }
    }

    fn fail(&mut self, unit: &UnitName, now: Instant) {
        let (min, max) = (self.min, self.max);
        let retry = self.retries.entry(unit.clone()).or_insert_with(|| Retry {
            until: now,
            backoff: Backoff::new(min, max),
        });
        let delay = retry.backoff.next_delay();
        retry.until = now + delay;
        info!(unit = %unit, retry_in = ?delay, "unit failed; retrying later");
    }

    /// Ends the holds of `changed`, units whose schedule entries changed: a fresh chance.
    pub(super) fn forget(&mut self, changed: &BTreeSet<UnitName>) {
        if changed.is_empty() {
            return;
        }
        self.retries.retain(|name, _| !changed.contains(name));
        self.revivals.retain(|name| !changed.contains(name));
    }

    /// When the agent must wake for a hold: the next retry to come due after `now`, or the
    /// next restart window to close after `now`. A retry due already is not a reason to wake:
    /// every pass that can plan takes the due ones in ([`Self::due`]), and one that cannot (a
    /// lease in doubt) would only come back at once, in a loop, until something else changed.
    pub(super) fn next_due(&self, now: Instant) -> Option<Instant> {
        self.retries
            .values()
            .map(|r| r.until)
            .filter(|until| *until > now)
            .chain(self.revivals.next_close(now))
            .min()
    }

    /// The units whose retry is due at `now`: part of every pass's scope until they are
    /// given a task or need none.
    pub(super) fn due(&self, now: Instant) -> BTreeSet<UnitName> {
        let due = self.retries.iter().filter(|(_, r)| r.until <= now);
        due.map(|(n, _)| n.clone()).collect()
    }

    /// Frees the units of `planned_for` whose retry was due at `now` but to which the plan
    /// gave no task: they need none any more (systemd's own `Restart=` brought the unit up,
    /// or it was stopped by hand as asked). Units `held` this pass for another reason (an
    /// operator's file, a refused alias) keep theirs.
    pub(super) fn settle(
        &mut self,
        planned_for: impl Fn(&UnitName) -> bool,
        held: &BTreeSet<UnitName>,
        tasks: &[Task],
        now: Instant,
    ) {
        let tasked: BTreeSet<&UnitName> = tasks.iter().map(|t| &t.unit).collect();
        self.retries.retain(|unit, retry| {
            retry.until > now || !planned_for(unit) || held.contains(unit) || tasked.contains(unit)
        });
    }

    /// How many units of `of` have a failed task and wait for their retry.
    pub(super) fn failing(&self, of: impl Fn(&UnitName) -> bool) -> usize {
        self.retries.keys().filter(|n| of(n)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Reason, TaskKind, UnitFileState};
    use fleet_core::SystemdState;

    const MIN: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(60);

    fn name(s: &str) -> UnitName {
        s.parse().unwrap()
    }

    fn start(unit: &str, active: &str) -> Task {
        Task {
            kind: TaskKind::Start,
            unit: name(unit),
            reason: Reason::DesiredLaunched {
                active: fleet_core::ActiveState::parse(active),
            },
        }
    }

    fn failed_unit() -> CurrentUnit {
        CurrentUnit {
            file: UnitFileState::Absent,
            systemd: Some(SystemdState {
                active: "failed".into(),
                ..SystemdState::not_found()
            }),
            need_daemon_reload: false,
            restarted: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_unit_whose_task_failed_waits_for_its_retry_and_a_task_that_works_frees_it() {
        let mut holds = Holds::new(MIN, MAX);
        let t0 = Instant::now();
        let units = BTreeMap::new();
        holds.record(&[start("a.service", "inactive")], |_| true, t0);
        assert!(holds.waiting(t0, &units).contains(&name("a.service")));
        assert_eq!(holds.failing(|_| true), 1);
        let due = holds.next_due(t0).expect("a retry is due");
        assert!(due > t0 && due <= t0 + MAX);
        assert!(
            holds.waiting(due, &units).is_empty(),
            "due: no longer waits"
        );
        holds.record(&[start("a.service", "inactive")], |_| false, due);
        assert_eq!(holds.failing(|_| true), 0);
        assert_eq!(holds.next_due(due), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_schedule_entry_ends_every_hold_of_its_unit() {
        let mut holds = Holds::new(MIN, MAX);
        let t0 = Instant::now();
        holds.record(&[start("a.service", "inactive")], |_| true, t0);
        holds.record(&[start("b.service", "failed")], |_| false, t0);
        let units = BTreeMap::from([(name("b.service"), failed_unit())]);
        assert_eq!(holds.waiting(t0, &units).len(), 2);
        holds.forget(&BTreeSet::from([name("a.service"), name("b.service")]));
        assert!(holds.waiting(t0, &units).is_empty());
        assert_eq!(holds.next_due(t0), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_revived_unit_waits_only_while_it_is_failed_and_its_window_is_open() {
        let mut holds = Holds::new(MIN, MAX);
        let t0 = Instant::now();
        holds.record(&[start("b.service", "failed")], |_| false, t0);
        assert_eq!(holds.failing(|_| true), 0, "a revival is no failed task");
        let failed = BTreeMap::from([(name("b.service"), failed_unit())]);
        assert!(holds.waiting(t0, &failed).contains(&name("b.service")));
        assert!(holds.waiting(t0, &BTreeMap::new()).is_empty(), "running");
        let closes = holds.next_due(t0).expect("a window is open");
        assert!(holds.waiting(closes, &failed).is_empty());
    }

    /// A retry already due is no reason to wake: a pass that cannot plan (a lease in doubt)
    /// would come straight back, in a loop. Every pass takes the due units into its scope.
    #[tokio::test(start_paused = true)]
    async fn a_retry_already_due_is_taken_by_the_next_pass_not_woken_for() {
        let mut holds = Holds::new(MIN, MAX);
        let t0 = Instant::now();
        holds.record(&[start("a.service", "inactive")], |_| true, t0);
        let at = holds.next_due(t0).expect("due later");
        assert_eq!(holds.next_due(at), None, "due now: nothing to wake for");
        assert_eq!(holds.due(at), BTreeSet::from([name("a.service")]));
        assert!(holds.due(t0).is_empty());
    }

    /// A unit whose retry came due but that the plan gave no task needs none (systemd's own
    /// `Restart=` brought it up): its retry goes, unless the plan did not cover it or it was
    /// held this pass for another reason.
    #[tokio::test(start_paused = true)]
    async fn a_due_retry_the_plan_gives_no_task_is_freed_unless_held_or_not_planned() {
        let mut holds = Holds::new(MIN, MAX);
        let t0 = Instant::now();
        let failed = [
            start("a.service", "inactive"),
            start("b.service", "inactive"),
            start("c.service", "inactive"),
            start("d.service", "inactive"),
        ];
        holds.record(&failed, |_| true, t0);
        let later = t0 + MAX + MAX;
        let held = BTreeSet::from([name("b.service")]);
        let tasks = [start("c.service", "inactive")];
        let planned_for = |u: &UnitName| u.as_str() != "d.service";
        holds.settle(planned_for, &held, &tasks, later);
        assert_eq!(
            holds.due(later),
            BTreeSet::from([name("b.service"), name("c.service"), name("d.service")])
        );
        assert_eq!(holds.failing(|_| true), 3);
        // Not due yet: kept whatever the plan did.
        let mut holds = Holds::new(MIN, MAX);
        holds.record(&failed[..1], |_| true, t0);
        holds.settle(|_| true, &BTreeSet::new(), &[], t0);
        assert_eq!(holds.failing(|_| true), 1);
    }
}
