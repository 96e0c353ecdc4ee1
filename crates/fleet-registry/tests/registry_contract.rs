//! Contract tests of the typed registry: every body runs against the in-memory `MemKv` and
//! against a real etcd started by the test, so the fake cannot drift from etcd.

use fleet_core::{DesiredState, MachineId, MachineInfo, SystemdState, UnitFile, UnitName};
use fleet_registry::kv::{
    Hook, Hooked, Kv, KvError, LeaseId, MemKv, RANGE_PAGE, Rbac, Request, Txn, TxnOp,
};
use fleet_registry::{
    CreateOutcome, EngineRole, EngineWrite, Key, Keys, LiveView, MachineRole, NewUnit, Registry,
    RegistryError, ScheduleEntry, SharedStore, Store, UnitStateRecord, UnitsRole, batches,
};
use fleet_testing::TestEtcd;
use std::collections::BTreeSet;
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
        api: String::new(),
        fence_at: None,
    }
}

/// Every key under the prefix, for "nothing else was written" checks.
fn writer<K: Kv>(reg: &Registry<K>) -> UnitsRole<K> {
    UnitsRole::new(reg.clone())
}

/// The role of machine `m1`, the machine every test here registers.
fn m1<K: Kv>(reg: &Registry<K>) -> MachineRole<K> {
    MachineRole::new(reg.clone(), machine("m1"))
}

async fn keys<K: Kv>(reg: &Registry<K>) -> Vec<String> {
    let res = reg.raw_kv().range(PREFIX, true, None).await.unwrap();
    res.kvs.into_iter().map(|kv| kv.key).collect()
}

async fn creates_a_unit_with_its_file_and_reference<K: Kv>(reg: Registry<K>) {
    let f = file("/bin/true");
    let out = writer(&reg)
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
    writer(&reg)
        .create_unit(&n, &file("/bin/true"), DesiredState::Inactive)
        .await
        .unwrap();
    let before = keys(&reg).await;
    let out = writer(&reg)
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
    let CreateOutcome::Created(unit) = writer(&reg)
        .create_unit(&n, &file("/bin/true"), DesiredState::Inactive)
        .await
        .unwrap()
    else {
        panic!()
    };
    let new = file("/bin/false");
    let replaced = writer(&reg)
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
        match writer(&reg)
            .create_unit(&name(n), &f, DesiredState::Inactive)
            .await
            .unwrap()
        {
            CreateOutcome::Created(u) => units.push(u),
            other => panic!("{other:?}"),
        }
    }
    writer(&reg).destroy_unit(&units[0]).await.unwrap();
    assert!(reg.file(&f.hash()).await.unwrap().is_some());
    writer(&reg).destroy_unit(&units[1]).await.unwrap();
    assert!(reg.file(&f.hash()).await.unwrap().is_none());
    assert!(keys(&reg).await.is_empty());
}

async fn stale_replace_is_a_conflict_and_writes_nothing<K: Kv>(reg: Registry<K>) {
    let n = name("a.service");
    let CreateOutcome::Created(unit) = writer(&reg)
        .create_unit(&n, &file("/bin/true"), DesiredState::Inactive)
        .await
        .unwrap()
    else {
        panic!()
    };
    // Another client wins the race.
    writer(&reg)
        .replace_unit(&unit, &file("/bin/one"), DesiredState::Inactive)
        .await
        .unwrap();
    let before = keys(&reg).await;
    let err = writer(&reg)
        .replace_unit(&unit, &file("/bin/two"), DesiredState::Inactive)
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::Conflict(_)), "{err:?}");
    assert_eq!(keys(&reg).await, before);
    let err = writer(&reg).destroy_unit(&unit).await.unwrap_err();
    assert!(matches!(err, RegistryError::Conflict(_)), "{err:?}");
    let err = writer(&reg)
        .set_desired(&unit, DesiredState::Launched)
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::Conflict(_)), "{err:?}");
    assert_eq!(keys(&reg).await, before);
}

async fn concurrent_replaces_have_exactly_one_winner<K: Kv>(reg: Registry<K>) {
    let n = name("a.service");
    let CreateOutcome::Created(unit) = writer(&reg)
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
                writer(&reg)
                    .replace_unit(&unit, &file(&format!("/bin/v{i}")), DesiredState::Inactive)
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
        writer(&reg)
            .create_unit(n, &f, DesiredState::Loaded)
            .await
            .unwrap();
    }
    writer(&reg)
        .create_unit(&name("other.service"), &f, DesiredState::Loaded)
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
    writer(&reg)
        .create_unit(&n, &f, DesiredState::Launched)
        .await
        .unwrap();
    let m = machine("m1");
    let presence = m1(&reg)
        .register(&info("m1"), Duration::from_secs(10), None)
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
    reg.write_schedule(std::slice::from_ref(&entry), &[])
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
        restarts: 0,
        since: None,
        exit: None,
    };
    m1(&reg).publish_state(&presence, &state).await.unwrap();
    let snap = reg.snapshot().await.unwrap();
    assert_eq!(snap.units.len(), 1);
    assert_eq!(snap.machines.keys().collect::<Vec<_>>(), vec![&m]);
    assert_eq!(snap.schedule[&n][&m], entry);
    assert_eq!(snap.states[&n][&m], state);
    // A later change is not visible in the snapshot taken before it.
    m1(&reg).remove_state(&n).await.unwrap();
    assert_eq!(snap.states[&n][&m], state);
    assert!(reg.snapshot().await.unwrap().states.is_empty());
}

