//! Faults injected by the tests themselves on real clusters (etcd + systemd machines running
//! fleetd with its engine), and the promises of `docs/guarantees.md` they check: kill -9 of
//! fleetd during a churn of starts and stops, an etcd outage longer than the agent TTL, a
//! machine cut off the network, the engine leader cut off the network, the engine leader
//! killed while scheduling, and two fleetctl processes racing on the same units. Needs root.
//! (The chaos soak that mixes these faults is `chaos.rs`.)
//!
//! Fault moments are random, from a seed printed at the start of each test
//! (`FLEET_FAULT_SEED=<n>` replays one). Nothing waits for a fixed time except where time is
//! the fault itself (an outage must last longer than a TTL); everything else waits for a
//! condition. Registry invariants are checked at every etcd revision by replaying etcd's
//! history (`support::replay`), not by sampling.

mod support;

use anyhow::{Context, Result, bail, ensure};
use fleet_core::MachineId;
use fleet_functional_tests::{
    Cluster, FleetdSpec, Machine, Signal, TestRegistry, wait_for, wait_for_value,
};
use fleet_registry::kv::{Kv, LeaseId};
use fleet_registry::{EngineRole, EngineWrite, RegistryError, ScheduleEntry, UnitRecord};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use support::{
    POLL, Placed, Rng, Run, TIMEOUT, UnitView, Want, fleetctl, fleetctl_ok, jobs_after,
    journal_cursor, leader, replay, revision, sleeper, start, units_on, wait_converged,
    wait_fleetd_restarted, write_units,
};

/// The engine re-checks every 0.5 s, so its leadership lease is 2.5 s (3 s in etcd).
const RECONCILE: &str = "0.5";
/// How long the partition test keeps a machine cut off.
const PARTITION: Duration = Duration::from_secs(15);
/// The engine leader's lease: 5 x the reconcile interval, rounded up by etcd.
const ENGINE_LEASE: Duration = Duration::from_secs(3);
/// How much later than the leader lease's TTL a new leader may take the key.
const TAKEOVER_SLACK: Duration = Duration::from_secs(2);
/// How long a cluster may take to settle after a fault.
const SETTLE: Duration = Duration::from_secs(45);

fn engine_spec() -> FleetdSpec {
    FleetdSpec::default().with_env("FLEET_ENGINE_RECONCILE_INTERVAL", RECONCILE)
}

/// `fleetctl <verb> --no-block <args...>`; an empty `args` runs nothing.
fn no_block(cluster: &Cluster, verb: &str, args: &[String]) -> Result<Option<Run>> {
    if args.is_empty() {
        return Ok(None);
    }
    let mut all = vec![verb.to_owned()];
    if verb != "destroy" && verb != "submit" {
        all.push("--no-block".to_owned());
    }
    all.extend(args.iter().cloned());
    fleetctl_ok(cluster, &all).map(Some)
}

/// `(machine name, MainPID, InvocationID)` of every launched unit.
fn runs(
    placed: &BTreeMap<String, Placed>,
    want: &BTreeMap<String, Want>,
) -> BTreeMap<String, Placed> {
    placed
        .iter()
        .filter(|(u, _)| want[*u] == Want::Launched)
        .map(|(u, p)| (u.clone(), p.clone()))
        .collect()
}

/// The fleetctl verb that takes a unit from `from` to `to`, if one does.
fn verb(from: Want, to: Want) -> Option<&'static str> {
    match (from, to) {
        (_, Want::Gone) => Some("destroy"),
        (_, Want::Launched) => Some("start"),
        (Want::Launched, Want::Loaded) => Some("stop"),
        (_, Want::Loaded) => Some("load"),
        (_, Want::Inactive) => Some("unload"),
    }
}

/// Picks the next desired state of a unit: most stay, some move.
fn next_want(rng: &mut Rng, now: Want) -> Want {
    let roll = rng.below(100);
    match now {
        Want::Launched if roll < 15 => Want::Loaded,
        Want::Launched if roll < 25 => Want::Inactive,
        Want::Launched if roll < 32 => Want::Gone,
        Want::Loaded if roll < 35 => Want::Launched,
        Want::Loaded if roll < 50 => Want::Inactive,
        Want::Inactive if roll < 45 => Want::Launched,
        Want::Inactive if roll < 60 => Want::Loaded,
        Want::Inactive if roll < 70 => Want::Gone,
        Want::Gone if roll < 55 => Want::Launched,
        other => other,
    }
}

