//! fleet's scheduler: a pure function from one consistent [`Snapshot`] (and the unit
//! files it names) to the [`Decision`]s that make the schedule obey every unit's `[X-Fleet]`
//! rules. No I/O, no clock, no randomness: the same snapshot always yields the same plan.
//!
//! The rules are fleet's (`engine/reconciler.go`, `engine/scheduler.go`,
//! `agent/state.go:AbleToRun`), made deterministic and settled within one plan:
//! - An entry stays where it is while its machine is live and still satisfies the unit's
//!   rules; a changed hash, desired state, restart generation or replace option is updated
//!   in place. Healthy units never move, a replaced one included.
//! - A rolling replace gives the new version only to the machines it has reached (and to
//!   machines that have no entry yet); the others keep the previous version.
//! - An entry placed under an older placement generation (`--reschedule`) is placed afresh,
//!   away from the machine to avoid if another one can run it.
//! - A non-global unit is not placed while another machine still publishes a running copy
//!   of it, one that is there and in the unit's placement history (scheduled there, or left
//!   lately, [`history`]): it waits, with a reason, until that copy has stopped. A copy any
//!   other machine publishes holds nothing back. The entry of a non-global unit on a
//!   machine that is there is deleted with a record that the unit left, saying what the
//!   machine had published of its copy (withdrawn once the copy stopped).
//! - Of two units on one machine that conflict, the first in name order stays; a unit that
//!   another unit there `Replaces=` is displaced (fleet #1698) to another machine able to
//!   run it. A non-global unit wins over a global one.
//! - An unplaced unit goes to the least-loaded able machine (fewest units, ties by machine
//!   ID), units taken in name order. `MachineOf=` dependents follow their peer.
//! - A global unit runs on every machine whose rules it satisfies; of two conflicting
//!   globals the first in name order wins.
//! - A unit that cannot be placed gets a reason; it is cleared once the unit is placed.
//!   Units whose options fleet's validation refuses are never placed (their reason says so).
//! - A drained machine takes no new non-global unit; its non-global units leave it a few at
//!   a time, each placed elsewhere like any unplaced unit (see [`drain`]).
//! - A value the registry cannot read is never taken for a unit or machine that is gone (see
//!   [`crate::unreadable`]): the units it concerns stay where they are, and an unreadable
//!   schedule entry is deleted.
//!
//! Every change is applied to a working copy at once, so later decisions see earlier ones,
//! and the plan is repeated until nothing changes: applying a plan and planning again yields
//! nothing (as long as the published states stay the same). The output is the net
//! difference from the snapshot.
//!
//! The same rule functions answer `explain` and a drain's status ([`explain`],
//! [`drain_status`]), for fleetctl and the API, and [`disruption`] is the rule that holds the
//! units of vanished machines. This crate is the engine's decisions without the engine's
//! I/O: fleet-engine runs them (leadership, watches, fenced writes); fleet-ops and fleetctl
//! use the explanations without depending on the engine.

mod cluster;
mod decision;
mod delta;
pub mod disruption;
mod drain;
mod explain;
mod history;
mod spec;
pub mod unreadable;

use fleet_core::{MachineId, UnitFile, UnitHash, UnitName};
use fleet_registry::{ScheduleEntry, Snapshot};
use std::collections::{BTreeMap, BTreeSet};

use cluster::{Cluster, Slot};
pub use decision::{Decision, DecisionKind, Reason, Violation};
pub use delta::{Entangled, Load, plan_delta, plan_delta_holding, plan_delta_on, touched_by_loss};
pub use disruption::{Assessment, Disruption, DisruptionConfig, Hold};
pub use explain::{
    DrainStatus, Explanation, MachineVerdict, Rejection, Status, drain_status, explain,
};
pub use history::strays;
use spec::Spec;

/// A bound on evict-then-place rounds. Ordinary plans settle in two or three; only a cycle
/// of `Replaces=` (a replaces b replaces c replaces a) could go on, and then the next plan
/// carries on where this one stopped.
const MAX_ROUNDS: usize = 16;

