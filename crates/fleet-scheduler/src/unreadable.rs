//! What the engine makes of registry values it cannot read ([`Snapshot::skipped`]). A value
//! that does not decode says nothing about the unit or machine its key names, so it is never
//! taken for one that is gone: a running unit is not stopped or moved because its record, or
//! its machine's, became unreadable (docs/guarantees.md, promise 1).
//!
//! - A unit whose record cannot be read keeps its entries exactly where they are (and its
//!   unschedulable reason); nothing is placed for it until the record reads again or is
//!   destroyed.
//! - A machine whose record cannot be read is there (its key is, held by its lease): the
//!   units on it stay exactly where they are, and it gets no new unit (its metadata is
//!   unknown).
//! - A schedule entry that cannot be read runs nowhere (its agent skips it), so its unit is
//!   placed as if it had no entry; the engine, which owns `schedule/`, deletes the entry
//!   unless the same plan writes that very key.
//!
//! - A drain mark that cannot be read still drains its machine: it takes no new non-global
//!   unit, and none of its units is moved (how many at a time is unknown) until the mark
//!   reads again or is removed. A drain move record that cannot be read counts for nothing.
//!
//! Keys whose parts do not parse name nothing and are left as they are (and warned about),
//! except under `schedule/`, which the engine owns: such a key is deleted, once, in the
//! pass that first sees it (issue 38: `schedule/m1/../../etc.service` was warned about by
//! every reader forever). No agent runs anything for it, so its deletion changes nothing
//! but the warnings.

use fleet_core::{MachineId, UnitName};
use fleet_registry::{Key, Keys, Snapshot, StrayScheduleKey};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use crate::{Decision, DecisionKind, Reason};

/// The unreadable values of one snapshot, by what their keys name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Unreadable {
    /// Units whose record cannot be read.
    pub units: BTreeSet<UnitName>,
    /// Machines whose record cannot be read.
    pub machines: BTreeSet<MachineId>,
    /// Schedule entries that cannot be read: key -> (machine, unit).
    pub schedule: BTreeMap<String, (MachineId, UnitName)>,
    /// Machines whose drain mark cannot be read.
    pub drained: BTreeSet<MachineId>,
    /// Machines whose migration mark cannot be read: held as if marked, since the mark
    /// may say that copies fleet started run there.
    pub migrating: BTreeSet<MachineId>,
}

impl Unreadable {
    pub fn of(snap: &Snapshot) -> Unreadable {
        let mut out = Unreadable::default();
        for (key, skipped) in &snap.skipped {
            match skipped.named.as_deref() {
                Some(Key::Unit(unit)) => {
                    out.units.insert(unit.clone());
                }
                Some(Key::Machine(machine)) => {
                    out.machines.insert(machine.clone());
                }
                Some(Key::Drain(machine)) => {
                    out.drained.insert(machine.clone());
                }
                Some(Key::Migrating(machine)) => {
                    out.migrating.insert(machine.clone());
                }
                Some(Key::Schedule { machine, unit }) => {
                    let slot = (machine.clone(), unit.clone());
                    out.schedule.insert(key.clone(), slot);
                }
                // A dynamic metadata value that is not UTF-8 (only a hand-written one can be:
                // the API checks what it writes) is left out: the machine keeps its
                // configured value of that key, and still counts only if it is registered.
                Some(
                    Key::File(_)
                    | Key::FileRef { .. }
                    | Key::State { .. }
                    | Key::Leader
                    | Key::Disruption
                    | Key::Unscheduled(_)
                    | Key::Metadata { .. }
                    | Key::Event { .. }
                    | Key::Moving(_)
                    | Key::Placement { .. }
                    | Key::Left { .. },
                )
                | None => {}
            }
        }
        out
    }

    /// `held` and every unit with an entry on a machine whose record cannot be read.
    pub fn held<'a>(
        &self,
        snap: &Snapshot,
        held: &'a BTreeSet<UnitName>,
    ) -> Cow<'a, BTreeSet<UnitName>> {
        let on_unreadable: Vec<&UnitName> = snap
            .schedule
            .iter()
            .filter(|(u, ms)| !held.contains(*u) && ms.keys().any(|m| self.machines.contains(m)))
            .map(|(u, _)| u)
            .collect();
        if on_unreadable.is_empty() {
            return Cow::Borrowed(held);
        }
        let mut all = held.clone();
        all.extend(on_unreadable.into_iter().cloned());
        Cow::Owned(all)
    }

    /// Puts first in `decisions` the deletion of every unreadable schedule entry whose key
    /// the plan does not write anyway (a put over it replaces it; two writes of one key
    /// cannot share a transaction).
    pub fn delete_entries(&self, decisions: &mut Vec<Decision>) {
        let written: BTreeSet<(&MachineId, &UnitName)> = decisions
            .iter()
            .filter_map(|d| d.kind.machine().map(|m| (m, d.kind.unit())))
            .collect();
        let deletes: Vec<Decision> = self
            .schedule
            .iter()
            .filter(|(_, (m, u))| !written.contains(&(m, u)))
            .map(|(key, (machine, unit))| Decision {
                // Its agent runs nothing for an entry it cannot read: no copy to record.
                kind: DecisionKind::Unschedule {
                    unit: unit.clone(),
                    machine: machine.clone(),
                    left: None,
                },
                reason: Reason::Unreadable { key: key.clone() },
            })
            .collect();
        decisions.splice(0..0, deletes);
    }
}

/// The keys under `schedule/` of `snap` that name no entry: to be deleted.
pub fn stray_schedule_keys(snap: &Snapshot, keys: &Keys) -> Vec<StrayScheduleKey> {
    snap.skipped
        .keys()
        .filter_map(|key| keys.stray_schedule_key(key))
        .collect()
}

/// Every machine migrating from fleet v1 (`P/migrating/`), its mark readable or not.
pub(crate) fn migrating_machines(snap: &Snapshot) -> BTreeSet<MachineId> {
    let unreadable = Unreadable::of(snap).migrating;
    snap.migrating.keys().cloned().chain(unreadable).collect()
}

/// Every machine that is there, readable or not.
pub(crate) fn present_machines(snap: &Snapshot) -> BTreeSet<MachineId> {
    let unreadable = Unreadable::of(snap).machines;
    snap.machines.keys().cloned().chain(unreadable).collect()
}
