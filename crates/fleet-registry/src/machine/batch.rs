//! A machine's writes and reads of any size, cut to etcd's transaction limit here so that no
//! caller does it: the agent publishes the states of a thousand units, withdraws those of a
//! destroyed batch, and fetches the files of its schedule, each as one call.
//!
//! Each batch goes out as transactions of at most [`MAX_TXN_OPS`] operations, [`IN_FLIGHT`]
//! of them at a time: a machine given 1,000 units publishes 8 transactions, not 1,000, and
//! does not wait for each before sending the next. A state record is small (well under a
//! kilobyte), so [`MAX_TXN_OPS`] of them stay far below etcd's request size.
//!
//! What a batch does not do: retry, or decide what a failure means. Each transaction succeeds
//! or fails on its own, and the [`Batch`] says which items went out and why the others did
//! not; the caller keeps what went out and tries the rest again when it chooses.

use fleet_core::{UnitFile, UnitHash, UnitName};
use futures::{Stream, StreamExt};

use super::{MachineRole, Presence};
use crate::EventSink;
use crate::error::{RegistryError, Result};
use crate::events::Event;
use crate::events::log::Boarding;
use crate::kv::{Kv, MAX_TXN_OPS};
use crate::records::UnitStateRecord;

/// Transactions of one batch in flight at once.
pub const IN_FLIGHT: usize = 4;

/// What became of a batch: the items whose transaction succeeded, and for each transaction
/// that failed, how many items it held and the error.
#[derive(Debug)]
pub struct Batch<T> {
    pub done: Vec<T>,
    pub failed: Vec<(usize, RegistryError)>,
}

impl<T> Batch<T> {
    /// Whether every item went out.
    pub fn complete(&self) -> bool {
        self.failed.is_empty()
    }
}

/// The files of one request of [`MachineRole::files_batched`]: each hash with its file, `None`
/// when the registry has none, or the error of reading that one record.
pub type Files = Vec<(UnitHash, Result<Option<UnitFile>>)>;

impl<K: Kv> MachineRole<K> {
    /// Publishes `states` (all of this machine) on `presence`'s lease, however many:
    /// [`MAX_TXN_OPS`] to a transaction, [`IN_FLIGHT`] transactions at a time.
    pub async fn publish_batch(
        &self,
        presence: &Presence,
        states: Vec<UnitStateRecord>,
    ) -> Batch<UnitStateRecord> {
        in_chunks(states, |chunk| async move {
            let res = self.publish_states(presence, &chunk).await;
            (chunk, res)
        })
        .await
    }

    /// [`publish_batch`](Self::publish_batch), with `events` aboard the batch's last (least
    /// full) transaction as far as it has room and the writer of `sink` a current lease
    /// ([`EventSink::board`]); the rest go to that writer. With 100,000 units on 5,000
    /// machines, the agents' event transactions of their own were a third of the launch's
    /// requests (issue 41). A lost event never fails the publish: if the transaction fails
    /// for a lease gone (which may be the events') or a refusal (a host's role without the
    /// events' prefix), it is sent again without them, and they go to the writer.
    pub async fn publish_batch_with_events(
        &self,
        presence: &Presence,
        mut states: Vec<UnitStateRecord>,
        sink: &EventSink,
        events: Vec<Event>,
    ) -> Batch<UnitStateRecord> {
        let last_len = match states.len() {
            0 => 0,
            n => (n - 1) % MAX_TXN_OPS + 1,
        };
        let last = states.split_off(states.len() - last_len);
        let boarding = match last_len {
            0 => {
                for event in events {
                    sink.emit(event);
                }
                None
            }
            n => sink.board(events, MAX_TXN_OPS - n),
        };
        let aboard = async {
            if last.is_empty() {
                return Batch {
                    done: Vec::new(),
                    failed: Vec::new(),
                };
            }
            let res = self.publish_aboard(presence, &last, sink, boarding).await;
            match res {
                Ok(()) => Batch {
                    done: last,
                    failed: Vec::new(),
                },
                Err(e) => Batch {
                    done: Vec::new(),
                    failed: vec![(last.len(), e)],
                },
            }
        };
        let (mut batch, aboard) = futures::join!(self.publish_batch(presence, states), aboard);
        batch.done.extend(aboard.done);
        batch.failed.extend(aboard.failed);
        batch
    }

