//! The registry in memory at one revision: a [`Snapshot`] with every unit file beside it,
//! read once, then changed event by event as one prefix watch delivers them. It owns how a
//! change applies and what it touched; it holds no watch, no lock and no task:
//! [`LiveView`](crate::LiveView) (one holder) and [`Store`](crate::Store) (shared by a
//! process) follow a watch with it.
//!
//! One prefix watch delivers every change in revision order and never splits a revision
//! across messages, so after each message the mirror is the registry as it was at its
//! revision, never a half-applied transaction.
//!
//! The watch is drained as fast as etcd sends, into memory, whatever its holder is doing: a
//! view read only between passes left its stream unread for a whole pass, and etcd 3.4
//! marked it a slow watcher, which it catches up under the lock its writes take. At 100,000
//! units the engine's watch held up to 150,000 pending events (docs/benchmarks.md, "Scale
//! II"). The backlog is held here instead, bounded by what is written while it is not
//! applied.
//!
//! Files are kept as the registry keeps them (written with their first unit, deleted with
//! their last), so a unit's file arrives in the same message as its record. A file that does
//! not parse is left out with a warning: its units then have no file, and the engine leaves
//! them alone, as it does when a file is missing. Any other value that does not parse is
//! left out as a snapshot leaves it out (listed in [`Snapshot::skipped`], what its key named
//! removed), with one warning when the mirror is read and one for each change that writes it.

use fleet_core::{UnitFile, UnitHash, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use tokio::sync::mpsc;
use tracing::{Instrument, debug, warn};

use crate::error::{RegistryError, Result};
use crate::keys::{Key, Keys, Kind};
use crate::kv::{Event, EventKind, KeyValue, Kv, Revision, Watch, WatchMessage};
use crate::read::{self, Skipped};
use crate::registry::Registry;
use crate::snapshot::Snapshot;

/// Which parts of the registry a batch of changes touched.
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

    /// Whether anything was touched.
    pub fn any(&self) -> bool {
        self.states || !self.only_states()
    }

    pub(crate) fn merge(&mut self, other: Touched) {
        self.units |= other.units;
        self.files |= other.files;
        self.machines |= other.machines;
        self.departed |= other.departed;
        self.schedules |= other.schedules;
        self.states |= other.states;
        self.unscheduled |= other.unscheduled;
    }
}

/// The units and files changes touched, for a leader that plans only those units.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Changed {
    units: BTreeSet<UnitName>,
    files: BTreeSet<UnitHash>,
    /// A unit or file key that names nothing readable changed: any unit may be concerned.
    unnamed: bool,
}

impl Changed {
    pub(crate) fn merge(&mut self, other: &Changed) {
        self.units.extend(other.units.iter().cloned());
        self.files.extend(other.files.iter().copied());
        self.unnamed |= other.unnamed;
    }

    /// The units changed, those naming a changed file included; `None` when a change could
    /// not be traced to its units (a key that does not parse).
    pub(crate) fn units(self, snapshot: &Snapshot) -> Option<BTreeSet<UnitName>> {
        let Changed {
            mut units,
            files,
            unnamed,
        } = self;
        if unnamed {
            return None;
        }
        if !files.is_empty() {
            // A file changes the plan of every unit that names it (a unit whose file was
            // missing is left alone until it arrives).
            let naming = snapshot.units.iter();
            units.extend(
                naming
                    .filter(|(_, u)| files.contains(&u.hash()))
                    .map(|(n, _)| n.clone()),
            );
        }
        Some(units)
    }
}

/// The registry's units, machines and their metadata, schedule, states, unschedulable
/// reasons and unit files at one revision.
#[derive(Debug)]
pub(crate) struct Mirror {
    keys: Keys,
    pub(crate) snapshot: Snapshot,
    /// Whether unit files are kept (the engine needs them; fleetctl's wait does not).
    with_files: bool,
    pub(crate) files: BTreeMap<UnitHash, UnitFile>,
    /// Files kept that do not read, by key: left out of `files` (their units have no file).
    pub(crate) unreadable_files: BTreeMap<String, Skipped>,
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

impl Mirror {
    /// Reads everything (unit files only `with_files`) at one revision, and watches from
    /// the next: the watch's messages, drained as they come.
    pub(crate) async fn read<K: Kv>(
        registry: &Registry<K>,
        with_files: bool,
    ) -> Result<(Mirror, mpsc::UnboundedReceiver<WatchMessage>)> {
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
        let mirror = Mirror {
            keys: registry.keys().clone(),
            snapshot,
            with_files,
            files,
            unreadable_files,
        };
        Ok((mirror, drain(watch)))
    }

