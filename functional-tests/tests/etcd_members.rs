//! One etcd member of three down, on a real cluster: fleetd and fleetctl are given every
//! member's endpoint, the dead member always first, and must go on working (issue 12, item 1;
//! promise 7 of `docs/guarantees.md`). One cluster for the three cases, in order: the raft
//! leader killed with units running, a follower down while a fleetd restarts, a member down
//! while a machine is lost. Needs root.

mod support;

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{
    Cluster, ClusterSpec, FleetdSpec, TestRegistry, cleanup_stale, wait_for,
};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::{
    POLL, Placed, TIMEOUT, Want, finish, fleetctl, fleetctl_ok, fleetd_log, journal_cursor, leader,
    sleeper, wait_converged, wait_registered, write_units,
};

/// fleetd's agent TTL in these clusters (the harness's default).
const TTL: Duration = Duration::from_secs(3);
/// How long every fleetctl call is watched after the leader's kill.
const WATCH_CALLS: Duration = Duration::from_secs(3);
/// Between two fleetctl calls while they are watched.
const CALL_EVERY: Duration = Duration::from_millis(100);
/// How long the cluster may take to settle at the start.
const SETTLE: Duration = Duration::from_secs(45);

fn start_cluster() -> Result<(Cluster, TestRegistry)> {
    cleanup_stale()?;
    let spec = FleetdSpec::default().with_env("FLEET_ENGINE_RECONCILE_INTERVAL", "0.5");
    let cluster = Cluster::start(ClusterSpec::with_fleetd(3, spec).with_etcd_members(3))?;
    ensure!(cluster.etcd_members() == 3);
    let registry = TestRegistry::of(&cluster)?;
    wait_registered(&cluster, &registry)?;
    Ok((cluster, registry))
}

/// Starts `names` (long sleepers) without waiting for them.
fn start_units(cluster: &Cluster, names: &[&str]) -> Result<()> {
    let texts: BTreeMap<String, String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| ((*n).to_owned(), sleeper(200_000 + i as u32)))
        .collect();
    let paths = write_units(&cluster.dir().join("units"), &texts)?;
    let mut args = vec!["start".to_owned(), "--no-block".to_owned()];
    args.extend(paths.into_values());
    fleetctl_ok(cluster, &args).map(drop)
}

fn launched(names: &[&str]) -> BTreeMap<String, Want> {
    names
        .iter()
        .map(|n| ((*n).to_owned(), Want::Launched))
        .collect()
}

#[test]
fn with_one_etcd_member_of_three_down_fleetd_and_fleetctl_keep_working() -> Result<()> {
    let (mut cluster, registry) = start_cluster()?;
    let mut want = launched(&["stay-1.service", "stay-2.service", "stay-3.service"]);
    start_units(
        &cluster,
        &["stay-1.service", "stay-2.service", "stay-3.service"],
    )?;
    let before = wait_converged(&cluster, &registry, &want, SETTLE)?;

    the_raft_leader_killed_moves_nothing_and_every_call_works(
        &mut cluster,
        &registry,
        &mut want,
        &before,
    )?;
    a_fleetd_restarted_with_a_follower_down_registers_within_one_ttl(&mut cluster, &registry)?;
    with_a_member_down_a_lost_machines_units_run_elsewhere_within_ttl_plus_10_s(
        &mut cluster,
        &registry,
        &want,
    )?;
    cluster.start_etcd_member(0)?;
    finish(cluster)
}

