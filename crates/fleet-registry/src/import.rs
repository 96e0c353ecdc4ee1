//! Writing units taken over from fleet v1 (`fleetctl import-fleet`), with the placement fleet
//! gave them. The one writer outside the engine that writes schedule entries, so it needs
//! credentials beyond any one role of `rbac.rs` (etcd's root user, or the operator and engine
//! roles together: docs/migrating.md). It writes nothing the engine would not keep:
//!
//! 1. [`Importer::mark_migrating`] first, for every machine it will place units on: from then
//!    on the engine keeps those machines' entries while they are absent (`Key::Migrating`);
//! 2. then each unit in one transaction: its file, file reference and record, and its entry
//!    (and placement) on every machine fleet ran it on, so that no engine ever sees the unit
//!    launched without its placement and places it elsewhere. Units go many to a
//!    transaction ([`batch`]), each unit whole in one.
//!
//! Both ways of importing (fleetctl's etcd driver, and fleetd's `POST /import` for its API
//! driver) write an [`ImportPlan`] with [`Importer::apply`], and both take a file from fleet
//! through [`check_file`]: what the import writes, and what it takes, is decided here once.

use fleet_core::{DesiredState, MachineId, Requirements, UnitFile, UnitHash, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use tracing::debug;

use crate::error::Result;
use crate::keys::Keys;
use crate::kv::{Compare, Kv, MAX_TXN_OPS, Txn, TxnOp};
use crate::records::{MigrationRecord, ReplaceState, ScheduleEntry, Unit, UnitRecord};
use crate::registry::{Registry, encode, put};
use crate::units::UnitsRole;

mod batch;

/// A unit as the import writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportedUnit {
    pub name: UnitName,
    pub file: UnitFile,
    pub desired: DesiredState,
    /// The machines it is scheduled on: fleet's target, or for a global unit the machines
    /// fleet ran it on. Empty: the engine places it (or nothing runs it).
    pub machines: Vec<MachineId>,
    /// The hash of the file ours had when the import was planned (`--replace`): written only
    /// if ours still has that one. `None`: written only if ours has no such unit.
    pub replaces: Option<UnitHash>,
}

/// What one run of the import writes: the marks first, then the units.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportPlan {
    pub marks: Vec<MigrationRecord>,
    pub units: Vec<ImportedUnit>,
}

/// Why a file fleet holds is not taken as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileRefusal {
    /// Ours refuses the file (its syntax, or an `[X-Fleet]` option ours cannot honour).
    #[error("ours refuses its file: {0}")]
    File(String),
    /// The text does not hash to the hash it came with (fleet's key, or the client's claim).
    #[error("its file hashes to {ours}, not {claimed}")]
    HashDiffers { claimed: String, ours: UnitHash },
}

