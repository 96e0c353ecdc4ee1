//! The engine, end to end: units started with the host's fleetctl are placed by the engine
//! elected among the machines' fleetd, run by their agents under real systemd, and move when
//! a machine or the leader goes away. Modelled on fleet's own functional tests
//! (`functional/scheduling_test.go`, `unit_action_test.go`, `cluster_test.go`, ...), with the
//! fixtures of `functional-tests/fixtures/units/`. Needs root.
//!
//! Every test boots its own cluster and waits for conditions, never for a fixed time. Where a
//! test shows that something does *not* happen (a unit stays unscheduled), it first waits for
//! the engine's written decision about it (its unscheduled reason in the registry).

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{
    Cluster, ClusterSpec, FleetdSpec, Machine, OutputExt, Signal, TestRegistry, cleanup_stale,
    wait_for, wait_for_value,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;
mod support;
use support::{Run, finish, fleetctl, leader};

const TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

/// `functional-tests/fixtures/units/<name>`, as an absolute path for fleetctl.
fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/units")
        .join(name)
        .display()
        .to_string()
}

/// Fixture paths of `names`.
fn fixtures<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Vec<String> {
    names.into_iter().map(|n| fixture(n.as_ref())).collect()
}

/// `hello@<i>.service` for every `i`, as paths next to the `hello@.service` template.
fn hellos(instances: impl IntoIterator<Item = u32>) -> Vec<String> {
    fixtures(instances.into_iter().map(|i| format!("hello@{i}.service")))
}

/// A cluster of `machines` machines, each registered (so that placement sees all of them).
fn start_cluster(machines: usize, spec: FleetdSpec) -> Result<Cluster> {
    cleanup_stale()?;
    let cluster = Cluster::start(ClusterSpec::with_fleetd(machines, spec))?;
    wait_registered(&cluster)?;
    Ok(cluster)
}

fn start(machines: usize) -> Result<Cluster> {
    start_cluster(machines, FleetdSpec::default())
}

/// Waits until `list-machines` shows every running machine of the cluster.
fn wait_registered(cluster: &Cluster) -> Result<()> {
    let want: BTreeSet<String> = cluster
        .machines()
        .iter()
        .filter(|m| m.is_up())
        .map(|m| m.id().to_string())
        .collect();
    let mut last = String::new();
    wait_for(TIMEOUT, POLL, || {
        let Ok(out) = cluster.fleetctl([
            "list-machines",
            "--no-legend",
            "--full",
            "--fields",
            "machine",
        ]) else {
            return false;
        };
        last = out.stdout_text();
        let listed: BTreeSet<String> = last.split_whitespace().map(str::to_owned).collect();
        want.is_subset(&listed)
    })
    .with_context(|| format!("not every machine registered; list-machines: {last:?}"))
}

/// Runs fleetctl and requires exit 0 and no `Error` on stderr (what fleet's tests check).
fn fleetctl_ok<S: AsRef<str>>(cluster: &Cluster, args: &[S]) -> Result<Run> {
    let run = fleetctl(cluster, args)?;
    let line: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    ensure!(
        run.success && !run.stderr.contains("Error"),
        "fleetctl {} failed: {run:?}",
        line.join(" ")
    );
    Ok(run)
}

/// `fleetctl <verb> <args...>`, checked.
fn command(cluster: &Cluster, verb: &[&str], args: &[String]) -> Result<Run> {
    let mut all: Vec<String> = verb.iter().map(|s| (*s).to_owned()).collect();
    all.extend(args.iter().cloned());
    fleetctl_ok(cluster, &all)
}

/// The name (`m1`, ...) of the machine a fleetctl legend (`<full id>/<ip>` or `<id>`) names;
/// the legend itself if no machine of the cluster has that ID.
fn machine_name(cluster: &Cluster, legend: &str) -> String {
    let id = legend.split('/').next().unwrap_or(legend);
    cluster
        .machine_by_id(id)
        .map_or_else(|_| legend.to_owned(), |m| m.name().to_owned())
}

/// One row of `list-units`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct UnitRow {
    unit: String,
    /// The machine's name (`m1`, ...).
    machine: String,
    active: String,
}

fn list_units(cluster: &Cluster) -> Result<Vec<UnitRow>> {
    let out = fleetctl_ok(
        cluster,
        &[
            "list-units",
            "--no-legend",
            "--full",
            "--fields",
            "unit,machine,active",
        ],
    )?;
    out.stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [unit, machine, active] => Ok(UnitRow {
                unit: unit.to_owned(),
                machine: machine_name(cluster, machine),
                active: active.to_owned(),
            }),
            _ => anyhow::bail!("bad list-units row {l:?}"),
        })
        .collect()
}

/// The active units, each with the machines it is active on.
fn active(rows: &[UnitRow]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.active == "active") {
        out.entry(r.unit.clone())
            .or_default()
            .push(r.machine.clone());
    }
    out
}

