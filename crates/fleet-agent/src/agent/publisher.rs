//! Publishing this machine's unit states: those that changed since the last publish (all of
//! them under a new lease), within the bound on states per machine ([`bound`](super::bound)),
//! withdrawing those of units that are gone. Owns what it published and on which presence,
//! and which units may have changed since; the registry cuts each batch to etcd's limits.
//!
//! Reads systemd for nothing: it publishes what the pass recorded in [`Current`]. Retries
//! nothing by itself: a publish that left states out says so ([`Publisher::complete`]), and
//! the agent's loop decides when to try again.
//!
//! The events a pass tells ride in its publish ([`Publisher::tell`]): one transaction for a
//! unit's state and what happened to it, not two (issue 41).

use fleet_core::UnitName;
use fleet_registry::kv::Kv;
use fleet_registry::{
    Event, EventSink, MAX_STATES_PER_MACHINE, MachineRole, Presence, UnitStateRecord,
};
use std::collections::{BTreeMap, BTreeSet};
use tracing::{debug, info, warn};

use super::bound;
use crate::current::Current;

/// This machine's published unit states, as last written.
#[derive(Debug)]
pub(super) struct Publisher<K> {
    registry: MachineRole<K>,
    published: BTreeMap<UnitName, UnitStateRecord>,
    /// The presence `published` lives on: under another lease, they are gone.
    on: Option<Presence>,
    /// The units whose state to publish may have changed since the last publish; `None`:
    /// any of them (after a whole read, a new lease or a failed publish).
    unpublished: Option<BTreeSet<UnitName>>,
    /// Whether the last publish got every state out.
    complete: bool,
    /// How many units the last publish left out past the bound on states: warned about when
    /// it changes, not on every pass.
    past_bound: usize,
    /// Where this machine's events go, and those told since the last publish.
    events: EventSink,
    told: Vec<Event>,
}

impl<K: Kv> Publisher<K> {
    pub(super) fn new(registry: MachineRole<K>, events: EventSink) -> Publisher<K> {
        Publisher {
            registry,
            published: BTreeMap::new(),
            on: None,
            unpublished: None,
            complete: true,
            past_bound: 0,
            events,
            told: Vec::new(),
        }
    }

    /// Holds `event` for the next publish, to go out in its transaction.
    pub(super) fn tell(&mut self, event: Event) {
        self.told.push(event);
    }

    /// Whether a state of `unit` is published.
    pub(super) fn has(&self, unit: &UnitName) -> bool {
        self.published.contains_key(unit)
    }

    /// How many states are published.
    pub(super) fn len(&self) -> usize {
        self.published.len()
    }

    /// Whether the last publish got every state out (no publish yet counts as one that did).
    pub(super) fn complete(&self) -> bool {
        self.complete
    }

    /// The states of `units` may have changed.
    pub(super) fn touched(&mut self, units: impl IntoIterator<Item = UnitName>) {
        if let Some(unpublished) = &mut self.unpublished {
            unpublished.extend(units);
        }
    }

    /// Any unit's state may have changed: the next publish compares them all.
    pub(super) fn touched_all(&mut self) {
        self.unpublished = None;
    }

    /// States a previous fleetd published under the lease we resumed (`presence`) are ours
    /// now: knowing them, the first publish withdraws those of units that are gone and skips
    /// unchanged ones.
    pub(super) async fn adopt(&mut self, presence: Presence) {
        match self.registry.published_states().await {
            Ok(states) => {
                let machine = self.registry.machine();
                self.published = states
                    .items
                    .into_iter()
                    .filter(|s| s.machine == *machine)
                    .map(|s| (s.name.clone(), s))
                    .collect();
                self.on = Some(presence);
            }
            Err(e) => warn!(error = %e, "reading previously published states failed"),
        }
    }

