//! The agent's loop: boot (preload what systemd runs, read this machine's schedule, adopt or
//! remove), then reconcile on every hint: a schedule change (a watch on this machine's own
//! prefix only), a systemd signal, a retry coming due, or the periodic resync.
//!
//! A pass reads as fleet's `agent/reconcile.go`: what should run here (the schedule the
//! [`ScheduleFollower`](follower) holds, less the units left alone this pass), what runs
//! ([`Current`]), the plan between them (pure, [`mod@plan`]), its execution, then the states
//! out ([`Publisher`](publisher)). Which units wait for a retry or a restart window is the
//! [`Holds`](holds)' to say. The loop itself only wakes, reads and hands on.
//!
//! It fails closed: until the schedule has been read once, nothing is planned, so nothing is
//! removed. While etcd is unreachable it keeps acting on the last schedule it read, so running
//! units stay as they are. It never touches a unit outside its units directory.

use fleet_core::UnitName;
use fleet_registry::kv::Kv;
use fleet_registry::{Delta, MachineRole, Presence};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::current::Current;
use crate::desired::Desired;
use crate::executor::{self, Outcome};
use crate::ledger::Ledger;
use crate::manager::{Change, UnitManager, UnitSource};
use crate::metrics::{Metrics, TaskResult, UnitCounts};
use crate::plan::{self, Task, TaskKind};

mod aliases;
mod boot;
mod bound;
mod config;
mod doubt;
mod events;
mod follower;
mod holds;
mod migration;
mod observe;
mod observed;
mod pending;
mod publisher;
mod resync;
mod retry;
pub use config::{AgentConfig, Progress};
use follower::{Followed, ScheduleFollower};
use holds::Holds;
use observed::Observed;
use publisher::Publisher;
use resync::Resync;

/// Questions to systemd in flight at once when asking where units come from: a pass with
/// 3,000 new units asked them one after another, 3,000 serial round trips.
const SOURCE_READS: usize = 4;

/// The agent of one machine.
#[derive(Debug)]
pub struct Agent<K, M> {
    manager: M,
    cfg: AgentConfig,
    presence: watch::Receiver<Option<Presence>>,
    /// This machine's schedule and the unit files it names.
    schedule: ScheduleFollower<K>,
    /// What this machine has: the units directory and systemd's view of it.
    current: Current,
    publisher: Publisher<K>,
    /// Units waiting for a retry or for their restart window to close.
    holds: Holds,
    /// Scheduled units systemd has from an operator's file, each warned about once.
    foreign: BTreeSet<UnitName>,
    /// Each unit with `[Install] Alias=` checked (`aliases`): for its file's hash, why it may
    /// not have them (None: it may).
    alias_verdicts: BTreeMap<UnitName, (fleet_core::UnitHash, Option<String>)>,
    ledger: Ledger,
    /// What systemd did to the units by itself, as last seen.
    observed: Observed,
    progress: watch::Sender<Progress>,
    metrics: Metrics,
    /// The units gauge's counts, kept per unit.
    unit_counts: UnitCounts,
}

impl<K: Kv, M: UnitManager> Agent<K, M> {
    pub fn new(
        registry: MachineRole<K>,
        manager: M,
        cfg: AgentConfig,
        presence: watch::Receiver<Option<Presence>>,
    ) -> Agent<K, M> {
        let cfg_restarts_dir = cfg.restarts_dir.clone();
        Agent {
            schedule: ScheduleFollower::new(
                registry.clone(),
                cfg.deny_units.clone(),
                retry::reconnect_backoff(&cfg),
            )
            .trusting_carried_files(cfg.trust_engine_files),
            publisher: Publisher::new(registry, cfg.events.clone()),
            holds: Holds::new(cfg.backoff_min, cfg.backoff_max),
            manager,
            cfg,
            presence,
            current: Current::default(),
            foreign: BTreeSet::new(),
            alias_verdicts: BTreeMap::new(),
            ledger: Ledger::load(cfg_restarts_dir),
            observed: Observed::default(),
            progress: watch::Sender::new(Progress::default()),
            metrics: Metrics::default(),
            unit_counts: UnitCounts::default(),
        }
    }

