//! The units role: unit records, their files and the files' references, what fleetctl (and
//! the HTTP API) write. Nothing else is written through it: schedules belong to the engine's
//! leadership, presence and states to each machine's role.
//!
//! Invariants every write keeps, each in one transaction:
//! - a unit record exists only together with its file and its `file-ref` entry;
//! - a file with no `file-ref` entry left is deleted (garbage collection fleet never did);
//! - a unit record is replaced or its desired state changed only if it is unchanged since the
//!   caller read it (compare-and-swap on its mod revision).

use crate::events::log::{EventConfig, EventLog, EventStats};
use crate::keys::EventSource;
use fleet_core::{DesiredState, MachineId, UnitFile, UnitHash, UnitName};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use tracing::{debug, warn};

use crate::error::{RegistryError, Result};
use crate::keys::Key;
use crate::kv::{Compare, Kv, MAX_TXN_OPS, Revision, Txn, TxnOp, TxnOpResponse};
use crate::read::{self, Listing};
use crate::records::{ReplaceState, Unit, UnitRecord};
use crate::registry::{Registry, delete, encode, put};
use crate::watch::WatchHints;

mod batch;
mod change;

/// How many unreferenced files are collected at once after a write (each its own
/// transaction, conditional on its references being gone).
const COLLECTIONS_IN_FLIGHT: usize = 32;

#[cfg(test)]
pub(crate) use batch::txn_bytes;
pub use batch::{NewUnit, batches};
pub(crate) use batch::{Write, cut};
pub use change::{Change, change_batches, dropped_files};

/// What `create_unit` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    Created(Unit),
    /// A unit of that name already exists (possibly with other content); nothing was written.
    Exists(Unit),
}

/// Writes unit records, unit files and file references (`P/unit/`, `P/file/`,
/// `P/file-ref/`), and reads them back.
#[derive(Debug, Clone)]
pub struct UnitsRole<K> {
    registry: Registry<K>,
}

/// The files a unit record keeps referenced: its own, and a rolling replace's previous one.
fn referenced(record: &UnitRecord) -> Vec<UnitHash> {
    let mut hashes = vec![record.hash];
    if let Some(r) = &record.replace.rollout
        && r.previous != record.hash
    {
        hashes.push(r.previous);
    }
    hashes
}

/// Files `old` referenced that `new` does not.
fn dropped_hashes(old: &UnitRecord, new: &UnitRecord) -> Vec<UnitHash> {
    let keep = referenced(new);
    referenced(old)
        .into_iter()
        .filter(|h| !keep.contains(h))
        .collect()
}

impl<K: Kv> UnitsRole<K> {
    pub fn new(registry: Registry<K>) -> UnitsRole<K> {
        UnitsRole { registry }
    }

    /// The writer of user actions' events (`P/event/user/`, issue 41).
    pub fn event_log(&self, cfg: EventConfig, stats: EventStats) -> EventLog {
        EventLog::start(self.registry.clone(), EventSource::User, cfg, stats, false)
    }

    /// The shared read-only views (snapshots, listings, leader), as every role has them.
    pub fn registry(&self) -> &Registry<K> {
        &self.registry
    }

    // ---- reads ----------------------------------------------------------------------------

    /// See [`Registry::unit`].
    pub async fn unit(&self, name: &UnitName) -> Result<Option<Unit>> {
        self.registry.unit(name).await
    }

    /// See [`Registry::units_named`].
    pub async fn units_named(
        &self,
        names: &BTreeSet<UnitName>,
    ) -> Result<BTreeMap<UnitName, Unit>> {
        self.registry.units_named(names).await
    }

    /// See [`Registry::units`].
    pub async fn units(&self) -> Result<Listing<Vec<Unit>>> {
        self.registry.units().await
    }

    /// See [`Registry::file`].
    pub async fn file(&self, hash: &UnitHash) -> Result<Option<UnitFile>> {
        self.registry.file(hash).await
    }

    /// See [`Registry::unit_file`].
    pub async fn unit_file(&self, unit: &Unit) -> Result<UnitFile> {
        self.registry.unit_file(unit).await
    }

    /// A watch that wakes on every change of a unit record from revision `from` on (a waiter
    /// reads again on each).
    pub fn watch_units(&self, from: Revision) -> WatchHints {
        let kv = self.registry.kv().clone();
        WatchHints::start(kv, self.registry.keys().units(), from)
    }

    // ---- writes ---------------------------------------------------------------------------

