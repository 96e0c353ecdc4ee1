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
use fleet_functional_tests::Machine;
use fleet_functional_tests::{
    Cluster, ClusterSpec, Driver, TestRegistry, cleanup_stale, reference_fleet_dir, wait_for,
};
use fleet_v1::{Role, WEB_INSTANCES, fleet_ok};
use observe::{Runs, assert_single, runs, watch_single};
use std::path::{Path, PathBuf};
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

/// A fleet v1 cluster of three machines running every unit of [`Plan`] under fleet.
struct UnderFleet {
    cluster: Cluster,
    registry: TestRegistry,
    /// Where the unit files are, for both fleetctls.
    dir: PathBuf,
    plan: Plan,
    /// What systemd runs under fleet.
    before: Runs,
    /// Where fleet loaded `loaded.service`.
    loaded_on: Vec<String>,
    /// fleet's `list-unit-files`.
    files: observe::UnitFilesTable,
    /// Held for the test's life: see [`ONE_AT_A_TIME`].
    _alone: std::sync::MutexGuard<'static, ()>,
}

/// The tests of this file run one at a time. fleet v1's engine moves the units of a machine
/// it does not see present, and the way back counts on it seeing every one: with two
/// clusters of fleet v1 booting at once among `make test`'s other suites on two cores, its
/// first pass once moved `plain2.service` while its copy still ran (a CI run of stop 47;
/// the same test passed alone).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl UnderFleet {
    /// Boots the cluster with our fleetctl over `driver`, and runs every unit under fleet.
    fn start(driver: Driver) -> Result<UnderFleet> {
        // Before anything boots: without the real fleet this test fails, it never passes.
        reference_fleet_dir()?;
        let alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        cleanup_stale()?;
        let mut cluster = Cluster::start(ClusterSpec::bare(3).with_etcd_v2())?;
        cluster.set_driver(driver);
        let registry = TestRegistry::of(&cluster)?;
        let dir = cluster.dir().join("units");
        std::fs::create_dir_all(&dir)?;
        let plan = Plan::new();
        for (machine, metadata) in cluster.machines().iter().zip(METADATA) {
            fleet_v1::start_fleets_fleetd(&cluster, machine, metadata)?;
        }
        let (before, loaded_on, files) = run_under_fleet(&cluster, &dir, &plan)?;
        Ok(UnderFleet {
            cluster,
            registry,
            dir,
            plan,
            before,
            loaded_on,
            files,
            _alone: alone,
        })
    }

    /// The machines fleet ran: not the one that only serves our API to the import.
    fn fleets_machines(&self) -> &[Machine] {
        &self.cluster.machines()[..METADATA.len()]
    }
}

#[test]
fn a_running_fleet_cluster_moves_to_ours_without_restarting_a_unit() -> Result<()> {
    let f = UnderFleet::start(Driver::Etcd)?;
    import(&f, &[])?;
    cut_over(&f)?;
    ours_runs_what_fleet_ran(&f)?;
    operate_after(&f.cluster, &f.dir, &f.plan)?;
    support::finish(f.cluster)
}

/// The same cutover with `fleetctl --driver api import-fleet`: a fourth machine's fleetd
/// serves the import (`POST /import`, admin over its unix socket) and leaves before the
/// cutover. Then the way back of docs/migrating.md, on every machine.
#[test]
fn a_fleet_cluster_imported_over_the_api_moves_to_ours_and_back_to_fleet() -> Result<()> {
    let mut f = UnderFleet::start(Driver::Api)?;
    let api = fleet_v1::start_api_fleetd(&mut f.cluster)?;
    let endpoint = api.api_endpoint();
    let api_name = api.name().to_owned();
    import(&f, &["--endpoint", &endpoint])?;
    // Its fleetd leaves our registry before the first engine of ours could count it live
    // (and place the global unit on it).
    let api = f.cluster.machine(&api_name)?;
    api.systemctl_ok(&["stop", "fleet.service"])?;
    wait_for(TIMEOUT * 2, POLL, || {
        observe::machine_count(&f.registry).is_ok_and(|n| n == 0)
    })
    .context("the API machine's presence never left our registry")?;
    cut_over(&f)?;
    ours_runs_what_fleet_ran(&f)?;
    go_back(&f)?;
    support::finish(f.cluster)
}