async fn second_machine_with_same_id_is_refused<K: Kv>(reg: Registry<K>) {
    let first = m1(&reg)
        .register(&info("m1"), Duration::from_secs(10), None)
        .await
        .unwrap();
    let err = m1(&reg)
        .register(&info("m1"), Duration::from_secs(10), None)
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::DuplicateMachine(_)), "{err:?}");
    // The owner of the lease (a restarted fleetd) resumes it.
    let resumed = m1(&reg)
        .register(&info("m1"), Duration::from_secs(10), Some(first.lease()))
        .await
        .unwrap();
    assert!(resumed.resumed());
    assert_eq!(resumed.lease(), first.lease());
}

async fn states_vanish_with_the_machine_lease<K: Kv>(reg: Registry<K>) {
    let presence = m1(&reg)
        .register(&info("m1"), Duration::from_secs(10), None)
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
        restarts: 0,
        since: None,
        exit: None,
    };
    m1(&reg).publish_state(&presence, &state).await.unwrap();
    assert_eq!(reg.unit_states().await.unwrap().items.len(), 1);
    m1(&reg).unregister(&presence).await.unwrap();
    assert!(reg.unit_states().await.unwrap().items.is_empty());
    assert!(reg.machines().await.unwrap().items.is_empty());
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
    // The leadership m1 would hold on some lease, while no engine holds the leader key.
    let leadership = EngineRole::new(reg.clone()).leadership_of(&machine("m1"), LeaseId(7));
    let err = leadership
        .write(&[EngineWrite::Schedule(entry)])
        .await
        .unwrap_err();
    assert!(matches!(err, RegistryError::LostLeadership), "{err:?}");
    assert!(keys(&reg).await.is_empty());
    let entries = reg.machine_schedule(&machine("m1")).await.unwrap().items;
    assert!(entries.is_empty());
}

async fn a_machine_role_writes_for_its_own_machine_only<K: Kv>(reg: Registry<K>) {
    let presence = m1(&reg)
        .register(&info("m1"), Duration::from_secs(10), None)
        .await
        .unwrap();
    let err = m1(&reg)
        .register(&info("m2"), Duration::from_secs(10), None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, RegistryError::ForeignMachine { .. }),
        "{err:?}"
    );
    let state = UnitStateRecord {
        name: name("a.service"),
        machine: machine("m2"),
        hash: None,
        systemd: SystemdState {
            load: "loaded".into(),
            active: "active".into(),
            sub: "running".into(),
        },
        drop_ins: vec![],
        restart: 0,
        restart_pending: false,
        restarts: 0,
        since: None,
        exit: None,
    };
    let err = m1(&reg).publish_state(&presence, &state).await.unwrap_err();
    assert!(
        matches!(err, RegistryError::ForeignMachine { .. }),
        "{err:?}"
    );
    assert_eq!(keys(&reg).await, [format!("{PREFIX}machine/m1")]);
    m1(&reg).unregister(&presence).await.unwrap();
}

async fn watch_hints_wake_on_changes_under_the_prefix<K: Kv>(reg: Registry<K>) {
    let m = machine("m1");
    let rev = reg.machine_schedule(&m).await.unwrap().revision;
    let mut hints = MachineRole::new(reg.clone(), m.clone()).watch_schedule(rev + 1);
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
        .write_schedule(std::slice::from_ref(&entry), &[])
        .await
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(5), hints.changed())
        .await
        .expect("a hint within 5 s")
        .expect("watcher alive");
    assert!(seen >= written, "seen {seen} < written {written}");
}

/// Follows `view` until it equals a fresh snapshot and file listing (5 s at most).
async fn converges<K: Kv>(view: &mut LiveView, reg: &Registry<K>) {
    let want = reg.snapshot().await.unwrap();
    let want_files = reg.files(None).await.unwrap().items;
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

/// Waits until `store` has applied `revision` and equals a fresh snapshot and file listing.
async fn store_converges<K: Kv>(store: &Store, reg: &Registry<K>) {
    let revision = reg.present_revision("test").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), store.reached(revision))
        .await
        .expect("the store follows within 5 s")
        .unwrap();
    let want = reg.snapshot().await.unwrap();
    let want_files = reg.files(None).await.unwrap().items;
    let read = store.read().await;
    assert_eq!(read.snapshot(), &want);
    assert_eq!(read.files(), &want_files);
}

