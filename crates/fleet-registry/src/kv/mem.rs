//! [`Kv`] in memory: a model of etcd's semantics for fast, deterministic tests.
//!
//! Owns the locking around the [`store`] state machine, lease expiry on tokio time (so tests
//! on paused time can jump past a TTL), watch delivery, and the test knobs etcd has no
//! counterpart for: [`MemKv::set_unavailable`] and [`MemKv::compact`]. The contract tests in
//! `tests/kv_contract.rs` hold it to etcd's behaviour; it must not grow conveniences etcd
//! lacks.

mod store;

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{Instrument, debug};

use super::{
    Event, Kv, KvError, LeaseId, RangeResult, Read, ReadResult, Revision, Txn, TxnResult, Watch,
    WatchMessage,
};
use store::Store;

/// What `KvError::Unavailable` names as the endpoint.
const ENDPOINT: &str = "memory";

/// Messages buffered for a slow watch consumer; the rest wait in an unbounded queue, as they
/// would wait in etcd.
const CHANNEL_CAPACITY: usize = 64;

/// An in-memory etcd. Clones share one store, like clients of one cluster.
#[derive(Clone, Default)]
pub struct MemKv {
    state: Arc<Mutex<State>>,
}

impl fmt::Debug for MemKv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("MemKv");
        // try_lock: formatting must not deadlock, e.g. in a log line under the lock.
        if let Ok(state) = self.state.try_lock() {
            out.field("revision", &state.store.revision())
                .field("watchers", &state.watchers.len())
                .field("unavailable", &state.unavailable);
        }
        out.finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct State {
    store: Store,
    watchers: Vec<Watcher>,
    /// The last revision whose events went to the watchers.
    published: Revision,
    unavailable: bool,
}

#[derive(Debug)]
struct Watcher {
    key: String,
    prefix: bool,
    from_revision: Revision,
    tx: mpsc::UnboundedSender<WatchMessage>,
}

impl Watcher {
    fn matching(&self, revision: Revision, events: &[Event]) -> Option<WatchMessage> {
        if revision < self.from_revision {
            return None;
        }
        let events: Vec<Event> = events
            .iter()
            .filter(|e| {
                if self.prefix {
                    e.kv.key.starts_with(&self.key)
                } else {
                    e.kv.key == self.key
                }
            })
            .cloned()
            .collect();
        (!events.is_empty()).then_some(WatchMessage::Events { revision, events })
    }
}

impl State {
    fn check_available(&self) -> Result<(), KvError> {
        if self.unavailable {
            return Err(KvError::Unavailable {
                endpoints: ENDPOINT.to_owned(),
                detail: "simulated outage".to_owned(),
            });
        }
        Ok(())
    }

    /// Sends the events of new revisions to the watchers, dropping watchers whose receiver
    /// has gone.
    fn publish(&mut self) {
        let Self {
            store,
            watchers,
            published,
            ..
        } = self;
        for (revision, events) in store.events_after(*published) {
            watchers.retain(|w| match w.matching(revision, events) {
                Some(message) => w.tx.send(message).is_ok(),
                None => !w.tx.is_closed(),
            });
        }
        *published = store.revision();
    }
}

