//! Typed registry operations on top of any [`Kv`].
//!
//! Invariants every write keeps, each in one transaction:
//! - a unit record exists only together with its file and its `file-ref` entry;
//! - a file with no `file-ref` entry left is deleted (garbage collection fleet never did);
//! - a unit record is replaced or its desired state changed only if it is unchanged since the
//!   caller read it (compare-and-swap on its mod revision).

use fleet_core::{DesiredState, MachineId, MachineInfo, UnitFile, UnitHash, UnitName};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tracing::debug;

use crate::error::{RegistryError, Result};
use crate::keys::Keys;
use crate::kv::{
    CmpOp, CmpTarget, Compare, KeyValue, Kv, LeaseId, Revision, Txn, TxnOp, TxnOpResponse,
};
use crate::leader::MAX_TXN_OPS;
use crate::metadata;
use crate::read::{self, Listing};
use crate::records::{ReplaceState, ScheduleEntry, Unit, UnitRecord, UnitStateRecord};

/// The registry: one etcd (or fake) and one key prefix.
#[derive(Debug, Clone)]
pub struct Registry<K> {
    kv: K,
    keys: Keys,
}

/// What `create_unit` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    Created(Unit),
    /// A unit of that name already exists (possibly with other content); nothing was written.
    Exists(Unit),
}

/// Guards an engine write: it applies only while `key` still holds `value` (our leadership).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub key: String,
    pub value: String,
}

/// A machine's presence: the lease its record and published states hang on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Presence {
    pub lease: LeaseId,
    /// True when a restarted fleetd took over its predecessor's still-live lease.
    pub resumed: bool,
}

pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("registry records always serialize")
}