/// The process's store follows every change, as the live view does, and tells each of its
/// subscribers, on its own, which units changed.
async fn store_follows_every_change_and_tells_each_subscriber<K: Kv>(reg: Registry<K>) {
    let (a, b) = (name("a.service"), name("b.service"));
    writer(&reg)
        .create_unit(&a, &file("/bin/a"), DesiredState::Launched)
        .await
        .unwrap();
    let stores = SharedStore::new(reg.clone());
    let store = stores.get().await.unwrap();
    store_converges(&store, &reg).await;
    let (engine, api) = (store.subscribe(), store.subscribe());

    writer(&reg)
        .create_unit(&b, &file("/bin/b"), DesiredState::Loaded)
        .await
        .unwrap();
    let unit_a = reg.unit(&a).await.unwrap().unwrap();
    writer(&reg)
        .replace_unit(&unit_a, &file("/bin/a2"), DesiredState::Launched)
        .await
        .unwrap();
    store_converges(&store, &reg).await;
    assert!(engine.changed().await.unwrap().units);
    {
        let read = store.read().await;
        assert_eq!(
            engine.take(&read).units,
            Some(BTreeSet::from([a.clone(), b.clone()]))
        );
        assert_eq!(
            api.take(&read).units,
            Some(BTreeSet::from([a.clone(), b.clone()]))
        );
    }

    // The engine's writes arrive by their events at the revision they landed at.
    let presence = m1(&reg)
        .register(&info("m1"), Duration::from_secs(10), None)
        .await
        .unwrap();
    let leader = EngineRole::new(reg.clone())
        .campaign(&machine("m1"), Duration::from_secs(10))
        .await
        .unwrap()
        .expect("no other leader");
    let writes = vec![EngineWrite::Unschedulable {
        unit: a.clone(),
        reason: "no machine".into(),
    }];
    let landed = leader.write(&writes).await.unwrap().expect("a write");
    tokio::time::timeout(Duration::from_secs(5), store.reached(landed))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.read().await.snapshot().unscheduled[&a], "no machine");
    let nothing = vec![EngineWrite::ClearUnschedulable { unit: b.clone() }];
    assert_eq!(
        leader.write(&nothing).await.unwrap(),
        None,
        "a write that changed nothing has no revision to wait for"
    );
    m1(&reg).unregister(&presence).await.unwrap();
    store_converges(&store, &reg).await;
    let touched = engine.changed().await.unwrap();
    assert!(touched.departed && touched.unscheduled, "{touched:?}");

    // Every handle shares the one store; the last one dropped ends it.
    let again = stores.get().await.unwrap();
    assert_eq!(again.revision(), store.revision());
    drop((store, again, engine, api));
    assert!(!stores.is_held().await);
}

async fn live_view_follows_every_change<K: Kv>(reg: Registry<K>) {
    let (a, b) = (name("a.service"), name("b.service"));
    let CreateOutcome::Created(unit_a) = writer(&reg)
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
    writer(&reg)
        .create_unit(&b, &file("/bin/b"), DesiredState::Loaded)
        .await
        .unwrap();
    let unit_a = writer(&reg)
        .replace_unit(&unit_a, &file("/bin/a2"), DesiredState::Launched)
        .await
        .unwrap();
    converges(&mut view, &reg).await;
    assert_eq!(view.files().len(), 2);
    let unit_b = reg.unit(&b).await.unwrap().unwrap();
    writer(&reg).destroy_unit(&unit_b).await.unwrap();
    converges(&mut view, &reg).await;

    // A machine, its schedule and states; then it goes and takes its states along.
    let presence = m1(&reg)
        .register(&info("m1"), Duration::from_secs(10), None)
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
    reg.write_schedule(std::slice::from_ref(&entry), &[])
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
        restarts: 0,
        since: None,
        exit: None,
    };
    m1(&reg).publish_state(&presence, &state).await.unwrap();
    converges(&mut view, &reg).await;
    let touched = {
        m1(&reg).unregister(&presence).await.unwrap();
        let mut touched = view.changed().await.unwrap();
        while !touched.departed || !touched.states {
            let more = view.changed().await.unwrap();
            touched.departed |= more.departed;
            touched.machines |= more.machines;
            touched.states |= more.states;
        }
        touched
    };
    assert!(!touched.only_states());
    assert!(
        !touched.machines,
        "a machine leaving changes what no other machine offers"
    );
    converges(&mut view, &reg).await;

    // The engine's writes, by their events.
    let leader = EngineRole::new(reg.clone())
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
    converges(&mut view, &reg).await;
    assert!(view.snapshot().schedule.is_empty());
    assert_eq!(view.snapshot().unscheduled[&a], "no machine");
    let writes = vec![EngineWrite::ClearUnschedulable { unit: a.clone() }];
    leader.write(&writes).await.unwrap();
    converges(&mut view, &reg).await;
    assert!(view.snapshot().unscheduled.is_empty());

    // Without files (fleetctl's wait): the same snapshot, no file kept, new files ignored.
    let mut bare = LiveView::start_without_files(reg.clone()).await.unwrap();
    writer(&reg)
        .create_unit(&b, &file("/bin/b2"), DesiredState::Loaded)
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

/// A valid unit file of just under `size` bytes, `tag` making it unique.
fn big_file(tag: usize, size: usize) -> UnitFile {
    let head = format!("[Unit]\nDescription=big {tag}\n[Service]\nExecStart=/bin/true\n");
    let line = format!("Environment=X={}\n", "x".repeat(1000));
    let lines = (size - head.len() - 64) / line.len();
    UnitFile::parse(format!("{head}{}", line.repeat(lines)).as_bytes()).unwrap()
}

