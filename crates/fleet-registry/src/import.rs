//! Writing units taken over from fleet v1 (`fleetctl import-fleet`), with the placement fleet
//! gave them. The one writer outside the engine that writes schedule entries, so it needs
//! credentials beyond any one role of `rbac.rs` (etcd's root user, or the operator and engine
//! roles together: docs/migrating.md). It writes nothing the engine would not keep:
//!
//! 1. [`Importer::mark_migrating`] first, for every machine it will place units on: from then
//!    on the engine keeps those machines' entries while they are absent (`Key::Migrating`);
//! 2. then each unit in one transaction: its file, file reference and record, and its entry
//!    (and placement) on every machine fleet ran it on, so that no engine ever sees the unit
//!    launched without its placement and places it elsewhere.

use fleet_core::{DesiredState, MachineId, UnitFile, UnitName};
use tracing::debug;

use crate::error::Result;
use crate::keys::Keys;
use crate::kv::{Compare, Kv, MAX_TXN_OPS, Txn, TxnOp};
use crate::records::{MigrationRecord, ReplaceState, ScheduleEntry, Unit, UnitRecord};
use crate::registry::{Registry, encode, put};
use crate::units::UnitsRole;

/// A unit as the import writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportedUnit {
    pub name: UnitName,
    pub file: UnitFile,
    pub desired: DesiredState,
    /// The machines it is scheduled on: fleet's target, or for a global unit the machines
    /// fleet ran it on. Empty: the engine places it (or nothing runs it).
    pub machines: Vec<MachineId>,
}

/// What [`Importer::import_unit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportOutcome {
    Written(Unit),
    /// The unit changed since it was read (or appeared): nothing was written.
    Conflict,
}

/// Writes imported units and migration marks.
#[derive(Debug, Clone)]
pub struct Importer<K> {
    registry: Registry<K>,
}

impl<K: Kv> Importer<K> {
    pub fn new(registry: Registry<K>) -> Importer<K> {
        Importer { registry }
    }

    /// Marks `record.machine` as migrating (idempotent: a second import rewrites it).
    pub async fn mark_migrating(&self, record: &MigrationRecord) -> Result<()> {
        let keys = self.registry.keys();
        let txn = Txn {
            compares: vec![],
            success: vec![put(keys.migrating(&record.machine), encode(record))],
            failure: vec![],
        };
        self.registry
            .txn(txn, "marking a machine migrating")
            .await?;
        Ok(())
    }

    /// Writes `unit` in one transaction if the unit is as read: absent (`existing` `None`) or
    /// unchanged since `existing` was read (then replaced, its old entries left to the engine
    /// to remove, as for any replace).
    pub async fn import_unit(
        &self,
        unit: &ImportedUnit,
        existing: Option<&Unit>,
    ) -> Result<ImportOutcome> {
        let keys = self.registry.keys();
        let record = UnitRecord {
            name: unit.name.clone(),
            hash: unit.file.hash(),
            desired: unit.desired,
            restart: 0,
            replace: ReplaceState::default(),
        };
        let unit_key = keys.unit(&unit.name);
        let compare = match existing {
            None => Compare::absent(&unit_key),
            Some(u) => Compare::mod_revision(&unit_key, u.mod_revision),
        };
        let units = UnitsRole::new(self.registry.clone());
        let mut success = units.unit_write_ops(&record, &unit.file);
        // A global unit fleet ran on more machines than one transaction holds: the rest of its
        // entries follow, each a plain put of what the engine would write for a live machine.
        let first = (MAX_TXN_OPS - success.len()) / 2;
        let (now, later) = unit.machines.split_at(first.min(unit.machines.len()));
        for machine in now {
            success.extend(entry_ops(keys, &record, machine));
        }
        let txn = Txn {
            compares: vec![compare],
            success,
            failure: vec![],
        };
        let res = self.registry.txn(txn, "importing unit").await?;
        if !res.succeeded {
            return Ok(ImportOutcome::Conflict);
        }
        for chunk in later.chunks(MAX_TXN_OPS / 2) {
            let txn = Txn {
                compares: vec![],
                success: chunk
                    .iter()
                    .flat_map(|m| entry_ops(keys, &record, m))
                    .collect(),
                failure: vec![],
            };
            self.registry
                .txn(txn, "importing a global unit's entries")
                .await?;
        }
        debug!(unit = %unit.name, machines = unit.machines.len(), "imported unit");
        Ok(ImportOutcome::Written(Unit {
            record,
            mod_revision: res.revision,
        }))
    }
}

/// The entry of `record` on `machine` and its placement, as the engine writes them.
fn entry_ops(keys: &Keys, record: &UnitRecord, machine: &MachineId) -> [TxnOp; 2] {
    let entry = ScheduleEntry {
        name: record.name.clone(),
        machine: machine.clone(),
        hash: record.hash,
        desired: record.desired,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    [
        put(keys.schedule(machine, &record.name), encode(&entry)),
        put(keys.placement(&record.name, machine), Vec::new()),
    ]
}
