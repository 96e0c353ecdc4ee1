//! Events (issue 41), as contract tests: each body runs against `MemKv` and a real etcd.
//! Written in the background by each role's writer, read back merged by time, followed by a
//! watch, bounded by a per-subject cap, expired by their lease; and each host writes only
//! its own machine's events (the fake RBAC of etcd 3.4).

use fleet_core::{MachineId, UnitName};
use fleet_registry::kv::{Kv, MemKv, Rbac};
use fleet_registry::{
    EngineRole, Event, EventConfig, EventFilter, EventKind, EventSource, EventStats, Keys,
    MachineRole, Registry, UnitsRole,
};
use fleet_testing::TestEtcd;
use std::time::Duration;

const PREFIX: &str = "/events/";
const CLOSE: Duration = Duration::from_secs(10);

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn machine(s: &str) -> MachineId {
    s.parse().unwrap()
}

async fn event_keys<K: Kv>(reg: &Registry<K>) -> Vec<(String, i64)> {
    let res = reg
        .raw_kv()
        .range(&reg.keys().events(), true, None)
        .await
        .unwrap();
    res.kvs.into_iter().map(|kv| (kv.key, kv.lease)).collect()
}

async fn writes_each_writers_events_under_its_prefix_and_lists_them_by_time<K: Kv>(
    reg: Registry<K>,
) {
    let (a, b) = (name("a.service"), name("b.service"));
    let user = UnitsRole::new(reg.clone()).event_log(EventConfig::default(), EventStats::default());
    let engine =
        EngineRole::new(reg.clone()).event_log(EventConfig::default(), EventStats::default());
    let m1 = MachineRole::new(reg.clone(), machine("m1"))
        .event_log(EventConfig::default(), EventStats::default());
    let mut submitted = Event::now(EventKind::Submitted, "desired launched").unit(&a);
    submitted.who = Some("CN=alice".into());
    let mut scheduled = Event::now(EventKind::Scheduled, "the only machine")
        .unit(&a)
        .on(&machine("m1"));
    scheduled.time = submitted.time + 1;
    let mut started = Event::now(EventKind::Started, "")
        .unit(&a)
        .on(&machine("m1"));
    started.time = submitted.time + 2;
    let mut other = Event::now(EventKind::Submitted, "desired loaded").unit(&b);
    other.time = submitted.time + 3;
    // Handed over out of order: the listing is by time.
    m1.sink().emit(started.clone());
    engine.sink().emit(scheduled.clone());
    user.sink().emit(submitted.clone());
    user.sink().emit(other.clone());
    for log in [user, engine, m1] {
        log.close(CLOSE).await;
    }

    let keys = event_keys(&reg).await;
    assert_eq!(keys.len(), 4, "{keys:?}");
    assert!(keys.iter().all(|(_, lease)| *lease != 0), "{keys:?}");
    let under = |source: EventSource| {
        let prefix = reg.keys().source_events(&source);
        keys.iter().filter(|(k, _)| k.starts_with(&prefix)).count()
    };
    assert_eq!(under(EventSource::User), 2);
    assert_eq!(under(EventSource::Engine), 1);
    assert_eq!(under(EventSource::Machine(machine("m1"))), 1);

    let all = reg.events(&EventFilter::default()).await.unwrap();
    let kinds: Vec<_> = all.items.iter().map(|e| (e.kind, e.unit.clone())).collect();
    assert_eq!(
        kinds,
        vec![
            (EventKind::Submitted, Some(a.clone())),
            (EventKind::Scheduled, Some(a.clone())),
            (EventKind::Started, Some(a.clone())),
            (EventKind::Submitted, Some(b.clone())),
        ]
    );
    assert_eq!(all.items[0].who.as_deref(), Some("CN=alice"));
    assert_eq!(all.items[0].source, Some(EventSource::User));
    assert_eq!(
        all.items[2].source,
        Some(EventSource::Machine(machine("m1")))
    );

    let of_a = EventFilter {
        unit: Some(a.clone()),
        ..EventFilter::default()
    };
    assert_eq!(reg.events(&of_a).await.unwrap().items.len(), 3);
    let on_m1 = EventFilter {
        machine: Some(machine("m1")),
        ..EventFilter::default()
    };
    assert_eq!(reg.events(&on_m1).await.unwrap().items.len(), 2);
    let later = EventFilter {
        since: Some(other.time),
        ..EventFilter::default()
    };
    assert_eq!(
        reg.events(&later).await.unwrap().items,
        vec![other.tap_source()]
    );
}

