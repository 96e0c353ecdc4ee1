//! Draining a machine on a real cluster (issue 16): `fleetctl drain` moves the machine's
//! non-global units off it, one at a time, each stopped there before it starts elsewhere, and
//! names the unit pinned to it; `explain` says why a unit is where it is, or nowhere;
//! `undrain` moves nothing back. Needs root.
//!
//! "Never two copies" is checked at every etcd revision (the replay of the registry's
//! history): no unit ever has a schedule entry, or a published state that may be running, on
//! two machines at once. And in systemd's own journals: each unit's run on the drained machine
//! was stopped, its process gone, before it was started (once) on another.

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{Cluster, FleetdSpec, wait_for};
use fleet_registry::{Key, Keys};
use std::collections::{BTreeMap, BTreeSet};
mod support;
use support::{
    POLL, PREFIX, TIMEOUT, fleetctl, fleetctl_ok, replay, revision, sleeper, write_units,
};

/// The machines where each unit has a schedule entry or a state that may be running.
fn copies(state: &BTreeMap<String, Vec<u8>>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let keys = Keys::new(PREFIX);
    for (key, value) in state {
        let (machine, unit) = match Key::parse(&keys, key) {
            Some(Key::Schedule { machine, unit }) => (machine, unit),
            Some(Key::State { machine, unit }) => {
                let record: serde_json::Value = serde_json::from_slice(value).unwrap_or_default();
                let active = record["systemd"]["active"].as_str().unwrap_or("");
                if matches!(active, "inactive" | "failed") {
                    continue;
                }
                (machine, unit)
            }
            _ => continue,
        };
        out.entry(unit.to_string())
            .or_default()
            .insert(machine.to_string());
    }
    out
}

#[test]
fn drain_moves_every_unit_it_can_one_at_a_time_never_two_copies_and_names_the_pinned_one()
-> Result<()> {
    let (cluster, registry) = support::start(3, FleetdSpec::default())?;
    let from = revision(&registry)?;
    let dir = cluster.dir().join("drain-units");
    let texts: BTreeMap<String, String> = (0..10)
        .map(|i| (format!("drain-{i}.service"), sleeper(2000 + i)))
        .collect();
    let paths = write_units(&dir, &texts)?;
    let mut start = vec!["start".to_owned()];
    start.extend(paths.values().cloned());
    fleetctl_ok(&cluster, &start)?;

    // The machine running the most units is drained; one unit is pinned to it.
    let snap = registry.block_on(registry.registry().snapshot())?;
    let mut load: BTreeMap<String, usize> = BTreeMap::new();
    for entries in snap.schedule.values() {
        for m in entries.keys() {
            *load.entry(m.to_string()).or_default() += 1;
        }
    }
    let (drained, before) = load
        .iter()
        .max_by_key(|(m, n)| (**n, std::cmp::Reverse((*m).clone())))
        .map(|(m, n)| (m.clone(), *n))
        .context("no unit scheduled")?;
    let pinned = BTreeMap::from([(
        "pinned.service".to_owned(),
        format!("{}\n[X-Fleet]\nMachineID={drained}\n", sleeper(3000)),
    )]);
    let pinned_path = write_units(&dir, &pinned)?;
    fleetctl_ok(&cluster, &["start", &pinned_path["pinned.service"]])?;

    // What runs on the drained machine before: each run must end there before the unit's new
    // run starts elsewhere (systemd's own journal, below).
    let source = cluster.machine_by_id(&drained)?;
    let names: Vec<String> = texts.keys().cloned().collect();
    let runs_before: BTreeMap<String, (String, String)> = support::units_on(source, &names)?
        .into_iter()
        .filter(|(_, v)| v.is_active())
        .map(|(unit, v)| (unit, v.identity()))
        .collect();
    ensure!(
        runs_before.len() == before,
        "{before} units scheduled on {drained}, {} running: {runs_before:?}",
        runs_before.len()
    );
    let cursors = cluster
        .machines()
        .iter()
        .map(|m| Ok((m.id().to_string(), support::journal_cursor(m)?)))
        .collect::<Result<BTreeMap<String, String>>>()?;

    let run = fleetctl(&cluster, &["drain", &drained])?;
    ensure!(!run.success, "a pinned unit must fail the drain: {run:?}");
    ensure!(
        run.stderr.contains("Unit pinned.service cannot leave")
            && run.stderr.contains("stays on drained machine"),
        "the pinned unit is named with its reason: {run:?}"
    );
    let explain = fleetctl_ok(&cluster, &["explain", "pinned.service"])?;
    ensure!(
        explain.stdout.contains("stays on drained machine"),
        "explain names the drain: {explain:?}"
    );
    let listing = fleetctl_ok(
        &cluster,
        &["list-machines", "--full", "--fields=machine,drained"],
    )?;
    ensure!(
        listing.stdout.contains("parallel=1"),
        "list-machines shows the drain: {listing:?}"
    );

    // Every drain-* unit runs elsewhere, active; the pinned one stays.
    let snap = registry.block_on(registry.registry().snapshot())?;
    for name in texts.keys() {
        let unit = name.parse()?;
        let machines: Vec<String> = snap
            .schedule
            .get(&unit)
            .map(|es| es.keys().map(ToString::to_string).collect())
            .unwrap_or_default();
        ensure!(
            machines.len() == 1 && machines[0] != drained,
            "{name} is on {machines:?} after the drain of {drained}"
        );
        let machine = cluster.machine_by_id(&machines[0])?;
        let views = support::units_on(machine, std::slice::from_ref(name))?;
        ensure!(
            views.get(name).is_some_and(|v| v.is_active()),
            "{name} not active on {}: {views:?}",
            machine.name()
        );
    }
    let pinned_on: Vec<String> = snap.schedule[&"pinned.service".parse()?]
        .keys()
        .map(ToString::to_string)
        .collect();
    ensure!(
        pinned_on == [drained.clone()],
        "pinned.service on {pinned_on:?}"
    );

    never_two_runs(&cluster, &drained, &runs_before, &cursors)?;

    let checked = replay(&registry, from, |rev, state| {
        for (unit, machines) in copies(state) {
            ensure!(
                machines.len() <= 1,
                "revision {rev}: {unit} on {machines:?} at once"
            );
        }
        Ok(())
    })?;
    eprintln!("drained {drained} ({before} units before); {checked} revisions checked");

    fleetctl_ok(&cluster, &["undrain", &drained])?;
    let after = registry.block_on(registry.registry().snapshot())?;
    ensure!(after.drained.is_empty(), "undrain left {:?}", after.drained);
    for name in texts.keys() {
        let entries = &after.schedule[&name.parse()?];
        ensure!(
            !entries.keys().any(|m| m.as_str() == drained),
            "{name} moved back to {drained} on undrain"
        );
    }
    support::finish(cluster)
}

