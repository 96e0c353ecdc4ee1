//! The values stored under the keys of [`crate::keys`], as JSON.

use fleet_core::{DesiredState, MachineId, SystemdState, UnitHash, UnitName};
use serde::{Deserialize, Serialize};
use std::fmt;

use crate::kv::Revision;

/// A unit known to the cluster: which file (by hash) and what the user wants of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitRecord {
    pub name: UnitName,
    pub hash: UnitHash,
    pub desired: DesiredState,
    /// Restart generation: `fleetctl restart` bumps it, and every machine running the unit
    /// restarts it once for each new value.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restart: u64,
    /// How the current version replaces the previous one (`--replace` options).
    #[serde(default, skip_serializing_if = "ReplaceState::is_default")]
    pub replace: ReplaceState,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The options of the last replace of a unit, read by the engine and copied to the agents.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplaceState {
    /// `--no-restart`: machines running the unit put the new file in place and reload
    /// systemd, but leave the running process alone until its next restart.
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_restart: bool,
    /// Placement generation: `--reschedule` bumps it, and the engine places the unit afresh.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub placement: u64,
    /// With a new placement generation: the machine to avoid if another one can run it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avoid: Option<MachineId>,
    /// The machine the unit's next placement takes while it is live and able to run it:
    /// where it ran when a replace in fleet's form (which leaves it `inactive`) came, so
    /// that the launch that follows brings it back there, as the client expects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer: Option<MachineId>,
    /// A rolling replace in progress: machines not in `updated` keep `previous`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
}

impl ReplaceState {
    pub fn is_default(&self) -> bool {
        *self == ReplaceState::default()
    }
}

/// A rolling replace: the machines already given the new version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollout {
    /// The version machines not yet updated keep running.
    pub previous: UnitHash,
    #[serde(default)]
    pub updated: std::collections::BTreeSet<MachineId>,
}

/// A [`UnitRecord`] as read, with the revision a compare-and-swap must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    pub record: UnitRecord,
    pub mod_revision: Revision,
}

impl Unit {
    pub fn name(&self) -> &UnitName {
        &self.record.name
    }
    pub fn hash(&self) -> UnitHash {
        self.record.hash
    }
    pub fn desired(&self) -> DesiredState {
        self.record.desired
    }
}

/// What a machine must run: written by the engine (or by tests) under the machine's own
/// prefix, so an agent watches only its own work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleEntry {
    pub name: UnitName,
    pub machine: MachineId,
    pub hash: UnitHash,
    /// `Loaded` or `Launched`; an `Inactive` unit has no entry.
    pub desired: DesiredState,
    /// The unit's restart generation, copied by the engine.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restart: u64,
    /// A new hash replaces the file and reloads systemd without restarting the unit.
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_restart: bool,
    /// The unit's placement generation when it was placed here.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub placement: u64,
}

/// What an agent publishes about a unit it runs; lives as long as the machine's lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitStateRecord {
    pub name: UnitName,
    pub machine: MachineId,
    /// Hash of the unit file the agent has in place (None: no readable file).
    pub hash: Option<UnitHash>,
    pub systemd: SystemdState,
    /// Drop-in files systemd applies on top of fleet's file (reported, never removed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop_ins: Vec<String>,
    /// The restart generation this machine has carried out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restart: u64,
    /// The running process started from an older file than the one in place.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restart_pending: bool,
    /// How many times the unit was restarted after failing on this machine since its agent
    /// started it here: systemd's own `Restart=` restarts (`NRestarts`) and the agent's
    /// revivals of the failed unit.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u64,
    /// When the unit entered its current ActiveState (systemd's `StateChangeTimestamp`), in
    /// microseconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// How its main process last ended, with systemd's `Result` when that says more:
    /// `exit status 3`, `killed by signal 9`, `killed by signal 15, result timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<String>,
}

/// A migration mark (`fleetctl import-fleet`): `machine` ran units under fleet v1 that were
/// imported with their placement, and its fleetd of ours has not taken them over yet. No
/// lease: it outlives everything until the machine's agent has adopted its units and deletes
/// it, or an operator deletes it for a host that will never come.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationRecord {
    pub machine: MachineId,
    /// When the import wrote it, in seconds since the UNIX epoch (shown only).
    pub since: u64,
    /// How many of the machine's units the import placed there (shown only).
    pub units: u64,
}

/// A drain mark (`fleetctl drain`): the machine takes no new non-global unit, and the engine
/// moves its non-global units off it, `parallel` at a time. Written by operators through the
/// units role, with no lease: it outlives fleetd restarts and leader changes, and a machine
/// not registered (yet) may be drained.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRecord {
    pub machine: MachineId,
    /// How many moved units may be on their way (not yet active on their new machine) at once;
    /// at least 1.
    pub parallel: u32,
    /// When the drain was first asked for, in seconds since the UNIX epoch (shown only).
    pub since: u64,
}

/// What the machine a unit left had published of the unit's copy there when the engine
/// deleted its entry: the value of `P/left/<name>/<machine>`, which says when the engine may
/// believe that copy stopped (issue 36). A published state can lag what the machine runs: its
/// agent publishes at the end of a pass, after the starts it made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeftCopy {
    /// A state whose copy may be running: the copy has stopped once the machine publishes no
    /// such state. The empty value, as every record was before the other kinds.
    Running,
    /// A state of a stopped copy (`inactive`, `failed`), which may predate a start: the copy
    /// has stopped once the machine withdraws the state (its agent unloaded the unit, which it
    /// does only once stopped).
    Stopped,
    /// No state: its agent may have started a copy and not published it yet. The copy has
    /// stopped once the machine publishes a stopped one; a copy it publishes running makes
    /// the record [`Running`](Self::Running).
    Unpublished,
}

impl LeftCopy {
    /// The stored value: empty, `stopped` or `unpublished`.
    pub fn value(self) -> &'static [u8] {
        match self {
            LeftCopy::Running => b"",
            LeftCopy::Stopped => b"stopped",
            LeftCopy::Unpublished => b"unpublished",
        }
    }

    /// The kind a stored value names; `None` for a value this version does not write.
    pub fn from_value(value: &[u8]) -> Option<LeftCopy> {
        [LeftCopy::Running, LeftCopy::Stopped, LeftCopy::Unpublished]
            .into_iter()
            .find(|kind| kind.value() == value)
    }

    /// `running`, `stopped` or `unpublished`: the kind in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            LeftCopy::Running => "running",
            LeftCopy::Stopped => "stopped",
            LeftCopy::Unpublished => "unpublished",
        }
    }
}

impl fmt::Display for LeftCopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A unit the engine took off drained machine `from`: it counts against that drain's
/// `parallel` until it is active on another machine. Written by the engine's leadership in
/// the transaction that unschedules the unit there, so a new leader knows the moves on their
/// way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRecord {
    pub unit: UnitName,
    pub from: MachineId,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records written before the kinds existed (always of a running copy) are empty.
    #[test]
    fn a_left_copy_reads_back_from_its_value_and_an_empty_one_is_running() {
        for kind in [LeftCopy::Running, LeftCopy::Stopped, LeftCopy::Unpublished] {
            assert_eq!(LeftCopy::from_value(kind.value()), Some(kind));
        }
        assert_eq!(LeftCopy::from_value(b""), Some(LeftCopy::Running));
        assert_eq!(LeftCopy::from_value(b"running"), None);
    }
}