impl MemKv {
    /// An empty store at revision 1, as a fresh etcd.
    pub fn new() -> MemKv {
        MemKv::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Simulates etcd going down (`true`) and coming back (`false`). While down, every call
    /// fails with [`KvError::Unavailable`], live watches get [`WatchMessage::Broken`], and no
    /// lease expires; on recovery every lease gets its full TTL again, as etcd renews leases
    /// when a new leader takes over.
    pub fn set_unavailable(&self, unavailable: bool) {
        let mut state = self.lock();
        if unavailable == state.unavailable {
            return;
        }
        state.unavailable = unavailable;
        if unavailable {
            for watcher in state.watchers.drain(..) {
                let _ = watcher.tx.send(WatchMessage::Broken);
            }
        } else {
            state.store.renew_all(Instant::now());
        }
        debug!(unavailable, "memory kv availability changed");
    }

    /// Compacts history up to `revision`, as etcd's compaction: reads before it fail with
    /// [`KvError::Compacted`] and watches from before it get [`WatchMessage::Compacted`].
    pub fn compact(&self, revision: Revision) -> Result<(), KvError> {
        self.lock().store.compact(revision)
    }

    /// How many watches are live (not yet dropped by their receiver), for tests that check
    /// watches are cleaned up.
    pub fn watcher_count(&self) -> usize {
        let mut state = self.lock();
        state.watchers.retain(|w| !w.tx.is_closed());
        state.watchers.len()
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock cannot leave the store half-written (each operation
    // checks before it mutates), so a poisoned lock is still usable.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Kv for MemKv {
    async fn range(
        &self,
        key: &str,
        prefix: bool,
        revision: Option<Revision>,
    ) -> Result<RangeResult, KvError> {
        let state = self.lock();
        state.check_available()?;
        state.store.range(key, prefix, revision)
    }

    async fn read(
        &self,
        reads: &[Read],
        revision: Option<Revision>,
    ) -> Result<ReadResult, KvError> {
        let state = self.lock();
        state.check_available()?;
        state.store.read(reads, revision)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult, KvError> {
        let mut state = self.lock();
        state.check_available()?;
        let result = state.store.txn(&txn)?;
        state.publish();
        Ok(result)
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseId, KvError> {
        let lease = {
            let mut state = self.lock();
            state.check_available()?;
            state.store.grant(ttl, Instant::now())
        };
        tokio::spawn(expire_lease(Arc::downgrade(&self.state), lease).in_current_span());
        Ok(lease)
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<(), KvError> {
        let mut state = self.lock();
        state.check_available()?;
        state.store.keep_alive(lease, Instant::now())
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), KvError> {
        let mut state = self.lock();
        state.check_available()?;
        state.store.revoke(lease);
        state.publish();
        Ok(())
    }

    async fn watch(
        &self,
        key: &str,
        prefix: bool,
        from_revision: Revision,
    ) -> Result<Watch, KvError> {
        let (queue_tx, queue_rx) = mpsc::unbounded_channel();
        {
            let mut state = self.lock();
            state.check_available()?;
            let watcher = Watcher {
                key: key.to_owned(),
                prefix,
                // As in etcd, 0 means "from the next change".
                from_revision: if from_revision > 0 {
                    from_revision
                } else {
                    state.store.revision() + 1
                },
                tx: queue_tx,
            };
            // History and registration under one lock: no revision is missed or sent twice.
            let replay = state.store.history(watcher.from_revision).map(|history| {
                history
                    .filter_map(|(revision, events)| watcher.matching(revision, events))
                    .collect::<Vec<_>>()
            });
            match replay {
                Err(compact_revision) => {
                    let _ = watcher
                        .tx
                        .send(WatchMessage::Compacted { compact_revision });
                }
                Ok(messages) => {
                    for message in messages {
                        let _ = watcher.tx.send(message);
                    }
                    state.watchers.push(watcher);
                }
            }
        }
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        tokio::spawn(forward(queue_rx, tx).in_current_span());
        Ok(Watch { rx })
    }
}

/// Moves messages from a watcher's queue to its channel until the receiver is dropped or
/// the watch ends (`Compacted`, `Broken`).
async fn forward(mut queue: mpsc::UnboundedReceiver<WatchMessage>, tx: mpsc::Sender<WatchMessage>) {
    loop {
        let message = tokio::select! {
            message = queue.recv() => message,
            () = tx.closed() => return,
        };
        let Some(message) = message else { return };
        let last = !matches!(message, WatchMessage::Events { .. });
        if tx.send(message).await.is_err() || last {
            return;
        }
    }
}

/// Revokes `lease` once its deadline passes without a keep-alive. Holds the store weakly so
/// a dropped `MemKv` ends its timers.
async fn expire_lease(state: Weak<Mutex<State>>, lease: LeaseId) {
    loop {
        let deadline = {
            let Some(state) = state.upgrade() else { return };
            let mut state = lock(&state);
            let now = Instant::now();
            match state.store.lease_deadline(lease) {
                None => return,
                Some(deadline) if deadline > now => deadline,
                // etcd is down: nothing expires; recovery renews every lease anyway.
                Some(_) if state.unavailable => {
                    state.store.renew(lease, now);
                    continue;
                }
                Some(_) => {
                    debug!(lease = lease.0, "memory kv lease expired");
                    state.store.revoke(lease);
                    state.publish();
                    return;
                }
            }
        };
        tokio::time::sleep_until(deadline).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::TxnOp;

    fn put(key: &str, lease: Option<LeaseId>) -> Txn {
        Txn {
            success: vec![TxnOp::Put {
                key: key.into(),
                value: b"v".to_vec(),
                lease,
            }],
            ..Txn::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn keeps_leases_alive_while_unavailable_and_renews_them_on_recovery() {
        let kv = MemKv::new();
        let lease = kv.grant(Duration::from_secs(2)).await.unwrap();
        kv.txn(put("k", Some(lease))).await.unwrap();
        kv.set_unavailable(true);
        tokio::time::sleep(Duration::from_secs(10)).await;
        kv.set_unavailable(false);
        tokio::time::sleep(Duration::from_millis(1900)).await;
        assert_eq!(kv.range("k", false, None).await.unwrap().kvs.len(), 1);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(kv.range("k", false, None).await.unwrap().kvs.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn breaks_watches_and_fails_calls_while_unavailable() {
        let kv = MemKv::new();
        let mut watch = kv.watch("k", false, 0).await.unwrap();
        kv.set_unavailable(true);
        assert_eq!(watch.rx.recv().await, Some(WatchMessage::Broken));
        assert_eq!(watch.rx.recv().await, None);
        let err = kv.range("k", false, None).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(kv.watch("k", false, 0).await.is_err());
    }
}