    /// Creates `name` with `file` and `desired` if no unit of that name exists.
    pub async fn create_unit(
        &self,
        name: &UnitName,
        file: &UnitFile,
        desired: DesiredState,
    ) -> Result<CreateOutcome> {
        let record = UnitRecord {
            name: name.clone(),
            hash: file.hash(),
            desired,
            restart: 0,
            replace: ReplaceState::default(),
        };
        let unit_key = self.registry.keys().unit(name);
        let txn = Txn {
            compares: vec![Compare::absent(&unit_key)],
            success: self.unit_write_ops(&record, file),
            failure: vec![TxnOp::Get {
                key: unit_key.clone(),
                prefix: false,
            }],
        };
        let res = self.registry.txn(txn, "creating unit").await?;
        if res.succeeded {
            debug!(unit = %name, hash = %record.hash, "created unit");
            return Ok(CreateOutcome::Created(Unit {
                record,
                mod_revision: res.revision,
            }));
        }
        match res.responses.first() {
            Some(TxnOpResponse::Get(kvs)) if !kvs.is_empty() => Ok(CreateOutcome::Exists(
                read::unit(self.registry.keys(), &kvs[0])?,
            )),
            // Deleted between the compare and the read of the failure branch cannot happen
            // (one revision), so an empty answer means a store bug; report it as a conflict.
            _ => Err(RegistryError::Conflict(name.clone())),
        }
    }

    /// Replaces `existing` with `file` and `desired`, if it is unchanged since it was read,
    /// keeping its placement. The old file is garbage-collected when no unit refers to it.
    pub async fn replace_unit(
        &self,
        existing: &Unit,
        file: &UnitFile,
        desired: DesiredState,
    ) -> Result<Unit> {
        let replace = ReplaceState {
            placement: existing.record.replace.placement,
            ..ReplaceState::default()
        };
        self.replace_unit_with(existing, file, desired, replace)
            .await
    }

    /// Replaces `existing` with the replace options `replace` (no restart, a new placement, a
    /// rolling replace that keeps the previous file referenced until it is finished).
    pub async fn replace_unit_with(
        &self,
        existing: &Unit,
        file: &UnitFile,
        desired: DesiredState,
        replace: ReplaceState,
    ) -> Result<Unit> {
        let name = existing.name();
        let record = UnitRecord {
            name: name.clone(),
            hash: file.hash(),
            desired,
            restart: existing.record.restart,
            replace,
        };
        let mut success = self.unit_write_ops(&record, file);
        let dropped = dropped_hashes(&existing.record, &record);
        success.extend(
            dropped
                .iter()
                .map(|h| delete(self.registry.keys().file_ref(h, name))),
        );
        let mod_revision = self.cas(existing, success, "replacing unit").await?;
        debug!(unit = %name, old = %existing.hash(), new = %record.hash, "replaced unit");
        self.collect_committed(&dropped).await;
        Ok(Unit {
            record,
            mod_revision,
        })
    }

    /// Marks more machines of a rolling replace as updated (they get the new version).
    pub async fn advance_rollout(
        &self,
        existing: &Unit,
        machines: impl IntoIterator<Item = MachineId>,
    ) -> Result<Unit> {
        let mut record = existing.record.clone();
        if let Some(rollout) = &mut record.replace.rollout {
            rollout.updated.extend(machines);
        }
        self.write_record(existing, record, "advancing rolling replace")
            .await
    }

    /// Ends a rolling replace: every machine gets the new version, the previous file goes.
    pub async fn finish_rollout(&self, existing: &Unit) -> Result<Unit> {
        let mut record = existing.record.clone();
        record.replace.rollout = None;
        let dropped = dropped_hashes(&existing.record, &record);
        let key = self.registry.keys().unit(existing.name());
        let mut success = vec![put(key.clone(), encode(&record))];
        success.extend(
            dropped
                .iter()
                .map(|h| delete(self.registry.keys().file_ref(h, existing.name()))),
        );
        let mod_revision = self
            .cas(existing, success, "finishing rolling replace")
            .await?;
        self.collect_committed(&dropped).await;
        Ok(Unit {
            record,
            mod_revision,
        })
    }

    /// Sets the desired state of `existing`, if it is unchanged since it was read.
    pub async fn set_desired(&self, existing: &Unit, desired: DesiredState) -> Result<Unit> {
        let mut record = UnitRecord {
            desired,
            ..existing.record.clone()
        };
        // The machine a replace in fleet's form kept is for the launch that follows it; once
        // the unit is made inactive again, the next launch places it afresh.
        if desired == DesiredState::Inactive {
            record.replace.prefer = None;
        }
        self.write_record(existing, record, "setting desired state")
            .await
    }

    /// Asks every machine running `existing` to restart it once more (if unchanged since read).
    pub async fn request_restart(&self, existing: &Unit) -> Result<Unit> {
        let record = UnitRecord {
            restart: existing.record.restart + 1,
            ..existing.record.clone()
        };
        self.write_record(existing, record, "requesting restart")
            .await
    }

    async fn write_record(
        &self,
        existing: &Unit,
        record: UnitRecord,
        op: &'static str,
    ) -> Result<Unit> {
        let ops = vec![put(
            self.registry.keys().unit(existing.name()),
            encode(&record),
        )];
        let mod_revision = self.cas(existing, ops, op).await?;
        Ok(Unit {
            record,
            mod_revision,
        })
    }

    /// Applies `ops` if `existing` is unchanged since it was read (compare-and-swap on its
    /// mod revision); `Conflict` otherwise. Returns the revision written at.
    async fn cas(&self, existing: &Unit, ops: Vec<TxnOp>, op: &'static str) -> Result<Revision> {
        let txn = Txn {
            compares: vec![Compare::mod_revision(
                self.registry.keys().unit(existing.name()),
                existing.mod_revision,
            )],
            success: ops,
            failure: vec![],
        };
        let res = self.registry.txn(txn, op).await?;
        if !res.succeeded {
            return Err(RegistryError::Conflict(existing.name().clone()));
        }
        Ok(res.revision)
    }

