//! The lease window of one writer's events, shared by its background writer and the
//! transactions its events board ([`EventSink::board`](super::EventSink::board)): the lease new
//! events go on, when it was granted, and how many events of each subject it holds, so that
//! the per-subject cap counts every event of the writer however it went out.
//!
//! Only the writer grants a lease (boarding never waits for etcd): a boarding finds the
//! window's current lease or does not board.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::time::Instant;

use super::EventConfig;
use crate::events::Event;
use crate::keys::{EventSource, EventStamp, EventSubject, Keys};
use crate::kv::{LeaseId, TxnOp};
use crate::registry::encode;

/// One writer's window; clones share it.
#[derive(Debug, Clone)]
pub(super) struct Window(Arc<Mutex<State>>);

#[derive(Debug)]
pub(super) struct State {
    cfg: EventConfig,
    keys: Keys,
    source: EventSource,
    /// The lease new events go on, and when it was granted.
    lease: Option<(LeaseId, Instant)>,
    /// Events put per subject on the current lease.
    counts: HashMap<EventSubject, u32>,
    nonce: RandomState,
    written: u64,
    /// etcd refused events aboard another write (a host's role without the events' prefix:
    /// `fleetctl auth setup` not run again since issue 41): nothing boards until the writer's
    /// own put succeeds.
    refused: bool,
}

impl Window {
    pub(super) fn new(cfg: EventConfig, keys: Keys, source: EventSource) -> Window {
        Window(Arc::new(Mutex::new(State {
            cfg,
            keys,
            source,
            lease: None,
            counts: HashMap::new(),
            nonce: RandomState::new(),
            written: 0,
            refused: false,
        })))
    }

    /// The window, locked; never held across an await.
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl State {
    /// The events of `batch` within their subject's cap on the current window, and how many
    /// were over it. A window that is over ends here: its lease is not used again.
    pub(super) fn capped(&mut self, batch: Vec<Event>) -> (Vec<Event>, usize) {
        if self.over() {
            self.lease = None;
            self.counts.clear();
        }
        let cap = self.cfg.cap;
        let before = batch.len();
        let kept: Vec<Event> = batch
            .into_iter()
            .filter(|e| {
                let n = self.counts.entry(e.subject()).or_default();
                *n += 1;
                *n <= cap
            })
            .collect();
        let over = before - kept.len();
        (kept, over)
    }

    /// `events`, counted against their subjects' cap when they boarded a write that did not
    /// land, are counted again by the writer that takes them: not twice.
    pub(super) fn uncount(&mut self, events: &[Event]) {
        for e in events {
            if let Some(n) = self.counts.get_mut(&e.subject()) {
                *n = n.saturating_sub(1);
            }
        }
    }

    /// The lease of the current window, if one was granted and its window is not over.
    pub(super) fn current(&self) -> Option<LeaseId> {
        self.lease.filter(|_| !self.over()).map(|(lease, _)| lease)
    }

    /// The lease events may board another write on: the current one, unless etcd refused
    /// events aboard since the writer's last put.
    pub(super) fn boarding(&self) -> Option<LeaseId> {
        self.current().filter(|_| !self.refused)
    }

    /// etcd refused the events aboard a write, or (`false`) took the writer's own put.
    pub(super) fn set_refused(&mut self, refused: bool) {
        self.refused = refused;
    }

    /// `lease` was granted: the window starts now, its counts afresh.
    pub(super) fn granted(&mut self, lease: LeaseId) {
        self.lease = Some((lease, Instant::now()));
        self.counts.clear();
    }

    /// `lease` is gone from etcd: the next events wait for a new one (if it is still the
    /// window's; a newer one stays).
    pub(super) fn forget(&mut self, lease: LeaseId) {
        if self.lease.is_some_and(|(l, _)| l == lease) {
            self.lease = None;
        }
    }

    /// The puts of `events` on `lease`: one key per subject ([`by_subject`]), stamped with
    /// its first event's time.
    pub(super) fn puts(&mut self, events: &[Event], lease: LeaseId) -> Vec<TxnOp> {
        by_subject(events)
            .into_iter()
            .map(|group| self.put(&group, lease))
            .collect()
    }

    /// The put of `group` (events of one subject, at least one) on `lease`, under a key of
    /// its own: one event as an object, several as an array ([`crate::events::decode`]).
    fn put(&mut self, group: &[&Event], lease: LeaseId) -> TxnOp {
        self.written += 1;
        let first = group[0];
        let stamp = EventStamp {
            micros: group.iter().map(|e| e.time).min().unwrap_or(first.time),
            nonce: self.nonce.hash_one(self.written),
        };
        let key = self.keys.event(&self.source, &first.subject(), stamp);
        let value = match group {
            [one] => encode(*one),
            many => encode(&many),
        };
        TxnOp::Put {
            key,
            value,
            lease: Some(lease),
        }
    }

    /// The TTL of a new window's lease: the retention plus the window.
    pub(super) fn ttl(&self) -> std::time::Duration {
        self.cfg.retention + self.cfg.window()
    }

    fn over(&self) -> bool {
        self.lease
            .is_some_and(|(_, granted)| granted.elapsed() >= self.cfg.window())
    }
}

/// `events` by subject, each group in the order of its subject's first event, the events of
/// a group in their order: what one write puts under one key. An agent's pass that starts a
/// unit and finds it active writes one key for both, not two (issue 41: at 100,000 units,
/// events were 3 in 10 of the launch's keys).
pub(super) fn by_subject(events: &[Event]) -> Vec<Vec<&Event>> {
    let mut index: HashMap<EventSubject, usize> = HashMap::new();
    let mut groups: Vec<Vec<&Event>> = Vec::new();
    for e in events {
        let i = *index.entry(e.subject()).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[i].push(e);
    }
    groups
}
