//! The engine loop of one fleetd: campaign for leadership; while leader, plan on every change
//! and write the decisions fenced by the leadership; when leadership is lost, stop writing and
//! campaign again. A follower waits on a watch of the leader key instead of polling.
//!
//! It decides nothing itself ([`crate::scheduler`] does) and owns no etcd call
//! (`fleet_registry` does). This loop is the one that retries, so it is the one that logs.
//!
//! A campaign etcd refuses (this host's etcd user lacks the engine role, or its credentials
//! are refused) will not succeed by being repeated soon: it is logged once as an error and
//! retried on the project's backoff up to [`REFUSED_RETRY_MAX`], so an agent-only host that
//! runs an engine by mistake neither spins nor stops; the rest of fleetd goes on.

mod copies;
mod decision_log;
mod events;
mod leading;
pub(crate) mod planner;
mod stray;

use crate::disruption::DisruptionConfig;
use crate::metrics::Metrics;
use fleet_core::MachineId;
use fleet_core::backoff::Backoff;
use fleet_registry::kv::{Kv, KvError};
use fleet_registry::{EngineRole, LeaderKey, Leadership, Registry, RegistryError, SharedStore};
use std::time::Duration;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

/// The longest pause between campaigns that etcd refused.
pub const REFUSED_RETRY_MAX: Duration = Duration::from_secs(60);

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
    /// Where the leader's decisions go as events (issue 41): off unless
    /// [`EngineConfig::with_events`] (fleetd gives the engine role's writer).
    pub events: fleet_registry::EventSink,
    /// Whether schedule entries carry their small files' text for agents that trust them
    /// (fleetd's `trust_engine_files`, issue 43; `fleet_registry::MAX_CARRIED_TEXT`).
    pub carry_files: bool,
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
            events: fleet_registry::EventSink::off(),
            carry_files: false,
        }
    }

    /// This configuration, recording the leader's decisions into `sink`.
    pub fn with_events(mut self, sink: fleet_registry::EventSink) -> EngineConfig {
        self.events = sink;
        self
    }

    /// This configuration, counting into `metrics` (fleetd's registered families).
    pub fn with_metrics(mut self, metrics: Metrics) -> EngineConfig {
        self.metrics = metrics;
        self
    }
}

/// How a phase of the loop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Flow {
    /// Campaign (again).
    Campaign,
    /// Take over the leader key, which has named an unregistered machine for too long.
    TakeOver(LeaderKey),
    /// Shutdown was requested; return.
    Shutdown,
}

/// Runs an engine until `shutdown` turns true (or its sender is dropped). A leader resigns
/// on the way out so that another engine takes over at once.
pub async fn run<K: Kv>(registry: Registry<K>, cfg: EngineConfig, shutdown: watch::Receiver<bool>) {
    run_sharing(SharedStore::new(registry), cfg, shutdown).await;
}

/// [`run`], a leader planning on the process's store of the registry (`stores`), which it
/// shares with the API's listings when both run in one fleetd.
#[tracing::instrument(name = "engine", skip_all, fields(machine = %cfg.machine))]
pub async fn run_sharing<K: Kv>(
    stores: SharedStore<K>,
    cfg: EngineConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    info!(machine = %cfg.machine, lease_ttl = ?cfg.lease_ttl, "engine started");
    let mut refused = Refused::new(cfg.reconcile_interval);
    let mut take_over = None;
    while !stopping(&shutdown) {
        let held = take_over.take();
        match campaign_once(&stores, &cfg, &mut refused, &mut shutdown, held).await {
            Flow::Shutdown => break,
            Flow::TakeOver(key) => take_over = Some(key),
            Flow::Campaign => {}
        }
    }
    info!(machine = %cfg.machine, "engine stopped");
}

/// One campaign (or the take-over of `held`, a key naming an unregistered machine), then
/// leading or following until that ends.
async fn campaign_once<K: Kv>(
    stores: &SharedStore<K>,
    cfg: &EngineConfig,
    refused: &mut Refused,
    shutdown: &mut watch::Receiver<bool>,
    held: Option<LeaderKey>,
) -> Flow {
    let registry = stores.registry();
    let role = EngineRole::new(registry.clone());
    let outcome = match &held {
        Some(key) => {
            role.take_over_unregistered(&cfg.machine, cfg.lease_ttl, key)
                .await
        }
        None => role.campaign(&cfg.machine, cfg.lease_ttl).await,
    };
    if outcome.is_ok() {
        refused.permitted();
    }
    match outcome {
        Ok(Some(leadership)) => lead(stores, leadership, cfg, shutdown).await,
        Ok(None) => follow(registry, cfg, shutdown).await,
        Err(err) if is_refusal(&err) => {
            let delay = refused.next_delay();
            if refused.first() {
                error!(error = %err, retry_in = ?delay, "this host's etcd user may not campaign for engine leadership; retrying slowly");
            } else {
                debug!(error = %err, retry_in = ?delay, "engine campaign refused again");
            }
            pause(delay, shutdown).await
        }
        Err(err) => {
            warn!(error = %err, "engine campaign failed; retrying");
            pause(cfg.reconcile_interval, shutdown).await
        }
    }
}