/// What a plan decided, and what it waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The changes to write, in [`DecisionKind`] order.
    pub decisions: Vec<Decision>,
    /// Units held back until a copy another machine still runs has stopped, and units
    /// moving off a drained machine until they are active elsewhere: the only cases where a
    /// change of published states can change the plan.
    pub waiting: BTreeSet<UnitName>,
    /// The units held back for a previous copy, each with the machine that copy is on.
    pub previous_copies: BTreeMap<UnitName, MachineId>,
}

/// Decides what to change so that the schedule obeys every unit's rules. Units whose file is
/// missing from `files` are left where they are. Decisions come in [`DecisionKind`] order.
pub fn plan(snapshot: &Snapshot, files: &BTreeMap<UnitHash, UnitFile>) -> Plan {
    plan_holding(snapshot, files, &BTreeSet::new())
}

/// [`plan`], leaving the `held` units exactly where they are, entries on machines that are
/// gone included: the engine holds them while their machine may come back (see
/// [`crate::disruption`]). A held unit gets no decision except the removal of an entry the
/// registry itself rules out (unit destroyed or inactive).
pub fn plan_holding(
    snapshot: &Snapshot,
    files: &BTreeMap<UnitHash, UnitFile>,
    held: &BTreeSet<UnitName>,
) -> Plan {
    plan_cluster(snapshot, Cluster::new(snapshot, files, held))
}

/// The plan of a working copy built from `snapshot`.
fn plan_cluster<'s>(snapshot: &'s Snapshot, mut cluster: Cluster<'s>) -> Plan {
    settle(&mut cluster);
    drain::start_moves(&mut cluster);
    for _ in 0..MAX_ROUNDS {
        settle(&mut cluster);
        if !place_unplaced(&mut cluster) {
            break;
        }
    }
    let (mut decisions, previous_copies) = decisions(snapshot, &cluster);
    cluster.unreadable().delete_entries(&mut decisions);
    let waiting = previous_copies.keys().chain(&cluster.in_flight).cloned();
    Plan {
        decisions,
        waiting: waiting.collect(),
        previous_copies,
    }
}

/// Evicts misplaced units and recomputes global units until neither changes anything. It
/// ends: evictions only remove, and the globals are a function of the non-global units.
fn settle(c: &mut Cluster<'_>) {
    loop {
        let evicted = evict_misplaced(c);
        let globals_changed = settle_globals(c);
        if !evicted && !globals_changed {
            return;
        }
    }
}

/// Removes every placed non-global unit whose machine no longer satisfies it.
fn evict_misplaced(c: &mut Cluster<'_>) -> bool {
    let placed: Vec<Slot> = c
        .slots()
        .filter(|(u, _)| c.specs.contains_key(u) && !c.is_global(u))
        .collect();
    let mut evicted = false;
    for (unit, machine) in placed {
        if let Some(reason) = keep_violation(c, &unit, &machine) {
            c.remove(&unit, &machine, reason);
            evicted = true;
        }
    }
    evicted
}

/// Why `unit` may not stay on `machine`. Conflicts count only against units before it in
/// name order (the later one of a pair goes); globals are ignored (they yield instead).
fn keep_violation(c: &Cluster<'_>, unit: &UnitName, machine: &MachineId) -> Option<Reason> {
    let violation = keep_rule(c, unit, machine)?;
    Some(reason_for(machine, violation))
}

/// The first rule `unit` breaks by staying on `machine` (see [`keep_violation`]).
fn keep_rule(c: &Cluster<'_>, unit: &UnitName, machine: &MachineId) -> Option<Violation> {
    c.static_violation(unit, machine).or_else(|| {
        // Only a unit with Conflicts= or Replaces= can make a pair invalid: when `unit` has
        // neither, only such neighbours need looking at (usually none).
        c.neighbours_of(unit, machine)
            .filter(|other| !c.is_global(other))
            .find_map(|other| c.neighbour_violation(unit, other, other < unit))
    })
}

fn reason_for(machine: &MachineId, violation: Violation) -> Reason {
    match violation {
        Violation::ReplacedBy { unit } => Reason::ReplacedBy {
            unit,
            machine: machine.clone(),
        },
        violation @ (Violation::MachineIdMismatch { .. }
        | Violation::MetadataMismatch { .. }
        | Violation::PeerNotHere { .. }
        | Violation::PeerReplaced { .. }
        | Violation::ConflictsWith { .. }
        | Violation::WouldReplace { .. }
        | Violation::Drained) => Reason::ConstraintsViolated {
            machine: machine.clone(),
            violation,
        },
    }
}

