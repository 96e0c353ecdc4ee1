//! An engine leader whose lease renewals fail for a while, as they did when etcd was
//! saturated in the million (docs/benchmarks.md, section 7, item 9): it asks again soon
//! after each failure, so one renewal that gets through before the lease ends keeps it
//! leading, on the same lease, without a new campaign. On paused time, over the in-memory
//! store with a hook that fails renewals as a deadline would.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_core::MachineId;
use fleet_engine::EngineConfig;
use fleet_registry::Registry;
use fleet_registry::kv::{Hook, Hooked, Kv, KvError, MemKv, Request};
use tokio::sync::watch;
use tokio::time::{Instant, sleep};

const PREFIX: &str = "/renewal-test/";

/// Counts lease grants (one per campaign); fails every renewal sent within `failing` of the
/// first grant, as a request past its deadline, and counts them.
#[derive(Debug, Clone)]
struct FailRenewals {
    granted: Arc<Mutex<Option<Instant>>>,
    failing: std::ops::Range<Duration>,
    grants: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
}

impl Hook for FailRenewals {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        match request {
            Request::Grant => {
                self.grants.fetch_add(1, Ordering::Relaxed);
                self.granted
                    .lock()
                    .unwrap()
                    .get_or_insert_with(Instant::now);
            }
            Request::KeepAlive { .. } => {
                let granted = *self.granted.lock().unwrap();
                if granted.is_some_and(|at| self.failing.contains(&at.elapsed())) {
                    self.failed.fetch_add(1, Ordering::Relaxed);
                    return Err(KvError::Timeout(Duration::from_secs(1), "memory".into()));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewals_fail_retries_soon_and_keeps_its_lease() {
    // The lease is 10 s (5 reconcile intervals): renewals are due at 3.3 s and 6.7 s. Both
    // fail, and so does everything until 7.5 s; a renewal due only a third later (10 s)
    // finds the lease gone.
    let hook = FailRenewals {
        granted: Arc::default(),
        failing: Duration::from_secs(1)..Duration::from_millis(7_500),
        grants: Arc::default(),
        failed: Arc::default(),
    };
    let kv = Hooked {
        inner: MemKv::new(),
        hook: hook.clone(),
    };
    let reg = Registry::new(kv.clone(), PREFIX);
    let machine: MachineId = "m1".parse().unwrap();
    let cfg = EngineConfig::new(machine.clone(), Duration::from_secs(2));
    assert_eq!(cfg.lease_ttl, Duration::from_secs(10));
    let (stop, shutdown) = watch::channel(false);
    let engine = tokio::spawn(fleet_engine::run(reg.clone(), cfg, shutdown));

    let leader_lease = || async {
        let key = reg.keys().leader();
        let res = kv.range(&key, false, None).await.unwrap();
        res.kvs.first().map(|kv| kv.lease)
    };
    while reg.leader().await.unwrap().is_none() {
        sleep(Duration::from_millis(50)).await;
    }
    let lease = leader_lease().await.expect("the leader key is on a lease");

    // Polled through the failures and well past the lease's first end.
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        assert_eq!(reg.leader().await.unwrap(), Some(machine.clone()));
        assert_eq!(
            leader_lease().await,
            Some(lease),
            "the leader's lease changed"
        );
        sleep(Duration::from_millis(100)).await;
    }
    let failed = hook.failed.load(Ordering::Relaxed);
    // 3.3 s, then every 250 ms to 7.5 s: the retries are what kept the lease.
    assert!(failed >= 10, "only {failed} renewals failed");
    assert_eq!(
        hook.grants.load(Ordering::Relaxed),
        1,
        "the engine campaigned again"
    );
    stop.send(true).unwrap();
    engine.await.unwrap();
}
