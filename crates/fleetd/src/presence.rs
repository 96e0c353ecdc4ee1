//! This machine's presence in the registry: registered on a lease, kept alive at TTL/3, and
//! registered again (a new lease, all states republished) if the lease ever expires, e.g.
//! after etcd was unreachable for longer than the TTL.
//!
//! The lease ID is kept in the runtime directory, so a restarted fleetd (even after kill -9)
//! takes over its own live lease: the machine never disappears from the cluster and its units'
//! states stay published. Another fleetd with the same machine ID has no such file and is
//! refused.

use anyhow::{Context, Result};
use fleet_core::MachineInfo;
use fleet_registry::kv::{Kv, KvError, LeaseId};
use fleet_registry::{Presence, Registry, RegistryError};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{info, warn};

#[derive(Debug)]
pub struct PresenceKeeper<K> {
    pub registry: Registry<K>,
    pub info: MachineInfo,
    pub ttl: Duration,
    pub lease_file: PathBuf,
}

impl<K: Kv> PresenceKeeper<K> {
    fn saved_lease(&self) -> Option<LeaseId> {
        let text = std::fs::read_to_string(&self.lease_file).ok()?;
        text.trim().parse().ok().map(LeaseId)
    }

    fn save_lease(&self, lease: LeaseId) {
        if let Some(dir) = self.lease_file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Err(e) = std::fs::write(&self.lease_file, lease.0.to_string()) {
            warn!(path = %self.lease_file.display(), error = %e, "could not save lease id; a restart will wait for the old lease to expire");
        }
    }

    /// Registers, retrying while etcd is unreachable. A duplicate machine ID is fatal.
    pub async fn register(&self) -> Result<Presence> {
        let mut delay = Duration::from_millis(200);
        loop {
            match self
                .registry
                .register_machine(&self.info, self.ttl, self.saved_lease())
                .await
            {
                Ok(p) => {
                    self.save_lease(p.lease);
                    info!(machine = %self.info.id, lease = p.lease.0, resumed = p.resumed, "machine registered");
                    return Ok(p);
                }
                Err(e @ RegistryError::DuplicateMachine(_)) => {
                    return Err(e).context("registering this machine");
                }
                Err(e) => {
                    warn!(error = %e, retry_in = ?delay, "registering machine failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Keeps `presence` alive until shutdown, publishing every new presence on `tx`.
    pub async fn keep(
        self,
        mut presence: Presence,
        tx: watch::Sender<Option<Presence>>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<()> {
        let period = self.ttl / 3;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return Ok(()),
                _ = tokio::time::sleep(period) => {}
            }
            match self.registry.keep_alive(&presence).await {
                Ok(()) => {}
                Err(RegistryError::Kv {
                    source: KvError::LeaseNotFound(_),
                    ..
                }) => {
                    warn!("machine lease expired; registering again");
                    presence = self.register().await?;
                    let _ = tx.send(Some(presence));
                }
                Err(e) => warn!(error = %e, "refreshing machine lease failed"),
            }
        }
    }
}
