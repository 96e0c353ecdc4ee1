//! Why a unit is where it is, or nowhere: [`explain`] answers from one snapshot with the
//! scheduler's own rule functions (the tests a plan makes to keep, place or refuse a unit),
//! never with a second implementation, so it cannot tell another story than the engine
//! acts on. [`drain_status`] says the same of a drain: what has left, what is on its way,
//! what waits its turn and what cannot leave.
//!
//! It looks at the registry as it is (the schedule of the snapshot), not at what the next
//! plan will make of it. The results are plain data, serialized for the API and fleetctl.

use fleet_core::{DesiredState, MachineId, Requirements, UnitFile, UnitHash, UnitName};
use fleet_registry::{Key, Snapshot};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

use super::cluster::Cluster;
use super::decision::{Reason, Violation};
use super::{drain, global_verdicts, globals, keep_rule, place_violation, unschedulable_reason};

/// Where a unit stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Scheduled on at least one machine.
    Placed,
    /// Wanted, and on no machine.
    Waiting,
    /// Its desired state is `inactive`: it is placed nowhere, on purpose.
    Inactive,
    /// Its unit file is not in the registry (or the engine holds it): left where it is.
    FileUnknown,
    /// Its `[X-Fleet]` options are a combination fleet refuses: never placed.
    Invalid,
    /// Its record cannot be read: left where it is.
    Unreadable,
    /// No such unit.
    NotFound,
}

/// The first rule a machine fails for a unit, as data and as the sentence the engine logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    #[serde(flatten)]
    pub violation: Violation,
    pub message: String,
}

impl From<Violation> for Rejection {
    fn from(violation: Violation) -> Rejection {
        let message = violation.to_string();
        Rejection { violation, message }
    }
}

/// What a unit's rules say of one live machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineVerdict {
    pub machine: MachineId,
    /// Whether the unit is scheduled there now.
    pub scheduled: bool,
    /// The first rule the machine fails: to keep the unit (if scheduled there) or to take it
    /// (if not). `None`: it satisfies every rule.
    pub rejected: Option<Rejection>,
}

/// Why a unit is where it is, or nowhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explanation {
    pub unit: UnitName,
    pub status: Status,
    /// One line: the scheduler's reason (as the engine publishes it), or why it stays.
    pub summary: String,
    /// The unit's `[X-Fleet]` rules, one `Key=value` each (empty: fleet picks the
    /// least-loaded machine).
    pub rules: Vec<String>,
    pub global: bool,
    /// Every live machine, in ID order.
    pub machines: Vec<MachineVerdict>,
}

/// Explains `unit` from `snapshot` (and the unit files it names).
pub fn explain(
    snapshot: &Snapshot,
    files: &BTreeMap<UnitHash, UnitFile>,
    unit: &UnitName,
) -> Explanation {
    let none = BTreeSet::new();
    let c = Cluster::new(snapshot, files, &none);
    let mut out = Explanation {
        unit: unit.clone(),
        status: Status::NotFound,
        summary: String::new(),
        rules: Vec::new(),
        global: false,
        machines: Vec::new(),
    };
    let Some(record) = snapshot.units.get(unit) else {
        let unreadable = snapshot
            .skipped
            .values()
            .any(|s| matches!(s.named.as_deref(), Some(Key::Unit(u)) if u == unit));
        (out.status, out.summary) = if unreadable {
            (
                Status::Unreadable,
                "its record cannot be read; it stays where it is".into(),
            )
        } else {
            (Status::NotFound, format!("unit {unit} not found"))
        };
        return out;
    };
    if let Some(file) = files.get(&record.hash()) {
        let reqs = Requirements::from_unit(unit, file);
        out.rules = rules(&reqs);
        out.global = reqs.global;
    }
    if record.desired() == DesiredState::Inactive {
        (out.status, out.summary) = (Status::Inactive, Reason::TargetInactive.to_string());
        return out;
    }
    if let Some(error) = c.invalid.get(unit) {
        let reason = Reason::InvalidRequirements {
            error: error.clone(),
        };
        (out.status, out.summary) = (Status::Invalid, reason.to_string());
        return out;
    }
    if !c.specs.contains_key(unit) {
        let summary = "its unit file is not known to the engine; it stays where it is";
        (out.status, out.summary) = (Status::FileUnknown, summary.into());
        return out;
    }
    out.machines = verdicts(&c, unit);
    let here: Vec<&MachineId> = c.machines_of(unit).collect();
    if here.is_empty() {
        out.status = Status::Waiting;
        out.summary = match unschedulable_reason(&c, unit) {
            Some(reason) => reason.to_string(),
            None => "a machine can take it: the engine places it in its next pass".into(),
        };
        return out;
    }
    out.status = Status::Placed;
    out.summary = placed_summary(&c, unit, &here, &out.rules);
    out
}

