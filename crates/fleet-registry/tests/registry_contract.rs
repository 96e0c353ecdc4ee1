//! Contract tests of the typed registry: every body runs against the in-memory `MemKv` and
//! against a real etcd started by the test, so the fake cannot drift from etcd.

use fleet_core::{DesiredState, MachineId, MachineInfo, SystemdState, UnitFile, UnitName};
use fleet_registry::kv::{Kv, MemKv};
use fleet_registry::testing::TestEtcd;
use fleet_registry::{
    CreateOutcome, EngineWrite, Fence, LiveView, Registry, RegistryError, ScheduleEntry,
    UnitStateRecord, WatchHints,
};
use std::time::Duration;

const PREFIX: &str = "/contract/";

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn machine(s: &str) -> MachineId {
    s.parse().unwrap()
}

fn file(exec: &str) -> UnitFile {
    UnitFile::parse(format!("[Service]\nExecStart={exec}\n").as_bytes()).unwrap()
}

fn info(id: &str) -> MachineInfo {
    MachineInfo {
        id: machine(id),
        public_ip: "10.0.0.1".into(),
        metadata: Default::default(),
        version: "test".into(),
        disable_engine: false,
    }
}

/// Every key under the prefix, for "nothing else was written" checks.
async fn keys<K: Kv>(reg: &Registry<K>) -> Vec<String> {
    let res = reg.kv().range(PREFIX, true, None).await.unwrap();
    res.kvs.into_iter().map(|kv| kv.key).collect()
}

async fn creates_a_unit_with_its_file_and_reference<K: Kv>(reg: Registry<K>) {
    let f = file("/bin/true");
    let out = reg
        .create_unit(&name("a.service"), &f, DesiredState::Inactive)
        .await
        .unwrap();
    let CreateOutcome::Created(unit) = out else {
        panic!("expected Created, got {out:?}");
    };
    assert_eq!(unit.hash(), f.hash());
    let h = f.hash();
    assert_eq!(
        keys(&reg).await,
        vec![
            format!("{PREFIX}file-ref/{h}/a.service"),
            format!("{PREFIX}file/{h}"),
            format!("{PREFIX}unit/a.service"),
        ]
    );
    assert_eq!(reg.file(&h).await.unwrap().unwrap(), f);
}

async fn refuses_to_create_an_existing_unit_and_returns_it<K: Kv>(reg: Registry<K>) {
    let n = name("a.service");
    reg.create_unit(&n, &file("/bin/true"), DesiredState::Inactive)
        .await
        .unwrap();
    let before = keys(&reg).await;
    let out = reg
        .create_unit(&n, &file("/bin/false"), DesiredState::Launched)
        .await
        .unwrap();
    let CreateOutcome::Exists(existing) = out else {
        panic!("expected Exists, got {out:?}");
    };
    assert_eq!(existing.hash(), file("/bin/true").hash());
    assert_eq!(keys(&reg).await, before, "nothing may be written");
}

async fn replace_collects_the_old_file<K: Kv>(reg: Registry<K>) {
    let n = name("a.service");
    let CreateOutcome::Created(unit) = reg
        .create_unit(&n, &file("/bin/true"), DesiredState::Inactive)
        .await
        .unwrap()
    else {
        panic!()
    };
    let new = file("/bin/false");
    let replaced = reg
        .replace_unit(&unit, &new, DesiredState::Inactive)
        .await
        .unwrap();
    assert_eq!(replaced.hash(), new.hash());
    let h = new.hash();
    assert_eq!(
        keys(&reg).await,
        vec![
            format!("{PREFIX}file-ref/{h}/a.service"),
            format!("{PREFIX}file/{h}"),
            format!("{PREFIX}unit/a.service"),
        ]
    );
}

async fn shared_file_survives_until_its_last_unit_goes<K: Kv>(reg: Registry<K>) {
    let f = file("/bin/true");
    let mut units = Vec::new();
    for n in ["x@1.service", "x@2.service"] {
        match reg
            .create_unit(&name(n), &f, DesiredState::Inactive)
            .await
            .unwrap()
        {
            CreateOutcome::Created(u) => units.push(u),
            other => panic!("{other:?}"),
        }
    }
    reg.destroy_unit(&units[0]).await.unwrap();
    assert!(reg.file(&f.hash()).await.unwrap().is_some());
    reg.destroy_unit(&units[1]).await.unwrap();
    assert!(reg.file(&f.hash()).await.unwrap().is_none());
    assert!(keys(&reg).await.is_empty());
}

