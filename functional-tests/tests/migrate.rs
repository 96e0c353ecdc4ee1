//! Issue 40, item 2: a live fleet v1.0 cluster moves to ours without restarting a unit.
//!
//! Three machines run fleet's own fleetd (`../shared/reference-fleet/`, fleet's config file,
//! etcd with `--enable-v2`); fleet's own fleetctl starts plain units, conflicting template
//! instances, a global unit, a `MachineOf` pair and a `MachineMetadata` unit, loads one and
//! submits one. Then the cutover as docs/migrating.md walks it: our `fleetctl import-fleet`
//! (a dry run first, which must write nothing), fleet's fleetd killed with SIGKILL on every
//! machine, our fleetd started in its place with the same file. Every machine's systemd is
//! polled between the steps for a unit running twice, and at the end every unit runs on the
//! machine it ran on, as the very same process and invocation, our listing shows fleet's
//! hashes and desired states, each machine's migration mark is gone, and ours replaces,
//! destroys and starts units. Needs root, and fails (never skips) without fleet's binaries.

#[path = "migrate/fleet_v1.rs"]
mod fleet_v1;
#[path = "migrate/observe.rs"]
mod observe;
mod support;

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{
    Cluster, ClusterSpec, Driver, TestRegistry, cleanup_stale, reference_fleet_dir, wait_for,
};
use fleet_v1::{Role, WEB_INSTANCES, fleet_ok};
use observe::{Runs, assert_single, runs, watch_single};
use std::path::Path;
use std::time::Duration;
use support::{POLL, TIMEOUT, fleetctl_ok};

/// Each machine's `metadata=`: only m2 may take the `MachineMetadata` unit.
const METADATA: [&str; 3] = ["hostname=m1", "hostname=m2,role=special", "hostname=m3"];

/// The units the test launches, by role.
struct Plan {
    /// Non-global units started under fleet: each runs on one machine.
    single: Vec<String>,
    global: Vec<String>,
}

impl Plan {
    fn new() -> Plan {
        let files = fleet_v1::unit_files();
        let with = |role: Role| -> Vec<String> {
            files
                .iter()
                .filter(|(_, _, r)| *r == role)
                .map(|(n, _, _)| (*n).to_owned())
                .collect()
        };
        let mut single = with(Role::Launched);
        single.extend(WEB_INSTANCES.map(str::to_owned));
        Plan {
            single,
            global: with(Role::Global),
        }
    }

    fn all(&self) -> Vec<String> {
        self.single.iter().chain(&self.global).cloned().collect()
    }
}

#[test]
fn a_running_fleet_cluster_moves_to_ours_without_restarting_a_unit() -> Result<()> {
    // Before anything boots: without the real fleet this test fails, it never passes.
    reference_fleet_dir()?;
    cleanup_stale()?;
    let mut cluster = Cluster::start(ClusterSpec::bare(3).with_etcd_v2())?;
    cluster.set_driver(Driver::Etcd);
    let registry = TestRegistry::of(&cluster)?;
    let dir = cluster.dir().join("units");
    std::fs::create_dir_all(&dir)?;
    let plan = Plan::new();

    for (machine, metadata) in cluster.machines().iter().zip(METADATA) {
        fleet_v1::start_fleets_fleetd(&cluster, machine, metadata)?;
    }
    let (before, loaded_on, fleets_files) = run_under_fleet(&cluster, &dir, &plan)?;

    import(&cluster, &registry, &plan)?;
    cut_over(&cluster, &registry, &plan, &before)?;

    // Long enough for our engine and agents to act on anything they disagree with.
    watch_single(&cluster, &plan.single, Duration::from_secs(5))?;
    ensure!(
        runs(&cluster, &plan.all())? == before,
        "a unit moved or restarted in the cutover"
    );
    ensure!(
        observe::loaded_only_on(&cluster, "loaded.service")? == loaded_on,
        "the loaded unit left {loaded_on:?}"
    );
    let ours = fleetctl_ok(
        &cluster,
        &[
            "list-unit-files",
            "--no-legend",
            "--full",
            "--fields=unit,hash,dstate",
        ],
    )?;
    ensure!(
        observe::unit_files_table(&ours.stdout) == fleets_files,
        "our listing differs from fleet's:\nours:\n{}\nfleet's:\n{fleets_files:#?}",
        ours.stdout
    );

    operate_after(&cluster, &dir, &plan)?;
    support::finish(cluster)
}

