//! What a leader does: keep the lease alive (a separate task, so a slow pass never delays a
//! renewal), and run a pass (plan on the process's [`Store`] of the registry, fenced write) at once,
//! on every change that can change a plan, and once a minute as a safety net unless the view
//! has not changed since a whole plan found nothing to do. It stops at the first sign of lost
//! leadership; the fence makes sure nothing it writes after that lands.
//!
//! The store is read once (or shared with the API's listings) and then follows one watch,
//! so an idle leader reads and decodes nothing: before, every pass re-read the whole
//! registry, and a pass ran every `engine_reconcile_interval` (see docs/benchmarks.md). A
//! leader subscribes when leadership starts, to a store caught up with the present, and
//! after each write waits until the store has applied it, so that the next plan sees what
//! the last one wrote (a unit placed by it must not look unplaced).
//!
//! Before each plan, [`Disruption`] says which units of vanished machines must stay (a
//! settle, a mass vanishing, the move rate); the leader publishes why rescheduling is held
//! at `P/engine/disruption`, in the same fenced writes, and passes again when a hold ends.
//!
//! What a pass plans (every unit, or only those that changed) and what passes remember
//! between them is decided on data by [`PassPlanner`] (`engine/planner.rs`): a pass here only
//! reads the view, asks it, writes fenced and records.
//!
//! At takeover the leader makes the placement mirror (`P/placement/<name>/<machine>`) match
//! its view's schedule once; every schedule write after that carries its placement.

use fleet_core::{Backoff, UnitFile, UnitHash};
use fleet_registry::kv::{Kv, KvError, next_renewal, renewal_window};
use fleet_registry::{
    Changes, EngineWrite, Leadership, Registry, RegistryError, SharedStore, Snapshot, Store,
    Subscription, Touched, WatchHints, texts_of,
};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior, timeout};
use tracing::{Instrument, debug, debug_span, info, warn};

use super::copies::{self, Copies};
use super::decision_log;
use super::events::EngineEvents;
use super::planner::{PassPlan, PassPlanner};
use super::{EngineConfig, Flow, stop_requested};
use crate::disruption::{Assessment, Hold};
use crate::metrics::{Failure, Metrics};
use crate::scheduler::strays;

/// The shortest re-check period honoured (a zero interval would spin).
const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// The first retry of a failed pass comes this soon (then later, up to
/// `engine_reconcile_interval`). At 100,000 units on 5,000 machines and fleetd's 1 s request
/// deadline, a schedule write now and then ran past it; each cost the whole 2 s, and the
/// engine fell 39 s behind the submit (issue 43).
const RETRY_MIN: Duration = Duration::from_millis(200);

/// How often a leader plans with nothing having changed: only a safety net, since every
/// change that can change a plan arrives through the view's watch.
pub(crate) const SAFETY_NET: Duration = Duration::from_secs(60);

/// How long a new leader waits for a store another user holds to apply the present
/// revision before it has a new one read instead.
const CATCH_UP: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(super) struct Leading<K> {
    registry: Registry<K>,
    /// The process's store of the registry, shared with the API's listings.
    stores: SharedStore<K>,
    leadership: Leadership<K>,
    /// How long to wait before retrying a failed pass: from [`RETRY_MIN`] up to
    /// `engine_reconcile_interval`, growing while passes keep failing.
    retry: Backoff,
    /// Whether the last pass's write failed in doubt (past its deadline, or the connection
    /// lost under it): etcd may still apply it, so the retry waits as long as it always did,
    /// `engine_reconcile_interval`, not the backoff's first 200 ms. A plan on a view without
    /// writes still on their way could place a unit a second time.
    in_doubt: bool,
    /// The wait after a write in doubt: `engine_reconcile_interval`.
    in_doubt_wait: Duration,
    /// How often a pass comes without a change (at least `engine_reconcile_interval`).
    safety_net: Duration,
    lease_ttl: Duration,
    /// The registry as the next plan sees it, and what changed in it since the last pass;
    /// `None` until subscribed (again).
    view: Option<Subscription>,
    /// Whether a pass's write failed since the view last caught up: some of it may have
    /// landed, so the next pass first waits for the view to apply the present revision, up
    /// to a lease, and reads a new one only if it has not by then. The view is kept, not
    /// subscribed anew: at 100,000 units on 5,000 machines a store is some 50 MB of etcd
    /// reads, and each failed write made a new one (214.6 MiB read in one launch, issue 43);
    /// and a new subscription plans every unit, where a kept one plans the failed pass's
    /// units and what changed since (`PassPlanner::write_failed`).
    behind: bool,
    /// What each pass plans, and what passes remember between them.
    planner: PassPlanner,
    /// The hold last logged, to log a change once.
    logged_hold: Option<Hold>,
    /// Whether this leadership has made the placement mirror match its view's schedule (once,
    /// at takeover: from then on every schedule write carries its placement).
    placements_repaired: bool,
    /// Units waiting for a previous copy, and stray states: what was reported of them.
    copies: Copies,
    metrics: Metrics,
    /// The decisions written, as events (issue 41).
    events: EngineEvents,
    /// Whether schedule entries carry their files' text (`EngineConfig::carry_files`).
    carry_files: bool,
}

