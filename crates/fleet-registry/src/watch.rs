//! Watches as hints: a change under a prefix wakes the caller, which then re-reads a
//! consistent view. Broken streams resume from the last seen revision + 1; a compacted start
//! revision wakes the caller too (it relists anyway) and re-watches from the present.
//!
//! A watch started [`WatchHints::with_events`] also keeps the events it got, so a caller that
//! follows a big prefix can apply them instead of re-reading it all on every change (the
//! agent with a thousand units: one full read per change made each unit cost every other
//! one, docs/benchmarks.md "Scale II"). Whenever events may be missing (a broken stream, a
//! compacted revision) [`WatchHints::take`] says [`Delta::Gap`]: re-read.

use fleet_core::Backoff;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, warn};

use crate::kv::{Event, Kv, KvError, Revision, WatchMessage};

/// What changed since the last [`WatchHints::take`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// Every event since then, in revision order (none if nothing came).
    Events(Vec<Event>),
    /// Some may be missing (or the watch keeps none): re-read.
    Gap,
}

/// The events a watch kept for its caller.
#[derive(Debug, Default)]
struct Kept {
    events: Vec<Event>,
    gap: bool,
    /// Past this many events untaken, they are dropped for a gap, and each is kept without
    /// its value: a caller that takes them late (a change stream whose client reads slowly)
    /// holds bounded memory, a few hundred bytes an event.
    most: Option<usize>,
}

/// A background watch of one prefix. `changed()` returns once something may have changed
/// since the last call. Dropping it stops the watch.
#[derive(Debug)]
pub struct WatchHints {
    rx: watch::Receiver<Revision>,
    task: JoinHandle<()>,
    kept: Option<Arc<Mutex<Kept>>>,
}

impl WatchHints {
    /// Watches everything under `prefix` from `from_revision` (usually the revision the caller
    /// just read at, + 1).
    pub fn start<K: Kv>(kv: K, prefix: String, from_revision: Revision) -> WatchHints {
        let (tx, rx) = watch::channel(from_revision - 1);
        let task = tokio::spawn(run(kv, prefix, from_revision, tx, None).in_current_span());
        WatchHints {
            rx,
            task,
            kept: None,
        }
    }

    /// As [`start`](Self::start), keeping the events for [`take`](Self::take).
    pub fn with_events<K: Kv>(kv: K, prefix: String, from_revision: Revision) -> WatchHints {
        Self::keeping(kv, prefix, from_revision, None)
    }

    /// As [`with_events`](Self::with_events), keeping at most `most` events untaken, each
    /// without its value (keys and revisions only): past that, [`take`](Self::take) says
    /// [`Delta::Gap`].
    pub fn with_events_up_to<K: Kv>(
        kv: K,
        prefix: String,
        from_revision: Revision,
        most: usize,
    ) -> WatchHints {
        Self::keeping(kv, prefix, from_revision, Some(most))
    }

    fn keeping<K: Kv>(
        kv: K,
        prefix: String,
        from_revision: Revision,
        most: Option<usize>,
    ) -> WatchHints {
        let (tx, rx) = watch::channel(from_revision - 1);
        let kept = Arc::new(Mutex::new(Kept {
            most,
            ..Kept::default()
        }));
        let task =
            tokio::spawn(run(kv, prefix, from_revision, tx, Some(kept.clone())).in_current_span());
        WatchHints {
            rx,
            task,
            kept: Some(kept),
        }
    }

    /// The events kept since the last call, or [`Delta::Gap`] if some may be missing since
    /// then (or this watch keeps none).
    pub fn take(&mut self) -> Delta {
        let Some(kept) = &self.kept else {
            return Delta::Gap;
        };
        let mut kept = kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let most = kept.most;
        let taken = std::mem::replace(
            &mut *kept,
            Kept {
                most,
                ..Kept::default()
            },
        );
        if taken.gap {
            Delta::Gap
        } else {
            Delta::Events(taken.events)
        }
    }

    /// Waits for the next change; returns the newest revision seen (a hint, not a promise:
    /// the caller re-reads). Returns `None` if the watcher stopped.
    pub async fn changed(&mut self) -> Option<Revision> {
        self.rx.changed().await.ok()?;
        Some(*self.rx.borrow_and_update())
    }

    /// The newest revision seen so far, without waiting or marking it seen.
    pub fn latest(&self) -> Revision {
        *self.rx.borrow()
    }
}

