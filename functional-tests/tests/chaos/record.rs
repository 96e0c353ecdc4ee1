//! The chaos soak's recorders: a poller of every machine's systemd and a recorder of every
//! change of a schedule entry in etcd, both feeding [`Seen`]; and the control that proves the
//! checker sees what they record. They observe; they decide nothing (`check.rs` does).

use super::check::{Change, RunRecord};
use super::{CONVERGE, POLL_EVERY, UNITS, unit_name, up};
use crate::support::{PREFIX, UnitView, units_on};
use anyhow::{Context, Result, bail};
use fleet_functional_tests::{Cluster, Machine, OutputExt, TestRegistry};
use fleet_registry::kv::{EventKind, Kv, WatchMessage};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What the recorders share with the soak.
#[derive(Debug, Default)]
pub struct Seen {
    /// Open runs by (machine, unit, invocation).
    pub open: BTreeMap<(String, String, String), RunRecord>,
    pub closed: Vec<RunRecord>,
    pub changes: Vec<Change>,
    pub polls: usize,
    pub events: usize,
}

/// Whether a unit in this state may have processes: any state but `inactive` and `failed`.
/// A copy the fence is stopping (`deactivating`, SIGTERM sent, SIGKILL after a grace) still
/// runs; counting only `active` would hide a double run in exactly that margin.
fn may_run(view: &UnitView) -> bool {
    view.active != "inactive" && view.active != "failed"
}

/// Polls systemd on every running machine until `stop`: opens a run when a unit is first
/// seen running ([`may_run`]) with an invocation, closes it at the first poll of that machine
/// without it.
pub fn poll_systemd(cluster: &Cluster, seen: &Mutex<Seen>, stop: &AtomicBool) {
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
                .filter(|(_, v)| may_run(v) && !v.invocation.is_empty())
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
pub fn watch_schedules(
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
    let kv = registry.registry().raw_kv();
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

/// Proves the checker is not blind: a second copy of a running unit is started on another
/// machine behind fleet's back (a transient unit of the same name, which fleetd leaves
/// alone), seen by the poller, then stopped behind fleet's back too. The checker must report
/// both: two copies at once, and a stop without a reason. Returns that copy.
/// A unit in `avoid` (operated on just before, so its stop could be excused) is taken only
/// when no other runs.
pub fn control(cluster: &Cluster, seen: &Mutex<Seen>, avoid: &BTreeSet<String>) -> Result<Control> {
    let lock = || seen.lock().unwrap_or_else(|e| e.into_inner());
    let (unit, running_on) = {
        let seen = lock();
        let up = |r: &&RunRecord| cluster.machine(&r.machine).is_ok_and(Machine::is_up);
        let run = seen
            .open
            .values()
            .filter(up)
            .find(|r| !avoid.contains(&r.unit))
            .or_else(|| seen.open.values().find(up))
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
    let key = (name.clone(), unit.clone(), invocation.clone());
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
    Ok(Control {
        unit,
        machine: name,
        invocation,
    })
}

/// The control copy: the checker's findings about it are told apart by its invocation, so a
/// real double run of the same unit is still reported.
#[derive(Debug, Clone)]
pub struct Control {
    pub unit: String,
    pub machine: String,
    pub invocation: String,
}