/// Aborts the lease keeper when leading ends, however it ends.
struct Keeper(JoinHandle<()>);

impl Drop for Keeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<K: Kv> Leading<K> {
    pub fn new(
        stores: SharedStore<K>,
        leadership: Leadership<K>,
        cfg: &EngineConfig,
    ) -> Leading<K> {
        Leading {
            registry: stores.registry().clone(),
            stores,
            leadership,
            retry: Backoff::new(
                RETRY_MIN.min(cfg.reconcile_interval).max(MIN_INTERVAL),
                cfg.reconcile_interval.max(MIN_INTERVAL),
            ),
            in_doubt: false,
            in_doubt_wait: cfg.reconcile_interval.max(MIN_INTERVAL),
            safety_net: SAFETY_NET.max(cfg.reconcile_interval),
            lease_ttl: cfg.lease_ttl.max(MIN_INTERVAL * 3),
            view: None,
            behind: false,
            planner: PassPlanner::new(cfg.disruption, Instant::now()),
            logged_hold: None,
            placements_repaired: false,
            copies: Copies::default(),
            metrics: cfg.metrics.clone(),
            events: EngineEvents::new(cfg.events.clone()),
            carry_files: cfg.carry_files,
        }
    }

    /// Leads until leadership is lost ([`Flow::Campaign`]) or shutdown ([`Flow::Shutdown`]).
    pub async fn run(mut self, shutdown: &mut watch::Receiver<bool>) -> Flow {
        let (lost_tx, mut lost) = watch::channel(false);
        let _keeper = Keeper(tokio::spawn(
            keep(self.leadership.clone(), self.lease_ttl, lost_tx).in_current_span(),
        ));
        let period = self.safety_net;
        let mut safety_net = tokio::time::interval_at(Instant::now() + period, period);
        safety_net.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // Whether a pass is due: at once, then after each change that matters.
        let mut due = true;
        loop {
            if due {
                let pass = tokio::select! {
                    biased;
                    () = stop_requested(shutdown) => return Flow::Shutdown,
                    _ = lost.changed() => return Flow::Campaign,
                    res = self.pass().instrument(debug_span!("engine pass")) => res,
                };
                match pass {
                    Ok(()) => self.retry.reset(),
                    Err(RegistryError::LostLeadership) => {
                        warn!("engine leadership lost: a write was refused");
                        return Flow::Campaign;
                    }
                    Err(err) => {
                        let retry_in = self.retry_delay();
                        warn!(error = %err, ?retry_in, "engine pass failed; retrying");
                        tokio::select! {
                            biased;
                            () = stop_requested(shutdown) => return Flow::Shutdown,
                            _ = lost.changed() => return Flow::Campaign,
                            () = tokio::time::sleep(retry_in) => {}
                        }
                        continue;
                    }
                }
            }
            tokio::select! {
                biased;
                () = stop_requested(shutdown) => return Flow::Shutdown,
                _ = lost.changed() => return Flow::Campaign,
                change = changed(self.view.as_ref()) => match change {
                    Ok(touched) => due = self.planner.changed(touched),
                    Err(err) => {
                        warn!(error = %err, "engine lost track of the registry; reading it again");
                        self.view = None;
                        due = true;
                    }
                },
                _ = safety_net.tick() => {
                    let revision = self.view.as_ref().map(|v| v.store().revision());
                    due = self.planner.safety_net(revision);
                }
                () = sleep_until(self.planner.recheck()) => {
                    due = true;
                    self.planner.recheck_came();
                }
            }
        }
    }

