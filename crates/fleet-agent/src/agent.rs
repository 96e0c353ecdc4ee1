//! The agent's loop: boot (preload what systemd runs, read this machine's schedule, adopt or
//! remove), then reconcile on every hint: a schedule change (a watch on this machine's own
//! prefix only), a systemd signal, a retry coming due, or the periodic resync.
//!
//! It fails closed: until the schedule has been read once, nothing is planned, so nothing is
//! removed. While etcd is unreachable it keeps acting on the last schedule it read, so running
//! units stay as they are. It never touches a unit outside its units directory.

use fleet_core::{ActiveState, Backoff, MachineId, UnitFile, UnitHash, UnitName, glob_match};
use fleet_registry::kv::Event;
use fleet_registry::kv::{Kv, LeaseId, MAX_TXN_OPS, Revision};
use fleet_registry::{
    Delta, MachineRole, Presence, RegistryError, ScheduleChange, ScheduleEntry, Skipped,
    UnitStateRecord,
};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::current::Current;
use crate::desired::Desired;
use crate::executor::{self, Outcome};
use crate::ledger::Ledger;
use crate::manager::{Change, UnitManager, UnitSource};
use crate::metrics::{Metrics, TaskResult, UnitCounts};
use crate::plan::{self, TaskKind, UnitFileState};
use crate::revivals::{self, Revivals};

mod aliases;
mod bound;
mod doubt;
mod resync;
use resync::Resync;

/// Requests for unit files in flight at once, each of up to [`MAX_TXN_OPS`] files. One
/// request per file, sequential, made an agent given 1,000 units wait for 1,000 round trips
/// before it could plan (docs/benchmarks.md, item 3).
const FILE_FETCHES: usize = 4;

/// Transactions of published or withdrawn states in flight at once, each of up to
/// [`MAX_TXN_OPS`] states.
const PUBLISHES: usize = 4;

/// The longest pause between two attempts to reach etcd or systemd in the boot and publish
/// loops: once etcd is back, an agent should notice within seconds, not a minute.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// How the agent behaves.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub machine: MachineId,
    /// Safety net: re-read everything at least this often even without hints (the first
    /// time at a random phase of it, then after 90–100 % of it: see `agent/resync.rs`).
    pub resync_interval: Duration,
    /// Unit name globs the agent refuses to manage (they would take over the host).
    pub deny_units: Vec<String>,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Where restart generations are recorded (`None`: in memory only, for tests).
    pub restarts_dir: Option<std::path::PathBuf>,
}

impl AgentConfig {
    pub fn new(machine: MachineId) -> AgentConfig {
        AgentConfig {
            machine,
            resync_interval: Duration::from_secs(60),
            deny_units: Vec::new(),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            restarts_dir: None,
        }
    }
}

/// What the agent has done so far, for its daemon's readiness and status line
/// ([`Agent::progress`]). Changes only when one of its values does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// The first reconcile pass after boot is over: every job the boot decisions called for
    /// has been issued and awaited.
    pub reconciled: bool,
    /// Unit files in the units directory.
    pub units: usize,
    /// Units whose last task failed, waiting for their retry.
    pub failing: usize,
}

