//! Creating many units in few transactions: `fleetctl start foo@{1..100000}.service` wrote
//! one transaction per unit (100,000 units took 54 s, issue 19). A batch is one transaction
//! that creates every unit of it or none: each unit's record, file reference and (once per
//! distinct content) file, guarded by one "absent" compare per unit.
//!
//! Batches fit etcd's default `--max-txn-ops` ([`MAX_TXN_OPS`]), which bounds the compares
//! and each branch's operations separately: a unit takes one compare and two puts, a distinct
//! file one more put, so instances of one template go 63 to a transaction. [`batches`] is the
//! pure rule that cuts a list into such transactions; fleetd never needs the limit raised.
//!
//! What a batch does not do: decide. A batch that finds any of its units already there writes
//! nothing and says so; the caller then creates those units one by one (the per-unit path
//! decides what an existing unit means). Nothing here runs transactions concurrently: the
//! caller chooses how many are in flight.

use fleet_core::{DesiredState, UnitFile, UnitHash, UnitName};
use std::collections::BTreeSet;
use std::ops::Range;
use tracing::debug;

use crate::error::{RegistryError, Result};
use crate::kv::{Compare, Kv, MAX_TXN_OPS, Txn};
use crate::records::{ReplaceState, Unit, UnitRecord};
use crate::registry::{encode, put};

use super::UnitsRole;

/// One unit of a batch.
#[derive(Debug, Clone, Copy)]
pub struct NewUnit<'a> {
    pub name: &'a UnitName,
    pub file: &'a UnitFile,
    pub desired: DesiredState,
}

/// Operations a batch of `units` units with `files` distinct files puts in its success branch.
fn success_ops(units: usize, files: usize) -> usize {
    2 * units + files
}

/// Cuts `units` into consecutive batches, each one transaction within [`MAX_TXN_OPS`]
/// compares and operations. A name seen again starts a new batch (etcd refuses a transaction
/// that puts one key twice), where the absent compare then finds the earlier one.
pub fn batches(units: &[NewUnit<'_>]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut names: BTreeSet<&UnitName> = BTreeSet::new();
    let mut hashes: BTreeSet<UnitHash> = BTreeSet::new();
    for (i, unit) in units.iter().enumerate() {
        let hash = unit.file.hash();
        let files = hashes.len() + usize::from(!hashes.contains(&hash));
        let fits = i - start < MAX_TXN_OPS && success_ops(i - start + 1, files) <= MAX_TXN_OPS;
        if !fits || names.contains(unit.name) {
            out.push(start..i);
            start = i;
            names.clear();
            hashes.clear();
        }
        names.insert(unit.name);
        hashes.insert(hash);
    }
    if start < units.len() {
        out.push(start..units.len());
    }
    out
}

impl<K: Kv> UnitsRole<K> {
    /// Creates every unit of `units` in one transaction if none of them exists yet: their
    /// records in the order given, or `None` when one of them exists (nothing was written).
    /// `units` must be one of [`batches`]' batches; more is [`RegistryError::TooManyChanges`].
    pub async fn create_batch(&self, units: &[NewUnit<'_>]) -> Result<Option<Vec<Unit>>> {
        let keys = self.registry.keys();
        let mut hashes = BTreeSet::new();
        let mut files = Vec::new();
        for unit in units {
            if hashes.insert(unit.file.hash()) {
                files.push(unit.file);
            }
        }
        let ops = success_ops(units.len(), files.len());
        if units.len() > MAX_TXN_OPS || ops > MAX_TXN_OPS {
            return Err(RegistryError::TooManyChanges {
                count: ops.max(units.len()),
                max: MAX_TXN_OPS,
            });
        }
        let records: Vec<UnitRecord> = units
            .iter()
            .map(|u| UnitRecord {
                name: u.name.clone(),
                hash: u.file.hash(),
                desired: u.desired,
                restart: 0,
                replace: ReplaceState::default(),
            })
            .collect();
        // Each file is (re)written with its references, as `create_unit` does: a concurrent
        // collection of the same hash may have just deleted it.
        let mut success: Vec<_> = files
            .iter()
            .map(|f| put(keys.file(&f.hash()), f.canonical().into_bytes()))
            .collect();
        for record in &records {
            success.push(put(keys.file_ref(&record.hash, &record.name), Vec::new()));
            success.push(put(keys.unit(&record.name), encode(record)));
        }
        let txn = Txn {
            compares: records
                .iter()
                .map(|r| Compare::absent(keys.unit(&r.name)))
                .collect(),
            success,
            failure: vec![],
        };
        let res = self.registry.txn(txn, "creating units").await?;
        if !res.succeeded {
            debug!(
                units = units.len(),
                "a unit of the batch exists; nothing written"
            );
            return Ok(None);
        }
        debug!(units = units.len(), files = files.len(), "created units");
        let mod_revision = res.revision;
        Ok(Some(
            records
                .into_iter()
                .map(|record| Unit {
                    record,
                    mod_revision,
                })
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(i: usize) -> UnitName {
        format!("foo@{i}.service").parse().unwrap()
    }

    fn file(exec: &str) -> UnitFile {
        UnitFile::parse(format!("[Service]\nExecStart={exec}\n").as_bytes()).unwrap()
    }

    fn new_units<'a>(names: &'a [UnitName], files: &'a [UnitFile]) -> Vec<NewUnit<'a>> {
        names
            .iter()
            .enumerate()
            .map(|(i, name)| NewUnit {
                name,
                file: &files[i % files.len()],
                desired: DesiredState::Launched,
            })
            .collect()
    }

    /// The compares and success operations of each batch, as `create_batch` builds them.
    fn op_counts(units: &[NewUnit<'_>]) -> Vec<(usize, usize)> {
        batches(units)
            .into_iter()
            .map(|r| {
                let b = &units[r];
                let files: BTreeSet<UnitHash> = b.iter().map(|u| u.file.hash()).collect();
                (b.len(), success_ops(b.len(), files.len()))
            })
            .collect()
    }

    #[test]
    fn instances_of_one_template_go_sixty_three_to_a_transaction() {
        let names: Vec<UnitName> = (0..1000).map(name).collect();
        let files = [file("/bin/true")];
        let units = new_units(&names, &files);
        let counts = op_counts(&units);
        assert_eq!(counts.len(), 1000_usize.div_ceil(63));
        assert!(
            counts[..counts.len() - 1]
                .iter()
                .all(|&(u, ops)| u == 63 && ops == 127)
        );
    }

    #[test]
    fn every_batch_fits_etcds_default_max_txn_ops_whatever_the_files() {
        let names: Vec<UnitName> = (0..500).map(name).collect();
        for distinct in [1, 2, 7, 63, 500] {
            let files: Vec<UnitFile> = (0..distinct).map(|i| file(&format!("/bin/{i}"))).collect();
            let units = new_units(&names, &files);
            let ranges = batches(&units);
            let covered: usize = ranges.iter().map(|r| r.len()).sum();
            assert_eq!(covered, units.len(), "{distinct} files");
            assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
            for (compares, ops) in op_counts(&units) {
                assert!(
                    compares <= MAX_TXN_OPS && ops <= MAX_TXN_OPS,
                    "{distinct} files"
                );
            }
        }
    }

    #[test]
    fn a_name_given_twice_starts_a_new_batch() {
        let names = [name(1), name(2), name(1)];
        let files = [file("/bin/true")];
        let units = new_units(&names, &files);
        assert_eq!(batches(&units), vec![0..2, 2..3]);
    }

    #[test]
    fn no_units_make_no_batch() {
        assert!(batches(&[]).is_empty());
    }
}