    /// Subscribes to the store (if not subscribed), plans on it, writes the decisions
    /// fenced, waits until the store has applied them, then logs them.
    async fn pass(&mut self) -> Result<(), RegistryError> {
        let started = Instant::now();
        if let Err(err) = self.read().await {
            self.metrics.failed(Failure::of(&err), None);
            return Err(err);
        }
        let view = self.view.as_ref().expect("just read");
        let store = view.store().clone();
        let (pass, writes, stray_keys, texts) = {
            let read = store.read().await;
            let Changes { touched, units } = view.take(&read);
            // What arrived since the loop woke up is planned now: the planner hears of it.
            self.planner.changed(touched);
            let (snapshot, files) = (read.snapshot(), read.files());
            self.events.confirm(snapshot);
            let pass = self.planner.next(snapshot, files, units, Instant::now());
            let stray_keys = crate::unreadable::stray_schedule_keys(snapshot, self.registry.keys());
            let mut writes: Vec<EngineWrite> = pass.decision_writes().collect();
            writes.extend(stray_keys.iter().cloned().map(EngineWrite::DeleteStray));
            writes.extend(pass.notice_write());
            let carried = writes.iter().filter_map(scheduled_hash);
            let texts = texts_of(carried.filter(|_| self.carry_files), files);
            (pass, writes, stray_keys, texts)
        };
        let planned_in = started.elapsed();
        let writing = Instant::now();
        let landed = match self.leadership.write_carrying(&writes, &texts).await {
            Ok(landed) => landed,
            Err(err) => {
                // Some of the writes may have landed: the next pass plans on the view caught
                // up with the present, and plans this pass's units again.
                self.behind = true;
                self.in_doubt = in_doubt(&err);
                self.planner.write_failed(&pass);
                self.events.failed(&pass.plan.decisions);
                self.metrics.failed(Failure::of(&err), Some(&pass.plan));
                return Err(err);
            }
        };
        let written_in = writing.elapsed();
        if let Some(revision) = landed
            && let Err(err) = self.applied(&store, revision).await
        {
            self.view = None;
            // Written: its events are told, though the view did not see it in time.
            self.events.decided(&pass.plan.decisions);
            self.metrics.failed(Failure::of(&err), Some(&pass.plan));
            return Err(err);
        }
        let applied_in = writing.elapsed() - written_in;
        self.metrics.reconciled(&pass.plan, started.elapsed());
        for key in &stray_keys {
            info!(key = %key, "deleted a schedule key that names no entry");
        }
        let read = store.read().await;
        let (snapshot, files) = (read.snapshot(), read.files());
        self.planner.done(&pass, snapshot, writes.is_empty());
        record(&mut self.copies, &self.metrics, &pass, snapshot, files);
        let times = PassTimes {
            planned_in,
            written_in,
            applied_in,
            done_in: started.elapsed(),
        };
        log_pass(read.revision(), &pass, writes.len(), &times);
        drop(read);
        self.log_assessment(&pass.assessment);
        pass.plan.decisions.iter().for_each(decision_log::log);
        self.events.decided(&pass.plan.decisions);
        Ok(())
    }

    /// After a failed write: waits until the view has applied the present revision, at most
    /// a lease (a successful pass waits as long for its own writes); a view that has not by
    /// then is given up, and the next subscription reads a new one.
    async fn catch_up(&mut self) -> Result<(), RegistryError> {
        if let Some(view) = &self.view {
            let store = view.store().clone();
            let present = self
                .registry
                .present_revision("reading the present revision for the engine's view")
                .await?;
            let within = self.lease_ttl.max(CATCH_UP);
            if !matches!(timeout(within, store.reached(present)).await, Ok(Ok(()))) {
                debug!(
                    store = store.revision(),
                    present,
                    "the view did not reach the present (behind or lost); reading a new one"
                );
                store.give_up("behind the present revision after a failed write");
                self.view = None;
            }
        }
        self.behind = false;
        Ok(())
    }

