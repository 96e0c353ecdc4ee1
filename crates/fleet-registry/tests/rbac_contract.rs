//! The etcd roles of `fleet_registry::rbac` against the role handles, on both sides: the
//! fake RBAC store (`kv::Rbac` over `MemKv`) and a real etcd with authentication on, each
//! body run on both so the fake cannot drift from etcd's RBAC.
//!
//! What they prove (docs/security.md, Proof): a host's credentials reach its own keys and
//! nothing else (not another machine's schedule, states, presence or lease, not a unit, not
//! the leader key), and does its own work; an agent-only host cannot campaign; the operator never writes a
//! schedule, a state or a presence; the viewer writes nothing. Every refusal is
//! `PermissionDenied` and leaves the registry as it was (read back as root).
//!
//! Run with `cargo test -p fleet-registry --features test-etcd --test rbac_contract`.
#![cfg(feature = "test-etcd")]

use std::time::Duration;

use fleet_core::{DesiredState, MachineId, MachineInfo, SystemdState, UnitFile, UnitName};
use fleet_registry::kv::{EtcdKv, Kv, KvError, MemKv, Rbac, Txn, TxnOp};
use fleet_registry::rbac::{self, ApiGrant, HostGrant, RoleSpec};
use fleet_registry::{
    EngineRole, Keys, MachineRole, Registry, RegistryError, ScheduleEntry, UnitStateRecord,
    UnitsRole,
};
use fleet_testing::TestEtcd;

const PREFIX: &str = "/rbac/";
const TTL: Duration = Duration::from_secs(30);

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
        disable_engine: true,
        api: String::new(),
        fence_at: None,
    }
}

fn state(unit: &str, m: &str) -> UnitStateRecord {
    UnitStateRecord {
        name: name(unit),
        machine: machine(m),
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
    }
}

fn keys() -> Keys {
    Keys::new(PREFIX)
}

/// The roles of an agent-only host `m` (no engine, no API).
fn agent_host(m: &str) -> Vec<RoleSpec> {
    rbac::host_roles(
        &keys(),
        &HostGrant {
            machine: machine(m),
            engine: false,
            api: ApiGrant::None,
        },
    )
}

/// The roles of an engine-capable host `m` without API.
fn engine_host(m: &str) -> Vec<RoleSpec> {
    rbac::host_roles(
        &keys(),
        &HostGrant {
            machine: machine(m),
            engine: true,
            api: ApiGrant::None,
        },
    )
}

/// One side of the contract: a registry seen by the superuser, and registries seen by users
/// holding exactly given roles.
trait Side {
    type Root: Kv;
    type User: Kv;
    fn root(&self) -> Registry<Self::Root>;
    async fn user(&self, user: &str, roles: Vec<RoleSpec>) -> Registry<Self::User>;
}

struct Fake {
    store: MemKv,
}

impl Side for Fake {
    type Root = MemKv;
    type User = Rbac<MemKv>;
    fn root(&self) -> Registry<MemKv> {
        Registry::new(self.store.clone(), PREFIX)
    }
    async fn user(&self, user: &str, roles: Vec<RoleSpec>) -> Registry<Rbac<MemKv>> {
        Registry::new(Rbac::new(self.store.clone(), user, roles), PREFIX)
    }
}

struct Real {
    etcd: TestEtcd,
    root: EtcdKv,
}

impl Side for Real {
    type Root = EtcdKv;
    type User = EtcdKv;
    fn root(&self) -> Registry<EtcdKv> {
        Registry::new(self.root.clone(), PREFIX)
    }
    async fn user(&self, user: &str, roles: Vec<RoleSpec>) -> Registry<EtcdKv> {
        let cfg = self.etcd.issue_user(user, &roles).await;
        Registry::new(EtcdKv::connect(&cfg).await.unwrap(), PREFIX)
    }
}

/// Every key and value under the prefix, read as the superuser.
async fn everything<K: Kv>(root: &Registry<K>) -> Vec<(String, Vec<u8>)> {
    let res = root.raw_kv().range(PREFIX, true, None).await.unwrap();
    res.kvs.into_iter().map(|kv| (kv.key, kv.value)).collect()
}

fn put(key: String) -> Txn {
    Txn {
        success: vec![TxnOp::Put {
            key,
            value: b"forged".to_vec(),
            lease: None,
        }],
        ..Txn::default()
    }
}

