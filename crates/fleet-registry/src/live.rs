//! A [`Snapshot`] kept current by one watch over the whole registry prefix, with every unit
//! file beside it: read once, then only the changes are decoded.
//!
//! The engine leader plans on this view. Re-reading and decoding everything for every pass
//! cost it most of its CPU and memory at 1,000 units and ~6.5 MiB of etcd reads per pass at
//! 10,000 (see docs/benchmarks.md). One prefix watch delivers every change in revision order
//! and never splits a revision across messages, so after each message the view is the
//! registry as it was at [`LiveView::revision`], never a half-applied transaction.
//!
//! Files are kept as the registry keeps them (written with their first unit, deleted with
//! their last), so a unit's file arrives in the same message as its record. A file that does
//! not parse is left out with a warning: its units then have no file, and the engine leaves
//! them alone, as it does when a file is missing. Any other value that does not parse is
//! left out as a snapshot leaves it out (listed in [`Snapshot::skipped`], what its key named
//! removed), with one warning when the view is read and one for each change that writes it.

use fleet_core::{MachineId, UnitFile, UnitHash, UnitName};
use std::collections::BTreeMap;
use tracing::{debug, warn};

use crate::error::{RegistryError, Result};
use crate::kv::{Event, EventKind, KeyValue, Kv, Revision, Watch, WatchMessage};
use crate::leader::EngineWrite;
use crate::metadata;
use crate::per_machine::PerMachine;
use crate::read::{self, Skipped};
use crate::registry::Registry;
use crate::snapshot::Snapshot;

/// Which parts of the view a batch of changes touched.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Touched {
    pub units: bool,
    pub files: bool,
    pub machines: bool,
    pub schedules: bool,
    pub states: bool,
    pub unscheduled: bool,
}

impl Touched {
    /// Only published unit states changed (what every agent writes on every state change).
    pub fn only_states(&self) -> bool {
        let Touched {
            units,
            files,
            machines,
            schedules,
            states: _,
            unscheduled,
        } = *self;
        !(units || files || machines || schedules || unscheduled)
    }

    fn merge(&mut self, other: Touched) {
        self.units |= other.units;
        self.files |= other.files;
        self.machines |= other.machines;
        self.schedules |= other.schedules;
        self.states |= other.states;
        self.unscheduled |= other.unscheduled;
    }
}

/// The registry's units, machines and their dynamic metadata, schedule, states,
/// unschedulable reasons and unit files, followed by a watch.
#[derive(Debug)]
pub struct LiveView<K> {
    registry: Registry<K>,
    snapshot: Snapshot,
    /// Whether unit files are kept (the engine needs them; fleetctl's wait does not).
    with_files: bool,
    files: BTreeMap<UnitHash, UnitFile>,
    watch: Watch,
}

impl<K: Kv> LiveView<K> {
    /// Reads everything, unit files included, at one revision and watches from the next.
    pub async fn start(registry: Registry<K>) -> Result<LiveView<K>> {
        LiveView::read(registry, true).await
    }

    /// As [`start`](Self::start), without the unit files: [`files`](Self::files) stays empty.
    pub async fn start_without_files(registry: Registry<K>) -> Result<LiveView<K>> {
        LiveView::read(registry, false).await
    }

    async fn read(registry: Registry<K>, with_files: bool) -> Result<LiveView<K>> {
        let snapshot = registry.snapshot().await?;
        for s in snapshot.skipped.values() {
            warn_skipped(s);
        }
        let mut files = BTreeMap::new();
        if with_files {
            let listed = registry
                .kv()
                .range(&registry.keys().files(), true, Some(snapshot.revision))
                .await
                .map_err(RegistryError::kv("reading unit files"))?;
            for kv in &listed.kvs {
                if let Some((hash, file)) = parse_file(registry.keys(), kv) {
                    files.insert(hash, file);
                }
            }
        }
        let watch = registry
            .kv()
            .watch(registry.keys().prefix(), true, snapshot.revision + 1)
            .await
            .map_err(RegistryError::kv("watching the registry"))?;
        debug!(
            revision = snapshot.revision,
            units = snapshot.units.len(),
            files = files.len(),
            "registry view read"
        );
        Ok(LiveView {
            registry,
            snapshot,
            with_files,
            files,
            watch,
        })
    }

