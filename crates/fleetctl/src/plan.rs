//! The decisions of fleet's unit operations, apart from their I/O. A command first resolves
//! each argument to a [`Prepared`] action (create, replace, keep) and reads a [`View`] of what
//! else the decision needs ([`needs`] says what); [`decide`] then says, for each unit, what
//! is written and what follows (nothing, a line, a wait); the caller applies the steps and
//! afterwards compares placements ([`placements`]).
//!
//! fleetctl's `load` and `start` apply these over either driver; only fleetctl uses them,
//! so they live here (fleet-ops holds what fleetctl and the API share). This module does no
//! I/O, prints nothing, and names only fleet-core's and fleet-ops' types (no clap, no
//! anyhow).

use fleet_core::{DesiredState, MachineId, Requirements, UnitFile, UnitHash, UnitName};
use std::collections::BTreeMap;

use fleet_ops::UnitStatus;

/// A unit as the decisions see it: what [`fleet_ops::Cluster::units`] says of it.
pub type Unit = UnitStatus;

/// What will happen to one argument.
#[derive(Debug, Clone)]
pub enum Action {
    Create(UnitFile),
    Replace {
        existing: Unit,
        file: UnitFile,
    },
    /// Already in the registry; left as it is.
    Keep(Unit),
}

/// One argument, resolved: its unit and what will happen to it.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub name: UnitName,
    pub action: Action,
}

/// What `load` or `start` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The desired state every unit is raised to (never lowered).
    pub target: DesiredState,
    /// Whether the caller waits for the units to get there (`--no-block`: not).
    pub wait: bool,
}

/// What [`decide`] needs to read from the registry, once, before it runs.
#[derive(Debug, Default, PartialEq)]
pub struct Needs {
    /// Replaced units, in argument order: where they run now.
    pub placements: Vec<UnitName>,
    /// Kept units that will be waited for (raised, or already at the target), one per file
    /// hash: their files tell global units (no single machine to wait on).
    pub files: BTreeMap<UnitHash, Unit>,
}

/// What the registry said, read as [`Needs`] asked.
#[derive(Debug, Default)]
pub struct View {
    /// Where each replaced unit runs now (its first scheduled machine), if anywhere.
    pub placed: BTreeMap<UnitName, MachineId>,
    /// The files [`Needs::files`] named, by hash.
    pub files: BTreeMap<UnitHash, UnitFile>,
}

/// One unit's step: the action to write, and what follows once it is written (and, if it
/// is still below the target, raised).
#[derive(Debug, Clone)]
pub struct Step {
    pub name: UnitName,
    pub action: Action,
    pub then: Then,
}

/// What follows a unit's write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Kept and nothing to wait for (past the target, a global unit at it, or not waited
    /// for): nothing changed, nothing to say.
    Nothing,
    /// Changed, and not waited for: it was triggered.
    Triggered,
    /// Changed, and global: it is said to be in its state at once, as there is no one
    /// machine to wait on (fleet's behaviour).
    Global,
    /// Wait until it reaches the target on its machine: changed, or kept at the target (a
    /// blocking command waits for the state it promises whether or not it wrote anything;
    /// fleet returned at once).
    Wait,
}

/// What to read before [`decide`].
pub fn needs(prepared: &[Prepared], request: Request) -> Needs {
    let mut needs = Needs::default();
    for p in prepared {
        match &p.action {
            Action::Replace { .. } => needs.placements.push(p.name.clone()),
            Action::Keep(unit) if request.wait && unit.desired <= request.target => {
                needs.files.entry(unit.hash).or_insert_with(|| unit.clone());
            }
            Action::Create(_) | Action::Keep(_) => {}
        }
    }
    needs
}

/// The steps of a `load` or `start`, in argument order. A unit changes when it is created,
/// replaced, or kept below the target (then raised); a kept unit is never lowered (unlike
/// fleet, `load` does not stop a launched unit, fleet #1428). A non-global unit kept at the
/// target is waited for like a changed one.
pub fn decide(prepared: Vec<Prepared>, view: &View, request: Request) -> Vec<Step> {
    prepared
        .into_iter()
        .map(|Prepared { name, action }| {
            let global = match &action {
                Action::Create(file) | Action::Replace { file, .. } => {
                    Requirements::global(&name, file)
                }
                Action::Keep(unit) => view
                    .files
                    .get(&unit.hash)
                    .is_some_and(|file| Requirements::global(&name, file)),
            };
            let changed = match &action {
                Action::Create(_) | Action::Replace { .. } => true,
                Action::Keep(unit) => raises(unit, request),
            };
            let at_target = matches!(&action, Action::Keep(u) if u.desired == request.target);
            let then = match (changed, request.wait, global) {
                (false, true, false) if at_target => Then::Wait,
                (false, _, _) => Then::Nothing,
                (true, false, _) => Then::Triggered,
                (true, true, true) => Then::Global,
                (true, true, false) => Then::Wait,
            };
            Step { name, action, then }
        })
        .collect()
}

fn raises(unit: &Unit, request: Request) -> bool {
    unit.desired < request.target
}

/// The first scheduled machine of each unit of `units` among `names` that has one.
pub fn placed<'a>(
    units: impl IntoIterator<Item = &'a UnitStatus>,
    names: &[UnitName],
) -> BTreeMap<UnitName, MachineId> {
    units
        .into_iter()
        .filter(|u| names.contains(&u.name))
        .filter_map(|u| Some((u.name.clone(), u.machines.first()?.clone())))
        .collect()
}

/// Where a replaced unit runs after its replacement, against where it ran before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    InPlace {
        name: UnitName,
        machine: MachineId,
    },
    Moved {
        name: UnitName,
        from: MachineId,
        to: MachineId,
    },
}

/// For each of `names` (in order) that ran somewhere before and runs somewhere now: whether
/// it stayed or moved. One that ran nowhere before or runs nowhere now is not reported.
pub fn placements(
    names: &[UnitName],
    before: &BTreeMap<UnitName, MachineId>,
    now: &BTreeMap<UnitName, MachineId>,
) -> Vec<Placement> {
    names
        .iter()
        .filter_map(|name| {
            let (old, new) = (before.get(name)?, now.get(name)?);
            Some(if old == new {
                Placement::InPlace {
                    name: name.clone(),
                    machine: new.clone(),
                }
            } else {
                Placement::Moved {
                    name: name.clone(),
                    from: old.clone(),
                    to: new.clone(),
                }
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
