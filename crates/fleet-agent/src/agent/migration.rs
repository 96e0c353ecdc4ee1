//! The end of a migration from fleet v1: once the agent's first pass has taken over the units
//! `fleetctl import-fleet` placed here (adopted the copies fleet started, removed what no
//! longer belongs), it deletes this machine's migration mark, and the engine stops keeping
//! the machine's units for it while it is absent. Best effort: a mark left (etcd away, or an
//! etcd role from before the mark existed) keeps the units of this machine where they are if
//! it goes away, until an operator deletes it; it is logged, never retried in a loop.

use fleet_registry::kv::Kv;
use tracing::{info, warn};

use super::Agent;
use crate::manager::UnitManager;

impl<K: Kv, M: UnitManager> Agent<K, M> {
    /// Deletes this machine's migration mark, if there is one.
    pub(super) async fn end_migration(&self) {
        match self.schedule.end_migration().await {
            Ok(true) => info!("took over the units imported from fleet; migration mark deleted"),
            Ok(false) => {}
            Err(e) => warn!(
                error = %e,
                "could not delete this machine's migration mark: the engine keeps its units \
                 here while it is away until it is deleted (fleetctl auth setup grants it)"
            ),
        }
    }
}
