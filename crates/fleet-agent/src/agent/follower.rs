//! Following this machine's schedule: the whole read, the watch on its prefix and the events
//! it keeps, applied on top of the schedule held, and the unit files the entries name. Owns
//! the revision the schedule is at and whether it may be trusted: until read once, and while
//! this machine's lease may have lapsed since it was read ([`doubt`](super::doubt)), there is
//! no schedule to act on (fail closed).
//!
//! Decides nothing about units: it says which entries changed, and the agent decides what that
//! means (a fresh chance for a failing unit, a pass over those units). A unit denied by
//! configuration is left out of the schedule held and warned of once.

use fleet_core::{Backoff, UnitFile, UnitHash, UnitName};
use fleet_registry::kv::{Event, Kv, Revision};
use fleet_registry::{
    CarriedFile, Delta, MachineRole, RegistryError, ScheduleChange, ScheduleEntry, Skipped,
    WatchHints,
};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::config::is_denied;
use super::doubt::LeaseDoubt;
use crate::fence::Deadline;

/// A schedule: each unit's entry.
pub(super) type Schedule = BTreeMap<UnitName, ScheduleEntry>;
/// Unit files by hash.
pub(super) type Files = BTreeMap<UnitHash, UnitFile>;

/// This machine's schedule as last read and followed, with the files its entries name.
#[derive(Debug)]
pub(super) struct ScheduleFollower<K> {
    registry: MachineRole<K>,
    deny_units: Vec<String>,
    /// The schedule; `None` until read once (fail closed).
    schedule: Option<BTreeMap<UnitName, ScheduleEntry>>,
    /// The revision `schedule` is at: watch events up to it are in it already.
    revision: Revision,
    /// The next change re-reads everything instead of applying the watch's events: this
    /// machine's lease was in doubt (a failed renewal, a new lease) since the last full read.
    /// In that case the watch may be late (a file that could not be read is `unfetched`).
    /// After a partition heals, etcd's buffered responses arrive one by one. The first of
    /// them can say "start U here" while a later one says "U moved elsewhere". Applied one
    /// response at a time, they made an agent start a unit that already ran on another
    /// machine, and then stop it (the chaos soak, seed 1796183104550035049).
    stale: bool,
    files: BTreeMap<UnitHash, UnitFile>,
    /// Units whose entries changed since [`take_changed`](Self::take_changed) last asked.
    changed: BTreeSet<UnitName>,
    /// Scheduled units refused by `deny_units`, each warned about once.
    denied: BTreeSet<UnitName>,
    /// Unreadable entries by key, with the revision each was written at: each is warned
    /// about once, not on every read.
    skipped: BTreeMap<String, Revision>,
    hints: Option<WatchHints>,
    /// Whether the lease may have lapsed since the schedule was read.
    doubt: LeaseDoubt,
    /// Whether the schedule was last refused for that, to log each spell once.
    held_in_doubt: bool,
    /// When to read again after a read failed (a request past its deadline, etcd away); none
    /// while the last read succeeded. Without it a failed read waited for the next change or
    /// the minute's resync: at 5,000 machines on fleetd's 1 s deadline, units scheduled in
    /// one burst started up to a minute late (issue 43).
    retry_at: Option<Instant>,
    retry: Backoff,
    /// Whether a file the schedule names could not be read after the watch's events were
    /// applied (etcd away, a request past its deadline): the retry reads the files missing,
    /// not the whole schedule. It read the whole schedule before, and under load that read
    /// too passed its deadline: in a 5,000-machine launch over TLS, 21,598 of the agents'
    /// 64,033 requests past their deadline were such reads (issue 43).
    unfetched: bool,
    /// Whether a file an entry carries is taken without reading it (`trust_engine_files`).
    trust_carried: bool,
}

/// What following the schedule found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Followed {
    /// The watch's events were applied: only these units' entries changed.
    Units(BTreeSet<UnitName>),
    /// The whole schedule was read: any unit's entry may have changed.
    Whole,
}

impl<K: Kv> ScheduleFollower<K> {
    /// A follower that retries a failed read after `retry`'s pauses.
    pub(super) fn new(
        registry: MachineRole<K>,
        deny_units: Vec<String>,
        retry: Backoff,
    ) -> ScheduleFollower<K> {
        ScheduleFollower {
            registry,
            deny_units,
            schedule: None,
            revision: 0,
            stale: false,
            files: BTreeMap::new(),
            changed: BTreeSet::new(),
            denied: BTreeSet::new(),
            skipped: BTreeMap::new(),
            hints: None,
            doubt: LeaseDoubt::none(),
            held_in_doubt: false,
            retry_at: None,
            retry,
            unfetched: false,
            trust_carried: false,
        }
    }

    /// Distrusts the schedule whenever the fence's deadline says the lease may have lapsed
    /// since it was read.
    pub(super) fn fenced(&mut self, deadlines: watch::Receiver<Option<Deadline>>) {
        self.doubt = LeaseDoubt::of(deadlines);
    }

