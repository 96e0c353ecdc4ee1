//! Reading what systemd did to the agent's units by itself ([`Observed`](super::observed)):
//! the facts ([`UnitManager::facts`]) of the units whose state changed, a few property reads
//! each, a few units at a time, never of every unit on every pass (3,000 units a machine).
//! The events they tell ride in the pass's publish of the states (or go to the machine's
//! writer, which never waits); the history they make
//! goes into the units' state records.

use fleet_core::UnitName;
use fleet_registry::kv::Kv;
use futures::StreamExt;
use std::collections::BTreeSet;
use tracing::debug;

use super::Agent;
use crate::manager::{ManagerError, UnitFacts, UnitManager};
use crate::plan::{CurrentUnit, UnitFileState};

/// Units whose facts are read at once (the real adapter caps its D-Bus calls in flight too).
const FACT_READS: usize = 16;

impl<K: Kv, M: UnitManager> Agent<K, M> {
    /// Reads the facts of the units of `names` (those a hint or a task named; `None`: every
    /// unit) whose state changed since their facts were last read (or that the agent started
    /// since); only units with a state to publish. Tells what they say as events and puts each
    /// unit's history in `current`.
    pub(super) async fn observe(&mut self, names: Option<&BTreeSet<UnitName>>) {
        let units = &self.current.units;
        // The units named, looked up one by one: walking every unit of the machine to find
        // them made each pass cost the machine's units, and a launch of 1,000 units a
        // machine grow faster than its units (issue 43's growth figure at 100 machines).
        let named: Box<dyn Iterator<Item = (&UnitName, &CurrentUnit)>> = match names {
            Some(ns) => Box::new(ns.iter().filter_map(|n| units.get_key_value(n))),
            None => Box::new(units.iter()),
        };
        let ours = named
            .filter(|(_, u)| !matches!(u.file, UnitFileState::Absent))
            .filter_map(|(n, u)| Some((n, u.systemd.as_ref()?)));
        // A unit named again in the state its facts were read in has nothing new to tell:
        // after the agent's starts, the hints of those starts cost no second read.
        let asked: Vec<UnitName> = self.observed.stale(ours);
        // A unit the agent just started afresh and finds active needs only its `since`.
        let known: Vec<(UnitName, Option<UnitFacts>)> = asked
            .iter()
            .map(|n| {
                let state = units.get(n).and_then(|u| u.systemd.as_ref());
                let known = state.and_then(|s| self.observed.started_active(n, s));
                (n.clone(), known)
            })
            .collect();
        let manager = &self.manager;
        let read: Vec<(UnitName, Result<UnitFacts, ManagerError>)> = futures::stream::iter(known)
            .map(|(name, known)| async move {
                let facts = match known {
                    Some(mut facts) => manager.since(&name).await.map(|since| {
                        facts.since = since;
                        facts
                    }),
                    None => manager.facts(&name).await,
                };
                (name, facts)
            })
            .buffer_unordered(FACT_READS)
            .collect()
            .await;
        for (name, facts) in read {
            let facts = match facts {
                Ok(facts) => facts,
                Err(e) => {
                    debug!(unit = %name, error = %e, "reading what systemd did to the unit failed");
                    continue;
                }
            };
            let Some(state) = self
                .current
                .units
                .get(&name)
                .and_then(|u| u.systemd.as_ref())
            else {
                continue;
            };
            for event in self.observed.saw(&name, state, &facts, &self.cfg.machine) {
                self.publisher.tell(event);
            }
        }
        self.keep_histories(names, &asked);
    }

    /// Forgets what the agent observed of units gone (of `names`, or of all), and puts the
    /// history of each unit of `names` (or of those `asked` of) in `current` where it changed,
    /// for the next publish.
    fn keep_histories(&mut self, names: Option<&BTreeSet<UnitName>>, asked: &[UnitName]) {
        let units = &self.current.units;
        match names {
            // A pass of named units reads only those again: only they can have left.
            Some(names) => {
                for gone in names.iter().filter(|n| !units.contains_key(*n)) {
                    self.observed.forget(gone);
                    self.current.history.remove(gone);
                }
            }
            None => {
                self.observed.retain(|n| units.contains_key(n));
                self.current.history.retain(|n, _| units.contains_key(n));
            }
        }
        let mut changed = Vec::new();
        let named: Vec<&UnitName> = match names {
            Some(names) => names.iter().collect(),
            None => asked.iter().collect(),
        };
        for name in named {
            let Some(history) = self.observed.history(name) else {
                continue;
            };
            if self.current.history.get(name) != Some(&history) {
                self.current.history.insert(name.clone(), history);
                changed.push(name.clone());
            }
        }
        self.publisher.touched(changed);
    }
}