/// kill -9 of fleetd at random moments while units are started, stopped, unloaded and
/// destroyed: after every restart each unit reaches its desired state, and every unit that was
/// running and was not touched keeps its very process (MainPID and InvocationID).
fn churn_with_kills(units: usize, rounds: usize) -> Result<()> {
    let mut rng = Rng::from_env_or_time("churn_with_kills");
    // A long agent TTL: a restarted fleetd resumes its lease long before it could lapse, so
    // nothing may move because of a kill.
    let spec = FleetdSpec {
        agent_ttl: "15s".to_owned(),
        ..engine_spec()
    };
    let (cluster, registry) = start(3, spec)?;
    let texts: BTreeMap<String, String> = (0..units)
        .map(|i| (format!("churn-{i:02}.service"), sleeper(100_000 + i as u32)))
        .collect();
    let paths = write_units(&cluster.dir().join("units"), &texts)?;
    let mut want: BTreeMap<String, Want> =
        texts.keys().map(|u| (u.clone(), Want::Launched)).collect();
    no_block(
        &cluster,
        "start",
        &paths.values().cloned().collect::<Vec<_>>(),
    )?;
    let mut placed = wait_converged(&cluster, &registry, &want, SETTLE)?;

    for round in 0..rounds {
        let before = runs(&placed, &want);
        let mut next = want.clone();
        let mut touched = BTreeSet::new();
        let mut by_verb: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (unit, now) in &want {
            let to = next_want(&mut rng, *now);
            if to == *now {
                continue;
            }
            let verb = verb(*now, to).context("no verb")?;
            let arg = if matches!(verb, "start" | "load") {
                paths[unit].clone()
            } else {
                unit.clone()
            };
            by_verb.entry(verb).or_default().push(arg);
            next.insert(unit.clone(), to);
            touched.insert(unit.clone());
        }
        let victim = &cluster.machines()[rng.below(3) as usize];
        let delay = Duration::from_millis(rng.below(1000));
        let old = victim
            .main_pid("fleet.service")?
            .context("fleetd not running")?;
        eprintln!(
            "round {round}: {:?}; kill -9 of fleetd on {} after {delay:?}",
            by_verb
                .iter()
                .map(|(v, a)| (*v, a.len()))
                .collect::<Vec<_>>(),
            victim.name()
        );
        std::thread::scope(|s| -> Result<()> {
            let killer = s.spawn(|| {
                // The fault's moment is random: this sleep is the injection, not a wait.
                std::thread::sleep(delay);
                victim.kill_fleetd(Signal::Kill)
            });
            for verb in ["destroy", "unload", "stop", "load", "start"] {
                no_block(
                    &cluster,
                    verb,
                    by_verb.get(verb).map_or(&[][..], Vec::as_slice),
                )?;
            }
            killer.join().expect("the killer thread does not panic")
        })?;
        wait_fleetd_restarted(victim, old)?;
        want = next;
        placed = wait_converged(&cluster, &registry, &want, SETTLE)
            .with_context(|| format!("round {round}"))?;
        for (unit, was) in &before {
            if want[unit] == Want::Launched && !touched.contains(unit) {
                ensure!(
                    placed.get(unit) == Some(was),
                    "round {round}: {unit} was restarted or moved: {was:?} -> {:?}",
                    placed.get(unit)
                );
            }
        }
    }
    support::finish(cluster)
}

#[test]
fn units_converge_and_untouched_ones_keep_running_through_kill_9_of_fleetd() -> Result<()> {
    churn_with_kills(24, 4)
}

/// The full variant: 50 units, 20 kills. `make soak`.
#[test]
#[ignore = "soak: run last by make test, alone by make soak"]
fn soak_units_converge_through_20_kills_of_fleetd_during_a_churn_of_50_units() -> Result<()> {
    churn_with_kills(50, 20)
}

/// Every systemd job about units matching `pattern` on every machine since `cursors`.
fn jobs_since(
    cluster: &Cluster,
    cursors: &BTreeMap<String, String>,
    pattern: &str,
) -> Result<Vec<(String, String, String)>> {
    let mut all = Vec::new();
    for m in cluster.machines().iter().filter(|m| m.is_up()) {
        for (unit, message) in jobs_after(m, pattern, &cursors[m.name()])? {
            all.push((m.name().to_owned(), unit, message));
        }
    }
    Ok(all)
}

fn cursors(cluster: &Cluster) -> Result<BTreeMap<String, String>> {
    cluster
        .machines()
        .iter()
        .filter(|m| m.is_up())
        .map(|m| Ok((m.name().to_owned(), journal_cursor(m)?)))
        .collect()
}

/// A unit whose start takes `seconds` (its `ExecStartPre` sleeps), so a test can act while
/// its start job runs.
fn slow_starter(seconds: u32, id: u32) -> String {
    format!("[Service]\nExecStartPre=/bin/sleep {seconds}\nExecStart=/bin/sleep {id}\n")
}