    /// Waits until `store` has applied the writes that landed at `revision`, at most a
    /// lease: a store that has not by then is given up (every user reads a new one).
    async fn applied(&self, store: &Store, revision: i64) -> Result<(), RegistryError> {
        match timeout(self.lease_ttl, store.reached(revision)).await {
            Ok(reached) => reached,
            Err(_) => {
                let why = "the engine's writes did not arrive within a lease";
                store.give_up(why);
                Err(RegistryError::ViewLost(why.to_owned()))
            }
        }
    }

    /// How long to wait before retrying a failed pass: the backoff's next delay, at least
    /// `engine_reconcile_interval` after a write in doubt.
    fn retry_delay(&mut self) -> Duration {
        let delay = self.retry.next_delay();
        if std::mem::take(&mut self.in_doubt) {
            return delay.max(self.in_doubt_wait);
        }
        delay
    }

    /// Subscribes to the store if not subscribed, and makes the placement mirror match its
    /// schedule once per leadership.
    async fn read(&mut self) -> Result<(), RegistryError> {
        if self.behind {
            self.catch_up().await?;
        }
        if self.view.is_none() {
            self.view = Some(self.stores.current(CATCH_UP).await?.subscribe());
            self.planner.new_view();
        }
        if !self.placements_repaired {
            let store = self.view.as_ref().expect("just read").store().clone();
            // Held across the repair (once per leadership): the store waits meanwhile.
            let read = store.read().await;
            // A previous leader may predate the mirror, or have been cut off mid-batch.
            match self.leadership.repair_placements(read.snapshot()).await? {
                0 => {}
                repaired => info!(repaired, "placement mirror repaired from the schedule"),
            }
            self.placements_repaired = true;
        }
        Ok(())
    }
}

impl<K> Leading<K> {
    /// Logs a hold when it starts or changes and when it ends, and moves the rate defers.
    fn log_assessment(&mut self, a: &Assessment) {
        if a.hold != self.logged_hold {
            match &a.hold {
                Some(hold) => {
                    let held: Vec<&str> = hold.held.iter().map(|m| m.as_str()).collect();
                    warn!(
                        vanished = hold.vanished,
                        machines = hold.machines,
                        held = %held.join(","),
                        reason = %hold,
                        "rescheduling held"
                    );
                }
                None => info!("rescheduling hold ended"),
            }
            self.events.held(a.hold.as_ref());
            self.logged_hold = a.hold.clone();
        }
        if a.rate_limited > 0 {
            info!(
                moving = a.moving,
                deferred = a.rate_limited,
                "moves of lost machines' units rate-limited"
            );
        }
    }
}

/// Where a pass's time went: planning (with reading the view), writing, and waiting for
/// its writes to come back through the store's watch.
struct PassTimes {
    planned_in: Duration,
    written_in: Duration,
    applied_in: Duration,
    done_in: Duration,
}

/// The pass's debug line: what it planned and decided, and where its time went (the scale
/// bench's passes are read from it, docs/benchmarks.md).
fn log_pass(revision: i64, pass: &PassPlan, writes: usize, t: &PassTimes) {
    debug!(
        revision,
        planned = pass.what(),
        changed = pass.changed,
        decisions = pass.plan.decisions.len(),
        waiting = pass.plan.waiting.len(),
        writes,
        planned_in = ?t.planned_in,
        written_in = ?t.written_in,
        applied_in = ?t.applied_in,
        done_in = ?t.done_in,
        "engine pass done"
    );
}

/// Counts what the view holds that cannot be read, and reports the strays among the
/// units the pass planned and the units its plan holds back for a previous copy.
fn record(
    copies: &mut Copies,
    metrics: &Metrics,
    pass: &PassPlan,
    snapshot: &Snapshot,
    files: &BTreeMap<UnitHash, UnitFile>,
) {
    metrics.unreadable(snapshot.skipped.len(), snapshot.state_bound.past_total());
    let planned = pass.planned();
    let found = match planned {
        Some(units) => strays(snapshot, files, units),
        None => strays(snapshot, files, snapshot.states.keys()),
    };
    let now = Instant::now();
    copies::report(copies, metrics, now, &pass.plan, planned, found);
}

