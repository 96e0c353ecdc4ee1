//! The etcd key schema (documented in docs/registry.md). Every key the project writes is built
//! here by [`Keys`], and every key read back is parsed here by [`Key::parse`], so the schema
//! lives in one place.
//!
//! `P` is the prefix (default `/_coreos.com/fleet/`):
//!
//! | key                               | value                         | lease      |
//! |-----------------------------------|-------------------------------|------------|
//! | `P/unit/<name>`                   | [`UnitRecord`] JSON           | none       |
//! | `P/file/<hash>`                   | canonical unit text           | none       |
//! | `P/file-ref/<hash>/<name>`        | empty (GC reference index)    | none       |
//! | `P/schedule/<machine>/<name>`     | [`ScheduleEntry`] JSON        | none       |
//! | `P/machine/<machine>`             | `MachineInfo` JSON            | machine's  |
//! | `P/unit-state/<machine>/<name>`   | [`UnitStateRecord`] JSON      | machine's  |
//! | `P/engine/leader`                 | leader's machine ID           | leader's   |
//! | `P/engine/disruption`             | why rescheduling is held      | none       |
//! | `P/unscheduled/<name>`            | why the engine cannot place it| none       |
//! | `P/metadata/<machine>/<key>`      | dynamic metadata value        | none       |
//! | `P/drain/<machine>`               | [`DrainRecord`] JSON          | none       |
//! | `P/moving/<name>`                 | [`MoveRecord`] JSON           | none       |
//! | `P/placement/<name>/<machine>`    | empty (the schedule by unit)  | none       |
//! | `P/left/<name>/<machine>`         | [`LeftCopy`] (history)        | none       |
//! | `P/migrating/<machine>`           | [`MigrationRecord`] JSON      | none       |
//! | `P/event/<source>/<subject>/<stamp>` | [`Event`] JSON (issue 41)  | the writer's, for the retention |
//!
//! [`UnitRecord`]: crate::UnitRecord
//! [`ScheduleEntry`]: crate::ScheduleEntry
//! [`UnitStateRecord`]: crate::UnitStateRecord
//! [`DrainRecord`]: crate::DrainRecord
//! [`MoveRecord`]: crate::MoveRecord
//! [`LeftCopy`]: crate::LeftCopy
//! [`MigrationRecord`]: crate::MigrationRecord
//! [`Event`]: crate::Event
//!
//! An event's `<source>` is `user`, `engine` or `machine/<M>` (the prefix each etcd role may
//! write), its `<subject>` `unit/<name>`, `machine/<M>` or `cluster`, its `<stamp>` the time
//! and a nonce ([`EventStamp`]), so one writer's events of one subject are one prefix in
//! time order.

use fleet_core::{MachineId, UnitHash, UnitName};

use crate::metadata::MetadataKey;

mod event;
pub use event::{EventSource, EventStamp, EventSubject};

/// What a key of the schema names, read from the key alone (its value may not parse):
/// [`Key::parse`] is the inverse of the builders of [`Keys`] ([`Key::build`] calls them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    Unit(UnitName),
    File(UnitHash),
    FileRef {
        hash: UnitHash,
        unit: UnitName,
    },
    Schedule {
        machine: MachineId,
        unit: UnitName,
    },
    Machine(MachineId),
    /// Machine first, so that one machine's states are one prefix (one etcd permission).
    State {
        machine: MachineId,
        unit: UnitName,
    },
    Leader,
    Disruption,
    Unscheduled(UnitName),
    Metadata {
        machine: MachineId,
        key: MetadataKey,
    },
    Drain(MachineId),
    Moving(UnitName),
    /// The schedule's mirror by unit: `unit` is scheduled to `machine`. Written by the engine
    /// in the transaction that writes or deletes the schedule entry, so a reader that waits for
    /// a few units reads only their keys.
    Placement {
        unit: UnitName,
        machine: MachineId,
    },
    /// The placement history: `unit` left `machine` while a copy may still have run there;
    /// the value says what the machine had published of it ([`crate::LeftCopy`]). Written by
    /// the engine in the transaction that deletes the schedule entry, deleted by it once that
    /// copy has stopped or the machine is gone; only such a machine (or one the unit is
    /// scheduled on) may hold the unit's next placement back (issue 36).
    Left {
        unit: UnitName,
        machine: MachineId,
    },
    /// `machine`'s units were imported from fleet v1 (`fleetctl import-fleet`) and it has not
    /// joined ours yet: the engine keeps its schedule while it is absent, since the copies
    /// fleet started there run on without any fence of ours. Deleted by the machine itself
    /// once its agent has taken them over.
    Migrating(MachineId),
    /// An event (issue 41): written by `source`, about `subject`, at `stamp`.
    Event {
        source: EventSource,
        subject: EventSubject,
        stamp: EventStamp,
    },
}

