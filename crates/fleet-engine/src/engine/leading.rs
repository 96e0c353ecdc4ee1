//! What a leader does: keep the lease alive (a separate task, so a slow pass never delays a
//! renewal), and run a pass (snapshot, plan, fenced write) at once, on every watch hint
//! (units, machines, schedules; unit states while a unit waits for a previous copy to stop)
//! and on the periodic re-check. It stops at the first sign of lost leadership; the fence
//! makes sure nothing it writes after that lands.

use fleet_core::{DesiredState, UnitFile, UnitHash};
use fleet_registry::kv::{Kv, Revision};
use fleet_registry::{
    EngineWrite, Leadership, Registry, RegistryError, ScheduleEntry, Snapshot, WatchHints,
};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{Instrument, debug, debug_span, info, warn};

use super::{EngineConfig, Flow, stop_requested};
use crate::scheduler::{Decision, DecisionKind, plan};

/// The shortest re-check period honoured (a zero interval would spin).
const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// Unit files fetched at once when many are new (an engine taking over a big cluster).
const FILE_FETCHES: usize = 16;

#[derive(Debug)]
pub(super) struct Leading<K> {
    registry: Registry<K>,
    leadership: Leadership<K>,
    reconcile_interval: Duration,
    lease_ttl: Duration,
    /// Unit files by hash: immutable, so kept across passes while some unit uses them.
    files: BTreeMap<UnitHash, UnitFile>,
    watches: Option<Watches>,
    /// The revision of the last snapshot planned and written; hints up to it are old news.
    settled_at: Revision,
    /// Whether the last plan held a unit back until a copy on another machine stops. Only
    /// then can a change of unit states change the plan, so only then do state hints (which
    /// every agent sends on every unit's state change) wake a pass.
    waiting: bool,
}

/// The prefixes whose changes can change a plan.
#[derive(Debug)]
struct Watches {
    units: WatchHints,
    machines: WatchHints,
    schedules: WatchHints,
    states: WatchHints,
}

impl Watches {
    fn start<K: Kv>(registry: &Registry<K>, from: Revision) -> Watches {
        let keys = registry.keys();
        let kv = registry.kv();
        Watches {
            units: WatchHints::start(kv.clone(), keys.units(), from),
            machines: WatchHints::start(kv.clone(), keys.machines(), from),
            schedules: WatchHints::start(kv.clone(), keys.schedules(), from),
            states: WatchHints::start(kv.clone(), keys.states(), from),
        }
    }

    /// The newest revision any watch reports; `None` when one of them stopped. State hints
    /// count only with `states`; meanwhile they coalesce into one (the newest revision),
    /// which a pass skips when its snapshot already covers it.
    async fn changed(&mut self, states: bool) -> Option<Revision> {
        tokio::select! {
            rev = self.units.changed() => rev,
            rev = self.machines.changed() => rev,
            rev = self.schedules.changed() => rev,
            rev = self.states.changed(), if states => rev,
        }
    }
}

/// Aborts the lease keeper when leading ends, however it ends.
struct Keeper(JoinHandle<()>);

impl Drop for Keeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<K: Kv> Leading<K> {
    pub fn new(registry: Registry<K>, leadership: Leadership<K>, cfg: &EngineConfig) -> Leading<K> {
        Leading {
            registry,
            leadership,
            reconcile_interval: cfg.reconcile_interval.max(MIN_INTERVAL),
            lease_ttl: cfg.lease_ttl.max(MIN_INTERVAL * 3),
            files: BTreeMap::new(),
            watches: None,
            settled_at: 0,
            waiting: false,
        }
    }

