//! A consistent view of the whole cluster at one etcd revision, for decisions and listings.

use fleet_core::{MachineId, MachineInfo, UnitName};
use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::error::{RegistryError, Result};
use crate::keys::{Key, Keys, Kind};
use crate::kv::{KeyValue, Kv, Revision};
use crate::metadata::{self, DynamicMetadata};
use crate::per_machine::PerMachine;
use crate::read::{self, Skipped};
use crate::records::{DrainRecord, MoveRecord, ScheduleEntry, Unit, UnitStateRecord};
use crate::registry::Registry;

/// Units, schedule, machines, their dynamic metadata, drains and published states, all read
/// at `revision`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub revision: Revision,
    pub units: BTreeMap<UnitName, Unit>,
    /// Machines as they registered, with their configured metadata: what the scheduler
    /// places on is [`machines_with_metadata`](Self::machines_with_metadata).
    pub machines: BTreeMap<MachineId, MachineInfo>,
    /// Dynamic metadata (`PATCH /machines`), of registered machines and others.
    pub metadata: DynamicMetadata,
    /// unit -> machine -> entry.
    pub schedule: BTreeMap<UnitName, PerMachine<ScheduleEntry>>,
    /// unit -> machine -> published state.
    pub states: BTreeMap<UnitName, PerMachine<UnitStateRecord>>,
    /// unit -> why the engine could not place it.
    pub unscheduled: BTreeMap<UnitName, String>,
    /// Drained machines (registered or not), by machine.
    pub drained: BTreeMap<MachineId, DrainRecord>,
    /// Units the engine is moving off a drained machine.
    pub moving: BTreeMap<UnitName, MoveRecord>,
    /// Values that could not be read, by key: left out of every map above, so a corrupt unit
    /// record reads as no unit, a corrupt schedule entry as no entry.
    pub skipped: BTreeMap<String, Skipped>,
}

impl Snapshot {
    pub(crate) fn skip(&mut self, s: Skipped) {
        self.skipped.insert(s.key.clone(), s);
    }

    /// The machines with their dynamic metadata over their configured metadata; borrowed
    /// when no registered machine has dynamic metadata.
    pub fn machines_with_metadata(&self) -> Cow<'_, BTreeMap<MachineId, MachineInfo>> {
        if !self.metadata.keys().any(|m| self.machines.contains_key(m)) {
            return Cow::Borrowed(&self.machines);
        }
        let mut machines = self.machines.clone();
        for machine in machines.values_mut() {
            metadata::apply_dynamic(machine, &self.metadata);
        }
        Cow::Owned(machines)
    }

    /// `name` as the unit map holds it, so that the schedule's and the states' copies share
    /// its text (a clone of a name shares it; one decoded from another record does not).
    fn shared_name(&self, name: &mut UnitName) {
        if let Some((known, _)) = self.units.get_key_value(name) {
            *name = known.clone();
        }
    }

    /// `machine` as the machine map holds it (see [`shared_name`](Self::shared_name)).
    fn shared_machine(&self, machine: &mut MachineId) {
        if let Some((known, _)) = self.machines.get_key_value(machine) {
            *machine = known.clone();
        }
    }

    pub(crate) fn insert_schedule(&mut self, mut e: ScheduleEntry) {
        self.shared_name(&mut e.name);
        self.shared_machine(&mut e.machine);
        self.schedule
            .entry(e.name.clone())
            .or_default()
            .insert(e.machine.clone(), e);
    }

    fn insert_state(&mut self, mut s: UnitStateRecord) {
        self.shared_name(&mut s.name);
        self.shared_machine(&mut s.machine);
        self.states
            .entry(s.name.clone())
            .or_default()
            .insert(s.machine.clone(), s);
    }

    /// Adds the value stored at `kv`, if its key is of a kind the snapshot keeps (units,
    /// machines, dynamic metadata, schedule, states, unschedulable reasons, drains, moves): readable, into its map; not, into
    /// [`skipped`](Self::skipped), and returned so that the caller may report it. Whatever was
    /// at the key before must have been [`remove`](Self::remove)d.
    pub(crate) fn insert(&mut self, keys: &Keys, kv: &KeyValue) -> Option<&Skipped> {
        let inserted = match keys.kind(&kv.key)? {
            Kind::Unit => read::unit(keys, kv).map(|unit| {
                self.units.insert(unit.name().clone(), unit);
            }),
            Kind::Machine => read::machine(keys, kv).map(|m| {
                self.machines.insert(m.id.clone(), m);
            }),
            Kind::Schedule => read::schedule_entry(keys, kv).map(|e| self.insert_schedule(e)),
            Kind::State => read::state(keys, kv).map(|s| self.insert_state(s)),
            Kind::Unscheduled => read::unscheduled(keys, kv).map(|(unit, reason)| {
                self.unscheduled.insert(unit, reason);
            }),
            Kind::Metadata => metadata::read(keys, kv).map(|(machine, key, value)| {
                self.metadata.entry(machine).or_default().insert(key, value);
            }),
            Kind::Drain => read::drain(keys, kv).map(|d| {
                self.drained.insert(d.machine.clone(), d);
            }),
            Kind::Moving => read::moving(keys, kv).map(|m| {
                self.moving.insert(m.unit.clone(), m);
            }),
            // Placements mirror the schedule, which the snapshot holds already.
            Kind::File | Kind::FileRef | Kind::Engine | Kind::Placement => return None,
        };
        let s = inserted.err()?;
        let key = s.key.clone();
        self.skip(s);
        self.skipped.get(&key)
    }

    /// Removes what is stored at `key`: its skipped value, or what the key names. A key that
    /// names nothing (its parts do not parse) can hold nothing but a skipped value.
    pub(crate) fn remove(&mut self, keys: &Keys, key: &str) {
        self.skipped.remove(key);
        match Key::parse(keys, key) {
            Some(Key::Unit(unit)) => {
                self.units.remove(&unit);
            }
            Some(Key::Machine(machine)) => {
                self.machines.remove(&machine);
            }
            Some(Key::Schedule { machine, unit }) => {
                remove_inner(&mut self.schedule, &unit, &machine)
            }
            Some(Key::State { unit, machine }) => remove_inner(&mut self.states, &unit, &machine),
            Some(Key::Unscheduled(unit)) => {
                self.unscheduled.remove(&unit);
            }
            Some(Key::Metadata { machine, key }) => {
                if let Some(values) = self.metadata.get_mut(&machine) {
                    values.remove(key.as_str());
                    if values.is_empty() {
                        self.metadata.remove(&machine);
                    }
                }
            }
            Some(Key::Drain(machine)) => {
                self.drained.remove(&machine);
            }
            Some(Key::Moving(unit)) => {
                self.moving.remove(&unit);
            }
            Some(
                Key::File(_)
                | Key::FileRef { .. }
                | Key::Leader
                | Key::Disruption
                | Key::Placement { .. },
            )
            | None => {}
        }
    }
}