/// The part of the schema a key is under, read from its first segment alone: a key of a
/// kind whose other parts do not parse still belongs to that kind (a listing of the kind
/// finds it, and skips it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Unit,
    File,
    FileRef,
    Schedule,
    Machine,
    State,
    /// `engine/leader` and `engine/disruption`.
    Engine,
    Unscheduled,
    Metadata,
    /// `drain/<machine>`: written by operators (the units role).
    Drain,
    /// `moving/<name>`: written by the engine while it moves a unit off a drained machine.
    Moving,
    /// `placement/<name>/<machine>`: the schedule by unit, written by the engine.
    Placement,
    /// `left/<name>/<machine>`: the placement history, written by the engine.
    Left,
    /// `migrating/<machine>`: written by `import-fleet`, deleted by the machine.
    Migrating,
    /// `event/...`: what happened, on its writer's lease.
    Event,
}

impl Key {
    /// What `key` names, if it is a key of the schema under `keys`' prefix whose parts parse.
    pub fn parse(keys: &Keys, key: &str) -> Option<Key> {
        let (kind, rest) = keys.split(key)?;
        let pair = || rest.split_once('/');
        Some(match kind {
            Kind::Unit => Key::Unit(rest.parse().ok()?),
            Kind::File => Key::File(rest.parse().ok()?),
            Kind::Machine => Key::Machine(rest.parse().ok()?),
            Kind::Unscheduled => Key::Unscheduled(rest.parse().ok()?),
            Kind::Drain => Key::Drain(rest.parse().ok()?),
            Kind::Moving => Key::Moving(rest.parse().ok()?),
            Kind::Migrating => Key::Migrating(rest.parse().ok()?),
            Kind::FileRef => {
                let (hash, unit) = pair()?;
                Key::FileRef {
                    hash: hash.parse().ok()?,
                    unit: unit.parse().ok()?,
                }
            }
            Kind::Schedule => {
                let (machine, unit) = pair()?;
                Key::Schedule {
                    machine: machine.parse().ok()?,
                    unit: unit.parse().ok()?,
                }
            }
            Kind::State => {
                let (machine, unit) = pair()?;
                Key::State {
                    machine: machine.parse().ok()?,
                    unit: unit.parse().ok()?,
                }
            }
            Kind::Placement => {
                let (unit, machine) = pair()?;
                Key::Placement {
                    unit: unit.parse().ok()?,
                    machine: machine.parse().ok()?,
                }
            }
            Kind::Left => {
                let (unit, machine) = pair()?;
                Key::Left {
                    unit: unit.parse().ok()?,
                    machine: machine.parse().ok()?,
                }
            }
            Kind::Metadata => {
                let (machine, key) = pair()?;
                Key::Metadata {
                    machine: machine.parse().ok()?,
                    key: key.parse().ok()?,
                }
            }
            Kind::Event => {
                let (source, rest) = EventSource::split(rest)?;
                let (subject, stamp) = EventSubject::split(rest)?;
                Key::Event {
                    source,
                    subject,
                    stamp: stamp.parse().ok()?,
                }
            }
            Kind::Engine => match rest {
                "leader" => Key::Leader,
                "disruption" => Key::Disruption,
                _ => return None,
            },
        })
    }

    /// The key itself, under `keys`' prefix.
    pub fn build(&self, keys: &Keys) -> String {
        match self {
            Key::Unit(unit) => keys.unit(unit),
            Key::File(hash) => keys.file(hash),
            Key::FileRef { hash, unit } => keys.file_ref(hash, unit),
            Key::Schedule { machine, unit } => keys.schedule(machine, unit),
            Key::Machine(machine) => keys.machine(machine),
            Key::State { machine, unit } => keys.state(machine, unit),
            Key::Leader => keys.leader(),
            Key::Disruption => keys.disruption(),
            Key::Unscheduled(unit) => keys.unscheduled(unit),
            Key::Metadata { machine, key } => keys.metadata(machine, key.as_str()),
            Key::Drain(machine) => keys.drain(machine),
            Key::Moving(unit) => keys.moving(unit),
            Key::Placement { unit, machine } => keys.placement(unit, machine),
            Key::Left { unit, machine } => keys.left(unit, machine),
            Key::Migrating(machine) => keys.migrating(machine),
            Key::Event {
                source,
                subject,
                stamp,
            } => keys.event(source, subject, *stamp),
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Key::Unit(_) => Kind::Unit,
            Key::File(_) => Kind::File,
            Key::FileRef { .. } => Kind::FileRef,
            Key::Schedule { .. } => Kind::Schedule,
            Key::Machine(_) => Kind::Machine,
            Key::State { .. } => Kind::State,
            Key::Leader | Key::Disruption => Kind::Engine,
            Key::Unscheduled(_) => Kind::Unscheduled,
            Key::Metadata { .. } => Kind::Metadata,
            Key::Drain(_) => Kind::Drain,
            Key::Moving(_) => Kind::Moving,
            Key::Placement { .. } => Kind::Placement,
            Key::Left { .. } => Kind::Left,
            Key::Migrating(_) => Kind::Migrating,
            Key::Event { .. } => Kind::Event,
        }
    }
}