fn placed_summary(
    c: &Cluster<'_>,
    unit: &UnitName,
    here: &[&MachineId],
    rules: &[String],
) -> String {
    let names: Vec<&str> = here.iter().map(|m| m.as_str()).collect();
    let on = names.join(", ");
    if c.is_global(unit) {
        return format!("global unit on {on}: every machine that satisfies its rules runs it");
    }
    let machine = here[0];
    if c.drained.contains_key(machine) {
        return match drain::stuck(c, unit, machine) {
            Some(reason) => reason.to_string(),
            None => format!(
                "{}: it leaves in its turn",
                Reason::Drained {
                    machine: machine.clone()
                }
            ),
        };
    }
    if let Some(violation) = keep_rule(c, unit, machine) {
        return format!("scheduled on {on}, which no longer satisfies it: {violation}");
    }
    if rules.is_empty() {
        format!("scheduled on {on}: it has no [X-Fleet] rules, and it stays")
    } else {
        format!("scheduled on {on}: the machine satisfies every rule, and it stays")
    }
}

/// The verdict of every live machine, by the scheduler's own tests: to keep a placed unit
/// ([`keep_rule`], a drain first), to place one ([`place_violation`]), or a global unit's.
fn verdicts(c: &Cluster<'_>, unit: &UnitName) -> Vec<MachineVerdict> {
    let all_globals = globals(c);
    c.machines
        .keys()
        .map(|machine| {
            let scheduled = c.machines_of(unit).any(|m| m == machine);
            let rejected = if c.is_global(unit) {
                global_verdicts(c, &all_globals, machine)
                    .into_iter()
                    .find(|(g, _)| g == unit)
                    .and_then(|(_, v)| v)
            } else if scheduled {
                c.drain_violation(unit, machine)
                    .or_else(|| keep_rule(c, unit, machine))
            } else {
                place_violation(c, unit, machine)
            };
            MachineVerdict {
                machine: machine.clone(),
                scheduled,
                rejected: rejected.map(Rejection::from),
            }
        })
        .collect()
}

/// The `[X-Fleet]` rules of a unit, one `Key=value` line each.
fn rules(reqs: &Requirements) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(id) = &reqs.machine_id {
        out.push(format!("MachineID={id}"));
    }
    out.extend(reqs.machine_of.iter().map(|p| format!("MachineOf={p}")));
    for (key, values) in &reqs.metadata {
        out.extend(values.iter().map(|v| format!("MachineMetadata={key}={v}")));
    }
    out.extend(reqs.conflicts.iter().map(|g| format!("Conflicts={g}")));
    out.extend(reqs.replaces.iter().map(|g| format!("Replaces={g}")));
    if reqs.global {
        out.push("Global=true".into());
    }
    out
}

/// How a drain of one machine stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainStatus {
    pub machine: MachineId,
    /// How many moves may be on their way at once; `None`: the machine is not drained.
    pub parallel: Option<u32>,
    /// Units that left it and are not yet active elsewhere.
    pub moving: Vec<UnitName>,
    /// Non-global units still on it that will leave in their turn.
    pub queued: Vec<UnitName>,
    /// Non-global units still on it that no other machine can take, with the reason.
    pub stuck: Vec<(UnitName, String)>,
    /// Global units on it: they stay.
    pub globals: Vec<UnitName>,
    /// Nothing on its way and nothing left that could leave.
    pub done: bool,
}

/// How the drain of `machine` stands in `snapshot`.
pub fn drain_status(
    snapshot: &Snapshot,
    files: &BTreeMap<UnitHash, UnitFile>,
    machine: &MachineId,
) -> DrainStatus {
    let none = BTreeSet::new();
    let c = Cluster::new(snapshot, files, &none);
    let moving: Vec<UnitName> = snapshot
        .moving
        .values()
        .filter(|m| &m.from == machine && !c.arrived_elsewhere(&m.unit, machine))
        .filter(|m| c.specs.contains_key(&m.unit))
        .map(|m| m.unit.clone())
        .collect();
    let mut out = DrainStatus {
        machine: machine.clone(),
        parallel: c.drained.get(machine).copied(),
        moving,
        queued: Vec::new(),
        stuck: Vec::new(),
        globals: Vec::new(),
        done: false,
    };
    let here = c
        .units_on(machine)
        .filter(|u| c.specs.contains_key(*u) && !out.moving.contains(u));
    for unit in here {
        if c.is_global(unit) {
            out.globals.push(unit.clone());
        } else if let Some(reason) = drain::stuck(&c, unit, machine) {
            out.stuck.push((unit.clone(), reason.to_string()));
        } else {
            out.queued.push(unit.clone());
        }
    }
    out.done = out.parallel.is_some() && out.moving.is_empty() && out.queued.is_empty();
    out
}

#[cfg(test)]
mod tests;
