//! What the scheduler tells the engine to write, and why. Every decision carries a typed
//! [`Reason`]; its `Display` is what the engine logs and what `P/unscheduled/<name>` shows.
//! The texts a user reads (the unscheduled reasons, which fleetctl prints while it waits and
//! the API serves) group the machines that fail a unit alike and name a machine by its short
//! ID, so that they stay one readable line at 50 machines.

use fleet_core::{DesiredState, MachineId, RequirementError, UnitHash, UnitName};
use fleet_registry::{LeftCopy, ScheduleEntry};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// One change to the registry, with the reason for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub kind: DecisionKind,
    pub reason: Reason,
}

/// The changes the engine may make. Declaration order is the order a plan lists them in and
/// the engine writes them in: removals first, so that even a batch split over several
/// transactions never has a unit on two machines at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecisionKind {
    /// Record at `P/moving/<unit>` that the unit leaves drained machine `from`: written
    /// before its entry there is deleted, so a move is never on its way unrecorded (a
    /// recorded move whose unit is still there is simply made again).
    Moving { unit: UnitName, from: MachineId },
    /// Delete the unit's entry on `machine`. With `left`, the machine may still run a copy:
    /// record at `P/left/<unit>/<machine>`, in the same transaction, that the unit left it
    /// and what the machine had published of the copy, so that the copy holds the unit's
    /// next placement back until it has stopped, under this leader or the next (see
    /// `history.rs`).
    Unschedule {
        unit: UnitName,
        machine: MachineId,
        left: Option<LeftCopy>,
    },
    /// Rewrite the unit's entry on `machine` (same machine; a new hash, desired state,
    /// restart generation or replace option).
    Update {
        unit: UnitName,
        machine: MachineId,
        hash: UnitHash,
        desired: DesiredState,
        restart: u64,
        no_restart: bool,
        placement: u64,
    },
    /// Write a new entry: `machine` must run the unit.
    Schedule {
        unit: UnitName,
        machine: MachineId,
        hash: UnitHash,
        desired: DesiredState,
        restart: u64,
        no_restart: bool,
        placement: u64,
    },
    /// Withdraw the record that the unit left `machine`: that machine holds it back no more.
    Forget { unit: UnitName, machine: MachineId },
    /// Rewrite the record that the unit left `machine`: the copy unpublished when the unit
    /// left is published now, so it has stopped once no longer published running.
    Record {
        unit: UnitName,
        machine: MachineId,
        copy: LeftCopy,
    },
    /// The unit cannot be placed; publish the reason at `P/unscheduled/<unit>`.
    Unschedulable { unit: UnitName },
    /// Remove a previously published reason: the unit is placed or no longer wanted.
    ClearUnschedulable { unit: UnitName },
    /// Withdraw the record of a move off a drained machine: it is over.
    MoveOver { unit: UnitName },
}

impl DecisionKind {
    pub fn unit(&self) -> &UnitName {
        match self {
            Self::Unschedule { unit, .. }
            | Self::Update { unit, .. }
            | Self::Schedule { unit, .. }
            | Self::Forget { unit, .. }
            | Self::Record { unit, .. }
            | Self::Unschedulable { unit }
            | Self::ClearUnschedulable { unit }
            | Self::Moving { unit, .. }
            | Self::MoveOver { unit } => unit,
        }
    }

    /// The machine whose schedule changes; `None` for the unscheduled-reason and move records.
    pub fn machine(&self) -> Option<&MachineId> {
        match self {
            Self::Unschedule { machine, .. }
            | Self::Update { machine, .. }
            | Self::Schedule { machine, .. } => Some(machine),
            Self::Forget { .. }
            | Self::Record { .. }
            | Self::Unschedulable { .. }
            | Self::ClearUnschedulable { .. }
            | Self::Moving { .. }
            | Self::MoveOver { .. } => None,
        }
    }

    /// The schedule entry an [`Update`](Self::Update) or a [`Schedule`](Self::Schedule)
    /// writes; `None` for the other kinds.
    pub fn schedule_entry(&self) -> Option<ScheduleEntry> {
        match self {
            Self::Update {
                unit,
                machine,
                hash,
                desired,
                restart,
                no_restart,
                placement,
            }
            | Self::Schedule {
                unit,
                machine,
                hash,
                desired,
                restart,
                no_restart,
                placement,
            } => Some(ScheduleEntry {
                name: unit.clone(),
                machine: machine.clone(),
                hash: *hash,
                desired: *desired,
                restart: *restart,
                no_restart: *no_restart,
                placement: *placement,
            }),
            Self::Unschedule { .. }
            | Self::Forget { .. }
            | Self::Record { .. }
            | Self::Unschedulable { .. }
            | Self::ClearUnschedulable { .. }
            | Self::Moving { .. }
            | Self::MoveOver { .. } => None,
        }
    }
}

