//! [`CallCounts`]: counts (and optionally logs) the calls the agent makes to its
//! [`UnitManager`](fleet_agent::UnitManager), heard through the agent's own
//! [`Metered`](fleet_agent::Metered) wrapper. Every agent loop wake-up starts with
//! `installed()`, so its count is the agent's passes; the log of call start times lets a
//! probe cut time into passes.

use fleet_agent::CallObserver;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub use fleet_agent::metrics::Call;

/// One call: what, and when it started.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    pub call: Call,
    pub at: Instant,
}

/// Shared call counts (and, when enabled, the timed log).
#[derive(Debug, Default)]
pub struct CallCounts {
    counts: [AtomicU64; Call::ALL.len()],
    log: Option<Mutex<Vec<Timed>>>,
}

impl CallCounts {
    pub fn new() -> Arc<CallCounts> {
        Arc::default()
    }

    /// Counts and also keeps every call's start.
    pub fn timed() -> Arc<CallCounts> {
        Arc::new(CallCounts {
            counts: Default::default(),
            log: Some(Mutex::new(Vec::new())),
        })
    }

    pub fn get(&self, call: Call) -> u64 {
        self.counts[call as usize].load(Ordering::Relaxed)
    }

    /// The timed log so far, emptied.
    pub fn take_log(&self) -> Vec<Timed> {
        self.log
            .as_ref()
            .map(|l| std::mem::take(&mut *l.lock().unwrap_or_else(|e| e.into_inner())))
            .unwrap_or_default()
    }
}

impl CallObserver for CallCounts {
    fn called(&self, call: Call, sent: tokio::time::Instant, _failed: bool) {
        self.counts[call as usize].fetch_add(1, Ordering::Relaxed);
        if let Some(log) = &self.log {
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            log.push(Timed {
                call,
                at: sent.into_std(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_agent::{FakeManager, Metered, UnitManager};
    use fleet_core::UnitName;

    #[tokio::test]
    async fn counts_each_call_of_the_wrapped_manager() {
        let counts = CallCounts::timed();
        let manager = Metered::new(FakeManager::new(), counts.clone());
        manager.installed().await.unwrap();
        let name: UnitName = "a.service".parse().unwrap();
        manager.status(&[name]).await.unwrap();
        assert_eq!(counts.get(Call::Installed), 1);
        assert_eq!(counts.get(Call::Status), 1);
        assert_eq!(counts.get(Call::Start), 0);
        assert_eq!(counts.take_log().len(), 2);
    }

    #[test]
    fn each_call_has_its_own_count() {
        let counts = CallCounts::new();
        for (i, call) in Call::ALL.into_iter().enumerate() {
            assert_eq!(call as usize, i, "{call:?} counts in its own place");
        }
        counts.called(Call::Source, tokio::time::Instant::now(), false);
        assert_eq!(counts.get(Call::Source), 1);
    }
}