/// A unit record read by name: unreadable, it fails the read.
fn decode_unit(keys: &Keys, kv: &KeyValue) -> Result<Unit> {
    Ok(read::unit(keys, kv)?)
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

fn put(key: String, value: Vec<u8>) -> TxnOp {
    TxnOp::Put {
        key,
        value,
        lease: None,
    }
}

fn delete(key: String) -> TxnOp {
    TxnOp::Delete { key, prefix: false }
}

impl<K: Kv> Registry<K> {
    pub fn new(kv: K, prefix: &str) -> Registry<K> {
        Registry {
            kv,
            keys: Keys::new(prefix),
        }
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn kv(&self) -> &K {
        &self.kv
    }

    // ---- units ------------------------------------------------------------------------

    pub async fn unit(&self, name: &UnitName) -> Result<Option<Unit>> {
        let res = self
            .kv
            .range(&self.keys.unit(name), false, None)
            .await
            .map_err(RegistryError::kv("reading unit"))?;
        let keys = &self.keys;
        res.kvs.first().map(|kv| decode_unit(keys, kv)).transpose()
    }

    /// The units of `names` that exist: one transaction of `Get`s per [`MAX_TXN_OPS`] names
    /// instead of one request per name, and unlike [`Registry::units`] it reads only those
    /// records, however many other units the registry holds. A corrupt record fails the call
    /// only if it is one of `names`.
    pub async fn units_named(
        &self,
        names: &BTreeSet<UnitName>,
    ) -> Result<BTreeMap<UnitName, Unit>> {
        let names: Vec<&UnitName> = names.iter().collect();
        let mut units = BTreeMap::new();
        for chunk in names.chunks(MAX_TXN_OPS) {
            let txn = Txn {
                compares: vec![],
                success: chunk
                    .iter()
                    .map(|name| TxnOp::Get {
                        key: self.keys.unit(name),
                        prefix: false,
                    })
                    .collect(),
                failure: vec![],
            };
            // The same operation name as `unit`: a caller's error reads the same either way.
            let res = self
                .kv
                .txn(txn)
                .await
                .map_err(RegistryError::kv("reading unit"))?;
            for (name, response) in chunk.iter().zip(&res.responses) {
                if let TxnOpResponse::Get(kvs) = response
                    && let Some(kv) = kvs.first()
                {
                    units.insert((*name).clone(), decode_unit(&self.keys, kv)?);
                }
            }
        }
        Ok(units)
    }

    /// Every readable unit, sorted by name, at one revision.
    pub async fn units(&self) -> Result<Listing<Vec<Unit>>> {
        let res = self
            .kv
            .range(&self.keys.units(), true, None)
            .await
            .map_err(RegistryError::kv("listing units"))?;
        let mut skipped = Vec::new();
        let items = read::all(&res.kvs, |kv| read::unit(&self.keys, kv), &mut skipped);
        Ok(Listing {
            revision: res.revision,
            items,
            skipped,
        })
    }

    /// The unit file stored under `hash`.
    pub async fn file(&self, hash: &UnitHash) -> Result<Option<UnitFile>> {
        let key = self.keys.file(hash);
        let res = self
            .kv
            .range(&key, false, None)
            .await
            .map_err(RegistryError::kv("reading unit file"))?;
        let Some(kv) = res.kvs.first() else {
            return Ok(None);
        };
        UnitFile::parse(&kv.value)
            .map(Some)
            .map_err(|e| RegistryError::Corrupt {
                key,
                detail: e.to_string(),
            })
    }

    /// Every readable unit file by hash, read at `revision` (or the latest).
    pub async fn files(
        &self,
        revision: Option<Revision>,
    ) -> Result<Listing<BTreeMap<UnitHash, UnitFile>>> {
        let res = self
            .kv
            .range(&self.keys.files(), true, revision)
            .await
            .map_err(RegistryError::kv("listing unit files"))?;
        let mut skipped = Vec::new();
        let files = read::all(&res.kvs, |kv| read::file(&self.keys, kv), &mut skipped);
        Ok(Listing {
            revision: res.revision,
            items: files.into_iter().collect(),
            skipped,
        })
    }

    /// The file of `unit`, which must exist (the registry writes both in one transaction).
    pub async fn unit_file(&self, unit: &Unit) -> Result<UnitFile> {
        self.file(&unit.hash())
            .await?
            .ok_or_else(|| RegistryError::FileMissing {
                unit: unit.name().clone(),
                hash: unit.hash(),
            })
    }

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
        let unit_key = self.keys.unit(name);
        let txn = Txn {
            compares: vec![Compare::absent(&unit_key)],
            success: self.unit_write_ops(&record, file),
            failure: vec![TxnOp::Get {
                key: unit_key.clone(),
                prefix: false,
            }],
        };
        let res = self
            .kv
            .txn(txn)
            .await
            .map_err(RegistryError::kv("creating unit"))?;
        if res.succeeded {
            debug!(unit = %name, hash = %record.hash, "created unit");
            return Ok(CreateOutcome::Created(Unit {
                record,
                mod_revision: res.revision,
            }));
        }
        match res.responses.first() {
            Some(TxnOpResponse::Get(kvs)) if !kvs.is_empty() => {
                Ok(CreateOutcome::Exists(decode_unit(&self.keys, &kvs[0])?))
            }
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
        success.extend(dropped.iter().map(|h| delete(self.keys.file_ref(h, name))));
        let mod_revision = self.cas(existing, success, "replacing unit").await?;
        debug!(unit = %name, old = %existing.hash(), new = %record.hash, "replaced unit");
        for hash in &dropped {
            self.collect_file(hash).await?;
        }
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
        let key = self.keys.unit(existing.name());
        let mut success = vec![put(key.clone(), encode(&record))];
        success.extend(
            dropped
                .iter()
                .map(|h| delete(self.keys.file_ref(h, existing.name()))),
        );
        let mod_revision = self
            .cas(existing, success, "finishing rolling replace")
            .await?;
        for hash in &dropped {
            self.collect_file(hash).await?;
        }
        Ok(Unit {
            record,
            mod_revision,
        })
    }

    /// Sets the desired state of `existing`, if it is unchanged since it was read.
    pub async fn set_desired(&self, existing: &Unit, desired: DesiredState) -> Result<Unit> {
        let record = UnitRecord {
            desired,
            ..existing.record.clone()
        };
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
        let ops = vec![put(self.keys.unit(existing.name()), encode(&record))];
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
                self.keys.unit(existing.name()),
                existing.mod_revision,
            )],
            success: ops,
            failure: vec![],
        };
        let res = self.kv.txn(txn).await.map_err(RegistryError::kv(op))?;
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
            .map(|h| delete(self.keys.file_ref(h, name)))
            .chain([delete(self.keys.unit(name))])
            .collect();
        self.cas(existing, ops, "destroying unit").await?;
        debug!(unit = %name, "destroyed unit");
        for hash in referenced(&existing.record) {
            self.collect_file(&hash).await?;
        }
        Ok(())
    }

    /// Deletes the record at `name` that cannot be read ([`RegistryError::Corrupt`] from
    /// [`Registry::unit`]), if it is still the value read, with every file reference under
    /// that name, and collects those files. Returns false when no record is there; a record
    /// that reads fine now (rewritten meanwhile) is a `Conflict`, to be re-read and destroyed
    /// the usual way.
    pub async fn destroy_unreadable_unit(&self, name: &UnitName) -> Result<bool> {
        let key = self.keys.unit(name);
        let op = "destroying unit";
        let res = self.kv.range(&key, false, None).await;
        let Some(record) = res.map_err(RegistryError::kv(op))?.kvs.pop() else {
            return Ok(false);
        };
        if read::unit(&self.keys, &record).is_ok() {
            return Err(RegistryError::Conflict(name.clone()));
        }
        // The record cannot say which files it used: its references, `file-ref/<hash>/<name>`,
        // can. A writer of the same name would have to replace the record first, which the
        // compare below catches.
        let base = self.keys.all_file_refs();
        let refs = self.kv.range(&base, true, None).await;
        let suffix = format!("/{name}");
        let hashes: Vec<UnitHash> = refs
            .map_err(RegistryError::kv(op))?
            .kvs
            .iter()
            .filter(|kv| kv.key.ends_with(&suffix))
            .filter_map(|kv| kv.key[base.len()..kv.key.len() - suffix.len()].parse().ok())
            .take(MAX_TXN_OPS - 1)
            .collect();
        let txn = Txn {
            compares: vec![Compare::mod_revision(&key, record.mod_revision)],
            success: hashes
                .iter()
                .map(|h| delete(self.keys.file_ref(h, name)))
                .chain([delete(key)])
                .collect(),
            failure: vec![],
        };
        let res = self.kv.txn(txn).await.map_err(RegistryError::kv(op))?;
        if !res.succeeded {
            return Err(RegistryError::Conflict(name.clone()));
        }
        debug!(unit = %name, files = hashes.len(), "destroyed unreadable unit record");
        for hash in &hashes {
            self.collect_file(hash).await?;
        }
        Ok(true)
    }

    /// The ops that write a unit record with its file and reference. The file is always
    /// (re)written: a concurrent collection of the same hash may have just deleted it.
    fn unit_write_ops(&self, record: &UnitRecord, file: &UnitFile) -> Vec<TxnOp> {
        vec![
            put(self.keys.file(&record.hash), file.canonical().into_bytes()),
            put(self.keys.file_ref(&record.hash, &record.name), Vec::new()),
            put(self.keys.unit(&record.name), encode(record)),
        ]
    }

    /// Deletes the file `hash` if no unit refers to it. Atomic against a concurrent writer:
    /// a writer adds its reference in the same transaction as the file, so either our
    /// compare sees the reference, or the writer re-creates the file after us.
    pub async fn collect_file(&self, hash: &UnitHash) -> Result<()> {
        let txn = Txn {
            compares: vec![Compare::prefix_empty(self.keys.file_refs(hash))],
            success: vec![delete(self.keys.file(hash))],
            failure: vec![],
        };
        let res = self
            .kv
            .txn(txn)
            .await
            .map_err(RegistryError::kv("collecting unit file"))?;
        if res.succeeded {
            debug!(hash = %hash, "collected unreferenced unit file");
        }
        Ok(())
    }

    // ---- schedule ---------------------------------------------------------------------

    /// Every readable schedule entry of `machine`, at one revision.
    pub async fn machine_schedule(
        &self,
        machine: &MachineId,
    ) -> Result<Listing<Vec<ScheduleEntry>>> {
        let res = self
            .kv
            .range(&self.keys.machine_schedule(machine), true, None)
            .await
            .map_err(RegistryError::kv("reading machine schedule"))?;
        let mut skipped = Vec::new();
        let read = |kv: &KeyValue| read::schedule_entry(&self.keys, kv);
        let items = read::all(&res.kvs, read, &mut skipped);
        Ok(Listing {
            revision: res.revision,
            items,
            skipped,
        })
    }

    /// Writes and deletes schedule entries in one transaction, fenced by leadership if given.
    pub async fn apply_schedule(
        &self,
        fence: Option<&Fence>,
        put_entries: &[ScheduleEntry],
        delete_entries: &[(MachineId, UnitName)],
    ) -> Result<Revision> {
        let mut ops: Vec<TxnOp> = put_entries
            .iter()
            .map(|e| put(self.keys.schedule(&e.machine, &e.name), encode(e)))
            .collect();
        ops.extend(
            delete_entries
                .iter()
                .map(|(m, n)| delete(self.keys.schedule(m, n))),
        );
        let txn = Txn {
            compares: fence
                .map(|f| vec![Compare::value(&f.key, f.value.as_bytes().to_vec())])
                .unwrap_or_default(),
            success: ops,
            failure: vec![],
        };
        let res = self
            .kv
            .txn(txn)
            .await
            .map_err(RegistryError::kv("writing schedule"))?;
        if !res.succeeded {
            return Err(RegistryError::LostLeadership);
        }
        Ok(res.revision)
    }

    // ---- machines -----------------------------------------------------------------------

    /// Registers this machine's presence on a new lease of `ttl`. If the record already exists
    /// on `previous` (our own lease from before a restart, still alive), it is taken over and
    /// the units' published states survive; any other holder is a duplicate machine ID.
    pub async fn register_machine(
        &self,
        info: &MachineInfo,
        ttl: Duration,
        previous: Option<LeaseId>,
    ) -> Result<Presence> {
        let key = self.keys.machine(&info.id);
        if let Some(lease) = previous
            && let Some(presence) = self.resume_presence(info, lease).await?
        {
            return Ok(presence);
        }
        let lease = self
            .kv
            .grant(ttl)
            .await
            .map_err(RegistryError::kv("granting machine lease"))?;
        let txn = Txn {
            compares: vec![Compare::absent(&key)],
            success: vec![TxnOp::Put {
                key,
                value: encode(info),
                lease: Some(lease),
            }],
            failure: vec![],
        };
        let res = self
            .kv
            .txn(txn)
            .await
            .map_err(RegistryError::kv("registering machine"))?;
        if !res.succeeded {
            // Best effort: the unused lease would expire by itself anyway.
            let _ = self.kv.revoke(lease).await;
            return Err(RegistryError::DuplicateMachine(info.id.clone()));
        }
        Ok(Presence {
            lease,
            resumed: false,
        })
    }

    async fn resume_presence(
        &self,
        info: &MachineInfo,
        lease: LeaseId,
    ) -> Result<Option<Presence>> {
        let key = self.keys.machine(&info.id);
        if self.kv.keep_alive(lease).await.is_err() {
            return Ok(None);
        }
        let txn = Txn {
            compares: vec![Compare {
                key: key.clone(),
                prefix: false,
                op: CmpOp::Equal,
                target: CmpTarget::Lease(lease.0),
            }],
            success: vec![TxnOp::Put {
                key,
                value: encode(info),
                lease: Some(lease),
            }],
            failure: vec![],
        };
        let res = self
            .kv
            .txn(txn)
            .await
            .map_err(RegistryError::kv("resuming machine presence"))?;
        Ok(res.succeeded.then_some(Presence {
            lease,
            resumed: true,
        }))
    }

    /// Refreshes a presence lease; `Kv { cause: LeaseNotFound }` once it has expired.
    pub async fn keep_alive(&self, presence: &Presence) -> Result<()> {
        self.kv
            .keep_alive(presence.lease)
            .await
            .map_err(RegistryError::kv("refreshing machine lease"))
    }

    /// Ends a presence: the machine record and every state published under it vanish.
    pub async fn unregister(&self, presence: &Presence) -> Result<()> {
        self.kv
            .revoke(presence.lease)
            .await
            .map_err(RegistryError::kv("revoking machine lease"))
    }

    /// Every live machine with a readable record, sorted by ID, with its dynamic metadata
    /// over its configured metadata (read at the same revision).
    pub async fn machines(&self) -> Result<Listing<Vec<MachineInfo>>> {
        let res = self
            .kv
            .range(&self.keys.machines(), true, None)
            .await
            .map_err(RegistryError::kv("listing machines"))?;
        let dynamic = self.dynamic_metadata_at(Some(res.revision)).await?;
        let mut skipped = dynamic.skipped;
        let mut items = read::all(&res.kvs, |kv| read::machine(&self.keys, kv), &mut skipped);
        for machine in &mut items {
            metadata::apply_dynamic(machine, &dynamic.items);
        }
        Ok(Listing {
            revision: res.revision,
            items,
            skipped,
        })
    }

    // ---- unit states ----------------------------------------------------------------------

    /// Publishes the state of a unit on this machine, living as long as `presence`.
    pub async fn publish_state(&self, presence: &Presence, state: &UnitStateRecord) -> Result<()> {
        let txn = Txn {
            compares: vec![],
            success: vec![TxnOp::Put {
                key: self.keys.state(&state.name, &state.machine),
                value: encode(state),
                lease: Some(presence.lease),
            }],
            failure: vec![],
        };
        self.kv
            .txn(txn)
            .await
            .map_err(RegistryError::kv("publishing unit state"))?;
        Ok(())
    }

    /// Withdraws the state of `name` on `machine` (only that machine's entry).
    pub async fn remove_state(&self, name: &UnitName, machine: &MachineId) -> Result<()> {
        let txn = Txn {
            compares: vec![],
            success: vec![delete(self.keys.state(name, machine))],
            failure: vec![],
        };
        self.kv
            .txn(txn)
            .await
            .map_err(RegistryError::kv("removing unit state"))?;
        Ok(())
    }

    /// Every readable published unit state, sorted by unit then machine.
    pub async fn unit_states(&self) -> Result<Listing<Vec<UnitStateRecord>>> {
        let res = self
            .kv
            .range(&self.keys.states(), true, None)
            .await
            .map_err(RegistryError::kv("listing unit states"))?;
        let mut skipped = Vec::new();
        let items = read::all(&res.kvs, |kv| read::state(&self.keys, kv), &mut skipped);
        Ok(Listing {
            revision: res.revision,
            items,
            skipped,
        })
    }
}