fn delete(key: String) -> Txn {
    Txn {
        success: vec![TxnOp::Delete { key, prefix: false }],
        ..Txn::default()
    }
}

/// A refusal of `user`; for a transaction of one op on `key`, both sides name it alike.
fn assert_denied_kv<T: std::fmt::Debug>(result: Result<T, KvError>, user: &str, tried: &str) {
    match result {
        Err(KvError::PermissionDenied { user: who, .. }) if who == user => {}
        other => panic!("{tried}: expected a refusal for {user}, got {other:?}"),
    }
}

/// What a refusal of a one-op transaction says: `write KEY` or `delete KEY`.
fn what_of(txn: &Txn) -> String {
    match &txn.success[..] {
        [TxnOp::Put { key, .. }] => format!("write {key}"),
        [TxnOp::Delete { key, .. }] => format!("delete {key}"),
        other => panic!("not a one-op transaction: {other:?}"),
    }
}

fn assert_denied_txn(
    result: Result<fleet_registry::kv::TxnResult, KvError>,
    user: &str,
    txn: &Txn,
) {
    match result {
        Err(KvError::PermissionDenied { user: who, what }) if who == user => {
            assert_eq!(what, what_of(txn));
        }
        other => panic!(
            "{}: expected a refusal for {user}, got {other:?}",
            what_of(txn)
        ),
    }
}

fn assert_denied<T: std::fmt::Debug>(result: Result<T, RegistryError>, user: &str, tried: &str) {
    match result {
        Err(RegistryError::Kv {
            cause: KvError::PermissionDenied { user: who, .. },
            ..
        }) if who == user => {}
        other => panic!("{tried}: expected a refusal for {user}, got {other:?}"),
    }
}