async fn lists_more_than_a_page_and_4_mib_of_unit_files<K: Kv>(reg: Registry<K>) {
    // Five files of almost 1 MiB (the largest fleetctl accepts) and more than a page of units.
    for i in 0..5 {
        let f = big_file(i, fleet_core::unit_file::MAX_UNIT_FILE_BYTES);
        let n = name(&format!("big{i}.service"));
        writer(&reg)
            .create_unit(&n, &f, DesiredState::Launched)
            .await
            .unwrap();
    }
    let small = RANGE_PAGE + 10;
    for i in 0..small {
        let n = name(&format!("small{i:04}.service"));
        writer(&reg)
            .create_unit(&n, &file(&format!("/bin/{i}")), DesiredState::Loaded)
            .await
            .unwrap();
    }
    let snap = reg.snapshot().await.unwrap();
    assert_eq!(snap.units.len(), small + 5);
    assert!(snap.skipped.is_empty());
    let files = reg.files(Some(snap.revision)).await.unwrap();
    assert_eq!(files.items.len(), small + 5);
    let bytes: usize = files.items.values().map(|f| f.canonical().len()).sum();
    assert!(bytes > 4 << 20, "only {bytes} bytes of files");
    assert_eq!(reg.units().await.unwrap().items.len(), small + 5);
    let view = LiveView::start(reg.clone()).await.unwrap();
    assert_eq!(view.snapshot(), &snap);
    assert_eq!(view.files(), &files.items);
}

/// The unreadable values of the corrupt-value tests: a non-JSON unit record, a good record
/// under another unit's key, a non-JSON schedule entry, state and machine, a file that does
/// not parse, an unscheduled reason under a key that is no unit name, a placement history
/// record of a kind no engine writes.
fn corrupt_keys(p: &str) -> Vec<(String, &'static str)> {
    vec![
        (format!("{p}unit/evil1.service"), "not json"),
        (
            format!("{p}unit/evil2.service"),
            r#"{"name":"a.service","hash":"0000000000000000000000000000000000000000","desired":"launched"}"#,
        ),
        (format!("{p}schedule/m1/evil3.service"), "{"),
        (
            Keys::new(p).state(&machine("m1"), &name("evil4.service")),
            "[]",
        ),
        (format!("{p}machine/m9"), "\u{1}"),
        (
            format!("{p}file/1111111111111111111111111111111111111111"),
            "[Service\nExecStart=/bin/true\n",
        ),
        (format!("{p}unscheduled/bad name"), "why"),
        (format!("{p}left/evil5.service/m1"), "running?"),
    ]
}

async fn listings_skip_unreadable_values_and_name_their_keys<K: Kv>(reg: Registry<K>) {
    let a = name("a.service");
    writer(&reg)
        .create_unit(&a, &file("/bin/a"), DesiredState::Launched)
        .await
        .unwrap();
    let presence = m1(&reg)
        .register(&info("m1"), Duration::from_secs(10), None)
        .await
        .unwrap();
    let good = reg.snapshot().await.unwrap();
    let corrupt = corrupt_keys(PREFIX);
    for (key, value) in &corrupt {
        reg.put_raw(key, value).await;
    }
    let snap = reg.snapshot().await.unwrap();
    assert_eq!(snap.units, good.units);
    assert_eq!(snap.machines, good.machines);
    assert!(snap.schedule.is_empty() && snap.states.is_empty() && snap.unscheduled.is_empty());
    assert!(snap.left.is_empty());
    let skipped: Vec<&str> = snap.skipped.keys().map(String::as_str).collect();
    let mut want: Vec<&str> = corrupt.iter().map(|(k, _)| k.as_str()).collect();
    want.retain(|k| !k.contains("/file/"));
    want.sort_unstable();
    assert_eq!(skipped, want);
    let evil2 = &snap.skipped[&format!("{PREFIX}unit/evil2.service")];
    assert!(evil2.detail.contains("unit/a.service"), "{}", evil2.detail);
    assert!(evil2.to_string().contains("unit/evil2.service"), "{evil2}");
    // What each key names, for the engine: the key's own name, not the record's.
    assert_eq!(
        evil2.named.as_deref(),
        Some(&Key::Unit(name("evil2.service")))
    );
    let named = |key: &str| {
        snap.skipped[&format!("{PREFIX}{key}")]
            .named
            .as_deref()
            .cloned()
    };
    assert_eq!(named("machine/m9"), Some(Key::Machine(machine("m9"))));
    assert_eq!(
        named("schedule/m1/evil3.service"),
        Some(Key::Schedule {
            machine: machine("m1"),
            unit: name("evil3.service")
        })
    );
    assert_eq!(named("unscheduled/bad name"), None);

    let files = reg.files(None).await.unwrap();
    assert_eq!(files.items.len(), 1, "{:?}", files.items);
    assert_eq!(files.skipped.len(), 1);
    assert!(
        files.skipped[0]
            .key
            .ends_with("/file/1111111111111111111111111111111111111111")
    );
    let units = reg.units().await.unwrap();
    assert_eq!(units.items.len(), 1);
    assert_eq!(units.skipped.len(), 2);
    let schedule = reg.machine_schedule(&machine("m1")).await.unwrap();
    assert!(schedule.items.is_empty());
    assert_eq!(schedule.skipped.len(), 1);
    assert_eq!(reg.unit_states().await.unwrap().skipped.len(), 1);
    let machines = reg.machines().await.unwrap();
    assert_eq!(machines.items.len(), 1);
    assert_eq!(machines.skipped[0].key, format!("{PREFIX}machine/m9"));
    // Asked for by name, an unreadable record is an error naming its key.
    let err = reg.unit(&name("evil1.service")).await.unwrap_err();
    assert!(
        matches!(&err, RegistryError::Corrupt { key, .. } if key.ends_with("unit/evil1.service")),
        "{err:?}"
    );
    assert!(reg.unit(&name("evil2.service")).await.is_err());
    m1(&reg).unregister(&presence).await.unwrap();
}

