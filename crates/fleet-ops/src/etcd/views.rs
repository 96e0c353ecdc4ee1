//! The model's views of what the registry holds, built from a [`Snapshot`] without I/O: one
//! definition of a unit's current state, its machines and its restart generation, used by
//! every listing, by `GET /units` and by waits.

use fleet_core::{DesiredState, Requirements, UnitFile, UnitHash, UnitName};
use fleet_registry::{Snapshot, Unit, UnitStateRecord};
use std::collections::{BTreeMap, BTreeSet};

use crate::model::{StateView, UnitStatus, UnitView, WaitView};

/// A unit's status as the snapshot has it: its scheduled machines (sorted), why it is not
/// placed, and its restart generation.
pub fn status_of(snap: &Snapshot, unit: &Unit) -> UnitStatus {
    let name = unit.name();
    UnitStatus {
        name: name.clone(),
        hash: unit.hash(),
        desired: unit.desired(),
        machines: snap
            .schedule
            .get(name)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default(),
        unscheduled: snap.unscheduled.get(name).cloned(),
        restart: unit.record.restart,
    }
}

/// fleet's current state of a unit: `launched` where a machine scheduled to launch it reports
/// it active, `loaded` where a scheduled machine reports it at all, else `inactive`.
pub fn current_state(snap: &Snapshot, name: &UnitName) -> DesiredState {
    let Some(entries) = snap.schedule.get(name) else {
        return DesiredState::Inactive;
    };
    let states = snap.states.get(name);
    let mut best = DesiredState::Inactive;
    for (machine, entry) in entries.iter() {
        let Some(state) = states.and_then(|s| s.get(machine)) else {
            continue;
        };
        let here = if entry.desired == DesiredState::Launched
            && state.systemd.active_state().satisfies_launched()
        {
            DesiredState::Launched
        } else {
            DesiredState::Loaded
        };
        best = best.max(here);
    }
    best
}

/// The units of a listing that it leaves out because their file is neither in `files` nor
/// reported unreadable (`unreadable`): a record whose file the registry lost (issue 38),
/// each reported as the skipped-record warning reports a corrupt record, naming the way
/// out.
pub fn missing_files<'a>(
    units: impl IntoIterator<Item = &'a Unit>,
    files: &BTreeMap<UnitHash, UnitFile>,
    unreadable: &BTreeSet<UnitHash>,
) -> Vec<String> {
    units
        .into_iter()
        .filter(|u| !files.contains_key(&u.hash()) && !unreadable.contains(&u.hash()))
        .map(|u| {
            format!(
                "skipped unit {name}: its unit file {hash} is missing from the registry \
                 (fleetctl destroy {name} removes the unit)",
                name = u.name(),
                hash = u.hash()
            )
        })
        .collect()
}

/// A unit with its file, placed as the snapshot says.
pub fn unit_view(snap: &Snapshot, unit: &Unit, file: &UnitFile) -> UnitView {
    UnitView {
        status: status_of(snap, unit),
        file: file.clone(),
        global: Requirements::global(unit.name(), file),
        current: current_state(snap, unit.name()),
    }
}

/// A unit as a write left it. A write reads no schedule, so the placement fields are empty
/// (no machines, no reason, current state `inactive`): a caller that reports placement
/// lists the unit afterwards.
pub fn written_view(unit: &Unit, file: &UnitFile) -> UnitView {
    UnitView {
        status: UnitStatus {
            name: unit.name().clone(),
            hash: unit.hash(),
            desired: unit.desired(),
            machines: Vec::new(),
            unscheduled: None,
            restart: unit.record.restart,
        },
        file: file.clone(),
        global: Requirements::global(unit.name(), file),
        current: DesiredState::Inactive,
    }
}

/// One machine's published state of a unit, as the model has it, from a record no longer
/// needed ([`state_view`] copies it first).
pub fn into_state_view(s: UnitStateRecord) -> StateView {
    StateView {
        name: s.name,
        machine: s.machine,
        hash: s.hash,
        load: s.systemd.load,
        active: s.systemd.active,
        sub: s.systemd.sub,
        restart: s.restart,
        restart_pending: s.restart_pending,
        restarts: s.restarts,
        since: s.since,
        exit: s.exit,
    }
}

pub fn state_view(s: &UnitStateRecord) -> StateView {
    into_state_view(s.clone())
}

/// What a wait on `names` sees in `snap` ([`WaitView::of`]).
pub fn wait_view(snap: &Snapshot, names: &BTreeSet<UnitName>) -> WaitView {
    let units = names
        .iter()
        .filter_map(|n| Some((n.clone(), status_of(snap, snap.units.get(n)?))));
    let states = names
        .iter()
        .filter_map(|n| snap.states.get(n))
        .flat_map(|per_machine| per_machine.iter().map(|(_, s)| state_view(s)));
    WaitView::of(names, units, states, snap.machines.values().cloned())
}

#[cfg(test)]
mod tests;
