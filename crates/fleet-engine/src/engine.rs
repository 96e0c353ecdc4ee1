//! The engine loop of one fleetd: campaign for leadership; while leader, plan on every change
//! and write the decisions fenced by the leadership; when leadership is lost, stop writing and
//! campaign again. A follower waits on a watch of the leader key instead of polling.
//!
//! It decides nothing itself ([`crate::scheduler`] does) and owns no etcd call
//! (`fleet_registry` does). This loop is the one that retries, so it is the one that logs.

mod leading;

use crate::disruption::DisruptionConfig;
use crate::metrics::Metrics;
use fleet_core::MachineId;
use fleet_registry::kv::Kv;
use fleet_registry::{EngineRole, Leadership, Registry};
use std::time::Duration;
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// How an engine behaves.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// This machine: the value of the leader key while we lead.
    pub machine: MachineId,
    /// fleet's `engine_reconcile_interval`: sets the leadership lease (five of it) and the
    /// retry delay after a failed pass. Passes themselves follow changes, with a re-check
    /// once a minute.
    pub reconcile_interval: Duration,
    /// The leadership lease; renewed every third of it. A crashed leader is replaced after
    /// at most this long.
    pub lease_ttl: Duration,
    /// When the units of vanished machines may move (see [`crate::disruption`]).
    pub disruption: DisruptionConfig,
    /// Where the loop counts what it does (detached unless [`EngineConfig::with_metrics`]).
    pub metrics: Metrics,
}

impl EngineConfig {
    /// fleet's `engine_reconcile_interval` default.
    pub const DEFAULT_RECONCILE_INTERVAL: Duration = Duration::from_secs(2);

    /// fleet's `agent_ttl` default, which sizes the disruption rule unless told otherwise.
    pub const DEFAULT_AGENT_TTL: Duration = Duration::from_secs(30);

    /// A configuration with fleet's lease of five reconcile intervals and the disruption rule
    /// for the default agent TTL.
    pub fn new(machine: MachineId, reconcile_interval: Duration) -> EngineConfig {
        EngineConfig {
            machine,
            reconcile_interval,
            lease_ttl: reconcile_interval * 5,
            disruption: DisruptionConfig::for_ttl(Self::DEFAULT_AGENT_TTL),
            metrics: Metrics::default(),
        }
    }

    /// This configuration, counting into `metrics` (fleetd's registered families).
    pub fn with_metrics(mut self, metrics: Metrics) -> EngineConfig {
        self.metrics = metrics;
        self
    }
}

/// How a phase of the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// Campaign (again).
    Campaign,
    /// Shutdown was requested; return.
    Shutdown,
}

/// Runs an engine until `shutdown` turns true (or its sender is dropped). A leader resigns
/// on the way out so that another engine takes over at once.
#[tracing::instrument(name = "engine", skip_all, fields(machine = %cfg.machine))]
pub async fn run<K: Kv>(
    registry: Registry<K>,
    cfg: EngineConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    info!(machine = %cfg.machine, lease_ttl = ?cfg.lease_ttl, "engine started");
    while !stopping(&shutdown) {
        if campaign_once(&registry, &cfg, &mut shutdown).await == Flow::Shutdown {
            break;
        }
    }
    info!(machine = %cfg.machine, "engine stopped");
}

/// One campaign, then leading or following until that ends.
async fn campaign_once<K: Kv>(
    registry: &Registry<K>,
    cfg: &EngineConfig,
    shutdown: &mut watch::Receiver<bool>,
) -> Flow {
    let role = EngineRole::new(registry.clone());
    match role.campaign(&cfg.machine, cfg.lease_ttl).await {
        Ok(Some(leadership)) => lead(registry, leadership, cfg, shutdown).await,
        Ok(None) => follow(registry, cfg, shutdown).await,
        Err(err) => {
            warn!(error = %err, "engine campaign failed; retrying");
            pause(cfg.reconcile_interval, shutdown).await
        }
    }
}

async fn lead<K: Kv>(
    registry: &Registry<K>,
    leadership: Leadership<K>,
    cfg: &EngineConfig,
    shutdown: &mut watch::Receiver<bool>,
) -> Flow {
    info!(machine = %cfg.machine, "engine leadership acquired");
    cfg.metrics.leading(true);
    let flow = leading::Leading::new(registry.clone(), leadership.clone(), cfg)
        .run(shutdown)
        .await;
    cfg.metrics.leading(false);
    if flow == Flow::Shutdown {
        resign(leadership, cfg).await;
    }
    flow
}

async fn resign<K: Kv>(leadership: Leadership<K>, cfg: &EngineConfig) {
    match tokio::time::timeout(cfg.reconcile_interval, leadership.resign()).await {
        Ok(Ok(())) => info!(machine = %cfg.machine, "engine leadership resigned"),
        Ok(Err(err)) => {
            warn!(error = %err, "resigning engine leadership failed; it lapses with its lease")
        }
        Err(_) => warn!("resigning engine leadership timed out; it lapses with its lease"),
    }
}

/// Waits until the leader key changes (deleted, or expired with its lease), with a slow
/// re-check in case the watch missed it.
async fn follow<K: Kv>(
    registry: &Registry<K>,
    cfg: &EngineConfig,
    shutdown: &mut watch::Receiver<bool>,
) -> Flow {
    let (leader, mut hints) = match registry.watch_leader().await {
        Ok(found) => found,
        Err(err) => {
            warn!(error = %err, "reading engine leader failed; retrying");
            return pause(cfg.reconcile_interval, shutdown).await;
        }
    };
    let Some(leader) = leader else {
        return Flow::Campaign;
    };
    debug!(leader = %leader, "following engine leader");
    loop {
        tokio::select! {
            () = stop_requested(shutdown) => return Flow::Shutdown,
            _ = hints.changed() => return Flow::Campaign,
            () = tokio::time::sleep(cfg.lease_ttl) => {}
        }
        // The slow re-check in case the watch missed a change: campaign only if the key
        // is gone (or cannot be read), without granting a lease for nothing.
        match registry.leader().await {
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => return Flow::Campaign,
        }
    }
}

/// Waits `delay` unless shutdown comes first.
async fn pause(delay: Duration, shutdown: &mut watch::Receiver<bool>) -> Flow {
    tokio::select! {
        () = stop_requested(shutdown) => Flow::Shutdown,
        () = tokio::time::sleep(delay) => Flow::Campaign,
    }
}

/// Resolves once shutdown is requested: the value turns true or its sender is gone.
async fn stop_requested(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

fn stopping(shutdown: &watch::Receiver<bool>) -> bool {
    *shutdown.borrow() || shutdown.has_changed().is_err()
}