/// Why a machine cannot run a unit: one `[X-Fleet]` rule it fails. Serialized (for
/// [`explain`](crate::explain)) as `{"rule": "<kebab-case variant>", <fields>}`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "kebab-case")]
pub enum Violation {
    /// `MachineID=` names another machine.
    MachineIdMismatch { wanted: String },
    /// `MachineMetadata=`: the machine lacks `key` or has none of its `accepted` values.
    MetadataMismatch {
        key: String,
        /// The values of `key` the unit accepts (any one will do).
        #[serde(default)]
        accepted: Vec<String>,
    },
    /// `MachineOf=`: the peer is not on this machine.
    PeerNotHere { peer: String },
    /// `MachineOf=`: the peer would leave this machine with a unit this one replaces.
    PeerReplaced { peer: String },
    /// `Conflicts=` (either unit's globs) with a unit on this machine.
    ConflictsWith { unit: UnitName },
    /// A unit on this machine `Replaces=` this one.
    ReplacedBy { unit: UnitName },
    /// A global unit would displace a unit on this machine; globals never displace.
    WouldReplace { unit: UnitName },
    /// The machine is drained: it takes no new non-global unit.
    Drained,
}

/// `key=a or key=b`, as a unit's `MachineMetadata=` lines accept them (`key` alone if none).
struct Wanted<'a> {
    key: &'a str,
    accepted: &'a [String],
}

impl fmt::Display for Wanted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.accepted.is_empty() {
            return f.write_str(self.key);
        }
        for (i, value) in self.accepted.iter().enumerate() {
            let sep = if i == 0 { "" } else { " or " };
            write!(f, "{sep}{}={value}", self.key)?;
        }
        Ok(())
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MachineIdMismatch { wanted } => {
                write!(f, "machine ID does not match required {wanted:?}")
            }
            Self::MetadataMismatch { key, accepted } => {
                write!(f, "machine metadata lacks {}", Wanted { key, accepted })
            }
            Self::PeerNotHere { peer } => {
                write!(f, "required peer unit {peer} is not scheduled here")
            }
            Self::PeerReplaced { peer } => write!(
                f,
                "required peer unit {peer} would leave with a unit it replaces here"
            ),
            Self::ConflictsWith { unit } => write!(f, "conflicts with unit {unit} scheduled here"),
            Self::ReplacedBy { unit } => write!(f, "unit {unit} scheduled here replaces it"),
            Self::WouldReplace { unit } => {
                write!(f, "global unit would replace unit {unit} scheduled here")
            }
            Self::Drained => f.write_str("machine is drained"),
        }
    }
}

