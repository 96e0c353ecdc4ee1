//! The agent's boot: systemd's state of the units directory, then this machine's schedule,
//! each retried until it answers, and what will be kept, replaced or removed logged before
//! anything is touched. Adopts the states a previous fleetd published under the resumed
//! lease, and deletes its old-layout ones. Plans and executes nothing: the loop does, once
//! boot has returned.

use fleet_core::{Backoff, UnitName};
use fleet_registry::kv::Kv;
use std::collections::{BTreeMap, BTreeSet};
use tokio::sync::watch;
use tracing::{info, warn};

use super::Agent;
use crate::current::Current;
use crate::manager::UnitManager;
use crate::plan::UnitFileState;

impl<K: Kv, M: UnitManager> Agent<K, M> {
    /// Builds the current state from systemd and reads the schedule (retrying until it can),
    /// logging what will be kept, replaced or removed. `None` on shutdown.
    pub(super) async fn boot(&mut self, shutdown: &mut watch::Receiver<bool>) -> Option<()> {
        let mut backoff = self.reconnect_backoff();
        loop {
            match Current::read(&self.manager, &BTreeSet::new(), &BTreeMap::new()).await {
                Ok(mut current) => {
                    current.read_details(&self.manager).await;
                    current.set_restarted(self.ledger.restarts_in_order());
                    self.current = current;
                    break;
                }
                Err(e) => warn!(error = %e, "reading systemd state at boot failed; retrying"),
            }
            if wait_or_shutdown(shutdown, &mut backoff).await {
                return None;
            }
        }
        // What systemd did to the units before this agent: their restarts, since and exits.
        self.observe(None).await;
        info!(
            units = self.current.hashes.len(),
            "preloaded units directory"
        );
        let mut backoff = self.reconnect_backoff();
        loop {
            match self.schedule.read().await {
                Ok(()) => match self.read_unfiled().await {
                    Ok(()) => break,
                    Err(e) => warn!(error = %e, "reading systemd state at boot failed; retrying"),
                },
                // Fail closed: nothing is removed until we know what should run here.
                Err(e) => warn!(error = %e, "reading schedule at boot failed; touching nothing"),
            }
            if wait_or_shutdown(shutdown, &mut backoff).await {
                return None;
            }
        }
        self.log_boot_decisions();
        let presence = *self.presence.borrow();
        if let Some(presence) = presence {
            self.publisher.adopt(presence).await;
        }
        let presence = *self.presence.borrow();
        if let Some(presence) = presence {
            self.publisher
                .remove_legacy(presence, &self.known_units())
                .await;
        }
        Some(())
    }

    /// The units this machine knows: its schedule's, its units directory's, systemd's.
    fn known_units(&self) -> Vec<UnitName> {
        let mut names = self.schedule.scheduled();
        names.extend(self.current.units.keys().cloned());
        names.into_iter().collect()
    }

    /// systemd's state of the scheduled units without a file here, which the preload could
    /// not know to ask about.
    async fn read_unfiled(&mut self) -> Result<(), crate::manager::ManagerError> {
        let names = self.schedule.scheduled();
        self.current.read_unfiled(&self.manager, &names).await?;
        self.current.set_restarted(self.ledger.restarts_in_order());
        Ok(())
    }

    fn log_boot_decisions(&self) {
        let desired = self.schedule.schedule().expect("read at boot");
        for (name, unit) in &self.current.units {
            let state = unit
                .systemd
                .as_ref()
                .map_or("unknown", |s| s.active.as_str());
            match (&unit.file, desired.get(name)) {
                (UnitFileState::Present { hash, .. }, Some(want)) if *hash == want.hash => {
                    info!(unit = %name, hash = %hash.short(), active = state, "keeping unit: its file matches the schedule");
                }
                (UnitFileState::Present { hash, .. }, Some(want)) => {
                    info!(unit = %name, current = %hash.short(), desired = %want.hash.short(), "replacing unit: hash differs from the schedule");
                }
                (UnitFileState::Unparseable, Some(_)) => {
                    info!(unit = %name, "replacing unit: its file is unreadable");
                }
                (UnitFileState::Present { .. } | UnitFileState::Unparseable, None) => {
                    info!(unit = %name, active = state, "removing unit: not scheduled here");
                }
                (UnitFileState::Absent, _) => {}
            }
        }
    }
}

/// Sleeps the next delay of `backoff` unless shutdown comes first; true on shutdown.
async fn wait_or_shutdown(shutdown: &mut watch::Receiver<bool>, backoff: &mut Backoff) -> bool {
    let d = backoff.next_delay();
    tokio::select! {
        _ = shutdown.changed() => true,
        _ = tokio::time::sleep(d) => *shutdown.borrow(),
    }
}
