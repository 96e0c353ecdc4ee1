//! A [`Mirror`] of the registry kept current by one watch, for one holder that applies the
//! changes itself when it asks for them: fleetctl-side waits and tests. A process that
//! plans or serves listings from memory shares one [`Store`](crate::Store) instead.
//!
//! The engine leader planned on this view before the store: re-reading and decoding
//! everything for every pass cost it most of its CPU and memory at 1,000 units and ~6.5 MiB
//! of etcd reads per pass at 10,000 (see docs/benchmarks.md).

use fleet_core::{UnitFile, UnitHash, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use tokio::sync::mpsc;

use crate::error::{RegistryError, Result};
use crate::kv::{Kv, Revision, WatchMessage};
use crate::leader::EngineWrite;
use crate::mirror::{Changed, Mirror, Touched};
use crate::read::Skipped;
use crate::registry::Registry;
use crate::snapshot::Snapshot;

/// The registry's units, machines and their metadata, schedule, states, unschedulable reasons and unit files,
/// followed by a watch.
#[derive(Debug)]
pub struct LiveView<K> {
    registry: Registry<K>,
    mirror: Mirror,
    /// The watch's messages, drained from it as they come.
    watch: mpsc::UnboundedReceiver<WatchMessage>,
    /// What changed since [`take_changed_units`](Self::take_changed_units) last asked.
    changed: Changed,
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
        let (mirror, watch) = Mirror::read(&registry, with_files).await?;
        Ok(LiveView {
            registry,
            mirror,
            watch,
            changed: Changed::default(),
        })
    }

    /// The units whose record or file changed since the last call (or since the view was
    /// read), and forgets them; `None` when a change could not be traced to its units (a
    /// key that does not parse). Writes recorded with [`record_writes`](Self::record_writes)
    /// are not changes here.
    pub fn take_changed_units(&mut self) -> Option<BTreeSet<UnitName>> {
        std::mem::take(&mut self.changed).units(&self.mirror.snapshot)
    }

    /// The registry as of [`revision`](Self::revision), plus the writes recorded since
    /// (see [`record_writes`](Self::record_writes)).
    pub fn snapshot(&self) -> &Snapshot {
        &self.mirror.snapshot
    }

    /// Every readable unit file in the registry, by hash (none without files).
    pub fn files(&self) -> &BTreeMap<UnitHash, UnitFile> {
        &self.mirror.files
    }

    /// The unit files kept that do not read, by key (their units have no file).
    pub fn unreadable_files(&self) -> impl Iterator<Item = &Skipped> {
        self.mirror.unreadable_files.values()
    }

    /// The revision of the last change applied.
    pub fn revision(&self) -> Revision {
        self.mirror.revision()
    }

    /// Waits for the next change and applies it, with every change that has already arrived
    /// after it (a burst becomes one batch). An error means the view cannot follow any more
    /// (the watch ended or fell behind a compaction): drop it and start a new one. A value
    /// that cannot be read is skipped, never an error.
    pub async fn changed(&mut self) -> Result<Touched> {
        let first = self.watch.recv().await;
        let mut touched = self.mirror.apply_message(first, &mut self.changed)?;
        touched.merge(self.catch_up()?);
        Ok(touched)
    }

    /// Applies every change that has already arrived, without waiting for one: a holder
    /// that reads the view now and then keeps it current, and its backlog small, this way.
    /// An error means the view cannot follow any more, as in [`changed`](Self::changed).
    pub fn catch_up(&mut self) -> Result<Touched> {
        let mut touched = Touched::default();
        loop {
            match self.watch.try_recv() {
                Ok(message) => {
                    let applied = self.mirror.apply_message(Some(message), &mut self.changed);
                    touched.merge(applied?);
                }
                Err(mpsc::error::TryRecvError::Empty) => return Ok(touched),
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    return Err(RegistryError::ViewLost("watch stream ended".to_owned()));
                }
            }
        }
    }

    /// Records writes a leader made (and etcd accepted) before their events arrive, so that
    /// a plan made in between sees them. The events re-apply the same values when they come;
    /// only the leader writes these keys. (The engine waits for its writes' revision in the
    /// shared [`Store`](crate::Store) instead.)
    pub fn record_writes(&mut self, writes: &[EngineWrite]) {
        let keys = self.registry.keys();
        let snap = &mut self.mirror.snapshot;
        for write in writes {
            match write {
                EngineWrite::Schedule(entry) => {
                    // A put or delete of a schedule key replaces an unreadable value there.
                    snap.remove(keys, &keys.schedule(&entry.machine, &entry.name));
                    snap.insert_schedule(entry.clone());
                }
                EngineWrite::Unschedule { machine, unit } => {
                    snap.remove(keys, &keys.schedule(machine, unit));
                }
                EngineWrite::Leave {
                    machine,
                    unit,
                    copy,
                } => {
                    snap.remove(keys, &keys.schedule(machine, unit));
                    snap.remove(keys, &keys.left(unit, machine));
                    snap.insert_left(unit.clone(), machine.clone(), *copy);
                }
                EngineWrite::Record {
                    unit,
                    machine,
                    copy,
                } => {
                    snap.remove(keys, &keys.left(unit, machine));
                    snap.insert_left(unit.clone(), machine.clone(), *copy);
                }
                EngineWrite::Forget { unit, machine } => {
                    snap.remove(keys, &keys.left(unit, machine));
                }
                EngineWrite::Unschedulable { unit, reason } => {
                    snap.unscheduled.insert(unit.clone(), reason.clone());
                }
                EngineWrite::ClearUnschedulable { unit } => {
                    snap.unscheduled.remove(unit);
                }
                EngineWrite::Moving(record) => {
                    snap.remove(keys, &keys.moving(&record.unit));
                    snap.moving.insert(record.unit.clone(), record.clone());
                }
                EngineWrite::Moved { unit } => {
                    snap.remove(keys, &keys.moving(unit));
                }
                EngineWrite::DeleteStray(key) => {
                    snap.remove(keys, key.as_str());
                }
                // Not part of the view: only fleetctl reads it.
                EngineWrite::Disruption { .. } => {}
            }
        }
    }
}
