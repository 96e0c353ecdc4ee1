//! The chaos soak (issue 12): about five minutes of faults under fleetctl churn on one real
//! cluster, with an invariant checker over etcd's history and every machine's systemd.
//!
//! Faults, one per round, in a random order: kill -9 of a fleetd, an etcd freeze
//! (SIGSTOP/SIGCONT), a machine's power loss (once), a machine cut off the network, and a kill
//! of one etcd member when the cluster's etcd has more than one. Meanwhile a client loop
//! starts, stops, destroys and replaces units with fleetctl. Two recorders run all along: one
//! polls systemd on every machine (ActiveState and InvocationID of every unit), one records
//! every change of a schedule entry from etcd's watch. After each fault the cluster must
//! converge on what the registry says within [`CONVERGE`]; at the end the checker
//! (`chaos/check.rs`) proves that no unit ran twice at once outside a documented window and
//! that no unit stopped without a registry reason, and every revision of etcd's history is
//! replayed to prove no unit was ever scheduled on two machines. It prints the seed, the
//! faults, the operations and the violations (0). `FLEET_FAULT_SEED=<n>` replays a run.
//! Needs root; `make soak`.

#[path = "chaos/check.rs"]
mod check;
mod support;

use anyhow::{Context, Result, bail, ensure};
use check::{Change, Record, RunRecord, Window};
use fleet_core::DesiredState;
use fleet_functional_tests::{
    Cluster, FleetdSpec, Machine, OutputExt, Signal, TestRegistry, wait_for_value,
};
use fleet_registry::kv::{EventKind, Kv, WatchMessage};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::{PREFIX, Rng, Want, fleetctl, replay, revision, units_on, wait_converged};

/// Machines at the start; one of them loses power during the soak.
const MACHINES: usize = 4;
const UNITS: usize = 12;
/// The agent TTL: long enough that a fleetd killed and restarted by systemd (1 s later)
/// resumes its lease, short enough that a lost machine's units move quickly.
const AGENT_TTL: &str = "6s";
/// How long etcd stays frozen. Shorter than the agent TTL by a renewal period, so no
/// machine's presence runs out: until the engine holds rescheduling when most machines
/// vanish at once (issue 12 item 2), a freeze longer than the TTL moves units, and the
/// checker would rightly report their stops. Raise it to 3 x TTL + 5 s once that hold is in.
const FREEZE: Duration = Duration::from_secs(3);
/// How long a machine stays cut off: longer than the agent TTL, so its units move.
const PARTITION: Duration = Duration::from_secs(10);
/// After a machine is back (healed, fleetd restarted) it may take this long to read its
/// schedule and stop its stale copies: part of the documented window (guarantees.md).
const HEAL_BOUND: Duration = Duration::from_secs(10);
/// Every fault is followed by convergence within this bound.
const CONVERGE: Duration = Duration::from_secs(45);
/// Rounds run until this much time has passed (and at least one of each fault ran);
/// `FLEET_CHAOS_SECS` sets another (a short run while working on the soak itself).
const BUDGET: Duration = Duration::from_secs(270);
const MAX_ROUNDS: usize = 40;
/// fleetctl operations per round, spread over the fault.
const OPS_PER_ROUND: usize = 6;
const POLL_EVERY: Duration = Duration::from_millis(300);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    FleetdKill,
    EtcdFreeze,
    PowerLoss,
    NetworkCut,
    EtcdMemberKill,
}

/// What was injected, for the report and the checker.
#[derive(Debug)]
struct Injected {
    fault: Fault,
    machine: Option<String>,
    at: Instant,
    lasted: Duration,
    converged_in: Duration,
}

fn unit_name(i: usize) -> String {
    format!("chaos-{i:02}.service")
}

/// Version `v` of unit `i`: different versions have different hashes.
fn unit_text(i: usize, v: u32) -> String {
    format!(
        "[Unit]\nDescription=chaos unit {i} version {v}\n\n[Service]\nExecStart=/bin/sleep {}\n",
        700_000 + 1000 * v + i as u32
    )
}

