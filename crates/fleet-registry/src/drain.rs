//! Drain marks: `fleetctl drain MACHINE` asks that a machine take no new non-global unit and
//! that the engine move its non-global units elsewhere, `parallel` at a time. The mark lives
//! at `P/drain/<machine>` with no lease, apart from the machine's presence, so it outlives
//! fleetd restarts, a machine leaving and rejoining, and leader changes, and a machine not
//! registered (yet) may be drained. Operators write it through the units role; the engine
//! only reads it (with the rest of its [`Snapshot`](crate::Snapshot)) and records the moves
//! it makes at `P/moving/<unit>` through its leadership.

use fleet_core::MachineId;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{RegistryError, Result};
use crate::kv::{Kv, Txn, TxnOpResponse};
use crate::read::{self, Listing};
use crate::records::DrainRecord;
use crate::registry::{Registry, delete, encode, put};
use crate::units::UnitsRole;

impl<K: Kv> Registry<K> {
    /// Every drain mark, at one revision, in machine order; unreadable ones are skipped.
    pub async fn drains(&self) -> Result<Listing<Vec<DrainRecord>>> {
        let res = self
            .kv()
            .range(&self.keys().drains(), true, None)
            .await
            .map_err(RegistryError::kv("reading drain marks"))?;
        let mut skipped = Vec::new();
        let items = read::all(&res.kvs, |kv| read::drain(self.keys(), kv), &mut skipped);
        Ok(Listing {
            revision: res.revision,
            items,
            skipped,
        })
    }

    /// The drain mark of `machine`, if it is drained.
    pub async fn drain(&self, machine: &MachineId) -> Result<Option<DrainRecord>> {
        let res = self
            .kv()
            .range(&self.keys().drain(machine), false, None)
            .await
            .map_err(RegistryError::kv("reading drain mark"))?;
        match res.kvs.first() {
            Some(kv) => Ok(Some(read::drain(self.keys(), kv)?)),
            None => Ok(None),
        }
    }
}

/// Drain marks are written by operators, through the units role (docs/registry.md, Roles).
impl<K: Kv> UnitsRole<K> {
    /// Drains `machine`, `parallel` moves at a time (0 counts as 1). Draining a drained
    /// machine changes its `parallel` and keeps its `since`. Returns the mark written.
    pub async fn drain(&self, machine: &MachineId, parallel: u32) -> Result<DrainRecord> {
        let registry = self.registry();
        let since = match registry.drain(machine).await {
            Ok(Some(existing)) => existing.since,
            // An unreadable mark is overwritten by a readable one.
            Ok(None) | Err(RegistryError::Corrupt { .. }) => unix_now(),
            Err(err) => return Err(err),
        };
        let record = DrainRecord {
            machine: machine.clone(),
            parallel: parallel.max(1),
            since,
        };
        let txn = Txn {
            compares: vec![],
            success: vec![put(registry.keys().drain(machine), encode(&record))],
            failure: vec![],
        };
        registry.txn(txn, "draining machine").await?;
        Ok(record)
    }

    /// Makes `machine` schedulable again. Units come back only through new scheduling
    /// decisions: nothing moves back by itself. `false` if it was not drained.
    pub async fn undrain(&self, machine: &MachineId) -> Result<bool> {
        let registry = self.registry();
        let txn = Txn {
            compares: vec![],
            success: vec![delete(registry.keys().drain(machine))],
            failure: vec![],
        };
        let res = registry.txn(txn, "undraining machine").await?;
        Ok(res
            .responses
            .iter()
            .any(|r| matches!(r, TxnOpResponse::Delete(n) if *n > 0)))
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LiveView;
    use crate::kv::MemKv;

    fn machine(id: &str) -> MachineId {
        id.parse().unwrap()
    }

    #[tokio::test]
    async fn a_machine_not_registered_may_be_drained_and_the_mark_reads_back() {
        let registry = Registry::new(MemKv::new(), "/fleet/");
        let units = UnitsRole::new(registry.clone());
        let mark = units.drain(&machine("m9"), 0).await.unwrap();
        assert_eq!(mark.parallel, 1, "0 counts as 1");
        assert_eq!(
            registry.drain(&machine("m9")).await.unwrap(),
            Some(mark.clone())
        );
        assert_eq!(registry.drains().await.unwrap().items, vec![mark.clone()]);
        let snap = registry.snapshot().await.unwrap();
        assert_eq!(snap.drained.get(&machine("m9")), Some(&mark));
    }

    #[tokio::test]
    async fn draining_again_changes_parallel_and_keeps_since() {
        let registry = Registry::new(MemKv::new(), "/fleet/");
        let units = UnitsRole::new(registry.clone());
        let first = units.drain(&machine("m1"), 1).await.unwrap();
        let second = units.drain(&machine("m1"), 3).await.unwrap();
        assert_eq!(second.parallel, 3);
        assert_eq!(second.since, first.since);
    }

    #[tokio::test]
    async fn undrain_removes_the_mark_and_says_whether_there_was_one() {
        let registry = Registry::new(MemKv::new(), "/fleet/");
        let units = UnitsRole::new(registry.clone());
        units.drain(&machine("m1"), 2).await.unwrap();
        assert!(units.undrain(&machine("m1")).await.unwrap());
        assert!(!units.undrain(&machine("m1")).await.unwrap());
        assert_eq!(registry.drain(&machine("m1")).await.unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_live_view_follows_drains_as_machine_changes() {
        let registry = Registry::new(MemKv::new(), "/fleet/");
        let units = UnitsRole::new(registry.clone());
        let mut view = LiveView::start_without_files(registry.clone())
            .await
            .unwrap();
        let mark = units.drain(&machine("m1"), 2).await.unwrap();
        let touched = view.changed().await.unwrap();
        assert!(touched.machines, "a drain wakes the engine");
        assert_eq!(view.snapshot().drained.get(&machine("m1")), Some(&mark));
        units.undrain(&machine("m1")).await.unwrap();
        view.changed().await.unwrap();
        assert!(view.snapshot().drained.is_empty());
    }
}