/// etcd killed (SIGKILL) for longer than the agent TTL, then restarted: no unit is stopped
/// during the outage (no stop job in any machine's journal), every running unit keeps its
/// process, and after the restart the cluster converges: units whose start fleetctl
/// acknowledged just before etcd died run (promise 3), and a unit whose start job finished
/// during the outage has its state published once etcd is back.
#[test]
fn an_etcd_outage_longer_than_the_agent_ttl_stops_nothing_and_the_cluster_converges_after()
-> Result<()> {
    let (mut cluster, registry) = start(2, engine_spec())?;
    let mut texts: BTreeMap<String, String> = (0..7)
        .map(|i| (format!("outage-{i}.service"), sleeper(200_000 + i)))
        .collect();
    let slow = "outage-slow.service".to_owned();
    texts.insert(slow.clone(), slow_starter(2, 200_100));
    let paths = write_units(&cluster.dir().join("units"), &texts)?;
    let first: Vec<String> = (0..6).map(|i| format!("outage-{i}.service")).collect();
    let late = ["outage-6.service".to_owned(), slow.clone()];
    let mut want: BTreeMap<String, Want> =
        first.iter().map(|u| (u.clone(), Want::Launched)).collect();
    let first_paths: Vec<String> = first.iter().map(|u| paths[u].clone()).collect();
    no_block(&cluster, "start", &first_paths)?;
    let before = wait_converged(&cluster, &registry, &want, SETTLE)?;
    let cursors = cursors(&cluster)?;

    // Acknowledged (exit 0); then etcd dies while the slow unit's start job runs.
    let late_paths: Vec<String> = late.iter().map(|u| paths[u].clone()).collect();
    no_block(&cluster, "start", &late_paths)?;
    let one = [slow.clone()];
    wait_for(TIMEOUT, POLL, || {
        cluster
            .machines()
            .iter()
            .any(|m| units_on(m, &one).is_ok_and(|v| v[&slow].active == "activating"))
    })
    .context("the slow unit never started")?;
    let etcd = cluster.state().etcd.process.context("etcd not running")?;
    etcd.kill_and_wait(Duration::from_secs(10))?;
    let down = Instant::now();
    cluster.stop_etcd()?;

    // The outage: longer than twice the agent TTL (3 s), and long enough that every fleetd
    // noticed and the slow unit's start finished. Meanwhile every running unit stays as it was.
    let ttl = Duration::from_secs(3);
    let mut noticed = BTreeSet::new();
    wait_for(TIMEOUT, Duration::from_millis(250), || {
        for m in cluster.machines() {
            if let Ok(warnings) = support::fleetd_warnings(m, &cursors[m.name()])
                && !warnings.trim().is_empty()
            {
                noticed.insert(m.name().to_owned());
            }
        }
        let slow_up = cluster
            .machines()
            .iter()
            .any(|m| units_on(m, &one).is_ok_and(|v| v[&slow].is_active()));
        down.elapsed() > 2 * ttl && noticed.len() == cluster.machines().len() && slow_up
    })
    .with_context(|| format!("not every fleetd noticed the outage: {noticed:?}"))?;
    support::unchanged(&cluster, &before).context("during the etcd outage")?;
    let outage = down.elapsed();
    cluster.start_etcd()?;

    for u in &late {
        want.insert(u.clone(), Want::Launched);
    }
    // A state that could not be published during the outage must be published when etcd is
    // back, not at the agent's next 60 s resync.
    let after = wait_converged(&cluster, &registry, &want, Duration::from_secs(20))
        .context("after the etcd restart")?;
    for (unit, was) in &before {
        ensure!(
            &after[unit] == was,
            "{unit} restarted or moved across the outage: {was:?} -> {:?}",
            after[unit]
        );
    }
    let jobs = jobs_since(&cluster, &cursors, "outage-*")?;
    let unexpected: Vec<_> = jobs
        .iter()
        .filter(|(_, unit, message)| !(late.contains(unit) && message.starts_with("Start")))
        .collect();
    ensure!(
        unexpected.is_empty(),
        "systemd jobs during or after the {outage:?} outage: {unexpected:?}"
    );
    support::finish(cluster)
}

/// The machine IDs of every engine-running machine but the leader.
fn followers<'a>(cluster: &'a Cluster, leader: &str) -> Vec<&'a Machine> {
    cluster
        .machines()
        .iter()
        .filter(|m| m.id().as_str() != leader)
        .collect()
}