/// The file `text` of unit `name`, if ours reads it, can represent it, and computes `hash`
/// for it: the hash fleet names it by must be ours, or our agent would take the running unit
/// for another version and restart it.
pub fn check_file(name: &UnitName, text: &[u8], hash: &str) -> Result<UnitFile, FileRefusal> {
    let file = UnitFile::parse(text).map_err(|e| FileRefusal::File(e.to_string()))?;
    if file.hash().to_string() != hash {
        return Err(FileRefusal::HashDiffers {
            claimed: hash.to_owned(),
            ours: file.hash(),
        });
    }
    Requirements::from_unit(name, &file)
        .validate()
        .map_err(|e| FileRefusal::File(e.to_string()))?;
    fleet_core::xfleet::check_values(name, &file).map_err(|e| FileRefusal::File(e.to_string()))?;
    Ok(file)
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

    /// Writes `plan`: every mark, then every unit, each as [`Importer::import_unit`] writes
    /// it, if ours still holds what the plan was made from (no unit, or the file it
    /// replaces), many units to a transaction ([`batch`]). One outcome per unit, in order. An
    /// error stops it: the units before it are written, the rest are not.
    pub async fn apply(&self, plan: &ImportPlan) -> Result<Vec<ImportOutcome>> {
        for record in &plan.marks {
            self.mark_migrating(record).await?;
        }
        let replaced: BTreeSet<UnitName> = plan
            .units
            .iter()
            .filter(|u| u.replaces.is_some())
            .map(|u| u.name.clone())
            .collect();
        let ours = self.registry.units_named(&replaced).await?;
        let mut outcomes = Vec::with_capacity(plan.units.len());
        for range in batch::import_batches(&plan.units) {
            outcomes.extend(self.apply_batch(&plan.units[range], &ours).await?);
        }
        Ok(outcomes)
    }

    /// The units of one batch: in one transaction when each is as its plan was made from;
    /// else, or when that transaction finds one changed, one by one, each unit's own compare
    /// deciding.
    async fn apply_batch(
        &self,
        batch: &[ImportedUnit],
        ours: &BTreeMap<UnitName, Unit>,
    ) -> Result<Vec<ImportOutcome>> {
        // What each unit is written over: nothing, a unit as read, or (None) not what the
        // plan replaces, a conflict known before writing.
        let over: Vec<Option<Option<&Unit>>> = batch
            .iter()
            .map(|u| match (u.replaces, ours.get(&u.name)) {
                (None, _) => Some(None),
                (Some(hash), Some(existing)) if existing.hash() == hash => Some(Some(existing)),
                (Some(_), _) => None,
            })
            .collect();
        if batch.len() > 1 && over.iter().all(Option::is_some) {
            let over: Vec<Option<&Unit>> = over.iter().flatten().copied().collect();
            if let Some(written) = self.write_batch(batch, &over).await? {
                return Ok(written);
            }
        }
        let mut outcomes = Vec::with_capacity(batch.len());
        for (unit, over) in batch.iter().zip(over) {
            outcomes.push(match over {
                Some(existing) => self.import_unit(unit, existing).await?,
                None => ImportOutcome::Conflict,
            });
        }
        Ok(outcomes)
    }

    /// One transaction writing every unit of `batch` (one of [`batch::import_batches`]'s)
    /// over `over` (each unit's existing one, or none); `None` when one of them changed and
    /// nothing was written.
    async fn write_batch(
        &self,
        batch: &[ImportedUnit],
        over: &[Option<&Unit>],
    ) -> Result<Option<Vec<ImportOutcome>>> {
        let keys = self.registry.keys();
        let records: Vec<UnitRecord> = batch.iter().map(record_of).collect();
        let mut files = BTreeSet::new();
        let mut success = Vec::new();
        for (unit, record) in batch.iter().zip(&records) {
            if files.insert(record.hash) {
                success.push(put(
                    keys.file(&record.hash),
                    unit.file.canonical().into_bytes(),
                ));
            }
            success.push(put(keys.file_ref(&record.hash, &record.name), Vec::new()));
            success.push(put(keys.unit(&record.name), encode(record)));
            for machine in &unit.machines {
                success.extend(entry_ops(keys, record, machine));
            }
        }
        let txn = Txn {
            compares: records
                .iter()
                .zip(over)
                .map(|(r, o)| compare_of(keys, r, *o))
                .collect(),
            success,
            failure: vec![],
        };
        let res = self.registry.txn(txn, "importing units").await?;
        if !res.succeeded {
            return Ok(None);
        }
        debug!(units = batch.len(), files = files.len(), "imported units");
        Ok(Some(
            records
                .into_iter()
                .map(|record| {
                    ImportOutcome::Written(Unit {
                        record,
                        mod_revision: res.revision,
                    })
                })
                .collect(),
        ))
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
        let record = record_of(unit);
        let compare = compare_of(keys, &record, existing);
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

/// The record `unit` is written with.
fn record_of(unit: &ImportedUnit) -> UnitRecord {
    UnitRecord {
        name: unit.name.clone(),
        hash: unit.file.hash(),
        desired: unit.desired,
        restart: 0,
        replace: ReplaceState::default(),
    }
}

/// The unit's key is as the plan read it: absent, or at `existing`'s revision.
fn compare_of(keys: &Keys, record: &UnitRecord, existing: Option<&Unit>) -> Compare {
    let key = keys.unit(&record.name);
    match existing {
        None => Compare::absent(&key),
        Some(u) => Compare::mod_revision(&key, u.mod_revision),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::MemKv;

    fn file(exec: &str) -> UnitFile {
        UnitFile::parse(format!("[Service]\nExecStart={exec}\n").as_bytes()).unwrap()
    }

    fn unit(
        name: &str,
        exec: &str,
        machines: &[&MachineId],
        replaces: Option<UnitHash>,
    ) -> ImportedUnit {
        ImportedUnit {
            name: name.parse().unwrap(),
            file: file(exec),
            desired: DesiredState::Launched,
            machines: machines.iter().map(|m| (*m).clone()).collect(),
            replaces,
        }
    }

    async fn has(registry: &Registry<MemKv>, key: &str) -> bool {
        !registry
            .kv()
            .range(key, false, None)
            .await
            .unwrap()
            .kvs
            .is_empty()
    }

    #[tokio::test]
    async fn a_plan_marks_first_then_writes_each_unit_only_over_what_it_was_made_from() {
        let registry = Registry::new(MemKv::new(), "/fleet/");
        let units = UnitsRole::new(registry.clone());
        for (name, exec) in [("b.service", "/bin/old"), ("c.service", "/bin/changed")] {
            let name: UnitName = name.parse().unwrap();
            units
                .create_unit(&name, &file(exec), DesiredState::Loaded)
                .await
                .unwrap();
        }
        let m1: MachineId = "m1".parse().unwrap();
        let plan = ImportPlan {
            marks: vec![MigrationRecord {
                machine: m1.clone(),
                since: 1,
                units: 1,
            }],
            units: vec![
                unit("a.service", "/bin/a", &[&m1], None),
                unit("b.service", "/bin/b", &[], Some(file("/bin/old").hash())),
                // Planned over another file than the one ours now has.
                unit("c.service", "/bin/c", &[], Some(file("/bin/old").hash())),
                // Planned as new, but ours has it meanwhile.
                unit("b.service", "/bin/d", &[], None),
            ],
        };
        let outcomes = Importer::new(registry.clone()).apply(&plan).await.unwrap();
        let written: Vec<bool> = outcomes
            .iter()
            .map(|o| matches!(o, ImportOutcome::Written(_)))
            .collect();
        assert_eq!(written, [true, true, false, false]);
        let keys = registry.keys();
        assert!(has(&registry, &keys.migrating(&m1)).await);
        let a: UnitName = "a.service".parse().unwrap();
        assert!(has(&registry, &keys.schedule(&m1, &a)).await);
        assert!(has(&registry, &keys.placement(&a, &m1)).await);
        let hash_of = |name: &'static str| {
            let registry = registry.clone();
            async move {
                let unit = registry.unit(&name.parse().unwrap()).await.unwrap();
                unit.unwrap().hash()
            }
        };
        assert_eq!(hash_of("b.service").await, file("/bin/b").hash());
        assert_eq!(hash_of("c.service").await, file("/bin/changed").hash());
    }

    #[tokio::test]
    async fn a_batch_that_finds_a_unit_there_is_written_unit_by_unit() {
        let registry = Registry::new(MemKv::new(), "/fleet/");
        let name: UnitName = "x.service".parse().unwrap();
        UnitsRole::new(registry.clone())
            .create_unit(&name, &file("/bin/x"), DesiredState::Loaded)
            .await
            .unwrap();
        let m1: MachineId = "m1".parse().unwrap();
        // Planned before x.service appeared in ours: one batch, whose compare fails.
        let plan = ImportPlan {
            marks: vec![],
            units: (0..5)
                .map(|i| unit(&format!("u{i}.service"), "/bin/u", &[&m1], None))
                .chain([unit("x.service", "/bin/other", &[&m1], None)])
                .collect(),
        };
        let before = registry.snapshot().await.unwrap().revision;
        let outcomes = Importer::new(registry.clone()).apply(&plan).await.unwrap();
        let written: Vec<bool> = outcomes
            .iter()
            .map(|o| matches!(o, ImportOutcome::Written(_)))
            .collect();
        assert_eq!(written, [true, true, true, true, true, false]);
        // The failed batch wrote nothing; each unit then took a transaction of its own.
        assert_eq!(registry.snapshot().await.unwrap().revision, before + 5);
        let x = registry.unit(&name).await.unwrap().unwrap();
        assert_eq!(x.hash(), file("/bin/x").hash());
        assert!(!has(&registry, &registry.keys().schedule(&m1, &name)).await);
        // Planned on a registry that holds none of them: all six in one transaction.
        let fresh = Registry::new(MemKv::new(), "/fleet/");
        let before = fresh.snapshot().await.unwrap().revision;
        Importer::new(fresh.clone()).apply(&plan).await.unwrap();
        assert_eq!(fresh.snapshot().await.unwrap().revision, before + 1);
    }

    #[test]
    fn a_file_is_taken_only_with_its_own_hash_and_options_ours_honours() {
        let name: UnitName = "a.service".parse().unwrap();
        let text = b"[Service]\r\nExecStart=/bin/sleep \\\n 1\n";
        let hash = UnitFile::parse(text).unwrap().hash().to_string();
        assert!(check_file(&name, text, &hash).is_ok());
        let other = "1".repeat(40);
        assert!(matches!(
            check_file(&name, text, &other),
            Err(FileRefusal::HashDiffers { claimed, .. }) if claimed == other
        ));
        let odd = b"[X-Fleet]\nMachineOf=a.service\n";
        let hash = UnitFile::parse(odd).unwrap().hash().to_string();
        assert!(matches!(
            check_file(&name, odd, &hash),
            Err(FileRefusal::File(_))
        ));
        assert!(matches!(
            check_file(&name, b"[Unit\nA=b\n", &hash),
            Err(FileRefusal::File(_))
        ));
    }
}
