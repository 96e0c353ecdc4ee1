//! A consistent view of the whole cluster at one etcd revision, for decisions and listings.

use fleet_core::{MachineId, MachineInfo, UnitName};
use std::collections::BTreeMap;

use crate::error::{RegistryError, Result};
use crate::kv::{Kv, Revision};
use crate::per_machine::PerMachine;
use crate::records::{ScheduleEntry, Unit, UnitStateRecord};
use crate::registry::{Registry, decode, decode_unit};

/// Units, schedule, machines and published states, all read at `revision`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub revision: Revision,
    pub units: BTreeMap<UnitName, Unit>,
    pub machines: BTreeMap<MachineId, MachineInfo>,
    /// unit -> machine -> entry.
    pub schedule: BTreeMap<UnitName, PerMachine<ScheduleEntry>>,
    /// unit -> machine -> published state.
    pub states: BTreeMap<UnitName, PerMachine<UnitStateRecord>>,
    /// unit -> why the engine could not place it.
    pub unscheduled: BTreeMap<UnitName, String>,
}

impl<K: Kv> Registry<K> {
    /// Reads everything at one revision: the first read fixes it, the rest read at it.
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
            let unit = decode_unit(kv)?;
            snap.units.insert(unit.name().clone(), unit);
        }
        for kv in self.range_at(&keys.machines(), revision).await? {
            let m: MachineInfo = decode(&kv)?;
            snap.machines.insert(m.id.clone(), m);
        }
        for kv in self.range_at(&keys.schedules(), revision).await? {
            let e: ScheduleEntry = decode(&kv)?;
            snap.schedule
                .entry(e.name.clone())
                .or_default()
                .insert(e.machine.clone(), e);
        }
        for kv in self.range_at(&keys.states(), revision).await? {
            let s: UnitStateRecord = decode(&kv)?;
            snap.states
                .entry(s.name.clone())
                .or_default()
                .insert(s.machine.clone(), s);
        }
        let base = keys.unscheduled_all();
        for kv in self.range_at(&base, revision).await? {
            let name =
                kv.key[base.len()..]
                    .parse::<UnitName>()
                    .map_err(|e| RegistryError::Corrupt {
                        key: kv.key.clone(),
                        detail: e.to_string(),
                    })?;
            snap.unscheduled
                .insert(name, String::from_utf8_lossy(&kv.value).into_owned());
        }
        Ok(snap)
    }

    async fn range_at(&self, prefix: &str, revision: Revision) -> Result<Vec<crate::kv::KeyValue>> {
        Ok(self
            .kv()
            .range(prefix, true, Some(revision))
            .await
            .map_err(RegistryError::kv("reading snapshot"))?
            .kvs)
    }
}
