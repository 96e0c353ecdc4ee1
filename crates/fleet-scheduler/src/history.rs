//! The placement history (issue 36): which machines may hold a unit's next placement back.
//!
//! A non-global unit is not placed while a copy of it may still run on another machine: that
//! copy's stop job (`ExecStopPost=` included) may still be going, and two copies never run at
//! once. What says a copy may run is the state a machine publishes under its own prefix
//! (`P/unit-state/<M>/`), which M's etcd credentials may write, for any unit. Believed from
//! any machine, one compromised or confused host could hold any unit back, cluster-wide,
//! forever. So a published copy counts only from a machine in the unit's history:
//!
//! - a machine the unit is scheduled on, as the snapshot has it (an entry this very plan
//!   removes counts), or
//! - a machine the unit left while a copy may still run there: any machine that is there,
//!   whatever it published, since a state lags its agent's starts (it publishes at the end of
//!   its pass, so a copy just started shows no state, or a state from before the start). The
//!   engine records that (`P/left/<unit>/<machine>`, [`Snapshot::left`]), with what the
//!   machine had published of the copy ([`LeftCopy`]), in the transaction that deletes the
//!   entry ([`Cluster::leaves_copy`]), so a new leader knows it as well as the old one did,
//!
//! and only while that machine is there (its record is, readable or not): once its lease is
//! gone, its states are gone with it, and its fence stops the copy. Until the fence has, the
//! engine holds the unit like the machine's scheduled ones ([`crate::disruption`] counts the
//! record as the machine's): it is not placed elsewhere. A record is withdrawn ([`forgotten`])
//! once the machine shows the copy stopped (how depends on what it had published: see
//! [`forgotten`]), once the machine is gone and its unit no longer held, or once the unit is
//! scheduled there again. A copy no state shows holds nothing back (the engine cannot know of
//! it); once published running, it does. Anything else a machine publishes about a unit it
//! may run is a *stray* ([`strays`]): ignored for placement, reported by the engine.

use fleet_core::{MachineId, Requirements, UnitFile, UnitHash, UnitName};
use fleet_registry::{LeftCopy, PerMachine, ScheduleEntry, Snapshot, UnitStateRecord};
use std::collections::{BTreeMap, BTreeSet};

use super::cluster::Cluster;
use super::decision::{Decision, DecisionKind, Reason};

/// The machines in each unit's history, and what they publish, as one snapshot has them.
#[derive(Debug, Clone, Copy)]
pub(super) struct History<'s> {
    schedule: &'s BTreeMap<UnitName, PerMachine<ScheduleEntry>>,
    left: &'s BTreeMap<UnitName, PerMachine<LeftCopy>>,
    states: &'s BTreeMap<UnitName, PerMachine<UnitStateRecord>>,
}

impl<'s> History<'s> {
    pub fn of(snapshot: &'s Snapshot) -> History<'s> {
        History {
            schedule: &snapshot.schedule,
            left: &snapshot.left,
            states: &snapshot.states,
        }
    }

    /// Whether `machine` is in `unit`'s history: scheduled there, or a record that it left.
    pub fn knows(&self, unit: &UnitName, machine: &MachineId) -> bool {
        self.schedule
            .get(unit)
            .is_some_and(|ms| ms.contains_key(machine))
            || self.recorded(unit, machine).is_some()
    }

    /// What the registry records `machine` had published of `unit` when the unit left it, if
    /// it records that the unit left it.
    pub fn recorded(&self, unit: &UnitName, machine: &MachineId) -> Option<LeftCopy> {
        self.left.get(unit).and_then(|ms| ms.get(machine)).copied()
    }

    /// What `machine` publishes of `unit`'s copy, as a record of the history keeps it.
    pub fn published(&self, unit: &UnitName, machine: &MachineId) -> LeftCopy {
        match self.state(unit, machine) {
            None => LeftCopy::Unpublished,
            Some(state) if state.systemd.active_state().may_be_running() => LeftCopy::Running,
            Some(_) => LeftCopy::Stopped,
        }
    }

    fn state(&self, unit: &UnitName, machine: &MachineId) -> Option<&'s UnitStateRecord> {
        self.states.get(unit).and_then(|states| states.get(machine))
    }