/// A machine cut off the network keeps running its units while it cannot reach etcd (fleetd
/// never stops a unit because it lost etcd); after the agent TTL the engine moves them; on
/// heal the machine stops its stale copies as soon as it reads its schedule again, and from
/// then on every unit runs exactly once. The two windows are printed (docs/guarantees.md).
#[test]
fn a_machine_cut_off_has_its_units_moved_and_stops_its_stale_copies_once_healed() -> Result<()> {
    let (cluster, registry) = start(3, engine_spec())?;
    let texts: BTreeMap<String, String> = (0..6)
        .map(|i| (format!("part-{i}.service"), sleeper(300_000 + i)))
        .collect();
    let paths = write_units(&cluster.dir().join("units"), &texts)?;
    let mut want: BTreeMap<String, Want> =
        texts.keys().map(|u| (u.clone(), Want::Launched)).collect();
    no_block(
        &cluster,
        "start",
        &paths.values().cloned().collect::<Vec<_>>(),
    )?;
    let before = wait_converged(&cluster, &registry, &want, SETTLE)?;
    let leader = leader(&registry)?.context("no engine leader")?;
    let victim = followers(&cluster, &leader)
        .into_iter()
        .max_by_key(|m| before.values().filter(|p| p.machine == m.name()).count())
        .context("no follower")?;
    let moved: Vec<String> = before
        .iter()
        .filter(|(_, p)| p.machine == victim.name())
        .map(|(u, _)| u.clone())
        .collect();
    ensure!(
        !moved.is_empty(),
        "nothing runs on {}: {before:?}",
        victim.name()
    );

    victim.cut_network()?;
    let cut = Instant::now();
    // Rescheduled elsewhere (published and running there) once its lease expired.
    let mut last = String::new();
    let elsewhere = wait_for_value(Duration::from_secs(45), POLL, || {
        let others: Vec<&Machine> = cluster
            .machines()
            .iter()
            .filter(|m| m.id() != victim.id())
            .collect();
        let mut placed = BTreeMap::new();
        for m in others {
            let views = units_on(m, &moved).ok()?;
            for (u, v) in views.into_iter().filter(|(_, v)| v.is_active()) {
                placed.insert(u, (m.name().to_owned(), v.identity()));
            }
        }
        last = format!("{placed:?}");
        (placed.len() == moved.len()).then_some(placed)
    })
    .with_context(|| format!("{moved:?} not rescheduled off {}: {last}", victim.name()))?;
    let rescheduled_after = cut.elapsed();
    // Meanwhile the cut-off machine still runs its copies, untouched (promise 1).
    let views = units_on(victim, &moved)?;
    for unit in &moved {
        ensure!(
            views[unit].identity() == before[unit].identity,
            "{unit} on the cut-off machine was stopped or restarted: {:?}",
            views[unit]
        );
    }

    // A partition long enough for every connection of the cut-off machine to etcd to be
    // declared dead (HTTP/2 keepalive: 10 s + timeout), as a real one would be: time is the
    // fault here.
    wait_for(TIMEOUT, Duration::from_millis(250), || {
        cut.elapsed() >= PARTITION
            && units_on(victim, &moved).is_ok_and(|v| v.values().all(UnitView::is_active))
    })
    .with_context(|| format!("{} stopped its copies while cut off", victim.name()))?;
    victim.heal_network()?;
    let healed = Instant::now();
    wait_for(Duration::from_secs(60), Duration::from_millis(100), || {
        units_on(victim, &moved).is_ok_and(|v| v.values().all(|u| !u.is_active()))
    })
    .with_context(|| format!("{} kept its stale copies after the heal", victim.name()))?;
    let stale_after_heal = healed.elapsed();
    eprintln!(
        "partition of {:?}: units rescheduled {rescheduled_after:?} after the cut; stale \
         copies stopped {stale_after_heal:?} after the heal (two copies ran for {:?})",
        healed.duration_since(cut),
        healed.duration_since(cut) - rescheduled_after + stale_after_heal
    );
    support::wait_registered(&cluster, &registry)?;
    want.extend(moved.iter().map(|u| (u.clone(), Want::Launched)));
    let after = wait_converged(&cluster, &registry, &want, SETTLE)?;
    for (unit, p) in &after {
        if let Some((machine, identity)) = elsewhere.get(unit) {
            ensure!(
                &p.machine == machine && &p.identity == identity,
                "{unit}'s new copy was moved or restarted after the heal: {p:?}"
            );
        } else {
            ensure!(p == &before[unit], "{unit} moved or restarted: {p:?}");
        }
    }
    support::finish(cluster)
}

/// The leader key as etcd holds it: the leader's machine ID and its lease.
fn leader_key(registry: &TestRegistry) -> Result<Option<(String, i64)>> {
    let key = registry.registry().keys().leader();
    let res = registry
        .block_on(registry.registry().raw_kv().range(&key, false, None))
        .context("reading the leader key")?;
    Ok(res.kvs.first().map(|kv| {
        (
            String::from_utf8_lossy(&kv.value).trim().to_owned(),
            kv.lease,
        )
    }))
}

