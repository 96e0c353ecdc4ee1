//! The event writer (issue 41): events are handed to an [`EventSink`] without waiting, and
//! one background task per writer puts them in etcd, many to a transaction, on a lease of
//! the retention so they expire by themselves.
//!
//! Writing an event must never delay the action it describes, and losing one must never fail
//! it: [`EventSink::emit`] only tries to queue (a bounded queue; full, the event is dropped
//! and counted), and a put that fails is counted and forgotten, never retried in a loop.
//!
//! Space is bounded twice: every event lives at most the retention plus one lease window (a
//! lease is granted per window of a quarter of the retention, with the retention plus that
//! window as its TTL, and never kept alive), and a writer puts at most [`EventConfig::cap`]
//! events of one subject (unit, machine) per window, counting the rest as capped. So one
//! writer holds at most `cap × 5` events of a unit (docs/registry.md "Events").

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry as Prometheus;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tracing::{Instrument, debug, warn};

use super::{Event, lease_gone};
use crate::keys::EventSource;
use crate::kv::{Kv, KvError, LeaseId, Txn, TxnOp};
use crate::registry::Registry;
use window::Window;

mod window;

/// Events to one transaction at most: etcd's 128 operations (a put each, no compare), so that
/// fleetctl's close after a start of thousands of units writes them in few requests.
const BATCH: usize = crate::kv::MAX_TXN_OPS;

/// A writer's transactions in flight at once. One at a time, a writer put about 1,000
/// events a second under a launch's load, and fleetctl's submit of 100,000 units and the
/// engine's passes emitted faster: at 20,000 units on 1,000 machines half the `submitted`
/// events were dropped (issue 41).
const IN_FLIGHT: usize = 4;

/// How a writer keeps events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventConfig {
    /// How long an event is kept at least (fleetd's `event_retention`, default 1 h).
    pub retention: Duration,
    /// Events of one subject a writer puts per lease window, at most.
    pub cap: u32,
    /// Events waiting to be written, at most; past it they are dropped.
    pub queue: usize,
    /// How long a writer waits after an event for more to put in the same transaction (a
    /// closing writer does not wait). An agent starting units one pass at a time wrote one
    /// transaction per pass: at 100,000 units on 5,000 machines, as many event transactions as
    /// units, and the launch took 137 s with events on against 57 s off (issue 41).
    pub linger: Duration,
}

impl EventConfig {
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(3600);
    /// A quarter of the second within which `fleetctl events --follow` shows an event.
    pub const DEFAULT_LINGER: Duration = Duration::from_millis(250);

    pub fn new(retention: Duration) -> EventConfig {
        EventConfig {
            retention,
            cap: 100,
            queue: 100_000,
            linger: Self::DEFAULT_LINGER,
        }
    }

    /// A lease is used for new events this long; it lives this much beyond the retention.
    fn window(&self) -> Duration {
        (self.retention / 4).max(Duration::from_secs(1))
    }
}

impl Default for EventConfig {
    fn default() -> Self {
        EventConfig::new(EventConfig::DEFAULT_RETENTION)
    }
}

/// What became of the events handed to writers, by outcome; clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct EventStats {
    outcomes: Family<Outcome, Counter>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

impl EventStats {
    /// Counts registered in `registry` as `events` (fleetd's `fleet_registry_events_total`).
    pub fn register(registry: &mut Prometheus) -> EventStats {
        let stats = EventStats::default();
        registry.register(
            "events",
            "events handed to the writer, by outcome (written, dropped: queue full, capped: \
             over the per-unit cap, failed: etcd refused or could not be reached)",
            stats.outcomes.clone(),
        );
        for outcome in ["written", "dropped", "capped", "failed"] {
            stats.count(outcome, 0);
        }
        stats
    }

    fn count(&self, outcome: &'static str, n: u64) {
        self.outcomes.get_or_create(&Outcome { outcome }).inc_by(n);
    }

    /// Events of `outcome` so far (`written`, `dropped`, `capped`, `failed`).
    pub fn get(&self, outcome: &'static str) -> u64 {
        self.outcomes.get_or_create(&Outcome { outcome }).get()
    }
}