/// A failed unit's next chance, and the backoff that spaces its chances.
#[derive(Debug, Clone)]
struct Retry {
    until: Instant,
    backoff: Backoff,
}

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

    /// Builds the current state from systemd and reads the schedule (retrying until it can),
    /// logging what will be kept, replaced or removed. `None` on shutdown.
    async fn boot(&mut self, shutdown: &mut watch::Receiver<bool>) -> Option<Revision> {
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
        info!(
            units = self.current.hashes.len(),
            "preloaded units directory"
        );
        let mut backoff = self.reconnect_backoff();
        let revision = loop {
            match self.read_schedule().await {
                Ok(rev) => match self.read_unfiled().await {
                    Ok(()) => break rev,
                    Err(e) => warn!(error = %e, "reading systemd state at boot failed; retrying"),
                },
                // Fail closed: nothing is removed until we know what should run here.
                Err(e) => warn!(error = %e, "reading schedule at boot failed; touching nothing"),
            }
            if wait_or_shutdown(shutdown, &mut backoff).await {
                return None;
            }
        };
        self.log_boot_decisions();
        self.adopt_published_states().await;
        self.remove_legacy_states().await;
        Some(revision)
    }

    /// After an upgrade in place, the resumed lease still carries the previous fleetd's
    /// old-layout state keys (`P/state/<unit>/<M>`), which nothing reads any more: delete
    /// those of the units this machine knows (its schedule, its units directory, systemd's).
    /// Best effort: a refusal (etcd auth enabled before the upgrade) leaves them to the lease.
    async fn remove_legacy_states(&self) {
        let Some(presence) = *self.presence.borrow() else {
            return;
        };
        if !presence.resumed() {
            return;
        }
        let names: Vec<UnitName> = self
            .desired
            .iter()
            .flat_map(|d| d.keys())
            .chain(self.current.units.keys())
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        match self.registry.remove_legacy_states(&names).await {
            Ok(0) => {}
            Ok(deleted) => info!(
                deleted,
                "deleted old-layout unit states of the resumed lease"
            ),
            Err(e) => {
                info!(error = %e, "old-layout unit states not deleted; they go with the lease")
            }
        }
    }

    /// systemd's state of the scheduled units without a file here, which the preload could
    /// not know to ask about.
    async fn read_unfiled(&mut self) -> Result<(), crate::manager::ManagerError> {
        let names: BTreeSet<UnitName> = self
            .desired
            .as_ref()
            .map(|d| d.keys().cloned().collect())
            .unwrap_or_default();
        self.current.read_unfiled(&self.manager, &names).await?;
        self.current.set_restarted(self.ledger.restarts_in_order());
        Ok(())
    }

    /// States a previous fleetd published under the lease we resumed are ours now: knowing
    /// them, the first publish withdraws those of units that are gone and skips unchanged ones.
    async fn adopt_published_states(&mut self) {
        let Some(presence) = *self.presence.borrow() else {
            return;
        };
        match self.registry.published_states().await {
            Ok(states) => {
                self.published = states
                    .items
                    .into_iter()
                    .filter(|s| s.machine == self.cfg.machine)
                    .map(|s| (s.name.clone(), s))
                    .collect();
                self.published_lease = Some(presence.lease());
            }
            Err(e) => warn!(error = %e, "reading previously published states failed"),
        }
    }

    fn log_boot_decisions(&self) {
        let desired = self.desired.as_ref().expect("read at boot");
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

    /// Reads this machine's schedule and the files it needs.
    async fn read_schedule(&mut self) -> Result<Revision, RegistryError> {
        let (at_start, started) = (self.doubt.deadline(), Instant::now());
        let listing = self.registry.schedule().await?;
        self.note_skipped(&listing.skipped);
        let revision = listing.revision;
        let mut desired = BTreeMap::new();
        for e in listing.items {
            if self.is_denied(&e.name) {
                if self.denied.insert(e.name.clone()) {
                    warn!(unit = %e.name, "refusing to manage unit: it matches deny_units");
                }
                continue;
            }
            desired.insert(e.name.clone(), e);
        }
        let wanted: BTreeSet<UnitHash> = desired.values().map(|e| e.hash).collect();
        // A unit waiting out a retry backoff gets a fresh chance as soon as what is asked of
        // it changes (a fixed version, a new desired state, or no longer scheduled here).
        if let Some(old) = &self.desired {
            self.backoff
                .retain(|name, _| old.get(name) == desired.get(name));
            self.revivals
                .retain(|name| old.get(name) == desired.get(name));
        }
        self.files.retain(|h, _| wanted.contains(h));
        self.fetch_files(wanted).await?;
        self.desired = Some(desired);
        self.doubt.read(at_start, started);
        self.schedule_revision = revision;
        self.schedule_stale = false;
        Ok(revision)
    }

    /// Brings the schedule up to date: applies the watch's events when it kept them all,
    /// re-reads the whole schedule otherwise. A pass then costs what changed, not every
    /// unit scheduled here (with 1,000 units each change re-read all 1,000 entries).
    ///
    /// Returns the units whose entries changed when the events were applied, `None` after a
    /// full read (any unit may have).
    async fn follow_schedule(
        &mut self,
        delta: Delta,
    ) -> Result<Option<BTreeSet<UnitName>>, RegistryError> {
        match delta {
            Delta::Events(events) if self.desired.is_some() && !self.schedule_stale => {
                match self.apply_schedule_events(&events).await {
                    Ok(Some(changed)) => Ok(Some(changed)),
                    Ok(None) => self.read_schedule().await.map(|_| None),
                    Err(e) => {
                        self.schedule_stale = true;
                        Err(e)
                    }
                }
            }
            Delta::Events(_) | Delta::Gap => self.read_schedule().await.map(|_| None),
        }
    }

    /// Applies schedule events newer than the schedule held and returns the units whose
    /// entries changed; `None` (nothing applied) when one cannot be read as an entry of ours:
    /// only a full read says what to skip.
    async fn apply_schedule_events(
        &mut self,
        events: &[Event],
    ) -> Result<Option<BTreeSet<UnitName>>, RegistryError> {
        let fresh: Vec<(Revision, ScheduleChange)> = events
            .iter()
            .filter(|e| e.kv.mod_revision > self.schedule_revision)
            .map(|e| (e.kv.mod_revision, self.registry.schedule_change(e)))
            .collect();
        if fresh
            .iter()
            .any(|(_, c)| matches!(c, ScheduleChange::Unreadable))
        {
            return Ok(None);
        }
        let mut changed = BTreeSet::new();
        let mut dropped_hash = false;
        let mut new_hashes = BTreeSet::new();
        for (revision, change) in fresh {
            self.schedule_revision = self.schedule_revision.max(revision);
            let (name, entry) = match change {
                ScheduleChange::Put(e) if self.is_denied(&e.name) => {
                    if self.denied.insert(e.name.clone()) {
                        warn!(unit = %e.name, "refusing to manage unit: it matches deny_units");
                    }
                    (e.name, None)
                }
                ScheduleChange::Put(e) => (e.name.clone(), Some(e)),
                ScheduleChange::Removed(name) => (name, None),
                ScheduleChange::Unreadable => unreachable!("refused above"),
            };
            let desired = self.desired.get_or_insert_with(BTreeMap::new);
            let old = match entry {
                Some(e) => {
                    new_hashes.insert(e.hash);
                    desired.insert(name.clone(), e)
                }
                None => desired.remove(&name),
            };
            if old.as_ref() != desired.get(&name) {
                dropped_hash |=
                    old.is_some_and(|o| desired.get(&name).map(|e| e.hash) != Some(o.hash));
                changed.insert(name);
            }
        }
        self.backoff.retain(|name, _| !changed.contains(name));
        self.revivals.retain(|name| !changed.contains(name));
        if dropped_hash {
            let wanted: BTreeSet<UnitHash> = self
                .desired
                .iter()
                .flat_map(|d| d.values().map(|e| e.hash))
                .collect();
            self.files.retain(|h, _| wanted.contains(h));
        }
        self.fetch_files(new_hashes).await?;
        Ok(Some(changed))
    }

    /// Reads the files of `hashes` not held yet: [`MAX_TXN_OPS`] to a request,
    /// [`FILE_FETCHES`] requests at a time.
    async fn fetch_files(&mut self, hashes: BTreeSet<UnitHash>) -> Result<(), RegistryError> {
        let missing: Vec<UnitHash> = hashes
            .into_iter()
            .filter(|h| !self.files.contains_key(h))
            .collect();
        let registry = &self.registry;
        // Owned chunks: a stream of borrowed ones makes the agent's future not `Send`.
        let chunks: Vec<Vec<UnitHash>> = missing.chunks(MAX_TXN_OPS).map(<[_]>::to_vec).collect();
        let mut fetched = futures::stream::iter(chunks)
            .map(|chunk| async move { registry.files(&chunk).await })
            .buffer_unordered(FILE_FETCHES);
        // An etcd failure fails the read at once (dropping the reads in flight); the files read
        // until then are kept, so a retry needs fewer. A missing or unreadable file only holds
        // back its own units (the planner leaves a unit without a file as it is), as in the
        // engine: one bad record must not stop every other unit's schedule.
        while let Some(files) = fetched.next().await {
            for (hash, file) in files? {
                match file {
                    Ok(Some(file)) => {
                        self.files.insert(hash, file);
                    }
                    Ok(None) => {
                        warn!(hash = %hash, "scheduled unit file missing from the registry")
                    }
                    Err(e @ RegistryError::Corrupt { .. }) => {
                        warn!(hash = %hash, error = %e, "scheduled unit file unreadable; its units are left as they are");
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Warns once about each unreadable schedule entry (a unit this machine then does not
    /// run: the engine sees no entry either and places the unit as if it had none).
    fn note_skipped(&mut self, skipped: &[Skipped]) {
        let now: BTreeMap<String, Revision> = skipped
            .iter()
            .map(|s| (s.key.clone(), s.mod_revision))
            .collect();
        for s in skipped {
            if self.skipped.get(&s.key) != Some(&s.mod_revision) {
                warn!(key = %s.key, error = %s.detail, "skipping unreadable schedule entry");
            }
        }
        self.skipped = now;
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

    /// Before a file is swapped under a running unit (`--no-restart`), remembers which
    /// version and which invocation of the unit run, so the unit shows `restart_pending`
    /// until it restarts.
    async fn remember_running_versions(&mut self, tasks: &[plan::Task]) {
        for t in tasks {
            let plan::Reason::ReplaceWithoutRestart { current, .. } = &t.reason else {
                continue;
            };
            let invocation = match self.manager.details(&t.unit).await {
                Ok(d) => d.invocation_id,
                Err(e) => {
                    warn!(unit = %t.unit, error = %e, "reading the unit's invocation failed");
                    None
                }
            };
            self.ledger.record_swap(&t.unit, *current, invocation);
        }
    }

    /// Which running units run an older version than their file. A unit systemd restarted by
    /// itself (another InvocationID) runs the file it was restarted with: no longer pending.
    async fn refresh_pending(&mut self) {
        let mut pending = BTreeSet::new();
        // The ledger's few swapped units, not a lookup for each unit with a file.
        let hashes = &self.current.hashes;
        let candidates: Vec<(UnitName, Option<String>)> = self
            .ledger
            .swapped()
            .filter(|(name, started, _)| hashes.get(*name).is_some_and(|h| h != started))
            .map(|(name, _, invocation)| (name.clone(), invocation.map(str::to_owned)))
            .collect();
        for (name, invocation) in candidates {
            let running = self
                .current
                .units
                .get(&name)
                .and_then(|u| u.systemd.as_ref())
                .is_some_and(|s| s.active_state() == ActiveState::Active);
            let now = match self.manager.details(&name).await {
                Ok(d) => d.invocation_id,
                Err(_) => continue,
            };
            if running && invocation.is_some() && now == invocation {
                pending.insert(name);
            } else {
                self.ledger.clear_swap(&name);
            }
        }
        let changed: Vec<UnitName> = self
            .current
            .restart_pending
            .symmetric_difference(&pending)
            .cloned()
            .collect();
        self.current.restart_pending = pending;
        self.mark_unpublished(changed);
    }

    /// Desired units whose file asks for an alias they may not have (`aliases`): held, and
    /// warned of once per file. An alias whose source cannot be read holds its unit this
    /// pass: fail closed.
    async fn aliased(&mut self, desired: &Desired) -> Vec<UnitName> {
        let mut held = Vec::new();
        let mut unchecked = Vec::new();
        for (name, unit) in &desired.units {
            let Some(words) = self.files.get(&unit.hash).map(aliases::aliases) else {
                continue;
            };
            match self.alias_verdicts.get(name) {
                _ if words.is_empty() => {}
                Some((hash, verdict)) if *hash == unit.hash => {
                    if verdict.is_some() {
                        held.push(name.clone());
                    }
                }
                _ => unchecked.push((name.clone(), unit.hash, words)),
            }
        }
        for (name, hash, words) in unchecked {
            match self.alias_refusal(desired, &name, &words).await {
                Ok(verdict) => {
                    if let Some(why) = &verdict {
                        warn!(unit = %name, reason = %why, "refusing to manage unit: an alias it asks for is not its to take");
                        held.push(name.clone());
                    }
                    self.alias_verdicts.insert(name, (hash, verdict));
                }
                Err(e) => {
                    warn!(unit = %name, error = %e, "reading where systemd has a unit's alias from failed; leaving the unit as it is");
                    held.push(name);
                }
            }
        }
        held
    }

    /// Why `name` may not have the aliases `words`, if it may not.
    async fn alias_refusal(
        &self,
        desired: &Desired,
        name: &UnitName,
        words: &[String],
    ) -> Result<Option<String>, crate::ManagerError> {
        for word in words {
            let parsed = word.parse::<UnitName>().ok();
            let source = match &parsed {
                Some(alias) if alias != name => Some(self.manager.source(alias).await?),
                _ => None,
            };
            let alias = aliases::Alias {
                name: word,
                denied: parsed.as_ref().is_some_and(|a| self.is_denied(a)),
                fleets: parsed.as_ref().is_some_and(|a| {
                    desired.units.contains_key(a) || self.current.units.contains_key(a)
                }),
                source: source.as_ref(),
            };
            if let Some(why) = aliases::refusal(name, &alias) {
                return Ok(Some(why));
            }
        }
        Ok(None)
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

    fn fail(&mut self, unit: UnitName, now: Instant) {
        let fresh = self.retry_backoff();
        let retry = self.backoff.entry(unit.clone()).or_insert(Retry {
            until: now,
            backoff: fresh,
        });
        let delay = retry.backoff.next_delay();
        retry.until = now + delay;
        info!(unit = %unit, retry_in = ?delay, "unit failed; retrying later");
    }

    /// The backoff of a failing unit: `backoff_min` to `backoff_max`, jittered.
    fn retry_backoff(&self) -> Backoff {
        Backoff::new(self.cfg.backoff_min, self.cfg.backoff_max)
    }

    /// The backoff of a loop that waits for etcd or systemd to answer: `backoff_min` to
    /// [`RECONNECT_MAX`], jittered so that agents do not come back in lockstep.
    fn reconnect_backoff(&self) -> Backoff {
        Backoff::new(
            self.cfg.backoff_min,
            RECONNECT_MAX.max(self.cfg.backoff_min),
        )
    }

    /// Publishes the states that changed since last time (all of them under a new lease) and
    /// withdraws those of units that left the units directory.
    async fn publish(&mut self) -> bool {
        let Some(presence) = *self.presence.borrow() else {
            return true;
        };
        if self.published_lease != Some(presence.lease()) {
            self.published.clear();
            self.published_lease = Some(presence.lease());
            self.unpublished = None;
        }
        // Only the units read again since the last complete publish, unless any may have
        // changed: a pass after one unit's change compares one state, not all of them.
        let machine = &self.cfg.machine;
        let (changed, gone): (Vec<UnitStateRecord>, Vec<UnitName>) = match self.unpublished.take() {
            Some(names) => {
                let mut changed = Vec::new();
                let mut gone = Vec::new();
                for name in names {
                    match self.current.record(&name, machine) {
                        Some(r) if self.published.get(&name) != Some(&r) => changed.push(r),
                        Some(_) => {}
                        None if self.published.contains_key(&name) => gone.push(name),
                        None => {}
                    }
                }
                (changed, gone)
            }
            None => {
                let records = self.current.records(machine);
                let gone = self
                    .published
                    .keys()
                    .filter(|n| !records.contains_key(*n))
                    .cloned()
                    .collect();
                let changed = records
                    .into_values()
                    .filter(|r| self.published.get(&r.name) != Some(r))
                    .collect();
                (changed, gone)
            }
        };
        // Whatever fails below is retried with every state compared again.
        self.unpublished = Some(BTreeSet::new());
        let registry = &self.registry;
        let mut complete = true;
        // Withdrawn first, together: a destroyed batch is gone from the registry as soon as
        // it is stopped, not one round trip per unit later, and what it frees under the bound
        // on states is free for the states published next.
        let chunks: Vec<Vec<UnitName>> = gone.chunks(MAX_TXN_OPS).map(<[_]>::to_vec).collect();
        let withdrawn: Vec<(Vec<UnitName>, bool)> = futures::stream::iter(chunks)
            .map(|chunk| async move {
                let ok = registry.remove_states(&chunk).await.is_ok();
                (chunk, ok)
            })
            .buffer_unordered(PUBLISHES)
            .collect()
            .await;
        for (chunk, ok) in withdrawn {
            if ok {
                for name in &chunk {
                    self.published.remove(name);
                }
            } else {
                complete = false;
            }
        }
        let (changed, past_bound) = bound::fit(&self.published, changed);
        if past_bound != self.past_bound {
            self.past_bound = past_bound;
            if past_bound > 0 {
                warn!(
                    machine = %self.cfg.machine,
                    units = past_bound,
                    bound = fleet_registry::MAX_STATES_PER_MACHINE,
                    "more units here than a machine may publish states of; theirs are not published"
                );
            }
        }
        // Many states to a transaction (a machine given 1,000 units publishes 8, not 1,000),
        // a few transactions at once. A failed one leaves its states for the retry.
        let chunks: Vec<Vec<UnitStateRecord>> =
            changed.chunks(MAX_TXN_OPS).map(<[_]>::to_vec).collect();
        let published: Vec<(Vec<UnitStateRecord>, bool)> = futures::stream::iter(chunks)
            .map(|chunk| async move {
                let ok = registry.publish_states(&presence, &chunk).await;
                if let Err(e) = &ok {
                    debug!(units = chunk.len(), error = %e, "publishing states failed");
                }
                (chunk, ok.is_ok())
            })
            .buffer_unordered(PUBLISHES)
            .collect()
            .await;
        for (chunk, ok) in published {
            if ok {
                for r in chunk {
                    self.published.insert(r.name.clone(), r);
                }
            } else {
                complete = false;
            }
        }
        if past_bound > 0 {
            // Compared again on the next pass: a withdrawal may have made room by then.
            self.unpublished = None;
        }
        if !complete {
            self.unpublished = None;
        }
        complete
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

/// Sleeps the next delay of `backoff` unless shutdown comes first; true on shutdown.
async fn wait_or_shutdown(shutdown: &mut watch::Receiver<bool>, backoff: &mut Backoff) -> bool {
    let d = backoff.next_delay();
    tokio::select! {
        _ = shutdown.changed() => true,
        _ = tokio::time::sleep(d) => *shutdown.borrow(),
    }
}
