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
//! them alone, as it does when a file is missing.

use fleet_core::{MachineId, MachineInfo, UnitFile, UnitHash, UnitName};
use std::collections::BTreeMap;
use tracing::{debug, warn};

use crate::error::{RegistryError, Result};
use crate::kv::{Event, EventKind, KeyValue, Kv, Revision, Watch, WatchMessage};
use crate::leader::EngineWrite;
use crate::per_machine::PerMachine;
use crate::records::{ScheduleEntry, UnitStateRecord};
use crate::registry::{Registry, decode, decode_unit};
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

/// The registry's units, machines, schedule, states, unschedulable reasons and unit files,
/// followed by a watch.
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
        let mut files = BTreeMap::new();
        if with_files {
            let base = registry.keys().files();
            let listed = registry
                .kv()
                .range(&base, true, Some(snapshot.revision))
                .await
                .map_err(RegistryError::kv("reading unit files"))?;
            for kv in &listed.kvs {
                if let Some((hash, file)) = parse_file(&kv.key[base.len()..], kv) {
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
    /// (the watch ended or fell behind a compaction, or a record is corrupt): drop it and
    /// start a new one.
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
        let snap = &mut self.snapshot;
        for write in writes {
            match write {
                EngineWrite::Schedule(entry) => {
                    snap.schedule
                        .entry(entry.name.clone())
                        .or_default()
                        .insert(entry.machine.clone(), entry.clone());
                }
                EngineWrite::Unschedule { machine, unit } => {
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
                    touched.merge(self.apply(event)?);
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
    fn apply(&mut self, event: &Event) -> Result<Touched> {
        let kv = &event.kv;
        let put = event.kind == EventKind::Put;
        let Some(rest) = kv.key.strip_prefix(self.registry.keys().prefix()) else {
            return Ok(Touched::default());
        };
        let Some((kind, rest)) = rest.split_once('/') else {
            return Ok(Touched::default());
        };
        let snap = &mut self.snapshot;
        let mut touched = Touched::default();
        match kind {
            "unit" => {
                if put {
                    let unit = decode_unit(kv)?;
                    snap.units.insert(unit.name().clone(), unit);
                } else {
                    snap.units.remove(&parse_key::<UnitName>(kv, rest)?);
                }
                touched.units = true;
            }
            "file" if !self.with_files => {}
            "file" => {
                if put {
                    if let Some((hash, file)) = parse_file(rest, kv) {
                        self.files.insert(hash, file);
                    }
                } else if let Ok(hash) = rest.parse::<UnitHash>() {
                    self.files.remove(&hash);
                }
                touched.files = true;
            }
            "machine" => {
                if put {
                    let m: MachineInfo = decode(kv)?;
                    snap.machines.insert(m.id.clone(), m);
                } else {
                    snap.machines.remove(&parse_key::<MachineId>(kv, rest)?);
                }
                touched.machines = true;
            }
            "schedule" => {
                if put {
                    let e: ScheduleEntry = decode(kv)?;
                    snap.schedule
                        .entry(e.name.clone())
                        .or_default()
                        .insert(e.machine.clone(), e);
                } else {
                    let (machine, unit) = split_key(kv, rest)?;
                    remove_inner(&mut snap.schedule, &unit, &machine);
                }
                touched.schedules = true;
            }
            "state" => {
                if put {
                    let s: UnitStateRecord = decode(kv)?;
                    snap.states
                        .entry(s.name.clone())
                        .or_default()
                        .insert(s.machine.clone(), s);
                } else {
                    let (unit, machine) = split_key(kv, rest)?;
                    remove_inner(&mut snap.states, &unit, &machine);
                }
                touched.states = true;
            }
            "unscheduled" => {
                let unit = parse_key::<UnitName>(kv, rest)?;
                if put {
                    let reason = String::from_utf8_lossy(&kv.value).into_owned();
                    snap.unscheduled.insert(unit, reason);
                } else {
                    snap.unscheduled.remove(&unit);
                }
                touched.unscheduled = true;
            }
            _ => {}
        }
        Ok(touched)
    }
}

fn parse_key<T: std::str::FromStr>(kv: &KeyValue, part: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    part.parse().map_err(|e: T::Err| RegistryError::Corrupt {
        key: kv.key.clone(),
        detail: e.to_string(),
    })
}

/// `<a>/<b>` of a two-level key (`schedule/<machine>/<unit>`, `state/<unit>/<machine>`).
fn split_key<A, B>(kv: &KeyValue, rest: &str) -> Result<(A, B)>
where
    A: std::str::FromStr,
    B: std::str::FromStr,
    A::Err: std::fmt::Display,
    B::Err: std::fmt::Display,
{
    let (a, b) = rest.split_once('/').ok_or_else(|| RegistryError::Corrupt {
        key: kv.key.clone(),
        detail: "expected two parts".to_owned(),
    })?;
    Ok((parse_key(kv, a)?, parse_key(kv, b)?))
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
fn parse_file(hash: &str, kv: &KeyValue) -> Option<(UnitHash, UnitFile)> {
    let parsed = hash
        .parse::<UnitHash>()
        .map_err(|e| e.to_string())
        .and_then(|hash| {
            UnitFile::parse(&kv.value)
                .map(|file| (hash, file))
                .map_err(|e| e.to_string())
        });
    match parsed {
        Ok(pair) => Some(pair),
        Err(detail) => {
            warn!(key = %kv.key, error = %detail, "unit file unreadable; its units are left alone");
            None
        }
    }
}