    // ---- what is held ----------------------------------------------------------------------

    /// Deletes this machine's migration mark (see `migration.rs`): whether there was one.
    pub(super) async fn end_migration(&self) -> fleet_registry::Result<bool> {
        self.registry.end_migration().await
    }

    /// The schedule as read, whether or not it may be acted on; `None` until read once.
    pub(super) fn schedule(&self) -> Option<&Schedule> {
        self.schedule.as_ref()
    }

    /// The schedule to act on at `now`, with the files it names: `None` until read once, and
    /// while the lease may have lapsed since it was read (each such spell logged once).
    pub(super) fn trusted(&mut self, now: Instant) -> Option<(&Schedule, &Files)> {
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
        let schedule = self.schedule.as_ref().filter(|_| !in_doubt)?;
        Some((schedule, &self.files))
    }

    /// Whether `unit` is scheduled here.
    pub(super) fn is_scheduled(&self, unit: &UnitName) -> bool {
        self.schedule.as_ref().is_some_and(|s| s.contains_key(unit))
    }

    /// The units scheduled here (none before the first read).
    pub(super) fn scheduled(&self) -> BTreeSet<UnitName> {
        self.schedule
            .as_ref()
            .map(|s| s.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The unit files read so far, by hash.
    pub(super) fn files(&self) -> &Files {
        &self.files
    }

    /// The units whose entries changed since the last call, forgotten by this one: a failing
    /// unit whose entry changed deserves a fresh chance. Entries count as changed as soon as
    /// they are read, even when a file they name could not be.
    pub(super) fn take_changed(&mut self) -> BTreeSet<UnitName> {
        std::mem::take(&mut self.changed)
    }

    // ---- hints ------------------------------------------------------------------------------

    /// Starts watching the schedule from just after the revision read (after the first read).
    pub(super) fn watch(&mut self) {
        self.hints = Some(self.registry.watch_schedule(self.revision + 1));
    }

    /// Waits until the watch says the schedule may have changed; never, before [`watch`].
    ///
    /// [`watch`]: Self::watch
    pub(super) async fn hinted(&mut self) -> Option<()> {
        match &mut self.hints {
            Some(hints) => hints.changed().await.map(|_| ()),
            None => std::future::pending().await,
        }
    }

    /// The events the watch kept since the last call, or [`Delta::Gap`].
    pub(super) fn take_delta(&mut self) -> Delta {
        self.hints.as_mut().map_or(Delta::Gap, WatchHints::take)
    }

    /// The next change re-reads the whole schedule (the lease changed: the watch may be late).
    pub(super) fn distrust_events(&mut self) {
        self.stale = true;
    }

    /// Whether a whole read now would end a doubt about the lease: the lease was renewed
    /// since it may have lapsed.
    pub(super) fn wants_read(&self, now: Instant) -> bool {
        self.doubt.wants_read(now) || self.retry_at.is_some_and(|at| now >= at)
    }

    /// What the read due at `now` ([`wants_read`](Self::wants_read)) is to follow: no events,
    /// when all it must do is read the files a failed read left out, else a gap (the whole
    /// schedule).
    pub(super) fn due(&self, now: Instant) -> Delta {
        if self.unfetched && !self.stale && !self.doubt.wants_read(now) {
            Delta::Events(Vec::new())
        } else {
            Delta::Gap
        }
    }

    /// When a failed read is due again; `None` while the last one succeeded.
    pub(super) fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    // ---- reads ------------------------------------------------------------------------------

    /// Brings the schedule up to date: applies the watch's events when it kept them all,
    /// re-reads the whole schedule otherwise. A pass then costs what changed, not every
    /// unit scheduled here (with 1,000 units each change re-read all 1,000 entries).
    /// A failed read is due again after a pause of the retry's backoff ([`retry_at`]).
    ///
    /// [`retry_at`]: Self::retry_at
    pub(super) async fn follow(&mut self, delta: Delta) -> Result<Followed, RegistryError> {
        let followed = self.follow_once(delta).await;
        match &followed {
            Ok(_) => {
                self.retry_at = None;
                self.retry.reset();
            }
            Err(_) => self.retry_at = Some(Instant::now() + self.retry.next_delay()),
        }
        followed
    }

    async fn follow_once(&mut self, delta: Delta) -> Result<Followed, RegistryError> {
        match delta {
            Delta::Events(events) if self.schedule.is_some() && !self.stale => {
                match self.apply(&events).await {
                    // The files missing are read now: their units get a pass too.
                    Ok(Some(_)) if std::mem::take(&mut self.unfetched) => Ok(Followed::Whole),
                    Ok(Some(changed)) => Ok(Followed::Units(changed)),
                    Ok(None) => self.read().await.map(|()| Followed::Whole),
                    Err(e) => {
                        self.unfetched = true;
                        Err(e)
                    }
                }
            }
            Delta::Events(_) | Delta::Gap => self.read().await.map(|()| Followed::Whole),
        }
    }

    /// Reads the whole schedule and the files it needs.
    pub(super) async fn read(&mut self) -> Result<(), RegistryError> {
        let (at_start, started) = (self.doubt.deadline(), Instant::now());
        let listing = self.registry.schedule().await?;
        self.note_skipped(&listing.skipped);
        let mut schedule = BTreeMap::new();
        let mut carried = Vec::new();
        for (e, file) in listing.items {
            if self.refuse(&e.name) {
                continue;
            }
            carried.push((e.hash, file));
            schedule.insert(e.name.clone(), e);
        }
        let wanted: BTreeSet<UnitHash> = schedule.values().map(|e| e.hash).collect();
        if let Some(old) = &self.schedule {
            let names = old.keys().chain(schedule.keys());
            self.changed
                .extend(names.filter(|n| old.get(*n) != schedule.get(*n)).cloned());
        }
        self.files.retain(|h, _| wanted.contains(h));
        for (hash, file) in carried {
            self.take_carried(hash, file);
        }
        self.fetch_files(wanted).await?;
        self.schedule = Some(schedule);
        self.doubt.read(at_start, started);
        self.revision = listing.revision;
        self.stale = false;
        self.unfetched = false;
        Ok(())
    }

    /// Whether `unit` is refused by `deny_units` (warned about the first time).
    fn refuse(&mut self, unit: &UnitName) -> bool {
        if !is_denied(&self.deny_units, unit) {
            return false;
        }
        if self.denied.insert(unit.clone()) {
            warn!(unit = %unit, "refusing to manage unit: it matches deny_units");
        }
        true
    }

    /// Applies schedule events newer than the schedule held and returns the units whose
    /// entries changed; `None` (nothing applied) when one cannot be read as an entry of ours:
    /// only a whole read says what to skip.
    async fn apply(
        &mut self,
        events: &[Event],
    ) -> Result<Option<BTreeSet<UnitName>>, RegistryError> {
        let fresh: Vec<(Revision, ScheduleChange)> = events
            .iter()
            .filter(|e| e.kv.mod_revision > self.revision)
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
            self.revision = self.revision.max(revision);
            let (name, entry) = match change {
                ScheduleChange::Put(e, _) if self.refuse(&e.name) => (e.name, None),
                ScheduleChange::Put(e, file) => {
                    self.take_carried(e.hash, file);
                    (e.name.clone(), Some(e))
                }
                ScheduleChange::Removed(name) => (name, None),
                ScheduleChange::Unreadable => unreachable!("refused above"),
            };
            let schedule = self.schedule.get_or_insert_with(BTreeMap::new);
            let old = match entry {
                Some(e) => {
                    new_hashes.insert(e.hash);
                    schedule.insert(name.clone(), e)
                }
                None => schedule.remove(&name),
            };
            if old.as_ref() != schedule.get(&name) {
                dropped_hash |=
                    old.is_some_and(|o| schedule.get(&name).map(|e| e.hash) != Some(o.hash));
                changed.insert(name);
            }
        }
        self.changed.extend(changed.iter().cloned());
        if dropped_hash {
            let wanted: BTreeSet<UnitHash> = self
                .schedule
                .iter()
                .flat_map(|s| s.values().map(|e| e.hash))
                .collect();
            self.files.retain(|h, _| wanted.contains(h));
        }
        if self.unfetched {
            // Those a failed read left out, with the new ones (those held are not read).
            new_hashes.extend(
                self.schedule
                    .iter()
                    .flat_map(|s| s.values().map(|e| e.hash)),
            );
        }
        self.fetch_files(new_hashes).await?;
        Ok(Some(changed))
    }

    /// Takes the files schedule entries carry without reading them (issue 43). Only an
    /// engine host can write an entry, but it cannot write a file: trusting what its entries
    /// carry lets it run files no operator stored (docs/security.md), so this is fleetd's
    /// `trust_engine_files`, off unless set.
    pub(super) fn trusting_carried_files(mut self, trust: bool) -> Self {
        self.trust_carried = trust;
        self
    }

    /// Keeps the file a schedule entry carries (issue 43), when trusted, so that it need not
    /// be read. One that does not read as the entry's file is warned about and read from the
    /// registry.
    fn take_carried(&mut self, hash: UnitHash, file: CarriedFile) {
        if !self.trust_carried {
            return;
        }
        match file {
            CarriedFile::File(file) => {
                self.files.entry(hash).or_insert(file);
            }
            CarriedFile::Absent => {}
            CarriedFile::Unreadable(why) => {
                warn!(hash = %hash, error = %why, "a schedule entry carries an unreadable file; reading the file instead")
            }
        }
    }

    /// Reads the files of `hashes` not held yet, in as few requests as the registry can.
    async fn fetch_files(&mut self, hashes: BTreeSet<UnitHash>) -> Result<(), RegistryError> {
        let missing: Vec<UnitHash> = hashes
            .into_iter()
            .filter(|h| !self.files.contains_key(h))
            .collect();
        let mut fetched = self.registry.files_batched(&missing);
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
}

#[cfg(test)]
mod tests;
