//! Publishing this machine's unit states: those that changed since the last publish (all of
//! them under a new lease), within the bound on states per machine, withdrawing those of
//! units that are gone. Reads systemd for nothing: it publishes what the pass recorded.

use fleet_core::UnitName;
use fleet_registry::UnitStateRecord;
use fleet_registry::kv::{Kv, MAX_TXN_OPS};
use futures::StreamExt;
use std::collections::BTreeSet;
use tracing::{debug, warn};

use super::{Agent, bound};
use crate::manager::UnitManager;

impl<K: Kv, M: UnitManager> Agent<K, M> {
    /// Publishes the states that changed since last time (all of them under a new lease) and
    /// withdraws those of units that left the units directory.
    #[allow(
        clippy::too_many_lines,
        reason = "the lease, the withdrawals and the per-machine bound in one place until issue 39 item 1's Publisher takes them"
    )]
    pub(super) async fn publish(&mut self) -> bool {
        let Some(presence) = *self.presence.borrow() else {
            return true;
        };
        if self.published_lease != Some(presence.lease()) {
            self.published.clear();
            self.published_lease = Some(presence.lease());
            self.unpublished = None;
        }
        // Only the units read again since the last complete publish, unless any may have
        // changed: a pass after one unit's change compares one state, not all of them.
        let machine = &self.cfg.machine;
        let (changed, gone): (Vec<UnitStateRecord>, Vec<UnitName>) = match self.unpublished.take() {
            Some(names) => {
                let mut changed = Vec::new();
                let mut gone = Vec::new();
                for name in names {
                    match self.current.record(&name, machine) {
                        Some(r) if self.published.get(&name) != Some(&r) => changed.push(r),
                        Some(_) => {}
                        None if self.published.contains_key(&name) => gone.push(name),
                        None => {}
                    }
                }
                (changed, gone)
            }
            None => {
                let records = self.current.records(machine);
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
                (changed, gone)
            }
        };
        // Whatever fails below is retried with every state compared again.
        self.unpublished = Some(BTreeSet::new());
        let registry = &self.registry;
        let mut complete = true;
        // Withdrawn first, together: a destroyed batch is gone from the registry as soon as
        // it is stopped, not one round trip per unit later, and what it frees under the bound
        // on states is free for the states published next.
        let chunks: Vec<Vec<UnitName>> = gone.chunks(MAX_TXN_OPS).map(<[_]>::to_vec).collect();
        let withdrawn: Vec<(Vec<UnitName>, bool)> = futures::stream::iter(chunks)
            .map(|chunk| async move {
                let ok = registry.remove_states(&chunk).await.is_ok();
                (chunk, ok)
            })
            .buffer_unordered(PUBLISHES)
            .collect()
            .await;
        for (chunk, ok) in withdrawn {
            if ok {
                for name in &chunk {
                    self.published.remove(name);
                }
            } else {
                complete = false;
            }
        }
        let (changed, past_bound) = bound::fit(&self.published, changed);
        if past_bound != self.past_bound {
            self.past_bound = past_bound;
            if past_bound > 0 {
                warn!(
                    machine = %self.cfg.machine,
                    units = past_bound,
                    bound = fleet_registry::MAX_STATES_PER_MACHINE,
                    "more units here than a machine may publish states of; theirs are not published"
                );
            }
        }
        // Many states to a transaction (a machine given 1,000 units publishes 8, not 1,000),
        // a few transactions at once. A failed one leaves its states for the retry.
        let chunks: Vec<Vec<UnitStateRecord>> =
            changed.chunks(MAX_TXN_OPS).map(<[_]>::to_vec).collect();
        let published: Vec<(Vec<UnitStateRecord>, bool)> = futures::stream::iter(chunks)
            .map(|chunk| async move {
                let ok = registry.publish_states(&presence, &chunk).await;
                if let Err(e) = &ok {
                    debug!(units = chunk.len(), error = %e, "publishing states failed");
                }
                (chunk, ok.is_ok())
            })
            .buffer_unordered(PUBLISHES)
            .collect()
            .await;
        for (chunk, ok) in published {
            if ok {
                for r in chunk {
                    self.published.insert(r.name.clone(), r);
                }
            } else {
                complete = false;
            }
        }
        if past_bound > 0 {
            // Compared again on the next pass: a withdrawal may have made room by then.
            self.unpublished = None;
        }
        if !complete {
            self.unpublished = None;
        }
        complete
    }
}

/// Transactions of published or withdrawn states in flight at once, each of up to
/// [`MAX_TXN_OPS`] states.
const PUBLISHES: usize = 4;