    /// This agent, holding every task while the fence's deadline says its lease may have
    /// lapsed since it read its schedule ([`doubt`]).
    pub fn with_fence(
        mut self,
        deadlines: watch::Receiver<Option<crate::fence::Deadline>>,
    ) -> Agent<K, M> {
        self.schedule.fenced(deadlines);
        self
    }

    /// This agent, counting into `metrics` (fleetd's registered families).
    pub fn with_metrics(mut self, metrics: Metrics) -> Agent<K, M> {
        self.metrics = metrics;
        self
    }

    /// Follows the agent's [`Progress`] (taken before [`Agent::run`], which consumes it).
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    /// Runs until `shutdown` becomes true. Never stops or removes units because of shutdown:
    /// the units keep running and a restarted agent adopts them.
    #[tracing::instrument(name = "agent", skip_all, fields(machine = %self.cfg.machine))]
    #[allow(
        clippy::too_many_lines,
        reason = "the agent's select! loop, one arm per event it waits on, as fleet's reconcile loop reads"
    )]
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut changes = self.manager.changes();
        if self.boot(&mut shutdown).await.is_none() {
            return;
        }
        self.schedule.watch();
        // Jittered, so that agents started together do not resync together.
        let mut resync = Resync::new(self.cfg.resync_interval);
        let mut resync_at = Instant::now() + resync.next_delay();
        let mut presence = self.presence.clone();
        let mut pass = 0u64;
        let mut publish_backoff = self.reconnect_backoff();
        let mut retry_at = None;
        // Whether the last wake-up was for nothing of ours: then no pass.
        let mut idle = false;
        // The units the next pass plans for: those read again since the last one, or
        // (`None`) every unit.
        let mut scope: Option<BTreeSet<UnitName>> = None;
        // Units whose tasks the last pass may have left unfinished: part of the next scope.
        let mut unfinished = BTreeSet::new();
        loop {
            if !idle {
                pass += 1;
                unfinished = self
                    .reconcile(scope.as_ref())
                    .instrument(info_span!("reconcile", pass))
                    .await;
                if pass == 1 {
                    // Operators (and the functional tests) read this as "boot is over": every
                    // job the boot decisions called for has been issued and awaited.
                    info!(
                        units = self.current.hashes.len(),
                        published = self.publisher.len(),
                        "initial reconcile complete"
                    );
                    self.end_migration().await;
                }
                self.report_progress();
                // States that could not be published (etcd away) are retried on their own:
                // no watch event or systemd signal may come to wake us once etcd is back.
                let publish_retry = if self.publisher.complete() {
                    publish_backoff.reset();
                    None
                } else {
                    Some(Instant::now() + publish_backoff.next_delay())
                };
                retry_at = self
                    .holds
                    .next_due(Instant::now())
                    .into_iter()
                    .chain(publish_retry)
                    .chain(self.schedule.retry_at())
                    .min();
            }
            idle = false;
            // What to read of the schedule: nothing, the watch's events, or all of it.
            let mut schedule = None;
            let mut details = false;
            // The units to read again from systemd and the units directory: those a hint
            // names, or (`None`) every one.
            let mut reread: Option<BTreeSet<UnitName>> = None;
            tokio::select! {
                _ = shutdown.changed() => {
                    info!("agent stopping; units keep running");
                    return;
                }
                Some(()) = self.schedule.hinted() => {
                    // News of the lease that came with the events counts before them.
                    if presence.has_changed().unwrap_or(false) {
                        presence.borrow_and_update();
                        self.schedule.distrust_events();
                    }
                    schedule = Some(self.schedule.take_delta());
                }
                change = changes.recv() => match change {
                    // Another unit of the machine (a timer's service, an operator's unit, a
                    // login session): its state is nothing this agent publishes or acts on.
                    Some(Change::Units(units)) if !units.iter().any(|u| self.concerns(u)) => {
                        debug!(units = units.len(), "state changes of units not fleet's; no pass");
                        idle = true;
                    }
                    Some(Change::Units(units)) => reread = Some(units),
                    Some(Change::Resync) => details = true,
                    // The D-Bus connection is gone; fleetd exits and is restarted, and the
                    // new agent adopts everything.
                    None => {
                        error!("lost the connection to systemd; agent stopping");
                        return;
                    }
                },
                // The safety net re-reads the schedule and systemd's states (one batched call);
                // per-unit details (drop-ins) change only with a reload, which systemd signals.
                () = tokio::time::sleep_until(resync_at) => {
                    schedule = Some(Delta::Gap);
                    resync_at = Instant::now() + resync.next_delay();
                }
                _ = sleep_until(retry_at) => {}
                Ok(()) = presence.changed() => self.schedule.distrust_events(),
            }
            if idle {
                continue;
            }
            let now = Instant::now();
            if schedule.is_none() && self.schedule.wants_read(now) {
                schedule = Some(self.schedule.due(now));
            }
            if let Some(delta) = schedule {
                reread = self.follow(delta).await;
            }
            self.refresh_current(details, reread.as_ref()).await;
            scope = reread.filter(|_| !details).map(|mut names| {
                names.append(&mut unfinished);
                names
            });
        }
    }

    /// Brings the schedule up to date, giving a fresh chance to each unit whose entry changed.
    /// Returns the units to read again: those whose entries changed when the watch's events
    /// were applied, or (`None`) every one.
    async fn follow(&mut self, delta: Delta) -> Option<BTreeSet<UnitName>> {
        let followed = self.schedule.follow(delta).await;
        self.holds.forget(&self.schedule.take_changed());
        match followed {
            Ok(Followed::Units(changed)) => Some(changed),
            Ok(Followed::Whole) => None,
            Err(e) => {
                warn!(error = %e, "reading schedule failed; keeping the last one");
                None
            }
        }
    }

    /// Whether a change of `unit`'s systemd state may matter to this agent: the unit is
    /// scheduled here, in its units directory or known to systemd as one of those, or has a
    /// published state.
    fn concerns(&self, unit: &UnitName) -> bool {
        self.schedule.is_scheduled(unit)
            || self.current.units.contains_key(unit)
            || self.current.hashes.contains_key(unit)
            || self.publisher.has(unit)
    }

    /// Publishes the agent's [`Progress`] after a pass, when it changed.
    fn report_progress(&self) {
        let progress = Progress {
            reconciled: true,
            units: self.current.hashes.len(),
            failing: self.holds.failing(|n| self.schedule.is_scheduled(n)),
        };
        self.progress.send_if_modified(|p| {
            let changed = *p != progress;
            *p = progress;
            changed
        });
    }

    /// A unit of `deny_units`, or one named like the fence's own units ([`config::is_denied`]).
    fn is_denied(&self, name: &UnitName) -> bool {
        config::is_denied(&self.cfg.deny_units, name)
    }

    /// Reads systemd's state and the units directory again: of the units of `names` only, or
    /// (`None`) of every unit, with the per-unit details too when `details` (after a
    /// daemon-reload). A unit whose state changes without a hint naming it waits for the
    /// periodic resync, as the manager's contract says hints may (rarely) be missed.
    async fn refresh_current(&mut self, details: bool, names: Option<&BTreeSet<UnitName>>) {
        match names {
            Some(names) if !details => {
                let schedule = &self.schedule;
                let scheduled = |n: &UnitName| schedule.is_scheduled(n);
                if let Err(e) = self.current.refresh(&self.manager, names, scheduled).await {
                    warn!(error = %e, "reading systemd state failed");
                    return;
                }
                self.publisher.touched(names.iter().cloned());
            }
            Some(_) | None => {
                let also = self.schedule.scheduled();
                match Current::read(&self.manager, &also, &self.current.drop_ins).await {
                    Ok(mut current) => {
                        if details {
                            current.read_details(&self.manager).await;
                        }
                        current.history = std::mem::take(&mut self.current.history);
                        self.current = current;
                        self.publisher.touched_all();
                    }
                    Err(e) => {
                        warn!(error = %e, "reading systemd state failed");
                        return;
                    }
                }
            }
        }
        let scope = names.filter(|_| !details);
        self.sync_restarted(scope);
        self.observe(scope).await;
        self.refresh_pending().await;
    }

    /// Fills in the restart generation the ledger has for the units of `scope` (`None`:
    /// every unit) and marks those whose generation changed for publishing.
    fn sync_restarted(&mut self, scope: Option<&BTreeSet<UnitName>>) {
        let ledger = &self.ledger;
        let restarted = match scope {
            Some(names) => self
                .current
                .set_restarted_of(names, |n| ledger.get(n).map(|e| e.restart)),
            None => self.current.set_restarted(ledger.restarts_in_order()),
        };
        self.publisher.touched(restarted);
    }

    /// Plans and executes until nothing is left to do (bounded), then publishes states.
    ///
    /// After a daemon-reload, the per-unit details (drop-ins, NeedDaemonReload: a dozen
    /// property reads per unit, every unit with a file) are read once the states are out, so a
    /// replaced unit is published as soon as it runs; what the details change goes out in a
    /// second publish.
    ///
    /// A pass plans for the units of `scope` alone (`None`: every unit), those read again
    /// since the last pass: the resync, the end of a daemon-reload, a retry, a lease change
    /// and a failed read of the schedule make a whole pass; a hint makes a pass over the
    /// units it named (docs/agent.md).
    ///
    /// Returns the units of the last round's tasks when every round had tasks: what may be
    /// left to do for them, the next pass plans again.
    async fn reconcile(&mut self, scope: Option<&BTreeSet<UnitName>>) -> BTreeSet<UnitName> {
        let started = Instant::now();
        let mut details_due = false;
        let mut unfinished = BTreeSet::new();
        for _ in 0..3 {
            let outcome = self.plan_and_execute(scope).await;
            details_due |= outcome.reloaded;
            unfinished.clear();
            if outcome.outcome.executed == 0 {
                break;
            }
            // What the tasks did; a unit they changed as a side effect (a dependency) has
            // its own hint coming, and the reload's end hints a full read.
            self.refresh_current(false, Some(&outcome.touched)).await;
            // A failed unit waits for its retry, which makes a whole pass.
            if !outcome.outcome.failed.is_empty() {
                break;
            }
            unfinished = outcome.touched;
        }
        self.publish().await;
        if details_due {
            self.current.read_details(&self.manager).await;
            self.publisher.touched_all();
            self.publish().await;
        }
        match scope {
            Some(names) => self.unit_counts.count_of(&self.current.units, names),
            None => self.unit_counts.count_all(&self.current.units),
        }
        self.metrics.units(&self.unit_counts);
        self.metrics.passed(started.elapsed());
        unfinished
    }

    /// Publishes the states the pass recorded, on this machine's presence as it is now.
    async fn publish(&mut self) {
        let presence = *self.presence.borrow();
        self.publisher.publish(presence, &self.current).await;
    }

    /// One round of a pass, as fleet's reconciler reads: desired, current, plan, execute.
    async fn plan_and_execute(&mut self, scope: Option<&BTreeSet<UnitName>>) -> PassOutcome {
        let now = Instant::now();
        // A pass of a few units takes in the units whose retry came due too: the agent does
        // not wake for a retry already due (`Holds::next_due`).
        let widened: Option<BTreeSet<UnitName>> =
            scope.map(|names| names.union(&self.holds.due(now)).cloned().collect());
        let scope = widened.as_ref();
        let Some(desired) = self.desired(scope, now).await else {
            return PassOutcome::default();
        };
        let tasks = self.plan(&desired, scope, now);
        let planned_for = |unit: &UnitName| scope.is_none_or(|names| names.contains(unit));
        self.holds.settle(planned_for, &desired.held, &tasks, now);
        if tasks.is_empty() {
            return PassOutcome::default();
        }
        self.execute(&desired, tasks, now).await
    }

    /// What should run here, of the units of `scope` (`None`: every unit): the schedule, if it
    /// may be acted on at `now`, with the units left alone this pass held (an operator's unit
    /// of the same name, an alias the unit may not take).
    async fn desired(
        &mut self,
        scope: Option<&BTreeSet<UnitName>>,
        now: Instant,
    ) -> Option<Desired> {
        let (schedule, files) = self.schedule.trusted(now)?;
        let mut desired = match scope {
            Some(names) => Desired::build_of(schedule, files, names),
            None => Desired::build(schedule, files),
        };
        for name in self.foreign(&desired).await {
            desired.hold(name);
        }
        for name in self.aliased(&desired).await {
            desired.hold(name);
        }
        Some(desired)
    }

    /// The tasks that take what runs here to `desired`, for the units of `scope`, leaving the
    /// units that wait (held this pass, or by [`Holds`]) as they are.
    fn plan(
        &mut self,
        desired: &Desired,
        scope: Option<&BTreeSet<UnitName>>,
        now: Instant,
    ) -> Vec<Task> {
        let mut waiting = desired.held.clone();
        waiting.extend(self.holds.waiting(now, &self.current.units));
        let (current, present) = (&self.current.units, &self.current.hashes);
        let (tasks, tracked) = match scope {
            Some(names) => (
                plan::plan_of(&desired.units, current, &waiting, names),
                self.ledger.track_of(&desired.units, present, names),
            ),
            None => (
                plan::plan(&desired.units, current, &waiting),
                self.ledger.track(&desired.units, present),
            ),
        };
        // Units the ledger just met (adopted ones) carry its generation from now on.
        self.sync_restarted(Some(&tracked));
        tasks
    }

    /// Executes `tasks` and records what they came to: the metrics, the ledger, the holds.
    async fn execute(&mut self, desired: &Desired, tasks: Vec<Task>, now: Instant) -> PassOutcome {
        let planned = tasks.clone();
        self.remember_running_versions(&tasks).await;
        let touched: BTreeSet<UnitName> = tasks.iter().map(|t| t.unit.clone()).collect();
        debug!(tasks = tasks.len(), "executing plan");
        let hashes = desired.hashes();
        let files = self.schedule.files();
        let outcome = executor::execute(&self.manager, tasks, &hashes, files).await;
        // The executor skips a reload that nothing needs.
        let reloaded = outcome
            .results
            .iter()
            .any(|(k, r)| *k == TaskKind::ReloadUnitFiles && *r != TaskResult::Skipped);
        for (kind, result) in &outcome.results {
            self.metrics.task(*kind, *result);
        }
        self.ledger
            .record_started(&desired.units, &planned, &outcome);
        self.holds
            .record(&planned, |unit| outcome.failed.contains_key(unit), now);
        let told = |unit: &UnitName| self.observed.told_failed(unit);
        for event in events::of(&planned, &outcome, &self.cfg.machine, told) {
            self.publisher.tell(event);
        }
        for t in &planned {
            let started = matches!(t.kind, TaskKind::Start | TaskKind::Restart);
            if started && !outcome.failed.contains_key(&t.unit) {
                self.observed
                    .started(&t.unit, crate::revivals::is_revival(t));
            }
        }
        PassOutcome {
            outcome,
            reloaded,
            touched,
        }
    }

    /// Desired units that systemd has from a unit file outside our units directory (an
    /// operator's own unit of the same name): never stopped, replaced or relinked by fleet.
    /// A unit whose source cannot be read is held too, this pass: fail closed.
    async fn foreign(&mut self, desired: &Desired) -> Vec<UnitName> {
        let mut foreign = Vec::new();
        // One call per unit without a file of ours, a few at a time.
        let manager = &self.manager;
        let sources: Vec<(UnitName, Result<UnitSource, _>)> =
            futures::stream::iter(desired.unowned(&self.current.units))
                .map(|name| async move {
                    let source = manager.source(&name).await;
                    (name, source)
                })
                .buffered(SOURCE_READS)
                .collect()
                .await;
        for (name, source) in sources {
            match source {
                Ok(UnitSource::NoFile | UnitSource::UnitsDir) => continue,
                Ok(UnitSource::Foreign { fragment }) => {
                    if self.foreign.insert(name.clone()) {
                        warn!(unit = %name, fragment = %fragment.display(), "refusing to manage unit: a unit file of that name outside the units directory is not fleet's");
                    }
                }
                Err(e) => {
                    warn!(unit = %name, error = %e, "reading where systemd loaded the unit from failed; leaving it as it is");
                }
            }
            foreign.push(name);
        }
        foreign
    }
}

#[derive(Debug, Default)]
struct PassOutcome {
    outcome: Outcome,
    reloaded: bool,
    /// The units the plan had tasks for.
    touched: BTreeSet<UnitName>,
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