fn globals(c: &Cluster<'_>) -> Vec<UnitName> {
    c.specs
        .iter()
        .filter(|(_, s)| s.reqs.global)
        .map(|(n, _)| n.clone())
        .collect()
}

/// Each global unit's verdict on `machine`, deciding in name order.
fn global_verdicts(
    c: &Cluster<'_>,
    globals: &[UnitName],
    machine: &MachineId,
) -> Vec<(UnitName, Option<Violation>)> {
    let mut accepted: Vec<UnitName> = Vec::new();
    let mut verdicts = Vec::with_capacity(globals.len());
    for unit in globals {
        let verdict = c.global_violation(unit, machine, &accepted);
        if verdict.is_none() {
            accepted.push(unit.clone());
        }
        verdicts.push((unit.clone(), verdict));
    }
    verdicts
}

/// Puts every global unit on exactly the machines that accept it.
fn settle_globals(c: &mut Cluster<'_>) -> bool {
    let globals = globals(c);
    let machines: Vec<MachineId> = c.machines.keys().cloned().collect();
    let mut changed = false;
    for machine in &machines {
        for (unit, verdict) in global_verdicts(c, &globals, machine) {
            let here = c.machines_of(&unit).any(|m| m == machine);
            match (verdict, here) {
                (None, false) => c.place(&unit, machine, Reason::Global),
                (Some(violation), true) => c.remove(&unit, machine, reason_for(machine, violation)),
                (None, true) | (Some(_), false) => continue,
            }
            changed = true;
        }
    }
    changed
}

/// Places every unplaced non-global unit that some machine can take, in name order, again
/// and again while that places something (a dependent named before its peer waits a turn).
///
/// A unit whose copy may still run on another machine in its history is not placed: the old
/// copy's stop job (`ExecStopPost=` included) may still be going, and two copies of a
/// non-global unit never run at once. The engine watches unit states and places it once that
/// copy has stopped.
fn place_unplaced(c: &mut Cluster<'_>) -> bool {
    let mut placed_any = false;
    loop {
        let waiting: Vec<UnitName> = c
            .specs
            .iter()
            .filter(|(n, s)| !s.reqs.global && c.machines_of(n).next().is_none())
            .map(|(n, _)| n.clone())
            .collect();
        let mut progress = false;
        for unit in waiting {
            let Ok(machine) = choose(c, &unit) else {
                continue;
            };
            if c.previous_copy(&unit, &machine).is_some() {
                continue;
            }
            let reason = c.placement_reason(&unit, c.specs[&unit].desired);
            c.place(&unit, &machine, reason);
            progress = true;
        }
        if !progress {
            return placed_any;
        }
        placed_any = true;
    }
}

/// The least-loaded machine able to run `unit` (ties by machine ID), or why there is none.
/// The machine a `--reschedule` avoids comes last, whatever its load; the machine a replace
/// in fleet's form keeps comes first while it is live and able.
fn choose(c: &Cluster<'_>, unit: &UnitName) -> Result<MachineId, Reason> {
    if c.machines.is_empty() {
        return Err(Reason::NoMachines);
    }
    if let Some(peer) = c.reqs(unit).machine_of.iter().find(|p| !c.is_placed(p)) {
        return Err(Reason::PeerNotScheduled { peer: peer.clone() });
    }
    if let Some(m) = c.preferred(unit)
        && place_violation(c, unit, m).is_none()
    {
        return Ok(m.clone());
    }
    let avoided = c.avoided(unit);
    if let Some(m) = c.least_loaded(avoided)
        && place_violation(c, unit, m).is_none()
    {
        return Ok(m.clone());
    }
    let mut candidates: Vec<&MachineId> = c.machines.keys().collect();
    candidates.sort_by_cached_key(|m| (Some(*m) == avoided, c.load(m), *m));
    let mut rejections = Vec::new();
    for machine in candidates {
        match place_violation(c, unit, machine) {
            None => return Ok(machine.clone()),
            Some(violation) => rejections.push((machine.clone(), violation)),
        }
    }
    rejections.sort_by(|a, b| a.0.cmp(&b.0));
    Err(Reason::NoMachineAble { rejections })
}