    /// The registry as of [`revision`](Self::revision), plus the engine's own writes
    /// recorded since (see [`record_writes`](Self::record_writes)).
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Every readable unit file in the registry, by hash (none without files).
    pub fn files(&self) -> &BTreeMap<UnitHash, UnitFile> {
        &self.files
    }

    /// The revision of the last change applied.
    pub fn revision(&self) -> Revision {
        self.snapshot.revision
    }

    /// Waits for the next change and applies it, with every change that has already arrived
    /// after it (a burst becomes one batch). An error means the view cannot follow any more
    /// (the watch ended or fell behind a compaction): drop it and start a new one. A value
    /// that cannot be read is skipped, never an error.
    pub async fn changed(&mut self) -> Result<Touched> {
        let first = self.watch.rx.recv().await;
        let mut touched = self.apply_message(first)?;
        while let Ok(next) = self.watch.rx.try_recv() {
            touched.merge(self.apply_message(Some(next))?);
        }
        Ok(touched)
    }

    /// Records writes the engine made (and etcd accepted) before their events arrive, so
    /// that a plan made in between sees them: without this, a unit placed by the last pass
    /// would look unplaced and could be placed a second time elsewhere. The events re-apply
    /// the same values when they come; only the engine writes these keys.
    pub fn record_writes(&mut self, writes: &[EngineWrite]) {
        let keys = self.registry.keys();
        let snap = &mut self.snapshot;
        for write in writes {
            match write {
                EngineWrite::Schedule(entry) => {
                    // A put or delete of a schedule key replaces an unreadable value there.
                    snap.skipped
                        .remove(&keys.schedule(&entry.machine, &entry.name));
                    snap.schedule
                        .entry(entry.name.clone())
                        .or_default()
                        .insert(entry.machine.clone(), entry.clone());
                }
                EngineWrite::Unschedule { machine, unit } => {
                    snap.skipped.remove(&keys.schedule(machine, unit));
                    remove_inner(&mut snap.schedule, unit, machine);
                }
                EngineWrite::Unschedulable { unit, reason } => {
                    snap.unscheduled.insert(unit.clone(), reason.clone());
                }
                EngineWrite::ClearUnschedulable { unit } => {
                    snap.unscheduled.remove(unit);
                }
                // Not part of the view: only fleetctl reads it.
                EngineWrite::Disruption { .. } => {}
            }
        }
    }

    fn apply_message(&mut self, message: Option<WatchMessage>) -> Result<Touched> {
        let lost = RegistryError::ViewLost;
        match message {
            Some(WatchMessage::Events { revision, events }) => {
                let mut touched = Touched::default();
                for event in &events {
                    touched.merge(self.apply(event));
                }
                self.snapshot.revision = self.snapshot.revision.max(revision);
                Ok(touched)
            }
            Some(WatchMessage::Compacted { compact_revision }) => Err(lost(format!(
                "revision {} compacted (up to {compact_revision})",
                self.snapshot.revision + 1
            ))),
            Some(WatchMessage::Broken) | None => Err(lost("watch stream ended".to_owned())),
        }
    }

    /// Applies one change; keys the view does not keep (file references, the leader key)
    /// touch nothing.
    fn apply(&mut self, event: &Event) -> Touched {
        let kv = &event.kv;
        let keys = self.registry.keys();
        let Some(rest) = kv.key.strip_prefix(keys.prefix()) else {
            return Touched::default();
        };
        let Some((kind, _)) = rest.split_once('/') else {
            return Touched::default();
        };
        let mut touched = Touched::default();
        match kind {
            "file" if !self.with_files => {}
            "file" => {
                if event.kind == EventKind::Put {
                    if let Some((hash, file)) = parse_file(keys, kv) {
                        self.files.insert(hash, file);
                    }
                } else if let Ok(hash) = read::key_part::<UnitHash>(keys, kv, &keys.files()) {
                    self.files.remove(&hash);
                }
                touched.files = true;
            }
            "unit" => {
                self.apply_record(event);
                touched.units = true;
            }
            "machine" => {
                self.apply_record(event);
                touched.machines = true;
            }
            // Dynamic metadata changes what a machine offers, as a new machine record does.
            "metadata" => {
                self.apply_metadata(event);
                touched.machines = true;
            }
            "schedule" => {
                self.apply_record(event);
                touched.schedules = true;
            }
            "state" => {
                self.apply_record(event);
                touched.states = true;
            }
            "unscheduled" => {
                self.apply_record(event);
                touched.unscheduled = true;
            }
            _ => {}
        }
        touched
    }

