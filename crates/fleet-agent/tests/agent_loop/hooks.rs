//! Hooks on the in-memory store that count or fail the agent's requests.

use fleet_registry::kv::{Hook, Hooked, KvError, MemKv, Outcome, Request, TxnOp};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Unit-file reads that take `latency` each, counting how many are in flight at once, and
/// how many files they asked for in all.
#[derive(Debug, Clone)]
pub(crate) struct SlowFiles {
    pub(crate) latency: Duration,
    pub(crate) in_flight: std::sync::Arc<std::sync::Mutex<(usize, usize)>>,
    pub(crate) requests: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
}

pub(crate) type SlowFilesKv = Hooked<MemKv, SlowFiles>;

impl SlowFiles {
    pub(crate) fn most_in_flight(&self) -> usize {
        self.in_flight.lock().unwrap().1
    }
}

impl Hook for SlowFiles {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        let files = match request {
            Request::Range { key, .. } => usize::from(key.starts_with("/t/file/")),
            Request::Txn(txn) => txn
                .success
                .iter()
                .filter(|op| matches!(op, TxnOp::Get { key, .. } if key.starts_with("/t/file/")))
                .count(),
            _ => 0,
        };
        if files == 0 {
            return Ok(());
        }
        self.requests.lock().unwrap().push(files);
        {
            let mut n = self.in_flight.lock().unwrap();
            n.0 += 1;
            n.1 = n.1.max(n.0);
        }
        tokio::time::sleep(self.latency).await;
        self.in_flight.lock().unwrap().0 -= 1;
        Ok(())
    }
}

/// Counts the requests the fake RBAC refused.
#[derive(Debug, Clone, Default)]
pub(crate) struct Refusals(pub(crate) Arc<Mutex<Vec<String>>>);

impl Hook for Refusals {
    async fn before(&self, _: Request<'_>) -> Result<(), KvError> {
        Ok(())
    }

    fn after(&self, _: Request<'_>, outcome: Outcome<'_>, _: Duration) {
        if let Outcome::Failed(e @ KvError::PermissionDenied { .. }) = outcome {
            self.0.lock().unwrap().push(e.to_string());
        }
    }
}

/// Counts range reads of this machine's schedule.
#[derive(Debug, Clone, Default)]
pub(crate) struct ScheduleReads(pub(crate) Arc<Mutex<usize>>);

impl Hook for ScheduleReads {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        if let Request::Range { key, .. } = request
            && key.starts_with("/t/schedule/")
        {
            *self.0.lock().unwrap() += 1;
        }
        Ok(())
    }
}

/// Counts transactions that put unit states, and the states they put.
#[derive(Debug, Clone, Default)]
pub(crate) struct StatePuts(pub(crate) Arc<Mutex<Vec<usize>>>);

impl Hook for StatePuts {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        if let Request::Txn(txn) = request {
            let puts = txn
                .success
                .iter()
                .filter(
                    |op| matches!(op, TxnOp::Put { key, .. } if key.starts_with("/t/unit-state/")),
                )
                .count();
            if puts > 0 {
                self.0.lock().unwrap().push(puts);
            }
        }
        Ok(())
    }
}

/// Fails every read of a unit file while `failing` is set, as etcd past fleetd's deadline
/// would, and tells `refused` each time it does.
#[derive(Debug, Clone, Default)]
pub(crate) struct FailFiles {
    pub(crate) failing: Arc<std::sync::atomic::AtomicBool>,
    pub(crate) refused: Arc<tokio::sync::Notify>,
}

impl Hook for FailFiles {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        let file = |key: &str| key.starts_with("/t/file/");
        let touches_files = match request {
            Request::Range { key, .. } => file(key),
            Request::Read(reads) => reads.iter().any(|r| file(&r.start)),
            Request::Txn(txn) => txn
                .success
                .iter()
                .any(|op| matches!(op, TxnOp::Get { key, .. } if file(key))),
            _ => false,
        };
        if touches_files && self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            self.refused.notify_one();
            return Err(KvError::Unavailable {
                endpoints: "test".into(),
                detail: "the test fails file reads".into(),
            });
        }
        Ok(())
    }
}

/// Each transaction that puts unit states or events: how many of each it put.
#[derive(Debug, Clone, Default)]
pub(crate) struct StateAndEventPuts(pub(crate) Arc<Mutex<Vec<(usize, usize)>>>);

impl Hook for StateAndEventPuts {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        if let Request::Txn(txn) = request {
            let puts = |prefix: &str| {
                txn.success
                    .iter()
                    .filter(|op| matches!(op, TxnOp::Put { key, .. } if key.starts_with(prefix)))
                    .count()
            };
            let (states, events) = (puts("/t/unit-state/"), puts("/t/event/"));
            if states + events > 0 {
                self.0.lock().unwrap().push((states, events));
            }
        }
        Ok(())
    }
}
