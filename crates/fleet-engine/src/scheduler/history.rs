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
//! - a machine the unit left while a copy may still have run there: the engine records that
//!   (`P/left/<unit>/<machine>`, [`Snapshot::left`]) in the transaction that deletes the entry
//!   ([`Cluster::leaves_copy`]), so a new leader knows it as well as the old one did,
//!
//! and only while that machine is there (its record is, readable or not): once its lease is
//! gone, its states are gone with it, and its fence stops the copy. Until the fence has, the
//! engine holds the unit like the machine's scheduled ones ([`crate::disruption`] counts the
//! record as the machine's): it is not placed elsewhere. A record is withdrawn ([`forgotten`])
//! once the machine publishes no state of the unit that may be running, once the machine is
//! gone and its unit no longer held, or once the unit is scheduled there again. Anything else a machine publishes about a unit it may run
//! is a *stray* ([`strays`]): ignored for placement, reported by the engine.

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
            || self.recorded(unit, machine)
    }

    /// Whether the registry records that `unit` left `machine`.
    pub fn recorded(&self, unit: &UnitName, machine: &MachineId) -> bool {
        self.left
            .get(unit)
            .is_some_and(|ms| ms.contains_key(machine))
    }

    /// Whether `machine` publishes a copy of `unit` that may be running.
    pub fn may_run(&self, unit: &UnitName, machine: &MachineId) -> bool {
        self.states
            .get(unit)
            .and_then(|states| states.get(machine))
            .is_some_and(|state| state.systemd.active_state().may_be_running())
    }

    /// The machines that publish a copy of `unit` that may be running, in ID order.
    pub fn running(&self, unit: &UnitName) -> impl Iterator<Item = &'s MachineId> {
        let states = self.states.get(unit).into_iter().flat_map(PerMachine::iter);
        states
            .filter(|(_, state)| state.systemd.active_state().may_be_running())
            .map(|(machine, _)| machine)
    }
}

/// The records of the history the plan withdraws, each with why: its machine is gone (and the
/// unit is not held: a held unit keeps its record while the machine's fence may still be
/// stopping the copy), the unit is scheduled there again (the entry speaks for it), or the
/// machine publishes no copy that may be running. Only the records of the units in the plan's snapshot: a plan of a few
/// units (`delta.rs`) leaves the others' records to the next whole plan.
pub(super) fn forgotten(snapshot: &Snapshot, c: &Cluster<'_>) -> Vec<Decision> {
    let history = History::of(snapshot);
    let mut out = Vec::new();
    for (unit, machines) in &snapshot.left {
        for machine in machines.keys() {
            let reason = if !c.is_there(machine) {
                if c.is_held(unit) {
                    continue;
                }
                Reason::MachineGone {
                    machine: machine.clone(),
                }
            } else if c.has(unit, machine) {
                Reason::ScheduledAgain {
                    machine: machine.clone(),
                }
            } else if !history.may_run(unit, machine) {
                Reason::CopyStopped {
                    machine: machine.clone(),
                }
            } else {
                continue;
            };
            let kind = DecisionKind::Forget {
                unit: unit.clone(),
                machine: machine.clone(),
            };
            out.push(Decision { kind, reason });
        }
    }
    out
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
