//! The writer's linger, on the in-memory store and paused time: events that come close
//! together share a transaction, one alone waits no longer than the linger, and a close
//! writes at once.

use std::sync::{Arc, Mutex};

use super::*;
use crate::events::EventKind;
use crate::kv::{Hook, Hooked, KvError, MemKv, Request};
use crate::{EventStats, MachineRole};
use fleet_core::{MachineId, UnitName};

/// Counts transactions, with when each was sent.
#[derive(Debug, Clone, Default)]
struct Txns(Arc<Mutex<Vec<Instant>>>);

impl Hook for Txns {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        if let Request::Txn(_) = request {
            self.0.lock().unwrap().push(Instant::now());
        }
        Ok(())
    }
}

fn log(txns: &Txns) -> EventLog {
    let kv = Hooked {
        inner: MemKv::new(),
        hook: txns.clone(),
    };
    let machine: MachineId = "m1".parse().unwrap();
    MachineRole::new(Registry::new(kv, "/t/"), machine)
        .event_log(EventConfig::default(), EventStats::default())
}

fn started(i: usize) -> Event {
    let unit: UnitName = format!("u{i}.service").parse().unwrap();
    Event::now(EventKind::Started, "").unit(&unit)
}

#[tokio::test(start_paused = true)]
async fn events_within_the_linger_share_one_transaction() {
    let txns = Txns::default();
    let log = log(&txns);
    let t0 = Instant::now();
    for i in 0..10 {
        log.sink().emit(started(i));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(EventConfig::DEFAULT_LINGER * 2).await;
    let sent = txns.0.lock().unwrap().clone();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(sent[0] - t0 <= EventConfig::DEFAULT_LINGER + Duration::from_millis(1));
    assert_eq!(log.sink().stats().get("written"), 10);
}

#[tokio::test(start_paused = true)]
async fn events_further_apart_than_the_linger_each_go_alone() {
    let txns = Txns::default();
    let log = log(&txns);
    for i in 0..3 {
        log.sink().emit(started(i));
        tokio::time::sleep(EventConfig::DEFAULT_LINGER * 2).await;
    }
    assert_eq!(txns.0.lock().unwrap().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_close_writes_what_is_queued_without_waiting_the_linger() {
    let txns = Txns::default();
    let log = log(&txns);
    let sink = log.sink();
    sink.emit(started(0));
    sink.emit(started(1));
    let t0 = Instant::now();
    log.close(Duration::from_secs(10)).await;
    assert!(
        t0.elapsed() < EventConfig::DEFAULT_LINGER,
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(txns.0.lock().unwrap().len(), 1);
    assert_eq!(sink.stats().get("written"), 2);
}