/// Why a decision was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Wanted `loaded` or `launched` and on no machine (fleet's wording).
    NotScheduled { desired: DesiredState },
    /// A global unit and this machine qualifies.
    Global,
    /// The machine it was on went away (its presence record vanished).
    MachineGone { machine: MachineId },
    /// Its desired state is `inactive`.
    TargetInactive,
    /// The unit no longer exists.
    UnitDestroyed,
    /// A non-global unit had entries on several machines; the one on `kept` stays.
    Duplicate { kept: MachineId },
    /// Its machine can no longer run it.
    ConstraintsViolated {
        machine: MachineId,
        violation: Violation,
    },
    /// A unit that `Replaces=` it took its machine.
    ReplacedBy { unit: UnitName, machine: MachineId },
    /// Its unit file changed; the entry is updated where it is.
    HashChanged { from: UnitHash, to: UnitHash },
    /// `fleetctl restart` asked for another restart.
    RestartRequested { generation: u64 },
    /// A replace with `--reschedule` asked for a fresh placement (placement generation).
    RescheduleRequested { generation: u64 },
    /// The replace option "no restart" changed; the entry is updated where it is.
    NoRestartChanged { no_restart: bool },
    /// Its desired state changed; the entry is updated where it is.
    DesiredChanged {
        from: DesiredState,
        to: DesiredState,
    },
    /// Its `[X-Fleet]` options are a combination fleet refuses; it is never placed.
    InvalidRequirements { error: RequirementError },
    /// There is no live machine at all.
    NoMachines,
    /// A machine could take it, but `machine`, where the unit is scheduled or which it left
    /// lately, is there and still publishes a running (starting, stopping) copy of it: two
    /// copies of a non-global unit never run at once.
    WaitingForPreviousCopy { machine: MachineId },
    /// The copy the unit left on `machine` has stopped: the machine publishes it stopped, or
    /// withdrew the state it had published (see `fleet_registry::LeftCopy`).
    CopyStopped { machine: MachineId },
    /// `machine` publishes the copy it had not published when the unit left it.
    CopyPublished { machine: MachineId },
    /// The unit is scheduled on `machine` again: its entry there speaks for its copy.
    ScheduledAgain { machine: MachineId },
    /// `MachineOf=` names a unit that is not scheduled anywhere.
    PeerNotScheduled { peer: String },
    /// Every live machine fails one of its rules (sorted by machine).
    NoMachineAble {
        rejections: Vec<(MachineId, Violation)>,
    },
    /// A unit that could not be placed now is.
    NowPlaced,
    /// A unit that could not be placed is now inactive or destroyed.
    NoLongerWanted,
    /// The schedule entry at `key` cannot be read: its agent runs nothing for it, and the
    /// unit is placed as if it had none.
    Unreadable { key: String },
    /// `machine` is drained: the unit leaves it (and is placed elsewhere once stopped there).
    Drained { machine: MachineId },
    /// The unit stays on drained `machine`: every other machine fails one of its rules
    /// (sorted by machine; empty when there is no other machine).
    CannotLeaveDrained {
        machine: MachineId,
        rejections: Vec<(MachineId, Violation)>,
    },
    /// The unit that left drained `machine` runs elsewhere now, or the move no longer
    /// matters (undrained, unit gone).
    MoveOver { machine: MachineId },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotScheduled { desired } => {
                write!(f, "target state {desired} and unit not scheduled")
            }
            Self::Global => f.write_str("global unit and the machine qualifies"),
            Self::MachineGone { machine } => write!(f, "target machine {machine} went away"),
            Self::TargetInactive => f.write_str("target state inactive"),
            Self::UnitDestroyed => f.write_str("unit destroyed"),
            Self::Duplicate { kept } => write!(f, "unit is already scheduled on {kept}"),
            Self::ConstraintsViolated { machine, violation } => {
                write!(
                    f,
                    "target machine {machine} unable to run unit: {violation}"
                )
            }
            Self::ReplacedBy { unit, machine } => {
                write!(f, "replaced by unit {unit} on machine {machine}")
            }
            Self::RestartRequested { generation } => {
                write!(f, "restart {generation} requested")
            }
            Self::RescheduleRequested { generation } => {
                write!(f, "reschedule {generation} requested")
            }
            Self::NoRestartChanged { no_restart } => {
                write!(f, "no-restart changed to {no_restart}")
            }
            Self::HashChanged { from, to } => write!(
                f,
                "unit file changed from {} to {}",
                from.short(),
                to.short()
            ),
            Self::DesiredChanged { from, to } => {
                write!(f, "target state changed from {from} to {to}")
            }
            Self::InvalidRequirements { error } => write!(f, "invalid [X-Fleet] options: {error}"),
            Self::NoMachines => f.write_str("zero machines available"),
            Self::WaitingForPreviousCopy { machine } => {
                let machine = machine.short();
                write!(f, "waiting for the previous copy on {machine} to stop")
            }
            Self::CopyStopped { machine } => write!(f, "the copy on {machine} has stopped"),
            Self::CopyPublished { machine } => write!(f, "the copy on {machine} is published"),
            Self::ScheduledAgain { machine } => write!(f, "scheduled on {machine} again"),
            Self::PeerNotScheduled { peer } => {
                write!(f, "required peer unit {peer} is not scheduled")
            }
            Self::NoMachineAble { rejections } => write_rejections(f, rejections),
            Self::NowPlaced => f.write_str("unit is scheduled now"),
            Self::NoLongerWanted => f.write_str("unit is inactive or destroyed"),
            Self::Unreadable { key } => write!(f, "registry value at {key} cannot be read"),
            Self::Drained { machine } => write!(f, "machine {machine} is drained"),
            Self::CannotLeaveDrained {
                machine,
                rejections,
            } if rejections.is_empty() => {
                let machine = machine.short();
                write!(f, "stays on drained machine {machine}: no other machine")
            }
            Self::CannotLeaveDrained {
                machine,
                rejections,
            } => {
                write!(f, "stays on drained machine {}: ", machine.short())?;
                write_rejections(f, rejections)
            }
            Self::MoveOver { machine } => {
                write!(f, "move off drained machine {machine} is over")
            }
        }
    }
}

