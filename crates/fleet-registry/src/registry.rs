//! The registry's connection (one [`Kv`], one key prefix) and its read-only views: units,
//! files, schedules, machines and states, each read at one revision.
//!
//! Nothing here writes. Writes go through the handle of a role, each over a `Registry`, each
//! able to write only its own keys (docs/registry.md has the table of roles and prefixes):
//! [`UnitsRole`](crate::UnitsRole) (fleetctl, the HTTP API), [`MachineRole`](crate::MachineRole)
//! (one machine's agent and presence), [`EngineRole`](crate::EngineRole) and the
//! [`Leadership`](crate::Leadership) it wins (the engine). The raw store stays private to the
//! crate, so that no caller writes around its role.

use fleet_core::{MachineId, MachineInfo, UnitFile, UnitHash, UnitName};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use tracing::debug;

use crate::error::{RegistryError, Result};
use crate::keys::Keys;
use crate::kv::{
    KeyValue, Kv, KvError, MAX_TXN_OPS, Revision, Txn, TxnOp, TxnOpResponse, TxnResult,
};
use crate::metadata;
use crate::read::{self, Listing};
use crate::records::{ScheduleEntry, Unit, UnitStateRecord};

/// How often a transaction of reads that passed its deadline is asked again before the read
/// fails, once etcd answered another piece of the read ([`Registry::read_txn`]). A bulk `fleetctl start` reads its names' records in such
/// transactions, 8 at once: in the million at fleetctl's 3 s, one of them passing 3 s while
/// etcd was behind failed the whole command at 250,000 units (docs/benchmarks.md, section 7).
pub(crate) const READ_RETRIES: u32 = 2;

/// The registry: one etcd (or fake) and one key prefix.
#[derive(Debug, Clone)]
pub struct Registry<K> {
    kv: K,
    keys: Keys,
}

pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("registry records always serialize")
}

pub(crate) fn put(key: String, value: Vec<u8>) -> TxnOp {
    TxnOp::Put {
        key,
        value,
        lease: None,
    }
}

pub(crate) fn delete(key: String) -> TxnOp {
    TxnOp::Delete { key, prefix: false }
}