/// Waits until `list-units` satisfies `ok`; returns those rows.
fn wait_units(
    cluster: &Cluster,
    what: &str,
    ok: impl Fn(&[UnitRow]) -> bool,
) -> Result<Vec<UnitRow>> {
    let mut last = Vec::new();
    wait_for_value(TIMEOUT, POLL, || {
        let rows = list_units(cluster).ok()?;
        let good = ok(&rows);
        last = rows.clone();
        good.then_some(rows)
    })
    .with_context(|| format!("list-units never showed {what}; last: {last:#?}"))
}

/// Waits until exactly the units in `want` are active, each on exactly one machine (and
/// nothing else is listed at all); returns unit -> machine name.
fn wait_active_exactly(cluster: &Cluster, want: &[&str]) -> Result<BTreeMap<String, String>> {
    let rows = wait_units(cluster, &format!("exactly {want:?} active"), |rows| {
        let act = active(rows);
        rows.len() == want.len()
            && act.len() == want.len()
            && want
                .iter()
                .all(|u| act.get(*u).is_some_and(|m| m.len() == 1))
    })?;
    Ok(rows.into_iter().map(|r| (r.unit, r.machine)).collect())
}

/// One row of `list-unit-files`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileRow {
    unit: String,
    dstate: String,
    state: String,
    /// `-`, `global`, or the machine's name.
    target: String,
}

fn list_unit_files(cluster: &Cluster) -> Result<Vec<FileRow>> {
    let out = fleetctl_ok(
        cluster,
        &[
            "list-unit-files",
            "--no-legend",
            "--full",
            "--fields",
            "unit,dstate,state,target",
        ],
    )?;
    out.stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [unit, dstate, state, target] => Ok(FileRow {
                unit: unit.to_owned(),
                dstate: dstate.to_owned(),
                state: state.to_owned(),
                target: match target {
                    "-" | "global" => target.to_owned(),
                    t => machine_name(cluster, t),
                },
            }),
            _ => anyhow::bail!("bad list-unit-files row {l:?}"),
        })
        .collect()
}

fn is_active(machine: &Machine, unit: &str) -> Result<bool> {
    let out = machine.systemctl(["is-active", unit])?;
    Ok(out.stdout_text().trim() == "active")
}

/// Waits until systemd on `machine` no longer runs `unit`.
fn wait_inactive(machine: &Machine, unit: &str) -> Result<()> {
    wait_for(TIMEOUT, POLL, || !is_active(machine, unit).unwrap_or(true))
        .with_context(|| format!("{unit} still runs on {}", machine.name()))
}

