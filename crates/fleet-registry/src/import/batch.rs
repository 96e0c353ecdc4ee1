//! Many imported units in few transactions: the import of a cluster of thousands of units
//! wrote one transaction per unit. A batch is one transaction that writes every unit of it or
//! none: each unit's record, file reference, schedule entries and placements, each distinct
//! file once, guarded by one compare per unit (absent, or the revision the plan's replace was
//! read at). The bounds are those of `crate::units::batches` (etcd's default
//! `--max-txn-ops` for the compares and for the operations, [`MAX_TXN_BYTES`](crate::kv::MAX_TXN_BYTES) for the
//! request, a name once per batch), with the same cost per put; a unit's entries count too.
//!
//! What a batch does not do: decide. A batch whose compare fails writes nothing, and its
//! units are then written one by one, where each unit's own compare says which changed.

use std::ops::Range;

use super::ImportedUnit;
use crate::units::{Write, cut};

/// Operations of one unit beside its file: its file reference and record, and an entry and
/// a placement per machine.
fn own_ops(unit: &ImportedUnit) -> usize {
    2 + 2 * unit.machines.len()
}

/// Cuts `units` into consecutive batches, each one transaction within [`MAX_TXN_OPS`](crate::kv::MAX_TXN_OPS)
/// compares and operations (a distinct file counts once per batch) and [`MAX_TXN_BYTES`](crate::kv::MAX_TXN_BYTES)
/// bytes. A unit alone is a batch whatever its size (`Importer::import_unit` then splits a
/// global unit's entries); a name seen again starts a new batch, since etcd refuses a
/// transaction that writes one key twice.
pub fn import_batches(units: &[ImportedUnit]) -> Vec<Range<usize>> {
    cut(units, |u| Write {
        name: &u.name,
        own_ops: own_ops(u),
        file: Some(&u.file),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{MAX_TXN_BYTES, MAX_TXN_OPS};
    use crate::units::txn_bytes;
    use fleet_core::{DesiredState, MachineId, UnitFile, UnitHash};
    use std::collections::BTreeSet;

    fn unit(name: &str, body: &str, machines: usize) -> ImportedUnit {
        ImportedUnit {
            name: name.parse().unwrap(),
            file: UnitFile::parse(format!("[Service]\nExecStart={body}\n").as_bytes()).unwrap(),
            desired: DesiredState::Launched,
            machines: (0..machines)
                .map(|m| format!("m{m}").parse::<MachineId>().unwrap())
                .collect(),
            replaces: None,
        }
    }

    /// Each batch as a transaction would hold it: compares, operations, bytes.
    fn cost(batch: &[ImportedUnit]) -> (usize, usize, usize) {
        let files: BTreeSet<UnitHash> = batch.iter().map(|u| u.file.hash()).collect();
        let ops = batch.iter().map(own_ops).sum::<usize>() + files.len();
        let file_bytes: usize = files
            .iter()
            .filter_map(|h| batch.iter().find(|u| u.file.hash() == *h))
            .map(|u| u.file.canonical().len())
            .sum();
        let bytes = batch
            .iter()
            .map(|u| txn_bytes(own_ops(u), None))
            .sum::<usize>()
            + files.len() * crate::kv::TXN_OP_BYTES
            + file_bytes;
        (batch.len(), ops, bytes)
    }

    #[test]
    fn instances_of_one_file_go_many_to_a_transaction_within_etcds_bounds() {
        let units: Vec<ImportedUnit> = (0..200)
            .map(|i| unit(&format!("web@{i}.service"), "/bin/web", 1))
            .collect();
        let batches = import_batches(&units);
        // Four operations a unit and the file once: 31 units to a transaction.
        assert_eq!(batches.len(), 7, "{batches:?}");
        assert_eq!(batches[0], 0..31);
        let mut next = 0;
        for range in &batches {
            assert_eq!(range.start, next, "in order, none left out");
            next = range.end;
            let (compares, ops, bytes) = cost(&units[range.clone()]);
            assert!(compares <= MAX_TXN_OPS && ops <= MAX_TXN_OPS, "{range:?}");
            assert!(bytes <= MAX_TXN_BYTES, "{range:?}");
        }
        assert_eq!(next, units.len());
    }

    #[test]
    fn a_unit_with_many_machines_a_big_file_or_a_name_again_starts_a_batch() {
        // About half a transaction's bytes, in lines a unit file may hold.
        let big = |c: &str| -> String {
            (0..500)
                .map(|i| format!("\nEnvironment=A{i}={}", c.repeat(1040)))
                .collect()
        };
        let units = vec![
            unit("a.service", "/bin/a", 1),
            unit("glob.service", "/bin/g", 100),
            unit("b.service", &format!("/bin/b{}", big("x")), 0),
            unit("c.service", &format!("/bin/c{}", big("y")), 0),
            unit("d.service", "/bin/d", 0),
            unit("d.service", "/bin/d2", 0),
        ];
        assert_eq!(
            import_batches(&units),
            [0..1, 1..2, 2..3, 3..5, 5..6],
            "the global unit alone, one big file a batch, d twice never together"
        );
        assert!(import_batches(&[]).is_empty());
    }
}
