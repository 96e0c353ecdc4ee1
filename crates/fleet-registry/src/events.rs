//! Events (issue 41): what happened to units and machines, who or what did it, and why, kept
//! in etcd under `P/event/` on a lease so they expire by themselves (docs/registry.md).
//!
//! This module owns the record ([`Event`]), its reads ([`Registry::events`], a listing merged
//! by time, and [`Registry::follow_events`], a watch) and, in [`log`], the writer that puts
//! events in the background. It decides nothing about what is worth an event: fleet-ops
//! (user actions), the engine (its decisions) and the agent (what systemd did) build them.

use fleet_core::{MachineId, UnitName};
use serde::{Deserialize, Serialize};
use std::fmt;

use crate::error::{RegistryError, Result};
use crate::keys::{EventSource, EventSubject, Key, Keys};
use crate::kv::{EventKind as KvEventKind, KeyValue, Kv, KvError, Revision, Watch, WatchMessage};
use crate::read::Listing;
use crate::registry::Registry;

pub mod log;
mod narrow;

/// What happened: a closed set, in three groups by writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    // User actions (fleetctl, the API).
    /// A new unit was written (its desired state in the reason).
    Submitted,
    /// A unit's desired state was changed (start, stop, load, unload).
    DesiredChanged,
    /// A unit's file was replaced.
    Replaced,
    /// A restart was asked for.
    RestartRequested,
    Destroyed,
    Drained,
    Undrained,
    /// A machine's dynamic metadata was set or removed.
    MetadataSet,
    // Engine decisions.
    /// Placed on `machine`; the reason says why that machine.
    Scheduled,
    /// Taken off `machine`, by the engine's reason.
    Unscheduled,
    /// Taken off `from` and placed on `machine`; the reason gives the cause.
    Moved,
    /// The engine cannot place it (the reason `explain` gives).
    Unschedulable,
    /// Rescheduling is held (the disruption rule).
    RescheduleHeld,
    RescheduleResumed,
    // What the agent of `machine` saw systemd do.
    Started,
    Active,
    Failed,
    /// systemd restarted it (`Restart=`): the count in the reason.
    RestartedBySystemd,
    Stopped,
    /// Removed from the machine at its agent's boot cleanup.
    Removed,
    /// A kind this version does not know (written by a newer one).
    #[serde(other)]
    Unknown,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Submitted => "submitted",
            EventKind::DesiredChanged => "desired-changed",
            EventKind::Replaced => "replaced",
            EventKind::RestartRequested => "restart-requested",
            EventKind::Destroyed => "destroyed",
            EventKind::Drained => "drained",
            EventKind::Undrained => "undrained",
            EventKind::MetadataSet => "metadata-set",
            EventKind::Scheduled => "scheduled",
            EventKind::Unscheduled => "unscheduled",
            EventKind::Moved => "moved",
            EventKind::Unschedulable => "unschedulable",
            EventKind::RescheduleHeld => "reschedule-held",
            EventKind::RescheduleResumed => "reschedule-resumed",
            EventKind::Started => "started",
            EventKind::Active => "active",
            EventKind::Failed => "failed",
            EventKind::RestartedBySystemd => "restarted-by-systemd",
            EventKind::Stopped => "stopped",
            EventKind::Removed => "removed",
            EventKind::Unknown => "unknown",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Now, in microseconds since the epoch (an event's `time`).
pub fn micros_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// One event, as stored at `P/event/<source>/<subject>/<stamp>` (JSON). The source is the
/// key's, never the value's: a writer cannot claim to be another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Microseconds since the epoch, by the writer's clock.
    pub time: u64,
    pub kind: EventKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<UnitName>,
    /// The machine it is about (placed on, running on, drained).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<MachineId>,
    /// The machine a move took it from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<MachineId>,
    pub reason: String,
    /// Who asked, for a user action: a certificate subject, an etcd user, a local user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub who: Option<String>,
    /// Who wrote it, from the key (left out of the stored value).
    #[serde(skip)]
    pub source: Option<EventSource>,
}

impl Event {
    /// An event of `kind` now, about nothing yet.
    pub fn now(kind: EventKind, reason: impl Into<String>) -> Event {
        Event::at(micros_now(), kind, reason)
    }

    /// An event of `kind` at `time` (microseconds since the epoch), about nothing yet: a
    /// user's action is stamped when its write was sent, before the writes it causes.
    pub fn at(time: u64, kind: EventKind, reason: impl Into<String>) -> Event {
        Event {
            time,
            kind,
            unit: None,
            machine: None,
            from: None,
            reason: reason.into(),
            who: None,
            source: None,
        }
    }

    pub fn unit(mut self, unit: &UnitName) -> Event {
        self.unit = Some(unit.clone());
        self
    }

    pub fn on(mut self, machine: &MachineId) -> Event {
        self.machine = Some(machine.clone());
        self
    }

    pub fn from(mut self, machine: &MachineId) -> Event {
        self.from = Some(machine.clone());
        self
    }

    pub fn by(mut self, who: Option<&str>) -> Event {
        self.who = who.map(str::to_owned);
        self
    }

    /// What its key is about: its unit, else its machine, else the cluster.
    pub fn subject(&self) -> EventSubject {
        match (&self.unit, &self.machine) {
            (Some(u), _) => EventSubject::Unit(u.clone()),
            (None, Some(m)) => EventSubject::Machine(m.clone()),
            (None, None) => EventSubject::Cluster,
        }
    }