async fn stale_replace_is_a_conflict_and_writes_nothing<K: Kv>(reg: Registry<K>) {
    let n = name("a.service");
    let CreateOutcome::Created(unit) = reg
        .create_unit(&n, &file("/bin/true"), DesiredState::Inactive)
        .await
        .unwrap()
    else {
        panic!()
    };
    // Another client wins the race.
    reg.replace_unit(&unit, &file("/bin/one"), DesiredState::Inactive)
        .await
        .unwrap();
    let before = keys(&reg).await;
    let err = reg
        .replace_unit(&unit, &file("/bin/two"), DesiredState::Inactive)
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::Conflict(_)), "{err:?}");
    assert_eq!(keys(&reg).await, before);
    let err = reg.destroy_unit(&unit).await.unwrap_err();
    assert!(matches!(err, RegistryError::Conflict(_)), "{err:?}");
    let err = reg
        .set_desired(&unit, DesiredState::Launched)
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::Conflict(_)), "{err:?}");
    assert_eq!(keys(&reg).await, before);
}

async fn concurrent_replaces_have_exactly_one_winner<K: Kv>(reg: Registry<K>) {
    let n = name("a.service");
    let CreateOutcome::Created(unit) = reg
        .create_unit(&n, &file("/bin/true"), DesiredState::Inactive)
        .await
        .unwrap()
    else {
        panic!()
    };
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let reg = reg.clone();
            let unit = unit.clone();
            tokio::spawn(async move {
                reg.replace_unit(&unit, &file(&format!("/bin/v{i}")), DesiredState::Inactive)
                    .await
            })
        })
        .collect();
    let mut wins = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => wins += 1,
            Err(RegistryError::Conflict(_)) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(wins, 1);
    // Exactly one file and one reference remain: the winner's.
    let ks = keys(&reg).await;
    assert_eq!(
        ks.iter().filter(|k| k.contains("/file/")).count(),
        1,
        "{ks:?}"
    );
    assert_eq!(
        ks.iter().filter(|k| k.contains("/file-ref/")).count(),
        1,
        "{ks:?}"
    );
}

async fn reads_many_named_units_in_transactions_of_at_most_128_gets<K: Kv>(reg: Registry<K>) {
    let f = file("/bin/true");
    // More than two transactions' worth (etcd refuses a txn of more than 128 ops by
    // default, so the etcd run checks the chunking), half of them registered.
    let names: std::collections::BTreeSet<UnitName> = (0..300)
        .map(|i| name(&format!("u{i:03}.service")))
        .collect();
    for n in names.iter().step_by(2) {
        reg.create_unit(n, &f, DesiredState::Loaded).await.unwrap();
    }
    reg.create_unit(&name("other.service"), &f, DesiredState::Loaded)
        .await
        .unwrap();

    let units = reg.units_named(&names).await.unwrap();

    assert_eq!(units.len(), 150);
    for (i, n) in names.iter().enumerate() {
        let expected = reg.unit(n).await.unwrap();
        assert_eq!(units.get(n), expected.as_ref(), "{n}");
        assert_eq!(expected.is_some(), i % 2 == 0, "{n}");
    }
    assert!(
        !units.contains_key(&name("other.service")),
        "only the named ones"
    );
    assert!(
        reg.units_named(&Default::default())
            .await
            .unwrap()
            .is_empty()
    );
}

async fn snapshot_reads_everything_at_one_revision<K: Kv>(reg: Registry<K>) {
    let n = name("a.service");
    let f = file("/bin/true");
    reg.create_unit(&n, &f, DesiredState::Launched)
        .await
        .unwrap();
    let m = machine("m1");
    let presence = reg
        .register_machine(&info("m1"), Duration::from_secs(10), None)
        .await
        .unwrap();
    let entry = ScheduleEntry {
        name: n.clone(),
        machine: m.clone(),
        hash: f.hash(),
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    reg.apply_schedule(None, std::slice::from_ref(&entry), &[])
        .await
        .unwrap();
    let state = UnitStateRecord {
        name: n.clone(),
        machine: m.clone(),
        hash: Some(f.hash()),
        systemd: SystemdState {
            load: "loaded".into(),
            active: "active".into(),
            sub: "running".into(),
        },
        drop_ins: vec![],
        restart: 0,
        restart_pending: false,
    };
    reg.publish_state(&presence, &state).await.unwrap();
    let snap = reg.snapshot().await.unwrap();
    assert_eq!(snap.units.len(), 1);
    assert_eq!(snap.machines.keys().collect::<Vec<_>>(), vec![&m]);
    assert_eq!(snap.schedule[&n][&m], entry);
    assert_eq!(snap.states[&n][&m], state);
    // A later change is not visible in the snapshot taken before it.
    reg.remove_state(&n, &m).await.unwrap();
    assert_eq!(snap.states[&n][&m], state);
    assert!(reg.snapshot().await.unwrap().states.is_empty());
}

async fn second_machine_with_same_id_is_refused<K: Kv>(reg: Registry<K>) {
    let first = reg
        .register_machine(&info("m1"), Duration::from_secs(10), None)
        .await
        .unwrap();
    let err = reg
        .register_machine(&info("m1"), Duration::from_secs(10), None)
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::DuplicateMachine(_)), "{err:?}");
    // The owner of the lease (a restarted fleetd) resumes it.
    let resumed = reg
        .register_machine(&info("m1"), Duration::from_secs(10), Some(first.lease))
        .await
        .unwrap();
    assert!(resumed.resumed);
    assert_eq!(resumed.lease, first.lease);
}

