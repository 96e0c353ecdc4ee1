//! The placement rules of one unit on one machine, read against the working copy: a drained
//! machine, `MachineID=`, `MachineMetadata=`, `MachineOf=`, `Conflicts=` and `Replaces=`, and
//! the globals' own. Each answers with the first [`Violation`], or none; which rule wins when
//! two units disagree is the planner's business.

use fleet_core::{MachineId, UnitName, units_conflict};

use super::Cluster;
use crate::decision::Violation;

impl<'s> Cluster<'s> {
    /// A drained machine takes no new non-global unit (globals still run everywhere).
    pub fn drain_violation(&self, unit: &UnitName, machine: &MachineId) -> Option<Violation> {
        (!self.is_global(unit) && self.drained.contains_key(machine)).then_some(Violation::Drained)
    }

    /// The rules about the machine itself: `MachineID=`, then `MachineMetadata=` (which a
    /// migrating machine that has not joined passes: see [`Cluster::is_migrating`]).
    pub fn machine_violation(&self, unit: &UnitName, machine: &MachineId) -> Option<Violation> {
        let reqs = self.reqs(unit);
        if !reqs.machine_id_matches(machine) {
            let wanted = reqs.machine_id.clone().unwrap_or_default();
            return Some(Violation::MachineIdMismatch { wanted });
        }
        let metadata = self.machines.get(machine).map(|m| &m.metadata);
        // A machine imported from fleet v1 that has not joined publishes no metadata yet:
        // unknown is no mismatch, and fleet placed the unit there by the same rule. (It is
        // absent, so this only keeps entries, never places a unit.)
        if metadata.is_none() && self.is_migrating(machine) {
            return None;
        }
        reqs.metadata.iter().find_map(|(key, accepted)| {
            let have = metadata.and_then(|md| md.get(key));
            (!have.is_some_and(|v| accepted.contains(v))).then(|| Violation::MetadataMismatch {
                key: key.clone(),
                accepted: accepted.clone(),
            })
        })
    }

    /// `MachineID=`, `MachineMetadata=`, then `MachineOf=` against what is on the machine now
    /// (fleet's order).
    pub fn static_violation(&self, unit: &UnitName, machine: &MachineId) -> Option<Violation> {
        self.machine_violation(unit, machine).or_else(|| {
            if self.reqs(unit).machine_of.is_empty() {
                return None;
            }
            let here: Vec<&UnitName> = self.units_on(machine).collect();
            self.peer_violation(unit, &here)
        })
    }

    /// `MachineOf=`: every peer must be among `here`. Peers are plain names, not globs.
    fn peer_violation(&self, unit: &UnitName, here: &[&UnitName]) -> Option<Violation> {
        self.reqs(unit)
            .machine_of
            .iter()
            .find(|peer| !here.iter().any(|u| u.as_str() == peer.as_str()))
            .map(|peer| Violation::PeerNotHere { peer: peer.clone() })
    }

    /// `MachineOf=` once `unit` is on `machine` and the units it replaces have left it,
    /// taking along (transitively) the units that must share their machine. Without this a
    /// unit that needs, through its peers, the very unit it replaces would displace it and
    /// follow it forever.
    pub fn peer_displaced(&self, unit: &UnitName, machine: &MachineId) -> Option<Violation> {
        let reqs = self.reqs(unit);
        // Only a unit with `Replaces=` displaces anything, and only one with peers can lose
        // them that way.
        if reqs.machine_of.is_empty() || reqs.replaces.is_empty() {
            return None;
        }
        let here: Vec<&UnitName> = self.units_on(machine).collect();
        let mut leaving: Vec<&UnitName> = here
            .iter()
            .copied()
            .filter(|o| {
                matches!(
                    self.neighbour_violation(o, unit, false),
                    Some(Violation::ReplacedBy { .. })
                )
            })
            .collect();
        while !leaving.is_empty() {
            let follows = |o: &&UnitName| {
                !leaving.contains(o)
                    && self
                        .reqs(o)
                        .machine_of
                        .iter()
                        .any(|p| leaving.iter().any(|l| l.as_str() == p))
            };
            let more: Vec<&UnitName> = here.iter().copied().filter(follows).collect();
            if more.is_empty() {
                break;
            }
            leaving.extend(more);
        }
        reqs.machine_of
            .iter()
            .find(|peer| leaving.iter().any(|l| l.as_str() == peer.as_str()))
            .map(|peer| Violation::PeerReplaced { peer: peer.clone() })
    }

    /// Whether global `unit` may run on `machine`, given the globals `accepted` there before it
    /// (name order, so of two conflicting globals the first in name order wins). Non-global
    /// units on the machine always win: a global never displaces one.
    pub fn global_violation(
        &self,
        unit: &UnitName,
        machine: &MachineId,
        accepted: &[UnitName],
    ) -> Option<Violation> {
        if let Some(v) = self.machine_violation(unit, machine) {
            return Some(v);
        }
        let pinned: Vec<&UnitName> = self
            .units_on(machine)
            .filter(|u| !self.is_global(u))
            .collect();
        let here: Vec<&UnitName> = pinned.iter().copied().chain(accepted).collect();
        if let Some(v) = self.peer_violation(unit, &here) {
            return Some(v);
        }
        let reqs = self.reqs(unit);
        let against_pinned = pinned.iter().find_map(|other| {
            self.neighbour_violation(unit, other, true).or_else(|| {
                (reqs.replaces_name(other) && !self.reqs(other).replaces_name(unit)).then(|| {
                    Violation::WouldReplace {
                        unit: (*other).clone(),
                    }
                })
            })
        });
        against_pinned.or_else(|| {
            accepted
                .iter()
                .find_map(|other| self.neighbour_violation(unit, other, true))
        })
    }

    /// Whether `unit` can share a machine with `other`: `Conflicts=` either way, or `other`
    /// replacing `unit` (one way only: fleet ignores units that replace each other).
    pub fn neighbour_violation(
        &self,
        unit: &UnitName,
        other: &UnitName,
        check_conflicts: bool,
    ) -> Option<Violation> {
        let (reqs, other_reqs) = (self.reqs(unit), self.reqs(other));
        if check_conflicts && units_conflict((unit, reqs), (other, other_reqs)) {
            return Some(Violation::ConflictsWith {
                unit: other.clone(),
            });
        }
        (unit != other && other_reqs.replaces_name(unit) && !reqs.replaces_name(other)).then(|| {
            Violation::ReplacedBy {
                unit: other.clone(),
            }
        })
    }
}
