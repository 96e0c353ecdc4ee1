//! Issue 38, items 4 and 12: registry values no client can write, put there by hand as
//! etcd's root. A key under `schedule/` that names no entry is deleted by the leader (once,
//! logged) instead of being warned about forever; a unit whose file is gone is reported by
//! `list-unit-files` (not left out silently) and `destroy` removes it. Two machines of real
//! systemd; needs root.

mod support;

use anyhow::{Context, Result, ensure};
use fleet_core::DesiredState;
use fleet_functional_tests::{FleetdSpec, wait_for};
use fleet_registry::kv::Kv;
use std::time::Duration;
use support::{POLL, PREFIX, finish, fleetd_log_all, leader, sleeper, start};

const WITHIN: Duration = Duration::from_secs(30);

#[test]
fn a_stray_schedule_key_is_deleted_and_a_unit_without_its_file_is_reported_and_destroyed()
-> Result<()> {
    let (cluster, registry) = start(2, FleetdSpec::default())?;
    let m1 = cluster.machine("m1")?.id().clone();
    let stray = format!("{PREFIX}schedule/{m1}/../../etc.service");
    registry.put_raw(&stray, b"{}")?;
    // A change of units wakes the leader; its pass deletes the key.
    registry.create_unit("wake.service", &sleeper(390_001), DesiredState::Inactive)?;
    let kv = registry.registry().raw_kv();
    wait_for(WITHIN, POLL, || {
        registry
            .block_on(kv.range(&stray, false, None))
            .is_ok_and(|r| r.kvs.is_empty())
    })
    .context("the leader never deleted the stray schedule key")?;
    let leader = leader(&registry)?.context("no engine leader")?;
    let leader = cluster.machine_by_id(&leader)?;
    let told = fleetd_log_all(leader)?
        .lines()
        .filter(|l| l.contains("deleted a schedule key that names no entry") && l.contains(&stray))
        .count();
    ensure!(told == 1, "{} said it {told} times", leader.name());

    let hash = registry.create_unit("lost.service", &sleeper(390_002), DesiredState::Inactive)?;
    registry.delete_raw(&registry.registry().keys().file(&hash))?;
    let out = cluster.fleetctl(["list-unit-files", "--no-legend"])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "list-unit-files: {out:?}");
    ensure!(
        stderr.contains("lost.service")
            && stderr.contains("is missing from the registry")
            && stderr.contains("fleetctl destroy lost.service"),
        "list-unit-files warned: {stderr}"
    );
    let out = cluster.fleetctl(["destroy", "lost.service"])?;
    ensure!(out.status.success(), "destroy: {out:?}");
    let out = cluster.fleetctl(["list-unit-files", "--no-legend"])?;
    ensure!(
        out.status.success() && out.stderr.is_empty(),
        "list-unit-files after destroy: {out:?}"
    );
    finish(cluster)
}