/// Machine m2 registered with a running unit and a schedule entry, unit `a.service` created,
/// and m1's schedule holding it: what the refusals below must leave untouched.
async fn populated<S: Side>(side: &S) {
    let root = side.root();
    let f = file("/bin/true");
    UnitsRole::new(root.clone())
        .create_unit(&name("a.service"), &f, DesiredState::Launched)
        .await
        .unwrap();
    let m2 = MachineRole::new(root.clone(), machine("m2"));
    let presence = m2.register(&info("m2"), TTL, None).await.unwrap();
    m2.publish_state(&presence, &state("a.service", "m2"))
        .await
        .unwrap();
    let entry = |m: &str| ScheduleEntry {
        name: name("a.service"),
        machine: machine(m),
        hash: f.hash(),
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    root.write_schedule(&[entry("m1"), entry("m2")], &[])
        .await
        .unwrap();
}

async fn a_host_cannot_write_another_machines_keys_nor_a_unit_nor_the_leader<S: Side>(side: S) {
    populated(&side).await;
    let before = everything(&side.root()).await;
    let host = side.user("fleet-host-m1", agent_host("m1")).await;
    let kv = host.raw_kv();
    let k = keys();
    let (a, m1, m2) = (name("a.service"), machine("m1"), machine("m2"));
    let tries = [
        put(k.schedule(&m2, &a)),    // put m2's schedule
        put(k.schedule(&m1, &a)),    // put its own schedule
        delete(k.schedule(&m2, &a)), // delete m2's schedule
        put(k.state(&m2, &a)),       // put m2's state
        delete(k.state(&m2, &a)),    // delete m2's state
        put(k.machine(&m2)),         // put m2's presence
        delete(k.machine(&m2)),      // delete m2's presence
        put(k.unit(&a)),             // put a unit
        delete(k.unit(&a)),          // delete a unit
        put(k.leader()),             // put the leader key
    ];
    for txn in tries {
        assert_denied_txn(kv.txn(txn.clone()).await, "fleet-host-m1", &txn);
    }
    assert_eq!(everything(&side.root()).await, before);
}

async fn a_host_cannot_revoke_another_machines_lease<S: Side>(side: S) {
    let root = side.root();
    let m2 = MachineRole::new(root.clone(), machine("m2"));
    let presence = m2.register(&info("m2"), TTL, None).await.unwrap();
    let before = everything(&root).await;
    let host = side.user("fleet-host-m1", agent_host("m1")).await;
    assert_denied_kv(
        host.raw_kv().revoke(presence.lease()).await,
        "fleet-host-m1",
        "revoke m2's lease",
    );
    assert_eq!(everything(&root).await, before);
    m2.keep_alive(&presence).await.expect("m2's lease lives on");
}

async fn a_host_does_its_own_work<S: Side>(side: S) {
    populated(&side).await;
    let host = side.user("fleet-host-m1", agent_host("m1")).await;
    let me = MachineRole::new(host.clone(), machine("m1"));
    let presence = me.register(&info("m1"), TTL, None).await.expect("register");
    me.keep_alive(&presence).await.expect("keep alive");
    let schedule = me.schedule().await.expect("read its schedule");
    assert_eq!(schedule.items.len(), 1);
    let hash = schedule.items[0].0.hash;
    assert!(me.file(&hash).await.expect("read a file").is_some());
    me.unregister(&presence).await.expect("unregister");
}

async fn a_host_publishes_reads_and_withdraws_its_own_states<S: Side>(side: S) {
    populated(&side).await;
    let host = side.user("fleet-host-m1", agent_host("m1")).await;
    let me = MachineRole::new(host.clone(), machine("m1"));
    let presence = me.register(&info("m1"), TTL, None).await.expect("register");
    me.publish_state(&presence, &state("a.service", "m1"))
        .await
        .expect("publish its state");
    let published = me.published_states().await.expect("read its states");
    assert_eq!(published.items, vec![state("a.service", "m1")]);
    me.remove_state(&name("a.service"))
        .await
        .expect("withdraw its state");
    // m2's state, which it could not touch, is still there.
    let root_states = MachineRole::new(side.root(), machine("m2"))
        .published_states()
        .await
        .unwrap();
    assert_eq!(root_states.items, vec![state("a.service", "m2")]);
}

async fn an_agent_only_host_cannot_campaign<S: Side>(side: S) {
    let host = side.user("fleet-host-m1", agent_host("m1")).await;
    let err = EngineRole::new(host)
        .campaign(&machine("m1"), TTL)
        .await
        .map(|l| l.is_some());
    let text = match &err {
        Err(e) => e.to_string(),
        Ok(_) => String::new(),
    };
    assert_denied(err, "fleet-host-m1", "campaign");
    assert!(text.contains("'fleet-host-m1' may not "), "{text}");
    assert_eq!(side.root().leader().await.unwrap(), None);
}

async fn an_engine_host_campaigns_and_schedules<S: Side>(side: S) {
    let host = side.user("fleet-host-m1", engine_host("m1")).await;
    let leadership = EngineRole::new(host)
        .campaign(&machine("m1"), TTL)
        .await
        .expect("campaign")
        .expect("elected");
    let entry = ScheduleEntry {
        name: name("a.service"),
        machine: machine("m2"),
        hash: file("/bin/true").hash(),
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    leadership
        .write(&[fleet_registry::EngineWrite::Schedule(entry)])
        .await
        .expect("a fenced schedule write")
        .expect("still leading");
    assert_eq!(side.root().leader().await.unwrap(), Some(machine("m1")));
}

async fn the_operator_writes_units_but_no_schedule_state_or_presence<S: Side>(side: S) {
    populated(&side).await;
    let op = side
        .user("fleet-operator", vec![rbac::operator(&keys())])
        .await;
    UnitsRole::new(op.clone())
        .create_unit(&name("b.service"), &file("/bin/b"), DesiredState::Launched)
        .await
        .expect("the operator creates units");
    let before = everything(&side.root()).await;
    let k = keys();
    let (a, m1) = (name("a.service"), machine("m1"));
    for txn in [
        put(k.schedule(&m1, &a)), // put a schedule
        put(k.state(&m1, &a)),    // put a state
        put(k.machine(&m1)),      // put a presence
        put(k.leader()),          // put the leader key
    ] {
        assert_denied_txn(op.raw_kv().txn(txn.clone()).await, "fleet-operator", &txn);
    }
    assert_eq!(everything(&side.root()).await, before);
}

async fn the_viewer_reads_and_writes_nothing<S: Side>(side: S) {
    populated(&side).await;
    let before = everything(&side.root()).await;
    let viewer = side.user("fleet-viewer", vec![rbac::viewer(&keys())]).await;
    let units = UnitsRole::new(viewer.clone());
    assert_eq!(units.units().await.expect("list units").items.len(), 1);
    viewer.snapshot().await.expect("a snapshot");
    assert_denied(
        units
            .create_unit(&name("b.service"), &file("/bin/b"), DesiredState::Launched)
            .await,
        "fleet-viewer",
        "create a unit",
    );
    let existing = units.unit(&name("a.service")).await.unwrap().unwrap();
    assert_denied(
        units.set_desired(&existing, DesiredState::Inactive).await,
        "fleet-viewer",
        "stop a unit",
    );
    assert_denied(
        units.destroy_unit(&existing).await,
        "fleet-viewer",
        "destroy a unit",
    );
    assert_eq!(everything(&side.root()).await, before);
}

/// Issue 41: a host writes its own agent's events and no other machine's (the refusal is
/// counted by its writer, and nothing lands), the engine and the operator write their own,
/// and a viewer reads them all and writes none.
async fn each_host_writes_its_own_events_and_a_viewer_reads_them_all<S: Side>(side: S) {
    use fleet_registry::{Event, EventConfig, EventFilter, EventKind, EventStats};
    let close = Duration::from_secs(10);
    let a = name("a.service");
    let host = side.user("fleet-host-m1", engine_host("m1")).await;
    let stats = EventStats::default();
    let forged = MachineRole::new(host.clone(), machine("m2"))
        .event_log(EventConfig::default(), stats.clone());
    forged
        .sink()
        .emit(Event::now(EventKind::Failed, "forged").unit(&a));
    forged.close(close).await;
    assert_eq!((stats.get("failed"), stats.get("written")), (1, 0));
    let own = MachineRole::new(host.clone(), machine("m1"))
        .event_log(EventConfig::default(), stats.clone());
    own.sink().emit(Event::now(EventKind::Started, "").unit(&a));
    own.close(close).await;
    let engine = EngineRole::new(host).event_log(EventConfig::default(), stats.clone());
    engine
        .sink()
        .emit(Event::now(EventKind::Scheduled, "").unit(&a));
    engine.close(close).await;
    let operator = side
        .user("fleet-operator", vec![rbac::operator(&keys())])
        .await;
    let user = UnitsRole::new(operator).event_log(EventConfig::default(), stats.clone());
    user.sink()
        .emit(Event::now(EventKind::Submitted, "").unit(&a));
    user.close(close).await;
    assert_eq!((stats.get("failed"), stats.get("written")), (1, 3));

    let viewer = side.user("fleet-viewer", vec![rbac::viewer(&keys())]).await;
    let seen = viewer
        .events(&EventFilter::default())
        .await
        .expect("a viewer reads events");
    let reasons: Vec<&str> = seen.items.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(seen.items.len(), 3, "{reasons:?}");
    assert!(!reasons.contains(&"forged"));
    let written = UnitsRole::new(viewer).event_log(EventConfig::default(), stats.clone());
    written
        .sink()
        .emit(Event::now(EventKind::Submitted, "").unit(&a));
    written.close(close).await;
    assert_eq!(stats.get("failed"), 2, "a viewer wrote an event");
}

macro_rules! contract {
    ($($test:ident),* $(,)?) => {
        mod fake {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(super::Fake { store: super::MemKv::new() }).await;
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test]
                async fn $test() {
                    let etcd = super::TestEtcd::start_auth().await;
                    let root = etcd.kv().await;
                    super::$test(super::Real { etcd, root }).await;
                }
            )*
        }
    };
}