/// The leader (member 0, listed first everywhere) is SIGKILLed: `list-units` every 100 ms
/// for 3 s and two `start`s (one right after the kill, one after) all succeed, and no unit
/// moves or restarts.
fn the_raft_leader_killed_moves_nothing_and_every_call_works(
    cluster: &mut Cluster,
    registry: &TestRegistry,
    want: &mut BTreeMap<String, Want>,
    before: &BTreeMap<String, Placed>,
) -> Result<()> {
    cluster.make_etcd_leader(0)?;
    cluster.kill_etcd_member(0)?;
    let killed = Instant::now();
    start_units(cluster, &["new-1.service"])
        .context("a start right after the etcd leader's kill")?;
    let mut calls = 0;
    while killed.elapsed() < WATCH_CALLS {
        calls += 1;
        let run = fleetctl(cluster, &["list-units", "--no-legend"])?;
        ensure!(
            run.success,
            "list-units call {calls}, {:?} after the etcd leader's kill, failed: {run:?}",
            killed.elapsed()
        );
        std::thread::sleep(CALL_EVERY);
    }
    start_units(cluster, &["new-2.service"]).context("a start after the etcd leader's kill")?;
    let new_leader = cluster.etcd_leader()?;
    ensure!(new_leader != 0, "the dead member is still the leader");
    eprintln!("{calls} list-units calls after the kill, all fine; new etcd leader: {new_leader}");

    want.insert("new-1.service".to_owned(), Want::Launched);
    want.insert("new-2.service".to_owned(), Want::Launched);
    let after = wait_converged(cluster, registry, want, TIMEOUT)?;
    for (unit, placed) in before {
        ensure!(
            after.get(unit) == Some(placed),
            "{unit} moved or restarted: {placed:?} -> {:?}",
            after.get(unit)
        );
    }
    cluster.start_etcd_member(0)
}

/// Member 0 (listed first) is a follower and down; m2's fleetd restarts: it logs "fleetd
/// started" (registered) within one TTL of its start, and its presence lasts (keep-alives go
/// to the live members).
fn a_fleetd_restarted_with_a_follower_down_registers_within_one_ttl(
    cluster: &mut Cluster,
    registry: &TestRegistry,
) -> Result<()> {
    cluster.make_etcd_leader(1)?;
    cluster.kill_etcd_member(0)?;
    let machine = cluster.machine("m2")?;
    let cursor = journal_cursor(machine)?;
    let restarted = Instant::now();
    machine.restart_fleetd()?;
    wait_for(TIMEOUT, POLL, || {
        fleetd_log(machine, &cursor).is_ok_and(|log| log.contains("fleetd started"))
    })
    .with_context(|| {
        format!(
            "m2's fleetd did not start: {:?}",
            fleetd_log(machine, &cursor)
        )
    })?;
    let took = restarted.elapsed();
    ensure!(took < TTL, "m2's fleetd took {took:?} to register");
    // Present for two TTLs more: its lease is being kept alive.
    let id = machine.id().clone();
    let until = Instant::now() + 2 * TTL;
    while Instant::now() < until {
        ensure!(
            registry.machine_ids()?.contains(&id),
            "m2 vanished from the registry"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(())
}

/// Member 0 still down, a machine that is not the engine leader loses power: its units run
/// on the other machines within TTL + 10 s.
fn with_a_member_down_a_lost_machines_units_run_elsewhere_within_ttl_plus_10_s(
    cluster: &mut Cluster,
    registry: &TestRegistry,
    want: &BTreeMap<String, Want>,
) -> Result<()> {
    let placed = wait_converged(cluster, registry, want, TIMEOUT)?;
    let engine = leader(registry)?.context("no engine leader")?;
    let lost = cluster
        .machines()
        .iter()
        .filter(|m| !m.id().matches(&engine))
        .max_by_key(|m| placed.values().filter(|p| p.machine == m.name()).count())
        .context("no machine but the engine leader")?;
    let moving = placed.values().filter(|p| p.machine == lost.name()).count();
    ensure!(moving > 0, "nothing runs on {}: {placed:?}", lost.name());
    let lost_name = lost.name().to_owned();
    lost.poweroff()?;
    let powered_off = Instant::now();
    let after = wait_converged(cluster, registry, want, TTL + Duration::from_secs(10))
        .with_context(|| format!("{lost_name}'s units did not move in time"))?;
    ensure!(after.values().all(|p| p.machine != lost_name));
    eprintln!(
        "{moving} units of {lost_name} running elsewhere {:?} after its power-off",
        powered_off.elapsed()
    );
    Ok(())
}
