//! A feed of the registry's changes, each told as the parts of the registry it touched
//! (units, their states, machines, events), so that a reader re-reads only what it shows:
//! fleetd's `GET /fleet/v1/changes` and fleetctl's `list-* --watch` over etcd (issue 41).
//!
//! One watch of the whole prefix underneath ([`WatchHints::with_events_up_to`]), as hints: a
//! change says which parts may differ, never what they hold. Changes are coalesced: one
//! comes out at once after a quiet spell, then at most one every [`ChangeFeed::new`]'s
//! `every`, naming every part touched meanwhile. Events the watch may have missed (a broken
//! stream, a compacted revision, more than [`MOST_KEPT`] untaken) name every part: re-read
//! everything.

use std::collections::BTreeSet;
use std::time::Duration;
use tokio::time::Instant;

use crate::keys::{Keys, Kind};
use crate::kv::{Kv, Revision};
use crate::watch::{Delta, WatchHints};

/// The most watch events kept between two changes of a feed: past them, a change names
/// every part (bounded memory while a reader is slow).
pub const MOST_KEPT: usize = 10_000;

/// A part of the registry, as a reader re-reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// Unit records, files, where units are scheduled or why not (`list-unit-files`).
    Units,
    /// The states machines publish of their units (`list-units`).
    States,
    /// Machines: presence, metadata, drains, the engine's leader and notices
    /// (`list-machines`, and the legends of the other listings).
    Machines,
    /// What happened (`events`).
    Events,
}

impl Part {
    pub const ALL: [Part; 4] = [Part::Units, Part::States, Part::Machines, Part::Events];

    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Part::Units => "units",
            Part::States => "states",
            Part::Machines => "machines",
            Part::Events => "events",
        }
    }

    /// The part `name` names (`None`: a name of a newer version, ignored).
    pub fn parse(name: &str) -> Option<Part> {
        Part::ALL.into_iter().find(|p| p.as_str() == name)
    }

    /// The part a key of `kind` belongs to.
    pub fn of_kind(kind: Kind) -> Part {
        match kind {
            Kind::Unit
            | Kind::File
            | Kind::FileRef
            | Kind::Schedule
            | Kind::Unscheduled
            | Kind::Moving
            | Kind::Placement
            | Kind::Left => Part::Units,
            Kind::State => Part::States,
            Kind::Machine | Kind::Engine | Kind::Metadata | Kind::Drain | Kind::Migrating => {
                Part::Machines
            }
            Kind::Event => Part::Events,
        }
    }
}

/// One change: the parts touched up to `revision` since the last one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    pub revision: Revision,
    pub parts: BTreeSet<Part>,
}

/// The parts `delta` touched: every part after a gap, or for a key outside the schema (a
/// legacy or newer key: whatever it is, a re-read decides).
pub fn parts_of(keys: &Keys, delta: &Delta) -> BTreeSet<Part> {
    match delta {
        Delta::Gap => Part::ALL.into_iter().collect(),
        Delta::Events(events) => {
            let mut parts = BTreeSet::new();
            for e in events {
                match keys.kind(&e.kv.key) {
                    Some(kind) => {
                        parts.insert(Part::of_kind(kind));
                    }
                    None => return Part::ALL.into_iter().collect(),
                }
            }
            parts
        }
    }
}

/// The registry's changes from a revision on (see the module's text).
#[derive(Debug)]
pub struct ChangeFeed {
    hints: WatchHints,
    keys: Keys,
    every: Duration,
    /// When the last change came out: the next waits until `every` after it.
    last: Option<Instant>,
}

impl ChangeFeed {
    /// Every change of `keys`' prefix from `from` (the revision read + 1).
    pub fn new<K: Kv>(kv: K, keys: Keys, from: Revision, every: Duration) -> ChangeFeed {
        let hints = WatchHints::with_events_up_to(kv, keys.prefix().to_owned(), from, MOST_KEPT);
        ChangeFeed {
            hints,
            keys,
            every,
            last: None,
        }
    }

