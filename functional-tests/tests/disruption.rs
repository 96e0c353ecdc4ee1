//! When many machines vanish at once, the cause is etcd or the network, not the machines:
//! nothing moves and nothing restarts (issue 12, item 2; docs/engine.md, *Vanished machines*).
//! When one machine vanishes, its units still move within the agent TTL.
//!
//! Three machines, `agent_ttl` 3 s (the harness's), six units. The faults are a SIGSTOP of
//! etcd itself, and leases revoked directly through etcd while the machines' fleetd is
//! frozen so that they cannot register again until the test lets them.

mod support;

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{Cluster, FleetdSpec, Machine, Signal, wait_for, wait_for_value};
use fleet_registry::kv::{Kv, LeaseId};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::{
    POLL, Placed, TIMEOUT, Want, fleetctl_ok, jobs_after, journal_cursor, leader, sleeper, start,
    unchanged, units_on, wait_converged, wait_registered, write_units,
};

/// The harness's `agent_ttl`.
const TTL: Duration = Duration::from_secs(3);
/// The engine's hold of a disruption, by default 2 × `agent_ttl`, and its settle (TTL/3).
const GRACE: Duration = Duration::from_secs(6);
const SETTLE: Duration = Duration::from_secs(1);
/// How long a cluster may take to converge after a fault.
const CONVERGE: Duration = Duration::from_secs(45);

/// The TLS API of the freeze's machines, so that their peer check runs.
const FREEZE_API_PORT: u16 = 49156;

fn engine_spec() -> FleetdSpec {
    FleetdSpec::default().with_env("FLEET_ENGINE_RECONCILE_INTERVAL", "0.5")
}

/// Six launched units spread over the machines, and where each runs (machine, MainPID,
/// InvocationID).
fn six_units(
    cluster: &Cluster,
    registry: &fleet_functional_tests::TestRegistry,
    prefix: &str,
) -> Result<(BTreeMap<String, Want>, BTreeMap<String, Placed>)> {
    let texts: BTreeMap<String, String> = (0..6)
        .map(|i| (format!("{prefix}-{i}.service"), sleeper(400_000 + i)))
        .collect();
    let paths = write_units(&cluster.dir().join("units"), &texts)?;
    let mut args = vec!["start".to_owned(), "--no-block".to_owned()];
    args.extend(paths.values().cloned());
    fleetctl_ok(cluster, &args)?;
    let want: BTreeMap<String, Want> = texts.keys().map(|u| (u.clone(), Want::Launched)).collect();
    let placed = wait_converged(cluster, registry, &want, CONVERGE)?;
    Ok((want, placed))
}

fn cursors(cluster: &Cluster) -> Result<BTreeMap<String, String>> {
    cluster
        .machines()
        .iter()
        .map(|m| Ok((m.name().to_owned(), journal_cursor(m)?)))
        .collect()
}

/// Every systemd job about units matching `pattern` on every machine since `cursors`.
fn jobs_since(
    cluster: &Cluster,
    cursors: &BTreeMap<String, String>,
    pattern: &str,
) -> Result<Vec<(String, String, String)>> {
    let mut all = Vec::new();
    for m in cluster.machines() {
        for (unit, message) in jobs_after(m, pattern, &cursors[m.name()])? {
            all.push((m.name().to_owned(), unit, message));
        }
    }
    Ok(all)
}

/// Unit -> the machine names it is scheduled on, read from etcd.
fn schedule(
    cluster: &Cluster,
    registry: &fleet_functional_tests::TestRegistry,
) -> Result<BTreeMap<String, Vec<String>>> {
    let snap = registry.block_on(registry.registry().snapshot())?;
    let name_of = |id: &fleet_core::MachineId| {
        cluster
            .machines()
            .iter()
            .find(|m| m.id() == id)
            .map_or_else(|| id.to_string(), |m| m.name().to_owned())
    };
    Ok(snap
        .schedule
        .iter()
        .map(|(u, ms)| (u.to_string(), ms.keys().map(name_of).collect()))
        .collect())
}

fn placed_schedule(placed: &BTreeMap<String, Placed>) -> BTreeMap<String, Vec<String>> {
    placed
        .iter()
        .map(|(u, p)| (u.clone(), vec![p.machine.clone()]))
        .collect()
}

/// Revokes the lease `machine`'s presence hangs on, as etcd does when it expires.
fn revoke_presence(
    registry: &fleet_functional_tests::TestRegistry,
    machine: &Machine,
) -> Result<()> {
    let reg = registry.registry();
    let key = reg.keys().machine(machine.id());
    let res = registry.block_on(reg.raw_kv().range(&key, false, None))?;
    let lease = res
        .kvs
        .first()
        .with_context(|| format!("{} has no presence", machine.name()))?
        .lease;
    registry.block_on(reg.raw_kv().revoke(LeaseId(lease)))?;
    Ok(())
}