/// A live engine leader cut off the network (fleet's engine has no fence; a deposed leader
/// could schedule), with units started right after the cut for whichever engine leads to
/// place. Another machine's engine takes over within the leader lease's TTL; a
/// write carrying the old leader's fence is refused; the old leader notices on its own that
/// its lease lapsed; no unit is ever scheduled on two machines; its units run elsewhere after
/// the agent TTL (the documented partition window); and on heal it follows the new leader
/// instead of taking leadership back, and stops its stale copies.
#[test]
fn a_leader_cut_off_is_replaced_within_the_ttl_its_fence_refuses_it_and_it_steps_down_on_heal()
-> Result<()> {
    let (cluster, registry) = start(3, engine_spec())?;
    let texts: BTreeMap<String, String> = (0..9)
        .map(|i| (format!("lead-{i}.service"), sleeper(600_000 + i)))
        .collect();
    let paths = write_units(&cluster.dir().join("units"), &texts)?;
    // Six run before the cut; three are started while the leader is cut off, for whichever
    // engine leads to place.
    let (first, late): (Vec<String>, Vec<String>) = texts
        .keys()
        .cloned()
        .partition(|u| u.as_str() < "lead-6.service");
    let mut want: BTreeMap<String, Want> =
        first.iter().map(|u| (u.clone(), Want::Launched)).collect();
    let paths_of = |units: &[String]| units.iter().map(|u| paths[u].clone()).collect::<Vec<_>>();
    no_block(&cluster, "start", &paths_of(&first))?;
    let before = wait_converged(&cluster, &registry, &want, SETTLE)?;
    let old = leader_key(&registry)?.context("no engine leader")?;
    let deposed = cluster.machine_by_id(&old.0)?;
    let moved: Vec<String> = before
        .iter()
        .filter(|(_, p)| p.machine == deposed.name())
        .map(|(u, _)| u.clone())
        .collect();
    let cursor = journal_cursor(deposed)?;
    let from = revision(&registry)?;
    // The leader's own fence, as its engine holds it (fleet_registry::Leadership). While it
    // leads, a fenced write goes through (one that changes nothing: no such unit is
    // unschedulable), so the refusal below is the fence's doing, not a broken write.
    let old_id: MachineId = old.0.parse().context("the leader key's machine ID")?;
    let fence = EngineRole::new(registry.registry().clone()).leadership_of(&old_id, LeaseId(old.1));
    let nothing = EngineWrite::ClearUnschedulable {
        unit: "fence-check.service".parse()?,
    };
    registry
        .block_on(fence.write(&[nothing]))
        .context("a write fenced by the live leader was refused")?;

    deposed.cut_network()?;
    let cut = Instant::now();
    no_block(&cluster, "start", &paths_of(&late))?;
    want.extend(late.iter().map(|u| (u.clone(), Want::Launched)));
    let new = wait_for_value(TIMEOUT, Duration::from_millis(20), || {
        leader_key(&registry)
            .ok()
            .flatten()
            .filter(|(id, _)| *id != old.0)
    })
    .context("no engine took over from the cut-off leader")?;
    let took_over = cut.elapsed();
    // What was left of the lease (at most its TTL: 2.5 s, 3 s in etcd), then etcd's expiry
    // check and a follower's campaign; 2 s of slack for a loaded machine.
    ensure!(
        took_over < ENGINE_LEASE + TAKEOVER_SLACK,
        "a new leader only after {took_over:?}"
    );

    // What the old leader could still send (a request in flight when the link went down):
    // a second copy of a unit, on its own machine. Its fence refuses it.
    let (_, schedules) = support::dump(&registry, &format!("{}schedule/", support::PREFIX))?;
    let value = schedules
        .iter()
        .find(|(k, _)| !k.contains(deposed.id().as_str()))
        .map(|(_, v)| v)
        .context("nothing scheduled off the cut-off leader")?;
    let mut copy: ScheduleEntry = serde_json::from_slice(value).context("a schedule entry")?;
    copy.machine = deposed.id().clone();
    match registry.block_on(fence.write(&[EngineWrite::Schedule(copy)])) {
        Err(RegistryError::LostLeadership) => {}
        other => bail!("a write fenced by the deposed leader was not refused: {other:?}"),
    }

    // Cut off, it steps down by itself: its lease could not be renewed for a whole TTL.
    wait_for(TIMEOUT, Duration::from_millis(250), || {
        support::fleetd_log(deposed, &cursor).is_ok_and(|log| {
            log.contains("engine leadership lapsed") || log.contains("engine leadership lost")
        })
    })
    .context("the cut-off leader never noticed it lost leadership")?;
    // Its units run elsewhere once its presence expired; it keeps its own copies (promise 1).
    let mut last = String::new();
    wait_for(SETTLE, POLL, || {
        let mut placed = BTreeSet::new();
        for m in cluster.machines().iter().filter(|m| m.id() != deposed.id()) {
            if let Ok(views) = units_on(m, &moved) {
                placed.extend(
                    views
                        .into_iter()
                        .filter(|(_, v)| v.is_active())
                        .map(|(u, _)| u),
                );
            }
        }
        last = format!("{placed:?}");
        placed.len() == moved.len()
    })
    .with_context(|| format!("{moved:?} not rescheduled off {}: {last}", deposed.name()))?;
    let rescheduled_after = cut.elapsed();
    // Until the heal it keeps running its own copies, untouched (promise 1): time is the
    // fault here, as in the machine partition.
    let mut changed = Vec::new();
    wait_for(TIMEOUT, Duration::from_millis(250), || {
        let Ok(views) = units_on(deposed, &moved) else {
            return false;
        };
        changed = moved
            .iter()
            .filter(|u| views.get(*u).map(UnitView::identity) != Some(before[*u].identity.clone()))
            .map(|u| (u.clone(), views.get(u).cloned()))
            .collect();
        !changed.is_empty() || cut.elapsed() >= PARTITION
    })?;
    ensure!(
        changed.is_empty(),
        "{} stopped or restarted its copies while cut off: {changed:?}",
        deposed.name()
    );
    deposed.heal_network()?;
    let healed = Instant::now();

    support::wait_registered(&cluster, &registry)?;
    let after = wait_converged(&cluster, &registry, &want, SETTLE).context("after the heal")?;
    let stale_gone = healed.elapsed();
    let now = leader_key(&registry)?.context("no leader after the heal")?;
    ensure!(
        now == new,
        "leadership changed after the heal: {new:?} -> {now:?} (old {old:?})"
    );
    let log = support::fleetd_log(deposed, &cursor)?;
    ensure!(
        !log.contains("engine leadership acquired"),
        "the old leader took leadership back:\n{log}"
    );
    for (unit, p) in &after {
        if let Some(was) = before.get(unit)
            && !moved.contains(unit)
        {
            ensure!(p == was, "{unit} moved or restarted: {p:?}");
        }
    }
    // At every revision from before the cut to now: one leader key holder at a time, never
    // the old one again, and no unit scheduled on two machines.
    let leader_path = registry.registry().keys().leader();
    let mut deposed_at = None;
    let checked = replay(&registry, from, |rev, state| {
        let holder = state
            .get(&leader_path)
            .map(|v| String::from_utf8_lossy(v).into_owned());
        match (&holder, deposed_at) {
            (Some(h), Some(at)) if h.trim() == old.0 => {
                bail!("revision {rev}: the old leader holds the key again (deposed at {at})")
            }
            (Some(h), None) if h.trim() != old.0 => deposed_at = Some(rev),
            _ => {}
        }
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        for (unit, machine) in schedule_entries(state) {
            if let Some(other) = seen.insert(unit.clone(), machine.clone()) {
                bail!("revision {rev}: {unit} scheduled on {other} and {machine}");
            }
        }
        Ok(())
    })?;
    eprintln!(
        "leader {} cut off: new leader after {took_over:?}, its units running elsewhere after \
         {rescheduled_after:?}; healed after {:?}, converged {stale_gone:?} later; \
         {checked} revisions checked",
        deposed.name(),
        healed.duration_since(cut)
    );
    support::finish(cluster)
}