    /// The revision of the last change applied.
    pub(crate) fn revision(&self) -> Revision {
        self.snapshot.revision
    }

    /// Applies one message of the watch (`None`: the watch ended), adding the units and
    /// files it changed to `changed`. An error means the mirror cannot follow any more.
    pub(crate) fn apply_message(
        &mut self,
        message: Option<WatchMessage>,
        changed: &mut Changed,
    ) -> Result<Touched> {
        let lost = RegistryError::ViewLost;
        match message {
            Some(WatchMessage::Events { revision, events }) => {
                let mut touched = Touched::default();
                for event in &events {
                    touched.merge(self.apply(event, changed));
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

    /// Applies one change; keys the mirror does not keep (file references, the leader key)
    /// touch nothing. A put or delete of a snapshot record first removes what was at the key
    /// (the key names it), then puts a readable new value in, an unreadable one in `skipped`.
    fn apply(&mut self, event: &Event, changed: &mut Changed) -> Touched {
        let kv = &event.kv;
        let Some(kind) = self.keys.kind(&kv.key) else {
            return Touched::default();
        };
        let mut touched = Touched::default();
        let flag = match kind {
            Kind::File if !self.with_files => return touched,
            Kind::File => return self.apply_file(event, changed),
            // Placements mirror the schedule, whose own events the mirror applies.
            // Events (issue 41) change no plan: written on every decision, they must not
            // wake the engine that wrote them.
            Kind::FileRef | Kind::Engine | Kind::Placement | Kind::Event => return touched,
            Kind::Unit => {
                match Key::parse(&self.keys, &kv.key) {
                    Some(Key::Unit(name)) => {
                        changed.units.insert(name);
                    }
                    _ => changed.unnamed = true,
                }
                &mut touched.units
            }
            // Dynamic metadata and a drain change what a machine offers, as a new machine
            // record does.
            Kind::Machine if event.kind == EventKind::Delete => &mut touched.departed,
            Kind::Machine | Kind::Metadata | Kind::Drain | Kind::Migrating => &mut touched.machines,
            // Written by the leader alone, like schedules.
            Kind::Moving | Kind::Left => &mut touched.schedules,
            Kind::Schedule => &mut touched.schedules,
            Kind::State => &mut touched.states,
            Kind::Unscheduled => &mut touched.unscheduled,
        };
        *flag = true;
        let keys = &self.keys;
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

    /// Applies a change of a unit file.
    fn apply_file(&mut self, event: &Event, changed: &mut Changed) -> Touched {
        let kv = &event.kv;
        let touched = Touched {
            files: true,
            ..Touched::default()
        };
        let Some(Key::File(hash)) = Key::parse(&self.keys, &kv.key) else {
            changed.unnamed = true;
            return touched;
        };
        self.unreadable_files.remove(&kv.key);
        if event.kind == EventKind::Put {
            match parse_file(&self.keys, kv) {
                // Every batch of new units puts its files again, whether or not etcd holds
                // them (a concurrent collection may have just deleted one). The same content
                // again changes no unit: counting it made each batch of a template's
                // instances replan every instance before it.
                Ok((_, file)) if self.files.get(&hash) == Some(&file) => {
                    return Touched::default();
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
        changed.files.insert(hash);
        touched
    }
}

pub(crate) fn warn_skipped(s: &Skipped) {
    warn!(key = %s.key, error = %s.detail, "skipping unreadable registry value");
}

/// A stored file, or what is wrong with it (warned about) when its key or text does not
/// parse.
fn parse_file(keys: &Keys, kv: &KeyValue) -> std::result::Result<(UnitHash, UnitFile), Skipped> {
    read::file(keys, kv).inspect_err(|s| {
        warn!(key = %s.key, error = %s.detail, "unit file unreadable; its units are left alone");
    })
}
