//! User actions as events (issue 41): every write path of `RegistryCluster` (fleetctl's etcd
//! driver and the API run it) records what it did, as whom, once; a write that did nothing
//! or failed records nothing.

use fleet_core::{DesiredState, MachineId, UnitFile, UnitName};
use fleet_ops::{Cluster, OpsError, PutRequest, RegistryCluster, ReplaceHow, StateChange};
use fleet_registry::kv::MemKv;
use fleet_registry::{
    Event, EventConfig, EventFilter, EventKind, EventLog, EventStats, MetadataChange, Registry,
    UnitsRole,
};
use std::time::Duration;

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn machine(s: &str) -> MachineId {
    s.parse().unwrap()
}

fn create(n: &str, exec: &str, desired: DesiredState) -> PutRequest {
    PutRequest {
        name: name(n),
        file: Some(UnitFile::parse(format!("[Service]\nExecStart={exec}\n").as_bytes()).unwrap()),
        desired: Some(desired),
        how: ReplaceHow::default(),
    }
}

fn cluster(reg: &Registry<MemKv>) -> (RegistryCluster<MemKv>, EventLog) {
    let log = UnitsRole::new(reg.clone()).event_log(EventConfig::default(), EventStats::default());
    let cluster = RegistryCluster::new(reg.clone())
        .with_events(log.sink())
        .acting_as(Some("CN=alice"));
    (cluster, log)
}

async fn events(reg: &Registry<MemKv>, log: EventLog) -> Vec<Event> {
    log.close(Duration::from_secs(5)).await;
    reg.events(&EventFilter::default()).await.unwrap().items
}

fn said(events: &[Event]) -> Vec<(EventKind, String, String)> {
    events
        .iter()
        .map(|e| {
            let about = e
                .unit
                .as_ref()
                .map(ToString::to_string)
                .or(e.machine.as_ref().map(ToString::to_string))
                .unwrap_or_default();
            (e.kind, about, e.reason.clone())
        })
        .collect()
}

#[tokio::test]
async fn each_user_action_is_recorded_once_with_who_asked() {
    let reg = Registry::new(MemKv::new(), "/ops-events/");
    let (c, log) = cluster(&reg);
    c.put(create("a.service", "/bin/a", DesiredState::Loaded))
        .await
        .unwrap();
    c.create_many(vec![create("b.service", "/bin/b", DesiredState::Inactive)])
        .await;
    c.set_state(
        &name("a.service"),
        StateChange::Raise(DesiredState::Launched),
    )
    .await
    .unwrap();
    c.put(create("a.service", "/bin/a2", DesiredState::Launched))
        .await
        .unwrap();
    c.restart(&name("a.service")).await.unwrap();
    c.destroy_many(vec![name("b.service")]).await;
    c.drain(&machine("m1"), 2).await.unwrap();
    c.undrain(&machine("m1")).await.unwrap();
    c.change_metadata(&[MetadataChange::Set {
        machine: machine("m1"),
        key: "tier".parse().unwrap(),
        value: "web".into(),
    }])
    .await
    .unwrap();
    c.destroy(&name("a.service")).await.unwrap();

    let got = events(&reg, log).await;
    assert!(
        got.iter().all(|e| e.who.as_deref() == Some("CN=alice")),
        "{got:?}"
    );
    let kinds: Vec<_> = said(&got)
        .into_iter()
        .map(|(k, about, _)| (k, about))
        .collect();
    let expected = [
        (EventKind::Submitted, "a.service"),
        (EventKind::Submitted, "b.service"),
        (EventKind::DesiredChanged, "a.service"),
        (EventKind::Replaced, "a.service"),
        (EventKind::RestartRequested, "a.service"),
        (EventKind::Destroyed, "b.service"),
        (EventKind::Drained, "m1"),
        (EventKind::Undrained, "m1"),
        (EventKind::MetadataSet, "m1"),
        (EventKind::Destroyed, "a.service"),
    ];
    let expected: Vec<_> = expected
        .iter()
        .map(|(k, a)| (*k, (*a).to_owned()))
        .collect();
    assert_eq!(kinds, expected);
    assert_eq!(said(&got)[0].2, "desired state loaded");
    assert_eq!(said(&got)[8].2, "tier=web");
}

#[tokio::test]
async fn a_write_that_changes_nothing_or_fails_records_nothing() {
    let reg = Registry::new(MemKv::new(), "/ops-events/");
    let (c, log) = cluster(&reg);
    c.put(create("a.service", "/bin/a", DesiredState::Loaded))
        .await
        .unwrap();
    // The same again: unchanged.
    c.put(create("a.service", "/bin/a", DesiredState::Loaded))
        .await
        .unwrap();
    c.destroy(&name("missing.service")).await.unwrap();
    let refused = c
        .set_state(&name("missing.service"), StateChange::Stop)
        .await;
    assert!(
        matches!(refused, Err(OpsError::NoSuchUnit(_))),
        "{refused:?}"
    );
    assert!(!c.undrain(&machine("m1")).await.unwrap());
    let got = events(&reg, log).await;
    assert_eq!(said(&got).len(), 1, "{got:?}");
}
