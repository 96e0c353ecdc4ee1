//! Issue 38, item 3: one stray leader key stopped all scheduling, silently and forever. A
//! leader key on a live lease that names a machine with no presence record (written here as
//! etcd's root, as a decommissioned host's engine or a hand-made lease would leave it):
//! `list-machines` says so, a registered fleetd takes the key over after two agent TTLs,
//! and a unit submitted meanwhile then runs. Two machines of real systemd; needs root.

mod support;

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{FleetdSpec, wait_for};
use fleet_registry::kv::{Kv, Txn, TxnOp};
use std::time::Duration;
use support::{POLL, finish, fleetd_log_all, leader, sleeper, start};

/// Two agent TTLs (3 s in these clusters), a re-check and a pass, with room.
const TAKE_OVER: Duration = Duration::from_secs(40);

#[test]
fn a_leader_key_naming_an_unregistered_machine_is_shown_then_taken_over() -> Result<()> {
    let (cluster, registry) = start(2, FleetdSpec::default())?;
    wait_for(TAKE_OVER, POLL, || {
        leader(&registry).is_ok_and(|l| l.is_some())
    })
    .context("no engine leader at first")?;
    let kv = registry.registry().raw_kv();
    let lease = registry.block_on(kv.grant(Duration::from_secs(600)))?;
    let ghost = Txn {
        success: vec![TxnOp::Put {
            key: registry.registry().keys().leader(),
            value: b"ghost".to_vec(),
            lease: Some(lease),
        }],
        ..Txn::default()
    };
    registry.block_on(kv.txn(ghost))?;

    let out = cluster.fleetctl(["list-machines"])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success() && stderr.contains("names machine ghost, which is not registered"),
        "list-machines: {out:?}"
    );
    let dir = cluster.dir().join("units");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("after-ghost.service");
    std::fs::write(&path, sleeper(380_001))?;
    let path = path.display().to_string();
    let out = cluster.fleetctl(["start", "--no-block", &path])?;
    ensure!(out.status.success(), "start: {out:?}");

    let ids: Vec<String> = cluster
        .machines()
        .iter()
        .map(|m| m.id().to_string())
        .collect();
    wait_for(TAKE_OVER, POLL, || {
        leader(&registry).is_ok_and(|l| l.is_some_and(|l| ids.contains(&l)))
    })
    .context("no registered fleetd took the leader key over")?;
    let new = leader(&registry)?.context("the leader key went")?;
    let new = cluster.machine_by_id(&new)?;
    let log = fleetd_log_all(new)?;
    ensure!(
        log.contains("took over the engine leader key of a machine that is not registered"),
        "{} did not say it took the key over",
        new.name()
    );
    wait_for(TAKE_OVER, POLL, || {
        cluster
            .fleetctl(["list-units", "--no-legend", "--fields=unit,active"])
            .is_ok_and(|out| {
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .any(|l| l.split_whitespace().eq(["after-ghost.service", "active"]))
            })
    })
    .context("after-ghost.service never ran")?;
    let out = cluster.fleetctl(["list-machines"])?;
    ensure!(
        String::from_utf8_lossy(&out.stderr).is_empty(),
        "list-machines still warns: {out:?}"
    );
    finish(cluster)
}