/// Rejections grouped by violation: machines that fail a unit for the same reason are
/// counted together. Largest group first; among equals, the group of the first machine in ID
/// order first.
fn group_rejections(rejections: &[(MachineId, Violation)]) -> Vec<(&Violation, Vec<&MachineId>)> {
    // By violation (a map: thousands of machines may each fail differently), with the
    // position of the group's first machine.
    let mut by_violation: BTreeMap<&Violation, (usize, Vec<&MachineId>)> = BTreeMap::new();
    for (i, (machine, violation)) in rejections.iter().enumerate() {
        by_violation
            .entry(violation)
            .or_insert_with(|| (i, Vec::new()))
            .1
            .push(machine);
    }
    let mut groups: Vec<(usize, &Violation, Vec<&MachineId>)> = by_violation
        .into_iter()
        .map(|(violation, (first, machines))| (first, violation, machines))
        .collect();
    groups.sort_by_key(|(first, _, machines)| (std::cmp::Reverse(machines.len()), *first));
    groups
        .into_iter()
        .map(|(_, v, machines)| (v, machines))
        .collect()
}

/// `no machine able to run unit: 3 machines lack tier=api; 1 machine (4f1e2a10) runs a
/// conflicting web@1.service`: one clause per group of machines failing the same rule, at most
/// [`GROUPS_SHOWN`]. A small group's machines are named (short IDs, as list-machines shows
/// them) when the groups differ, so that the reader can tell which machine is which; the
/// per-machine detail is `fleetctl explain`'s.
fn write_rejections(
    f: &mut fmt::Formatter<'_>,
    rejections: &[(MachineId, Violation)],
) -> fmt::Result {
    f.write_str("no machine able to run unit")?;
    let groups = group_rejections(rejections);
    let named = groups.len() > 1;
    for (i, (violation, machines)) in groups.iter().take(GROUPS_SHOWN).enumerate() {
        let sep = if i == 0 { ": " } else { "; " };
        f.write_str(sep)?;
        let names = (named && machines.len() <= NAMED_UP_TO).then_some(machines.as_slice());
        write_group(f, violation, machines.len(), names)?;
    }
    let rest: usize = groups.iter().skip(GROUPS_SHOWN).map(|(_, m)| m.len()).sum();
    if rest > 0 {
        let machines = if rest == 1 { "machine" } else { "machines" };
        write!(f, "; {rest} more {machines} for other reasons")?;
    }
    Ok(())
}

/// How many groups of a [`Reason::NoMachineAble`] are said before summarising the rest.
const GROUPS_SHOWN: usize = 4;

/// A group of at most this many machines is named.
const NAMED_UP_TO: usize = 3;

/// One group: `3 machines lack tier=api`, `1 machine (4f1e2a10) is drained`.
fn write_group(
    f: &mut fmt::Formatter<'_>,
    violation: &Violation,
    n: usize,
    names: Option<&[&MachineId]>,
) -> fmt::Result {
    let one = n == 1;
    // The verb agrees with the count: (singular, plural).
    let verb = |singular: &'static str, plural: &'static str| if one { singular } else { plural };
    write!(f, "{n} {}", verb("machine", "machines"))?;
    if let Some(names) = names {
        let short: Vec<&str> = names.iter().map(|m| m.short()).collect();
        write!(f, " ({})", short.join(", "))?;
    }
    match violation {
        Violation::MachineIdMismatch { wanted } => {
            write!(f, " {} not MachineID={wanted}", verb("is", "are"))
        }
        Violation::MetadataMismatch { key, accepted } => {
            write!(f, " {} {}", verb("lacks", "lack"), Wanted { key, accepted })
        }
        Violation::PeerNotHere { peer } => {
            write!(f, " {} not run its peer {peer}", verb("does", "do"))
        }
        Violation::PeerReplaced { peer } => write!(
            f,
            " would lose its peer {peer} along with a unit it replaces"
        ),
        Violation::ConflictsWith { unit } => {
            write!(f, " {} a conflicting {unit}", verb("runs", "run"))
        }
        Violation::ReplacedBy { unit } => {
            write!(f, " {} {unit}, which replaces it", verb("runs", "run"))
        }
        Violation::WouldReplace { unit } => write!(
            f,
            " {} {unit}, which a global unit never displaces",
            verb("runs", "run")
        ),
        Violation::Drained => write!(f, " {} drained", verb("is", "are")),
    }
}