/// Machine name -> the lease its presence hangs on.
fn presence_leases(
    cluster: &Cluster,
    registry: &fleet_functional_tests::TestRegistry,
) -> Result<BTreeMap<String, i64>> {
    let reg = registry.registry();
    let mut out = BTreeMap::new();
    for m in cluster.machines() {
        let key = reg.keys().machine(m.id());
        let res = registry.block_on(reg.raw_kv().range(&key, false, None))?;
        if let Some(kv) = res.kvs.first() {
            out.insert(m.name().to_owned(), kv.lease);
        }
    }
    Ok(out)
}

/// The machines whose engine does not lead.
fn followers<'a>(
    cluster: &'a Cluster,
    registry: &fleet_functional_tests::TestRegistry,
) -> Result<Vec<&'a Machine>> {
    let leader = wait_for_value(TIMEOUT, POLL, || leader(registry).ok().flatten())
        .context("no engine leader")?;
    Ok(cluster
        .machines()
        .iter()
        .filter(|m| m.id().as_str() != leader)
        .collect())
}

/// What `fleetctl list-machines` prints on stderr (the engine's disruption notice).
fn list_machines_notice(cluster: &Cluster) -> Result<String> {
    let run = fleetctl_ok(cluster, &["list-machines", "--no-legend"])?;
    Ok(run.stderr)
}

