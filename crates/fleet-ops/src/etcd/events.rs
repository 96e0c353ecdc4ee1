//! User actions as events (issue 41), recorded once here for every write path: fleetctl's
//! etcd driver and the API both run [`RegistryCluster`], so each action is recorded the same
//! way whoever asks. An event is built from the outcome of a write that succeeded and handed
//! to the registry's [`EventSink`] (which never waits): it cannot delay or fail the write.
//! Its time is when the write was sent ([`Sent`]), not when its answer came.
//!
//! Also the listing and the follow of events over the registry.

use fleet_core::{MachineId, UnitName};
use fleet_registry::kv::Kv;
use fleet_registry::{Event, EventFilter, EventKind, EventSink, MetadataChange};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;

use super::RegistryCluster;
use crate::model::{Destroyed, EventListing, EventStream, PutOutcome, Restarted};
use crate::{DrainStatus, OpsError};

/// When a user's write was sent, the time of its event: taken before the write, so that the
/// action's event comes before those of what it causes (the engine, woken by the write, may
/// stamp its `scheduled` before the write's answer is back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent(u64);

impl Sent {
    pub fn now() -> Sent {
        Sent(fleet_registry::events::micros_now())
    }
}

/// Who acts and where their actions are recorded; cloned with the cluster.
#[derive(Debug, Clone)]
pub(super) struct Recorder {
    pub(super) sink: EventSink,
    pub(super) who: Option<Arc<str>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            sink: EventSink::off(),
            who: None,
        }
    }
}

impl<K: Kv> RegistryCluster<K> {
    /// This cluster, recording its users' actions into `sink` (fleetd's API, fleetctl's etcd
    /// driver). Without it, nothing is recorded.
    pub fn with_events(mut self, sink: EventSink) -> RegistryCluster<K> {
        self.recorder.sink = sink;
        self
    }

    /// This cluster, recording its actions as done by `who` (a certificate subject, an etcd
    /// user, a local user).
    pub fn acting_as(&self, who: Option<&str>) -> RegistryCluster<K> {
        let mut c = self.clone();
        c.recorder.who = who.map(Arc::from);
        c
    }

    /// This cluster, recording nothing: for a writer on behalf of several users, each of
    /// whom records their own outcome ([`RegistryCluster::record_put`]).
    pub fn without_events(&self) -> RegistryCluster<K> {
        let mut c = self.clone();
        c.recorder = Recorder::default();
        c
    }

    fn emit(&self, event: Event) {
        self.recorder
            .sink
            .emit(event.by(self.recorder.who.as_deref()));
    }

    /// Records what a put of `name` did, if it wrote anything.
    pub fn record_put(&self, name: &UnitName, outcome: &Result<PutOutcome, OpsError>, sent: Sent) {
        let event = match outcome {
            Ok(PutOutcome::Created(v)) => Event::at(
                sent.0,
                EventKind::Submitted,
                format!("desired state {}", v.status.desired),
            ),
            Ok(PutOutcome::Replaced(v)) => Event::at(
                sent.0,
                EventKind::Replaced,
                format!(
                    "unit file {}, desired state {}",
                    v.status.hash.short(),
                    v.status.desired
                ),
            ),
            Ok(PutOutcome::StateChanged(v)) => Event::at(
                sent.0,
                EventKind::DesiredChanged,
                format!("desired state {}", v.status.desired),
            ),
            Ok(PutOutcome::Unchanged(_)) | Err(_) => return,
        };
        self.emit(event.unit(name));
    }

    pub(super) fn record_puts(&self, outcomes: &crate::Created, sent: Sent) {
        for (name, outcome) in outcomes {
            self.record_put(name, outcome, sent);
        }
    }

    pub(super) fn record_state(&self, name: &UnitName, view: &crate::UnitView, sent: Sent) {
        let reason = format!("desired state {}", view.status.desired);
        self.emit(Event::at(sent.0, EventKind::DesiredChanged, reason).unit(name));
    }

    pub(super) fn record_restart(&self, name: &UnitName, done: &Restarted, sent: Sent) {
        let reason = match done {
            Restarted::Generation(g) => format!("restart {g}"),
            Restarted::Launched => "a loaded unit is launched".to_owned(),
        };
        self.emit(Event::at(sent.0, EventKind::RestartRequested, reason).unit(name));
    }

    pub(super) fn record_destroy(
        &self,
        name: &UnitName,
        outcome: &Result<Destroyed, OpsError>,
        sent: Sent,
    ) {
        let reason = match outcome {
            Ok(Destroyed::Unit) => String::new(),
            Ok(Destroyed::Unreadable(why)) => format!("an unreadable record: {why}"),
            Ok(Destroyed::Missing) | Err(_) => return,
        };
        self.emit(Event::at(sent.0, EventKind::Destroyed, reason).unit(name));
    }

    pub(super) fn record_drain(&self, machine: &MachineId, status: &DrainStatus, sent: Sent) {
        let parallel = status.parallel.unwrap_or(1);
        let reason = format!("{parallel} move(s) at a time");
        self.emit(Event::at(sent.0, EventKind::Drained, reason).on(machine));
    }

    pub(super) fn record_undrain(&self, machine: &MachineId, sent: Sent) {
        self.emit(Event::at(sent.0, EventKind::Undrained, "").on(machine));
    }

    /// One event per machine whose metadata changed: `key=value` set, `-key` removed.
    pub(super) fn record_metadata(&self, changes: &[MetadataChange], sent: Sent) {
        let mut by_machine: BTreeMap<&MachineId, Vec<String>> = BTreeMap::new();
        for change in changes {
            let (machine, said) = match change {
                MetadataChange::Set {
                    machine,
                    key,
                    value,
                } => (machine, format!("{key}={value}")),
                MetadataChange::Remove { machine, key } => (machine, format!("-{key}")),
            };
            by_machine.entry(machine).or_default().push(said);
        }
        for (machine, said) in by_machine {
            self.emit(Event::at(sent.0, EventKind::MetadataSet, said.join(",")).on(machine));
        }
    }

    pub(super) async fn list_events(&self, filter: &EventFilter) -> Result<EventListing, OpsError> {
        let listing = self.registry.events(filter).await?;
        Ok(EventListing {
            events: listing.items,
            skipped: listing.skipped.iter().map(ToString::to_string).collect(),
            revision: listing.revision,
        })
    }

    /// The events `filter` matches now, then each new one as it is written.
    pub(super) async fn follow(&self, filter: EventFilter) -> Result<EventStream, OpsError> {
        let listing = self.registry.events(&filter).await?;
        let follow = self.registry.follow_events(listing.revision + 1).await?;
        let now = futures::stream::iter(listing.items.into_iter().map(Ok));
        let later = futures::stream::unfold((follow, filter), |(mut follow, filter)| async {
            let batch = match follow.next().await? {
                Ok(events) => events
                    .into_iter()
                    .filter(|e| filter.matches(e))
                    .map(Ok)
                    .collect(),
                Err(e) => vec![Err(OpsError::from(e))],
            };
            Some((futures::stream::iter(batch), (follow, filter)))
        })
        .flatten();
        Ok(now.chain(later).boxed())
    }
}