    /// The machines `unit` is recorded to have left, in ID order.
    pub fn left_machines(&self, unit: &UnitName) -> impl Iterator<Item = &'s MachineId> {
        self.left.get(unit).into_iter().flat_map(PerMachine::keys)
    }

    /// The machines that publish a copy of `unit` that may be running, in ID order.
    pub fn running(&self, unit: &UnitName) -> impl Iterator<Item = &'s MachineId> {
        let states = self.states.get(unit).into_iter().flat_map(PerMachine::iter);
        states
            .filter(|(_, state)| state.systemd.active_state().may_be_running())
            .map(|(machine, _)| machine)
    }
}

/// The records of the history the plan withdraws or rewrites, each with why. A record goes
/// once its machine is gone (and the unit is not held: a held unit keeps its record while the
/// machine's fence may still be stopping the copy), once the unit is scheduled there again
/// (the entry speaks for it), or once the copy has stopped as the record's kind tells it
/// ([`LeftCopy`]): a copy published running is no longer published so; a copy published
/// stopped, whose state may predate a start, is no longer published at all (its agent
/// unloaded the unit, which it does only once stopped); an unpublished copy is published
/// stopped. An unpublished copy published running is recorded as running from then on.
/// Only the records of the units in the plan's snapshot: a plan of a few units (`delta.rs`)
/// leaves the others' records to the next whole plan.
pub(super) fn forgotten(snapshot: &Snapshot, c: &Cluster<'_>) -> Vec<Decision> {
    let history = History::of(snapshot);
    let mut out = Vec::new();
    for (unit, machines) in &snapshot.left {
        for (machine, copy) in machines {
            let Some((kind, reason)) = withdrawal(&history, c, unit, machine, *copy) else {
                continue;
            };
            out.push(Decision { kind, reason });
        }
    }
    out
}

/// What becomes of the record that `unit` left `machine`, whose copy was `copy`: `None`, it
/// stays as it is.
fn withdrawal(
    history: &History<'_>,
    c: &Cluster<'_>,
    unit: &UnitName,
    machine: &MachineId,
    copy: LeftCopy,
) -> Option<(DecisionKind, Reason)> {
    let machine = machine.clone();
    let forget = |reason| {
        let kind = DecisionKind::Forget {
            unit: unit.clone(),
            machine: machine.clone(),
        };
        Some((kind, reason))
    };
    if !c.is_there(&machine) {
        if c.is_held(unit) {
            return None;
        }
        return forget(Reason::MachineGone {
            machine: machine.clone(),
        });
    }
    if c.has(unit, &machine) {
        return forget(Reason::ScheduledAgain {
            machine: machine.clone(),
        });
    }
    match (copy, history.published(unit, &machine)) {
        (LeftCopy::Running, LeftCopy::Stopped | LeftCopy::Unpublished)
        | (LeftCopy::Stopped, LeftCopy::Unpublished)
        | (LeftCopy::Unpublished, LeftCopy::Stopped) => forget(Reason::CopyStopped {
            machine: machine.clone(),
        }),
        (LeftCopy::Unpublished, LeftCopy::Running) => {
            let kind = DecisionKind::Record {
                unit: unit.clone(),
                machine: machine.clone(),
                copy: LeftCopy::Running,
            };
            Some((kind, Reason::CopyPublished { machine }))
        }
        (LeftCopy::Running, LeftCopy::Running)
        | (LeftCopy::Stopped, LeftCopy::Running | LeftCopy::Stopped)
        | (LeftCopy::Unpublished, LeftCopy::Unpublished) => None,
    }
}

/// The stray states of `units`: a machine there publishes a copy of a wanted, non-global
/// unit (one the scheduler places) that may be running, and the unit's history does not name
/// the machine. Such a state holds nothing back; the engine reports it.
pub fn strays<'a>(
    snapshot: &Snapshot,
    files: &BTreeMap<UnitHash, UnitFile>,
    units: impl IntoIterator<Item = &'a UnitName>,
) -> BTreeSet<(UnitName, MachineId)> {
    let history = History::of(snapshot);
    let placeable = |name: &UnitName| {
        let unit = snapshot.units.get(name);
        let file = unit
            .filter(|u| u.desired() != fleet_core::DesiredState::Inactive)
            .and_then(|u| files.get(&u.hash()));
        file.is_some_and(|f| !Requirements::global(name, f))
    };
    let mut out = BTreeSet::new();
    for unit in units {
        let mut found = history
            .running(unit)
            .filter(|m| snapshot.machines.contains_key(*m) && !history.knows(unit, m))
            .peekable();
        // Whether the unit is placeable is asked only of the few units with a stray.
        if found.peek().is_some() && placeable(unit) {
            out.extend(found.map(|m| (unit.clone(), m.clone())));
        }
    }
    out
}