    /// Leads until leadership is lost ([`Flow::Campaign`]) or shutdown ([`Flow::Shutdown`]).
    pub async fn run(mut self, shutdown: &mut watch::Receiver<bool>) -> Flow {
        let (lost_tx, mut lost) = watch::channel(false);
        let _keeper = Keeper(tokio::spawn(keep(
            self.leadership.clone(),
            self.lease_ttl,
            lost_tx,
        )));
        let mut resync = tokio::time::interval(self.reconcile_interval);
        resync.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = stop_requested(shutdown) => return Flow::Shutdown,
                _ = lost.changed() => return Flow::Campaign,
                hint = wake(&mut self.watches, self.waiting) => match hint {
                    Some(rev) if rev <= self.settled_at => continue,
                    Some(_) => {}
                    None => self.watches = None,
                },
                _ = resync.tick() => {}
            }
            let pass = tokio::select! {
                biased;
                () = stop_requested(shutdown) => return Flow::Shutdown,
                _ = lost.changed() => return Flow::Campaign,
                res = self.pass().instrument(debug_span!("engine pass")) => res,
            };
            match pass {
                Ok(()) => {}
                Err(RegistryError::LostLeadership) => {
                    warn!("engine leadership lost: a write was refused");
                    return Flow::Campaign;
                }
                Err(err) => warn!(error = %err, "engine pass failed; retrying"),
            }
        }
    }

    /// Reads a snapshot, plans, writes the decisions fenced, then logs them.
    async fn pass(&mut self) -> Result<(), RegistryError> {
        let snapshot = self.registry.snapshot().await?;
        if self.watches.is_none() {
            self.watches = Some(Watches::start(&self.registry, snapshot.revision + 1));
        }
        self.fetch_files(&snapshot).await?;
        let plan = plan(&snapshot, &self.files);
        let writes: Vec<EngineWrite> = plan.decisions.iter().map(write_of).collect();
        self.leadership.write(&writes).await?;
        self.settled_at = snapshot.revision;
        self.waiting = !plan.waiting.is_empty();
        debug!(
            revision = snapshot.revision,
            decisions = plan.decisions.len(),
            waiting = plan.waiting.len(),
            "engine pass done"
        );
        plan.decisions.iter().for_each(log_decision);
        Ok(())
    }

    /// Makes `files` hold the file of every wanted unit; a file gone since the snapshot
    /// (its unit was replaced) is simply absent, and the plan leaves that unit alone.
    async fn fetch_files(&mut self, snapshot: &Snapshot) -> Result<(), RegistryError> {
        let wanted: BTreeSet<UnitHash> = snapshot
            .units
            .values()
            .filter(|u| u.desired() != DesiredState::Inactive)
            .map(|u| u.hash())
            .collect();
        self.files.retain(|hash, _| wanted.contains(hash));
        let missing: Vec<UnitHash> = wanted
            .into_iter()
            .filter(|hash| !self.files.contains_key(hash))
            .collect();
        let registry = &self.registry;
        let mut fetched = futures::stream::iter(missing)
            .map(|hash| async move { (hash, registry.file(&hash).await) })
            .buffer_unordered(FILE_FETCHES);
        while let Some((hash, file)) = fetched.next().await {
            match file {
                Ok(Some(file)) => {
                    self.files.insert(hash, file);
                }
                Ok(None) => {}
                // One unreadable file must not stop the scheduling of every other unit: its
                // units are left as they are (the scheduler skips units without a file).
                Err(e @ RegistryError::Corrupt { .. }) => {
                    warn!(hash = %hash, error = %e, "unit file unreadable; its units are left alone");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The next hint (of unit states too with `states`); never resolves while there are no
/// watches (the next pass starts them).
async fn wake(watches: &mut Option<Watches>, states: bool) -> Option<Revision> {
    match watches {
        Some(w) => w.changed(states).await,
        None => std::future::pending().await,
    }
}

/// Renews the lease every third of its TTL; signals `lost` when leadership is gone or could
/// not be renewed for a whole TTL (etcd unreachable: the lease has lapsed by then).
async fn keep<K: Kv>(leadership: Leadership<K>, ttl: Duration, lost: watch::Sender<bool>) {
    let mut renewed = Instant::now();
    loop {
        tokio::time::sleep(ttl / 3).await;
        match leadership.renew().await {
            Ok(()) => renewed = Instant::now(),
            Err(RegistryError::LostLeadership) => {
                warn!("engine leadership lost: the lease or the leader key is gone");
                break;
            }
            Err(err) if renewed.elapsed() < ttl => {
                warn!(error = %err, "renewing engine leadership failed; retrying");
            }
            Err(err) => {
                warn!(error = %err, "engine leadership lapsed: not renewed for a whole lease");
                break;
            }
        }
    }
    let _ = lost.send(true);
}

fn write_of(decision: &Decision) -> EngineWrite {
    match &decision.kind {
        DecisionKind::Unschedule { unit, machine } => EngineWrite::Unschedule {
            machine: machine.clone(),
            unit: unit.clone(),
        },
        DecisionKind::Update {
            unit,
            machine,
            hash,
            desired,
            restart,
            no_restart,
            placement,
        }
        | DecisionKind::Schedule {
            unit,
            machine,
            hash,
            desired,
            restart,
            no_restart,
            placement,
        } => EngineWrite::Schedule(ScheduleEntry {
            name: unit.clone(),
            machine: machine.clone(),
            hash: *hash,
            desired: *desired,
            restart: *restart,
            no_restart: *no_restart,
            placement: *placement,
        }),
        DecisionKind::Unschedulable { unit } => EngineWrite::Unschedulable {
            unit: unit.clone(),
            reason: decision.reason.to_string(),
        },
        DecisionKind::ClearUnschedulable { unit } => {
            EngineWrite::ClearUnschedulable { unit: unit.clone() }
        }
    }
}

fn log_decision(decision: &Decision) {
    let reason = &decision.reason;
    match &decision.kind {
        DecisionKind::Unschedule { unit, machine } => {
            info!(unit = %unit, machine = %machine, reason = %reason, "unscheduling unit");
        }
        DecisionKind::Update {
            unit,
            machine,
            hash,
            desired,
            ..
        } => {
            info!(unit = %unit, machine = %machine, hash = %hash, desired = %desired, reason = %reason, "updating unit in place");
        }
        DecisionKind::Schedule {
            unit,
            machine,
            hash,
            desired,
            ..
        } => {
            info!(unit = %unit, machine = %machine, hash = %hash, desired = %desired, reason = %reason, "scheduling unit");
        }
        DecisionKind::Unschedulable { unit } => {
            warn!(unit = %unit, reason = %reason, "unit cannot be scheduled");
        }
        DecisionKind::ClearUnschedulable { unit } => {
            info!(unit = %unit, reason = %reason, "unit no longer unschedulable");
        }
    }
}