/// Where events are handed over; cheap to clone, never waits. A sink of [`EventSink::off`]
/// drops everything.
#[derive(Debug, Clone)]
pub struct EventSink {
    tx: Option<mpsc::Sender<Event>>,
    /// The writer's lease window, for events that board a transaction of their own
    /// ([`board`](Self::board)).
    window: Option<Window>,
    stats: EventStats,
}

/// Events aboard a transaction of another write (the agent's publish of unit states, issue
/// 41): their puts on the writer's current lease. Tell the sink how it went:
/// [`landed`](EventSink::landed) or [`missed`](EventSink::missed).
#[derive(Debug)]
pub(crate) struct Boarding {
    lease: LeaseId,
    pub(crate) ops: Vec<TxnOp>,
    events: Vec<Event>,
}

impl EventSink {
    /// A sink that keeps nothing (events off, or a test).
    pub fn off() -> EventSink {
        EventSink {
            tx: None,
            window: None,
            stats: EventStats::default(),
        }
    }

    /// Takes the events of up to `room` subjects of `events` aboard a transaction of the
    /// caller's, as puts (one per subject) on the writer's current lease within the
    /// per-subject cap; the rest, or all of them while the
    /// writer holds no current lease (only the writer grants one: boarding never waits for
    /// etcd), are queued for the writer as [`emit`](Self::emit) does. At 100,000 units on
    /// 5,000 machines, an event transaction of each agent's own was one of every three
    /// requests of the launch.
    pub(crate) fn board(&self, events: Vec<Event>, room: usize) -> Option<Boarding> {
        let window = self.window.as_ref()?;
        let (mut events, rest) = within_room(events, room);
        let boarding = {
            let mut state = window.lock();
            match state.boarding() {
                Some(lease) if !events.is_empty() => {
                    let (kept, over) = state.capped(events);
                    self.stats.count("capped", over as u64);
                    let ops = state.puts(&kept, lease);
                    events = Vec::new();
                    Some(Boarding {
                        lease,
                        ops,
                        events: kept,
                    })
                }
                Some(_) | None => None,
            }
        };
        for event in events.into_iter().chain(rest) {
            self.emit(event);
        }
        boarding.filter(|b| !b.ops.is_empty())
    }

    /// The transaction `boarding` rode in was written.
    pub(crate) fn landed(&self, boarding: Boarding) {
        self.stats.count("written", boarding.events.len() as u64);
    }

    /// Whether a write that failed with `err` with events aboard is sent again without them:
    /// the events may be why it failed (their lease gone, their prefix refused).
    pub(crate) fn resend_without(err: &KvError) -> bool {
        lease_gone(err) || matches!(err, KvError::PermissionDenied { .. })
    }

    /// The transaction `boarding` was to ride in was refused before it was sent: its events
    /// go to the writer.
    pub(crate) fn unsent(&self, boarding: Boarding) {
        if let Some(window) = &self.window {
            window.lock().uncount(&boarding.events);
        }
        for event in boarding.events {
            self.emit(event);
        }
    }

    /// The transaction `boarding` rode in failed with `err`. A lease gone (the events' own,
    /// perhaps) or a refusal of the events' prefix means nothing was written: the events go
    /// to the writer, which takes a new lease (or is refused too, and warns), and after a
    /// refusal no event boards until the writer's own put succeeds. Any other failure loses
    /// them, as a failed write of the writer's own does (a transaction past its deadline may
    /// still have been applied: no event twice).
    pub(crate) fn missed(&self, boarding: Boarding, err: &KvError) {
        if let Some(window) = &self.window {
            let mut state = window.lock();
            if lease_gone(err) {
                state.forget(boarding.lease);
            }
            if matches!(err, KvError::PermissionDenied { .. }) {
                state.set_refused(true);
            }
        }
        if Self::resend_without(err) {
            self.unsent(boarding);
            return;
        }
        debug!(events = boarding.events.len(), error = %err, "events aboard a failed transaction not written");
        self.stats.count("failed", boarding.events.len() as u64);
    }

    /// Queues `event` for the writer; a full queue drops it (counted as `dropped`).
    pub fn emit(&self, event: Event) {
        if let Some(tx) = &self.tx
            && tx.try_send(event).is_err()
        {
            self.stats.count("dropped", 1);
        }
    }

