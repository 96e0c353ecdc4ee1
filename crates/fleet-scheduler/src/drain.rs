//! Draining: a drained machine takes no new non-global unit (see
//! [`Cluster::drain_violation`]), and its non-global units leave it a few at a time. A move
//! is only an eviction: the unit is then placed like any unplaced unit, on another machine
//! able to run it and only once its copy on the drained machine has stopped (the rule that
//! never lets two copies run), and it may not come back while the machine is drained.
//!
//! At most `parallel` moves of one drain are on their way at once: a move is on its way from
//! the plan that evicts the unit until the unit is active (loaded, if it is only to be
//! loaded) on another machine. The registry records each move (`P/moving/<unit>`), so a new
//! leader counts the moves its predecessor started. A unit no other machine can take
//! (`MachineID=` pinned, metadata, a peer that stays) stays where it is, with a reason that
//! names the drain. Global units stay. Undraining moves nothing back.

use fleet_core::{MachineId, UnitName};
use std::collections::BTreeMap;

use super::cluster::Cluster;
use super::decision::{Reason, Violation};
use super::place_violation;

/// Finds the recorded moves that are over, counts those on their way, and evicts from each
/// drained machine, in name order, as many movable units as its `parallel` still allows. A
/// recorded move whose unit is still on the drained machine (its eviction was not written)
/// is made again without counting twice.
pub(super) fn start_moves(c: &mut Cluster<'_>) {
    let mut on_way: BTreeMap<MachineId, u32> = BTreeMap::new();
    let mut again: Vec<(UnitName, MachineId)> = Vec::new();
    for (unit, record) in c.moving {
        let from = &record.from;
        let wanted = c.specs.get(unit).is_some_and(|s| !s.reqs.global);
        let over = !c.drained.contains_key(from)
            || (!wanted && !c.frozen.contains(unit))
            || c.arrived_elsewhere(unit, from);
        if over {
            c.moves_over.insert(unit.clone(), from.clone());
            continue;
        }
        *on_way.entry(from.clone()).or_default() += 1;
        c.in_flight.insert(unit.clone());
        if wanted && c.machines_of(unit).any(|m| m == from) {
            again.push((unit.clone(), from.clone()));
        }
    }
    for (unit, from) in again {
        c.remove(
            &unit,
            &from,
            Reason::Drained {
                machine: from.clone(),
            },
        );
    }
    let drained: Vec<(MachineId, u32)> = c
        .drained
        .iter()
        .filter(|(m, _)| c.machines.contains_key(*m))
        .map(|(m, p)| (m.clone(), *p))
        .collect();
    for (machine, parallel) in drained {
        let mut budget = parallel.saturating_sub(on_way.get(&machine).copied().unwrap_or(0));
        let candidates: Vec<UnitName> = c
            .units_on(&machine)
            .filter(|u| c.specs.contains_key(*u) && !c.is_global(u))
            .cloned()
            .collect();
        for unit in candidates {
            if budget == 0 {
                break;
            }
            if stuck(c, &unit, &machine).is_some() {
                continue;
            }
            c.remove(
                &unit,
                &machine,
                Reason::Drained {
                    machine: machine.clone(),
                },
            );
            c.moves_started.insert(unit.clone(), machine.clone());
            c.in_flight.insert(unit);
            budget -= 1;
        }
    }
}

/// Why `unit` cannot leave drained `machine`: every other machine fails one of its rules
/// (the scheduler's own placement test, [`place_violation`]). `None`: some machine can take it.
pub(super) fn stuck(c: &Cluster<'_>, unit: &UnitName, machine: &MachineId) -> Option<Reason> {
    let mut rejections: Vec<(MachineId, Violation)> = Vec::new();
    for other in c.machines.keys().filter(|m| *m != machine) {
        match place_violation(c, unit, other) {
            None => return None,
            Some(violation) => rejections.push((other.clone(), violation)),
        }
    }
    Some(Reason::CannotLeaveDrained {
        machine: machine.clone(),
        rejections,
    })
}

/// The reason a placed unit stays on a drained machine, if it is on one and cannot leave.
pub(super) fn stays_reason(c: &Cluster<'_>, unit: &UnitName) -> Option<Reason> {
    if c.is_global(unit) {
        return None;
    }
    let machine = c.machines_of(unit).find(|m| c.drained.contains_key(*m))?;
    stuck(c, unit, machine)
}
