//! The etcd key schema (documented in docs/registry.md). Every key the project writes is built
//! here, so the schema lives in one place.
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
//! | `P/state/<name>/<machine>`        | [`UnitStateRecord`] JSON      | machine's  |
//! | `P/engine/leader`                 | leader's machine ID           | leader's   |
//! | `P/engine/disruption`             | why rescheduling is held      | none       |
//! | `P/unscheduled/<name>`            | why the engine cannot place it| none       |
//! | `P/metadata/<machine>/<key>`      | dynamic metadata value        | none       |
//!
//! [`UnitRecord`]: crate::UnitRecord
//! [`ScheduleEntry`]: crate::ScheduleEntry
//! [`UnitStateRecord`]: crate::UnitStateRecord

use fleet_core::{MachineId, UnitHash, UnitName};

/// What a key of the schema names, read from the key alone (its value may not parse).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    Unit(UnitName),
    File(UnitHash),
    Schedule { machine: MachineId, unit: UnitName },
    Machine(MachineId),
    State { unit: UnitName, machine: MachineId },
    Unscheduled(UnitName),
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

    pub fn states(&self) -> String {
        format!("{}state/", self.prefix)
    }

    pub fn unit_states(&self, name: &UnitName) -> String {
        format!("{}state/{name}/", self.prefix)
    }

    pub fn state(&self, name: &UnitName, machine: &MachineId) -> String {
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

    pub fn unscheduled_all(&self) -> String {
        format!("{}unscheduled/", self.prefix)
    }

    pub fn unscheduled(&self, name: &UnitName) -> String {
        format!("{}unscheduled/{name}", self.prefix)
    }

    /// What `key` names, if it is a record key of the schema whose parts parse.
    pub fn named(&self, key: &str) -> Option<Named> {
        let (kind, rest) = key.strip_prefix(&self.prefix)?.split_once('/')?;
        let pair = || rest.split_once('/');
        Some(match kind {
            "unit" => Named::Unit(rest.parse().ok()?),
            "file" => Named::File(rest.parse().ok()?),
            "machine" => Named::Machine(rest.parse().ok()?),
            "unscheduled" => Named::Unscheduled(rest.parse().ok()?),
            "schedule" => {
                let (machine, unit) = pair()?;
                Named::Schedule {
                    machine: machine.parse().ok()?,
                    unit: unit.parse().ok()?,
                }
            }
            "state" => {
                let (unit, machine) = pair()?;
                Named::State {
                    unit: unit.parse().ok()?,
                    machine: machine.parse().ok()?,
                }
            }
            _ => return None,
        })
    }

    /// The part of `key` after `base`, if `key` is under it.
    pub fn rest<'a>(key: &'a str, base: &str) -> Option<&'a str> {
        key.strip_prefix(base)
    }
}

impl Default for Keys {
    fn default() -> Self {
        Keys::new(DEFAULT_PREFIX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::new("/p")
    }

    #[test]
    fn a_record_key_names_what_its_parts_say() {
        let k = keys();
        let (m, u): (MachineId, UnitName) = ("m1".parse().unwrap(), "a.service".parse().unwrap());
        assert_eq!(k.named(&k.unit(&u)), Some(Named::Unit(u.clone())));
        assert_eq!(k.named(&k.machine(&m)), Some(Named::Machine(m.clone())));
        assert_eq!(
            k.named(&k.schedule(&m, &u)),
            Some(Named::Schedule {
                machine: m.clone(),
                unit: u.clone()
            })
        );
        assert_eq!(
            k.named(&k.state(&u, &m)),
            Some(Named::State {
                unit: u.clone(),
                machine: m
            })
        );
        assert_eq!(k.named(&k.unscheduled(&u)), Some(Named::Unscheduled(u)));
    }

    #[test]
    fn a_key_whose_parts_do_not_parse_names_nothing() {
        let k = keys();
        for key in [
            "/p/unit/bad name",
            "/p/unit/",
            "/p/machine/a/b",
            "/p/schedule/m1",
            "/p/schedule/m1/not a unit",
            "/p/engine/leader",
            "/q/unit/a.service",
        ] {
            assert_eq!(k.named(key), None, "{key}");
        }
    }
}
