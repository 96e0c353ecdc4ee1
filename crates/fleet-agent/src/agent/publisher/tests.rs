//! The publisher on the in-memory registry, on paused time.

use super::*;
use crate::plan::{CurrentUnit, UnitFileState};
use fleet_core::{MachineId, MachineInfo, SystemdState, UnitHash};
use fleet_registry::Registry;
use fleet_registry::kv::MemKv;
use std::time::Duration;

fn m1() -> MachineId {
    "m1".parse().unwrap()
}

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn hash(s: &str) -> UnitHash {
    fleet_core::UnitFile::parse(format!("[Service]\nExecStart=/bin/{s}\n").as_bytes())
        .unwrap()
        .hash()
}

async fn world() -> (MemKv, MachineRole<MemKv>, Presence) {
    let kv = MemKv::new();
    let role = MachineRole::new(Registry::new(kv.clone(), "/t/"), m1());
    let presence = register(&role).await;
    (kv, role, presence)
}

async fn register(role: &MachineRole<MemKv>) -> Presence {
    let info = MachineInfo {
        id: m1(),
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

/// A machine with `units` in its units directory, each `active` as given.
fn current(units: &[(&str, &str)]) -> Current {
    let mut current = Current::default();
    for (unit, active) in units {
        let h = hash(unit);
        current.units.insert(
            name(unit),
            CurrentUnit {
                file: UnitFileState::Present {
                    hash: h,
                    linked: true,
                },
                systemd: Some(SystemdState {
                    active: (*active).into(),
                    ..SystemdState::not_found()
                }),
                need_daemon_reload: false,
                restarted: None,
            },
        );
        current.hashes.insert(name(unit), h);
    }
    current
}

async fn in_registry(role: &MachineRole<MemKv>) -> BTreeMap<String, String> {
    role.published_states()
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| (s.name.to_string(), s.systemd.active))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn publishes_what_changed_and_withdraws_what_left_the_units_directory() {
    let (_, role, presence) = world().await;
    let mut publisher = Publisher::new(role.clone(), EventSink::off());
    publisher
        .publish(
            Some(presence),
            &current(&[("a.service", "active"), ("b.service", "active")]),
        )
        .await;
    assert!(publisher.complete());
    assert_eq!(publisher.len(), 2);

    let now = current(&[("a.service", "failed")]);
    publisher.touched([name("a.service"), name("b.service")]);
    publisher.publish(Some(presence), &now).await;
    assert!(publisher.complete());
    assert!(publisher.has(&name("a.service")) && !publisher.has(&name("b.service")));
    let expected = BTreeMap::from([("a.service".to_owned(), "failed".to_owned())]);
    assert_eq!(in_registry(&role).await, expected);
}

#[tokio::test(start_paused = true)]
async fn only_the_units_touched_since_the_last_publish_are_compared() {
    let (_, role, presence) = world().await;
    let mut publisher = Publisher::new(role.clone(), EventSink::off());
    publisher
        .publish(Some(presence), &current(&[("a.service", "active")]))
        .await;
    // a changed, but nothing said so: the publish compares nothing.
    publisher
        .publish(Some(presence), &current(&[("a.service", "failed")]))
        .await;
    assert_eq!(in_registry(&role).await["a.service"], "active");
    publisher.touched_all();
    publisher
        .publish(Some(presence), &current(&[("a.service", "failed")]))
        .await;
    assert_eq!(in_registry(&role).await["a.service"], "failed");
}

#[tokio::test(start_paused = true)]
async fn a_failed_publish_is_incomplete_and_the_next_one_compares_every_state() {
    let (kv, role, presence) = world().await;
    let mut publisher = Publisher::new(role.clone(), EventSink::off());
    kv.set_unavailable(true);
    publisher
        .publish(Some(presence), &current(&[("a.service", "active")]))
        .await;
    assert!(!publisher.complete());
    assert_eq!(publisher.len(), 0);
    kv.set_unavailable(false);
    // Nothing touched since: still every state is compared.
    publisher
        .publish(Some(presence), &current(&[("a.service", "active")]))
        .await;
    assert!(publisher.complete());
    assert_eq!(in_registry(&role).await.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_new_lease_publishes_every_state_again() {
    let (_, role, presence) = world().await;
    let mut publisher = Publisher::new(role.clone(), EventSink::off());
    let now = current(&[("a.service", "active")]);
    publisher.publish(Some(presence), &now).await;
    role.unregister(&presence).await.unwrap();
    assert!(in_registry(&role).await.is_empty());
    let renewed = register(&role).await;
    publisher.publish(Some(renewed), &now).await;
    assert_eq!(in_registry(&role).await.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn without_a_presence_nothing_is_published_and_nothing_is_left_out() {
    let (_, role, _) = world().await;
    let mut publisher = Publisher::new(role.clone(), EventSink::off());
    publisher
        .publish(None, &current(&[("a.service", "active")]))
        .await;
    assert!(publisher.complete());
    assert!(in_registry(&role).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn adopted_states_of_a_resumed_lease_are_withdrawn_when_their_units_are_gone() {
    let (_, role, presence) = world().await;
    let mut before = Publisher::new(role.clone(), EventSink::off());
    before
        .publish(
            Some(presence),
            &current(&[("a.service", "active"), ("b.service", "active")]),
        )
        .await;
    // A restarted fleetd on the same lease: b is no longer in its units directory.
    let mut publisher = Publisher::new(role.clone(), EventSink::off());
    publisher.adopt(presence).await;
    assert_eq!(publisher.len(), 2);
    publisher
        .publish(Some(presence), &current(&[("a.service", "active")]))
        .await;
    assert_eq!(in_registry(&role).await.len(), 1);
}
