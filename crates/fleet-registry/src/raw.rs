//! Raw access for tests (the `test-etcd` feature): what no role may write (a schedule without
//! an engine, a corrupt value) and the store under the registry, to look at what was
//! written. Production code goes through roles; the throwaway etcd servers tests run are
//! the `fleet-testing` crate's.

use fleet_core::{MachineId, UnitName};

use crate::kv::{Kv, Revision, Txn, TxnOp};
use crate::records::ScheduleEntry;
use crate::registry::{Registry, delete, encode, put};

/// Raw access for tests, which set up what no role may write (a schedule without an
/// engine, a corrupt value) and look at what was written. Production code goes through roles.
impl<K: Kv> Registry<K> {
    /// The store under the registry.
    pub fn raw_kv(&self) -> &K {
        self.kv()
    }

    /// Writes `value` at `key` as it is, past every check: a corrupt value, another user's
    /// key, what a hand-written or buggy client could write.
    pub async fn put_raw(&self, key: &str, value: &str) {
        let txn = Txn {
            success: vec![put(key.to_owned(), value.as_bytes().to_vec())],
            ..Txn::default()
        };
        self.kv().txn(txn).await.expect("raw put");
    }

    /// Puts and deletes schedule entries in one transaction, without a leadership's fence:
    /// what an engine would write, for tests of the agent and of the readers.
    pub async fn write_schedule(
        &self,
        put_entries: &[ScheduleEntry],
        delete_entries: &[(MachineId, UnitName)],
    ) -> crate::Result<Revision> {
        let keys = self.keys();
        // With their placements, as the engine writes them.
        let mut ops: Vec<TxnOp> = put_entries
            .iter()
            .flat_map(|e| {
                [
                    put(keys.schedule(&e.machine, &e.name), encode(e)),
                    put(keys.placement(&e.name, &e.machine), Vec::new()),
                ]
            })
            .collect();
        ops.extend(
            delete_entries
                .iter()
                .flat_map(|(m, n)| [delete(keys.schedule(m, n)), delete(keys.placement(n, m))]),
        );
        let txn = Txn {
            compares: vec![],
            success: ops,
            failure: vec![],
        };
        let res = self.txn(txn, "writing schedule").await?;
        Ok(res.revision)
    }
}