/// Whether etcd refused the campaign itself (RBAC, credentials) rather than failing it.
fn is_refusal(err: &RegistryError) -> bool {
    matches!(
        err,
        RegistryError::Kv {
            cause: KvError::PermissionDenied { .. } | KvError::AuthFailed { .. },
            ..
        }
    )
}

/// Campaigns etcd refused in a row: how long to wait before the next, and whether the
/// refusal was logged already.
#[derive(Debug)]
struct Refused {
    backoff: Backoff,
    /// Refusals since the last permitted campaign.
    count: u32,
}

impl Refused {
    fn new(min: Duration) -> Refused {
        Refused {
            backoff: Backoff::new(min, REFUSED_RETRY_MAX),
            count: 0,
        }
    }

    /// Counts a refusal and returns the pause before the next campaign.
    fn next_delay(&mut self) -> Duration {
        self.count += 1;
        self.backoff.next_delay()
    }

    /// Whether the refusal just counted is the first in a row (the one logged).
    fn first(&self) -> bool {
        self.count == 1
    }

    /// A campaign went through: say so if refusals came before, and start over.
    fn permitted(&mut self) {
        if self.count > 0 {
            info!(
                refusals = self.count,
                "engine campaign permitted again by etcd"
            );
        }
        self.count = 0;
        self.backoff.reset();
    }
}

async fn lead<K: Kv>(
    stores: &SharedStore<K>,
    leadership: Leadership<K>,
    cfg: &EngineConfig,
    shutdown: &mut watch::Receiver<bool>,
) -> Flow {
    info!(machine = %cfg.machine, "engine leadership acquired");
    cfg.metrics.leading(true);
    let flow = leading::Leading::new(stores.clone(), leadership.clone(), cfg)
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

/// Waits until the leader key changes (deleted, or expired with its lease). The watch
/// resumes where it broke and wakes us when it does, so the re-check read is only a safety
/// net against a stream that hangs without breaking: once per [`leading::SAFETY_NET`],
/// jittered so that the followers of a large cluster (every fleetd runs an engine) do not
/// read in step.
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
    let net = leading::SAFETY_NET.max(cfg.lease_ttl);
    let mut recheck = Backoff::new(net * 3 / 4, net * 5 / 4);
    let grace = stray::grace(cfg);
    let mut suspicion: Option<stray::Suspicion> = None;
    loop {
        // Whether the key leads anything (issue 38): at once, then on the slow re-check in
        // case the watch missed a change, and when a suspicion ripens. Campaign only if the
        // key is gone, leads nothing (or cannot be read), without granting a lease for
        // nothing.
        let key = match registry.leader_key(Some(&cfg.machine)).await {
            Ok(key) => key,
            Err(_) => return Flow::Campaign,
        };
        match stray::judge(suspicion, &key, tokio::time::Instant::now(), grace) {
            stray::Verdict::Campaign => return Flow::Campaign,
            stray::Verdict::TakeOver => return Flow::TakeOver(key),
            stray::Verdict::Follow(now) => {
                if now.is_some() && suspicion.is_none() {
                    warn!(key = %key, grace = ?grace, "engine leader key names an unregistered machine; taking it over if it stays so");
                }
                suspicion = now;
            }
        }
        let mut delay = recheck.next_delay();
        if let Some(s) = &suspicion {
            delay = delay.min(
                s.due(grace)
                    .saturating_duration_since(tokio::time::Instant::now()),
            );
        }
        tokio::select! {
            () = stop_requested(shutdown) => return Flow::Shutdown,
            _ = hints.changed() => return Flow::Campaign,
            () = tokio::time::sleep(delay) => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_logged_once_per_run_of_refusals_and_backs_off_to_the_max() {
        let mut refused = Refused::new(Duration::from_secs(2));
        let delays: Vec<Duration> = (0..40).map(|_| refused.next_delay()).collect();
        assert!(!refused.first());
        assert!(delays.iter().all(|d| *d <= REFUSED_RETRY_MAX));
        assert!(
            delays.iter().any(|d| *d > Duration::from_secs(20)),
            "{delays:?}"
        );
        refused.permitted();
        refused.next_delay();
        assert!(refused.first(), "a new run of refusals is logged again");
    }

    #[test]
    fn only_refusals_of_etcd_count_as_refusals() {
        let kv = |cause| RegistryError::Kv {
            op: "claiming engine leadership",
            cause,
        };
        assert!(is_refusal(&kv(KvError::PermissionDenied {
            user: "u".into(),
            what: "write /k".into(),
        })));
        assert!(is_refusal(&kv(KvError::AuthFailed {
            user: "u".into(),
            detail: "authentication failed".into(),
        })));
        assert!(!is_refusal(&kv(KvError::Timeout(
            Duration::from_secs(1),
            "e".into()
        ))));
        assert!(!is_refusal(&RegistryError::LostLeadership));
    }
}