/// systemd's side of "never two copies": each unit that ran on `drained` was stopped there
/// (its old run is over: the process is gone) before systemd on its new machine started it, by
/// the journals' clocks; and it started there exactly once.
fn never_two_runs(
    cluster: &Cluster,
    drained: &str,
    runs_before: &BTreeMap<String, (String, String)>,
    cursors: &BTreeMap<String, String>,
) -> Result<()> {
    let source = cluster.machine_by_id(drained)?;
    let source_jobs = support::timed_jobs_after(source, "drain-*", &cursors[drained])?;
    let names: Vec<String> = runs_before.keys().cloned().collect();
    let now = support::units_on(source, &names)?;
    for (unit, (pid, invocation)) in runs_before {
        let stopped = source_jobs
            .iter()
            .filter(|j| &j.unit == unit && j.message.starts_with("Stopped "))
            .map(|j| j.at)
            .max()
            .with_context(|| format!("no stop of {unit} on {drained}: {source_jobs:?}"))?;
        ensure!(
            !now[unit].is_active() && now[unit].identity() != (pid.clone(), invocation.clone()),
            "{unit}'s run {pid}/{invocation} is still there on {drained}: {:?}",
            now[unit]
        );
        ensure!(
            !source
                .exec("test", ["-d", &format!("/proc/{pid}")])?
                .status
                .success(),
            "{unit}'s old process {pid} is still alive on {drained}"
        );
        let mut starts = Vec::new();
        for machine in cluster
            .machines()
            .iter()
            .filter(|m| m.id().as_str() != drained)
        {
            let jobs = support::timed_jobs_after(machine, unit, &cursors[machine.id().as_str()])?;
            let views = support::units_on(machine, std::slice::from_ref(unit))?;
            // A simple service logs only "Started"; others "Starting" first.
            let first = jobs
                .iter()
                .filter(|j| j.message.starts_with("Starting ") || j.message.starts_with("Started "))
                .map(|j| j.at)
                .min();
            for _ in jobs.iter().filter(|j| j.message.starts_with("Started ")) {
                let at = first.unwrap_or_default();
                starts.push((machine.name().to_owned(), at, views[unit].clone()));
            }
        }
        ensure!(
            starts.len() == 1,
            "{unit} started {} times after the drain began: {starts:?}",
            starts.len()
        );
        let (machine, started, view) = &starts[0];
        ensure!(
            *started > stopped,
            "{unit} started on {machine} at {started} before its stop on {drained} at {stopped}"
        );
        ensure!(
            view.is_active() && view.main_pid != "0",
            "{unit} on {machine}: {view:?}"
        );
    }
    Ok(())
}

