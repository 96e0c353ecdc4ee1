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

/// A machine registered on a store counting its transactions, and its event writer.
type Reg = Registry<Hooked<MemKv, Txns>>;

async fn machine(
    txns: &Txns,
) -> (
    Reg,
    MachineRole<Hooked<MemKv, Txns>>,
    crate::Presence,
    EventLog,
) {
    let kv = Hooked {
        inner: MemKv::new(),
        hook: txns.clone(),
    };
    let registry = Registry::new(kv, "/t/");
    let role = MachineRole::new(registry.clone(), "m1".parse().unwrap());
    let presence = register(&role).await;
    let log = role.event_log(EventConfig::default(), EventStats::default());
    (registry, role, presence, log)
}

/// Registers `role`'s machine for a TTL of 30 s.
async fn register<K: crate::kv::Kv>(role: &MachineRole<K>) -> crate::Presence {
    let info = fleet_core::MachineInfo {
        id: role.machine().clone(),
        public_ip: String::new(),
        metadata: Default::default(),
        version: "test".into(),
        disable_engine: true,
        api: String::new(),
        fence_at: None,
    };
    role.register(&info, Duration::from_secs(30), None)
        .await
        .unwrap()
}

/// Machine m1 as a host whose etcd role predates the events' prefix (`fleetctl auth setup`
/// not run again since issue 41), its refusals counted by `denials`.
fn host_refused_events(denials: Denials) -> MachineRole<Hooked<crate::kv::Rbac<MemKv>, Denials>> {
    let machine: MachineId = "m1".parse().unwrap();
    let keys = crate::Keys::new("/t/");
    let mut role = crate::rbac::machine(&keys, &machine);
    role.permissions
        .retain(|p| !p.key.starts_with(&keys.events()));
    let kv = Hooked {
        inner: crate::kv::Rbac::new(MemKv::new(), "fleet-host-m1", vec![role]),
        hook: denials,
    };
    MachineRole::new(Registry::new(kv, "/t/"), machine)
}

fn state(i: usize) -> crate::UnitStateRecord {
    crate::UnitStateRecord {
        name: format!("u{i}.service").parse().unwrap(),
        machine: "m1".parse().unwrap(),
        hash: None,
        systemd: fleet_core::SystemdState::not_found(),
        drop_ins: Vec::new(),
        restart: 0,
        restart_pending: false,
        restarts: 0,
        since: None,
        exit: None,
    }
}

async fn events_written(registry: &Reg) -> usize {
    let filter = crate::EventFilter {
        unit: None,
        machine: None,
        since: None,
    };
    registry.events(&filter).await.unwrap().items.len()
}

/// Issue 41: an agent's events used to take a transaction of their own next to its states'
/// (a third of the launch's requests at 100,000 units). Once the writer holds a lease, they
/// ride in the publish.
#[tokio::test(start_paused = true)]
async fn events_ride_in_the_publish_of_states_once_the_writer_holds_a_lease() {
    let txns = Txns::default();
    let (registry, role, presence, log) = machine(&txns).await;
    let sink = log.sink();
    // No lease yet: the publish carries no events, the writer takes them and a lease.
    let batch = role
        .publish_batch_with_events(&presence, vec![state(0)], &sink, vec![started(0)])
        .await;
    assert!(batch.complete());
    tokio::time::sleep(EventConfig::DEFAULT_LINGER * 2).await;
    assert_eq!(sink.stats().get("written"), 1);
    assert_eq!(events_written(&registry).await, 1);

    let before = txns.0.lock().unwrap().len();
    let batch = role
        .publish_batch_with_events(
            &presence,
            vec![state(1), state(2)],
            &sink,
            vec![started(1), started(2), started(3)],
        )
        .await;
    assert!(batch.complete());
    assert_eq!(batch.done.len(), 2);
    assert_eq!(txns.0.lock().unwrap().len() - before, 1, "one transaction");
    assert_eq!(sink.stats().get("written"), 4);
    assert_eq!(events_written(&registry).await, 4);
    tokio::time::sleep(EventConfig::DEFAULT_LINGER * 2).await;
    assert_eq!(
        txns.0.lock().unwrap().len() - before,
        1,
        "none by the writer"
    );
}