/// Why a new placement of `unit` on `machine` is refused. Replacing a unit there is allowed:
/// the replaced unit is then displaced.
fn place_violation(c: &Cluster<'_>, unit: &UnitName, machine: &MachineId) -> Option<Violation> {
    c.drain_violation(unit, machine)
        .or_else(|| c.static_violation(unit, machine))
        .or_else(|| {
            c.neighbours_of(unit, machine)
                .find_map(|other| c.neighbour_violation(unit, other, true))
        })
        .or_else(|| c.peer_displaced(unit, machine))
}

/// Why a wanted unit ends the plan on no machine, if it does.
fn unschedulable_reason(c: &Cluster<'_>, unit: &UnitName) -> Option<Reason> {
    if c.machines_of(unit).next().is_some() {
        return None;
    }
    if !c.is_global(unit) {
        return match choose(c, unit) {
            Err(reason) => Some(reason),
            Ok(machine) => c
                .previous_copy(unit, &machine)
                .map(|m| Reason::WaitingForPreviousCopy { machine: m.clone() }),
        };
    }
    if c.machines.is_empty() {
        return Some(Reason::NoMachines);
    }
    let globals = globals(c);
    let rejections = c
        .machines
        .keys()
        .filter_map(|m| {
            let verdicts = global_verdicts(c, &globals, m);
            let (_, verdict) = verdicts.into_iter().find(|(g, _)| g == unit)?;
            verdict.map(|v| (m.clone(), v))
        })
        .collect();
    Some(Reason::NoMachineAble { rejections })
}

/// The net difference between the snapshot and the settled working copy, and the units
/// waiting for a previous copy to stop (with the machine of that copy).
fn decisions(
    snapshot: &Snapshot,
    c: &Cluster<'_>,
) -> (Vec<Decision>, BTreeMap<UnitName, MachineId>) {
    // Looked up, not collected: two sets of every slot cloned, on every pass, were most of
    // this function's cost at 100,000 units.
    let before = |(unit, machine): &Slot| scheduled_in(snapshot, unit, machine);
    let after = |(unit, machine): &Slot| c.has(unit, machine);
    let mut out: Vec<Decision> = c
        .moves_started
        .iter()
        .map(|(unit, from)| Decision {
            kind: DecisionKind::Moving {
                unit: unit.clone(),
                from: from.clone(),
            },
            reason: Reason::Drained {
                machine: from.clone(),
            },
        })
        .collect();
    out.extend(removals(snapshot, c));
    // Both orders are (unit, machine): the snapshot's schedule is by unit, each unit's
    // entries by machine.
    out.extend(
        snapshot
            .schedule
            .iter()
            .flat_map(|(u, ms)| ms.keys().map(move |m| (u, m)))
            .filter(|(u, m)| c.has(u, m))
            .filter_map(|(u, m)| update(snapshot, c, &(u.clone(), m.clone()))),
    );
    for ((unit, machine), reason) in &c.added {
        let slot = (unit.clone(), machine.clone());
        let spec = &c.specs[unit];
        if after(&slot) && !before(&slot) {
            let kind = DecisionKind::Schedule {
                unit: unit.clone(),
                machine: machine.clone(),
                hash: spec.hash_on(machine, None),
                desired: spec.desired,
                restart: spec.restart,
                no_restart: spec.replace.no_restart,
                placement: spec.placement(),
            };
            out.push(Decision {
                kind,
                reason: reason.clone(),
            });
        }
    }
    out.extend(history::forgotten(snapshot, c));
    let (reasons, previous_copies) = unschedulable(snapshot, c);
    out.extend(reasons);
    out.extend(c.moves_over.iter().map(|(unit, from)| Decision {
        kind: DecisionKind::MoveOver { unit: unit.clone() },
        reason: Reason::MoveOver {
            machine: from.clone(),
        },
    }));
    (out, previous_copies)
}

fn scheduled_in(snapshot: &Snapshot, unit: &UnitName, machine: &MachineId) -> bool {
    snapshot
        .schedule
        .get(unit)
        .is_some_and(|ms| ms.contains_key(machine))
}

