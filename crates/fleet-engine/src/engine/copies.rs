//! What the leader reports about previous copies (issue 36), beside its plans: how many units
//! wait for a copy on a machine of their placement history to stop, a warning when some have
//! waited long (one for all of them, at most every [`WARN_EVERY`]: not one per pass, nor
//! one per unit), and each stray state once, when it is first seen (see
//! `crates/fleet-scheduler/src/history.rs`). [`Copies`] is pure, the time passed in; [`report`] logs and
//! sets the gauges.

use fleet_core::{MachineId, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;
use tokio::time::Instant;
use tracing::warn;

use crate::metrics::Metrics;
use crate::scheduler::Plan;

/// A unit held back longer than this is stuck, not moving: a stop job is bounded by
/// systemd's `TimeoutStopSec=` (90 s unless a unit says otherwise), then its processes are
/// killed, so a copy still published as running after that is one its machine cannot stop
/// (or will not).
pub(super) const STUCK_AFTER: Duration = Duration::from_secs(120);

/// At most one warning about stuck units this often, however many there are.
pub(super) const WARN_EVERY: Duration = Duration::from_secs(600);

/// How many stuck units a warning names (the longest waiting).
const NAMED: usize = 5;

/// Units stuck behind a copy that does not stop: what one warning says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stuck {
    pub units: usize,
    /// The longest waiting, longest first: unit, the machine of its copy, how long.
    pub longest: Vec<(UnitName, MachineId, Duration)>,
}

impl fmt::Display for Stuck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (unit, machine, waited)) in self.longest.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{unit} on {machine} for {}s", waited.as_secs())?;
        }
        Ok(())
    }
}

/// What one leadership knows of previous copies and stray states.
#[derive(Debug, Default)]
pub(super) struct Copies {
    /// Units the last plan held back for a previous copy: the copy's machine, since when.
    waiting: BTreeMap<UnitName, (MachineId, Instant)>,
    /// When the last warning about stuck units went out.
    warned: Option<Instant>,
    /// The stray states seen and not gone since.
    strays: BTreeSet<(UnitName, MachineId)>,
}

impl Copies {
    /// Takes in the units a plan holds back (`Plan::previous_copies`: all of them, since a
    /// leader plans only a few units when none waits). Returns what to warn about, when
    /// some unit has waited [`STUCK_AFTER`] for the same machine and no warning went out in
    /// the last [`WARN_EVERY`].
    pub fn held(&mut self, now: Instant, held: &BTreeMap<UnitName, MachineId>) -> Option<Stuck> {
        self.waiting
            .retain(|unit, (machine, _)| held.get(unit) == Some(machine));
        for (unit, machine) in held {
            self.waiting
                .entry(unit.clone())
                .or_insert_with(|| (machine.clone(), now));
        }
        let mut stuck: Vec<(UnitName, MachineId, Duration)> = self
            .waiting
            .iter()
            .map(|(unit, (machine, since))| {
                (
                    unit.clone(),
                    machine.clone(),
                    now.saturating_duration_since(*since),
                )
            })
            .filter(|(_, _, waited)| *waited >= STUCK_AFTER)
            .collect();
        let quiet = self
            .warned
            .is_some_and(|at| now.saturating_duration_since(at) < WARN_EVERY);
        if stuck.is_empty() || quiet {
            return None;
        }
        self.warned = Some(now);
        stuck.sort_by_key(|(_, _, waited)| std::cmp::Reverse(*waited));
        let units = stuck.len();
        stuck.truncate(NAMED);
        Some(Stuck {
            units,
            longest: stuck,
        })
    }