/// Writes every version of every unit under `dir/v<version>/`; returns the paths.
fn write_versions(dir: &std::path::Path) -> Result<BTreeMap<(usize, u32), String>> {
    let mut paths = BTreeMap::new();
    for v in 0..3 {
        let texts: BTreeMap<String, String> = (0..UNITS)
            .map(|i| (unit_name(i), unit_text(i, v)))
            .collect();
        let written = support::write_units(&dir.join(format!("v{v}")), &texts)?;
        for i in 0..UNITS {
            paths.insert((i, v), written[&unit_name(i)].clone());
        }
    }
    Ok(paths)
}

// --- recorders -----------------------------------------------------------------------------

/// What the recorders share with the soak.
#[derive(Debug, Default)]
struct Seen {
    /// Open runs by (machine, unit, invocation).
    open: BTreeMap<(String, String, String), RunRecord>,
    closed: Vec<RunRecord>,
    changes: Vec<Change>,
    polls: usize,
    events: usize,
}

/// Polls systemd on every running machine until `stop`: opens a run when a unit is first
/// seen active with an invocation, closes it at the first poll of that machine without it.
fn poll_systemd(cluster: &Cluster, seen: &Mutex<Seen>, stop: &AtomicBool) {
    let names: Vec<String> = (0..UNITS).map(unit_name).collect();
    while !stop.load(Ordering::SeqCst) {
        for m in cluster.machines().iter().filter(|m| m.is_up()) {
            let Ok(views) = units_on(m, &names) else {
                continue;
            };
            let now = Instant::now();
            let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.polls += 1;
            let active: BTreeSet<(String, String, String)> = views
                .iter()
                .filter(|(_, v)| v.is_active() && !v.invocation.is_empty())
                .map(|(u, v)| (m.name().to_owned(), u.clone(), v.invocation.clone()))
                .collect();
            let gone: Vec<_> = seen
                .open
                .keys()
                .filter(|k| k.0 == m.name() && !active.contains(*k))
                .cloned()
                .collect();
            for key in gone {
                if let Some(mut run) = seen.open.remove(&key) {
                    run.ended = Some(now);
                    seen.closed.push(run);
                }
            }
            for key in active {
                let run = seen.open.entry(key.clone()).or_insert_with(|| RunRecord {
                    machine: key.0.clone(),
                    unit: key.1.clone(),
                    invocation: key.2.clone(),
                    first: now,
                    last_seen: now,
                    ended: None,
                });
                run.last_seen = now;
            }
        }
        std::thread::sleep(POLL_EVERY);
    }
}