    /// Applies a put or delete of a dynamic metadata value, as [`apply_record`] does a record.
    ///
    /// [`apply_record`]: Self::apply_record
    fn apply_metadata(&mut self, event: &Event) {
        let kv = &event.kv;
        let keys = self.registry.keys();
        let snap = &mut self.snapshot;
        snap.skipped.remove(&kv.key);
        if let Some((machine, key)) = metadata::named(keys, &kv.key)
            && let Some(values) = snap.metadata.get_mut(&machine)
        {
            values.remove(key.as_str());
            if values.is_empty() {
                snap.metadata.remove(&machine);
            }
        }
        if event.kind == EventKind::Delete {
            return;
        }
        match metadata::read(keys, kv) {
            Ok((machine, key, value)) => {
                snap.metadata.entry(machine).or_default().insert(key, value);
            }
            Err(s) => {
                warn_skipped(&s);
                snap.skip(s);
            }
        }
    }

    /// Applies a put or delete of a snapshot record: first what was at the key goes (the
    /// key names it), then a readable new value goes in, an unreadable one into `skipped`.
    fn apply_record(&mut self, event: &Event) {
        let kv = &event.kv;
        let keys = self.registry.keys();
        let snap = &mut self.snapshot;
        snap.skipped.remove(&kv.key);
        remove_at(snap, keys, kv);
        if event.kind == EventKind::Delete {
            return;
        }
        let inserted = match &kv.key {
            k if k.starts_with(&keys.units()) => read::unit(keys, kv).map(|unit| {
                snap.units.insert(unit.name().clone(), unit);
            }),
            k if k.starts_with(&keys.machines()) => read::machine(keys, kv).map(|m| {
                snap.machines.insert(m.id.clone(), m);
            }),
            k if k.starts_with(&keys.schedules()) => {
                read::schedule_entry(keys, kv).map(|e| snap.insert_schedule(e))
            }
            k if k.starts_with(&keys.states()) => {
                read::state(keys, kv).map(|s| snap.insert_state(s))
            }
            _ => read::unscheduled(keys, kv).map(|(unit, reason)| {
                snap.unscheduled.insert(unit, reason);
            }),
        };
        if let Err(s) = inserted {
            warn_skipped(&s);
            snap.skip(s);
        }
    }
}

/// Removes what the key of `kv` names from the snapshot. A key that names nothing readable
/// (not a unit name, not two parts) can hold nothing the snapshot kept.
fn remove_at(snap: &mut Snapshot, keys: &crate::Keys, kv: &KeyValue) {
    if let Ok(unit) = read::key_part::<UnitName>(keys, kv, &keys.units()) {
        snap.units.remove(&unit);
    } else if let Ok(machine) = read::key_part::<MachineId>(keys, kv, &keys.machines()) {
        snap.machines.remove(&machine);
    } else if let Some((machine, unit)) = read::key_pair(kv, &keys.schedules()) {
        remove_inner(&mut snap.schedule, &unit, &machine);
    } else if let Some((unit, machine)) = read::key_pair(kv, &keys.states()) {
        remove_inner(&mut snap.states, &unit, &machine);
    } else if let Ok(unit) = read::key_part::<UnitName>(keys, kv, &keys.unscheduled_all()) {
        snap.unscheduled.remove(&unit);
    }
}

fn warn_skipped(s: &Skipped) {
    warn!(key = %s.key, error = %s.detail, "skipping unreadable registry value");
}

fn remove_inner<V>(
    map: &mut BTreeMap<UnitName, PerMachine<V>>,
    unit: &UnitName,
    machine: &MachineId,
) {
    if let Some(inner) = map.get_mut(unit) {
        inner.remove(machine);
        if inner.is_empty() {
            map.remove(unit);
        }
    }
}

/// A stored file, or `None` (with a warning) when its key or text does not parse.
fn parse_file(keys: &crate::Keys, kv: &KeyValue) -> Option<(UnitHash, UnitFile)> {
    match read::file(keys, kv) {
        Ok(pair) => Some(pair),
        Err(s) => {
            warn!(key = %s.key, error = %s.detail, "unit file unreadable; its units are left alone");
            None
        }
    }
}