/// Waits until `fleetctl explain <unit>` prints every one of `want`; returns what it printed.
fn explained(cluster: &Cluster, unit: &str, want: &[&str]) -> Result<String> {
    let mut last = String::new();
    wait_for(TIMEOUT, POLL, || {
        last = fleetctl(cluster, &["explain", unit]).map_or_else(|e| e.to_string(), |r| r.stdout);
        want.iter().all(|w| last.contains(w))
    })
    .with_context(|| format!("explain {unit} never said {want:?}; last: {last}"))?;
    Ok(last)
}

#[test]
fn explain_says_why_of_a_placed_unit_metadata_a_conflicts_clash_and_a_drained_machine() -> Result<()>
{
    let (cluster, _registry) = support::start(2, FleetdSpec::default())?;
    let m2 = &cluster.machines()[1];
    // Two machines, three units that conflict with each other: one of them waits.
    let clash = |i: u32| {
        let text = format!("{}\n[X-Fleet]\nConflicts=clash.*\n", sleeper(4002 + i));
        (format!("clash.{i}.service"), text)
    };
    let texts = BTreeMap::from([
        ("placed.service".to_owned(), sleeper(4000)),
        (
            "meta.service".to_owned(),
            format!(
                "{}\n[X-Fleet]\nMachineMetadata=nothing=here\n",
                sleeper(4001)
            ),
        ),
        clash(0),
        clash(1),
        clash(2),
    ]);
    let paths = write_units(&cluster.dir().join("explain-units"), &texts)?;
    fleetctl_ok(
        &cluster,
        &[
            "start",
            &paths["placed.service"],
            &paths["clash.0.service"],
            &paths["clash.1.service"],
        ],
    )?;
    let mut more = vec!["start".to_owned(), "--no-block".to_owned()];
    more.extend([
        paths["meta.service"].clone(),
        paths["clash.2.service"].clone(),
    ]);
    fleetctl_ok(&cluster, &more)?;

    explained(
        &cluster,
        "placed.service",
        &[
            "Unit placed.service: placed",
            "it has no [X-Fleet] rules, and it stays",
        ],
    )?;
    explained(
        &cluster,
        "meta.service",
        &[
            "Unit meta.service: waiting",
            "Rules: MachineMetadata=nothing=here",
            "machine metadata lacks nothing=here",
        ],
    )?;
    explained(
        &cluster,
        "clash.2.service",
        &[
            "Unit clash.2.service: waiting",
            "conflicts with unit clash.",
        ],
    )?;

    // A drained machine is named for a unit that may only run there.
    fleetctl_ok(
        &cluster,
        &["drain", "--no-block", "--force", m2.id().as_str()],
    )?;
    let only_m2 = BTreeMap::from([(
        "only-m2.service".to_owned(),
        format!("{}\n[X-Fleet]\nMachineID={}\n", sleeper(4004), m2.id()),
    )]);
    let path = write_units(&cluster.dir().join("explain-units"), &only_m2)?;
    fleetctl_ok(&cluster, &["start", "--no-block", &path["only-m2.service"]])?;
    let text = explained(
        &cluster,
        "only-m2.service",
        &["Unit only-m2.service: waiting", "machine is drained"],
    )?;
    let json = fleetctl_ok(&cluster, &["explain", "--output=json", "only-m2.service"])?;
    let doc: serde_json::Value = serde_json::from_str(&json.stdout)?;
    ensure!(doc["status"] == "waiting", "{doc}");
    ensure!(
        doc["machines"]
            .as_array()
            .is_some_and(|ms| ms.iter().any(|m| m["rejected"]["rule"] == "drained")),
        "{doc}\n{text}"
    );
    support::finish(cluster)
}