async fn destroys_an_unreadable_unit_record_with_its_references<K: Kv>(reg: Registry<K>) {
    let (a, evil) = (name("a.service"), name("evil1.service"));
    writer(&reg)
        .create_unit(&a, &file("/bin/a"), DesiredState::Launched)
        .await
        .unwrap();
    let before = keys(&reg).await;
    let f = file("/bin/evil");
    writer(&reg)
        .create_unit(&evil, &f, DesiredState::Launched)
        .await
        .unwrap();
    reg.put_raw(&reg.keys().unit(&evil), "not json").await;
    // Its file is shared with no one: it goes with its reference.
    assert!(writer(&reg).destroy_unreadable_unit(&evil).await.unwrap());
    assert_eq!(keys(&reg).await, before);
    assert!(!writer(&reg).destroy_unreadable_unit(&evil).await.unwrap());
    // A readable record is not destroyed this way.
    let err = writer(&reg).destroy_unreadable_unit(&a).await.unwrap_err();
    assert!(matches!(err, RegistryError::Conflict(_)), "{err:?}");
    assert_eq!(keys(&reg).await, before);

    // A file another unit still uses stays.
    writer(&reg)
        .create_unit(&evil, &file("/bin/a"), DesiredState::Launched)
        .await
        .unwrap();
    reg.put_raw(&reg.keys().unit(&evil), "{}").await;
    assert!(writer(&reg).destroy_unreadable_unit(&evil).await.unwrap());
    assert_eq!(keys(&reg).await, before);
}

async fn live_view_skips_unreadable_values_until_they_are_repaired<K: Kv>(reg: Registry<K>) {
    let a = name("a.service");
    let CreateOutcome::Created(unit_a) = writer(&reg)
        .create_unit(&a, &file("/bin/a"), DesiredState::Launched)
        .await
        .unwrap()
    else {
        panic!("a exists");
    };
    reg.put_raw(&format!("{PREFIX}unit/evil1.service"), "not json")
        .await;
    let mut view = LiveView::start(reg.clone()).await.unwrap();
    assert_eq!(view.snapshot(), &reg.snapshot().await.unwrap());
    assert_eq!(view.snapshot().skipped.len(), 1);

    // Every kind of unreadable value, then a readable unit over a corrupt one.
    for (key, value) in corrupt_keys(PREFIX) {
        reg.put_raw(&key, value).await;
    }
    converges(&mut view, &reg).await;
    let key_a = reg.keys().unit(&a);
    reg.put_raw(&key_a, "garbage over a good record").await;
    converges(&mut view, &reg).await;
    assert!(!view.snapshot().units.contains_key(&a));
    reg.put_raw(&key_a, &String::from_utf8(record_json(&unit_a)).unwrap())
        .await;
    converges(&mut view, &reg).await;
    assert!(view.snapshot().units.contains_key(&a));
    // Deleting them empties the skip list.
    let delete = TxnOp::Delete {
        key: format!("{PREFIX}unit/evil"),
        prefix: true,
    };
    let txn = Txn {
        success: vec![delete],
        ..Txn::default()
    };
    reg.raw_kv().txn(txn).await.unwrap();
    converges(&mut view, &reg).await;
    assert!(
        view.snapshot()
            .skipped
            .keys()
            .all(|k| !k.contains("unit/evil"))
    );
    // The delete of an unreadable schedule entry takes it out.
    let evil3 = format!("{PREFIX}schedule/m1/evil3.service");
    assert!(view.snapshot().skipped.contains_key(&evil3));
    let deleted = delete_raw(&reg, evil3.clone()).await;
    follow_to(&mut view, deleted).await;
    assert!(!view.snapshot().skipped.contains_key(&evil3));
}

