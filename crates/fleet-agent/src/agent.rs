//! The agent's loop: boot (preload what systemd runs, read this machine's schedule, adopt or
//! remove), then reconcile on every hint: a schedule change (a watch on this machine's own
//! prefix only), a systemd signal, a retry coming due, or the periodic resync.
//!
//! It fails closed: until the schedule has been read once, nothing is planned, so nothing is
//! removed. While etcd is unreachable it keeps acting on the last schedule it read, so running
//! units stay as they are. It never touches a unit outside its units directory.

use fleet_core::{ActiveState, UnitFile, UnitHash, UnitName, glob_match};
use fleet_registry::kv::{Kv, LeaseId, Revision};
use fleet_registry::{Delta, MachineRole, Presence, ScheduleEntry, UnitStateRecord};
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
use crate::plan::{self, TaskKind};
use crate::revivals::{self, Revivals};

mod aliases;
mod boot;
mod bound;
mod config;
mod doubt;
mod migration;
mod pending;
mod publish;
mod resync;
mod retry;
mod schedule;
pub use config::{AgentConfig, Progress};
use resync::Resync;
use retry::Retry;

/// Requests for unit files in flight at once, each of up to
/// [`MAX_TXN_OPS`](fleet_registry::kv::MAX_TXN_OPS) files. One request per file, sequential,
/// made an agent given 1,000 units wait for 1,000 round trips before it could plan
/// (docs/benchmarks.md, item 3).
const FILE_FETCHES: usize = 4;

/// The agent of one machine.
#[derive(Debug)]
pub struct Agent<K, M> {
    registry: MachineRole<K>,
    manager: M,
    cfg: AgentConfig,
    presence: watch::Receiver<Option<Presence>>,
    /// This machine's schedule; `None` until read once (fail closed).
    desired: Option<BTreeMap<UnitName, ScheduleEntry>>,
    /// The revision `desired` is the schedule at: watch events up to it are in it already.
    schedule_revision: Revision,
    /// The next change re-reads everything instead of applying the watch's events: events
    /// were applied but a file they need could not be read, or this machine's lease was in
    /// doubt (a failed renewal, a new lease) since the last full read. In that case the watch
    /// may be late. After a partition heals, etcd's buffered responses arrive one by one. The
    /// first of them can say "start U here" while a later one says "U moved elsewhere". Applied
    /// one response at a time, they made an agent start a unit that already ran on another
    /// machine, and then stop it (the chaos soak, seed 1796183104550035049).
    schedule_stale: bool,
    files: BTreeMap<UnitHash, UnitFile>,
    current: Current,
    published: BTreeMap<UnitName, UnitStateRecord>,
    published_lease: Option<LeaseId>,
    backoff: BTreeMap<UnitName, Retry>,
    /// Failed units restarted lately, whose next restart waits.
    revivals: Revivals,
    denied: BTreeSet<UnitName>,
    /// Each unit with `[Install] Alias=` checked (`aliases`): for its file's hash, why it may
    /// not have them (None: it may).
    alias_verdicts: BTreeMap<UnitName, (UnitHash, Option<String>)>,
    /// Unreadable schedule entries by key, with the revision each was written at: each is
    /// warned about once, not on every read of the schedule.
    skipped: BTreeMap<String, Revision>,
    ledger: Ledger,
    /// Whether the last publish got every state out.
    publish_complete: bool,
    /// How many units the last publish left out past the bound on states (`bound`): warned
    /// about when it changes, not on every pass.
    past_bound: usize,
    /// The units whose state to publish may have changed since the last publish; `None`:
    /// any of them (after a full read, a new lease or a failed publish).
    unpublished: Option<BTreeSet<UnitName>>,
    progress: watch::Sender<Progress>,
    metrics: Metrics,
    /// The units gauge's counts, kept per unit.
    unit_counts: UnitCounts,
    /// Whether the lease may have lapsed since the schedule was read ([`doubt`]).
    doubt: doubt::LeaseDoubt,
    /// Whether the last pass was held for that, to log each spell once.
    held_in_doubt: bool,
}

impl<K: Kv, M: UnitManager> Agent<K, M> {
    pub fn new(
        registry: MachineRole<K>,
        manager: M,
        cfg: AgentConfig,
        presence: watch::Receiver<Option<Presence>>,
    ) -> Agent<K, M> {
        let cfg_restarts_dir = cfg.restarts_dir.clone();
        let revivals = Revivals::new(cfg.backoff_min, cfg.backoff_max);
        Agent {
            registry,
            manager,
            cfg,
            presence,
            desired: None,
            schedule_revision: 0,
            schedule_stale: false,
            files: BTreeMap::new(),
            current: Current::default(),
            published: BTreeMap::new(),
            published_lease: None,
            backoff: BTreeMap::new(),
            revivals,
            denied: BTreeSet::new(),
            alias_verdicts: BTreeMap::new(),
            skipped: BTreeMap::new(),
            ledger: Ledger::load(cfg_restarts_dir),
            publish_complete: true,
            past_bound: 0,
            unpublished: None,
            progress: watch::Sender::new(Progress::default()),
            metrics: Metrics::default(),
            unit_counts: UnitCounts::default(),
            doubt: doubt::LeaseDoubt::none(),
            held_in_doubt: false,
        }
    }