/// Records every change of a schedule entry after revision `from` until `stop`, with the
/// moment it arrived; a watch broken by a fault is resumed where it stopped.
fn watch_schedules(
    cluster: &Cluster,
    registry: &TestRegistry,
    from: i64,
    seen: &Mutex<Seen>,
    stop: &AtomicBool,
) -> Result<()> {
    let prefix = format!("{PREFIX}schedule/");
    let machine_of = |id: &str| {
        cluster
            .machine_by_id(id)
            .map_or_else(|_| id.to_owned(), |m| m.name().to_owned())
    };
    let kv = registry.registry().kv();
    // The entries as of `from`: a put that rewrites an entry with the same value (a new
    // leader's first pass may) changes nothing and is no reason.
    let mut entries: BTreeMap<String, Vec<u8>> = registry
        .block_on(kv.range(&prefix, true, Some(from)))
        .context("reading the schedules")?
        .kvs
        .into_iter()
        .map(|kv| (kv.key, kv.value))
        .collect();
    let mut last = from;
    while !stop.load(Ordering::SeqCst) {
        let Ok(mut watch) = registry.block_on(kv.watch(&prefix, true, last + 1)) else {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        while !stop.load(Ordering::SeqCst) {
            let message = registry.block_on(async {
                tokio::time::timeout(Duration::from_millis(300), watch.rx.recv()).await
            });
            let events = match message {
                Err(_) => continue,
                Ok(Some(WatchMessage::Events { events, .. })) => events,
                Ok(Some(WatchMessage::Compacted { compact_revision })) => {
                    bail!("history compacted at {compact_revision}")
                }
                Ok(Some(WatchMessage::Broken) | None) => break,
            };
            let now = Instant::now();
            let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            for event in events {
                last = last.max(event.kv.mod_revision);
                seen.events += 1;
                let Some((machine, unit)) = event
                    .kv
                    .key
                    .strip_prefix(&prefix)
                    .and_then(|rest| rest.split_once('/'))
                else {
                    continue;
                };
                let before = match event.kind {
                    EventKind::Put => entries.insert(event.kv.key.clone(), event.kv.value.clone()),
                    EventKind::Delete => entries.remove(&event.kv.key),
                };
                // A put that creates the entry starts a run; it is no reason to stop one.
                let changed = match (event.kind, before) {
                    (EventKind::Put, Some(old)) => old != event.kv.value,
                    (EventKind::Put, None) => false,
                    (EventKind::Delete, _) => true,
                };
                if !changed {
                    continue;
                }
                seen.changes.push(Change {
                    at: now,
                    machine: machine_of(machine),
                    unit: unit.to_owned(),
                });
            }
        }
    }
    Ok(())
}

// --- faults --------------------------------------------------------------------------------

/// The members of the cluster's etcd. The harness runs one today; the member kill joins the
/// faults as soon as it runs more.
fn etcd_members(cluster: &Cluster) -> usize {
    cluster.state().etcd.process.map_or(0, |_| 1)
}

fn up(cluster: &Cluster) -> Vec<&Machine> {
    cluster.machines().iter().filter(|m| m.is_up()).collect()
}

/// The faults of the first rounds (each once, shuffled), then random ones; at most one power
/// loss, and never one that would leave fewer than three machines.
fn pick(rng: &mut Rng, round: usize, plan: &[Fault], cluster: &Cluster) -> Fault {
    if let Some(f) = plan.get(round) {
        return *f;
    }
    let mut menu = vec![Fault::FleetdKill, Fault::EtcdFreeze, Fault::NetworkCut];
    if etcd_members(cluster) > 1 {
        menu.push(Fault::EtcdMemberKill);
    }
    menu[rng.below(menu.len() as u64) as usize]
}

/// Injects `fault` and returns once it is over (fleetd restarted, etcd thawed, network
/// healed), with the machine it hit and its documented window, if any.
fn inject(
    cluster: &Cluster,
    rng: &mut Rng,
    fault: Fault,
    record: &mut Record,
) -> Result<Option<String>> {
    let machines = up(cluster);
    let victim = machines[rng.below(machines.len() as u64) as usize];
    let start = Instant::now();
    match fault {
        Fault::FleetdKill => {
            let old = victim
                .main_pid("fleetd.service")?
                .context("fleetd not running")?;
            victim.kill_fleetd(Signal::Kill)?;
            support::wait_fleetd_restarted(victim, old)?;
            record.windows.push(Window {
                machine: victim.name().to_owned(),
                from: start,
                to: Instant::now() + HEAL_BOUND,
            });
            Ok(Some(victim.name().to_owned()))
        }
        Fault::EtcdFreeze => {
            let etcd = cluster.state().etcd.process.context("etcd not running")?;
            etcd.signal(Signal::Stop)?;
            // The freeze's length is the fault itself.
            std::thread::sleep(FREEZE);
            etcd.signal(Signal::Cont)?;
            Ok(None)
        }
        Fault::PowerLoss => {
            victim.poweroff()?;
            record
                .power_lost
                .insert(victim.name().to_owned(), Instant::now());
            Ok(Some(victim.name().to_owned()))
        }
        Fault::NetworkCut => {
            victim.cut_network()?;
            // The partition's length is the fault itself.
            std::thread::sleep(PARTITION);
            victim.heal_network()?;
            record.windows.push(Window {
                machine: victim.name().to_owned(),
                from: start,
                to: Instant::now() + HEAL_BOUND,
            });
            Ok(Some(victim.name().to_owned()))
        }
        Fault::EtcdMemberKill => bail!("the harness runs a single etcd member"),
    }
}

// --- churn ---------------------------------------------------------------------------------

/// The client side: `OPS_PER_ROUND` random fleetctl operations, one every `spacing`. Returns
/// `(operation, succeeded)` for each; a failure must be one clean message.
fn churn(
    cluster: &Cluster,
    rng: &mut Rng,
    versions: &mut [u32],
    paths: &BTreeMap<(usize, u32), String>,
    spacing: Duration,
) -> Result<Vec<(String, bool)>> {
    let mut done = Vec::new();
    for _ in 0..OPS_PER_ROUND {
        let i = rng.below(UNITS as u64) as usize;
        let (verb, args): (&str, Vec<String>) = match rng.below(10) {
            0..=3 => ("start", vec![paths[&(i, versions[i])].clone()]),
            4..=5 => ("stop", vec![unit_name(i)]),
            6 => ("destroy", vec![unit_name(i)]),
            _ => {
                versions[i] = (versions[i] + 1) % 3;
                ("replace", vec![paths[&(i, versions[i])].clone()])
            }
        };
        let mut line: Vec<String> = match verb {
            "replace" => vec!["start".into(), "--no-block".into(), "--replace".into()],
            "destroy" => vec!["destroy".into()],
            other => vec![other.into(), "--no-block".into()],
        };
        line.extend(args);
        let run = fleetctl(cluster, &line)?;
        ensure!(
            run.success
                || (!run.stderr.trim().is_empty()
                    && run.stderr.lines().count() <= 3
                    && !run.stderr.contains("panicked")),
            "fleetctl {} failed unclearly: {run:?}",
            line.join(" ")
        );
        done.push((format!("{verb} {}", unit_name(i)), run.success));
        // The spacing spreads the operations over the fault: it is the load, not a wait.
        std::thread::sleep(spacing);
    }
    Ok(done)
}

/// What the machines must run: the registry's desired states.
fn wanted(registry: &TestRegistry) -> Result<BTreeMap<String, Want>> {
    let (_, units) = registry.block_on(registry.registry().units())?;
    let mut want: BTreeMap<String, Want> = (0..UNITS).map(|i| (unit_name(i), Want::Gone)).collect();
    for u in &units {
        let w = match u.desired() {
            DesiredState::Inactive => Want::Inactive,
            DesiredState::Loaded => Want::Loaded,
            DesiredState::Launched => Want::Launched,
        };
        want.insert(u.name().to_string(), w);
    }
    Ok(want)
}

/// Waits for etcd to answer again after a fault (a thawed etcd answers at once; this only
/// guards the read of the desired states).
fn wanted_when_ready(registry: &TestRegistry) -> Result<BTreeMap<String, Want>> {
    wait_for_value(CONVERGE, Duration::from_millis(200), || {
        wanted(registry).ok()
    })
    .context("etcd did not answer after the fault")
}

// --- the checker's control ----------------------------------------------------------------

/// Proves the checker is not blind: a second copy of a running unit is started on another
/// machine behind fleet's back (a transient unit of the same name, which fleetd leaves
/// alone), seen by the poller, then stopped behind fleet's back too. The checker must report
/// both: two copies at once, and a stop without a registry reason. Returns the unit and the
/// machine of that copy.
fn control(cluster: &Cluster, seen: &Mutex<Seen>) -> Result<(String, String)> {
    let lock = || seen.lock().unwrap_or_else(|e| e.into_inner());
    let (unit, running_on) = {
        let seen = lock();
        let run = seen
            .open
            .values()
            .find(|r| cluster.machine(&r.machine).is_ok_and(Machine::is_up))
            .context("no unit running for the control")?;
        (run.unit.clone(), run.machine.clone())
    };
    let other = up(cluster)
        .into_iter()
        .find(|m| m.name() != running_on)
        .context("no second machine for the control")?;
    let name = other.name().to_owned();
    other
        .exec(
            "systemd-run",
            ["--quiet", "--unit", &unit, "/bin/sleep", "1000"],
        )?
        .checked()
        .context("starting the control copy")?;
    let invocation = units_on(other, std::slice::from_ref(&unit))?
        .remove(&unit)
        .map(|v| v.invocation)
        .filter(|i| !i.is_empty())
        .context("the control copy has no invocation")?;
    let key = (name.clone(), unit.clone(), invocation);
    let has = |open: bool| {
        let seen = lock();
        if open {
            seen.open.contains_key(&key)
        } else {
            seen.closed
                .iter()
                .any(|r| (&r.machine, &r.unit, &r.invocation) == (&key.0, &key.1, &key.2))
        }
    };
    fleet_functional_tests::wait_for(CONVERGE, POLL_EVERY, || has(true))
        .context("the poller never saw the control copy")?;
    other.systemctl_ok(&["stop", &unit])?;
    fleet_functional_tests::wait_for(CONVERGE, POLL_EVERY, || has(false))
        .context("the poller never saw the control copy stop")?;
    Ok((unit, name))
}

// --- the soak ------------------------------------------------------------------------------

#[test]
#[ignore = "soak: run last by make test, alone by make soak"]
fn soak_chaos_of_faults_under_fleetctl_churn_breaks_no_invariant() -> Result<()> {
    let mut rng = Rng::from_env_or_time("chaos");
    let budget = std::env::var("FLEET_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(BUDGET, Duration::from_secs);
    let spec = FleetdSpec {
        agent_ttl: AGENT_TTL.to_owned(),
        ..FleetdSpec::default().with_env("FLEET_ENGINE_RECONCILE_INTERVAL", "0.5")
    };
    let (cluster, registry) = support::start(MACHINES, spec)?;
    let watcher = TestRegistry::of(&cluster)?;
    let paths = write_versions(&cluster.dir().join("chaos-units"))?;
    let mut versions = vec![0u32; UNITS];
    let all: Vec<String> = (0..UNITS).map(|i| paths[&(i, 0)].clone()).collect();
    let mut line = vec!["start".to_owned(), "--no-block".to_owned()];
    line.extend(all);
    support::fleetctl_ok(&cluster, &line)?;
    wait_converged(&cluster, &registry, &wanted(&registry)?, CONVERGE)?;

    let mut plan = vec![
        Fault::FleetdKill,
        Fault::EtcdFreeze,
        Fault::NetworkCut,
        Fault::PowerLoss,
    ];
    for i in (1..plan.len()).rev() {
        plan.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let from = revision(&registry)?;
    let start = Instant::now();
    let seen = Mutex::new(Seen::default());
    let stop = AtomicBool::new(false);
    let mut record = Record::default();
    let mut injected = Vec::new();
    let mut ops = Vec::new();

    let outcome = std::thread::scope(|s| -> Result<(String, String)> {
        let poller = s.spawn(|| poll_systemd(&cluster, &seen, &stop));
        let history = s.spawn(|| watch_schedules(&cluster, &watcher, from, &seen, &stop));
        let rounds = (|| -> Result<()> {
            for round in 0..MAX_ROUNDS {
                if round >= plan.len() && start.elapsed() > budget {
                    break;
                }
                let fault = pick(&mut rng, round, &plan, &cluster);
                let mut churn_rng = Rng::from_seed(rng.next());
                let spacing = Duration::from_millis(200 + rng.below(800));
                let at = Instant::now();
                let (hit, done) = std::thread::scope(|s| -> Result<_> {
                    let client =
                        s.spawn(|| churn(&cluster, &mut churn_rng, &mut versions, &paths, spacing));
                    let hit = inject(&cluster, &mut rng, fault, &mut record);
                    let done = client.join().expect("the client loop does not panic");
                    Ok((hit?, done?))
                })?;
                let lasted = at.elapsed();
                let want = wanted_when_ready(&registry)?;
                support::wait_registered(&cluster, &registry)?;
                wait_converged(&cluster, &registry, &want, CONVERGE).with_context(|| {
                    format!("round {round}: no convergence within {CONVERGE:?} after {fault:?}")
                })?;
                let converged_in = at.elapsed() - lasted;
                eprintln!(
                    "round {round} at {:.1} s: {fault:?} on {hit:?} for {lasted:.1?}, \
                     converged {converged_in:.1?} later; {} operations",
                    at.duration_since(start).as_secs_f64(),
                    done.len()
                );
                ops.extend(done);
                injected.push(Injected {
                    fault,
                    machine: hit,
                    at,
                    lasted,
                    converged_in,
                });
            }
            Ok(())
        })();
        // The control must fall outside every documented window, or it would be excused.
        let windows_end = record.windows.iter().map(|w| w.to).max();
        let control = rounds.and_then(|()| {
            if let Some(end) = windows_end {
                std::thread::sleep(end.saturating_duration_since(Instant::now()));
            }
            control(&cluster, &seen)
        });
        stop.store(true, Ordering::SeqCst);
        poller.join().expect("the systemd poller does not panic");
        history
            .join()
            .expect("the history recorder does not panic")?;
        control
    });
    let (control_unit, control_machine) = outcome?;

    let seen = seen.into_inner().unwrap_or_else(|e| e.into_inner());
    record.runs = seen.closed;
    record.runs.extend(seen.open.into_values());
    record.changes = seen.changes;
    let (control, mut violations): (Vec<String>, Vec<String>) = check::violations(&record, start)
        .into_iter()
        .partition(|v| v.starts_with(&format!("{control_unit} ")) && v.contains(&control_machine));
    eprintln!("chaos: the control copy of {control_unit} on {control_machine}: {control:?}");
    ensure!(
        control.iter().any(|v| v.contains("at once"))
            && control
                .iter()
                .filter(|v| v.contains("without a registry reason"))
                .count()
                == 1,
        "the checker missed the control copy of {control_unit} on {control_machine}: {control:?}; \
         its runs: {:#?}; windows: {:#?}",
        record
            .runs
            .iter()
            .filter(|r| r.unit == control_unit)
            .collect::<Vec<_>>(),
        record.windows
    );
    let checked = replay(&registry, from, |rev, state| {
        let base = format!("{PREFIX}schedule/");
        let mut on: BTreeMap<&str, &str> = BTreeMap::new();
        for key in state.keys() {
            let Some((machine, unit)) = key.strip_prefix(&base).and_then(|r| r.split_once('/'))
            else {
                continue;
            };
            if let Some(other) = on.insert(unit, machine) {
                bail!("revision {rev}: {unit} scheduled on {other} and {machine}");
            }
        }
        Ok(())
    });
    match checked {
        Ok(n) => eprintln!("chaos: {n} revisions of etcd's history replayed"),
        Err(e) => violations.push(format!("{e:#}")),
    }

    eprintln!("chaos: faults injected ({}):", injected.len());
    for f in &injected {
        eprintln!(
            "  {:>6.1} s  {:?} on {} for {:.1?}, converged {:.1?} later",
            f.at.duration_since(start).as_secs_f64(),
            f.fault,
            f.machine.as_deref().unwrap_or("the cluster"),
            f.lasted,
            f.converged_in
        );
    }
    let mut by_verb: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (op, ok) in &ops {
        let counts = by_verb
            .entry(op.split(' ').next().unwrap_or(""))
            .or_default();
        counts.0 += 1;
        counts.1 += usize::from(!ok);
    }
    eprintln!(
        "chaos: {} fleetctl operations, (run, refused cleanly) by verb: {by_verb:?}",
        ops.len()
    );
    eprintln!(
        "chaos: {} runs of units seen in {} polls, {} schedule changes of {} events",
        record.runs.len(),
        seen.polls,
        record.changes.len(),
        seen.events
    );
    eprintln!("chaos: violations: {}", violations.len());
    for v in &violations {
        eprintln!("  {v}");
    }
    ensure!(
        violations.is_empty(),
        "{} invariant violations (FLEET_FAULT_SEED replays the run)",
        violations.len()
    );
    support::finish(cluster)
}
