//! Changing many existing units in few transactions: `fleetctl destroy` and `start
//! --replace` of 300 units wrote one transaction per unit (after a read of it, and followed by
//! a collection of its file), 32 at a time, so each machine saw its units' changes arrive
//! over 1.5–2.3 s and stopped them as they came (docs/benchmarks.md, "Lifecycle latency").
//! A batch is one transaction that changes every unit of it or none, each guarded by the
//! compare-and-swap its single write would use: the record is unchanged since it was read.
//!
//! Batches fit etcd's default `--max-txn-ops` ([`MAX_TXN_OPS`]) as create's do
//! ([`change_batches`] is the pure rule). A batch that finds any of its units changed writes
//! nothing and says so; the caller then changes those units one by one, which re-reads each
//! and decides again. Files no longer referenced are collected after the batch lands, once
//! per distinct file ([`UnitsRole::collect_files`]); a failed collection leaves the file
//! (harmless, as for a single write).

use fleet_core::{DesiredState, UnitFile, UnitHash, UnitName};
use std::collections::BTreeSet;
use std::ops::Range;
use tracing::debug;

use crate::error::{RegistryError, Result};
use crate::kv::{Compare, Kv, MAX_TXN_OPS, Txn};
use crate::records::{ReplaceState, Unit, UnitRecord};
use crate::registry::{delete, encode, put};

use super::batch::{Write, cut};
use super::{UnitsRole, dropped_hashes, referenced};

/// One change of a batch, to a unit as it was read.
#[derive(Debug, Clone)]
pub enum Change<'a> {
    /// New content and desired state, with the replace options `replace`
    /// ([`UnitsRole::replace_unit_with`] as a single write).
    Replace {
        existing: &'a Unit,
        file: &'a UnitFile,
        desired: DesiredState,
        replace: ReplaceState,
    },
    /// Delete the unit and its file references ([`UnitsRole::destroy_unit`]).
    Destroy(&'a Unit),
}

impl Change<'_> {
    fn existing(&self) -> &Unit {
        match self {
            Change::Replace { existing, .. } | Change::Destroy(existing) => existing,
        }
    }

    pub fn name(&self) -> &UnitName {
        self.existing().name()
    }

    /// The record this change writes (`None`: the unit is deleted).
    fn record(&self) -> Option<UnitRecord> {
        match self {
            Change::Replace {
                existing,
                file,
                desired,
                replace,
            } => Some(UnitRecord {
                name: existing.name().clone(),
                hash: file.hash(),
                desired: *desired,
                restart: existing.record.restart,
                replace: replace.clone(),
            }),
            Change::Destroy(_) => None,
        }
    }

    /// The file this change writes, if any.
    fn file(&self) -> Option<&UnitFile> {
        match self {
            Change::Replace { file, .. } => Some(file),
            Change::Destroy(_) => None,
        }
    }

    /// The files the unit referred to and no longer does once this change lands.
    fn dropped(&self) -> Vec<UnitHash> {
        match self.record() {
            Some(new) => dropped_hashes(&self.existing().record, &new),
            None => referenced(&self.existing().record),
        }
    }

    /// Operations of the success branch besides the file itself: a replace puts its record
    /// and its file reference and deletes the references it drops; a destroy deletes its
    /// record and its references.
    fn own_ops(&self) -> usize {
        let dropped = self.dropped().len();
        match self {
            Change::Replace { .. } => 2 + dropped,
            Change::Destroy(_) => 1 + dropped,
        }
    }
}

/// Cuts `changes` into consecutive batches, each one transaction within [`MAX_TXN_OPS`]
/// compares and operations (a distinct file counts once per batch) and [`MAX_TXN_BYTES`](crate::kv::MAX_TXN_BYTES)
/// bytes (a change alone is a batch whatever its size). A name seen again starts a new
/// batch: etcd refuses a transaction that writes one key twice.
pub fn change_batches(changes: &[Change<'_>]) -> Vec<Range<usize>> {
    cut(changes, |c| Write {
        name: c.name(),
        own_ops: c.own_ops(),
        file: c.file(),
    })
}

/// The files the changes of landed batches stopped referring to, each once.
pub fn dropped_files<'a>(changes: impl IntoIterator<Item = &'a Change<'a>>) -> BTreeSet<UnitHash> {
    changes.into_iter().flat_map(Change::dropped).collect()
}