/// The snapshot's entries the plan deletes. One whose machine may still run a copy records
/// that the unit left it, and what the machine had published of the copy
/// ([`Cluster::leaves_copy`]).
fn removals<'a>(snapshot: &'a Snapshot, c: &'a Cluster<'_>) -> impl Iterator<Item = Decision> + 'a {
    c.removed
        .iter()
        .filter(|((unit, machine), _)| {
            scheduled_in(snapshot, unit, machine) && !c.has(unit, machine)
        })
        .map(|((unit, machine), reason)| Decision {
            kind: DecisionKind::Unschedule {
                unit: unit.clone(),
                machine: machine.clone(),
                left: c.leaves_copy(unit, machine),
            },
            reason: reason.clone(),
        })
}

/// An in-place update of an entry that differs from what its unit asks of that machine.
fn update(snapshot: &Snapshot, c: &Cluster<'_>, (unit, machine): &Slot) -> Option<Decision> {
    let spec = c.specs.get(unit)?;
    let entry = snapshot.schedule.get(unit)?.get(machine)?;
    let hash = spec.hash_on(machine, Some(entry.hash));
    let reason = stale_entry_reason(entry, spec, hash)?;
    let kind = DecisionKind::Update {
        unit: unit.clone(),
        machine: machine.clone(),
        hash,
        desired: spec.desired,
        restart: spec.restart,
        no_restart: spec.replace.no_restart,
        placement: spec.placement(),
    };
    Some(Decision { kind, reason })
}

/// Why `entry` must be rewritten to run `hash` as `spec` says; `None` if it need not be.
fn stale_entry_reason(entry: &ScheduleEntry, spec: &Spec, hash: UnitHash) -> Option<Reason> {
    if entry.hash != hash {
        Some(Reason::HashChanged {
            from: entry.hash,
            to: hash,
        })
    } else if entry.desired != spec.desired {
        Some(Reason::DesiredChanged {
            from: entry.desired,
            to: spec.desired,
        })
    } else if entry.restart != spec.restart {
        Some(Reason::RestartRequested {
            generation: spec.restart,
        })
    } else if entry.no_restart != spec.replace.no_restart {
        Some(Reason::NoRestartChanged {
            no_restart: spec.replace.no_restart,
        })
    } else if entry.placement != spec.placement() {
        Some(Reason::RescheduleRequested {
            generation: spec.placement(),
        })
    } else {
        None
    }
}

/// Unscheduled reasons to publish (new or changed) and to clear, and the units waiting for
/// a previous copy to stop (with the machine of that copy).
fn unschedulable(
    snapshot: &Snapshot,
    c: &Cluster<'_>,
) -> (Vec<Decision>, BTreeMap<UnitName, MachineId>) {
    let mut out = Vec::new();
    let mut stuck = BTreeSet::new();
    let mut waiting = BTreeMap::new();
    let invalid = c.invalid.iter().map(|(unit, error)| {
        let error = error.clone();
        (unit, Some(Reason::InvalidRequirements { error }))
    });
    let reasons = c.specs.keys().map(|u| {
        let reason = unschedulable_reason(c, u).or_else(|| drain::stays_reason(c, u));
        (u, reason)
    });
    for (unit, reason) in reasons.chain(invalid) {
        let Some(reason) = reason else {
            continue;
        };
        stuck.insert(unit);
        if let Reason::WaitingForPreviousCopy { machine } = &reason {
            waiting.insert(unit.clone(), machine.clone());
        }
        if snapshot.unscheduled.get(unit) != Some(&reason.to_string()) {
            let kind = DecisionKind::Unschedulable { unit: unit.clone() };
            out.push(Decision { kind, reason });
        }
    }
    for unit in snapshot.unscheduled.keys() {
        if stuck.contains(unit) || c.frozen.contains(unit) {
            continue;
        }
        let reason = if c.specs.contains_key(unit) {
            Reason::NowPlaced
        } else {
            Reason::NoLongerWanted
        };
        let kind = DecisionKind::ClearUnschedulable { unit: unit.clone() };
        out.push(Decision { kind, reason });
    }
    (out, waiting)
}

/// The decision tables' world and the property tests' generators, for the tests of this crate
/// and of fleet-engine's pass planner (feature `testing`, a dev-dependency only).
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(
    not(test),
    allow(
        dead_code,
        unused_imports,
        reason = "only the World and generators are used outside"
    )
)]
pub mod tests;
