//! Following this machine's schedule: the whole read, the watch's events applied on top,
//! and the unit files the entries name, fetched in batches. Decides nothing about units;
//! a unit denied by configuration is left out of the schedule held and warned of once.

use fleet_core::{UnitHash, UnitName};
use fleet_registry::kv::{Event, Kv, MAX_TXN_OPS, Revision};
use fleet_registry::{Delta, RegistryError, ScheduleChange, Skipped};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use tokio::time::Instant;
use tracing::warn;

use super::{Agent, FILE_FETCHES};
use crate::manager::UnitManager;

impl<K: Kv, M: UnitManager> Agent<K, M> {
    /// Reads this machine's schedule and the files it needs.
    pub(super) async fn read_schedule(&mut self) -> Result<Revision, RegistryError> {
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
    pub(super) async fn follow_schedule(
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
}