impl Drop for WatchHints {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<K: Kv> crate::Registry<K> {
    /// A watch of the whole registry from now: any change under the prefix wakes it (the
    /// dashboard's change stream, which re-reads what it shows on each).
    pub async fn watch_everything(&self) -> crate::error::Result<WatchHints> {
        let now = self
            .kv()
            .range(&self.keys().leader(), false, None)
            .await
            .map_err(crate::error::RegistryError::kv("reading the revision"))?;
        Ok(WatchHints::start(
            self.kv().clone(),
            self.keys().prefix().to_owned(),
            now.revision + 1,
        ))
    }
}

const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// `event` without its value, for a caller that needs only what changed.
fn without_value(mut event: Event) -> Event {
    event.kv.value = Vec::new();
    event
}

/// Records a gap (events may be missing) for a caller that keeps events.
fn gap(kept: &Option<Arc<Mutex<Kept>>>) {
    if let Some(kept) = kept {
        let mut kept = kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.events.clear();
        kept.gap = true;
    }
}

async fn run<K: Kv>(
    kv: K,
    prefix: String,
    mut from: Revision,
    tx: watch::Sender<Revision>,
    kept: Option<Arc<Mutex<Kept>>>,
) {
    // Jittered: every agent's watch breaks at the same moment when etcd goes away, and must
    // not come back at the same moment.
    let mut backoff = Backoff::new(RETRY_MIN, RETRY_MAX);
    // A refusal (etcd's RBAC, the credentials) lasts until an administrator acts: said once
    // per run of refusals, where an outage is the caller's to report.
    let mut refused = false;
    loop {
        let mut w = match kv.watch(&prefix, true, from).await {
            Ok(w) => {
                refused = false;
                w
            }
            Err(err) => {
                let refusal = matches!(
                    err,
                    KvError::PermissionDenied { .. } | KvError::AuthFailed { .. }
                );
                if refusal && !refused {
                    warn!(prefix = %prefix, error = %err, "etcd refused a watch; retrying slowly");
                } else {
                    debug!(prefix = %prefix, error = %err, "watch could not start; retrying");
                }
                refused = refusal;
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
        };
        while let Some(msg) = w.rx.recv().await {
            match msg {
                WatchMessage::Events { revision, events } => {
                    backoff.reset();
                    from = revision + 1;
                    // Kept before the wake-up, so the caller woken finds them.
                    if let Some(kept) = &kept {
                        let mut kept = kept
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        let values = kept.most.is_none();
                        if !kept.gap && values {
                            kept.events.extend(events);
                        } else if !kept.gap {
                            kept.events.extend(events.into_iter().map(without_value));
                        }
                        if kept.most.is_some_and(|most| kept.events.len() > most) {
                            kept.events = Vec::new();
                            kept.gap = true;
                        }
                    }
                    if tx.send(revision).is_err() {
                        return;
                    }
                }
                WatchMessage::Compacted { compact_revision } => {
                    warn!(prefix = %prefix, compact_revision, "watch start revision compacted; relisting");
                    from = compact_revision.max(from);
                    gap(&kept);
                    // The caller must relist: wake it with the newest revision we know.
                    if tx.send(compact_revision).is_err() {
                        return;
                    }
                    break;
                }
                WatchMessage::Broken => {
                    debug!(prefix = %prefix, from, "watch broken; resuming");
                    gap(&kept);
                    // Changes may have happened while we were away: wake the caller too.
                    if tx.send(from - 1).is_err() {
                        return;
                    }
                    break;
                }
            }
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{EventKind, MemKv, Txn, TxnOp};

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
    async fn a_watch_with_events_keeps_every_event_until_taken() {
        let kv = MemKv::new();
        let mut hints = WatchHints::with_events(kv.clone(), "/p/".into(), 1);
        put(&kv, "/p/a").await;
        put(&kv, "/p/b").await;
        put(&kv, "/other").await;
        hints.changed().await.unwrap();
        while hints.rx.has_changed().unwrap_or(false) {
            hints.changed().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        let Delta::Events(events) = hints.take() else {
            panic!("a gap");
        };
        let keys: Vec<&str> = events.iter().map(|e| e.kv.key.as_str()).collect();
        assert_eq!(keys, ["/p/a", "/p/b"]);
        assert!(events.iter().all(|e| e.kind == EventKind::Put));
        assert_eq!(hints.take(), Delta::Events(vec![]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_keeping_few_events_says_gap_past_them_then_keeps_again() {
        let kv = MemKv::new();
        let mut hints = WatchHints::with_events_up_to(kv.clone(), "/p/".into(), 1, 2);
        for key in ["/p/a", "/p/b", "/p/c"] {
            put(&kv, key).await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(hints.take(), Delta::Gap);
        put(&kv, "/p/d").await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        let Delta::Events(events) = hints.take() else {
            panic!("a gap");
        };
        assert_eq!(events.len(), 1);
        assert!(events[0].kv.value.is_empty(), "kept without its value");
        assert_eq!(hints.latest(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_without_events_always_says_gap() {
        let kv = MemKv::new();
        let mut hints = WatchHints::start(kv, "/p/".into(), 1);
        assert_eq!(hints.take(), Delta::Gap);
    }

    #[tokio::test(start_paused = true)]
    async fn a_compacted_start_is_a_gap() {
        let kv = MemKv::new();
        put(&kv, "/p/a").await;
        put(&kv, "/p/b").await;
        kv.compact(3).unwrap();
        let mut hints = WatchHints::with_events(kv.clone(), "/p/".into(), 1);
        hints.changed().await.unwrap();
        assert_eq!(hints.take(), Delta::Gap);
    }
}