/// Losing an event never fails the publish: with the events' lease gone, the states go out
/// again without them, and the writer puts them on a new lease.
#[tokio::test(start_paused = true)]
async fn a_publish_whose_events_lease_is_gone_goes_out_without_them() {
    let txns = Txns::default();
    let (registry, role, presence, log) = machine(&txns).await;
    let sink = log.sink();
    sink.emit(started(0));
    tokio::time::sleep(EventConfig::DEFAULT_LINGER * 2).await;
    let lease = sink.window.as_ref().unwrap().lock().current().unwrap();
    registry.kv().revoke(lease).await.unwrap();

    let batch = role
        .publish_batch_with_events(&presence, vec![state(1)], &sink, vec![started(1)])
        .await;
    assert!(batch.complete());
    assert_eq!(role.published_states().await.unwrap().items.len(), 1);
    tokio::time::sleep(EventConfig::DEFAULT_LINGER * 2).await;
    assert_eq!(
        events_written(&registry).await,
        1,
        "the revoked lease took the first"
    );
    assert_eq!(sink.stats().get("written"), 2);
    assert_eq!(sink.stats().get("failed"), 0);
}

/// A publish that fails for another reason (etcd away) loses its events: the transaction may
/// have been applied after all, and no event is written twice.
#[tokio::test(start_paused = true)]
async fn a_publish_that_fails_otherwise_loses_its_events_and_fails_as_before() {
    let txns = Txns::default();
    let (registry, role, presence, log) = machine(&txns).await;
    let sink = log.sink();
    sink.emit(started(0));
    tokio::time::sleep(EventConfig::DEFAULT_LINGER * 2).await;
    registry.kv().inner.set_unavailable(true);
    let batch = role
        .publish_batch_with_events(&presence, vec![state(1)], &sink, vec![started(1)])
        .await;
    assert!(!batch.complete());
    assert_eq!(sink.stats().get("failed"), 1);
    registry.kv().inner.set_unavailable(false);
    tokio::time::sleep(EventConfig::DEFAULT_LINGER * 2).await;
    assert_eq!(events_written(&registry).await, 1);
}

/// Counts the requests etcd's permission check refused.
#[derive(Debug, Clone, Default)]
struct Denials(Arc<Mutex<usize>>);

impl Hook for Denials {
    async fn before(&self, _: Request<'_>) -> Result<(), KvError> {
        Ok(())
    }

    fn after(&self, _: Request<'_>, outcome: crate::kv::Outcome<'_>, _: Duration) {
        if let crate::kv::Outcome::Failed(KvError::PermissionDenied { .. }) = outcome {
            *self.0.lock().unwrap() += 1;
        }
    }
}

/// A host whose etcd role predates issue 41's event prefix (`fleetctl auth setup` not run
/// again): events are refused, and that must not fail the publish of its states (docs/
/// registry.md, "Upgrading"). The states go out again without them, and no event boards
/// again until the writer's own put succeeds.
#[tokio::test(start_paused = true)]
async fn a_host_refused_its_events_still_publishes_its_states() {
    let denials = Denials::default();
    let role = host_refused_events(denials.clone());
    let presence = register(&role).await;
    let log = role.event_log(EventConfig::default(), EventStats::default());
    let sink = log.sink();
    // The eager writer holds its lease (a grant needs no key's permission).
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(sink.window.as_ref().unwrap().lock().current().is_some());
    for i in 0..2 {
        let batch = role
            .publish_batch_with_events(&presence, vec![state(i)], &sink, vec![started(i)])
            .await;
        assert!(batch.complete(), "{:?}", batch.failed);
    }
    assert_eq!(role.published_states().await.unwrap().items.len(), 2);
    tokio::time::sleep(EventConfig::DEFAULT_LINGER * 2).await;
    assert_eq!(sink.stats().get("failed"), 2);
    assert_eq!(sink.stats().get("written"), 0);
    // The first publish's events aboard, then the writer's put of both: the second publish
    // did not try its events aboard.
    assert_eq!(*denials.0.lock().unwrap(), 2);
}