/// Resolves at `at`; never without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The next change of the store that touched something; never resolves without a
/// subscription (the next pass subscribes).
async fn changed(view: Option<&Subscription>) -> Result<Touched, RegistryError> {
    match view {
        Some(v) => v.changed().await,
        None => std::future::pending().await,
    }
}

/// Renews the lease every third of its TTL, and [`next_renewal`]'s moment after a renewal
/// failed while the lease may live; signals `lost` when leadership is gone or could not be
/// renewed for a whole TTL (etcd unreachable: the lease has lapsed by then).
///
/// A renewal is a lease call only. Whether the leader key still holds us is known from a
/// watch of the key, read again only when the watch says it changed or broke: an idle
/// leader reads nothing (issue 19). A watch that stays silent while the key is lost costs
/// nothing either: every write is fenced by the key, and the first one refused ends leading.
async fn keep<K: Kv>(leadership: Leadership<K>, ttl: Duration, lost: watch::Sender<bool>) {
    let mut renewed = Instant::now();
    let mut renewal_due = Instant::now() + ttl / 3;
    let mut key: Option<WatchHints> = None;
    loop {
        if key.is_none() {
            match leadership.watch().await {
                Ok(hints) => key = Some(hints),
                Err(RegistryError::LostLeadership) => {
                    warn!("engine leadership lost: the leader key is gone or taken");
                    break;
                }
                // Checked again with the next renewal.
                Err(err) => debug!(error = %err, "watching the engine leader key failed"),
            }
        }
        tokio::select! {
            () = tokio::time::sleep_until(renewal_due) => {
                let sent = Instant::now();
                // etcd renewed the lease no earlier than the request's send time.
                match leadership.refresh_within(renewal_window(ttl, sent - renewed)).await {
                    Ok(()) => {
                        renewed = sent;
                        renewal_due = sent + next_renewal(ttl, false, Duration::ZERO);
                    }
                    Err(RegistryError::LostLeadership) => {
                        warn!("engine leadership lost: the lease is gone");
                        break;
                    }
                    Err(err) if renewed.elapsed() < ttl => {
                        // The lease may live a while yet: ask again soon, not a third later.
                        let retry_in = next_renewal(ttl, true, renewed.elapsed());
                        renewal_due = Instant::now() + retry_in;
                        warn!(error = %err, ?retry_in, "renewing engine leadership failed; retrying");
                    }
                    Err(err) => {
                        warn!(error = %err, "engine leadership lapsed: not renewed for a whole lease");
                        break;
                    }
                }
            }
            changed = key_changed(&mut key) => {
                if !changed {
                    // The watch task ended: start another (and read the key) next round.
                    key = None;
                    continue;
                }
                match leadership.check().await {
                    Ok(_) => {}
                    Err(RegistryError::LostLeadership) => {
                        warn!("engine leadership lost: the leader key is gone or taken");
                        break;
                    }
                    Err(err) => {
                        // A change went unread: read (and watch) the key again next round.
                        debug!(error = %err, "checking engine leadership failed");
                        key = None;
                    }
                }
            }
        }
    }
    let _ = lost.send(true);
}

/// Whether the watched leader key changed (`false`: the watch ended); never resolves without
/// a watch.
async fn key_changed(key: &mut Option<WatchHints>) -> bool {
    match key {
        Some(hints) => hints.changed().await.is_some(),
        None => std::future::pending().await,
    }
}

/// The file a write's schedule entry names, if it writes one: the files whose text the
/// entries carry to their agents.
fn scheduled_hash(write: &EngineWrite) -> Option<&UnitHash> {
    match write {
        EngineWrite::Schedule(entry) => Some(&entry.hash),
        _ => None,
    }
}

/// Whether a failed write may still be applied by etcd: it ran past its deadline, or the
/// connection went under it.
fn in_doubt(err: &RegistryError) -> bool {
    matches!(
        err,
        RegistryError::Kv {
            cause: KvError::Timeout(..) | KvError::Unavailable { .. },
            ..
        }
    )
}