    /// Takes in the strays `found` among the units a pass planned (`planned`; every unit
    /// when `None`): those of the other units are kept as they were. Returns the strays not
    /// known before, to be logged once.
    pub fn strays(
        &mut self,
        planned: Option<&BTreeSet<UnitName>>,
        found: BTreeSet<(UnitName, MachineId)>,
    ) -> Vec<(UnitName, MachineId)> {
        let fresh = found.difference(&self.strays).cloned().collect();
        match planned {
            None => self.strays = found,
            Some(units) => {
                self.strays.retain(|(unit, _)| !units.contains(unit));
                self.strays.extend(found);
            }
        }
        fresh
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn stray_count(&self) -> usize {
        self.strays.len()
    }
}

/// Records what a pass found: the strays of the units it planned (`planned`, or every
/// unit), the units its plan holds back; logs new strays and stuck units, sets the gauges.
pub(super) fn report(
    copies: &mut Copies,
    metrics: &Metrics,
    now: Instant,
    plan: &Plan,
    planned: Option<&BTreeSet<UnitName>>,
    found: BTreeSet<(UnitName, MachineId)>,
) {
    for (unit, machine) in copies.strays(planned, found) {
        warn!(
            unit = %unit,
            from = %machine,
            "ignoring a stray unit state: the unit was not scheduled on that machine lately"
        );
    }
    if let Some(stuck) = copies.held(now, &plan.previous_copies) {
        warn!(
            units = stuck.units,
            longest = %stuck,
            "units still wait for a previous copy that does not stop"
        );
    }
    metrics.copies(copies.waiting(), copies.stray_count());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(s: &str) -> UnitName {
        s.parse().unwrap()
    }

    fn machine(s: &str) -> MachineId {
        s.parse().unwrap()
    }

    fn held(pairs: &[(&str, &str)]) -> BTreeMap<UnitName, MachineId> {
        pairs.iter().map(|(u, m)| (unit(u), machine(m))).collect()
    }

    #[test]
    fn a_unit_held_past_the_stop_timeout_is_warned_about_once_per_period() {
        let start = Instant::now();
        let mut c = Copies::default();
        let a = held(&[("a.service", "m1")]);
        assert_eq!(c.held(start, &a), None, "a wait just begun");
        assert_eq!(c.held(start + STUCK_AFTER / 2, &a), None);
        let at = start + STUCK_AFTER;
        let stuck = c.held(at, &a).expect("stuck");
        assert_eq!(stuck.units, 1);
        assert_eq!(stuck.to_string(), "a.service on m1 for 120s");
        assert_eq!(c.held(at + WARN_EVERY / 2, &a), None, "warned lately");
        assert!(c.held(at + WARN_EVERY, &a).is_some(), "warned again");
        assert_eq!(c.waiting(), 1);
    }

    #[test]
    fn a_wait_that_ends_or_changes_machine_starts_its_clock_again() {
        let start = Instant::now();
        let mut c = Copies::default();
        c.held(start, &held(&[("a.service", "m1"), ("b.service", "m1")]));
        let later = start + STUCK_AFTER;
        // a now waits for a copy on m2, b waits no more.
        assert_eq!(c.held(later, &held(&[("a.service", "m2")])), None);
        assert_eq!(c.waiting(), 1);
        let stuck = c.held(later + STUCK_AFTER, &held(&[("a.service", "m2")]));
        assert_eq!(
            stuck.map(|s| s.to_string()).as_deref(),
            Some("a.service on m2 for 120s")
        );
    }

    #[test]
    fn each_stray_is_new_once_and_a_partial_pass_keeps_the_others() {
        let mut c = Copies::default();
        let pair = |u: &str, m: &str| (unit(u), machine(m));
        let all = BTreeSet::from([pair("a.service", "m1"), pair("b.service", "m2")]);
        assert_eq!(c.strays(None, all.clone()).len(), 2);
        assert!(c.strays(None, all).is_empty(), "logged already");
        // A pass of b alone finds b's stray gone; a's is kept.
        let b = BTreeSet::from([unit("b.service")]);
        assert!(c.strays(Some(&b), BTreeSet::new()).is_empty());
        assert_eq!(c.stray_count(), 1);
        let again = c.strays(Some(&b), BTreeSet::from([pair("b.service", "m2")]));
        assert_eq!(
            again,
            [pair("b.service", "m2")],
            "gone, then back: new again"
        );
    }
}
