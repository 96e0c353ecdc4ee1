//! Matching systemd's `JobRemoved` signals to the start and stop calls waiting for them.
//!
//! One task drains the signal stream for the whole connection (an undrained zbus stream would
//! stall the connection) and hands each result to its waiter. A job can end before the call
//! that queued it has its reply, so results that arrive while a job call is in flight are kept
//! until the caller registers; outside such calls, results of other clients' jobs are dropped.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::oneshot;

/// Most early results kept; older ones are dropped first (another client's jobs, in practice).
const MAX_EARLY: usize = 4096;

#[derive(Debug, Default)]
struct State {
    /// Job calls between being sent and registering their job path.
    in_flight: usize,
    waiting: HashMap<String, oneshot::Sender<String>>,
    early: HashMap<String, String>,
    early_order: VecDeque<String>,
    closed: bool,
}

/// The waiters of one connection.
#[derive(Debug, Default)]
pub(super) struct JobWaiters {
    state: Mutex<State>,
}

/// What a caller gets when it registers its job.
#[derive(Debug)]
pub(super) enum Registered {
    /// The result was already there.
    Ended(String),
    Wait(oneshot::Receiver<String>),
    /// The signal stream is gone; no result will come.
    Closed,
}

impl JobWaiters {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Call before queuing a job, so its result is kept even if it ends before the reply.
    pub(super) fn expect(self: &Arc<Self>) -> Expectation {
        self.lock().in_flight += 1;
        Expectation {
            waiters: Arc::clone(self),
        }
    }

    /// A `JobRemoved` signal.
    pub(super) fn finish(&self, job: &str, result: &str) {
        let mut state = self.lock();
        if let Some(waiter) = state.waiting.remove(job) {
            // The waiter may have timed out and gone; nothing to do then.
            let _ = waiter.send(result.to_owned());
            return;
        }
        if state.in_flight == 0 {
            return;
        }
        if state.early.len() >= MAX_EARLY
            && let Some(oldest) = state.early_order.pop_front()
        {
            state.early.remove(&oldest);
        }
        state.early.insert(job.to_owned(), result.to_owned());
        state.early_order.push_back(job.to_owned());
    }

    /// A waiter gave up (timeout); forget its job.
    pub(super) fn forget(&self, job: &str) {
        self.lock().waiting.remove(job);
    }

    /// The signal stream ended: wake every waiter with "closed".
    pub(super) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.waiting.clear();
    }
}

/// A job call in flight; [`Expectation::register`] it once the job path is known.
#[derive(Debug)]
pub(super) struct Expectation {
    waiters: Arc<JobWaiters>,
}

impl Expectation {
    pub(super) fn register(self, job: &str) -> Registered {
        let mut state = self.waiters.lock();
        if let Some(result) = state.early.remove(job) {
            return Registered::Ended(result);
        }
        if state.closed {
            return Registered::Closed;
        }
        let (tx, rx) = oneshot::channel();
        state.waiting.insert(job.to_owned(), tx);
        Registered::Wait(rx)
    }
}

impl Drop for Expectation {
    fn drop(&mut self) {
        let mut state = self.waiters.lock();
        state.in_flight -= 1;
        if state.in_flight == 0 {
            state.early.clear();
            state.early_order.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = "/org/freedesktop/systemd1/job/7";

    #[tokio::test]
    async fn hands_a_result_to_its_registered_waiter() {
        let waiters = Arc::new(JobWaiters::default());
        let Registered::Wait(rx) = waiters.expect().register(JOB) else {
            panic!("expected to wait");
        };
        waiters.finish("/org/freedesktop/systemd1/job/6", "failed");
        waiters.finish(JOB, "done");
        assert_eq!(rx.await.unwrap(), "done");
    }

    #[test]
    fn keeps_a_result_that_arrives_before_the_reply() {
        let waiters = Arc::new(JobWaiters::default());
        let expectation = waiters.expect();
        waiters.finish(JOB, "done");
        assert!(matches!(expectation.register(JOB), Registered::Ended(r) if r == "done"));
        assert!(waiters.lock().early.is_empty());
    }

    #[test]
    fn drops_results_nobody_can_be_waiting_for() {
        let waiters = Arc::new(JobWaiters::default());
        waiters.finish(JOB, "done");
        assert!(waiters.lock().early.is_empty());
        let expectation = waiters.expect();
        waiters.finish(JOB, "done");
        drop(expectation);
        assert!(waiters.lock().early.is_empty());
    }

    #[test]
    fn bounds_the_early_results() {
        let waiters = Arc::new(JobWaiters::default());
        let _expectation = waiters.expect();
        for i in 0..MAX_EARLY + 10 {
            waiters.finish(&format!("/job/{i}"), "done");
        }
        let state = waiters.lock();
        assert_eq!(state.early.len(), MAX_EARLY);
        assert!(!state.early.contains_key("/job/0"));
    }

    #[tokio::test]
    async fn tells_waiters_when_the_signals_are_gone() {
        let waiters = Arc::new(JobWaiters::default());
        let Registered::Wait(rx) = waiters.expect().register(JOB) else {
            panic!("expected to wait");
        };
        waiters.close();
        assert!(rx.await.is_err());
        assert!(matches!(waiters.expect().register(JOB), Registered::Closed));
    }
}
