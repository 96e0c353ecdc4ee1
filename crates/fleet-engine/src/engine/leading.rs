//! What a leader does: keep the lease alive (a separate task, so a slow pass never delays a
//! renewal), and run a pass (plan on its [`LiveView`] of the registry, fenced write) at once,
//! on every change that can change a plan, and once a minute as a safety net unless the view
//! has not changed since a whole plan found nothing to do. It stops at the first sign of lost
//! leadership; the fence makes sure nothing it writes after that lands.
//!
//! The view is read once when leadership starts and then follows one watch, so an idle
//! leader reads and decodes nothing: before, every pass re-read the whole registry, and a
//! pass ran every `engine_reconcile_interval` (see docs/benchmarks.md).
//!
//! Before each plan, [`Disruption`] says which units of vanished machines must stay (a
//! settle, a mass vanishing, the move rate); the leader publishes why rescheduling is held
//! at `P/engine/disruption`, in the same fenced writes, and passes again when a hold ends.
//!
//! At takeover the leader makes the placement mirror (`P/placement/<name>/<machine>`) match
//! its view's schedule once; every schedule write after that carries its placement.

use fleet_registry::kv::{Kv, Revision};
use fleet_registry::{
    EngineWrite, Leadership, LiveView, MoveRecord, Registry, RegistryError, Touched, WatchHints,
};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{Instrument, debug, debug_span, info, warn};

use super::copies::{self, Copies};
use super::decision_log;
use super::{EngineConfig, Flow, stop_requested};
use crate::disruption::{Assessment, Disruption, Hold};
use crate::metrics::{Failure, Metrics};
use crate::scheduler::{
    Decision, DecisionKind, Entangled, Load, plan_delta_on, plan_holding, strays, touched_by_loss,
};
use fleet_core::UnitName;
use std::borrow::Cow;
use std::collections::BTreeSet;

