//! A delta pass writes the decisions of at most `UNITS_PER_PASS` units (issue 43: in the
//! million, passes that carried a backlog of 12–40 s of writes failed on one transaction past
//! fleetd's deadline, again and again). The units it leaves are planned by the next pass at
//! once, not at the next change or the minute's safety net. On paused time, over the
//! in-memory store, with a hook that holds the leader's schedule writes while a burst of
//! units arrives, so that one delta gets them all.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use fleet_core::{DesiredState, MachineId, MachineInfo, UnitFile};
use fleet_engine::{EngineConfig, UNITS_PER_PASS};
use fleet_registry::kv::{Hook, Hooked, KvError, MemKv, Request, TxnOp};
use fleet_registry::{MachineRole, Registry, UnitsRole};
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, sleep};

const PREFIX: &str = "/pass-share-test/";

/// While `held`, every transaction that writes a schedule entry waits for `release`;
/// counts the schedule entries written, transaction by transaction.
#[derive(Debug, Clone, Default)]
struct HoldSchedules {
    held: Arc<AtomicBool>,
    waiting: Arc<AtomicUsize>,
    release: Arc<Notify>,
}

impl Hook for HoldSchedules {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        let Request::Txn(txn) = request else {
            return Ok(());
        };
        let schedules = txn
            .success
            .iter()
            .any(|op| matches!(op, TxnOp::Put { key, .. } if key.contains("/schedule/")));
        while schedules && self.held.load(Ordering::SeqCst) {
            let released = self.release.notified();
            self.waiting.fetch_add(1, Ordering::SeqCst);
            released.await;
        }
        Ok(())
    }
}

async fn join(reg: &Registry<Hooked<MemKv, HoldSchedules>>, id: &str) {
    let info = MachineInfo {
        id: id.parse().unwrap(),
        public_ip: String::new(),
        metadata: BTreeMap::new(),
        version: "test".into(),
        disable_engine: false,
        api: String::new(),
        fence_at: None,
    };
    MachineRole::new(reg.clone(), id.parse().unwrap())
        .register(&info, Duration::from_secs(3600), None)
        .await
        .unwrap();
}

async fn submit(reg: &Registry<Hooked<MemKv, HoldSchedules>>, unit: &str) {
    let file = UnitFile::parse(format!("[Service]\nExecStart=/bin/echo {unit}\n").as_bytes());
    UnitsRole::new(reg.clone())
        .create_unit(
            &unit.parse().unwrap(),
            &file.unwrap(),
            DesiredState::Launched,
        )
        .await
        .unwrap();
}

async fn scheduled(reg: &Registry<Hooked<MemKv, HoldSchedules>>) -> usize {
    reg.snapshot().await.unwrap().schedule.len()
}

#[tokio::test(start_paused = true)]
async fn units_a_pass_leaves_are_planned_by_the_next_one_at_once() {
    let hook = HoldSchedules::default();
    let kv = Hooked {
        inner: MemKv::new(),
        hook: hook.clone(),
    };
    let reg = Registry::new(kv, PREFIX);
    for m in ["m1", "m2", "m3"] {
        join(&reg, m).await;
    }
    let machine: MachineId = "m1".parse().unwrap();
    let cfg = EngineConfig::new(machine, Duration::from_secs(2));
    let (stop, shutdown) = watch::channel(false);
    let engine = tokio::spawn(fleet_engine::run(reg.clone(), cfg, shutdown));
    submit(&reg, "first.service").await;
    while scheduled(&reg).await < 1 {
        sleep(Duration::from_millis(50)).await;
    }

    // The leader's next pass (for `trigger`) is held in its write while the burst arrives:
    // the pass after it is one delta of every unit of the burst.
    hook.held.store(true, Ordering::SeqCst);
    submit(&reg, "trigger.service").await;
    while hook.waiting.load(Ordering::SeqCst) == 0 {
        sleep(Duration::from_millis(10)).await;
    }
    let burst = UNITS_PER_PASS + 50;
    for i in 0..burst {
        submit(&reg, &format!("bulk{i}.service")).await;
    }
    hook.held.store(false, Ordering::SeqCst);
    hook.release.notify_waiters();

    // Well before the minute's safety net: nothing else would start a pass for the 50.
    let released = Instant::now();
    let all = burst + 2;
    while scheduled(&reg).await < all {
        assert!(
            released.elapsed() < Duration::from_secs(10),
            "{} of {all} units scheduled 10 s after the burst",
            scheduled(&reg).await
        );
        sleep(Duration::from_millis(100)).await;
    }
    stop.send(true).unwrap();
    engine.await.unwrap();
}