impl<K: Kv> UnitsRole<K> {
    /// Applies every change of `changes` in one transaction if none of their units changed
    /// since it was read: the records written, in the order given (`None` for a destroyed
    /// unit), or `None` when one of them changed (nothing was written). Files dropped are
    /// not collected here: the caller collects them once ([`UnitsRole::collect_files`]).
    /// `changes` must be one of [`change_batches`]' batches; more is
    /// [`RegistryError::TooManyChanges`].
    pub async fn change_batch(&self, changes: &[Change<'_>]) -> Result<Option<Vec<Option<Unit>>>> {
        let keys = self.registry.keys();
        let mut success = Vec::new();
        let mut files = BTreeSet::new();
        let mut records = Vec::with_capacity(changes.len());
        for change in changes {
            let name = change.name();
            if let Some(file) = change.file()
                && files.insert(file.hash())
            {
                // Rewritten with its reference, as a single replace does: a concurrent
                // collection of the same hash may have just deleted it.
                success.push(put(keys.file(&file.hash()), file.canonical().into_bytes()));
            }
            let record = change.record();
            let dropped = change.dropped();
            success.extend(dropped.iter().map(|h| delete(keys.file_ref(h, name))));
            match &record {
                Some(record) => {
                    success.push(put(keys.file_ref(&record.hash, name), Vec::new()));
                    success.push(put(keys.unit(name), encode(record)));
                }
                None => success.push(delete(keys.unit(name))),
            }
            records.push(record);
        }
        if changes.len() > MAX_TXN_OPS || success.len() > MAX_TXN_OPS {
            return Err(RegistryError::TooManyChanges {
                count: success.len().max(changes.len()),
                max: MAX_TXN_OPS,
            });
        }
        let txn = Txn {
            compares: changes
                .iter()
                .map(|c| Compare::mod_revision(keys.unit(c.name()), c.existing().mod_revision))
                .collect(),
            success,
            failure: vec![],
        };
        let res = self.registry.txn(txn, "changing units").await?;
        if !res.succeeded {
            debug!(
                units = changes.len(),
                "a unit of the batch changed since read; nothing written"
            );
            return Ok(None);
        }
        debug!(units = changes.len(), "changed units");
        Ok(Some(
            records
                .into_iter()
                .map(|record| {
                    record.map(|record| Unit {
                        record,
                        mod_revision: res.revision,
                    })
                })
                .collect(),
        ))
    }

    /// Collects each of `hashes` that no unit refers to any more, after a committed write: a
    /// failure is logged and leaves the file (see `collect_committed`).
    pub async fn collect_files(&self, hashes: &BTreeSet<UnitHash>) {
        self.collect_committed(hashes).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(i: usize, content: &UnitFile) -> Unit {
        Unit {
            record: UnitRecord {
                name: format!("foo@{i}.service").parse().unwrap(),
                hash: content.hash(),
                desired: DesiredState::Launched,
                restart: 0,
                replace: ReplaceState::default(),
            },
            mod_revision: 7,
        }
    }

    fn file(exec: &str) -> UnitFile {
        UnitFile::parse(format!("[Service]\nExecStart={exec}\n").as_bytes()).unwrap()
    }

    fn sizes(changes: &[Change<'_>]) -> Vec<usize> {
        change_batches(changes)
            .into_iter()
            .map(|r| r.len())
            .collect()
    }

    #[test]
    fn destroys_go_64_to_a_transaction() {
        let old = file("/bin/old");
        let units: Vec<Unit> = (0..300).map(|i| unit(i, &old)).collect();
        let changes: Vec<Change<'_>> = units.iter().map(Change::Destroy).collect();
        // A record delete and a reference delete each, one compare each.
        assert_eq!(sizes(&changes), vec![64, 64, 64, 64, 44]);
    }

    #[test]
    fn replaces_with_one_new_file_go_42_to_a_transaction() {
        let (old, new) = (file("/bin/old"), file("/bin/new"));
        let units: Vec<Unit> = (0..100).map(|i| unit(i, &old)).collect();
        let changes: Vec<Change<'_>> = units
            .iter()
            .map(|existing| Change::Replace {
                existing,
                file: &new,
                desired: DesiredState::Launched,
                replace: ReplaceState::default(),
            })
            .collect();
        // The file once, then a record put, a reference put and a reference delete each.
        assert_eq!(sizes(&changes), vec![42, 42, 16]);
    }

    #[test]
    fn distinct_files_count_once_each_and_a_name_seen_again_starts_a_batch() {
        let old = file("/bin/old");
        let news: Vec<UnitFile> = (0..3).map(|i| file(&format!("/bin/new{i}"))).collect();
        let units: Vec<Unit> = (0..3).map(|i| unit(i, &old)).collect();
        let changes = vec![
            Change::Replace {
                existing: &units[0],
                file: &news[0],
                desired: DesiredState::Launched,
                replace: ReplaceState::default(),
            },
            Change::Destroy(&units[1]),
            Change::Destroy(&units[0]),
            Change::Replace {
                existing: &units[2],
                file: &news[2],
                desired: DesiredState::Launched,
                replace: ReplaceState::default(),
            },
        ];
        assert_eq!(sizes(&changes), vec![2, 2]);
        assert!(change_batches(&[]).is_empty());
    }

    #[test]
    fn replaces_with_large_files_go_as_many_to_a_transaction_as_fit_etcds_request_size() {
        // Issue 38: `submit --replace` of 5 files of 965 KB was one 4.8 MB request.
        let old = file("/bin/old");
        let news: Vec<UnitFile> = (0..5)
            .map(|i| {
                let mut text = format!("[Service]\nExecStart=/bin/{i}\n");
                for line in 0..965 {
                    text.push_str(&format!("Environment=X{line}={}\n", "x".repeat(1000)));
                }
                UnitFile::parse(text.as_bytes()).unwrap()
            })
            .collect();
        let units: Vec<Unit> = (0..5).map(|i| unit(i, &old)).collect();
        let changes: Vec<Change<'_>> = units
            .iter()
            .zip(&news)
            .map(|(existing, file)| Change::Replace {
                existing,
                file,
                desired: DesiredState::Launched,
                replace: ReplaceState::default(),
            })
            .collect();
        assert_eq!(sizes(&changes), vec![1, 1, 1, 1, 1]);
    }
}