/// Every schedule entry as `(unit, machine)`.
fn schedule_entries(state: &BTreeMap<String, Vec<u8>>) -> Vec<(String, String)> {
    let base = format!("{}schedule/", support::PREFIX);
    state
        .keys()
        .filter_map(|k| k.strip_prefix(&base))
        .filter_map(|rest| rest.split_once('/'))
        .map(|(machine, unit)| (unit.to_owned(), machine.to_owned()))
        .collect()
}

/// The engine leader is killed (and not restarted) while 150 units are being started: another
/// machine's engine takes over and schedules them all, and at no etcd revision is any unit
/// scheduled on two machines. When the dead leader's fleetd comes back, it stops the copies
/// its agent had started (its units were moved when its presence expired).
#[test]
fn when_the_leader_dies_mid_scheduling_another_finishes_and_nothing_is_ever_scheduled_twice()
-> Result<()> {
    let mut rng = Rng::from_env_or_time("leader_dies_mid_scheduling");
    let (cluster, registry) = start(3, engine_spec())?;
    let total = 150;
    let texts: BTreeMap<String, String> = (0..total)
        .map(|i| (format!("mid-{i:03}.service"), sleeper(400_000 + i)))
        .collect();
    let paths = write_units(&cluster.dir().join("units"), &texts)?;
    let first = wait_for_value(TIMEOUT, POLL, || leader(&registry).ok().flatten())
        .context("no engine leader")?;
    let dead = cluster.machine_by_id(&first)?;
    let from = revision(&registry)?;
    let batches: Vec<Vec<String>> = paths
        .values()
        .cloned()
        .collect::<Vec<_>>()
        .chunks(25)
        .map(<[String]>::to_vec)
        .collect();
    let threshold = 5 + rng.below(40) as usize;
    let count = || -> usize {
        support::dump(&registry, &format!("{}schedule/", support::PREFIX))
            .map_or(0, |(_, kvs)| kvs.len())
    };
    // The batches after the second wait for the kill: on a fast machine (or a slow poll of the
    // count) the leader once scheduled all 150 before the kill landed.
    let killed = std::sync::atomic::AtomicBool::new(false);
    let at_kill = std::thread::scope(|s| -> Result<usize> {
        let submitter = s.spawn(|| -> Result<()> {
            for (i, batch) in batches.iter().enumerate() {
                if i == 2 {
                    wait_for(TIMEOUT, POLL, || {
                        killed.load(std::sync::atomic::Ordering::Relaxed)
                    })
                    .context("the leader was never killed")?;
                }
                no_block(&cluster, "start", batch)?;
            }
            Ok(())
        });
        wait_for(TIMEOUT, Duration::from_millis(5), || count() >= threshold)
            .context("nothing scheduled")?;
        dead.kill_fleetd(Signal::Kill)?;
        killed.store(true, std::sync::atomic::Ordering::Relaxed);
        let at_kill = count();
        // No restart: leadership must pass to another machine.
        dead.stop_fleetd()?;
        submitter.join().expect("the submitter does not panic")?;
        Ok(at_kill)
    })?;
    eprintln!(
        "leader {} killed with {at_kill} of {total} units scheduled",
        dead.name()
    );
    ensure!(
        at_kill < total as usize,
        "the leader finished before it was killed"
    );

    let live: BTreeSet<String> = followers(&cluster, &first)
        .iter()
        .map(|m| m.id().to_string())
        .collect();
    let mut last = String::new();
    wait_for(SETTLE, Duration::from_millis(200), || {
        let Ok((_, kvs)) = support::dump(&registry, &format!("{}schedule/", support::PREFIX))
        else {
            return false;
        };
        let entries = schedule_entries(&kvs);
        let units: BTreeSet<&String> = entries.iter().map(|(u, _)| u).collect();
        last = format!("{} entries, {} units", entries.len(), units.len());
        units.len() == total as usize && entries.iter().all(|(_, m)| live.contains(m))
    })
    .with_context(|| format!("not every unit scheduled on the live machines: {last}"))?;
    let second = leader(&registry)?.context("no leader")?;
    ensure!(second != first, "the dead fleetd is still the leader");

    // The dead leader's agent comes back: it stops what it had started before it died.
    dead.start_fleetd()?;
    support::wait_registered(&cluster, &registry)?;
    let want: BTreeMap<String, Want> = texts.keys().map(|u| (u.clone(), Want::Launched)).collect();
    wait_converged(&cluster, &registry, &want, SETTLE)?;
    // At every revision since the first submission, through the take-over and the old
    // leader's return: no unit on two machines.
    let checked = replay(&registry, from, |rev, state| {
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        for (unit, machine) in schedule_entries(state) {
            if let Some(other) = seen.insert(unit.clone(), machine.clone()) {
                bail!("revision {rev}: {unit} scheduled on {other} and {machine}");
            }
        }
        Ok(())
    })?;
    eprintln!("{checked} revisions checked");
    support::finish(cluster)
}