/// After the cutover: nothing ran twice or restarted, every unit is where fleet ran it, and
/// our listing is fleet's.
fn ours_runs_what_fleet_ran(f: &UnderFleet) -> Result<()> {
    let cluster = &f.cluster;
    // Long enough for our engine and agents to act on anything they disagree with.
    watch_single(cluster, &f.plan.single, Duration::from_secs(5))?;
    ensure!(
        runs(cluster, &f.plan.all())? == f.before,
        "a unit moved or restarted in the cutover"
    );
    ensure!(
        observe::loaded_only_on(cluster, "loaded.service")? == f.loaded_on,
        "the loaded unit left {:?}",
        f.loaded_on
    );
    let ours = fleetctl_ok(
        cluster,
        &[
            "list-unit-files",
            "--no-legend",
            "--full",
            "--fields=unit,hash,dstate",
        ],
    )?;
    ensure!(
        observe::unit_files_table(&ours.stdout) == f.files,
        "our listing differs from fleet's:\nours:\n{}\nfleet's:\n{:#?}",
        ours.stdout,
        f.files
    );
    Ok(())
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

/// Our `import-fleet` (with the global arguments `over`): a dry run that must leave our
/// keyspace as it was, then for real, then a dry run over what it wrote.
fn import(f: &UnderFleet, over: &[&str]) -> Result<()> {
    let from = f.cluster.etcd_endpoint();
    let args = |more: &[&str]| -> Vec<String> {
        over.iter()
            .chain(&["import-fleet", "--from", from.as_str()])
            .chain(more)
            .map(|a| (*a).to_owned())
            .collect()
    };
    let untouched = observe::keyspace(&f.registry)?;
    let dry = fleetctl_ok(&f.cluster, &args(&["--dry-run"]))?;
    for unit in f.plan.all() {
        ensure!(dry.stdout.contains(&unit), "{unit} not in {dry:?}");
    }
    ensure!(
        observe::keyspace(&f.registry)? == untouched,
        "import-fleet --dry-run wrote into our keyspace"
    );
    let real = fleetctl_ok(&f.cluster, &args(&[]))?;
    for unit in f.plan.all() {
        ensure!(real.stdout.contains(&unit), "{unit} not in {real:?}");
    }
    for machine in f.fleets_machines() {
        ensure!(
            observe::has_mark(&f.registry, machine)?,
            "no migration mark for {}",
            machine.name()
        );
    }
    a_dry_run_over_the_import_changes_nothing(f, &args(&["--dry-run", "--replace"]))
}

/// Issue 40: a dry run when ours already holds the import and fleet changed since (a unit
/// submitted anew with another file, a new one; neither runs), so that its plan writes
/// something: not one key, value or mod revision of ours changes.
fn a_dry_run_over_the_import_changes_nothing(f: &UnderFleet, dry_run: &[String]) -> Result<()> {
    let changed = "[Unit]\nDescription=submitted v2\n\n[Service]\nExecStart=/bin/sleep 10017\n";
    std::fs::write(f.dir.join("submitted.service"), changed)?;
    std::fs::write(f.dir.join("extra.service"), support::sleeper(10018))?;
    fleet_ok(&f.cluster, &f.dir, &["destroy", "submitted.service"])?;
    fleet_ok(
        &f.cluster,
        &f.dir,
        &["submit", "submitted.service", "extra.service"],
    )?;
    let held = observe::keyspace(&f.registry)?;
    let dry = fleetctl_ok(&f.cluster, dry_run)?;
    for line in [
        "Imported extra.service: inactive",
        "Imported submitted.service: inactive",
        "Unchanged plain1.service",
        "2 imported",
    ] {
        ensure!(dry.stdout.contains(line), "no {line:?} in {dry:?}");
    }
    let after = observe::keyspace(&f.registry)?;
    ensure!(
        after == held,
        "import-fleet --dry-run --replace changed our keyspace:\n{}",
        observe::keyspace_diff(&held, &after)
    );
    Ok(())
}

/// The cutover: fleet's fleetd killed on every machine, then ours started on each, one
/// machine at a time; no unit may run twice in between, none may restart, and each
/// machine's mark goes once its fleetd made its first pass.
///
/// Every kill comes before any start: a fleet engine that survives a kill by more than
/// `agent_ttl` would count the killed machine gone and start its units elsewhere.
fn cut_over(f: &UnderFleet) -> Result<()> {
    let (cluster, registry, plan) = (&f.cluster, &f.registry, &f.plan);
    for machine in f.fleets_machines() {
        fleet_v1::kill_fleets_fleetd(machine)?;
        assert_single(cluster, &plan.single)?;
    }
    ensure!(
        runs(cluster, &plan.all())? == f.before,
        "killing fleet's fleetd disturbed a unit"
    );
    // What the import placed: our engine must keep all of it, also the entries of machines
    // that have not joined yet (whose metadata it cannot know).
    let imported = observe::schedule(registry)?;
    for machine in f.fleets_machines() {
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
            now == f.before,
            "after our fleetd's first pass on {}: {now:#?}\nbefore: {:#?}",
            machine.name(),
            f.before
        );
    }
    Ok(())
}

