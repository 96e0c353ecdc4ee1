//! A unit's `restart_pending`: after its file is swapped under it without a restart
//! (`--no-restart`), which version and which invocation run, until systemd restarts it.
//! Reads systemd's invocation ids and the ledger; stops, starts and restarts nothing.

use fleet_core::UnitName;
use fleet_registry::kv::Kv;
use std::collections::BTreeSet;
use tracing::warn;

use super::Agent;
use crate::manager::UnitManager;
use crate::plan;

impl<K: Kv, M: UnitManager> Agent<K, M> {
    /// Before a file is swapped under a running unit (`--no-restart`), remembers which
    /// version and which invocation of the unit run, so the unit shows `restart_pending`
    /// until it restarts.
    pub(super) async fn remember_running_versions(&mut self, tasks: &[plan::Task]) {
        for t in tasks {
            let plan::Reason::ReplaceWithoutRestart { current, .. } = &t.reason else {
                continue;
            };
            let invocation = match self.manager.details(&t.unit).await {
                Ok(d) => d.invocation_id,
                Err(e) => {
                    warn!(unit = %t.unit, error = %e, "reading the unit's invocation failed");
                    None
                }
            };
            self.ledger.record_swap(&t.unit, *current, invocation);
        }
    }

    /// Which running units run an older version than their file. A unit systemd restarted by
    /// itself (another InvocationID) runs the file it was restarted with: no longer pending.
    pub(super) async fn refresh_pending(&mut self) {
        let mut pending = BTreeSet::new();
        // The ledger's few swapped units, not a lookup for each unit with a file.
        let hashes = &self.current.hashes;
        let candidates: Vec<(UnitName, Option<String>)> = self
            .ledger
            .swapped()
            .filter(|(name, started, _)| hashes.get(*name).is_some_and(|h| h != started))
            .map(|(name, _, invocation)| (name.clone(), invocation.map(str::to_owned)))
            .collect();
        for (name, invocation) in candidates {
            let running = self
                .current
                .units
                .get(&name)
                .and_then(|u| u.systemd.as_ref())
                .is_some_and(|s| s.active_state().satisfies_launched());
            let now = match self.manager.details(&name).await {
                Ok(d) => d.invocation_id,
                Err(_) => continue,
            };
            if running && invocation.is_some() && now == invocation {
                pending.insert(name);
            } else {
                self.ledger.clear_swap(&name);
            }
        }
        let changed: Vec<UnitName> = self
            .current
            .restart_pending
            .symmetric_difference(&pending)
            .cloned()
            .collect();
        self.current.restart_pending = pending;
        self.publisher.touched(changed);
    }
}
