//! Reading one unit's or one machine's events without everyone's (issue 41): at 100,000
//! units an hour of events is hundreds of thousands of records, and `fleetctl events --unit`
//! read them all to keep a dozen.
//!
//! - A unit's events: what users and the engine wrote about it (two prefixes), then what
//!   the agents of the machines it was on wrote about it. Those machines are the ones its
//!   own events name (placed on, moved from), its placements now and its placement history
//!   (`P/left/`): a few reads of a few keys, however big the cluster.
//! - A machine's events: what users and the engine wrote (any subject: they are filtered
//!   here) and what its own agent wrote; not the other agents'.
//!
//! What a unit's read misses: an agent's event about a unit on a machine that none of those
//! names, i.e. a machine the unit left longer ago than the retention whose agent writes
//! about it only now (a unit removed at the boot of a machine down for longer than that).
//! `--machine` finds it.

use fleet_core::{MachineId, UnitName};
use std::collections::BTreeSet;

use super::{Event, EventFilter, chronological, decode, decoded};
use crate::error::{RegistryError, Result};
use crate::keys::{EventSource, EventSubject, Key};
use crate::kv::{KeyValue, Kv, MAX_TXN_OPS, Read, Revision};
use crate::read::Listing;
use crate::registry::Registry;

/// Everything under `prefix` (which ends in `/`).
fn under(prefix: String) -> Read {
    let end = format!("{}0", &prefix[..prefix.len() - 1]);
    Read::interval(prefix, end, 0)
}

impl<K: Kv> Registry<K> {
    /// The events of `unit` that `filter` matches: see the module's doc.
    pub(super) async fn unit_events(
        &self,
        unit: &UnitName,
        filter: &EventFilter,
    ) -> Result<Listing<Vec<Event>>> {
        let keys = self.keys();
        let subject = EventSubject::Unit(unit.clone());
        let first = [
            under(keys.subject_events(&EventSource::User, &subject)),
            under(keys.subject_events(&EventSource::Engine, &subject)),
            under(keys.unit_placements(unit)),
            under(keys.unit_lefts(unit)),
        ];
        let res = self
            .kv()
            .read(&first, None)
            .await
            .map_err(RegistryError::kv("reading a unit's events"))?;
        let revision = res.revision;
        let mut found = res.found.into_iter();
        let mut kvs: Vec<KeyValue> = found.by_ref().take(2).flatten().collect();
        let mut machines: BTreeSet<MachineId> = found
            .flatten()
            .filter_map(|kv| match Key::parse(keys, &kv.key)? {
                Key::Placement { machine, .. } | Key::Left { machine, .. } => Some(machine),
                _ => None,
            })
            .collect();
        for e in kvs.iter().filter_map(|kv| decode(keys, kv).ok()).flatten() {
            machines.extend(e.machine);
            machines.extend(e.from);
        }
        let reads: Vec<Read> = machines
            .into_iter()
            .map(|m| under(keys.subject_events(&EventSource::Machine(m), &subject)))
            .collect();
        kvs.extend(self.read_all(&reads, revision).await?);
        Ok(self.listing(&kvs, revision, filter))
    }

    /// The events about `machine` that `filter` matches: see the module's doc.
    pub(super) async fn machine_events(
        &self,
        machine: &MachineId,
        filter: &EventFilter,
    ) -> Result<Listing<Vec<Event>>> {
        let keys = self.keys();
        let reads = [
            under(keys.source_events(&EventSource::User)),
            under(keys.source_events(&EventSource::Engine)),
            under(keys.source_events(&EventSource::Machine(machine.clone()))),
        ];
        let res = self
            .kv()
            .read(&reads, None)
            .await
            .map_err(RegistryError::kv("reading a machine's events"))?;
        let kvs: Vec<KeyValue> = res.found.into_iter().flatten().collect();
        Ok(self.listing(&kvs, res.revision, filter))
    }

    /// Every key of `reads` at `revision`, [`MAX_TXN_OPS`] reads to a request.
    async fn read_all(&self, reads: &[Read], revision: Revision) -> Result<Vec<KeyValue>> {
        let mut kvs = Vec::new();
        for chunk in reads.chunks(MAX_TXN_OPS) {
            let res = self
                .kv()
                .read(chunk, Some(revision))
                .await
                .map_err(RegistryError::kv("reading a unit's events"))?;
            kvs.extend(res.found.into_iter().flatten());
        }
        Ok(kvs)
    }

    /// The events of `kvs` that `filter` matches, oldest first; the unreadable ones skipped.
    pub(super) fn listing(
        &self,
        kvs: &[KeyValue],
        revision: Revision,
        filter: &EventFilter,
    ) -> Listing<Vec<Event>> {
        let mut found = Vec::new();
        let mut skipped = Vec::new();
        for kv in kvs {
            match decoded(self.keys(), kv, |e| filter.matches(e)) {
                Ok(events) => found.extend(events),
                Err(detail) => skipped.push(crate::read::skipped(self.keys(), kv, detail)),
            }
        }
        chronological(&mut found);
        Listing {
            revision,
            items: found.into_iter().map(|(_, e)| e).collect(),
            skipped,
        }
    }
}