fn record_json(unit: &fleet_registry::Unit) -> Vec<u8> {
    serde_json::to_vec(&unit.record).unwrap()
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

/// Hands each watch on through a channel of one message, counting the messages taken from
/// the store's watch: how fast the watch's reader drains it.
#[derive(Debug, Clone, Default)]
struct Drained(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Hook for Drained {
    async fn before(&self, _: Request<'_>) -> Result<(), KvError> {
        Ok(())
    }

    fn watched(&self, mut inner: fleet_registry::kv::Watch) -> fleet_registry::kv::Watch {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let taken = self.0.clone();
        tokio::spawn(async move {
            while let Some(message) = inner.rx.recv().await {
                taken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if tx.send(message).await.is_err() {
                    break;
                }
            }
        });
        fleet_registry::kv::Watch { rx }
    }
}

/// The engine reads its view between passes; a watch left unread for a pass made etcd 3.4
/// mark it slow and stop applying writes while it caught it up (docs/benchmarks.md, "Scale
/// II"). The view drains its watch as the changes come, read or not.
#[tokio::test]
async fn live_view_drains_its_watch_while_nobody_reads_the_view() {
    let kv = Hooked {
        inner: MemKv::new(),
        hook: Drained::default(),
    };
    let reg = Registry::new(kv.clone(), PREFIX);
    let mut view = LiveView::start(reg.clone()).await.unwrap();
    for i in 0..200 {
        writer(&reg)
            .create_unit(
                &name(&format!("u{i}.service")),
                &file("/bin/true"),
                DesiredState::Launched,
            )
            .await
            .unwrap();
    }
    let taken = || kv.hook.0.load(std::sync::atomic::Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while taken() < 200 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        taken(),
        200,
        "every change taken from the watch before the view is read"
    );
    while view.snapshot().units.len() < 200 {
        view.changed().await.unwrap();
    }
}

/// Fails every transaction that only collects a unit file (one delete of a `file/` key), as
/// an etcd that becomes unreachable right after a destroy or a replace committed.
#[derive(Debug, Clone)]
struct FailCollection;

impl Hook for FailCollection {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        if let Request::Txn(txn) = request
            && let [TxnOp::Delete { key, .. }] = txn.success.as_slice()
            && key.starts_with(&format!("{PREFIX}file/"))
        {
            return Err(KvError::Timeout(Duration::from_secs(1), "test".to_owned()));
        }
        Ok(())
    }
}

async fn a_committed_destroy_or_replace_succeeds_when_collecting_its_file_fails<K: Kv>(
    reg: Registry<K>,
) {
    let failing = Registry::new(
        Hooked {
            inner: reg.raw_kv().clone(),
            hook: FailCollection,
        },
        PREFIX,
    );
    let (a, b) = (file("/bin/a"), file("/bin/b"));
    let CreateOutcome::Created(unit) = writer(&failing)
        .create_unit(&name("x.service"), &a, DesiredState::Launched)
        .await
        .unwrap()
    else {
        panic!("not created");
    };
    let replaced = writer(&failing)
        .replace_unit(&unit, &b, DesiredState::Launched)
        .await
        .unwrap();
    assert_eq!(replaced.hash(), b.hash());
    writer(&failing).destroy_unit(&replaced).await.unwrap();
    assert!(reg.unit(&name("x.service")).await.unwrap().is_none());
    // Both files stay, unreferenced, until a collection succeeds.
    assert!(reg.file(&a.hash()).await.unwrap().is_some());
    writer(&reg).collect_file(&a.hash()).await.unwrap();
    writer(&reg).collect_file(&b.hash()).await.unwrap();
    assert!(keys(&reg).await.is_empty());
}

/// A batch of creates is one transaction within etcd's default `--max-txn-ops` (the etcd run
/// checks that etcd takes each one), and a batch over a unit that exists writes none of it.
async fn creates_units_in_batches_etcd_takes_and_none_over_an_existing_one<K: Kv>(
    reg: Registry<K>,
) {
    let f = file("/bin/true");
    let g = file("/bin/false");
    let names: Vec<UnitName> = (0..200)
        .map(|i| name(&format!("b@{i:03}.service")))
        .collect();
    let units: Vec<NewUnit<'_>> = names
        .iter()
        .enumerate()
        .map(|(i, n)| NewUnit {
            name: n,
            file: if i % 50 == 0 { &g } else { &f },
            desired: DesiredState::Launched,
        })
        .collect();
    let ranges = batches(&units);
    assert!(ranges.len() >= 4, "{ranges:?}");
    for range in &ranges[1..] {
        let created = writer(&reg).create_batch(&units[range.clone()]).await;
        assert_eq!(created.unwrap().unwrap().len(), range.len());
    }
    for n in &names[ranges[1].start..] {
        let unit = reg.unit(n).await.unwrap().unwrap();
        assert_eq!(unit.desired(), DesiredState::Launched);
        assert!(reg.unit_file(&unit).await.is_ok(), "{n}");
    }

    // The first batch again, with one unit that exists now: nothing of it is written.
    let mut again: Vec<NewUnit<'_>> = units[ranges[0].clone()].to_vec();
    again.pop();
    again.push(units[ranges[1].start]);
    let before = keys(&reg).await;
    assert_eq!(writer(&reg).create_batch(&again).await.unwrap(), None);
    assert_eq!(keys(&reg).await, before);

    let too_many: Vec<NewUnit<'_>> = units[..64].to_vec();
    let refused = writer(&reg).create_batch(&too_many).await.unwrap_err();
    assert!(
        matches!(refused, RegistryError::TooManyChanges { .. }),
        "{refused}"
    );
}

/// The engine plans only the units a change touched: the view names them, units whose
/// file changed included, and not the engine's own writes.
async fn live_view_names_the_units_that_changed<K: Kv>(reg: Registry<K>) {
    let (a, b, c) = (name("a.service"), name("b.service"), name("c.service"));
    writer(&reg)
        .create_unit(&a, &file("/bin/a"), DesiredState::Launched)
        .await
        .unwrap();
    let mut view = LiveView::start(reg.clone()).await.unwrap();
    assert_eq!(view.take_changed_units(), Some(BTreeSet::new()));
    for (unit, exec) in [(&b, "/bin/b"), (&c, "/bin/c")] {
        writer(&reg)
            .create_unit(unit, &file(exec), DesiredState::Launched)
            .await
            .unwrap();
    }
    converges(&mut view, &reg).await;
    assert_eq!(
        view.take_changed_units(),
        Some(BTreeSet::from([b.clone(), c.clone()]))
    );
    assert_eq!(view.take_changed_units(), Some(BTreeSet::new()));

    // A schedule entry is not a unit's change, nor is its file put again unchanged (each
    // batch of new units puts its files again); a destroy is. The destroy comes last, so
    // that once the view has it, it has every event before it.
    let unit_b = reg.unit(&b).await.unwrap().unwrap();
    let entry = ScheduleEntry {
        name: a.clone(),
        machine: machine("m1"),
        hash: unit_b.hash(),
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    reg.write_schedule(std::slice::from_ref(&entry), &[])
        .await
        .unwrap();
    let unit_c = reg.unit(&c).await.unwrap().unwrap();
    let key = Keys::new(PREFIX).file(&unit_c.hash());
    let listed = reg.raw_kv().range(&key, false, None).await.unwrap();
    let put = Txn {
        success: vec![TxnOp::Put {
            key: key.clone(),
            value: listed.kvs[0].value.clone(),
            lease: None,
        }],
        ..Txn::default()
    };
    reg.raw_kv().txn(put.clone()).await.unwrap();
    writer(&reg).destroy_unit(&unit_b).await.unwrap();
    converges(&mut view, &reg).await;
    assert_eq!(view.take_changed_units(), Some(BTreeSet::from([b.clone()])));

    // A file that was gone and is back changes its units; the new unit d comes last.
    let delete = Txn {
        success: vec![TxnOp::Delete {
            key: key.clone(),
            prefix: false,
        }],
        ..Txn::default()
    };
    reg.raw_kv().txn(delete).await.unwrap();
    reg.raw_kv().txn(put).await.unwrap();
    let d = name("d.service");
    writer(&reg)
        .create_unit(&d, &file("/bin/d"), DesiredState::Launched)
        .await
        .unwrap();
    converges(&mut view, &reg).await;
    assert_eq!(
        view.take_changed_units(),
        Some(BTreeSet::from([c.clone(), d.clone()]))
    );
}

// ---- issue 37: a host filling its own state prefix ---------------------------------------------

/// A state of unit `s<i>.service` on m1, its key and JSON.
fn numbered_state(keys: &Keys, i: usize) -> (String, Vec<u8>) {
    let record = UnitStateRecord {
        name: name(&format!("s{i:05}.service")),
        machine: machine("m1"),
        hash: None,
        systemd: SystemdState::not_found(),
        drop_ins: Vec::new(),
        restart: 0,
        restart_pending: false,
        restarts: 0,
        since: None,
        exit: None,
    };
    let key = keys.state(&record.machine, &record.name);
    (key, serde_json::to_vec(&record).unwrap())
}

/// Puts the states `range` of m1 raw, as its etcd credentials may; the revision reached.
async fn put_numbered_states<K: Kv>(reg: &Registry<K>, range: std::ops::Range<usize>) -> i64 {
    let ops: Vec<TxnOp> = range
        .map(|i| {
            let (key, value) = numbered_state(reg.keys(), i);
            TxnOp::Put {
                key,
                value,
                lease: None,
            }
        })
        .collect();
    let mut revision = 0;
    for chunk in ops.chunks(fleet_registry::MAX_TXN_OPS) {
        let txn = Txn {
            success: chunk.to_vec(),
            ..Txn::default()
        };
        revision = reg.raw_kv().txn(txn).await.unwrap().revision;
    }
    revision
}

async fn delete_raw<K: Kv>(reg: &Registry<K>, key: String) -> i64 {
    let txn = Txn {
        success: vec![TxnOp::Delete { key, prefix: false }],
        ..Txn::default()
    };
    reg.raw_kv().txn(txn).await.unwrap().revision
}

async fn follow_to(view: &mut LiveView, revision: i64) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while view.revision() < revision {
            view.changed().await.unwrap();
        }
    })
    .await
    .expect("the view follows");
}