/// The shortest re-check period honoured (a zero interval would spin).
const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// How often a leader plans with nothing having changed: only a safety net, since every
/// change that can change a plan arrives through the view's watch.
pub(crate) const SAFETY_NET: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub(super) struct Leading<K> {
    registry: Registry<K>,
    leadership: Leadership<K>,
    /// How long to wait before retrying a failed pass.
    retry: Duration,
    lease_ttl: Duration,
    /// The registry as the next plan sees it; `None` until read (again).
    view: Option<LiveView<K>>,
    /// Whether the last plan held a unit back until a copy on another machine stops. Only
    /// then can a change of unit states change the plan, so only then do state changes
    /// (which every agent writes on every unit's state change) start a pass.
    waiting: bool,
    /// The presence history of this leadership: which vanished machines' units stay.
    disruption: Disruption,
    /// When the last assessment changes by itself: a pass is due then.
    recheck: Option<Instant>,
    /// The disruption notice the registry holds, as far as we know (`None`: unknown, e.g.
    /// at the start of leadership, so the first pass writes it either way).
    notice: Option<Option<String>>,
    /// The hold last logged, to log a change once.
    logged_hold: Option<Hold>,
    /// Whether this leadership has made the placement mirror match its view's schedule (once,
    /// at takeover: from then on every schedule write carries its placement).
    placements_repaired: bool,
    /// Whether the next pass must plan every unit: at the start, after a machine registered
    /// or changed what it offers, and on the safety net. Otherwise a pass plans only the
    /// units that changed when [`plan_delta`] can (see `scheduler/delta.rs`).
    whole_due: bool,
    /// Whether a machine left, or the disruption's re-check came, since the last pass: the
    /// next one asks the disruption rule, and plans the lost machines' units it may move
    /// with the units that changed.
    loss_due: bool,
    /// The units whose options tie them to others, as of the last whole plan (`None`: none
    /// made yet with this view).
    entangled: Option<Entangled>,
    /// Each machine's schedule entries in the view, kept across delta passes (`None`:
    /// counted at the next one). Only the leader writes schedules, and a delta pass
    /// changes only its touched units' entries.
    load: Option<Load>,
    /// The view's revision after a whole plan that decided nothing, with nothing waiting,
    /// held or due to change by itself: the plan of that revision is known to be empty, so
    /// the safety net does not plan it again (issue 19: the idle leader's minute pass was a
    /// fifth of an idle fleetd's CPU with 3,000 units). Any pass that is not such a plan
    /// clears it.
    settled: Option<Revision>,
    /// Units waiting for a previous copy, and stray states: what was reported of them.
    copies: Copies,
    metrics: Metrics,
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
            retry: cfg.reconcile_interval.max(MIN_INTERVAL),
            lease_ttl: cfg.lease_ttl.max(MIN_INTERVAL * 3),
            view: None,
            waiting: false,
            disruption: Disruption::new(cfg.disruption, Instant::now()),
            recheck: None,
            notice: None,
            logged_hold: None,
            placements_repaired: false,
            whole_due: true,
            loss_due: false,
            entangled: None,
            load: None,
            settled: None,
            copies: Copies::default(),
            metrics: cfg.metrics.clone(),
        }
    }

    /// Leads until leadership is lost ([`Flow::Campaign`]) or shutdown ([`Flow::Shutdown`]).
    pub async fn run(mut self, shutdown: &mut watch::Receiver<bool>) -> Flow {
        let (lost_tx, mut lost) = watch::channel(false);
        let _keeper = Keeper(tokio::spawn(
            keep(self.leadership.clone(), self.lease_ttl, lost_tx).in_current_span(),
        ));
        let period = SAFETY_NET.max(self.retry);
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
                    Ok(()) => {}
                    Err(RegistryError::LostLeadership) => {
                        warn!("engine leadership lost: a write was refused");
                        return Flow::Campaign;
                    }
                    Err(err) => {
                        warn!(error = %err, retry_in = ?self.retry, "engine pass failed; retrying");
                        tokio::select! {
                            biased;
                            () = stop_requested(shutdown) => return Flow::Shutdown,
                            _ = lost.changed() => return Flow::Campaign,
                            () = tokio::time::sleep(self.retry) => {}
                        }
                        continue;
                    }
                }
            }
            tokio::select! {
                biased;
                () = stop_requested(shutdown) => return Flow::Shutdown,
                _ = lost.changed() => return Flow::Campaign,
                change = changed(&mut self.view) => match change {
                    Ok(touched) => {
                        due = self.matters(touched);
                        self.whole_due |= touched.machines;
                        self.loss_due |= touched.departed;
                    }
                    Err(err) => {
                        warn!(error = %err, "engine lost track of the registry; reading it again");
                        self.view = None;
                        due = true;
                    }
                },
                _ = safety_net.tick() => {
                    due = !self.settled_view();
                    self.whole_due |= due;
                }
                () = sleep_until(self.recheck) => {
                    due = true;
                    self.loss_due = true;
                }
            }
        }
    }

    /// Whether the view is still at the revision of the last whole plan that found nothing
    /// to do (see `settled`): planning it again would find nothing again, the planner being
    /// a function of the view and of the disruption's assessment, which was quiet.
    fn settled_view(&self) -> bool {
        let revision = self.view.as_ref().map(LiveView::revision);
        revision.is_some() && revision == self.settled
    }

    /// Whether a change can change the plan. Schedules and unschedulable reasons are written
    /// by the leader alone and already recorded in the view when written: their echo is
    /// not news. Unit states matter only while a unit waits for a copy to stop.
    fn matters(&self, t: Touched) -> bool {
        t.units || t.files || t.machines || t.departed || (t.states && self.waiting)
    }

    /// Plans on the view (reading it first if there is none), writes the decisions fenced,
    /// records them in the view, then logs them.
    #[allow(
        clippy::too_many_lines,
        reason = "the I/O shell of one pass: read, plan, write, record; its choice between a delta and a whole plan is to become a pure planner (issue 39, item 2)"
    )]
    async fn pass(&mut self) -> Result<(), RegistryError> {
        let started = Instant::now();
        self.settled = None;
        if self.view.is_none() {
            self.entangled = None;
            self.load = None;
            match LiveView::start(self.registry.clone()).await {
                Ok(view) => self.view = Some(view),
                Err(err) => {
                    self.metrics.failed(Failure::of(&err), None);
                    return Err(err);
                }
            }
        }
        let view = self.view.as_mut().expect("just read");
        if !self.placements_repaired {
            // A previous leader may predate the mirror, or have been cut off mid-batch.
            match self.leadership.repair_placements(view.snapshot()).await {
                Ok(0) => {}
                Ok(repaired) => info!(repaired, "placement mirror repaired from the schedule"),
                Err(err) => {
                    self.metrics.failed(Failure::of(&err), None);
                    return Err(err);
                }
            }
            self.placements_repaired = true;
        }
        let changed = view.take_changed_units();
        let partial = match (&changed, &self.entangled) {
            (Some(units), Some(entangled)) if !self.whole_due && !self.waiting => {
                Some((units, entangled))
            }
            _ => None,
        };
        // Machines left, or units of vanished machines wait: the disruption rule says which
        // of those units stay (a settle, a hold, the move rate). A whole plan always asks.
        let losing = self.loss_due || !self.disruption.quiet();
        let mut assessment = (partial.is_none() || losing)
            .then(|| self.disruption.assess(Instant::now(), view.snapshot()));
        // The units a delta pass plans, and the load of the others.
        let mut delta: Option<(Cow<'_, BTreeSet<UnitName>>, Load)> = None;
        let part = partial.and_then(|(units, entangled)| {
            let touched = match &assessment {
                None => Cow::Borrowed(units),
                // A loss is planned as a change of the lost machines' units that may move.
                Some(a) => Cow::Owned(touched_by_loss(view.snapshot(), units, &a.held)),
            };
            let load = self.load.get_or_insert_with(|| Load::of(view.snapshot()));
            let others = load.without(view.snapshot(), &touched);
            let none = BTreeSet::new();
            let held = assessment.as_ref().map_or(&none, |a| &a.held);
            let plan = plan_delta_on(
                view.snapshot(),
                view.files(),
                &touched,
                entangled,
                held,
                others.clone(),
            );
            delta = Some((touched, others));
            plan
        });
        let whole = part.is_none();
        if whole && assessment.is_none() {
            assessment = Some(self.disruption.assess(Instant::now(), view.snapshot()));
        }
        let assessed = assessment.is_some();
        let assessment = assessment.unwrap_or_default();
        let plan = match part {
            Some(plan) => plan,
            None => plan_holding(view.snapshot(), view.files(), &assessment.held),
        };
        let planned_in = started.elapsed();
        let mut writes: Vec<EngineWrite> = plan.decisions.iter().map(write_of).collect();
        let stray_keys =
            crate::unreadable::stray_schedule_keys(view.snapshot(), self.registry.keys());
        writes.extend(stray_keys.iter().cloned().map(EngineWrite::DeleteStray));
        let notice = assessment.hold.as_ref().map(ToString::to_string);
        if self.notice.as_ref() != Some(&notice) {
            writes.push(EngineWrite::Disruption {
                notice: notice.clone(),
            });
        }
        if let Err(err) = self.leadership.write(&writes).await {
            // Some of the writes may have landed: only a fresh read knows.
            self.view = None;
            self.load = None;
            self.notice = None;
            self.metrics.failed(Failure::of(&err), Some(&plan));
            return Err(err);
        }
        self.metrics.reconciled(&plan, started.elapsed());
        for key in &stray_keys {
            info!(key = %key, "deleted a schedule key that names no entry");
        }
        view.record_writes(&writes);
        let planned = delta.as_ref().filter(|_| !whole).map(|(t, _)| t.as_ref());
        let snapshot = view.snapshot();
        self.metrics
            .unreadable(snapshot.skipped.len(), snapshot.state_bound.past_total());
        let found = match planned {
            Some(units) => strays(snapshot, view.files(), units),
            None => strays(snapshot, view.files(), snapshot.states.keys()),
        };
        let now = Instant::now();
        copies::report(&mut self.copies, &self.metrics, now, &plan, planned, found);
        self.notice = Some(notice);
        self.waiting = !plan.waiting.is_empty();
        let written_in = started.elapsed() - planned_in;
        if assessed {
            self.recheck = assessment.recheck;
        }
        let settled = whole
            && writes.is_empty()
            && !self.waiting
            && self.recheck.is_none()
            && self.disruption.quiet();
        self.settled = settled.then(|| view.revision());
        self.loss_due = false;
        match delta.filter(|_| !whole) {
            // The touched units' entries as written.
            Some((touched, mut others)) => {
                others.add(view.snapshot(), &touched);
                self.load = Some(others);
            }
            None => {
                self.entangled = Some(Entangled::of(view.snapshot(), view.files()));
                self.whole_due = false;
                self.load = None;
            }
        }
        debug!(
            revision = view.revision(),
            planned = match (whole, losing) {
                (true, _) => "all units",
                (false, false) => "changed units",
                (false, true) => "changed units and lost machines' units",
            },
            changed = changed.as_ref().map_or(0, BTreeSet::len),
            decisions = plan.decisions.len(),
            waiting = plan.waiting.len(),
            planned_in = ?planned_in,
            written_in = ?written_in,
            "engine pass done"
        );
        self.log_assessment(&assessment);
        plan.decisions.iter().for_each(decision_log::log);
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

/// Resolves at `at`; never without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The next change of the view; never resolves while there is none (the next pass reads
/// one).
async fn changed<K: Kv>(view: &mut Option<LiveView<K>>) -> Result<Touched, RegistryError> {
    match view {
        Some(v) => v.changed().await,
        None => std::future::pending().await,
    }
}

/// Renews the lease every third of its TTL; signals `lost` when leadership is gone or could
/// not be renewed for a whole TTL (etcd unreachable: the lease has lapsed by then).
///
/// A renewal is a lease call only. Whether the leader key still holds us is known from a
/// watch of the key, read again only when the watch says it changed or broke: an idle
/// leader reads nothing (issue 19). A watch that stays silent while the key is lost costs
/// nothing either: every write is fenced by the key, and the first one refused ends leading.
async fn keep<K: Kv>(leadership: Leadership<K>, ttl: Duration, lost: watch::Sender<bool>) {
    let mut renewed = Instant::now();
    let mut next_renewal = Instant::now() + ttl / 3;
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
            () = tokio::time::sleep_until(next_renewal) => {
                next_renewal = Instant::now() + ttl / 3;
                match leadership.refresh().await {
                    Ok(()) => renewed = Instant::now(),
                    Err(RegistryError::LostLeadership) => {
                        warn!("engine leadership lost: the lease is gone");
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

fn write_of(decision: &Decision) -> EngineWrite {
    match &decision.kind {
        DecisionKind::Unschedule {
            unit,
            machine,
            left: None,
        } => EngineWrite::Unschedule {
            machine: machine.clone(),
            unit: unit.clone(),
        },
        DecisionKind::Unschedule {
            unit,
            machine,
            left: Some(copy),
        } => EngineWrite::Leave {
            machine: machine.clone(),
            unit: unit.clone(),
            copy: *copy,
        },
        DecisionKind::Forget { unit, machine } => EngineWrite::Forget {
            unit: unit.clone(),
            machine: machine.clone(),
        },
        DecisionKind::Record {
            unit,
            machine,
            copy,
        } => EngineWrite::Record {
            unit: unit.clone(),
            machine: machine.clone(),
            copy: *copy,
        },
        kind @ (DecisionKind::Update { .. } | DecisionKind::Schedule { .. }) => {
            EngineWrite::Schedule(kind.schedule_entry().expect("an entry's decision"))
        }
        DecisionKind::Unschedulable { unit } => EngineWrite::Unschedulable {
            unit: unit.clone(),
            reason: decision.reason.to_string(),
        },
        DecisionKind::ClearUnschedulable { unit } => {
            EngineWrite::ClearUnschedulable { unit: unit.clone() }
        }
        DecisionKind::Moving { unit, from } => EngineWrite::Moving(MoveRecord {
            unit: unit.clone(),
            from: from.clone(),
        }),
        DecisionKind::MoveOver { unit } => EngineWrite::Moved { unit: unit.clone() },
    }
}