/// Events handed back to the writer after their write was refused were counted against
/// their unit's cap twice, once aboard and once by the writer: at a cap of 1 the one event of
/// the unit was capped instead of tried.
#[tokio::test(start_paused = true)]
async fn an_event_handed_back_to_the_writer_counts_once_against_its_cap() {
    let role = host_refused_events(Denials::default());
    let presence = register(&role).await;
    let cfg = EventConfig {
        cap: 1,
        ..EventConfig::default()
    };
    let log = role.event_log(cfg, EventStats::default());
    let sink = log.sink();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let batch = role
        .publish_batch_with_events(&presence, vec![state(1)], &sink, vec![started(1)])
        .await;
    assert!(batch.complete());
    tokio::time::sleep(EventConfig::DEFAULT_LINGER * 2).await;
    assert_eq!(sink.stats().get("capped"), 0);
    assert_eq!(
        sink.stats().get("failed"),
        1,
        "tried by the writer, refused"
    );
}

fn active(i: usize) -> Event {
    let unit: UnitName = format!("u{i}.service").parse().unwrap();
    Event::now(EventKind::Active, "").unit(&unit)
}

/// Issue 41: a unit started and found active in one pass took two keys; one write now puts
/// a subject's events under one key, and every reader gets them back one by one, in order.
#[tokio::test(start_paused = true)]
async fn a_units_events_of_one_write_share_one_key_and_read_back_in_order() {
    let txns = Txns::default();
    let (registry, _role, _presence, log) = machine(&txns).await;
    let sink = log.sink();
    let m1: MachineId = "m1".parse().unwrap();
    for e in [started(0), active(0), started(1)] {
        sink.emit(e.on(&m1));
    }
    log.close(Duration::from_secs(10)).await;
    assert_eq!(sink.stats().get("written"), 3);
    let keys = registry.kv().range("/t/event/", true, None).await.unwrap();
    assert_eq!(keys.kvs.len(), 2, "one key per unit");

    let all = registry
        .events(&crate::EventFilter::default())
        .await
        .unwrap();
    let seen: Vec<(EventKind, String)> = all
        .items
        .iter()
        .map(|e| (e.kind, e.unit.as_ref().unwrap().to_string()))
        .collect();
    assert_eq!(
        seen,
        [
            (EventKind::Started, "u0.service".to_owned()),
            (EventKind::Active, "u0.service".to_owned()),
            (EventKind::Started, "u1.service".to_owned()),
        ]
    );
    assert!(all.skipped.is_empty());
    // The narrow read of one machine's events, and the follower's watch, alike.
    let filter = crate::EventFilter {
        machine: Some(m1),
        ..Default::default()
    };
    let narrow = registry.events(&filter).await.unwrap().items;
    assert_eq!(narrow, all.items);
    let mut follow = registry.follow_events(1).await.unwrap();
    let followed = follow.next().await.unwrap().unwrap();
    assert_eq!(followed, all.items);
    assert!(all.items.iter().all(|e| e.source.is_some()));
}

/// Transactions inside the store at once, and the most there ever were; each takes 50 ms.
#[derive(Debug, Clone, Default)]
struct Slow(Arc<Mutex<(usize, usize)>>);

impl Hook for Slow {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        if let Request::Txn(_) = request {
            {
                let mut n = self.0.lock().unwrap();
                n.0 += 1;
                n.1 = n.1.max(n.0);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.0.lock().unwrap().0 -= 1;
        }
        Ok(())
    }
}

/// Issue 41: fleetctl's submit of 100,000 units and an engine's pass emit faster than one
/// transaction at a time puts, into a queue of 10,000: at 20,000 units on 1,000 machines half
/// the `submitted` events were dropped. A backlog now goes out several transactions at a
/// time, and a bulk submit's events fit the queue.
#[tokio::test(start_paused = true)]
async fn a_backlog_is_written_whole_several_transactions_at_a_time() {
    let slow = Slow::default();
    let kv = Hooked {
        inner: MemKv::new(),
        hook: slow.clone(),
    };
    let registry = Registry::new(kv, "/t/");
    let log = crate::UnitsRole::new(registry.clone())
        .event_log(EventConfig::default(), EventStats::default());
    let sink = log.sink();
    let units = 30_000;
    for i in 0..units {
        sink.emit(started(i));
    }
    log.close(Duration::from_secs(3600)).await;
    assert_eq!(sink.stats().get("dropped"), 0);
    assert_eq!(sink.stats().get("written"), units as u64);
    assert_eq!(
        slow.0.lock().unwrap().1,
        IN_FLIGHT,
        "transactions in flight at once"
    );
}