/// `events --unit` and `--machine` read a few prefixes, not every agent's events: a unit's
/// are found on the machines its events name and where it is placed now, a machine's are
/// its own agent's and the users' and engine's that concern it.
async fn a_units_or_a_machines_events_are_read_without_the_other_agents<K: Kv>(reg: Registry<K>) {
    let (a, b) = (name("a.service"), name("b.service"));
    let (m1, m2, m3, m4) = (machine("m1"), machine("m2"), machine("m3"), machine("m4"));
    let engine =
        EngineRole::new(reg.clone()).event_log(EventConfig::default(), EventStats::default());
    let agents: Vec<_> = [&m1, &m2, &m3, &m4]
        .into_iter()
        .map(|m| {
            MachineRole::new(reg.clone(), m.clone())
                .event_log(EventConfig::default(), EventStats::default())
        })
        .collect();
    let t0 = Event::now(EventKind::Unknown, "").time;
    let at = |e: Event, dt: u64| Event { time: t0 + dt, ..e };
    engine
        .sink()
        .emit(at(Event::now(EventKind::Scheduled, "").unit(&a).on(&m1), 1));
    engine.sink().emit(at(
        Event::now(EventKind::Moved, "machine lost")
            .unit(&a)
            .on(&m2)
            .from(&m1),
        3,
    ));
    engine
        .sink()
        .emit(at(Event::now(EventKind::Scheduled, "").unit(&b).on(&m3), 5));
    for (i, log) in agents.iter().enumerate() {
        let on = [&m1, &m2, &m3, &m4][i];
        log.sink().emit(at(
            Event::now(EventKind::Started, "").unit(&a).on(on),
            10 + i as u64,
        ));
    }
    for log in agents.into_iter().chain([engine]) {
        log.close(CLOSE).await;
    }
    // Placed on m4 now (by a write the test makes for the engine).
    let placement = reg.keys().placement(&a, &m4);
    let put = fleet_registry::kv::TxnOp::Put {
        key: placement,
        value: Vec::new(),
        lease: None,
    };
    let txn = fleet_registry::kv::Txn {
        compares: Vec::new(),
        success: vec![put],
        failure: Vec::new(),
    };
    reg.raw_kv().txn(txn).await.unwrap();

    let of_a = EventFilter {
        unit: Some(a.clone()),
        ..EventFilter::default()
    };
    let seen: Vec<_> = reg.events(&of_a).await.unwrap().items;
    let seen: Vec<_> = seen.iter().map(|e| (e.kind, e.source.clone())).collect();
    // m3's agent wrote about a.service, but nothing says a.service was ever there.
    assert_eq!(
        seen,
        vec![
            (EventKind::Scheduled, Some(EventSource::Engine)),
            (EventKind::Moved, Some(EventSource::Engine)),
            (EventKind::Started, Some(EventSource::Machine(m1.clone()))),
            (EventKind::Started, Some(EventSource::Machine(m2.clone()))),
            (EventKind::Started, Some(EventSource::Machine(m4.clone()))),
        ]
    );
    let on_m3 = EventFilter {
        machine: Some(m3.clone()),
        ..EventFilter::default()
    };
    let seen: Vec<_> = reg.events(&on_m3).await.unwrap().items;
    let seen: Vec<_> = seen.iter().map(|e| (e.kind, e.unit.clone())).collect();
    assert_eq!(
        seen,
        vec![
            (EventKind::Scheduled, Some(b.clone())),
            (EventKind::Started, Some(a.clone())),
        ]
    );
}

/// What a listing gives back of an event the user writer wrote.
trait TapSource {
    fn tap_source(self) -> Event;
}

impl TapSource for Event {
    fn tap_source(mut self) -> Event {
        self.source = Some(EventSource::User);
        self
    }
}