/// A unit record read by name: unreadable, it fails the read.
fn decode_unit(keys: &Keys, kv: &KeyValue) -> Result<Unit> {
    Ok(read::unit(keys, kv)?)
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

    /// The raw store: crate-private, so that every write goes through a role. Tests get it
    /// through the `test-etcd` feature's `raw_kv`.
    pub(crate) fn kv(&self) -> &K {
        &self.kv
    }

    /// Sends `txn`; a failure to reach etcd names `op`.
    pub(crate) async fn txn(&self, txn: Txn, op: &'static str) -> Result<TxnResult> {
        self.kv.txn(txn).await.map_err(RegistryError::kv(op))
    }

    /// A transaction of `Get`s alone, one piece of a larger read, asked again
    /// ([`READ_RETRIES`] times at most) when it passes its deadline once `answered` says
    /// etcd answered another piece of the read: it writes nothing, so asking again is safe,
    /// and the pieces already answered stay read. An etcd that answered no piece may be
    /// hung, and a read of a hung etcd fails within its deadline, as a page's does.
    pub(crate) async fn read_txn(
        &self,
        txn: Txn,
        op: &'static str,
        answered: &AtomicBool,
    ) -> Result<TxnResult> {
        debug_assert!(txn.compares.is_empty() && txn.failure.is_empty());
        debug_assert!(txn.success.iter().all(|o| matches!(o, TxnOp::Get { .. })));
        let mut retries = READ_RETRIES;
        loop {
            match self.kv.txn(txn.clone()).await {
                Err(KvError::Timeout(after, _)) if retries > 0 && answered.load(Relaxed) => {
                    retries -= 1;
                    debug!(op, ?after, "a read passed its deadline, asking again");
                }
                res => {
                    answered.fetch_or(res.is_ok(), Relaxed);
                    return res.map_err(RegistryError::kv(op));
                }
            }
        }
    }

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
        let answered = AtomicBool::new(false);
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
            let res = self.read_txn(txn, "reading unit", &answered).await?;
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
        read::keyed_file(hash, &kv.value)
            .map(Some)
            .map_err(|detail| RegistryError::Corrupt { key, detail })
    }

    /// The files of `hashes` (at most [`MAX_TXN_OPS`]) in one transaction of `Get`s, each
    /// as [`Registry::file`] reads it: an agent given 100,000 units on 5,000 machines made
    /// 100,000 single reads of etcd, one per file (docs/benchmarks.md, "Scale II"). An etcd
    /// failure fails the call; a missing or corrupt file is that file's answer.
    pub async fn files_named(
        &self,
        hashes: &[UnitHash],
    ) -> Result<Vec<(UnitHash, Result<Option<UnitFile>>)>> {
        if hashes.len() > MAX_TXN_OPS {
            return Err(RegistryError::TooManyChanges {
                count: hashes.len(),
                max: MAX_TXN_OPS,
            });
        }
        let txn = Txn {
            compares: vec![],
            success: hashes
                .iter()
                .map(|hash| TxnOp::Get {
                    key: self.keys.file(hash),
                    prefix: false,
                })
                .collect(),
            failure: vec![],
        };
        // The same operation name as `file`: a caller's error reads the same either way.
        let res = self.txn(txn, "reading unit file").await?;
        Ok(hashes
            .iter()
            .zip(&res.responses)
            .map(|(hash, response)| {
                let kv = match response {
                    TxnOpResponse::Get(kvs) => kvs.first(),
                    _ => None,
                };
                let file = kv.map(|kv| {
                    read::keyed_file(hash, &kv.value).map_err(|detail| RegistryError::Corrupt {
                        key: self.keys.file(hash),
                        detail,
                    })
                });
                (*hash, file.transpose())
            })
            .collect())
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

    /// Whether `machine`'s schedule has a readable entry for `unit`: one key, which the
    /// machine's own role may read (issue 37: an agent-only host's API answers status and
    /// journal requests of its own units without reading the rest of the registry).
    pub async fn scheduled_on(&self, machine: &MachineId, unit: &UnitName) -> Result<bool> {
        let res = self
            .kv
            .range(&self.keys.schedule(machine, unit), false, None)
            .await
            .map_err(RegistryError::kv("reading a schedule entry"))?;
        Ok(res
            .kvs
            .iter()
            .any(|kv| read::schedule_entry(&self.keys, kv).is_ok()))
    }

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

    /// Every readable published unit state, sorted by unit then machine (the keys are
    /// machine-first; the order callers print and compare in is the unit's).
    pub async fn unit_states(&self) -> Result<Listing<Vec<UnitStateRecord>>> {
        let mut listing = self
            .states_under(&self.keys.states(), "listing unit states")
            .await?;
        // One key per (unit, machine): no two compare equal, so the unstable sort orders
        // them the same, and moves each record less than the stable one's merges (8.7 % of
        // fleetd serving 100,000 states, perf).
        listing
            .items
            .sort_unstable_by(|a, b| (&a.name, &a.machine).cmp(&(&b.name, &b.machine)));
        Ok(listing)
    }

    /// The readable states `machine` publishes, sorted by unit: one prefix, the one its
    /// etcd role may read.
    pub async fn machine_states(
        &self,
        machine: &MachineId,
    ) -> Result<Listing<Vec<UnitStateRecord>>> {
        self.states_under(&self.keys.machine_states(machine), "listing machine states")
            .await
    }

    async fn states_under(
        &self,
        prefix: &str,
        op: &'static str,
    ) -> Result<Listing<Vec<UnitStateRecord>>> {
        let res = self
            .kv
            .range(prefix, true, None)
            .await
            .map_err(RegistryError::kv(op))?;
        let mut skipped = Vec::new();
        let items = read::states(&self.keys, &res.kvs, &mut skipped);
        Ok(Listing {
            revision: res.revision,
            items,
            skipped,
        })
    }
}