    /// Publishes `states` with `boarding`'s events in one transaction; once more without
    /// them if a lease was gone.
    async fn publish_aboard(
        &self,
        presence: &Presence,
        states: &[UnitStateRecord],
        sink: &EventSink,
        boarding: Option<Boarding>,
    ) -> Result<()> {
        let Some(boarding) = boarding else {
            return self.publish_states(presence, states).await;
        };
        let ops = boarding.ops.clone();
        match self.publish_states_with(presence, states, ops).await {
            Ok(()) => {
                sink.landed(boarding);
                Ok(())
            }
            Err(RegistryError::Kv { op, cause }) => {
                let again = EventSink::resend_without(&cause);
                sink.missed(boarding, &cause);
                if !again {
                    return Err(RegistryError::Kv { op, cause });
                }
                self.publish_states(presence, states).await
            }
            Err(e) => {
                // Refused before anything was sent: the events go to the writer.
                sink.unsent(boarding);
                Err(e)
            }
        }
    }

    /// Withdraws the states of `names` on this machine, however many: [`MAX_TXN_OPS`] to a
    /// transaction, [`IN_FLIGHT`] transactions at a time.
    pub async fn withdraw_batch(&self, names: Vec<UnitName>) -> Batch<UnitName> {
        in_chunks(names, |chunk| async move {
            let res = self.remove_states(&chunk).await;
            (chunk, res)
        })
        .await
    }

    /// The files of `hashes`, however many: [`MAX_TXN_OPS`] to a request, [`IN_FLIGHT`]
    /// requests at a time, each request's files as it answers. A caller that stops at the
    /// first error keeps what came before it.
    pub fn files_batched(
        &self,
        hashes: &[UnitHash],
    ) -> impl Stream<Item = Result<Files>> + Send + '_ {
        // Owned chunks: a stream of borrowed ones makes the caller's future not `Send`.
        let chunks: Vec<Vec<UnitHash>> = hashes.chunks(MAX_TXN_OPS).map(<[_]>::to_vec).collect();
        futures::stream::iter(chunks)
            .map(move |chunk| async move { self.files(&chunk).await })
            .buffer_unordered(IN_FLIGHT)
    }
}