async fn a_follower_sees_the_events_written_after_its_listing<K: Kv>(reg: Registry<K>) {
    let listing = reg.events(&EventFilter::default()).await.unwrap();
    let mut follow = reg.follow_events(listing.revision + 1).await.unwrap();
    let user = UnitsRole::new(reg.clone()).event_log(EventConfig::default(), EventStats::default());
    let event = Event::now(EventKind::Destroyed, "").unit(&name("a.service"));
    user.sink().emit(event.clone());
    let got = tokio::time::timeout(Duration::from_secs(5), follow.next())
        .await
        .expect("an event within 5 s")
        .unwrap()
        .unwrap();
    assert_eq!(got, vec![event.tap_source()]);
    user.close(CLOSE).await;
}

async fn a_writer_puts_at_most_the_cap_of_one_subject_per_window<K: Kv>(reg: Registry<K>) {
    let cfg = EventConfig {
        cap: 3,
        ..EventConfig::default()
    };
    let stats = EventStats::default();
    let user = UnitsRole::new(reg.clone()).event_log(cfg, stats.clone());
    for _ in 0..5 {
        user.sink()
            .emit(Event::now(EventKind::Replaced, "").unit(&name("a.service")));
    }
    user.sink()
        .emit(Event::now(EventKind::Drained, "").on(&machine("m1")));
    user.close(CLOSE).await;
    // One write: a key per subject, holding its events.
    assert_eq!(event_keys(&reg).await.len(), 2);
    let read = reg.events(&EventFilter::default()).await.unwrap();
    assert_eq!(read.items.len(), 4);
    assert_eq!(stats.get("written"), 4);
    assert_eq!(stats.get("capped"), 2);
}