    /// After an upgrade in place, the resumed lease still carries the previous fleetd's
    /// old-layout state keys (`P/state/<unit>/<M>`), which nothing reads any more: deletes
    /// those of `units` (the units this machine knows). Best effort: a refusal (etcd auth
    /// enabled before the upgrade) leaves them to the lease.
    pub(super) async fn remove_legacy(&self, presence: Presence, units: &[UnitName]) {
        if !presence.resumed() {
            return;
        }
        match self.registry.remove_legacy_states(units).await {
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

    /// Publishes on `presence` the states of `current` that changed since last time (all of
    /// them under a new lease) and withdraws those of units that left the units directory.
    /// Without a presence there is nothing to publish on, and nothing is left out.
    pub(super) async fn publish(&mut self, presence: Option<Presence>, current: &Current) {
        let Some(presence) = presence else {
            self.flush_events();
            self.complete = true;
            return;
        };
        if self.on.map(|p| p.lease()) != Some(presence.lease()) {
            self.published.clear();
            self.on = Some(presence);
            self.unpublished = None;
        }
        let (changed, gone) = self.changes(current);
        // Whatever fails below is retried with every state compared again.
        self.unpublished = Some(BTreeSet::new());
        // Withdrawn first, together: a destroyed batch is gone from the registry as soon as
        // it is stopped, not one round trip per unit later, and what it frees under the bound
        // on states is free for the states published next.
        let withdrawn = self.registry.withdraw_batch(gone).await;
        let mut complete = withdrawn.complete();
        for name in &withdrawn.done {
            self.published.remove(name);
        }
        let (changed, past_bound) = bound::fit(&self.published, changed);
        self.note_past_bound(past_bound);
        // Many states to a transaction (a machine given 1,000 units publishes 8, not 1,000),
        // a few transactions at once. A failed one leaves its states for the retry.
        let told = std::mem::take(&mut self.told);
        let sent = self
            .registry
            .publish_batch_with_events(&presence, changed, &self.events, told)
            .await;
        for (units, e) in &sent.failed {
            debug!(units, error = %e, "publishing states failed");
        }
        complete &= sent.complete();
        for r in sent.done {
            self.published.insert(r.name.clone(), r);
        }
        // Past the bound, compared again on the next pass: a withdrawal may have made room.
        if past_bound > 0 || !complete {
            self.unpublished = None;
        }
        self.complete = complete;
    }

    /// The states to publish and the units whose states to withdraw: of the units that may
    /// have changed only, unless any may have (a pass after one unit's change compares one
    /// state, not all of them).
    fn changes(&mut self, current: &Current) -> (Vec<UnitStateRecord>, Vec<UnitName>) {
        let machine = self.registry.machine();
        let Some(names) = self.unpublished.take() else {
            let records = current.records(machine);
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
            return (changed, gone);
        };
        let mut changed = Vec::new();
        let mut gone = Vec::new();
        for name in names {
            match current.record(&name, machine) {
                Some(r) if self.published.get(&name) != Some(&r) => changed.push(r),
                Some(_) => {}
                None if self.published.contains_key(&name) => gone.push(name),
                None => {}
            }
        }
        (changed, gone)
    }

    fn note_past_bound(&mut self, past_bound: usize) {
        if past_bound == self.past_bound {
            return;
        }
        self.past_bound = past_bound;
        if past_bound > 0 {
            warn!(
                machine = %self.registry.machine(),
                units = past_bound,
                bound = MAX_STATES_PER_MACHINE,
                "more units here than a machine may publish states of; theirs are not published"
            );
        }
    }
}

impl<K> Publisher<K> {
    /// Hands the events told and not published yet to the machine's writer: with no presence
    /// to publish on, and when the agent stops, however it stops ([`Drop`]).
    fn flush_events(&mut self) {
        for event in self.told.drain(..) {
            self.events.emit(event);
        }
    }
}

impl<K> Drop for Publisher<K> {
    fn drop(&mut self) {
        self.flush_events();
    }
}

#[cfg(test)]
mod tests;