/// Starts every unit with fleet's fleetctl and waits until fleet and systemd agree they run.
/// Returns their runs, where the loaded unit is loaded, and fleet's unit-file listing.
fn run_under_fleet(
    cluster: &Cluster,
    dir: &Path,
    plan: &Plan,
) -> Result<(Runs, Vec<String>, observe::UnitFilesTable)> {
    wait_for(TIMEOUT, POLL, || {
        fleet_v1::fleet(cluster, dir, &["list-machines", "--no-legend"])
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().count() == 3)
    })
    .context("fleet's fleetds never all joined")?;
    for (name, text, _) in fleet_v1::unit_files() {
        std::fs::write(dir.join(name), text)?;
    }
    fleet_ok(
        cluster,
        dir,
        &["submit", "web@.service", "submitted.service"],
    )?;
    fleet_ok(cluster, dir, &["load", "--no-block", "loaded.service"])?;
    let launched = plan.all();
    let mut start = vec!["start", "--no-block"];
    start.extend(launched.iter().map(String::as_str));
    fleet_ok(cluster, dir, &start)?;

    let before = observe::wait_running(cluster, &plan.single, &plan.global)?;
    assert_single(cluster, &plan.single)?;
    ensure!(
        before["meta.service"].contains_key("m2"),
        "MachineMetadata=role=special ran elsewhere: {before:?}"
    );
    ensure!(
        before["pair-a.service"]
            .keys()
            .eq(before["pair-b.service"].keys()),
        "the MachineOf pair split: {before:?}"
    );
    let mut loaded_on = Vec::new();
    wait_for(TIMEOUT, POLL, || {
        loaded_on = observe::loaded_only_on(cluster, "loaded.service").unwrap_or_default();
        loaded_on.len() == 1
    })
    .with_context(|| format!("loaded.service is loaded on {loaded_on:?}"))?;
    fleet_agrees(cluster, dir, &before)?;
    let files = fleet_ok(
        cluster,
        dir,
        &[
            "list-unit-files",
            "--no-legend",
            "--full",
            "--fields=unit,hash,dstate",
        ],
    )?;
    Ok((before, loaded_on, observe::unit_files_table(&files)))
}

/// Waits until fleet's `list-units` shows every run systemd shows, on the same machine,
/// active.
fn fleet_agrees(cluster: &Cluster, dir: &Path, before: &Runs) -> Result<()> {
    let mut last = String::new();
    wait_for(TIMEOUT, POLL, || {
        let Ok(out) = fleet_ok(
            cluster,
            dir,
            &[
                "list-units",
                "--no-legend",
                "--full",
                "--fields=unit,machine,active",
            ],
        ) else {
            return false;
        };
        last = out;
        before.iter().all(|(unit, on)| {
            on.keys().all(|name| {
                let Ok(machine) = cluster.machine(name) else {
                    return false;
                };
                let id = machine.id().to_string();
                last.lines().any(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    cols.len() == 3
                        && cols[0] == unit
                        && cols[1].starts_with(&id)
                        && cols[2] == "active"
                })
            })
        })
    })
    .with_context(|| format!("fleet's list-units never matched systemd: {last}"))
}

/// Our `import-fleet`: a dry run that must leave our keyspace as it was, then for real.
fn import(cluster: &Cluster, registry: &TestRegistry, plan: &Plan) -> Result<()> {
    let from = cluster.etcd_endpoint();
    let untouched = observe::keyspace(registry)?;
    let dry = fleetctl_ok(cluster, &["import-fleet", "--from", &from, "--dry-run"])?;
    for unit in plan.all() {
        ensure!(dry.stdout.contains(&unit), "{unit} not in {dry:?}");
    }
    ensure!(
        observe::keyspace(registry)? == untouched,
        "import-fleet --dry-run wrote into our keyspace"
    );
    let real = fleetctl_ok(cluster, &["import-fleet", "--from", &from])?;
    for unit in plan.all() {
        ensure!(real.stdout.contains(&unit), "{unit} not in {real:?}");
    }
    for machine in cluster.machines() {
        ensure!(
            observe::has_mark(registry, machine)?,
            "no migration mark for {}",
            machine.name()
        );
    }
    Ok(())
}

