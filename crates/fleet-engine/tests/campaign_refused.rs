//! An engine whose campaign etcd refuses (this host's etcd user lacks the engine role):
//! retried slowly, never crashing, and leading once etcd permits it. On paused time, over
//! the in-memory store with a hook that refuses the leader key as etcd's RBAC would.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use fleet_core::MachineId;
use fleet_engine::{EngineConfig, REFUSED_RETRY_MAX};
use fleet_registry::Registry;
use fleet_registry::kv::{Hook, Hooked, KvError, MemKv, Request, TxnOp};
use tokio::sync::watch;
use tokio::time::{Instant, sleep};

const PREFIX: &str = "/campaign-test/";

/// Refuses, while `denied`, every transaction writing the leader key; counts lease grants
/// (one per campaign).
#[derive(Debug, Clone, Default)]
struct DenyLeader {
    denied: Arc<AtomicBool>,
    grants: Arc<AtomicUsize>,
}

impl Hook for DenyLeader {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        match request {
            Request::Grant => {
                self.grants.fetch_add(1, Ordering::Relaxed);
            }
            Request::Txn(txn) if self.denied.load(Ordering::Relaxed) => {
                let leader = format!("{PREFIX}engine/leader");
                let writes_leader = txn.success.iter().any(|op| {
                    matches!(op, TxnOp::Put { key, .. } | TxnOp::Delete { key, .. } if *key == leader)
                });
                if writes_leader {
                    return Err(KvError::PermissionDenied {
                        user: "fleet-host-m1".into(),
                        what: format!("write {leader}"),
                    });
                }
            }
            _ => {}
        }
        Ok(())
    }
}

fn machine(s: &str) -> MachineId {
    s.parse().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_refused_campaign_is_retried_slowly_and_leads_once_permitted() {
    let hook = DenyLeader::default();
    hook.denied.store(true, Ordering::Relaxed);
    let kv = Hooked {
        inner: MemKv::new(),
        hook: hook.clone(),
    };
    let reg = Registry::new(kv, PREFIX);
    let cfg = EngineConfig::new(machine("m1"), Duration::from_secs(2));
    let (stop, shutdown) = watch::channel(false);
    let engine = tokio::spawn(fleet_engine::run(reg.clone(), cfg, shutdown));

    sleep(Duration::from_secs(600)).await;
    let tries = hook.grants.load(Ordering::Relaxed);
    // Every 2 s (the reconcile interval) would be 300 tries; backing off to a minute, with
    // jitter, is a few dozen at most.
    assert!((3..=60).contains(&tries), "{tries} campaigns in 10 minutes");
    assert!(!engine.is_finished(), "the engine gave up");
    assert_eq!(reg.leader().await.unwrap(), None);

    hook.denied.store(false, Ordering::Relaxed);
    let permitted = Instant::now();
    while reg.leader().await.unwrap().is_none() {
        assert!(
            permitted.elapsed() <= REFUSED_RETRY_MAX + Duration::from_secs(1),
            "not leading a retry after etcd permitted it"
        );
        sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(reg.leader().await.unwrap(), Some(machine("m1")));
    stop.send(true).unwrap();
    engine.await.unwrap();
}