    /// The next change; `None` once the watch stopped. Cancel-safe: a change not returned
    /// stays for the next call.
    pub async fn next(&mut self) -> Option<Changed> {
        loop {
            self.hints.changed().await?;
            if let Some(last) = self.last {
                tokio::time::sleep_until(last + self.every).await;
            }
            let parts = parts_of(&self.keys, &self.hints.take());
            if parts.is_empty() {
                continue;
            }
            self.last = Some(Instant::now());
            return Some(Changed {
                revision: self.hints.latest(),
                parts,
            });
        }
    }
}

impl<K: Kv> crate::Registry<K> {
    /// The present revision and the feed of every change after it, at most one every
    /// `every` ([`ChangeFeed`]).
    pub async fn changes(&self, every: Duration) -> crate::error::Result<(Revision, ChangeFeed)> {
        let now = self
            .present_revision("reading the revision a change feed starts at")
            .await?;
        let feed = ChangeFeed::new(self.kv().clone(), self.keys().clone(), now + 1, every);
        Ok((now, feed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{Event, EventKind, KeyValue, MemKv, Txn, TxnOp};

    fn event(key: &str) -> Event {
        Event {
            kind: EventKind::Put,
            kv: KeyValue {
                key: key.to_owned(),
                value: vec![],
                create_revision: 1,
                mod_revision: 1,
                version: 1,
                lease: 0,
            },
        }
    }

    #[test]
    fn each_key_touches_the_part_a_listing_of_it_reads() {
        let keys = Keys::new("/p/");
        let delta = |ks: &[&str]| Delta::Events(ks.iter().map(|k| event(k)).collect());
        let parts = |ks: &[&str]| parts_of(&keys, &delta(ks)).into_iter().collect::<Vec<_>>();
        assert_eq!(parts(&["/p/unit/a.service"]), [Part::Units]);
        assert_eq!(parts(&["/p/unit-state/m1/a.service"]), [Part::States]);
        assert_eq!(
            parts(&["/p/engine/leader", "/p/drain/m1"]),
            [Part::Machines]
        );
        assert_eq!(
            parts(&["/p/schedule/m1/a.service", "/p/event/user/cluster/x"]),
            [Part::Units, Part::Events]
        );
        assert_eq!(parts(&[]), []);
    }

    #[test]
    fn a_gap_or_a_key_outside_the_schema_touches_every_part() {
        let keys = Keys::new("/p/");
        assert_eq!(parts_of(&keys, &Delta::Gap).len(), Part::ALL.len());
        let strange = Delta::Events(vec![event("/p/unit/a.service"), event("/p/newer/x")]);
        assert_eq!(parts_of(&keys, &strange).len(), Part::ALL.len());
    }

    #[test]
    fn a_part_parses_back_from_its_name_and_a_newer_name_is_none() {
        for p in Part::ALL {
            assert_eq!(Part::parse(p.as_str()), Some(p));
        }
        assert_eq!(Part::parse("leases"), None);
    }

    async fn put(kv: &MemKv, key: &str) {
        let op = TxnOp::Put {
            key: key.into(),
            value: b"v".to_vec(),
            lease: None,
        };
        kv.txn(Txn {
            compares: vec![],
            success: vec![op],
            failure: vec![],
        })
        .await
        .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_comes_at_once_then_the_next_ones_are_coalesced() {
        let kv = MemKv::new();
        let every = Duration::from_millis(50);
        let mut feed = ChangeFeed::new(kv.clone(), Keys::new("/p/"), 1, every);
        put(&kv, "/p/unit/a.service").await;
        let started = Instant::now();
        let first = feed.next().await.unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(first.parts, BTreeSet::from([Part::Units]));
        put(&kv, "/p/unit-state/m1/a.service").await;
        put(&kv, "/p/machine/m1").await;
        let second = feed.next().await.unwrap();
        assert_eq!(started.elapsed(), every);
        assert_eq!(second.parts, BTreeSet::from([Part::States, Part::Machines]));
        assert!(second.revision > first.revision);
    }
}