fn remove_inner<V>(
    map: &mut BTreeMap<UnitName, PerMachine<V>>,
    unit: &UnitName,
    machine: &MachineId,
) {
    if let Some(inner) = map.get_mut(unit) {
        inner.remove(machine);
        if inner.is_empty() {
            map.remove(unit);
        }
    }
}

impl<K: Kv> Registry<K> {
    /// Reads everything at one revision: the first read fixes it, the rest read at it, all
    /// at once (at 100,000 units one after another they were most of a listing's time). A
    /// value that cannot be read is left out and listed in [`Snapshot::skipped`].
    pub async fn snapshot(&self) -> Result<Snapshot> {
        let keys = self.keys();
        let first = self
            .kv()
            .range(&keys.units(), true, None)
            .await
            .map_err(RegistryError::kv("reading snapshot"))?;
        let revision = first.revision;
        let mut snap = Snapshot {
            revision,
            ..Snapshot::default()
        };
        let rest = [
            keys.machines(),
            keys.schedules(),
            keys.states(),
            keys.unscheduled_all(),
            keys.metadata_all(),
            keys.drains(),
            keys.moves(),
        ];
        for kv in &first.kvs {
            snap.insert(keys, kv);
        }
        let reads = rest.iter().map(|prefix| self.range_at(prefix, revision));
        // Inserted in the order above, units first, so that later records share their names.
        for kvs in futures::future::try_join_all(reads).await? {
            for kv in &kvs {
                snap.insert(keys, kv);
            }
        }
        Ok(snap)
    }

    async fn range_at(&self, prefix: &str, revision: Revision) -> Result<Vec<KeyValue>> {
        Ok(self
            .kv()
            .range(prefix, true, Some(revision))
            .await
            .map_err(RegistryError::kv("reading snapshot"))?
            .kvs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::UnitRecord;
    use fleet_core::{DesiredState, SystemdState, UnitFile};

    fn kv(key: String, value: Vec<u8>) -> KeyValue {
        KeyValue {
            key,
            value,
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
        }
    }

    fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
        serde_json::to_vec(value).unwrap()
    }

    #[test]
    fn schedule_and_states_share_the_text_of_names_and_machines() {
        let keys = Keys::new("/fleet/");
        let name: UnitName = "web@1.service".parse().unwrap();
        let machine: MachineId = "m1".parse().unwrap();
        let hash = UnitFile::parse(b"[Service]\nExecStart=/bin/true\n")
            .unwrap()
            .hash();
        let info = MachineInfo {
            id: machine.clone(),
            public_ip: "10.0.0.1".to_owned(),
            metadata: BTreeMap::new(),
            version: "1".to_owned(),
            disable_engine: false,
            api: String::new(),
        };
        let record = UnitRecord {
            name: name.clone(),
            hash,
            desired: DesiredState::Launched,
            restart: 0,
            replace: Default::default(),
        };
        let entry = ScheduleEntry {
            name: name.clone(),
            machine: machine.clone(),
            hash,
            desired: DesiredState::Launched,
            restart: 0,
            no_restart: false,
            placement: 0,
        };
        let state = UnitStateRecord {
            name: name.clone(),
            machine: machine.clone(),
            hash: Some(hash),
            systemd: SystemdState::not_found(),
            drop_ins: Vec::new(),
            restart: 0,
            restart_pending: false,
        };
        let mut snap = Snapshot::default();
        for (key, value) in [
            (keys.unit(&name), json(&record)),
            (keys.machine(&machine), json(&info)),
            (keys.schedule(&machine, &name), json(&entry)),
            (keys.state(&machine, &name), json(&state)),
        ] {
            assert!(snap.insert(&keys, &kv(key, value)).is_none());
        }
        let text = |n: &UnitName| n.as_str().as_ptr();
        let (unit_key, unit) = snap.units.first_key_value().unwrap();
        let (machine_key, _) = snap.machines.first_key_value().unwrap();
        let (schedule_key, on) = snap.schedule.first_key_value().unwrap();
        let (state_key, states) = snap.states.first_key_value().unwrap();
        let (entry, state) = (&on[&machine], &states[&machine]);
        for n in [
            unit.name(),
            schedule_key,
            &entry.name,
            state_key,
            &state.name,
        ] {
            assert_eq!(text(n), text(unit_key), "{n} has a copy of its own");
        }
        let (on_key, _) = on.iter().next().unwrap();
        for m in [on_key, &entry.machine, &state.machine] {
            assert_eq!(m.as_str().as_ptr(), machine_key.as_str().as_ptr());
        }
    }
}