    /// This agent, holding every task while the fence's deadline says its lease may have
    /// lapsed since it read its schedule ([`doubt`]).
    pub fn with_fence(
        mut self,
        deadlines: watch::Receiver<Option<crate::fence::Deadline>>,
    ) -> Agent<K, M> {
        self.doubt = doubt::LeaseDoubt::of(deadlines);
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
        let Some(revision) = self.boot(&mut shutdown).await else {
            return;
        };
        let mut hints = self.registry.watch_schedule(revision + 1);
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
                        published = self.published.len(),
                        "initial reconcile complete"
                    );
                    self.end_migration().await;
                }
                self.report_progress();
                // States that could not be published (etcd away) are retried on their own:
                // no watch event or systemd signal may come to wake us once etcd is back.
                let publish_retry = if self.publish_complete {
                    publish_backoff.reset();
                    None
                } else {
                    Some(Instant::now() + publish_backoff.next_delay())
                };
                retry_at = self
                    .backoff
                    .values()
                    .map(|b| b.until)
                    .chain(publish_retry)
                    .chain(self.revivals.next_close(Instant::now()))
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
                Some(_) = hints.changed() => {
                    // News of the lease that came with the events counts before them.
                    if presence.has_changed().unwrap_or(false) {
                        presence.borrow_and_update();
                        self.schedule_stale = true;
                    }
                    schedule = Some(hints.take());
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
                Ok(()) = presence.changed() => self.schedule_stale = true,
            }
            if idle {
                continue;
            }
            if schedule.is_none() && self.doubt.wants_read(Instant::now()) {
                schedule = Some(Delta::Gap);
            }
            if let Some(delta) = schedule {
                match self.follow_schedule(delta).await {
                    // Only these entries changed: only their units need reading again.
                    Ok(Some(changed)) => reread = Some(changed),
                    Ok(None) => reread = None,
                    Err(e) => {
                        warn!(error = %e, "reading schedule failed; keeping the last one");
                        reread = None;
                    }
                }
            }
            self.refresh_current(details, reread.as_ref()).await;
            scope = reread.filter(|_| !details).map(|mut names| {
                names.append(&mut unfinished);
                names
            });
        }
    }

    /// Whether a change of `unit`'s systemd state may matter to this agent: the unit is
    /// scheduled here, in its units directory or known to systemd as one of those, or has a
    /// published state.
    fn concerns(&self, unit: &UnitName) -> bool {
        self.desired.as_ref().is_some_and(|d| d.contains_key(unit))
            || self.current.units.contains_key(unit)
            || self.current.hashes.contains_key(unit)
            || self.published.contains_key(unit)
    }

    /// Publishes the agent's [`Progress`] after a pass, when it changed.
    fn report_progress(&self) {
        let desired = |n: &&UnitName| self.desired.as_ref().is_some_and(|d| d.contains_key(*n));
        let progress = Progress {
            reconciled: true,
            units: self.current.hashes.len(),
            failing: self.backoff.keys().filter(desired).count(),
        };
        self.progress.send_if_modified(|p| {
            let changed = *p != progress;
            *p = progress;
            changed
        });
    }

    /// A unit of `deny_units`, or one named like the fence's own units, which fleetd stops
    /// and replaces by name (`systemd::fence::FENCE_PREFIX`), whatever the configuration.
    fn is_denied(&self, name: &UnitName) -> bool {
        name.as_str()
            .starts_with(crate::systemd::fence::FENCE_PREFIX)
            || self
                .cfg
                .deny_units
                .iter()
                .any(|g| glob_match(g, name.as_str()))
    }

    /// Reads systemd's state and the units directory again: of the units of `names` only, or
    /// (`None`) of every unit, with the per-unit details too when `details` (after a
    /// daemon-reload). A unit whose state changes without a hint naming it waits for the
    /// periodic resync, as the manager's contract says hints may (rarely) be missed.
    async fn refresh_current(&mut self, details: bool, names: Option<&BTreeSet<UnitName>>) {
        match names {
            Some(names) if !details => {
                let desired = self.desired.as_ref();
                let scheduled = |n: &UnitName| desired.is_some_and(|d| d.contains_key(n));
                if let Err(e) = self.current.refresh(&self.manager, names, scheduled).await {
                    warn!(error = %e, "reading systemd state failed");
                    return;
                }
                if let Some(unpublished) = &mut self.unpublished {
                    unpublished.extend(names.iter().cloned());
                }
            }
            Some(_) | None => {
                let also: BTreeSet<UnitName> = self
                    .desired
                    .as_ref()
                    .map(|d| d.keys().cloned().collect())
                    .unwrap_or_default();
                match Current::read(&self.manager, &also, &self.current.drop_ins).await {
                    Ok(mut current) => {
                        if details {
                            current.read_details(&self.manager).await;
                        }
                        self.current = current;
                        self.unpublished = None;
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
        self.mark_unpublished(restarted);
    }

    /// Notes units whose state to publish changed outside a read of them.
    fn mark_unpublished(&mut self, names: impl IntoIterator<Item = UnitName>) {
        if let Some(unpublished) = &mut self.unpublished {
            unpublished.extend(names);
        }
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
        self.publish_complete = self.publish().await;
        if details_due {
            self.current.read_details(&self.manager).await;
            self.unpublished = None;
            self.publish_complete = self.publish().await;
        }
        match scope {
            Some(names) => self.unit_counts.count_of(&self.current.units, names),
            None => self.unit_counts.count_all(&self.current.units),
        }
        self.metrics.units(&self.unit_counts);
        self.metrics.passed(started.elapsed());
        unfinished
    }

    #[allow(
        clippy::too_many_lines,
        reason = "one pass in the order it runs: desired, current, plan, execute, record; issue 39 item 1 splits it"
    )]
    async fn plan_and_execute(&mut self, scope: Option<&BTreeSet<UnitName>>) -> PassOutcome {
        let now = Instant::now();
        let in_doubt = self.doubt.in_doubt(now);
        if in_doubt != self.held_in_doubt {
            self.held_in_doubt = in_doubt;
            if in_doubt {
                warn!(
                    "this machine's lease may have lapsed: acting on nothing until its schedule is read on a live lease"
                );
            } else {
                info!("schedule read on a live lease; acting again");
            }
        }
        let Some(schedule) = self.desired.as_ref().filter(|_| !in_doubt) else {
            return PassOutcome::default();
        };
        let mut desired = match scope {
            Some(names) => Desired::build_of(schedule, &self.files, names),
            None => Desired::build(schedule, &self.files),
        };
        for name in self.foreign(&desired).await {
            desired.hold(name);
        }
        for name in self.aliased(&desired).await {
            desired.hold(name);
        }
        let mut waiting = desired.held.clone();
        waiting.extend(
            self.backoff
                .iter()
                .filter(|(_, b)| b.until > now)
                .map(|(n, _)| n.clone()),
        );
        let units = &self.current.units;
        waiting.extend(self.revivals.holding(now, |name| {
            units
                .get(name)
                .and_then(|u| u.systemd.as_ref())
                .is_some_and(|s| s.active_state() == ActiveState::Failed)
        }));
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
        if tasks.is_empty() {
            return PassOutcome::default();
        }
        let planned = tasks.clone();
        self.remember_running_versions(&tasks).await;
        let touched: BTreeSet<UnitName> = tasks.iter().map(|t| t.unit.clone()).collect();
        debug!(tasks = tasks.len(), "executing plan");
        let hashes = desired.hashes();
        let outcome = executor::execute(&self.manager, tasks, &hashes, &self.files).await;
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
        for unit in touched.iter().cloned() {
            match outcome.failed.get(&unit) {
                Some(_) => self.fail(unit, now),
                None => {
                    self.backoff.remove(&unit);
                }
            }
        }
        for task in planned.iter().filter(|t| revivals::is_revival(t)) {
            if !outcome.failed.contains_key(&task.unit) {
                let wait = self.revivals.restarted(&task.unit, now);
                debug!(unit = %task.unit, next_restart_after = ?wait, "restarted a failed unit");
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
        // One call per unit without a file of ours: asked 32 at a time, not one after
        // another (a pass with 3,000 new units made 3,000 serial round trips to systemd).
        let manager = &self.manager;
        let sources: Vec<(UnitName, Result<UnitSource, _>)> =
            futures::stream::iter(desired.unowned(&self.current.units))
                .map(|name| async move {
                    let source = manager.source(&name).await;
                    (name, source)
                })
                .buffered(FILE_FETCHES)
                .collect()
                .await;
        for (name, source) in sources {
            match source {
                Ok(UnitSource::NoFile | UnitSource::UnitsDir) => continue,
                Ok(UnitSource::Foreign { fragment }) => {
                    if self.denied.insert(name.clone()) {
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