    pub fn stats(&self) -> &EventStats {
        &self.stats
    }
}

/// `events` split in those whose subjects fit `room` keys (one key per subject,
/// [`window::by_subject`]) and the rest, each in their order.
fn within_room(events: Vec<Event>, room: usize) -> (Vec<Event>, Vec<Event>) {
    let subjects: std::collections::HashSet<_> = window::by_subject(&events)
        .into_iter()
        .take(room)
        .map(|group| group[0].subject())
        .collect();
    events
        .into_iter()
        .partition(|e| subjects.contains(&e.subject()))
}

/// A running writer: its sink, and the task to [`close`](EventLog::close).
#[derive(Debug)]
pub struct EventLog {
    sink: EventSink,
    close: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl EventLog {
    /// Starts the writer of `source`'s events. Crate-private: each role hands out the writer
    /// of its own prefix (`UnitsRole::event_log`, `EngineRole::event_log`,
    /// `MachineRole::event_log`).
    ///
    /// An `eager` writer takes its first lease at once, not at its first event: an agent's
    /// events then ride in its state writes from the first one (a launch on 5,000 machines
    /// otherwise began with 5,000 lease grants and 5,000 event transactions).
    pub(crate) fn start<K: Kv>(
        registry: Registry<K>,
        source: EventSource,
        cfg: EventConfig,
        stats: EventStats,
        eager: bool,
    ) -> EventLog {
        let (tx, rx) = mpsc::channel(cfg.queue.max(1));
        let (close, closed) = oneshot::channel();
        let window = Window::new(cfg, registry.keys().clone(), source);
        let writer = Writer {
            registry,
            cfg,
            stats: stats.clone(),
            window: window.clone(),
            failing: Arc::new(AtomicBool::new(false)),
            granting: Arc::new(tokio::sync::Mutex::new(())),
        };
        let task = tokio::spawn(writer.run(rx, closed, eager).in_current_span());
        EventLog {
            sink: EventSink {
                tx: Some(tx),
                window: Some(window),
                stats,
            },
            close,
            task,
        }
    }

    pub fn sink(&self) -> EventSink {
        self.sink.clone()
    }

    /// The sink alone: the writer goes on while any clone of it lives (a daemon's writer,
    /// never closed).
    pub fn into_sink(self) -> EventSink {
        self.sink
    }

    /// Writes what is queued (waiting at most `within`), then stops: fleetctl's last step,
    /// so that a short-lived process still records what it did.
    pub async fn close(self, within: Duration) {
        let _ = self.close.send(());
        let mut task = self.task;
        if tokio::time::timeout(within, &mut task).await.is_err() {
            task.abort();
        }
    }
}

/// What ended one wait of [`Writer::linger`].
enum Linger {
    Event(Option<Event>),
    Over,
    /// The log was closed (`true`) or let go.
    Closed(bool),
}

/// The background task of one [`EventLog`], and (cloned) each of its writes in flight.
#[derive(Clone)]
struct Writer<K> {
    registry: Registry<K>,
    cfg: EventConfig,
    stats: EventStats,
    /// The lease, its window and counts, shared with the sinks' boardings.
    window: Window,
    /// Whether the last write failed: a failure is worth a warning once, not per batch.
    failing: Arc<AtomicBool>,
    /// Held while a lease is granted: writes in flight take one lease, not one each.
    granting: Arc<tokio::sync::Mutex<()>>,
}

impl<K: Kv + 'static> Writer<K> {
    async fn run(self, mut rx: mpsc::Receiver<Event>, closed: oneshot::Receiver<()>, eager: bool) {
        if eager && let Err(err) = self.lease().await {
            debug!(error = %err, "no lease for events yet; the first event takes one");
        }
        let mut closing = false;
        // `None` once the log was closed or let go ([`EventLog::into_sink`]).
        let mut closed = Some(closed);
        // Dropped with the task (a close that took too long): its writes end with it.
        let mut writes = JoinSet::new();
        loop {
            let first = match (closing, closed.as_mut()) {
                (true, _) => rx.try_recv().ok(),
                (false, None) => rx.recv().await,
                (false, Some(close)) => tokio::select! {
                    ev = rx.recv() => ev,
                    asked = close => {
                        closed = None;
                        // Let go without a close: write on while any sink lives.
                        if asked.is_err() {
                            continue;
                        }
                        closing = true;
                        rx.try_recv().ok()
                    }
                },
            };
            let Some(first) = first else { break };
            let mut batch = vec![first];
            if !closing {
                closing = self.linger(&mut batch, &mut rx, &mut closed).await;
            }
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(e) => batch.push(e),
                    Err(_) => break,
                }
            }
            while writes.len() >= IN_FLIGHT {
                writes.join_next().await;
            }
            let writer = self.clone();
            writes.spawn(async move { writer.write(batch).await }.in_current_span());
        }
        while writes.join_next().await.is_some() {}
    }

    /// Adds to `batch` what arrives within the linger, until it is full. Returns whether the
    /// log was closed meanwhile (the rest is then written without waiting).
    async fn linger(
        &self,
        batch: &mut Vec<Event>,
        rx: &mut mpsc::Receiver<Event>,
        closed: &mut Option<oneshot::Receiver<()>>,
    ) -> bool {
        let until = Instant::now() + self.cfg.linger;
        while batch.len() < BATCH {
            let close = async {
                match closed.as_mut() {
                    Some(close) => close.await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let step = tokio::select! {
                ev = rx.recv() => Linger::Event(ev),
                () = tokio::time::sleep_until(until) => Linger::Over,
                asked = close => Linger::Closed(asked),
            };
            match step {
                Linger::Event(Some(ev)) => batch.push(ev),
                Linger::Event(None) | Linger::Over => return false,
                Linger::Closed(asked) => {
                    *closed = None;
                    // Let go without a close ([`EventLog::into_sink`]): linger on.
                    if asked {
                        return true;
                    }
                }
            }
        }
        false
    }

    /// Puts `batch` (what the cap lets through) in one transaction; once more on a new lease
    /// if the lease was gone. A failure is counted, logged at debug, and forgotten.
    async fn write(&self, batch: Vec<Event>) {
        let mut attempts = 0;
        let kept = self.capped(batch);
        if kept.is_empty() {
            return;
        }
        loop {
            attempts += 1;
            let lease = match self.lease().await {
                Ok(lease) => lease,
                Err(err) => {
                    self.failed(kept.len(), &err);
                    return;
                }
            };
            let ops = self.window.lock().puts(&kept, lease);
            let txn = Txn {
                compares: vec![],
                success: ops,
                failure: vec![],
            };
            match self.registry.kv().txn(txn).await {
                Ok(_) => {
                    self.stats.count("written", kept.len() as u64);
                    self.failing.store(false, Ordering::Relaxed);
                    self.window.lock().set_refused(false);
                    return;
                }
                Err(err) if lease_gone(&err) && attempts == 1 => self.window.lock().forget(lease),
                Err(err) => {
                    self.failed(kept.len(), &err);
                    return;
                }
            }
        }
    }

    /// Counts `n` events lost to `err`; warns when writes start failing, then only counts.
    fn failed(&self, n: usize, err: &dyn std::fmt::Display) {
        self.stats.count("failed", n as u64);
        if self.failing.swap(true, Ordering::Relaxed) {
            debug!(events = n, error = %err, "events not written");
        } else {
            warn!(events = n, error = %err, "events not written; the actions they describe are not affected");
        }
    }

    /// The events of `batch` within their subject's cap on the current lease window.
    fn capped(&self, batch: Vec<Event>) -> Vec<Event> {
        let (kept, over) = self.window.lock().capped(batch);
        if over > 0 {
            self.stats.count("capped", over as u64);
        }
        kept
    }

    /// The lease of the current window, granted if there is none.
    async fn lease(&self) -> Result<LeaseId, KvError> {
        let _one = self.granting.lock().await;
        let ttl = {
            let state = self.window.lock();
            if let Some(lease) = state.current() {
                return Ok(lease);
            }
            state.ttl()
        };
        let lease = self.registry.kv().grant(ttl).await?;
        self.window.lock().granted(lease);
        Ok(lease)
    }
}

#[cfg(test)]
mod tests;