async fn states_vanish_with_the_machine_lease<K: Kv>(reg: Registry<K>) {
    let presence = reg
        .register_machine(&info("m1"), Duration::from_secs(10), None)
        .await
        .unwrap();
    let state = UnitStateRecord {
        name: name("a.service"),
        machine: machine("m1"),
        hash: None,
        systemd: SystemdState {
            load: "loaded".into(),
            active: "inactive".into(),
            sub: "dead".into(),
        },
        drop_ins: vec![],
        restart: 0,
        restart_pending: false,
    };
    reg.publish_state(&presence, &state).await.unwrap();
    assert_eq!(reg.unit_states().await.unwrap().len(), 1);
    reg.unregister(&presence).await.unwrap();
    assert!(reg.unit_states().await.unwrap().is_empty());
    assert!(reg.machines().await.unwrap().is_empty());
}

async fn fenced_schedule_write_fails_without_leadership<K: Kv>(reg: Registry<K>) {
    let entry = ScheduleEntry {
        name: name("a.service"),
        machine: machine("m1"),
        hash: file("/bin/true").hash(),
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    let fence = Fence {
        key: reg.keys().leader(),
        value: "m1".into(),
    };
    let err = reg
        .apply_schedule(Some(&fence), std::slice::from_ref(&entry), &[])
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::LostLeadership), "{err:?}");
    assert!(keys(&reg).await.is_empty());
    let (_, entries) = reg.machine_schedule(&machine("m1")).await.unwrap();
    assert!(entries.is_empty());
}

async fn watch_hints_wake_on_changes_under_the_prefix<K: Kv>(reg: Registry<K>) {
    let m = machine("m1");
    let (rev, _) = reg.machine_schedule(&m).await.unwrap();
    let mut hints = WatchHints::start(reg.kv().clone(), reg.keys().machine_schedule(&m), rev + 1);
    let entry = ScheduleEntry {
        name: name("a.service"),
        machine: m.clone(),
        hash: file("/bin/true").hash(),
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    let written = reg
        .apply_schedule(None, std::slice::from_ref(&entry), &[])
        .await
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(5), hints.changed())
        .await
        .expect("a hint within 5 s")
        .expect("watcher alive");
    assert!(seen >= written, "seen {seen} < written {written}");
}

/// Follows `view` until it equals a fresh snapshot and file listing (5 s at most).
async fn converges<K: Kv>(view: &mut LiveView<K>, reg: &Registry<K>) {
    let want = reg.snapshot().await.unwrap();
    let want_files = reg.files(None).await.unwrap();
    let caught_up = tokio::time::timeout(Duration::from_secs(5), async {
        while *view.snapshot() != want || *view.files() != want_files {
            view.changed().await.unwrap();
        }
    })
    .await;
    assert!(
        caught_up.is_ok(),
        "view never caught up:\n{:#?}\nwanted\n{want:#?}",
        view.snapshot()
    );
}