/// The file hashes a unit record refers to (its own and, during a rolling replace, the
/// previous one).
fn referenced(record: &UnitRecord) -> Vec<String> {
    let mut hashes = vec![record.hash.to_string()];
    if let Some(r) = &record.replace.rollout {
        hashes.push(r.previous.to_string());
    }
    hashes
}

/// The registry's integrity at one revision: every unit has its file and its reference, and
/// every reference belongs to a unit that refers to that file. Returns the files no unit
/// refers to (left for a moment between a replace or destroy and its collection).
fn registry_consistent(state: &BTreeMap<String, Vec<u8>>) -> Result<BTreeSet<String>> {
    let p = support::PREFIX;
    let under = |dir: &str| -> Vec<(String, &Vec<u8>)> {
        let base = format!("{p}{dir}/");
        state
            .iter()
            .filter_map(|(k, v)| k.strip_prefix(&base).map(|rest| (rest.to_owned(), v)))
            .collect()
    };
    let files: BTreeSet<String> = under("file").into_iter().map(|(h, _)| h).collect();
    let refs: BTreeSet<(String, String)> = under("file-ref")
        .into_iter()
        .filter_map(|(rest, _)| {
            rest.split_once('/')
                .map(|(h, n)| (h.to_owned(), n.to_owned()))
        })
        .collect();
    let mut units = BTreeMap::new();
    for (name, value) in under("unit") {
        let record: UnitRecord = serde_json::from_slice(value)
            .with_context(|| format!("unit record {name}: {}", String::from_utf8_lossy(value)))?;
        ensure!(
            record.name.as_str() == name,
            "record {name} names {}",
            record.name
        );
        units.insert(name, referenced(&record));
    }
    for (name, hashes) in &units {
        for h in hashes {
            ensure!(
                files.contains(h),
                "{name} refers to file {h}, which is missing"
            );
            ensure!(
                refs.contains(&(h.clone(), name.clone())),
                "{name} refers to file {h} without a reference"
            );
        }
    }
    for (h, n) in &refs {
        ensure!(
            units.get(n).is_some_and(|hs| hs.contains(h)),
            "reference {h}/{n} without a unit referring to that file"
        );
    }
    let referenced: BTreeSet<&String> = refs.iter().map(|(h, _)| h).collect();
    Ok(files
        .into_iter()
        .filter(|f| !referenced.contains(f))
        .collect())
}

/// One fleetctl client's local unit files: the same names, its own contents.
fn client_files(
    cluster: &Cluster,
    client: usize,
    names: &[String],
) -> Result<BTreeMap<String, String>> {
    let texts = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                n.clone(),
                sleeper(500_000 + 1000 * client as u32 + i as u32),
            )
        })
        .collect();
    write_units(&cluster.dir().join(format!("client{client}")), &texts)
}