contract!(
    a_host_cannot_write_another_machines_keys_nor_a_unit_nor_the_leader,
    a_host_cannot_revoke_another_machines_lease,
    a_host_does_its_own_work,
    a_host_publishes_reads_and_withdraws_its_own_states,
    an_agent_only_host_cannot_campaign,
    an_engine_host_campaigns_and_schedules,
    the_operator_writes_units_but_no_schedule_state_or_presence,
    the_viewer_reads_and_writes_nothing,
    each_host_writes_its_own_events_and_a_viewer_reads_them_all,
);

/// Only real etcd has passwords.
#[tokio::test]
async fn a_host_with_a_wrong_password_is_refused_its_credentials() {
    let etcd = TestEtcd::start_auth().await;
    let mut cfg = etcd.issue_user("fleet-host-m1", &agent_host("m1")).await;
    if let Some(auth) = &mut cfg.auth {
        auth.password.push_str("-wrong");
    }
    let host = Registry::new(EtcdKv::connect(&cfg).await.unwrap(), PREFIX);
    let err = MachineRole::new(host, machine("m1"))
        .register(&info("m1"), TTL, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RegistryError::Kv { cause: KvError::AuthFailed { user, .. }, .. } if user == "fleet-host-m1"),
        "{err:?}"
    );
    assert!(!err.is_transient());
}