/// etcd frozen for 3 × TTL + 5 s, then thawed: every lease ran out, every machine vanished
/// at once. Every unit keeps its machine and MainPID during and after, and fleetctl fails
/// within its request timeout while etcd hangs.
#[test]
fn a_frozen_etcd_moves_and_restarts_nothing_and_fleetctl_fails_within_its_timeout() -> Result<()> {
    // With the TLS API, every fleetd asks its peers while etcd hangs (issue 36): none of
    // them reaches it, so none fences.
    let (cluster, registry) = start(3, engine_spec().with_api_tls(FREEZE_API_PORT))?;
    let (want, before) = six_units(&cluster, &registry, "freeze")?;
    let cursors = cursors(&cluster)?;
    let leases = presence_leases(&cluster, &registry)?;
    let etcd = cluster.state().etcd.process.context("etcd not running")?;

    etcd.signal(Signal::Stop)?;
    let frozen = Instant::now();
    let result = (|| -> Result<()> {
        // Only fleetctl is timed: over the API, picking a fleetd to ask comes first.
        let mut command = cluster.fleetctl_command(cluster.driver())?;
        command.args(["--request-timeout", "2", "list-units"]);
        let asked = Instant::now();
        let out = command.output()?;
        let took = asked.elapsed();
        let run = support::Run {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        ensure!(
            !run.success,
            "list-units succeeded against a frozen etcd: {run:?}"
        );
        ensure!(
            took < Duration::from_secs(4),
            "list-units took {took:?} with a 2 s request timeout"
        );
        ensure!(
            run.stderr.trim().lines().count() == 1 && run.stderr.contains("etcd"),
            "not one clear line: {:?}",
            run.stderr
        );
        while frozen.elapsed() < 3 * TTL + Duration::from_secs(5) {
            unchanged(&cluster, &before).context("while etcd was frozen")?;
            std::thread::sleep(Duration::from_millis(500));
        }
        Ok(())
    })();
    etcd.signal(Signal::Cont)?;
    result?;
    let thawed = Instant::now();

    wait_registered(&cluster, &registry)?;
    // The fault was real: every machine vanished and registered again on a new lease. An
    // engine that saw them gone says why it moved nothing (one whose first look came after
    // they were all back had nothing to hold).
    let again = presence_leases(&cluster, &registry)?;
    for (m, lease) in &leases {
        ensure!(
            again.get(m) != Some(lease),
            "{m} kept its lease {lease} across the freeze"
        );
    }
    let held = cluster.machines().iter().any(|m| {
        support::fleetd_log(m, &cursors[m.name()]).is_ok_and(|l| l.contains("rescheduling held"))
    });
    eprintln!("after the thaw an engine logged a hold: {held}");
    // Past the grace and the settle, nothing may have moved or restarted.
    while thawed.elapsed() < GRACE + SETTLE + Duration::from_secs(2) {
        unchanged(&cluster, &before).context("after etcd thawed")?;
        std::thread::sleep(Duration::from_millis(500));
    }
    let after = wait_converged(&cluster, &registry, &want, CONVERGE)?;
    ensure!(
        after == before,
        "moved or restarted: {before:?} -> {after:?}"
    );
    let jobs = jobs_since(&cluster, &cursors, "freeze-*")?;
    ensure!(jobs.is_empty(), "systemd jobs across the freeze: {jobs:?}");
    wait_for(TIMEOUT, POLL, || {
        list_machines_notice(&cluster).is_ok_and(|n| n.is_empty())
    })
    .context("the disruption notice stayed")?;
    support::finish(cluster)
}

/// The leases of 2 of 3 machines revoked directly (their fleetd frozen, so they stay away):
/// rescheduling holds, `list-machines` says why, and once they register again on new leases
/// their units are still theirs, untouched. Then one machine's lease alone: its units move
/// within the TTL.
#[test]
fn a_mass_lease_expiry_holds_rescheduling_and_a_single_one_still_moves_units() -> Result<()> {
    // The leases are made to expire by freezing fleetd, which a real mass expiry (etcd stalled
    // or cut off from every host) does not do: its fleetds live on and keep their fences
    // pushed. Frozen here, their fences would stop their units, rightly (tests/fence.rs), and
    // this test is about the engine's hold alone.
    let spec = engine_spec().with_env("FLEET_DISABLE_FENCE", "true");
    let (cluster, registry) = start(3, spec)?;
    let (want, before) = six_units(&cluster, &registry, "mass")?;
    let cursors = cursors(&cluster)?;
    let followers = followers(&cluster, &registry)?;
    ensure!(followers.len() == 2, "followers: {}", followers.len());

    for m in &followers {
        m.kill_fleetd(Signal::Stop)?;
    }
    let result = (|| -> Result<()> {
        for m in &followers {
            revoke_presence(&registry, m)?;
        }
        let revoked = Instant::now();
        let notice = wait_for_value(TIMEOUT, POLL, || {
            list_machines_notice(&cluster)
                .ok()
                .filter(|n| !n.is_empty())
        })
        .context("list-machines never told of a hold")?;
        ensure!(
            notice.starts_with("Warning: rescheduling held: 2 of 3 machines vanished within 3s"),
            "{notice:?}"
        );
        // The leader logs the hold as it publishes it: looked for now, in the leader's whole
        // journal, not at the end of the test after a cursor (a line missing there once, in
        // CI, under the API driver, though the notice had been published).
        let leader = cluster
            .machines()
            .iter()
            .find(|m| !followers.iter().any(|f| f.name() == m.name()))
            .context("no leader machine")?;
        wait_for(TIMEOUT, POLL, || {
            leader
                .journal(&["-o", "cat"])
                .is_ok_and(|j| j.contains("rescheduling held"))
        })
        .context("the leader did not log the hold")?;
        // Well past the settle, and most of the grace: the schedule is as it was.
        while revoked.elapsed() < GRACE - Duration::from_secs(2) {
            let now = schedule(&cluster, &registry)?;
            ensure!(
                now == placed_schedule(&before),
                "moved during the hold: {now:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        Ok(())
    })();
    for m in &followers {
        m.kill_fleetd(Signal::Cont)?;
    }
    result?;
    wait_registered(&cluster, &registry)?;
    wait_for(TIMEOUT, POLL, || {
        list_machines_notice(&cluster).is_ok_and(|n| n.is_empty())
    })
    .context("the hold did not end when the machines came back")?;
    let after = wait_converged(&cluster, &registry, &want, CONVERGE)?;
    ensure!(
        after == before,
        "moved or restarted: {before:?} -> {after:?}"
    );
    let jobs = jobs_since(&cluster, &cursors, "mass-*")?;
    ensure!(jobs.is_empty(), "systemd jobs across the hold: {jobs:?}");

    // One machine alone: no disruption, its units move once the fence's margin is over.
    let lost = followers[0];
    let on_lost: Vec<String> = after
        .iter()
        .filter(|(_, p)| p.machine == lost.name())
        .map(|(u, _)| u.clone())
        .collect();
    ensure!(!on_lost.is_empty(), "nothing ran on {}", lost.name());
    lost.kill_fleetd(Signal::Stop)?;
    let moved = (|| -> Result<Duration> {
        revoke_presence(&registry, lost)?;
        let revoked = Instant::now();
        let others: Vec<&Machine> = cluster
            .machines()
            .iter()
            .filter(|m| m.name() != lost.name())
            .collect();
        wait_for(TIMEOUT, POLL, || {
            on_lost.iter().all(|u| {
                others
                    .iter()
                    .any(|m| units_on(m, std::slice::from_ref(u)).is_ok_and(|v| v[u].is_active()))
            })
        })
        .context("the lost machine's units did not start elsewhere")?;
        Ok(revoked.elapsed())
    })();
    lost.kill_fleetd(Signal::Cont)?;
    let moved = moved?;
    // The engine waits the fence's margin after a machine vanished (its copies are stopped
    // by then), then places them; the new machine starts them.
    let bound = fleet_core::fence::engine_wait(TTL) + Duration::from_secs(2);
    ensure!(
        moved < bound,
        "a single machine's units took {moved:?} to run elsewhere (bound {bound:?})"
    );
    eprintln!("single machine lost: its units running elsewhere after {moved:?}");
    wait_converged(&cluster, &registry, &want, CONVERGE)?;
    support::finish(cluster)
}
