//! A [`Snapshot`] kept current by one watch over the whole registry prefix, with every unit
//! file beside it: read once, then only the changes are decoded.
//!
//! The engine leader plans on this view. Re-reading and decoding everything for every pass
//! cost it most of its CPU and memory at 1,000 units and ~6.5 MiB of etcd reads per pass at
//! 10,000 (see docs/benchmarks.md). One prefix watch delivers every change in revision order
//! and never splits a revision across messages, so after each message the view is the
//! registry as it was at [`LiveView::revision`], never a half-applied transaction.
//!
//! The watch is drained as fast as etcd sends, into memory, whatever the engine is doing: a
//! view read only between passes left its stream unread for a whole pass, and etcd 3.4 marked
//! it a slow watcher, which it catches up under the lock its writes take. At 100,000 units the
//! engine's watch held up to 150,000 pending events (docs/benchmarks.md, "Scale II"; etcd's
//! stalls there outlived this fix: etcd 3.4 copies its write buffer for every read and every
//! `Txn`). The backlog is held here instead, bounded by what is written during one pass.
//!
//! Files are kept as the registry keeps them (written with their first unit, deleted with
//! their last), so a unit's file arrives in the same message as its record. A file that does
//! not parse is left out with a warning: its units then have no file, and the engine leaves
//! them alone, as it does when a file is missing. Any other value that does not parse is
//! left out as a snapshot leaves it out (listed in [`Snapshot::skipped`], what its key named
//! removed), with one warning when the view is read and one for each change that writes it.

use fleet_core::{UnitFile, UnitHash, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use tokio::sync::mpsc;
use tracing::{Instrument, debug, warn};

use crate::error::{RegistryError, Result};
use crate::keys::{Key, Kind};
use crate::kv::{Event, EventKind, KeyValue, Kv, Revision, Watch, WatchMessage};
use crate::leader::EngineWrite;
use crate::read::{self, Skipped};
use crate::registry::Registry;
use crate::snapshot::Snapshot;

/// Which parts of the view a batch of changes touched.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Touched {
    pub units: bool,
    pub files: bool,
    /// A machine registered, or changed what it offers (dynamic metadata, a drain).
    pub machines: bool,
    /// A machine's record was deleted (its lease ran out or was revoked): the units on it
    /// may have to move, and nothing any other machine offers changed.
    pub departed: bool,
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
            departed,
            schedules,
            states: _,
            unscheduled,
        } = *self;
        !(units || files || machines || departed || schedules || unscheduled)
    }

    fn merge(&mut self, other: Touched) {
        self.units |= other.units;
        self.files |= other.files;
        self.machines |= other.machines;
        self.departed |= other.departed;
        self.schedules |= other.schedules;
        self.states |= other.states;
        self.unscheduled |= other.unscheduled;
    }
}

/// The registry's units, machines and their metadata, schedule, states, unschedulable reasons and unit files,
/// followed by a watch.
#[derive(Debug)]
pub struct LiveView<K> {
    registry: Registry<K>,
    snapshot: Snapshot,
    /// Whether unit files are kept (the engine needs them; fleetctl's wait does not).
    with_files: bool,
    files: BTreeMap<UnitHash, UnitFile>,
    /// Files kept that do not read, by key: left out of `files` (their units have no file).
    unreadable_files: BTreeMap<String, Skipped>,
    /// The watch's messages, drained from it by [`drain`] as they come.
    watch: mpsc::UnboundedReceiver<WatchMessage>,
    /// What changed since [`take_changed_units`](Self::take_changed_units) last asked.
    changed: Changed,
}

/// The units and files changes touched, for a leader that plans only those units.
#[derive(Debug, Default)]
struct Changed {
    units: BTreeSet<UnitName>,
    files: BTreeSet<UnitHash>,
    /// A unit or file key that names nothing readable changed: any unit may be concerned.
    unnamed: bool,
}