/// docs/migrating.md, "The way back", exactly: ours killed with SIGKILL and its fence timers
/// stopped on every machine; fleet's fleetd started again on every machine but the first
/// without its engine (`disable_engine=true`) until fleet lists them; then on the first with
/// its engine. Every machine's systemd is polled for a unit running twice throughout;
/// fleet's agents keep every unit as it runs (same machine, MainPID and InvocationID), and
/// fleet lists them active where they run.
///
/// Other orders failed, and the doc says why. Started with their engines one machine after
/// the other (about a second apart), fleet's first engine pass found the others absent and
/// moved their units: five restarted on other machines, and the unit only m2 may run
/// restarted on m2. Started together within a second, and also started without engines and
/// then SIGKILLed and started with them one at a time, `pair-b` ran on two machines at once.
fn go_back(f: &UnderFleet) -> Result<()> {
    let (cluster, plan) = (&f.cluster, &f.plan);
    for machine in f.fleets_machines() {
        fleet_v1::kill_ours_for_fleet(machine)?;
        assert_single(cluster, &plan.single)?;
    }
    let machines: Vec<(&Machine, &str)> = f.fleets_machines().iter().zip(METADATA).collect();
    let (engine, agents) = machines.split_first().context("no machine")?;
    fleet_v1::start_fleets_fleetds(cluster, agents, "disable_engine=true\n")?;
    fleet_joined(f, agents.len())?;
    watch_single(cluster, &plan.single, Duration::from_secs(5))
        .with_context(|| format!("fleet without its engine:\n{}", fleets_logs(f)))?;
    fleet_v1::start_fleets_fleetds(cluster, &[*engine], "")?;
    fleet_joined(f, machines.len())?;
    // fleet's engine reconciles every few seconds and its agents every `agent_ttl`: long
    // enough for both to act on anything they disagree with.
    watch_single(cluster, &plan.single, Duration::from_secs(40))
        .with_context(|| format!("fleet with its engines:\n{}", fleets_logs(f)))?;
    let now = runs(cluster, &plan.all())?;
    ensure!(
        now == f.before,
        "back on fleet, a unit moved or restarted: {now:#?}\nbefore: {:#?}",
        f.before
    );
    fleet_agrees(cluster, &f.dir, &f.before)
}

/// Waits until fleet's `list-machines` lists `count` machines, no unit running twice.
fn fleet_joined(f: &UnderFleet, count: usize) -> Result<()> {
    wait_for(TIMEOUT, POLL, || {
        assert_single(&f.cluster, &f.plan.single).is_ok()
            && fleet_v1::fleet(&f.cluster, &f.dir, &["list-machines", "--no-legend"])
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().count() == count)
    })
    .with_context(|| format!("fleet never listed {count} machines:\n{}", fleets_logs(f)))
}

/// What fleet's fleetds logged about scheduling, each machine's after its name.
fn fleets_logs(f: &UnderFleet) -> String {
    f.fleets_machines()
        .iter()
        .map(|m| {
            let log = support::fleetd_log_all(m).unwrap_or_default();
            let lines: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("chedul") || l.contains("ngine") || l.contains("pair"))
                .collect();
            format!("== {}:\n{}", m.name(), lines.join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
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