    /// Deletes `existing` (if unchanged since read) and collects its file.
    pub async fn destroy_unit(&self, existing: &Unit) -> Result<()> {
        let name = existing.name();
        let ops = referenced(&existing.record)
            .iter()
            .map(|h| delete(self.registry.keys().file_ref(h, name)))
            .chain([delete(self.registry.keys().unit(name))])
            .collect();
        self.cas(existing, ops, "destroying unit").await?;
        debug!(unit = %name, "destroyed unit");
        self.collect_committed(&referenced(&existing.record)).await;
        Ok(())
    }

    /// Deletes the record at `name` that cannot be read ([`RegistryError::Corrupt`] from
    /// [`UnitsRole::unit`]), if it is still the value read, with every file reference under
    /// that name, and collects those files. Returns false when no record is there; a record
    /// that reads fine now (rewritten meanwhile) is a `Conflict`, to be re-read and destroyed
    /// the usual way.
    pub async fn destroy_unreadable_unit(&self, name: &UnitName) -> Result<bool> {
        let key = self.registry.keys().unit(name);
        let op = "destroying unit";
        let res = self.registry.kv().range(&key, false, None).await;
        let Some(record) = res.map_err(RegistryError::kv(op))?.kvs.pop() else {
            return Ok(false);
        };
        if read::unit(self.registry.keys(), &record).is_ok() {
            return Err(RegistryError::Conflict(name.clone()));
        }
        // The record cannot say which files it used: its references, `file-ref/<hash>/<name>`,
        // can. A writer of the same name would have to replace the record first, which the
        // compare below catches.
        let refs = self
            .registry
            .kv()
            .range(&self.registry.keys().all_file_refs(), true, None)
            .await;
        let hashes: Vec<UnitHash> = refs
            .map_err(RegistryError::kv(op))?
            .kvs
            .iter()
            .filter_map(|kv| match Key::parse(self.registry.keys(), &kv.key) {
                Some(Key::FileRef { hash, unit }) if unit == *name => Some(hash),
                _ => None,
            })
            .take(MAX_TXN_OPS - 1)
            .collect();
        let txn = Txn {
            compares: vec![Compare::mod_revision(&key, record.mod_revision)],
            success: hashes
                .iter()
                .map(|h| delete(self.registry.keys().file_ref(h, name)))
                .chain([delete(key)])
                .collect(),
            failure: vec![],
        };
        let res = self.registry.txn(txn, op).await?;
        if !res.succeeded {
            return Err(RegistryError::Conflict(name.clone()));
        }
        debug!(unit = %name, files = hashes.len(), "destroyed unreadable unit record");
        self.collect_committed(&hashes).await;
        Ok(true)
    }

    /// The ops that write a unit record with its file and reference. The file is always
    /// (re)written: a concurrent collection of the same hash may have just deleted it.
    pub(crate) fn unit_write_ops(&self, record: &UnitRecord, file: &UnitFile) -> Vec<TxnOp> {
        vec![
            put(
                self.registry.keys().file(&record.hash),
                file.canonical().into_bytes(),
            ),
            put(
                self.registry.keys().file_ref(&record.hash, &record.name),
                Vec::new(),
            ),
            put(self.registry.keys().unit(&record.name), encode(record)),
        ]
    }

    /// Collects the files a committed write stopped referring to. The write has landed, so a
    /// failed collection must not turn it into an error (a destroy answered "failed" for a
    /// unit that is gone): it is logged, and the file stays, unreferenced, until a later write
    /// of the same content references it again or a later collection of it succeeds.
    /// The collections go [`COLLECTIONS_IN_FLIGHT`] at a time: a destroy of 300 units with
    /// 300 distinct files spent about 0.5 s collecting them one after another.
    async fn collect_committed<'a>(&self, hashes: impl IntoIterator<Item = &'a UnitHash>) {
        futures::stream::iter(hashes)
            .for_each_concurrent(COLLECTIONS_IN_FLIGHT, |hash| async move {
                if let Err(e) = self.collect_file(hash).await {
                    warn!(hash = %hash, error = %e, "collecting an unreferenced unit file failed; it stays");
                }
            })
            .await;
    }

    /// Deletes the file `hash` if no unit refers to it. Atomic against a concurrent writer:
    /// a writer adds its reference in the same transaction as the file, so either our
    /// compare sees the reference, or the writer re-creates the file after us.
    pub async fn collect_file(&self, hash: &UnitHash) -> Result<()> {
        let txn = Txn {
            compares: vec![Compare::prefix_empty(self.registry.keys().file_refs(hash))],
            success: vec![delete(self.registry.keys().file(hash))],
            failure: vec![],
        };
        let res = self.registry.txn(txn, "collecting unit file").await?;
        if res.succeeded {
            debug!(hash = %hash, "collected unreferenced unit file");
        }
        Ok(())
    }
}