/// The default key prefix, fleet's.
pub const DEFAULT_PREFIX: &str = "/_coreos.com/fleet/";

/// Builds keys under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// `prefix` gets a trailing `/` if it lacks one.
    pub fn new(prefix: &str) -> Keys {
        let mut prefix = prefix.to_owned();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        Keys { prefix }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn units(&self) -> String {
        format!("{}unit/", self.prefix)
    }

    pub fn unit(&self, name: &UnitName) -> String {
        format!("{}unit/{name}", self.prefix)
    }

    pub fn file(&self, hash: &UnitHash) -> String {
        format!("{}file/{hash}", self.prefix)
    }

    pub fn files(&self) -> String {
        format!("{}file/", self.prefix)
    }

    pub fn file_refs(&self, hash: &UnitHash) -> String {
        format!("{}file-ref/{hash}/", self.prefix)
    }

    pub fn all_file_refs(&self) -> String {
        format!("{}file-ref/", self.prefix)
    }

    pub fn file_ref(&self, hash: &UnitHash, name: &UnitName) -> String {
        format!("{}file-ref/{hash}/{name}", self.prefix)
    }

    pub fn schedules(&self) -> String {
        format!("{}schedule/", self.prefix)
    }

    pub fn machine_schedule(&self, machine: &MachineId) -> String {
        format!("{}schedule/{machine}/", self.prefix)
    }

    pub fn schedule(&self, machine: &MachineId, name: &UnitName) -> String {
        format!("{}schedule/{machine}/{name}", self.prefix)
    }

    pub fn machines(&self) -> String {
        format!("{}machine/", self.prefix)
    }

    pub fn machine(&self, machine: &MachineId) -> String {
        format!("{}machine/{machine}", self.prefix)
    }

    /// Every machine's published unit states.
    pub fn states(&self) -> String {
        format!("{}unit-state/", self.prefix)
    }

    /// The states machine `machine` publishes: the prefix its etcd role may write.
    pub fn machine_states(&self, machine: &MachineId) -> String {
        format!("{}unit-state/{machine}/", self.prefix)
    }

    pub fn state(&self, machine: &MachineId, name: &UnitName) -> String {
        format!("{}unit-state/{machine}/{name}", self.prefix)
    }

    /// The state key of the layout before issue 17 (`P/state/<name>/<machine>`): not read any
    /// more, only deleted by an upgraded agent that took over its old lease (docs/registry.md,
    /// Schema changes).
    pub fn legacy_state(&self, name: &UnitName, machine: &MachineId) -> String {
        format!("{}state/{name}/{machine}", self.prefix)
    }

    pub fn leader(&self) -> String {
        format!("{}engine/leader", self.prefix)
    }

    /// Present while the engine holds rescheduling (more machines vanished at once than it
    /// believes): the reason, for `fleetctl list-machines`.
    pub fn disruption(&self) -> String {
        format!("{}engine/disruption", self.prefix)
    }

    /// Dynamic machine metadata (the API's `PATCH /machines`), by machine then key.
    pub fn metadata_all(&self) -> String {
        format!("{}metadata/", self.prefix)
    }

    pub fn metadata(&self, machine: &MachineId, key: &str) -> String {
        format!("{}metadata/{machine}/{key}", self.prefix)
    }

    /// Drain marks, by machine: set by `fleetctl drain`, kept until `undrain` (no lease, so
    /// they survive fleetd restarts and leader changes).
    pub fn drains(&self) -> String {
        format!("{}drain/", self.prefix)
    }

    pub fn drain(&self, machine: &MachineId) -> String {
        format!("{}drain/{machine}", self.prefix)
    }

    /// The machines whose units were imported from fleet v1 and that have not joined yet.
    pub fn migrations(&self) -> String {
        format!("{}migrating/", self.prefix)
    }

    pub fn migrating(&self, machine: &MachineId) -> String {
        format!("{}migrating/{machine}", self.prefix)
    }

    /// The units the engine is moving off a drained machine, by unit.
    pub fn moves(&self) -> String {
        format!("{}moving/", self.prefix)
    }

    pub fn moving(&self, name: &UnitName) -> String {
        format!("{}moving/{name}", self.prefix)
    }

    /// The schedule by unit: every unit's placements.
    pub fn placements(&self) -> String {
        format!("{}placement/", self.prefix)
    }

    /// The machines unit `name` is scheduled to (one key each).
    pub fn unit_placements(&self, name: &UnitName) -> String {
        format!("{}placement/{name}/", self.prefix)
    }

    pub fn placement(&self, name: &UnitName, machine: &MachineId) -> String {
        format!("{}placement/{name}/{machine}", self.prefix)
    }

    /// The placement history: every unit's records of machines it left.
    pub fn lefts(&self) -> String {
        format!("{}left/", self.prefix)
    }

    /// The machines unit `name` left (one key each).
    pub fn unit_lefts(&self, name: &UnitName) -> String {
        format!("{}left/{name}/", self.prefix)
    }

    pub fn left(&self, name: &UnitName, machine: &MachineId) -> String {
        format!("{}left/{name}/{machine}", self.prefix)
    }

    /// Every event (issue 41).
    pub fn events(&self) -> String {
        format!("{}event/", self.prefix)
    }

    /// The events `source` writes: the prefix its etcd role may write.
    pub fn source_events(&self, source: &EventSource) -> String {
        format!("{}event/{}/", self.prefix, source.segment())
    }

    /// The events `source` wrote about `subject`.
    pub fn subject_events(&self, source: &EventSource, subject: &EventSubject) -> String {
        format!(
            "{}event/{}/{}/",
            self.prefix,
            source.segment(),
            subject.segment()
        )
    }

    pub fn event(&self, source: &EventSource, subject: &EventSubject, stamp: EventStamp) -> String {
        format!(
            "{}event/{}/{}/{stamp}",
            self.prefix,
            source.segment(),
            subject.segment()
        )
    }

    pub fn unscheduled_all(&self) -> String {
        format!("{}unscheduled/", self.prefix)
    }

    pub fn unscheduled(&self, name: &UnitName) -> String {
        format!("{}unscheduled/{name}", self.prefix)
    }

    /// The kind of `key`, if it is under the prefix in a part of the schema.
    pub fn kind(&self, key: &str) -> Option<Kind> {
        Some(self.split(key)?.0)
    }

    /// `key`, when it is under `P/schedule/` and its parts do not parse (see
    /// [`StrayScheduleKey`]).
    pub fn stray_schedule_key(&self, key: &str) -> Option<StrayScheduleKey> {
        let stray = self.kind(key) == Some(Kind::Schedule) && Key::parse(self, key).is_none();
        stray.then(|| StrayScheduleKey(key.to_owned()))
    }

    /// The machine whose prefix `P/unit-state/<machine>/` holds `key`, whether or not the
    /// rest of the key parses: what counts against that machine's bound on states
    /// (`read::MAX_STATES_PER_MACHINE`), since its etcd role may write any key there.
    pub fn state_machine(&self, key: &str) -> Option<MachineId> {
        match self.split(key)? {
            (Kind::State, rest) => rest.split_once('/')?.0.parse().ok(),
            _ => None,
        }
    }

    /// The kind of `key` and the rest of it after `<kind>/`.
    fn split<'a>(&self, key: &'a str) -> Option<(Kind, &'a str)> {
        let (kind, rest) = key.strip_prefix(&self.prefix)?.split_once('/')?;
        let kind = match kind {
            "unit" => Kind::Unit,
            "file" => Kind::File,
            "file-ref" => Kind::FileRef,
            "schedule" => Kind::Schedule,
            "machine" => Kind::Machine,
            "unit-state" => Kind::State,
            "engine" => Kind::Engine,
            "unscheduled" => Kind::Unscheduled,
            "metadata" => Kind::Metadata,
            "drain" => Kind::Drain,
            "moving" => Kind::Moving,
            "placement" => Kind::Placement,
            "left" => Kind::Left,
            "migrating" => Kind::Migrating,
            "event" => Kind::Event,
            _ => return None,
        };
        Some((kind, rest))
    }
}

/// A key under `P/schedule/` whose parts do not parse (`schedule/m1/../../etc.service`,
/// `schedule/m1/bad name`): it names no entry, so no agent runs anything for it and no
/// decision about a unit ever deletes it (issue 38). Built only from such a key, so the
/// engine's delete of it (`EngineWrite::DeleteStray`) can delete nothing else.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct StrayScheduleKey(String);

impl StrayScheduleKey {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for StrayScheduleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Default for Keys {
    fn default() -> Self {
        Keys::new(DEFAULT_PREFIX)
    }
}

#[cfg(test)]
mod tests;