async fn live_view_follows_every_change<K: Kv>(reg: Registry<K>) {
    let (a, b) = (name("a.service"), name("b.service"));
    let CreateOutcome::Created(unit_a) = reg
        .create_unit(&a, &file("/bin/a"), DesiredState::Launched)
        .await
        .unwrap()
    else {
        panic!("a exists");
    };
    let mut view = LiveView::start(reg.clone()).await.unwrap();
    assert_eq!(view.snapshot(), &reg.snapshot().await.unwrap());
    assert_eq!(view.files().len(), 1);

    // Units and files, replaced and destroyed (the old file goes with its last unit).
    reg.create_unit(&b, &file("/bin/b"), DesiredState::Loaded)
        .await
        .unwrap();
    let unit_a = reg
        .replace_unit(&unit_a, &file("/bin/a2"), DesiredState::Launched)
        .await
        .unwrap();
    converges(&mut view, &reg).await;
    assert_eq!(view.files().len(), 2);
    let unit_b = reg.unit(&b).await.unwrap().unwrap();
    reg.destroy_unit(&unit_b).await.unwrap();
    converges(&mut view, &reg).await;

    // A machine, its schedule and states; then it goes and takes its states along.
    let presence = reg
        .register_machine(&info("m1"), Duration::from_secs(10), None)
        .await
        .unwrap();
    let entry = ScheduleEntry {
        name: a.clone(),
        machine: machine("m1"),
        hash: unit_a.hash(),
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    reg.apply_schedule(None, std::slice::from_ref(&entry), &[])
        .await
        .unwrap();
    let state = UnitStateRecord {
        name: a.clone(),
        machine: machine("m1"),
        hash: Some(unit_a.hash()),
        systemd: SystemdState {
            load: "loaded".into(),
            active: "active".into(),
            sub: "running".into(),
        },
        drop_ins: vec![],
        restart: 0,
        restart_pending: false,
    };
    reg.publish_state(&presence, &state).await.unwrap();
    converges(&mut view, &reg).await;
    let touched = {
        reg.unregister(&presence).await.unwrap();
        let mut touched = view.changed().await.unwrap();
        while !touched.machines || !touched.states {
            let more = view.changed().await.unwrap();
            touched.machines |= more.machines;
            touched.states |= more.states;
        }
        touched
    };
    assert!(!touched.only_states());
    converges(&mut view, &reg).await;

    // The engine's writes: seen at once through record_writes, then the same by their events.
    let leader = reg
        .campaign(&machine("m1"), Duration::from_secs(10))
        .await
        .unwrap()
        .expect("no other leader");
    let writes = vec![
        EngineWrite::Unschedule {
            machine: machine("m1"),
            unit: a.clone(),
        },
        EngineWrite::Unschedulable {
            unit: a.clone(),
            reason: "no machine".into(),
        },
    ];
    leader.write(&writes).await.unwrap();
    view.record_writes(&writes);
    assert!(view.snapshot().schedule.is_empty());
    assert_eq!(view.snapshot().unscheduled[&a], "no machine");
    converges(&mut view, &reg).await;
    let writes = vec![EngineWrite::ClearUnschedulable { unit: a.clone() }];
    leader.write(&writes).await.unwrap();
    view.record_writes(&writes);
    assert!(view.snapshot().unscheduled.is_empty());
    converges(&mut view, &reg).await;

    // Without files (fleetctl's wait): the same snapshot, no file kept, new files ignored.
    let mut bare = LiveView::start_without_files(reg.clone()).await.unwrap();
    reg.create_unit(&b, &file("/bin/b2"), DesiredState::Loaded)
        .await
        .unwrap();
    let want = reg.snapshot().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while *bare.snapshot() != want {
            bare.changed().await.unwrap();
        }
    })
    .await
    .expect("the view without files caught up");
    assert!(bare.files().is_empty());
}

/// Only the fake can cut the stream on demand: an outage ends every watch, and the view
/// says it lost track instead of waiting forever (the engine then reads everything again).
#[tokio::test]
async fn live_view_reports_a_broken_watch() {
    let kv = MemKv::new();
    let reg = Registry::new(kv.clone(), PREFIX);
    let mut view = LiveView::start(reg).await.unwrap();
    kv.set_unavailable(true);
    let err = view.changed().await.unwrap_err();
    assert!(matches!(err, RegistryError::ViewLost(_)), "{err:?}");
    assert!(err.is_transient());
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
    creates_a_unit_with_its_file_and_reference,
    refuses_to_create_an_existing_unit_and_returns_it,
    replace_collects_the_old_file,
    shared_file_survives_until_its_last_unit_goes,
    stale_replace_is_a_conflict_and_writes_nothing,
    concurrent_replaces_have_exactly_one_winner,
    reads_many_named_units_in_transactions_of_at_most_128_gets,
    snapshot_reads_everything_at_one_revision,
    second_machine_with_same_id_is_refused,
    states_vanish_with_the_machine_lease,
    fenced_schedule_write_fails_without_leadership,
    watch_hints_wake_on_changes_under_the_prefix,
    live_view_follows_every_change,
);