    /// Whether it concerns `machine`: placed on, moved from, or written by it.
    fn concerns_machine(&self, machine: &MachineId) -> bool {
        self.machine.as_ref() == Some(machine)
            || self.from.as_ref() == Some(machine)
            || self.source == Some(EventSource::Machine(machine.clone()))
    }
}

/// Which events a reader wants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    pub unit: Option<UnitName>,
    pub machine: Option<MachineId>,
    /// Only events at or after this time (microseconds since the epoch).
    pub since: Option<u64>,
}

impl EventFilter {
    pub fn matches(&self, e: &Event) -> bool {
        self.unit
            .as_ref()
            .is_none_or(|u| e.unit.as_ref() == Some(u))
            && self.machine.as_ref().is_none_or(|m| e.concerns_machine(m))
            && self.since.is_none_or(|t| e.time >= t)
    }
}

/// The events of one key, read back: one event (an object), or the events of one subject a
/// writer put in one write (an array, in their order); an unreadable key is a
/// [`crate::Skipped`].
pub(crate) fn decode(keys: &Keys, kv: &KeyValue) -> Result<Vec<Event>, String> {
    let Some(Key::Event { source, .. }) = Key::parse(keys, &kv.key) else {
        return Err("not an event key".to_owned());
    };
    let many = kv.value.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
    let mut events: Vec<Event> = match many {
        true => serde_json::from_slice(&kv.value),
        false => serde_json::from_slice(&kv.value).map(|e| vec![e]),
    }
    .map_err(|e| e.to_string())?;
    if events.is_empty() {
        return Err("no events".to_owned());
    }
    for e in &mut events {
        e.source = Some(source.clone());
    }
    Ok(events)
}

/// The events of `kv` that `keep` wants, each with its key.
fn decoded(
    keys: &Keys,
    kv: &KeyValue,
    keep: impl Fn(&Event) -> bool,
) -> Result<Vec<(String, Event)>, String> {
    Ok(decode(keys, kv)?
        .into_iter()
        .filter(|e| keep(e))
        .map(|e| (kv.key.clone(), e))
        .collect())
}

/// By time, then by key (then as written, within a key: the sort is stable): every reader
/// shows the same order.
fn chronological(events: &mut [(String, Event)]) {
    events.sort_by(|(ka, a), (kb, b)| a.time.cmp(&b.time).then_with(|| ka.cmp(kb)));
}

impl<K: Kv> Registry<K> {
    /// The events `filter` matches, oldest first, and the revision read at (a follower
    /// watches from the next one). Bounded by the per-unit cap and the retention, not by the
    /// registry's size; one unit's or one machine's are read without the others' agents'
    /// ([`narrow`]).
    pub async fn events(&self, filter: &EventFilter) -> Result<Listing<Vec<Event>>> {
        if let Some(unit) = &filter.unit {
            return self.unit_events(unit, filter).await;
        }
        if let Some(machine) = &filter.machine {
            return self.machine_events(machine, filter).await;
        }
        let res = self
            .kv()
            .range(&self.keys().events(), true, None)
            .await
            .map_err(RegistryError::kv("reading events"))?;
        Ok(self.listing(&res.kvs, res.revision, filter))
    }

    /// The events written from revision `from` on, as they come (etcd's watch: nothing
    /// polls).
    pub async fn follow_events(&self, from: Revision) -> Result<EventFollow<K>> {
        let watch = self.watch_events(from).await?;
        Ok(EventFollow {
            registry: self.clone(),
            watch,
            next: from,
        })
    }

    async fn watch_events(&self, from: Revision) -> Result<Watch> {
        self.kv()
            .watch(&self.keys().events(), true, from)
            .await
            .map_err(RegistryError::kv("watching events"))
    }
}

/// A watch of `P/event/`: [`EventFollow::next`] gives each new event, oldest first. A broken
/// watch resumes where it stopped; after a compaction, from the oldest revision left (the
/// events in between are lost to the follower, not to the registry).
#[derive(Debug)]
pub struct EventFollow<K> {
    registry: Registry<K>,
    watch: Watch,
    next: Revision,
}

impl<K: Kv> EventFollow<K> {
    /// The events of the next revisions that bring some (expirations bring none); `None`
    /// only if etcd cannot be watched again.
    pub async fn next(&mut self) -> Option<Result<Vec<Event>>> {
        loop {
            let msg = self.watch.rx.recv().await.unwrap_or(WatchMessage::Broken);
            let from = match msg {
                WatchMessage::Events { revision, events } => {
                    self.next = revision + 1;
                    let keys = self.registry.keys();
                    let mut found: Vec<(String, Event)> = events
                        .iter()
                        .filter(|e| e.kind == KvEventKind::Put)
                        .filter_map(|e| decoded(keys, &e.kv, |_| true).ok())
                        .flatten()
                        .collect();
                    if found.is_empty() {
                        continue;
                    }
                    chronological(&mut found);
                    return Some(Ok(found.into_iter().map(|(_, e)| e).collect()));
                }
                WatchMessage::Broken => self.next,
                WatchMessage::Compacted { compact_revision } => compact_revision,
            };
            match self.registry.watch_events(from).await {
                Ok(watch) => self.watch = watch,
                Err(RegistryError::Kv { cause, .. }) if cause.is_transient() => {
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// Whether `err` says the lease a put named is gone.
pub(crate) fn lease_gone(err: &KvError) -> bool {
    matches!(err, KvError::LeaseNotFound(_))
}