/// Issue 37, item 7: one machine's credentials write more states under its prefix than a
/// machine may publish. Every reader takes the first `MAX_STATES_PER_MACHINE` in key order,
/// leaves the rest out unread and reports them once, at the machine's state prefix; the view
/// that follows the watch counts them as they come and go.
async fn a_machines_states_past_its_bound_are_left_out_and_reported_once<K: Kv>(reg: Registry<K>) {
    use fleet_registry::MAX_STATES_PER_MACHINE as MAX;
    let m1 = machine("m1");
    let prefix = reg.keys().machine_states(&m1);
    put_numbered_states(&reg, 0..MAX + 5).await;
    let past_name = |i: usize| name(&format!("s{i:05}.service"));

    let snap = reg.snapshot().await.unwrap();
    assert_eq!(snap.states.len(), MAX);
    assert!(snap.states.contains_key(&past_name(MAX - 1)));
    assert!(!snap.states.contains_key(&past_name(MAX)));
    assert_eq!(snap.state_bound.past(&m1), 5);
    assert_eq!(snap.skipped.len(), 1, "{:?}", snap.skipped);
    let report = &snap.skipped[&prefix];
    assert!(
        report
            .detail
            .contains("more unit states than a machine may (10000); 5 past"),
        "{}",
        report.detail
    );

    for listing in [
        reg.unit_states().await.unwrap(),
        reg.machine_states(&m1).await.unwrap(),
    ] {
        assert_eq!(listing.items.len(), MAX);
        assert_eq!(listing.skipped.len(), 1);
        assert_eq!(listing.skipped[0].key, prefix);
    }

    let mut view = LiveView::start(reg.clone()).await.unwrap();
    assert_eq!(view.snapshot(), &snap);
    // A new key while the machine is at its bound is left out too, one more counted.
    let rev = put_numbered_states(&reg, MAX + 5..MAX + 6).await;
    follow_to(&mut view, rev).await;
    assert_eq!(view.snapshot().state_bound.past(&m1), 6);
    assert_eq!(view.snapshot().states.len(), MAX);
    // A key taken in goes: the next new key fits (the view takes keys as they come).
    let (first, _) = numbered_state(reg.keys(), 0);
    let rev = delete_raw(&reg, first).await;
    follow_to(&mut view, rev).await;
    assert_eq!(view.snapshot().states.len(), MAX - 1);
    let rev = put_numbered_states(&reg, MAX + 6..MAX + 7).await;
    follow_to(&mut view, rev).await;
    assert_eq!(view.snapshot().states.len(), MAX);
    assert!(view.snapshot().states.contains_key(&past_name(MAX + 6)));
    // Keys left out go: counted down; the report goes with the last.
    for i in MAX..MAX + 6 {
        let (key, _) = numbered_state(reg.keys(), i);
        let rev = delete_raw(&reg, key).await;
        follow_to(&mut view, rev).await;
        assert_eq!(view.snapshot().state_bound.past(&m1), MAX + 5 - i);
    }
    assert!(view.snapshot().skipped.is_empty());
    assert_eq!(view.snapshot(), &reg.snapshot().await.unwrap());
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
    a_machine_role_writes_for_its_own_machine_only,
    watch_hints_wake_on_changes_under_the_prefix,
    live_view_follows_every_change,
    store_follows_every_change_and_tells_each_subscriber,
    live_view_names_the_units_that_changed,
    lists_more_than_a_page_and_4_mib_of_unit_files,
    listings_skip_unreadable_values_and_name_their_keys,
    destroys_an_unreadable_unit_record_with_its_references,
    live_view_skips_unreadable_values_until_they_are_repaired,
    a_committed_destroy_or_replace_succeeds_when_collecting_its_file_fails,
    creates_units_in_batches_etcd_takes_and_none_over_an_existing_one,
    a_machines_states_past_its_bound_are_left_out_and_reported_once,
);