async fn events_expire_after_the_retention<K: Kv>(reg: Registry<K>) {
    let cfg = EventConfig::new(Duration::from_secs(2));
    let user = UnitsRole::new(reg.clone()).event_log(cfg, EventStats::default());
    user.sink()
        .emit(Event::now(EventKind::Submitted, "").unit(&name("a.service")));
    user.close(CLOSE).await;
    assert_eq!(event_keys(&reg).await.len(), 1);
    // The retention plus one window (a quarter of it, at least a second), and etcd's slack.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !event_keys(&reg).await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "events outlived their lease"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The agent's events ride in its publish of unit states (issue 41). With the events' lease
/// gone (etcd answers "lease not found" for a transaction holding two leases, one alive),
/// the states still go out, and the writer puts the events on a new lease.
async fn events_aboard_a_publish_survive_their_lease_gone<K: Kv>(reg: Registry<K>) {
    let m1 = machine("m1");
    let role = MachineRole::new(reg.clone(), m1.clone());
    let info = fleet_core::MachineInfo {
        id: m1.clone(),
        public_ip: String::new(),
        metadata: Default::default(),
        version: "test".into(),
        disable_engine: true,
        api: String::new(),
        fence_at: None,
    };
    let presence = role
        .register(&info, Duration::from_secs(30), None)
        .await
        .unwrap();
    let stats = EventStats::default();
    let log = role.event_log(EventConfig::default(), stats.clone());
    let sink = log.sink();
    let state = |unit: &str| fleet_registry::UnitStateRecord {
        name: name(unit),
        machine: m1.clone(),
        hash: None,
        systemd: fleet_core::SystemdState::not_found(),
        drop_ins: Vec::new(),
        restart: 0,
        restart_pending: false,
        restarts: 0,
        since: None,
        exit: None,
    };
    let started = |unit: &str| Event::now(EventKind::Started, "").unit(&name(unit)).on(&m1);
    sink.emit(started("a.service"));
    let until = |n: usize| {
        let reg = reg.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let keys = event_keys(&reg).await;
                if keys.len() == n {
                    return keys;
                }
                assert!(tokio::time::Instant::now() < deadline, "{keys:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let first = until(1).await;
    // Aboard: the state and its event in one transaction, on the writer's lease.
    let batch = role
        .publish_batch_with_events(
            &presence,
            vec![state("b.service")],
            &sink,
            vec![started("b.service")],
        )
        .await;
    assert!(batch.complete());
    let keys = until(2).await;
    assert!(
        keys.iter().all(|(_, lease)| *lease == first[0].1),
        "{keys:?}"
    );

    reg.raw_kv()
        .revoke(fleet_registry::kv::LeaseId(first[0].1))
        .await
        .unwrap();
    until(0).await;
    let batch = role
        .publish_batch_with_events(
            &presence,
            vec![state("c.service")],
            &sink,
            vec![started("c.service")],
        )
        .await;
    assert!(batch.complete(), "{:?}", batch.failed);
    assert_eq!(role.published_states().await.unwrap().items.len(), 2);
    let keys = until(1).await;
    assert_ne!(keys[0].1, first[0].1, "a new lease");
    // The writer counts its put once etcd has answered, which may be after the key shows.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while stats.get("written") < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            stats.get("written")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(stats.get("written"), 3);
    assert_eq!(stats.get("failed"), 0);
}

macro_rules! contract {
    ($($test:ident),* $(,)?) => {
        mod mem {
            $(
                #[tokio::test]
                async fn $test() {
                    let reg = fleet_registry::Registry::new(super::MemKv::new(), super::PREFIX);
                    super::$test(reg).await;
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test]
                async fn $test() {
                    let etcd = super::TestEtcd::start().await;
                    let reg = fleet_registry::Registry::new(etcd.kv().await, super::PREFIX);
                    super::$test(reg).await;
                }
            )*
        }
    };
}

contract!(
    writes_each_writers_events_under_its_prefix_and_lists_them_by_time,
    a_follower_sees_the_events_written_after_its_listing,
    a_writer_puts_at_most_the_cap_of_one_subject_per_window,
    events_expire_after_the_retention,
    a_units_or_a_machines_events_are_read_without_the_other_agents,
    events_aboard_a_publish_survive_their_lease_gone,
);

/// The store as an etcd user holding only `role` sees it.
fn as_role(kv: &MemKv, role: fleet_registry::rbac::RoleSpec) -> Registry<Rbac<MemKv>> {
    Registry::new(Rbac::new(kv.clone(), role.name.clone(), vec![role]), PREFIX)
}

/// A host's credentials write its own agent's events and never another machine's (a
/// refused write is counted, and fails nothing); a viewer reads every writer's events.
#[tokio::test]
async fn a_host_cannot_write_another_machines_events_and_a_viewer_reads_them() {
    let kv = MemKv::new();
    let keys = Keys::new(PREFIX);
    let host_m2 = as_role(&kv, fleet_registry::rbac::machine(&keys, &machine("m2")));
    let a = name("a.service");

    let stats = EventStats::default();
    let forged = MachineRole::new(host_m2.clone(), machine("m1"))
        .event_log(EventConfig::default(), stats.clone());
    forged
        .sink()
        .emit(Event::now(EventKind::Failed, "").unit(&a));
    forged.close(CLOSE).await;
    assert_eq!(stats.get("failed"), 1);
    assert_eq!(stats.get("written"), 0);

    let own = MachineRole::new(host_m2, machine("m2"))
        .event_log(EventConfig::default(), EventStats::default());
    own.sink().emit(Event::now(EventKind::Started, "").unit(&a));
    own.close(CLOSE).await;
    let operator = as_role(&kv, fleet_registry::rbac::operator(&keys));
    let user = UnitsRole::new(operator).event_log(EventConfig::default(), EventStats::default());
    user.sink()
        .emit(Event::now(EventKind::Submitted, "").unit(&a));
    user.close(CLOSE).await;

    let viewer = as_role(&kv, fleet_registry::rbac::viewer(&keys));
    let seen = viewer.events(&EventFilter::default()).await.unwrap();
    let sources: Vec<_> = seen.items.iter().map(|e| e.source.clone()).collect();
    assert_eq!(seen.items.len(), 2, "{seen:?}");
    assert!(sources.contains(&Some(EventSource::Machine(machine("m2")))));
    assert!(sources.contains(&Some(EventSource::User)));
    viewer.follow_events(seen.revision + 1).await.unwrap();
}
