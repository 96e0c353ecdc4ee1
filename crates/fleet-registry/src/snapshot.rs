//! A consistent view of the whole cluster at one etcd revision, for decisions and listings.

use fleet_core::{MachineId, MachineInfo, UnitName};
use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::error::{RegistryError, Result};
use crate::kv::{KeyValue, Kv, Revision};
use crate::metadata::{self, DynamicMetadata};
use crate::per_machine::PerMachine;
use crate::read::{self, Skipped};
use crate::records::{ScheduleEntry, Unit, UnitStateRecord};
use crate::registry::Registry;

/// Units, schedule, machines, their dynamic metadata and published states, all read at
/// `revision`.
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

    pub(crate) fn insert_schedule(&mut self, e: ScheduleEntry) {
        self.schedule
            .entry(e.name.clone())
            .or_default()
            .insert(e.machine.clone(), e);
    }

    pub(crate) fn insert_state(&mut self, s: UnitStateRecord) {
        self.states
            .entry(s.name.clone())
            .or_default()
            .insert(s.machine.clone(), s);
    }
}

impl<K: Kv> Registry<K> {
    /// Reads everything at one revision: the first read fixes it, the rest read at it. A
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
        for kv in &first.kvs {
            match read::unit(keys, kv) {
                Ok(unit) => {
                    snap.units.insert(unit.name().clone(), unit);
                }
                Err(s) => snap.skip(s),
            }
        }
        for kv in self.range_at(&keys.machines(), revision).await? {
            match read::machine(keys, &kv) {
                Ok(m) => {
                    snap.machines.insert(m.id.clone(), m);
                }
                Err(s) => snap.skip(s),
            }
        }
        for kv in self.range_at(&keys.metadata_all(), revision).await? {
            match metadata::read(keys, &kv) {
                Ok((machine, key, value)) => {
                    snap.metadata.entry(machine).or_default().insert(key, value);
                }
                Err(s) => snap.skip(s),
            }
        }
        for kv in self.range_at(&keys.schedules(), revision).await? {
            match read::schedule_entry(keys, &kv) {
                Ok(e) => snap.insert_schedule(e),
                Err(s) => snap.skip(s),
            }
        }
        for kv in self.range_at(&keys.states(), revision).await? {
            match read::state(keys, &kv) {
                Ok(s) => snap.insert_state(s),
                Err(s) => snap.skip(s),
            }
        }
        for kv in self.range_at(&keys.unscheduled_all(), revision).await? {
            match read::unscheduled(keys, &kv) {
                Ok((name, reason)) => {
                    snap.unscheduled.insert(name, reason);
                }
                Err(s) => snap.skip(s),
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