/// Where each unit runs and its main PID there.
fn placements(
    cluster: &Cluster,
    units: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, (String, u32)>> {
    units
        .iter()
        .map(|(unit, machine)| {
            let m = cluster.machine(machine)?;
            ensure!(is_active(m, unit)?, "{unit} is not active on {machine}");
            let pid = m
                .main_pid(unit)?
                .with_context(|| format!("{unit} has no main PID on {machine}"))?;
            Ok((unit.clone(), (machine.clone(), pid)))
        })
        .collect()
}

/// The engine's published reason for not placing `unit`, once there is one.
fn wait_unscheduled_reason(registry: &TestRegistry, unit: &str) -> Result<String> {
    let name = unit.parse()?;
    wait_for_value(TIMEOUT, POLL, || {
        let snap = registry.block_on(registry.registry().snapshot()).ok()?;
        snap.unscheduled.get(&name).cloned()
    })
    .with_context(|| format!("the engine published no reason for not scheduling {unit}"))
}

#[test]
fn a_started_unit_is_the_only_active_unit_and_runs_under_systemd_on_its_machine() -> Result<()> {
    let cluster = start(2)?;
    let out = fleetctl_ok(&cluster, &["start", &fixture("hello.service")])?;
    assert!(
        out.stdout.contains("Unit hello.service launched on "),
        "{out:?}"
    );

    let placed = wait_active_exactly(&cluster, &["hello.service"])?;
    let machine = cluster.machine(&placed["hello.service"])?;
    assert!(is_active(machine, "hello.service")?);
    assert!(machine.main_pid("hello.service")?.is_some());
    for other in cluster
        .machines()
        .iter()
        .filter(|m| m.name() != machine.name())
    {
        assert!(
            !is_active(other, "hello.service")?,
            "also on {}",
            other.name()
        );
    }
    let files = list_unit_files(&cluster)?;
    assert_eq!(
        files,
        vec![FileRow {
            unit: "hello.service".into(),
            dstate: "launched".into(),
            state: "launched".into(),
            target: machine.name().into(),
        }]
    );
    finish(cluster)
}

#[test]
fn many_template_instances_are_submitted_loaded_started_and_undone_in_one_command_twice()
-> Result<()> {
    let cluster = start(3)?;
    let nine = hellos(1..=9);
    let six = hellos(1..=6);
    let three = hellos(1..=3);
    let names = |n: u32| -> Vec<String> { (1..=n).map(|i| format!("hello@{i}.service")).collect() };

    for round in 1..=2 {
        // submit 9, destroy 9.
        command(&cluster, &["submit"], &nine)?;
        let files = list_unit_files(&cluster)?;
        let listed: Vec<&str> = files.iter().map(|f| f.unit.as_str()).collect();
        assert_eq!(listed, names(9), "round {round}");
        assert!(
            files
                .iter()
                .all(|f| f.dstate == "inactive" && f.target == "-"),
            "round {round}: {files:#?}"
        );
        let out = command(&cluster, &["destroy"], &nine)?;
        assert_eq!(out.stdout.matches("Destroyed hello@").count(), 9, "{out:?}");
        assert_eq!(list_unit_files(&cluster)?, vec![], "round {round}");
    }

    for round in 1..=2 {
        // load 6 (blocking: each loaded on its machine), unload 6.
        let out = command(&cluster, &["load"], &six)?;
        assert_eq!(out.stdout.matches(" loaded on ").count(), 6, "{out:?}");
        let rows = wait_units(&cluster, "6 loaded units", |rows| {
            rows.len() == 6 && rows.iter().all(|r| r.active == "inactive")
        })?;
        let listed: Vec<String> = rows.iter().map(|r| r.unit.clone()).collect();
        assert_eq!(listed, names(6), "round {round}");
        // Spread evenly: 2 per machine.
        let mut per_machine: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &rows {
            *per_machine.entry(r.machine.as_str()).or_default() += 1;
        }
        assert_eq!(
            per_machine.values().copied().collect::<Vec<_>>(),
            vec![2, 2, 2],
            "{rows:#?}"
        );
        command(&cluster, &["unload"], &six)?;
        wait_units(&cluster, "no units", <[UnitRow]>::is_empty)?;
        let files = list_unit_files(&cluster)?;
        assert_eq!(files.len(), 6, "{files:#?}");
        assert!(
            files
                .iter()
                .all(|f| f.dstate == "inactive" && f.target == "-"),
            "{files:#?}"
        );
    }

    for round in 1..=2 {
        // start 3 (blocking), stop 3.
        let out = command(&cluster, &["start"], &three)?;
        assert_eq!(out.stdout.matches(" launched on ").count(), 3, "{out:?}");
        wait_units(&cluster, "3 active units", |rows| {
            rows.len() == 3 && active(rows).len() == 3
        })?;
        command(&cluster, &["stop"], &three)?;
        let rows = wait_units(&cluster, "3 stopped units", |rows| {
            rows.len() == 3 && active(rows).is_empty()
        })?;
        for r in &rows {
            assert!(
                !is_active(cluster.machine(&r.machine)?, &r.unit)?,
                "round {round}: {r:?} still runs"
            );
        }
    }
    finish(cluster)
}

#[test]
fn machine_of_pairs_run_together_and_move_together_when_their_machine_leaves() -> Result<()> {
    let cluster = start(3)?;
    let pairs: Vec<String> = (1..=3)
        .flat_map(|i| [format!("ping.{i}.service"), format!("pong.{i}.service")])
        .collect();
    let mut args = vec!["start".to_owned(), "--no-block".to_owned()];
    args.extend(fixtures(&pairs));
    fleetctl_ok(&cluster, &args)?;
    assert_eq!(list_unit_files(&cluster)?.len(), 6);

    let want: Vec<&str> = pairs.iter().map(String::as_str).collect();
    let placed = wait_active_exactly(&cluster, &want)?;
    for i in 1..=3 {
        assert_eq!(
            placed[&format!("ping.{i}.service")],
            placed[&format!("pong.{i}.service")],
            "pair {i} split: {placed:#?}"
        );
    }
    let pair_machines: BTreeSet<&String> = (1..=3)
        .map(|i| &placed[&format!("ping.{i}.service")])
        .collect();
    assert_eq!(pair_machines.len(), 3, "pairs not spread: {placed:#?}");
    let before = placements(&cluster, &placed)?;

    let lost = cluster.machine(&placed["ping.1.service"])?;
    lost.stop_fleetd()?;
    let moved = wait_units(&cluster, "ping.1 and pong.1 elsewhere", |rows| {
        let act = active(rows);
        rows.len() == 6
            && act.len() == 6
            && ["ping.1.service", "pong.1.service"]
                .iter()
                .all(|u| act[*u].len() == 1 && act[*u][0] != lost.name())
    })?;
    let after: BTreeMap<String, String> = moved.into_iter().map(|r| (r.unit, r.machine)).collect();
    assert_eq!(
        after["ping.1.service"], after["pong.1.service"],
        "ping.1 and pong.1 split: {after:#?}"
    );
    let now = placements(&cluster, &after)?;
    for i in 2..=3 {
        for unit in [format!("ping.{i}.service"), format!("pong.{i}.service")] {
            assert_eq!(now[&unit], before[&unit], "{unit} moved or restarted");
        }
    }

    // Back again, the machine starts empty: what it still ran goes, nothing moves back.
    lost.start_fleetd()?;
    wait_registered(&cluster)?;
    for unit in ["ping.1.service", "pong.1.service"] {
        wait_inactive(lost, unit)?;
    }
    let rows = list_units(&cluster)?;
    assert!(rows.iter().all(|r| r.machine != lost.name()), "{rows:#?}");
    assert_eq!(placements(&cluster, &after)?, now);
    finish(cluster)
}

#[test]
fn conflicting_units_spread_over_machines_and_the_rest_wait_with_a_visible_reason() -> Result<()> {
    let cluster = start(3)?;
    let registry = TestRegistry::of(&cluster)?;
    let first_four = fixtures((0..4).map(|i| format!("conflict.{i}.service")));
    command(&cluster, &["start", "--no-block"], &first_four)?;

    // Exactly three run, on three machines; the fourth has nowhere to go.
    let rows = wait_units(&cluster, "3 conflict units active", |rows| {
        rows.len() == 3 && active(rows).len() == 3
    })?;
    let machines: BTreeSet<&str> = rows.iter().map(|r| r.machine.as_str()).collect();
    assert_eq!(machines.len(), 3, "{rows:#?}");
    let running: BTreeSet<&str> = rows.iter().map(|r| r.unit.as_str()).collect();
    let waiting: Vec<String> = (0..4)
        .map(|i| format!("conflict.{i}.service"))
        .filter(|u| !running.contains(u.as_str()))
        .collect();
    assert_eq!(waiting.len(), 1);
    let reason = wait_unscheduled_reason(&registry, &waiting[0])?;
    assert!(
        reason.contains("runs a conflicting conflict."),
        "{}: {reason}",
        waiting[0]
    );

    // A blocking start of one more gives up, saying why.
    let out = fleetctl(
        &cluster,
        &[
            "start",
            "--block-attempts",
            "2",
            &fixture("conflict.4.service"),
        ],
    )?;
    assert!(
        !out.success,
        "blocking start of an unplaceable unit: {out:?}"
    );
    assert!(
        out.stderr
            .contains("Unit conflict.4.service cannot be scheduled yet: ")
            && out.stderr.contains("runs a conflicting conflict."),
        "{out:?}"
    );

    let files = list_unit_files(&cluster)?;
    assert_eq!(files.len(), 5, "{files:#?}");
    assert!(files.iter().all(|f| f.dstate == "launched"), "{files:#?}");
    let (placed, unplaced): (Vec<&FileRow>, Vec<&FileRow>) =
        files.iter().partition(|f| f.target != "-");
    assert_eq!(placed.len(), 3, "{files:#?}");
    assert!(placed.iter().all(|f| f.state == "launched"), "{files:#?}");
    let targets: BTreeSet<&str> = placed.iter().map(|f| f.target.as_str()).collect();
    assert_eq!(targets.len(), 3, "{files:#?}");
    let mut unplaced: Vec<&str> = unplaced.iter().map(|f| f.unit.as_str()).collect();
    unplaced.sort_unstable();
    let mut expected: Vec<&str> = vec![waiting[0].as_str(), "conflict.4.service"];
    expected.sort_unstable();
    assert_eq!(unplaced, expected, "{files:#?}");
    assert!(
        files
            .iter()
            .filter(|f| f.target == "-")
            .all(|f| f.state == "inactive"),
        "{files:#?}"
    );
    // Still exactly three running.
    let rows = list_units(&cluster)?;
    assert_eq!(active(&rows).len(), 3, "{rows:#?}");
    finish(cluster)
}

#[test]
fn a_one_way_conflict_keeps_hello_off_until_the_conflicting_unit_is_destroyed() -> Result<()> {
    let cluster = start(1)?;
    let registry = TestRegistry::of(&cluster)?;
    let m1 = &cluster.machines()[0];
    fleetctl_ok(
        &cluster,
        &["start", &fixture("conflicts-with-hello.service")],
    )?;
    fleetctl_ok(
        &cluster,
        &["start", "--no-block", &fixture("hello.service")],
    )?;

    let reason = wait_unscheduled_reason(&registry, "hello.service")?;
    assert!(
        reason.contains("runs a conflicting conflicts-with-hello.service"),
        "{reason}"
    );
    assert_eq!(list_unit_files(&cluster)?.len(), 2);
    let placed = wait_active_exactly(&cluster, &["conflicts-with-hello.service"])?;
    assert_eq!(placed["conflicts-with-hello.service"], "m1");
    assert!(!is_active(m1, "hello.service")?);

    fleetctl_ok(&cluster, &["destroy", "conflicts-with-hello.service"])?;
    let placed = wait_active_exactly(&cluster, &["hello.service"])?;
    assert_eq!(placed["hello.service"], "m1");
    assert!(is_active(m1, "hello.service")?);
    wait_inactive(m1, "conflicts-with-hello.service")?;
    // Placed, so no reason is left.
    wait_for(TIMEOUT, POLL, || {
        registry
            .block_on(registry.registry().snapshot())
            .is_ok_and(|s| s.unscheduled.is_empty())
    })
    .context("hello.service's unscheduled reason stayed after it was placed")?;
    finish(cluster)
}

#[test]
fn units_pinned_by_machine_id_run_on_that_machine_full_or_short_id() -> Result<()> {
    let cluster = start(3)?;
    let dir = cluster.dir().join("units");
    std::fs::create_dir_all(&dir)?;
    let mut want = BTreeMap::new();
    let mut args = Vec::new();
    // One unit file per machine naming its full ID, started in reverse machine order (so that
    // the least-loaded choice alone would not put them right).
    for m in cluster.machines().iter().rev() {
        let unit = format!("pinned-{}.service", m.name());
        let path = dir.join(&unit);
        std::fs::write(
            &path,
            format!(
                "[Service]\nExecStart=/bin/sleep infinity\n\n[X-Fleet]\nMachineID={}\n",
                m.id()
            ),
        )?;
        args.push(path.display().to_string());
        want.insert(unit, m.name().to_owned());
    }
    // And the template `MachineID=%i`, instantiated with m2's short ID.
    let m2 = cluster.machine("m2")?;
    let unit = format!("pin@{}.service", &m2.id().to_string()[..8]);
    args.push(fixture(&unit));
    want.insert(unit, "m2".to_owned());

    let out = command(&cluster, &["start"], &args)?;
    assert_eq!(out.stdout.matches(" launched on ").count(), 4, "{out:?}");
    let units: Vec<&str> = want.keys().map(String::as_str).collect();
    let placed = wait_active_exactly(&cluster, &units)?;
    assert_eq!(placed, want);
    placements(&cluster, &placed)?;
    finish(cluster)
}

#[test]
fn template_metadata_with_the_instance_name_picks_the_machine_with_that_hostname() -> Result<()> {
    let cluster = start(3)?;
    let args = fixtures(["m3", "m2", "m1"].map(|h| format!("metadata@{h}.service")));
    let out = command(&cluster, &["start"], &args)?;
    assert_eq!(out.stdout.matches(" launched on ").count(), 3, "{out:?}");
    let placed = wait_active_exactly(
        &cluster,
        &[
            "metadata@m1.service",
            "metadata@m2.service",
            "metadata@m3.service",
        ],
    )?;
    for (unit, machine) in &placed {
        assert_eq!(unit, &format!("metadata@{machine}.service"));
    }
    placements(&cluster, &placed)?;
    // The same start again writes nothing, and still reports where each unit runs.
    let out = command(&cluster, &["start"], &args)?;
    assert_eq!(out.stdout.matches(" launched on ").count(), 3, "{out:?}");

    // A unit no machine qualifies for: the reason counts the machines, names none; the same
    // start again waits and fails the same way (it used to exit 0 at once).
    for _ in 0..2 {
        let out = fleetctl(
            &cluster,
            &[
                "start",
                "--block-attempts",
                "2",
                &fixture("metadata@nosuch.service"),
            ],
        )?;
        assert!(
            !out.success,
            "a unit no machine qualifies for started: {out:?}"
        );
        assert!(
            out.stderr.contains(
                "Unit metadata@nosuch.service cannot be scheduled yet: no machine able to run \
                 unit: 3 machines lack hostname=nosuch\n"
            ),
            "{out:?}"
        );
        for m in cluster.machines() {
            assert!(!out.stderr.contains(m.id().as_str()), "{out:?}");
        }
    }
    finish(cluster)
}

#[test]
fn a_global_unit_runs_on_every_machine_including_one_that_joins_later() -> Result<()> {
    let mut cluster = start(3)?;
    let out = fleetctl_ok(&cluster, &["start", &fixture("global.service")])?;
    assert!(out.stdout.contains("global.service"), "{out:?}");
    let everywhere = |n: usize| {
        move |rows: &[UnitRow]| {
            let act = active(rows);
            rows.len() == n
                && act
                    .get("global.service")
                    .is_some_and(|m| m.iter().collect::<BTreeSet<_>>().len() == n)
        }
    };
    wait_units(&cluster, "global.service on 3 machines", everywhere(3))?;
    for m in cluster.machines() {
        assert!(is_active(m, "global.service")?, "not on {}", m.name());
    }
    let files = list_unit_files(&cluster)?;
    assert_eq!(
        files,
        vec![FileRow {
            unit: "global.service".into(),
            dstate: "launched".into(),
            state: "-".into(),
            target: "global".into(),
        }]
    );

    let m4 = cluster.add_machine()?.name().to_owned();
    wait_registered(&cluster)?;
    let rows = wait_units(&cluster, "global.service on 4 machines", everywhere(4))?;
    assert!(rows.iter().any(|r| r.machine == m4), "{rows:#?}");
    assert!(is_active(cluster.machine(&m4)?, "global.service")?);
    finish(cluster)
}

#[test]
fn of_two_conflicting_global_units_the_first_in_name_order_runs_on_every_machine() -> Result<()> {
    let cluster = start(3)?;
    // The second one first: it runs everywhere until the first one arrives.
    fleetctl_ok(&cluster, &["start", &fixture("conflict-global.1.service")])?;
    wait_units(&cluster, "conflict-global.1 on 3 machines", |rows| {
        rows.len() == 3 && active(rows).get("conflict-global.1.service").map(Vec::len) == Some(3)
    })?;
    fleetctl_ok(&cluster, &["start", &fixture("conflict-global.0.service")])?;
    let rows = wait_units(&cluster, "only conflict-global.0, on 3 machines", |rows| {
        rows.len() == 3
            && rows.iter().all(|r| r.unit == "conflict-global.0.service")
            && active(rows).get("conflict-global.0.service").map(Vec::len) == Some(3)
    })?;
    let machines: BTreeSet<&str> = rows.iter().map(|r| r.machine.as_str()).collect();
    assert_eq!(machines.len(), 3, "{rows:#?}");
    for m in cluster.machines() {
        assert!(is_active(m, "conflict-global.0.service")?);
        wait_inactive(m, "conflict-global.1.service")?;
    }
    finish(cluster)
}

#[test]
fn a_unit_that_replaces_another_takes_its_machine_and_the_other_moves() -> Result<()> {
    let cluster = start(2)?;
    fleetctl_ok(&cluster, &["start", &fixture("replace.0.service")])?;
    let placed = wait_active_exactly(&cluster, &["replace.0.service"])?;
    let home = placed["replace.0.service"].clone();
    let other = if home == "m1" { "m2" } else { "m1" };

    // fleet refuses MachineID with Replaces, so the new unit is pinned by metadata.
    let dir = cluster.dir().join("units");
    std::fs::create_dir_all(&dir)?;
    let refused = dir.join("replace-by-id.service");
    std::fs::write(
        &refused,
        format!(
            "[Service]\nExecStart=/bin/sleep infinity\n\n[X-Fleet]\nMachineID={}\n\
             Replaces=replace.0.service\n",
            cluster.machine(&home)?.id()
        ),
    )?;
    let out = fleetctl(&cluster, &["start", &refused.display().to_string()])?;
    assert!(!out.success, "{out:?}");
    assert!(
        out.stderr
            .contains("MachineID cannot be used with Replaces"),
        "{out:?}"
    );
    assert_eq!(list_unit_files(&cluster)?.len(), 1);

    let kick = format!("replace-kick0@{home}.service");
    fleetctl_ok(&cluster, &["start", &fixture(&kick)])?;
    let placed = wait_active_exactly(&cluster, &["replace.0.service", &kick])?;
    assert_eq!(placed[&kick], home, "{placed:#?}");
    assert_eq!(placed["replace.0.service"], other, "{placed:#?}");
    placements(&cluster, &placed)?;
    wait_inactive(cluster.machine(&home)?, "replace.0.service")?;
    finish(cluster)
}

/// fleet's `TestScheduleReplace`: the replacing unit goes to the least-loaded machine, which is
/// the one running the unit it replaces; that unit moves, the others stay as they were.
#[test]
fn a_replacing_unit_on_the_least_loaded_machine_pushes_the_replaced_one_away() -> Result<()> {
    let cluster = start(2)?;
    fleetctl_ok(&cluster, &["start", &fixture("replace.0.service")])?;
    let group = fixtures(["replace.1.service", "replace.2.service"]);
    command(&cluster, &["start"], &group)?;
    let placed = wait_active_exactly(
        &cluster,
        &[
            "replace.0.service",
            "replace.1.service",
            "replace.2.service",
        ],
    )?;
    let home = placed["replace.0.service"].clone();
    assert_eq!(placed["replace.1.service"], placed["replace.2.service"]);
    assert_ne!(placed["replace.1.service"], home, "{placed:#?}");
    let before = placements(&cluster, &placed)?;

    fleetctl_ok(&cluster, &["start", &fixture("replace-kick0.service")])?;
    // Waited for as a whole: a list-units read between the kick's start and the replaced
    // unit's withdrawn state can show both on `home` for a moment (the state of a stopped
    // unit is withdrawn after the pass), which is not the end state.
    let want = [
        "replace-kick0.service",
        "replace.0.service",
        "replace.1.service",
        "replace.2.service",
    ];
    let rows = wait_units(&cluster, "the kick on home and replace.0 moved", |rows| {
        let act = active(rows);
        let on = |u: &str| act.get(u).filter(|m| m.len() == 1).map(|m| m[0].clone());
        rows.len() == want.len()
            && want.iter().all(|u| on(u).is_some())
            && on("replace-kick0.service").as_deref() == Some(home.as_str())
            && on("replace.0.service").is_some_and(|m| m != home)
    })?;
    let placed: BTreeMap<String, String> = rows.into_iter().map(|r| (r.unit, r.machine)).collect();
    let now = placements(&cluster, &placed)?;
    for unit in ["replace.1.service", "replace.2.service"] {
        assert_eq!(now[unit], before[unit], "{unit} moved or restarted");
    }
    wait_inactive(cluster.machine(&home)?, "replace.0.service")?;
    finish(cluster)
}

/// fleet's `TestScheduleMultipleConflicts`, on two machines so that the conflicts decide:
/// several `Conflicts` lines, space-separated globs and quoted globs all count.
#[test]
fn conflicts_given_on_several_lines_or_in_one_value_all_count() -> Result<()> {
    let cluster = start(2)?;
    let registry = TestRegistry::of(&cluster)?;
    let units: Vec<String> = (0..3)
        .map(|i| format!("conflict.multiple.{i}.service"))
        .collect();
    command(&cluster, &["start", "--no-block"], &fixtures(&units))?;
    let rows = wait_units(
        &cluster,
        "2 of the conflict.multiple units active",
        |rows| rows.len() == 2 && active(rows).len() == 2,
    )?;
    let machines: BTreeSet<&str> = rows.iter().map(|r| r.machine.as_str()).collect();
    assert_eq!(machines.len(), 2, "{rows:#?}");
    let waiting: Vec<&String> = units
        .iter()
        .filter(|u| !rows.iter().any(|r| &r.unit == *u))
        .collect();
    assert_eq!(waiting.len(), 1, "{rows:#?}");
    let reason = wait_unscheduled_reason(&registry, waiting[0])?;
    assert!(
        reason.contains("runs a conflicting conflict.multiple."),
        "{reason}"
    );
    assert_eq!(active(&list_units(&cluster)?).len(), 2);
    finish(cluster)
}

#[test]
fn the_units_of_a_lost_machine_move_and_no_other_unit_does() -> Result<()> {
    let cluster = start(3)?;
    let six = hellos(1..=6);
    command(&cluster, &["start"], &six)?;
    let names: Vec<String> = (1..=6).map(|i| format!("hello@{i}.service")).collect();
    let want: Vec<&str> = names.iter().map(String::as_str).collect();
    let placed = wait_active_exactly(&cluster, &want)?;
    let before = placements(&cluster, &placed)?;

    let lost = cluster.machine(&placed["hello@1.service"])?;
    let lost_units: Vec<&String> = placed
        .iter()
        .filter(|(_, m)| *m == lost.name())
        .map(|(u, _)| u)
        .collect();
    assert_eq!(lost_units.len(), 2, "{placed:#?}");
    lost.poweroff()?;

    let rows = wait_units(&cluster, "every unit active on the live machines", |rows| {
        rows.len() == 6 && active(rows).len() == 6 && rows.iter().all(|r| r.machine != lost.name())
    })?;
    let after: BTreeMap<String, String> = rows.into_iter().map(|r| (r.unit, r.machine)).collect();
    let now = placements(&cluster, &after)?;
    for (unit, (machine, pid)) in &before {
        if machine == lost.name() {
            assert_ne!(&now[unit].0, machine);
        } else {
            assert_eq!(
                &now[unit],
                &(machine.clone(), *pid),
                "{unit} moved or restarted"
            );
        }
    }
    // The lost machine's two units went one to each live machine (least loaded).
    let targets: BTreeSet<&String> = lost_units.iter().map(|u| &now[*u].0).collect();
    assert_eq!(targets.len(), 2, "{now:#?}");
    finish(cluster)
}

#[test]
fn when_the_engine_leader_dies_another_machine_takes_over_and_schedules() -> Result<()> {
    let spec = FleetdSpec::default().with_env("FLEET_ENGINE_RECONCILE_INTERVAL", "1");
    let cluster = start_cluster(3, spec)?;
    let registry = TestRegistry::of(&cluster)?;
    command(&cluster, &["start"], &hellos(1..=3))?;
    let first = wait_for_value(TIMEOUT, POLL, || leader(&registry).ok().flatten())
        .context("no engine leader elected")?;
    let dead = cluster.machine_by_id(&first)?;
    let placed = wait_active_exactly(
        &cluster,
        &["hello@1.service", "hello@2.service", "hello@3.service"],
    )?;
    let before = placements(&cluster, &placed)?;

    // kill -9, and no restart: its leadership must lapse, not be handed over.
    dead.kill_fleetd(Signal::Kill)?;
    dead.stop_fleetd()?;
    assert_eq!(dead.main_pid("fleet.service")?, None);

    let out = command(
        &cluster,
        &["start", "--block-attempts", "15"],
        &hellos(4..=6),
    )?;
    assert_eq!(out.stdout.matches(" launched on ").count(), 3, "{out:?}");
    let names: Vec<String> = (1..=6).map(|i| format!("hello@{i}.service")).collect();
    let want: Vec<&str> = names.iter().map(String::as_str).collect();
    // The new leader also moves the unit of the dead leader's machine.
    let rows = wait_units(&cluster, "6 units active on the live machines", |rows| {
        rows.len() == 6 && active(rows).len() == 6 && rows.iter().all(|r| r.machine != dead.name())
    })?;
    let placed: BTreeMap<String, String> = rows.into_iter().map(|r| (r.unit, r.machine)).collect();
    assert_eq!(placed.keys().map(String::as_str).collect::<Vec<_>>(), want);
    let now = placements(&cluster, &placed)?;
    for (unit, was) in &before {
        if was.0 != dead.name() {
            assert_eq!(&now[unit], was, "{unit} moved or restarted");
        }
    }
    let second = leader(&registry)?.context("no leader now")?;
    assert_ne!(second, first, "the dead fleetd is still the leader");
    cluster.machine_by_id(&second)?;
    finish(cluster)
}

/// A leader whose fleetd is killed and restarted by systemd takes its own key over at once
/// (engine.md, "Campaign"): scheduling resumes well before its old lease would have expired.
#[test]
fn a_leader_restarted_after_kill_9_takes_its_leadership_back_without_waiting_for_its_lease()
-> Result<()> {
    // Lease TTL 20 s, renewed every ~6.7 s: at least 13 s left on it after the kill.
    let spec = FleetdSpec::default().with_env("FLEET_ENGINE_RECONCILE_INTERVAL", "4");
    let cluster = start_cluster(2, spec)?;
    let registry = TestRegistry::of(&cluster)?;
    let first = wait_for_value(TIMEOUT, POLL, || leader(&registry).ok().flatten())
        .context("no engine leader elected")?;
    let m = cluster.machine_by_id(&first)?;
    let old = m.main_pid("fleet.service")?.context("fleetd not running")?;
    let killed = std::time::Instant::now();
    m.kill_fleetd(Signal::Kill)?;
    wait_for(TIMEOUT, POLL, || {
        m.main_pid("fleet.service")
            .ok()
            .flatten()
            .is_some_and(|pid| pid != old)
    })
    .context("systemd did not restart fleetd")?;

    // 3 attempts of 2 s: over before the old lease could have lapsed.
    let out = fleetctl(
        &cluster,
        &["start", "--block-attempts", "3", &fixture("hello.service")],
    )?;
    let took = killed.elapsed();
    assert!(
        out.success,
        "nothing scheduled {took:?} after the leader's kill -9: {out:?}"
    );
    assert_eq!(leader(&registry)?.as_deref(), Some(first.as_str()));
    wait_active_exactly(&cluster, &["hello.service"])?;
    finish(cluster)
}

#[test]
fn list_unit_files_is_sorted_and_list_machines_shows_every_machine() -> Result<()> {
    let cluster = start(3)?;
    let mut names: Vec<String> = (1..=20).map(|i| format!("hello@{i:02}.service")).collect();
    // Submitted one by one, out of order.
    for i in 0..20 {
        let name = &names[(i * 7 + 3) % 20];
        fleetctl_ok(&cluster, &["submit", &fixture(name)])?;
    }
    let out = fleetctl_ok(
        &cluster,
        &["list-unit-files", "--no-legend", "--fields", "unit"],
    )?;
    names.sort();
    let listed: Vec<&str> = out.stdout.lines().map(str::trim).collect();
    assert_eq!(listed, names);

    let out = fleetctl_ok(&cluster, &["list-machines"])?;
    let mut lines = out.stdout.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header, ["MACHINE", "IP", "METADATA"], "{out:?}");
    let mut rows: Vec<Vec<String>> = lines
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect();
    rows.sort();
    let mut want: Vec<Vec<String>> = cluster
        .machines()
        .iter()
        .map(|m| {
            vec![
                format!("{}...", &m.id().to_string()[..8]),
                m.ip().to_string(),
                format!("hostname={}", m.name()),
            ]
        })
        .collect();
    want.sort();
    assert_eq!(rows, want, "{out:?}");

    let out = fleetctl_ok(&cluster, &["list-machines", "--full", "--no-legend"])?;
    let mut rows: Vec<Vec<String>> = out
        .stdout
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect();
    rows.sort();
    let mut want: Vec<Vec<String>> = cluster
        .machines()
        .iter()
        .map(|m| {
            vec![
                m.id().to_string(),
                m.ip().to_string(),
                format!("hostname={}", m.name()),
            ]
        })
        .collect();
    want.sort();
    assert_eq!(rows, want, "{out:?}");
    finish(cluster)
}
