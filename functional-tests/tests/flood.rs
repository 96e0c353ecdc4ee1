//! Issue 37, item 7: one host's etcd credentials (etcd's auth on, the roles `fleetctl auth
//! setup` makes) fill the host's own state prefix with more unit states than a machine may
//! publish. The engine still schedules, `list-units` still answers and says what it left
//! out, and the leader reports the host once. Two machines of real systemd, one etcd; needs
//! root.

mod support;

use anyhow::{Context, Result, ensure};
use fleet_core::{MachineId, SystemdState};
use fleet_functional_tests::metrics::scrape;
use fleet_functional_tests::{
    Cluster, ClusterSpec, EtcdAuthSpec, FleetdSpec, TestRegistry, cleanup_stale, wait_for,
};
use fleet_registry::kv::{EtcdAuth, Kv, Txn, TxnOp};
use fleet_registry::{Keys, MAX_STATES_PER_MACHINE, MAX_TXN_OPS, UnitStateRecord};
use std::time::Duration;
use support::{POLL, PREFIX, finish, fleetd_log_all, leader, sleeper};

/// A start, and the leader's report: a few agent TTLs at most.
const CONVERGE: Duration = Duration::from_secs(60);

/// How many states past the bound the host writes.
const PAST: usize = 50;

/// Machine `m`'s etcd user, as `functional_tests::auth` made it.
fn host_auth(m: &MachineId) -> EtcdAuth {
    EtcdAuth {
        username: fleet_registry::rbac::host_user_name(m),
        password: format!("host-{m}"),
    }
}

/// Writes, with `host`'s credentials, `MAX_STATES_PER_MACHINE + PAST` states of units that
/// do not exist under machine `m`'s own prefix, 128 to a transaction.
fn flood(host: &TestRegistry, m: &MachineId) -> Result<()> {
    let keys = Keys::new(PREFIX);
    let ops: Vec<TxnOp> = (0..MAX_STATES_PER_MACHINE + PAST)
        .map(|i| {
            let state = UnitStateRecord {
                name: format!("flood{i:05}.service").parse()?,
                machine: m.clone(),
                hash: None,
                systemd: SystemdState {
                    load: "loaded".into(),
                    active: "active".into(),
                    sub: "running".into(),
                },
                drop_ins: Vec::new(),
                restart: 0,
                restart_pending: false,
                restarts: 0,
                since: None,
                exit: None,
            };
            Ok(TxnOp::Put {
                key: keys.state(m, &state.name),
                value: serde_json::to_vec(&state)?,
                lease: None,
            })
        })
        .collect::<Result<_>>()?;
    for chunk in ops.chunks(MAX_TXN_OPS) {
        let txn = Txn {
            success: chunk.to_vec(),
            ..Txn::default()
        };
        let res = host.block_on(host.registry().raw_kv().txn(txn))?;
        ensure!(res.succeeded, "a transaction of states was not applied");
    }
    Ok(())
}

#[test]
fn a_host_writing_more_states_than_a_machine_may_leaves_the_cluster_answering() -> Result<()> {
    cleanup_stale()?;
    let spec = FleetdSpec::default().with_etcd_auth(EtcdAuthSpec {
        machine_only: vec![],
    });
    let mut cluster = Cluster::start(ClusterSpec::with_fleetd(2, spec))?;
    cluster.set_driver(fleet_functional_tests::Driver::Etcd);
    let root = TestRegistry::of(&cluster)?;
    support::wait_registered(&cluster, &root)?;
    let m2 = cluster.machine("m2")?.id().clone();
    let host = TestRegistry::connect_as(&cluster.etcd_endpoint(), PREFIX, Some(host_auth(&m2)))?;
    flood(&host, &m2).context("m2's user writes its own states")?;

    // The engine still places a new unit, and list-units says what it left out.
    let dir = cluster.dir().join("units");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("after-flood.service");
    std::fs::write(&path, sleeper(370_001))?;
    let path = path.display().to_string();
    let out = cluster.fleetctl(["start", "--block-attempts=20", &path])?;
    ensure!(out.status.success(), "start after the flood: {out:?}");
    let bound = format!("publishes more unit states than a machine may ({MAX_STATES_PER_MACHINE})");
    let out = cluster.fleetctl(["list-units", "--no-legend"])?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    ensure!(out.status.success(), "list-units: {out:?}");
    ensure!(
        stdout.contains("after-flood.service"),
        "list-units: {stdout}"
    );
    let prefix = Keys::new(PREFIX).machine_states(&m2);
    let told = stderr
        .lines()
        .filter(|l| l.contains(&bound) && l.contains(&prefix))
        .count();
    ensure!(told == 1, "list-units warned: {stderr}");
    ensure!(
        stdout.lines().count() <= MAX_STATES_PER_MACHINE + 2,
        "list-units listed past the bound"
    );

    // The leader's view left them out and says so, naming the host's prefix: once per read
    // of its view, not once per key.
    let leader = leader(&root)?.context("no engine leader")?;
    let leader = cluster.machine_by_id(&leader)?;
    wait_for(CONVERGE, POLL, || {
        fleetd_log_all(leader).is_ok_and(|log| {
            let told = log
                .lines()
                .filter(|l| l.contains(&bound) && l.contains(&prefix))
                .count();
            (1..=3).contains(&told)
        })
    })
    .with_context(|| format!("{} did not report m2's states once", leader.name()))?;

    // And its metrics say so, for an alert: the states left out, and m2's prefix as one
    // unreadable value.
    wait_for(CONVERGE, POLL, || {
        scrape(leader).is_ok_and(|s| {
            s.sum("fleet_engine_unit_states_past_bound", &[]) >= PAST as f64
                && s.sum("fleet_engine_unreadable_registry_values", &[]) >= 1.0
        })
    })
    .with_context(|| {
        format!(
            "{}'s metrics did not count m2's states past the bound: {:?}",
            leader.name(),
            scrape(leader).map(|s| (
                s.sum("fleet_engine_unit_states_past_bound", &[]),
                s.sum("fleet_engine_unreadable_registry_values", &[])
            ))
        )
    })?;
    finish(cluster)
}