/// Reads `watch` as fast as it delivers, into an unbounded channel, until the receiver is
/// dropped (which drops the watch and so cancels it in etcd).
fn drain(mut watch: Watch) -> mpsc::UnboundedReceiver<WatchMessage> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        async move {
            loop {
                tokio::select! {
                    message = watch.rx.recv() => {
                        let Some(message) = message else { break };
                        if tx.send(message).is_err() {
                            break;
                        }
                    }
                    () = tx.closed() => break,
                }
            }
        }
        .in_current_span(),
    );
    rx
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
        let mut unreadable_files = BTreeMap::new();
        if with_files {
            let listed = registry
                .kv()
                .range(&registry.keys().files(), true, Some(snapshot.revision))
                .await
                .map_err(RegistryError::kv("reading unit files"))?;
            for kv in &listed.kvs {
                match parse_file(registry.keys(), kv) {
                    Ok((hash, file)) => {
                        files.insert(hash, file);
                    }
                    Err(s) => {
                        unreadable_files.insert(s.key.clone(), s);
                    }
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
            unreadable_files,
            watch: drain(watch),
            changed: Changed::default(),
        })
    }

    /// The units whose record or file changed since the last call (or since the view was
    /// read), and forgets them; `None` when a change could not be traced to its units (a
    /// key that does not parse). The engine's own writes are not changes here.
    pub fn take_changed_units(&mut self) -> Option<BTreeSet<UnitName>> {
        let Changed {
            mut units,
            files,
            unnamed,
        } = std::mem::take(&mut self.changed);
        if unnamed {
            return None;
        }
        if !files.is_empty() {
            // A file changes the plan of every unit that names it (a unit whose file was
            // missing is left alone until it arrives).
            let naming = self.snapshot.units.iter();
            units.extend(
                naming
                    .filter(|(_, u)| files.contains(&u.hash()))
                    .map(|(n, _)| n.clone()),
            );
        }
        Some(units)
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

    /// The unit files kept that do not read, by key (their units have no file).
    pub fn unreadable_files(&self) -> impl Iterator<Item = &Skipped> {
        self.unreadable_files.values()
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
        let first = self.watch.recv().await;
        let mut touched = self.apply_message(first)?;
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
                Ok(message) => touched.merge(self.apply_message(Some(message))?),
                Err(mpsc::error::TryRecvError::Empty) => return Ok(touched),
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    return Err(RegistryError::ViewLost("watch stream ended".to_owned()));
                }
            }
        }
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
    /// touch nothing. A put or delete of a snapshot record first removes what was at the key
    /// (the key names it), then puts a readable new value in, an unreadable one in `skipped`.
    fn apply(&mut self, event: &Event) -> Touched {
        let kv = &event.kv;
        let keys = self.registry.keys();
        let Some(kind) = keys.kind(&kv.key) else {
            return Touched::default();
        };
        let mut touched = Touched::default();
        let flag = match kind {
            Kind::File if !self.with_files => return touched,
            Kind::File => {
                let Some(Key::File(hash)) = Key::parse(keys, &kv.key) else {
                    self.changed.unnamed = true;
                    touched.files = true;
                    return touched;
                };
                self.unreadable_files.remove(&kv.key);
                if event.kind == EventKind::Put {
                    match parse_file(keys, kv) {
                        // Every batch of new units puts its files again, whether or not
                        // etcd holds them (a concurrent collection may have just deleted
                        // one). The same content again changes no unit: counting it made
                        // each batch of a template's instances replan every instance
                        // before it.
                        Ok((_, file)) if self.files.get(&hash) == Some(&file) => {
                            return touched;
                        }
                        Ok((hash, file)) => {
                            self.files.insert(hash, file);
                        }
                        Err(s) => {
                            self.unreadable_files.insert(s.key.clone(), s);
                        }
                    }
                } else {
                    self.files.remove(&hash);
                }
                self.changed.files.insert(hash);
                touched.files = true;
                return touched;
            }
            // Placements mirror the schedule, whose own events the view applies.
            // Events (issue 41) change no plan: written on every decision, they must not
            // wake the engine that wrote them.
            Kind::FileRef | Kind::Engine | Kind::Placement | Kind::Event => return touched,
            Kind::Unit => {
                match Key::parse(keys, &kv.key) {
                    Some(Key::Unit(name)) => {
                        self.changed.units.insert(name);
                    }
                    _ => self.changed.unnamed = true,
                }
                &mut touched.units
            }
            // Dynamic metadata and a drain change what a machine offers, as a new machine
            // record does.
            Kind::Machine if event.kind == EventKind::Delete => &mut touched.departed,
            Kind::Machine | Kind::Metadata | Kind::Drain | Kind::Migrating => &mut touched.machines,
            // Written by the leader alone, like schedules (and recorded in the same way).
            Kind::Moving | Kind::Left => &mut touched.schedules,
            Kind::Schedule => &mut touched.schedules,
            Kind::State => &mut touched.states,
            Kind::Unscheduled => &mut touched.unscheduled,
        };
        *flag = true;
        let held = self.snapshot.remove(keys, &kv.key);
        // A key that existed but held nothing here was a state left out past its machine's
        // bound (a put of version 1 creates its key).
        if kind == Kind::State && !held && (event.kind == EventKind::Delete || kv.version > 1) {
            self.snapshot.release_past_state(keys, &kv.key);
        }
        if event.kind == EventKind::Put
            && let Some(s) = self.snapshot.insert(keys, kv)
        {
            warn_skipped(s);
        }
        touched
    }
}

fn warn_skipped(s: &Skipped) {
    warn!(key = %s.key, error = %s.detail, "skipping unreadable registry value");
}

/// A stored file, or what is wrong with it (warned about) when its key or text does not
/// parse.
fn parse_file(
    keys: &crate::Keys,
    kv: &KeyValue,
) -> std::result::Result<(UnitHash, UnitFile), Skipped> {
    read::file(keys, kv).inspect_err(|s| {
        warn!(key = %s.key, error = %s.detail, "unit file unreadable; its units are left alone");
    })
}
