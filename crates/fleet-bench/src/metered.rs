//! [`MeteredManager`]: a [`UnitManager`] that counts (and optionally times) the calls the
//! agent makes to the one it wraps. Every agent loop wake-up starts with `installed()`, so its
//! count is the agent's passes; the log of call start times lets a probe cut time into passes.

use fleet_agent::{
    ChangeReceiver, InstalledUnit, JobOutcome, ManagerError, ReloadFacts, UnitDetails, UnitManager,
    UnitSource,
};
use fleet_core::{SystemdState, UnitFile, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The calls of [`UnitManager`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Call {
    Installed,
    Install,
    Uninstall,
    Reload,
    Start,
    Stop,
    Status,
    Details,
    Source,
}

const CALLS: usize = 9;

/// One call: what, and when it started.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    pub call: Call,
    pub at: Instant,
}

/// Shared call counts (and, when enabled, the timed log).
#[derive(Debug, Default)]
pub struct CallCounts {
    counts: [AtomicU64; CALLS],
    log: Option<Mutex<Vec<Timed>>>,
}

impl CallCounts {
    pub fn new() -> Arc<CallCounts> {
        Arc::default()
    }

    /// Counts and also keeps every call's start and duration.
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

    fn record(&self, call: Call, at: Instant) {
        self.counts[call as usize].fetch_add(1, Ordering::Relaxed);
        if let Some(log) = &self.log {
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            log.push(Timed { call, at });
        }
    }
}

/// Wraps a [`UnitManager`], counting its calls into a [`CallCounts`].
#[derive(Debug, Clone)]
pub struct MeteredManager<M> {
    inner: M,
    counts: Arc<CallCounts>,
}

impl<M: UnitManager> MeteredManager<M> {
    pub fn new(inner: M, counts: Arc<CallCounts>) -> MeteredManager<M> {
        MeteredManager { inner, counts }
    }

    async fn metered<T>(&self, call: Call, fut: impl Future<Output = T>) -> T {
        let at = Instant::now();
        let out = fut.await;
        self.counts.record(call, at);
        out
    }
}

impl<M: UnitManager> UnitManager for MeteredManager<M> {
    async fn installed(&self) -> Result<Vec<InstalledUnit>, ManagerError> {
        self.metered(Call::Installed, self.inner.installed()).await
    }

    async fn installed_of(&self, names: &[UnitName]) -> Result<Vec<InstalledUnit>, ManagerError> {
        self.metered(Call::Installed, self.inner.installed_of(names))
            .await
    }

    async fn install(&self, name: &UnitName, file: &UnitFile) -> Result<(), ManagerError> {
        self.metered(Call::Install, self.inner.install(name, file))
            .await
    }

    async fn uninstall(&self, name: &UnitName) -> Result<(), ManagerError> {
        self.metered(Call::Uninstall, self.inner.uninstall(name))
            .await
    }

    async fn reload(&self) -> Result<(), ManagerError> {
        self.metered(Call::Reload, self.inner.reload()).await
    }

    async fn start(&self, name: &UnitName) -> Result<JobOutcome, ManagerError> {
        self.metered(Call::Start, self.inner.start(name)).await
    }

    async fn stop(&self, name: &UnitName) -> Result<JobOutcome, ManagerError> {
        self.metered(Call::Stop, self.inner.stop(name)).await
    }

    async fn status(
        &self,
        names: &[UnitName],
    ) -> Result<BTreeMap<UnitName, SystemdState>, ManagerError> {
        self.metered(Call::Status, self.inner.status(names)).await
    }

    async fn details(&self, name: &UnitName) -> Result<UnitDetails, ManagerError> {
        self.metered(Call::Details, self.inner.details(name)).await
    }

    async fn loaded(&self, names: &[UnitName]) -> Result<BTreeSet<UnitName>, ManagerError> {
        self.metered(Call::Status, self.inner.loaded(names)).await
    }

    async fn reload_facts(&self, name: &UnitName) -> Result<ReloadFacts, ManagerError> {
        self.metered(Call::Details, self.inner.reload_facts(name))
            .await
    }

    async fn source(&self, name: &UnitName) -> Result<UnitSource, ManagerError> {
        self.metered(Call::Source, self.inner.source(name)).await
    }

    fn changes(&self) -> ChangeReceiver {
        self.inner.changes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_agent::FakeManager;

    #[tokio::test]
    async fn counts_each_call_of_the_wrapped_manager() {
        let counts = CallCounts::timed();
        let manager = MeteredManager::new(FakeManager::new(), counts.clone());
        manager.installed().await.unwrap();
        let name: UnitName = "a.service".parse().unwrap();
        manager.status(&[name]).await.unwrap();
        assert_eq!(counts.get(Call::Installed), 1);
        assert_eq!(counts.get(Call::Status), 1);
        assert_eq!(counts.get(Call::Start), 0);
        assert_eq!(counts.take_log().len(), 2);
    }
}