/// Two fleetctl processes replace, stop and destroy the same units concurrently for `rounds`
/// rounds each: every registry change is atomic (at every revision each unit has its file and
/// its reference, and no reference is dangling), no file is left behind once they are done,
/// and the machines end up running exactly what the registry says, with its hashes.
fn racing_clients(rounds: usize) -> Result<()> {
    let (cluster, registry) = start(2, engine_spec())?;
    let names: Vec<String> = (0..4).map(|i| format!("race-{i}.service")).collect();
    let files = [
        client_files(&cluster, 0, &names)?,
        client_files(&cluster, 1, &names)?,
    ];
    let from = revision(&registry)?;
    let seed = Rng::from_env_or_time("racing_clients").next();
    // Both clients start each round together, on the same unit most of the time.
    let barrier = std::sync::Barrier::new(2);
    let refusals = std::thread::scope(|s| -> Result<Vec<String>> {
        let clients: Vec<_> = (0..2)
            .map(|c| {
                let (cluster, names, files, barrier) = (&cluster, &names, &files[c], &barrier);
                s.spawn(move || -> Result<Vec<String>> {
                    let mut shared = Rng::from_seed(seed);
                    let mut rng = Rng::from_seed(seed + 1 + c as u64);
                    let mut refused = Vec::new();
                    for _ in 0..rounds {
                        let mut pick = shared.below(names.len() as u64);
                        if rng.chance(20) {
                            pick = rng.below(names.len() as u64);
                        }
                        let unit = &names[pick as usize];
                        barrier.wait();
                        let run = match rng.below(10) {
                            0..=5 => fleetctl(
                                cluster,
                                &["start", "--no-block", "--replace", files[unit].as_str()],
                            )?,
                            6..=7 => fleetctl(cluster, &["destroy", unit.as_str()])?,
                            _ => fleetctl(cluster, &["stop", "--no-block", unit.as_str()])?,
                        };
                        if !run.success {
                            refused.push(run.stderr.trim().to_owned());
                        }
                    }
                    Ok(refused)
                })
            })
            .collect();
        let mut all = Vec::new();
        for c in clients {
            all.extend(c.join().expect("a client does not panic")?);
        }
        Ok(all)
    })?;
    // A refusal is a clean one: a conflict or a unit the other client just destroyed.
    for r in &refusals {
        ensure!(
            !r.is_empty() && r.lines().count() <= 3 && !r.contains("panicked"),
            "unclear refusal: {r:?}"
        );
    }
    eprintln!(
        "{} refusals: {:?}",
        refusals.len(),
        refusals.iter().take(5).collect::<Vec<_>>()
    );

    let mut orphans_seen = 0;
    let checked = replay(&registry, from, |rev, state| {
        let orphans = registry_consistent(state).with_context(|| format!("revision {rev}"))?;
        orphans_seen += usize::from(!orphans.is_empty());
        Ok(())
    })?;
    let (_, now) = support::dump(&registry, support::PREFIX)?;
    let orphans = registry_consistent(&now)?;
    ensure!(
        orphans.is_empty(),
        "unit files left without a unit: {orphans:?}"
    );
    eprintln!("{checked} revisions checked; {orphans_seen} with a file awaiting collection");

    // The machines follow the registry.
    let units = registry.block_on(registry.registry().units())?.items;
    let mut want: BTreeMap<String, Want> = names.iter().map(|n| (n.clone(), Want::Gone)).collect();
    for u in &units {
        let w = match u.desired() {
            fleet_core::DesiredState::Inactive => Want::Inactive,
            fleet_core::DesiredState::Loaded => Want::Loaded,
            fleet_core::DesiredState::Launched => Want::Launched,
        };
        want.insert(u.name().to_string(), w);
    }
    wait_converged(&cluster, &registry, &want, SETTLE)?;
    support::finish(cluster)
}

#[test]
fn concurrent_fleetctl_replace_stop_and_destroy_keep_the_registry_consistent() -> Result<()> {
    racing_clients(25)
}

/// The full variant: 100 rounds per client. `make soak`.
#[test]
#[ignore = "soak: run last by make test, alone by make soak"]
fn soak_100_rounds_of_concurrent_fleetctl_keep_the_registry_consistent() -> Result<()> {
    racing_clients(100)
}

/// Two fleetctl processes starting the same stopped units at the same moment: both must
/// succeed (the units are launched either way) or refuse cleanly; neither may crash. Only
/// etcd is needed, so this runs against a throwaway one, without machines.
#[test]
fn two_fleetctl_starting_the_same_units_at_once_both_succeed_and_neither_crashes() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let etcd = runtime.block_on(fleet_testing::TestEtcd::start());
    let dir = etcd.dir().join("units");
    let texts: BTreeMap<String, String> = (0..30)
        .map(|i| (format!("twin-{i:02}.service"), sleeper(990_000 + i)))
        .collect();
    let paths: Vec<String> = write_units(&dir, &texts)?.into_values().collect();
    let fleetctl = fleet_functional_tests::default_bin_dir().join("fleetctl");
    let run = |args: &[String]| -> Result<Run> {
        let out = std::process::Command::new(&fleetctl)
            .args(["--driver", "etcd", "--endpoint"])
            .arg(etcd.endpoint())
            .args(args)
            .env_remove("FLEETCTL_ENDPOINT")
            .output()
            .context("running fleetctl")?;
        Ok(Run {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    };
    let verb = |v: &[&str], args: &[String]| -> Vec<String> {
        v.iter()
            .map(|s| (*s).to_owned())
            .chain(args.iter().cloned())
            .collect()
    };
    let submitted = run(&verb(&["submit"], &paths))?;
    ensure!(submitted.success, "{submitted:?}");
    let names: Vec<String> = texts.keys().cloned().collect();
    for round in 0..5 {
        let barrier = std::sync::Barrier::new(2);
        let runs = std::thread::scope(|s| -> Result<Vec<Run>> {
            let racers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        run(&verb(&["start", "--no-block"], &paths))
                    })
                })
                .collect();
            racers
                .into_iter()
                .map(|r| r.join().expect("a racer does not panic"))
                .collect()
        })?;
        for r in &runs {
            ensure!(
                !r.stderr.contains("panicked"),
                "round {round}: BUG: fleetctl crashed when another fleetctl started the same \
                 units: {}",
                r.stderr.trim()
            );
            ensure!(
                r.success || r.stderr.contains("concurrently"),
                "round {round}: {r:?}"
            );
        }
        let stopped = run(&verb(&["stop", "--no-block"], &names))?;
        ensure!(stopped.success, "{stopped:?}");
    }
    Ok(())
}
