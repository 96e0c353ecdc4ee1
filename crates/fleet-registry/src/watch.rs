//! Watches as hints: a change under a prefix wakes the caller, which then re-reads a
//! consistent view. Broken streams resume from the last seen revision + 1; a compacted start
//! revision wakes the caller too (it relists anyway) and re-watches from the present.

use fleet_core::Backoff;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, warn};

use crate::kv::{Kv, KvError, Revision, WatchMessage};

/// A background watch of one prefix. `changed()` returns once something may have changed
/// since the last call. Dropping it stops the watch.
#[derive(Debug)]
pub struct WatchHints {
    rx: watch::Receiver<Revision>,
    task: JoinHandle<()>,
}

impl WatchHints {
    /// Watches everything under `prefix` from `from_revision` (usually the revision the caller
    /// just read at, + 1).
    pub fn start<K: Kv>(kv: K, prefix: String, from_revision: Revision) -> WatchHints {
        let (tx, rx) = watch::channel(from_revision - 1);
        let task = tokio::spawn(run(kv, prefix, from_revision, tx).in_current_span());
        WatchHints { rx, task }
    }

    /// Waits for the next change; returns the newest revision seen (a hint, not a promise:
    /// the caller re-reads). Returns `None` if the watcher stopped.
    pub async fn changed(&mut self) -> Option<Revision> {
        self.rx.changed().await.ok()?;
        Some(*self.rx.borrow_and_update())
    }
}

impl Drop for WatchHints {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

async fn run<K: Kv>(kv: K, prefix: String, mut from: Revision, tx: watch::Sender<Revision>) {
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
                WatchMessage::Events { revision, .. } => {
                    backoff.reset();
                    from = revision + 1;
                    if tx.send(revision).is_err() {
                        return;
                    }
                }
                WatchMessage::Compacted { compact_revision } => {
                    warn!(prefix = %prefix, compact_revision, "watch start revision compacted; relisting");
                    from = compact_revision.max(from);
                    // The caller must relist: wake it with the newest revision we know.
                    if tx.send(compact_revision).is_err() {
                        return;
                    }
                    break;
                }
                WatchMessage::Broken => {
                    debug!(prefix = %prefix, from, "watch broken; resuming");
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
