//! An [`Inspector`] for tests: canned status, journals fed by the test through a channel,
//! and a record of every call, so a test can tell what ran (and that nothing did).
//!
//! A journal stream ends when the test drops the journal's sender (as journalctl ends
//! without `--follow`), and [`FakeInspector::wait_journal_dropped`] tells when the stream
//! itself was dropped (as the real side kills journalctl then).

use bytes::Bytes;
use fleet_core::UnitName;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, mpsc};

use super::{InspectError, InspectFuture, Inspector, JournalRequest, JournalStream, StatusReport};

/// One call the routes made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Status {
        unit: UnitName,
        lines: u32,
    },
    Journal {
        unit: UnitName,
        request: JournalRequest,
    },
}

#[derive(Debug, Default)]
struct State {
    calls: Vec<Call>,
    /// Senders of the journals asked for, in order, until the test takes them.
    journals: Vec<mpsc::UnboundedSender<Bytes>>,
    /// Journal streams dropped so far.
    dropped: usize,
    fail: bool,
    /// While set, each status waits for a permit of it (a slow `systemctl status`).
    status_gate: Option<Arc<tokio::sync::Semaphore>>,
}

/// Clones share their state.
#[derive(Debug, Clone, Default)]
pub struct FakeInspector {
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
}

impl FakeInspector {
    pub fn new() -> FakeInspector {
        FakeInspector::default()
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// Holds every status from now on until the returned gate gives it a permit.
    pub fn hold_statuses(&self) -> Arc<tokio::sync::Semaphore> {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        self.lock().status_gate = Some(gate.clone());
        gate
    }

    /// Every call fails from now on (`systemctl` could not be run).
    pub fn fail(&self, fail: bool) {
        self.lock().fail = fail;
    }

    /// The sender of the next journal asked for, once asked: what it sends is the body;
    /// dropping it ends the journal.
    pub async fn next_journal(&self) -> mpsc::UnboundedSender<Bytes> {
        loop {
            let notified = self.changed.notified();
            {
                let mut state = self.lock();
                if !state.journals.is_empty() {
                    return state.journals.remove(0);
                }
            }
            notified.await;
        }
    }

    /// Returns once `count` journal streams have been dropped.
    pub async fn wait_journal_dropped(&self, count: usize) {
        loop {
            let notified = self.changed.notified();
            if self.lock().dropped >= count {
                return;
            }
            notified.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, call: Call) -> Result<(), InspectError> {
        let mut state = self.lock();
        state.calls.push(call);
        if state.fail {
            return Err(InspectError::Spawn {
                program: "systemctl",
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        }
        Ok(())
    }
}

/// Counts the stream's drop in the fake's state.
#[derive(Debug)]
struct DropMark(FakeInspector);

impl Drop for DropMark {
    fn drop(&mut self) {
        self.0.lock().dropped += 1;
        self.0.changed.notify_waiters();
    }
}

impl Inspector for FakeInspector {
    fn status<'a>(&'a self, unit: &'a UnitName, lines: u32) -> InspectFuture<'a, StatusReport> {
        Box::pin(async move {
            self.record(Call::Status {
                unit: unit.clone(),
                lines,
            })?;
            let gate = self.lock().status_gate.clone();
            if let Some(gate) = gate {
                gate.acquire().await.map(|p| p.forget()).ok();
            }
            Ok(StatusReport {
                text: format!("● {unit}\n   Active: active (running)\n"),
                properties: BTreeMap::from([
                    ("ActiveState".to_owned(), "active".to_owned()),
                    ("Id".to_owned(), unit.to_string()),
                ]),
            })
        })
    }

    fn journal<'a>(
        &'a self,
        unit: &'a UnitName,
        request: JournalRequest,
    ) -> InspectFuture<'a, JournalStream> {
        Box::pin(async move {
            self.record(Call::Journal {
                unit: unit.clone(),
                request,
            })?;
            let (tx, rx) = mpsc::unbounded_channel();
            self.lock().journals.push(tx);
            self.changed.notify_waiters();
            let mark = DropMark(self.clone());
            let stream = futures::stream::unfold((rx, mark), |(mut rx, mark)| async move {
                let chunk = rx.recv().await?;
                Some((Ok(chunk), (rx, mark)))
            });
            Ok(Box::pin(stream) as JournalStream)
        })
    }
}