/// Sends `items` as chunks of [`MAX_TXN_OPS`] through `send`, [`IN_FLIGHT`] at a time.
async fn in_chunks<T, F, Fut>(items: Vec<T>, send: F) -> Batch<T>
where
    T: Clone,
    F: Fn(Vec<T>) -> Fut,
    Fut: Future<Output = (Vec<T>, Result<()>)>,
{
    let chunks: Vec<Vec<T>> = items.chunks(MAX_TXN_OPS).map(<[_]>::to_vec).collect();
    let sent: Vec<(Vec<T>, Result<()>)> = futures::stream::iter(chunks)
        .map(send)
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let mut batch = Batch {
        done: Vec::new(),
        failed: Vec::new(),
    };
    for (chunk, res) in sent {
        match res {
            Ok(()) => batch.done.extend(chunk),
            Err(e) => batch.failed.push((chunk.len(), e)),
        }
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{Hook, Hooked, KvError, MemKv, Request, TxnOp};
    use crate::registry::Registry;
    use fleet_core::{MachineId, MachineInfo, SystemdState};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Counts transactions and fails the `fail_nth` one (1-based; 0: none).
    #[derive(Clone, Default)]
    struct Txns {
        seen: Arc<AtomicUsize>,
        fail_nth: usize,
    }

    impl Hook for Txns {
        async fn before(&self, request: Request<'_>) -> std::result::Result<(), KvError> {
            let Request::Txn(txn) = request else {
                return Ok(());
            };
            // Only the batch's own writes: registering the machine is not counted.
            let of_states = |op: &TxnOp| match op {
                TxnOp::Put { key, .. } | TxnOp::Delete { key, .. } => key.contains("unit-state"),
                TxnOp::Get { .. } => false,
            };
            if !txn.success.iter().any(of_states) {
                return Ok(());
            }
            let n = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
            if n == self.fail_nth {
                return Err(KvError::Unavailable {
                    endpoints: "mem".into(),
                    detail: "the hook's failure".into(),
                });
            }
            Ok(())
        }
    }

    fn m1() -> MachineId {
        "m1".parse().unwrap()
    }

    fn state(i: usize) -> UnitStateRecord {
        UnitStateRecord {
            name: format!("u{i:05}.service").parse().unwrap(),
            machine: m1(),
            hash: None,
            systemd: SystemdState::not_found(),
            drop_ins: Vec::new(),
            restart: 0,
            restart_pending: false,
            restarts: 0,
            since: None,
            exit: None,
        }
    }

    async fn role(hook: Txns) -> (MachineRole<Hooked<MemKv, Txns>>, Presence) {
        let kv = Hooked {
            inner: MemKv::new(),
            hook,
        };
        let role = MachineRole::new(Registry::new(kv, "/t/"), m1());
        let info = MachineInfo {
            id: m1(),
            public_ip: String::new(),
            metadata: Default::default(),
            version: "test".into(),
            disable_engine: true,
            api: String::new(),
            fence_at: None,
        };
        let presence = role
            .register(&info, Duration::from_secs(30), None)
            .await
            .unwrap();
        (role, presence)
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_of_any_size_goes_out_in_transactions_of_the_limit() {
        let hook = Txns::default();
        let (role, presence) = role(hook.clone()).await;
        let states: Vec<UnitStateRecord> = (0..2 * MAX_TXN_OPS + 1).map(state).collect();
        let batch = role.publish_batch(&presence, states).await;
        assert!(batch.complete());
        assert_eq!(batch.done.len(), 2 * MAX_TXN_OPS + 1);
        assert_eq!(hook.seen.load(Ordering::SeqCst), 3);
        let published = role.published_states().await.unwrap().items;
        assert_eq!(published.len(), 2 * MAX_TXN_OPS + 1);

        let names: Vec<UnitName> = published.into_iter().map(|s| s.name).collect();
        let batch = role.withdraw_batch(names).await;
        assert!(batch.complete());
        assert_eq!(hook.seen.load(Ordering::SeqCst), 6);
        assert!(role.published_states().await.unwrap().items.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_transaction_fails_only_its_own_items() {
        let hook = Txns {
            fail_nth: 2,
            ..Txns::default()
        };
        let (role, presence) = role(hook).await;
        let states: Vec<UnitStateRecord> = (0..MAX_TXN_OPS + 5).map(state).collect();
        let batch = role.publish_batch(&presence, states).await;
        assert!(!batch.complete());
        assert_eq!(batch.failed.len(), 1);
        let (count, _) = &batch.failed[0];
        assert_eq!(batch.done.len() + count, MAX_TXN_OPS + 5);
        let published = role.published_states().await.unwrap().items;
        assert_eq!(published.len(), batch.done.len());
    }

    #[tokio::test(start_paused = true)]
    async fn files_of_any_number_come_in_requests_of_the_limit() {
        let (role, _) = role(Txns::default()).await;
        let hashes: Vec<UnitHash> = (0..MAX_TXN_OPS + 1)
            .map(|i| {
                UnitFile::parse(format!("[Service]\nExecStart=/bin/x{i}\n").as_bytes())
                    .unwrap()
                    .hash()
            })
            .collect();
        let answers: Vec<Result<Files>> = role.files_batched(&hashes).collect().await;
        assert_eq!(answers.len(), 2);
        let files: Vec<(UnitHash, Result<Option<UnitFile>>)> =
            answers.into_iter().flat_map(Result::unwrap).collect();
        assert_eq!(files.len(), MAX_TXN_OPS + 1);
        assert!(files.iter().all(|(_, f)| matches!(f, Ok(None))));
    }
}