/// The cutover: fleet's fleetd killed on every machine, then ours started on each, one
/// machine at a time; no unit may run twice in between, none may restart, and each
/// machine's mark goes once its fleetd made its first pass.
///
/// Every kill comes before any start: a fleet engine that survives a kill by more than
/// `agent_ttl` would count the killed machine gone and start its units elsewhere.
fn cut_over(cluster: &Cluster, registry: &TestRegistry, plan: &Plan, before: &Runs) -> Result<()> {
    for machine in cluster.machines() {
        fleet_v1::kill_fleets_fleetd(machine)?;
        assert_single(cluster, &plan.single)?;
    }
    ensure!(
        runs(cluster, &plan.all())? == *before,
        "killing fleet's fleetd disturbed a unit"
    );
    // What the import placed: our engine must keep all of it, also the entries of machines
    // that have not joined yet (whose metadata it cannot know).
    let imported = observe::schedule(registry)?;
    for machine in cluster.machines() {
        fleet_v1::start_our_fleetd(machine)?;
        wait_for(TIMEOUT, POLL, || {
            observe::has_mark(registry, machine).is_ok_and(|has| !has)
        })
        .with_context(|| {
            let log = support::fleetd_log_all(machine).unwrap_or_default();
            format!("{}'s mark stayed; its fleetd:\n{log}", machine.name())
        })?;
        watch_single(cluster, &plan.single, Duration::from_secs(2))?;
        let schedule = observe::schedule(registry)?;
        ensure!(
            schedule == imported,
            "our engine changed the imported schedule once {} joined:\n{schedule:#?}\n\
             imported: {imported:#?}",
            machine.name()
        );
        let now = runs(cluster, &plan.all())?;
        ensure!(
            now == *before,
            "after our fleetd's first pass on {}: {now:#?}\nbefore: {before:#?}",
            machine.name()
        );
    }
    Ok(())
}

/// After the cutover ours runs the cluster: a replace of a changed file (never two copies),
/// a destroy, a start.
fn operate_after(cluster: &Cluster, dir: &Path, plan: &Plan) -> Result<()> {
    let plain = dir.join("plain1.service");
    std::fs::write(
        &plain,
        "[Unit]\nDescription=plain 1 v2\n\n[Service]\nExecStart=/bin/sleep 10101\n",
    )?;
    fleetctl_ok(
        cluster,
        &["start", "--replace", &plain.display().to_string()],
    )?;
    wait_for(TIMEOUT, POLL, || {
        assert_single(cluster, &plan.single).is_ok()
            && described_once(cluster, "plain1.service", "plain 1 v2")
    })
    .context("plain1.service never ran its new file")?;

    fleetctl_ok(cluster, &["destroy", "plain2.service"])?;
    wait_for(TIMEOUT, POLL, || {
        runs(cluster, &["plain2.service".to_owned()]).is_ok_and(|r| r.is_empty())
    })
    .context("plain2.service still runs after destroy")?;

    let fresh = dir.join("fresh.service");
    std::fs::write(&fresh, support::sleeper(10202))?;
    fleetctl_ok(cluster, &["start", &fresh.display().to_string()])?;
    observe::wait_running(cluster, &["fresh.service".to_owned()], &[])?;
    assert_single(cluster, &plan.single)
}

/// Whether exactly one machine runs `unit` and its description is `description`.
fn described_once(cluster: &Cluster, unit: &str, description: &str) -> bool {
    let Ok(on) = runs(cluster, &[unit.to_owned()]) else {
        return false;
    };
    let Some(machines) = on.get(unit) else {
        return false;
    };
    machines.len() == 1
        && machines.keys().all(|name| {
            cluster.machine(name).is_ok_and(|m| {
                m.systemctl_ok(&["show", "-p", "Description", "--value", unit])
                    .is_ok_and(|d| d.trim() == description)
            })
        })
}