// ---- issue 17: each role handle on the fake RBAC store holding only its role -------------------

/// The store as an etcd user holding only `role` sees it.
fn as_role(kv: &MemKv, role: fleet_registry::rbac::RoleSpec) -> Registry<Rbac<MemKv>> {
    Registry::new(Rbac::new(kv.clone(), role.name.clone(), vec![role]), PREFIX)
}

/// fleetctl's writes (submit, start, restart, replace, drain, metadata, destroy) need nothing
/// beyond `rbac::operator`, and its listings nothing beyond `rbac::viewer`.
#[tokio::test(start_paused = true)]
async fn the_units_role_needs_only_the_operator_role_and_listings_only_the_viewer_role() {
    let kv = MemKv::new();
    let keys = Keys::new(PREFIX);
    let admin = Registry::new(kv.clone(), PREFIX);
    MachineRole::new(admin.clone(), machine("m1"))
        .register(&info("m1"), Duration::from_secs(60), None)
        .await
        .unwrap();
    let ops = UnitsRole::new(as_role(&kv, fleet_registry::rbac::operator(&keys)));
    let a = name("a.service");
    ops.create_unit(&a, &file("/bin/a"), DesiredState::Loaded)
        .await
        .unwrap();
    let unit = ops.unit(&a).await.unwrap().unwrap();
    let unit = ops
        .set_desired(&unit, DesiredState::Launched)
        .await
        .unwrap();
    let unit = ops.request_restart(&unit).await.unwrap();
    let unit = ops
        .replace_unit(&unit, &file("/bin/a2"), DesiredState::Launched)
        .await
        .unwrap();
    ops.drain(&machine("m1"), 1).await.unwrap();
    ops.undrain(&machine("m1")).await.unwrap();
    ops.change_metadata(&[fleet_registry::MetadataChange::Set {
        machine: machine("m1"),
        key: "tier".parse().unwrap(),
        value: "web".into(),
    }])
    .await
    .unwrap();
    ops.destroy_unit(&unit).await.unwrap();

    let view = as_role(&kv, fleet_registry::rbac::viewer(&keys));
    view.units().await.unwrap();
    view.machines().await.unwrap();
    view.unit_states().await.unwrap();
    view.snapshot().await.unwrap();
    view.drains().await.unwrap();
    view.dynamic_metadata().await.unwrap();
    view.leader().await.unwrap();
    let refused = UnitsRole::new(view)
        .create_unit(&name("b.service"), &file("/bin/b"), DesiredState::Loaded)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("may not write"), "{refused}");
}
