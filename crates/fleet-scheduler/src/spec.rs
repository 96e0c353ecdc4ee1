//! What the plan needs of one wanted unit (from its record and file), and which version of
//! it each machine must run under its replace options. Nothing here looks at the cluster.

use fleet_core::{DesiredState, MachineId, Requirements, UnitHash};
use fleet_registry::ReplaceState;

/// What the plan needs of a wanted unit (desired `loaded` or `launched`, file known).
#[derive(Debug)]
pub(super) struct Spec {
    pub hash: UnitHash,
    pub desired: DesiredState,
    pub restart: u64,
    /// How the current version replaces the previous one: copied to entries (no restart,
    /// placement generation) or read here (machine to avoid, rolling replace).
    pub replace: ReplaceState,
    pub reqs: Requirements,
}

impl Spec {
    /// The version `machine` must run, given the one its entry names now (`None`: no entry).
    /// A rolling replace gives the new version only to machines it has reached and to
    /// machines that have none yet; the others keep (or go back to) the previous one, and
    /// an entry already on the new version never goes back.
    pub fn hash_on(&self, machine: &MachineId, current: Option<UnitHash>) -> UnitHash {
        match (&self.replace.rollout, current) {
            (Some(rollout), Some(current))
                if current != self.hash && !rollout.updated.contains(machine) =>
            {
                rollout.previous
            }
            (Some(_) | None, Some(_) | None) => self.hash,
        }
    }

    /// The placement generation: an entry placed under an older one is placed afresh.
    pub fn placement(&self) -> u64 {
        self.replace.placement
    }
}
