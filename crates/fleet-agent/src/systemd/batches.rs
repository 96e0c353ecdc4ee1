//! Group commit for calls systemd takes as a list: while one call is in flight, the callers
//! that arrive queue their item, and the next of them makes one call for all of them.
//!
//! Each `DisableUnitFiles` makes PID 1 search its unit directories for the links of the files
//! it names, once per call, whatever their number; the agent's unloads disable one unit each,
//! up to [`crate::executor`]'s concurrency at once. Batched, a destroy of 100 units on one
//! machine makes a handful of those calls instead of 100.

use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use tokio::sync::oneshot;

/// Items waiting for the next call, and the gate held by the caller whose call is in flight.
#[derive(Debug)]
pub(super) struct Batches<T, R> {
    pending: Mutex<Vec<(T, oneshot::Sender<R>)>>,
    gate: tokio::sync::Mutex<()>,
}

impl<T, R> Default for Batches<T, R> {
    fn default() -> Self {
        Batches {
            pending: Mutex::new(Vec::new()),
            gate: tokio::sync::Mutex::new(()),
        }
    }
}

impl<T, R> Batches<T, R> {
    fn lock(&self) -> MutexGuard<'_, Vec<(T, oneshot::Sender<R>)>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `item`'s result, from a call of `call` with every item waiting when this caller's turn
    /// came (or an earlier caller's call that took `item` along). `call` answers its items in
    /// their order. `None` when the caller that took `item` was dropped mid-call, or `call`
    /// answered fewer items: the caller then makes the call for `item` alone.
    pub(super) async fn run<F, Fut>(&self, item: T, call: F) -> Option<R>
    where
        F: FnOnce(Vec<T>) -> Fut,
        Fut: Future<Output = Vec<R>>,
    {
        let (tx, rx) = oneshot::channel();
        self.lock().push((item, tx));
        {
            let _gate = self.gate.lock().await;
            // Empty when an earlier caller's call took this item: its answer is in `rx`.
            let batch = std::mem::take(&mut *self.lock());
            if !batch.is_empty() {
                let (items, answers): (Vec<T>, Vec<_>) = batch.into_iter().unzip();
                let results = call(items).await;
                for (answer, result) in answers.into_iter().zip(results) {
                    let _ = answer.send(result);
                }
            }
        }
        rx.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn callers_that_arrive_during_a_call_share_the_next_one() {
        let batches = Arc::new(Batches::<u32, u32>::default());
        let calls = Arc::new(Mutex::new(Vec::new()));
        let run = |item: u32| {
            let (batches, calls) = (batches.clone(), calls.clone());
            tokio::spawn(async move {
                batches
                    .run(item, |items| async move {
                        calls.lock().unwrap().push(items.clone());
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        items.iter().map(|i| i * 10).collect()
                    })
                    .await
            })
        };
        let first = run(1);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let rest: Vec<_> = (2..=5).map(run).collect();
        assert_eq!(first.await.unwrap(), Some(10));
        for (i, r) in (2..=5).zip(rest) {
            assert_eq!(r.await.unwrap(), Some(i * 10));
        }
        let calls = calls.lock().unwrap().clone();
        assert_eq!(calls, vec![vec![1], vec![2, 3, 4, 5]]);
    }

    #[tokio::test]
    async fn an_item_the_call_did_not_answer_is_none() {
        let batches = Batches::<u32, u32>::default();
        let got = batches.run(7, |_| async { Vec::new() }).await;
        assert_eq!(got, None);
    }
}
