//! `--replace` end to end (issue 5): units replaced with the host's fleetctl, placed by the
//! engine elected among the machines' fleetd and run by their agents under real systemd.
//! fleet's own replace tests (`TestUnitSubmitReplace`, `TestUnitLoadReplace`,
//! `TestUnitStartReplace`), the serialization test fleet removed as flaky
//! (`TestReplaceSerialization`), and what fleet never had: replaces that stay on their
//! machine, rolling replaces of global units, replaces without restart, templates replaced
//! without touching their instances, and two clients replacing the same unit at once.
//! Fixtures are in `functional-tests/fixtures/replace/` (`v1/`, `v2/`, `v3/`: versions of the
//! same unit file; `bad/`: versions that cannot start); versions that differ by a number are
//! written by the tests. Needs root.
//!
//! Every test boots its own cluster and waits for conditions, never for a fixed time. Where a
//! test shows that something did *not* happen (a unit untouched), it checks after a positive
//! event that comes later (another unit replaced, a failed unit retried).
//! "Never two copies at once" is checked on timestamps written by the units themselves or
//! logged by systemd (the machines share the host's clock), not by sampling alone.

use anyhow::{Context, Result, bail, ensure};
use fleet_core::{UnitFile, UnitHash};
use fleet_functional_tests::{
    Cluster, ClusterSpec, FleetdSpec, Machine, OutputExt, TestRegistry, cleanup_stale, wait_for,
    wait_for_value,
};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
mod support;
use support::{finish, strip_ansi};

const TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);
/// A fleetctl run that takes longer than this is killed and fails the test (blocking commands
/// are also given `--block-attempts`, so this is only the last resort against a hang).
const FLEETCTL_TIMEOUT: Duration = Duration::from_secs(90);
/// `--block-attempts` for blocking commands: 2 s each.
const BLOCK_ATTEMPTS: &str = "15";

// --- cluster and fleetctl ------------------------------------------------------------------

/// A cluster of `machines` machines, each registered (so that placement sees all of them).
fn start(machines: usize) -> Result<Cluster> {
    cleanup_stale()?;
    let cluster = Cluster::start(ClusterSpec::with_fleetd(machines, FleetdSpec::default()))?;
    wait_registered(&cluster)?;
    Ok(cluster)
}

/// Waits until `list-machines` shows every machine of the cluster.
fn wait_registered(cluster: &Cluster) -> Result<()> {
    let want: BTreeSet<String> = cluster
        .machines()
        .iter()
        .map(|m| m.id().to_string())
        .collect();
    let mut last = String::new();
    wait_for(TIMEOUT, POLL, || {
        let Ok(run) = fleetctl(
            cluster,
            &[
                "list-machines",
                "--no-legend",
                "--full",
                "--fields",
                "machine",
            ],
        ) else {
            return false;
        };
        last = run.stdout;
        let listed: BTreeSet<String> = last.split_whitespace().map(str::to_owned).collect();
        want.is_subset(&listed)
    })
    .with_context(|| format!("not every machine registered; list-machines: {last:?}"))
}

/// What a fleetctl run printed.
#[derive(Debug)]
struct Run {
    success: bool,
    stdout: String,
    stderr: String,
}

/// Starts fleetctl (over the cluster's driver) on the host, output captured.
fn spawn_fleetctl<S: AsRef<str>>(cluster: &Cluster, args: &[S]) -> Result<Child> {
    cluster
        .fleetctl_command(cluster.driver())?
        .args(args.iter().map(AsRef::as_ref))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", cluster.fleetctl_path().display()))
}

/// Waits for a fleetctl started by [`spawn_fleetctl`]; kills it after [`FLEETCTL_TIMEOUT`].
fn collect(mut child: Child, line: &str) -> Result<Run> {
    let mut stdout = child.stdout.take().context("no stdout pipe")?;
    let mut stderr = child.stderr.take().context("no stderr pipe")?;
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = wait_for_value(FLEETCTL_TIMEOUT, Duration::from_millis(10), || {
        child.try_wait().ok().flatten()
    });
    let status = match status {
        Ok(status) => status,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            let (out, err) = (
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default(),
            );
            bail!("fleetctl {line} hung for {FLEETCTL_TIMEOUT:?}: stdout {out:?}, stderr {err:?}");
        }
    };
    Ok(Run {
        success: status.success(),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

fn fleetctl<S: AsRef<str>>(cluster: &Cluster, args: &[S]) -> Result<Run> {
    let line: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    collect(spawn_fleetctl(cluster, args)?, &line.join(" "))
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

/// `fleetctl <verb...> <units...>`, checked.
fn command(cluster: &Cluster, verb: &[&str], units: &[String]) -> Result<Run> {
    let mut all: Vec<String> = verb.iter().map(|s| (*s).to_owned()).collect();
    all.extend(units.iter().cloned());
    fleetctl_ok(cluster, &all)
}

// --- unit files ----------------------------------------------------------------------------

/// `functional-tests/fixtures/replace/<rel>`, absolute.
fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/replace")
        .join(rel)
}

fn fixture_arg(rel: &str) -> String {
    fixture(rel).display().to_string()
}

fn fixture_text(rel: &str) -> Result<String> {
    std::fs::read_to_string(fixture(rel)).with_context(|| format!("fixture {rel}"))
}

/// `dir/<template>@<i>.service` for every `i`: instance arguments next to a template (which
/// need not exist there).
fn instances(dir: &Path, template: &str, range: impl IntoIterator<Item = u32>) -> Vec<String> {
    range
        .into_iter()
        .map(|i| {
            dir.join(format!("{template}@{i}.service"))
                .display()
                .to_string()
        })
        .collect()
}

/// A fresh directory of the run for the unit files a test writes.
fn workdir(cluster: &Cluster, name: &str) -> Result<PathBuf> {
    let dir = cluster.dir().join("replace-units").join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// Writes `dir/name` with `text`; returns its path as a fleetctl argument.
fn write_unit(dir: &Path, name: &str, text: &str) -> Result<String> {
    let path = dir.join(name);
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path.display().to_string())
}

fn parse(text: &str) -> Result<UnitFile> {
    UnitFile::parse(text.as_bytes()).with_context(|| format!("unit file {text:?}"))
}

/// The full hash fleet gives `text` (what `--full` listings show).
fn hash_of(text: &str) -> Result<String> {
    Ok(parse(text)?.hash().to_string())
}

fn unit_hash(text: &str) -> Result<UnitHash> {
    Ok(parse(text)?.hash())
}

/// What `fleetctl cat` prints for a unit stored from `text`.
fn canonical(text: &str) -> Result<String> {
    Ok(parse(text)?.canonical())
}

fn cat(cluster: &Cluster, unit: &str) -> Result<String> {
    Ok(fleetctl_ok(cluster, &["cat", unit])?.stdout)
}

// --- listings ------------------------------------------------------------------------------

/// The name (`m1`, ...) of the machine a fleetctl legend (`<full id>/<ip>` or `<id>`) names;
/// the legend itself if no machine of the cluster has that ID.
fn machine_name(cluster: &Cluster, legend: &str) -> String {
    let id = legend.split('/').next().unwrap_or(legend);
    cluster
        .machine_by_id(id)
        .map_or_else(|_| legend.to_owned(), |m| m.name().to_owned())
}

/// fleetctl's legend of a machine, as in `replaced in place on 69aee328.../10.251.3.11`.
fn short(machine: &Machine) -> String {
    format!("{}.../{}", &machine.id().to_string()[..8], machine.ip())
}

/// One row of `list-units`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct UnitRow {
    unit: String,
    /// The machine's name (`m1`, ...).
    machine: String,
    active: String,
    sub: String,
    hash: String,
    pending: String,
}

fn list_units(cluster: &Cluster) -> Result<Vec<UnitRow>> {
    let out = fleetctl_ok(
        cluster,
        &[
            "list-units",
            "--no-legend",
            "--full",
            "--fields",
            "unit,machine,active,sub,hash,pending",
        ],
    )?;
    let mut rows = out
        .stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [unit, machine, active, sub, hash, pending] => Ok(UnitRow {
                unit: unit.to_owned(),
                machine: machine_name(cluster, machine),
                active: active.to_owned(),
                sub: sub.to_owned(),
                hash: hash.to_owned(),
                pending: pending.to_owned(),
            }),
            _ => bail!("bad list-units row {l:?}"),
        })
        .collect::<Result<Vec<_>>>()?;
    rows.sort();
    Ok(rows)
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

/// The rows of `unit`.
fn rows_of<'a>(rows: &'a [UnitRow], unit: &str) -> Vec<&'a UnitRow> {
    rows.iter().filter(|r| r.unit == unit).collect()
}

/// The single row of `unit`, if it has exactly one.
fn row_of<'a>(rows: &'a [UnitRow], unit: &str) -> Option<&'a UnitRow> {
    match rows_of(rows, unit)[..] {
        [row] => Some(row),
        _ => None,
    }
}

/// One row of `list-unit-files`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileRow {
    unit: String,
    hash: String,
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
            "unit,hash,dstate,state,target",
        ],
    )?;
    out.stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [unit, hash, dstate, state, target] => Ok(FileRow {
                unit: unit.to_owned(),
                hash: hash.to_owned(),
                dstate: dstate.to_owned(),
                state: state.to_owned(),
                target: match target {
                    "-" | "global" => target.to_owned(),
                    t => machine_name(cluster, t),
                },
            }),
            _ => bail!("bad list-unit-files row {l:?}"),
        })
        .collect()
}

fn file_row(files: &[FileRow], unit: &str) -> Result<FileRow> {
    files
        .iter()
        .find(|f| f.unit == unit)
        .cloned()
        .with_context(|| format!("{unit} not in list-unit-files: {files:#?}"))
}

// --- machines ------------------------------------------------------------------------------

fn is_active(machine: &Machine, unit: &str) -> Result<bool> {
    let out = machine.systemctl(["is-active", unit])?;
    Ok(out.stdout_text().trim() == "active")
}

/// The unit's main PID on `machine`; fails if it has none.
fn pid(machine: &Machine, unit: &str) -> Result<u32> {
    machine
        .main_pid(unit)?
        .with_context(|| format!("{unit} has no main PID on {}", machine.name()))
}

/// Main PID of every active row of `rows`, by (unit, machine name).
fn pids(cluster: &Cluster, rows: &[UnitRow]) -> Result<BTreeMap<(String, String), u32>> {
    rows.iter()
        .filter(|r| r.active == "active")
        .map(|r| {
            let m = cluster.machine(&r.machine)?;
            Ok(((r.unit.clone(), r.machine.clone()), pid(m, &r.unit)?))
        })
        .collect()
}

/// The environment of process `pid` in `machine`, one `KEY=value` per line.
fn environ(machine: &Machine, pid: u32) -> Result<String> {
    machine.sh(&format!("tr '\\0' '\\n' < /proc/{pid}/environ"))
}

/// Waits until systemd on `machine` no longer runs `unit`.
fn wait_inactive(machine: &Machine, unit: &str) -> Result<()> {
    wait_for(TIMEOUT, POLL, || !is_active(machine, unit).unwrap_or(true))
        .with_context(|| format!("{unit} still runs on {}", machine.name()))
}

/// Microseconds since the epoch on the host's clock (the machines share it).
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// systemd's catalogue IDs of the job messages about a unit.
const MSG_STOPPING: &str = "de5b426a63be47a7b6ac3eaac82e2f6f";
const MSG_STARTED: &str = "39f53479d3a045ac8e11786248231fbf";
const MSG_FAILED: &str = "be02cf6855d2428ba40df7e9d022f03d";

/// What systemd (PID 1) logged about `unit` at or after `since` (µs): (time, message ID).
fn job_events(machine: &Machine, unit: &str, since: u64) -> Result<Vec<(u64, String)>> {
    let filter = format!("UNIT={unit}");
    let out = machine.journal(&["-o", "json", &filter])?;
    let mut events = Vec::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let entry: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("journal line {line:?}"))?;
        let at: u64 = entry["__REALTIME_TIMESTAMP"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("no timestamp in {line:?}"))?;
        if let Some(id) = entry["MESSAGE_ID"].as_str()
            && at >= since
        {
            events.push((at, id.to_owned()));
        }
    }
    events.sort();
    Ok(events)
}

/// The periods (µs) in which `unit` was down on a machine, from its job events: from each
/// "Stopping" to the next "Started" (open-ended, `u64::MAX`, if it never started again).
fn down_periods(events: &[(u64, String)]) -> Vec<(u64, u64)> {
    let mut periods = Vec::new();
    let mut down_since = None;
    for (at, id) in events {
        match id.as_str() {
            MSG_STOPPING if down_since.is_none() => down_since = Some(*at),
            MSG_STARTED => {
                if let Some(from) = down_since.take() {
                    periods.push((from, *at));
                }
            }
            _ => {}
        }
    }
    if let Some(from) = down_since {
        periods.push((from, u64::MAX));
    }
    periods
}

/// The most periods that overlap at any one moment.
fn max_overlap(periods: &[(u64, u64)]) -> usize {
    let mut edges: Vec<(u64, i32)> = periods
        .iter()
        .flat_map(|&(from, to)| [(from, 1), (to, -1)])
        .collect();
    // At equal times an end comes before a start: touching periods do not overlap.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, delta) in edges {
        now += delta;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

/// Samples `systemctl is-active unit` on every machine, round after round, until `stop`;
/// returns how many machines were active in each round.
fn sample_active(cluster: &Cluster, unit: &str, stop: &AtomicBool) -> Vec<usize> {
    let mut rounds = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let active = cluster
            .machines()
            .iter()
            .filter(|m| is_active(m, unit).unwrap_or(false))
            .count();
        rounds.push(active);
    }
    rounds
}

// --- fleet's replace tests -----------------------------------------------------------------

/// fleet's `TestUnitSubmitReplace`, plus the same-content and refused cases.
#[test]
fn submit_replace_gives_nine_inactive_instances_new_content_and_refuses_loaded_or_launched_ones()
-> Result<()> {
    let cluster = start(3)?;
    let names: Vec<String> = (1..=9).map(|i| format!("hello@{i}.service")).collect();
    let v1 = fixture_text("v1/hello@.service")?;
    let v2 = fixture_text("v2/hello@.service")?;
    let (h1, h2) = (hash_of(&v1)?, hash_of(&v2)?);
    command(
        &cluster,
        &["submit"],
        &instances(&fixture("v1"), "hello", 1..=9),
    )?;
    let files = list_unit_files(&cluster)?;
    assert_eq!(files.len(), 9, "{files:#?}");
    assert!(
        files.iter().all(|f| f.hash == h1 && f.dstate == "inactive"),
        "{files:#?}"
    );

    let tmp = workdir(&cluster, "submit-v2")?;
    for (i, name) in names.iter().enumerate() {
        let path = write_unit(&tmp, name, &v2)?;
        let out = fleetctl_ok(&cluster, &["submit", "--replace", &path])?;
        assert!(
            out.stdout.contains(&format!("Unit {name} inactive")),
            "{out:?}"
        );
        let files = list_unit_files(&cluster)?;
        assert_eq!(files.len(), 9, "after replacing {name}: {files:#?}");
        for (j, f) in files.iter().enumerate() {
            let want = if j <= i { &h2 } else { &h1 };
            assert_eq!(&f.hash, want, "after replacing {name}: {files:#?}");
            assert_eq!(f.dstate, "inactive", "{files:#?}");
        }
        let text = cat(&cluster, name)?;
        assert_eq!(text, canonical(&v2)?, "cat {name}");
        assert_ne!(text, canonical(&v1)?);
    }
    assert!(list_units(&cluster)?.is_empty());

    let out = fleetctl_ok(
        &cluster,
        &[
            "submit",
            "--replace",
            &tmp.join(&names[0]).display().to_string(),
        ],
    )?;
    assert!(
        out.stdout
            .contains("Found same Unit(hello@1.service) in Registry, nothing to do"),
        "{out:?}"
    );

    // A loaded and a launched instance cannot be replaced by submit.
    command(&cluster, &["load"], &instances(&tmp, "hello", [1]))?;
    command(&cluster, &["start"], &instances(&tmp, "hello", [2]))?;
    let rows = wait_units(&cluster, "hello@1 loaded, hello@2 active", |rows| {
        rows.len() == 2
            && row_of(rows, "hello@1.service").is_some_and(|r| r.active == "inactive")
            && row_of(rows, "hello@2.service").is_some_and(|r| r.active == "active")
    })?;
    let files = list_unit_files(&cluster)?;
    let running = pids(&cluster, &rows)?;
    let v3 = fixture_text("v3/hello@.service")?;
    let tmp3 = workdir(&cluster, "submit-v3")?;
    for (name, state) in [
        ("hello@1.service", "loaded"),
        ("hello@2.service", "launched"),
    ] {
        let path = write_unit(&tmp3, name, &v3)?;
        let out = fleetctl(&cluster, &["submit", "--replace", &path])?;
        assert!(!out.success, "submit --replace of a {state} unit: {out:?}");
        assert!(
            out.stderr.contains(&format!(
                "can not replace Unit({name}) in state '{state}', use the appropriate command"
            )),
            "{out:?}"
        );
        assert_eq!(cat(&cluster, name)?, canonical(&v2)?, "{name} changed");
    }
    assert_eq!(
        list_unit_files(&cluster)?,
        files,
        "a refused replace changed something"
    );
    assert_eq!(list_units(&cluster)?, rows);
    assert_eq!(pids(&cluster, &rows)?, running);
    finish(cluster)
}

/// fleet's `TestUnitLoadReplace`, plus load --replace of an inactive unit and of a launched one
/// (refused).
#[test]
fn load_replace_gives_six_loaded_instances_new_content_in_place_and_refuses_a_launched_one()
-> Result<()> {
    let cluster = start(3)?;
    let names: Vec<String> = (1..=6).map(|i| format!("hello@{i}.service")).collect();
    let v1 = fixture_text("v1/hello@.service")?;
    let v2 = fixture_text("v2/hello@.service")?;
    let (h1, h2) = (hash_of(&v1)?, hash_of(&v2)?);
    let out = command(
        &cluster,
        &["load"],
        &instances(&fixture("v1"), "hello", 1..=6),
    )?;
    assert_eq!(out.stdout.matches(" loaded on ").count(), 6, "{out:?}");
    let before = wait_units(&cluster, "6 loaded instances", |rows| {
        rows.len() == 6 && rows.iter().all(|r| r.active == "inactive" && r.hash == h1)
    })?;

    let tmp = workdir(&cluster, "load-v2")?;
    for (i, name) in names.iter().enumerate() {
        let path = write_unit(&tmp, name, &v2)?;
        let out = fleetctl_ok(
            &cluster,
            &[
                "load",
                "--replace",
                "--block-attempts",
                BLOCK_ATTEMPTS,
                &path,
            ],
        )?;
        let home = cluster.machine(&before[i].machine)?;
        assert!(
            out.stdout
                .contains(&format!("Unit {name} replaced in place on {}", short(home))),
            "{out:?}"
        );
        let rows = list_units(&cluster)?;
        assert_eq!(rows.len(), 6, "after replacing {name}: {rows:#?}");
        for (j, r) in rows.iter().enumerate() {
            let want = if j <= i { &h2 } else { &h1 };
            assert_eq!(&r.hash, want, "after replacing {name}: {rows:#?}");
            assert_eq!(r.active, "inactive", "{rows:#?}");
            assert_eq!(r.machine, before[j].machine, "{name} moved: {rows:#?}");
        }
        let f = file_row(&list_unit_files(&cluster)?, name)?;
        assert_eq!(
            (f.hash.as_str(), f.dstate.as_str()),
            (h2.as_str(), "loaded")
        );
        assert_eq!(cat(&cluster, name)?, canonical(&v2)?, "cat {name}");
    }
    let out = fleetctl_ok(
        &cluster,
        &[
            "load",
            "--replace",
            &tmp.join(&names[5]).display().to_string(),
        ],
    )?;
    assert!(
        out.stdout
            .contains("Found same Unit(hello@6.service) in Registry, nothing to do"),
        "{out:?}"
    );

    // An inactive unit: replaced and loaded.
    command(
        &cluster,
        &["submit"],
        &instances(&fixture("v1"), "hello", [7]),
    )?;
    let path = write_unit(&tmp, "hello@7.service", &v2)?;
    fleetctl_ok(
        &cluster,
        &[
            "load",
            "--replace",
            "--block-attempts",
            BLOCK_ATTEMPTS,
            &path,
        ],
    )?;
    wait_units(&cluster, "hello@7 loaded with the new hash", |rows| {
        rows.len() == 7
            && row_of(rows, "hello@7.service")
                .is_some_and(|r| r.active == "inactive" && r.hash == h2)
    })?;
    assert_eq!(cat(&cluster, "hello@7.service")?, canonical(&v2)?);

    // A launched unit cannot be replaced by load.
    command(&cluster, &["start"], &instances(&tmp, "hello", [1]))?;
    wait_units(&cluster, "hello@1 active", |rows| {
        rows.len() == 7 && row_of(rows, "hello@1.service").is_some_and(|r| r.active == "active")
    })?;
    let files = list_unit_files(&cluster)?;
    let rows = list_units(&cluster)?;
    let running = pids(&cluster, &rows)?;
    let tmp3 = workdir(&cluster, "load-v3")?;
    let path = write_unit(
        &tmp3,
        "hello@1.service",
        &fixture_text("v3/hello@.service")?,
    )?;
    let out = fleetctl(&cluster, &["load", "--replace", &path])?;
    assert!(!out.success, "load --replace of a launched unit: {out:?}");
    assert!(
        out.stderr.contains(
            "can not replace Unit(hello@1.service) in state 'launched', use the appropriate command"
        ),
        "{out:?}"
    );
    assert_eq!(cat(&cluster, "hello@1.service")?, canonical(&v2)?);
    assert_eq!(
        list_unit_files(&cluster)?,
        files,
        "a refused replace changed something"
    );
    assert_eq!(list_units(&cluster)?, rows);
    assert_eq!(pids(&cluster, &rows)?, running);
    finish(cluster)
}

/// fleet's `TestUnitStartReplace`, plus start --replace of an inactive and a loaded unit in one
/// command.
#[test]
fn start_replace_runs_the_new_content_of_three_instances_in_place_and_takes_any_state() -> Result<()>
{
    let cluster = start(3)?;
    let names: Vec<String> = (1..=3).map(|i| format!("hello@{i}.service")).collect();
    let v1 = fixture_text("v1/hello@.service")?;
    let v2 = fixture_text("v2/hello@.service")?;
    let (h1, h2) = (hash_of(&v1)?, hash_of(&v2)?);
    let out = command(
        &cluster,
        &["start"],
        &instances(&fixture("v1"), "hello", 1..=3),
    )?;
    assert_eq!(out.stdout.matches(" launched on ").count(), 3, "{out:?}");
    let before = wait_units(&cluster, "3 active instances", |rows| {
        rows.len() == 3 && rows.iter().all(|r| r.active == "active" && r.hash == h1)
    })?;
    let mut running = pids(&cluster, &before)?;

    let tmp = workdir(&cluster, "start-v2")?;
    for (i, name) in names.iter().enumerate() {
        let path = write_unit(&tmp, name, &v2)?;
        let out = fleetctl_ok(
            &cluster,
            &[
                "start",
                "--replace",
                "--block-attempts",
                BLOCK_ATTEMPTS,
                &path,
            ],
        )?;
        let home = cluster.machine(&before[i].machine)?;
        assert!(
            out.stdout
                .contains(&format!("Unit {name} replaced in place on {}", short(home))),
            "{out:?}"
        );
        let rows = list_units(&cluster)?;
        assert_eq!(rows.len(), 3, "after replacing {name}: {rows:#?}");
        let now = pids(&cluster, &rows)?;
        for (j, r) in rows.iter().enumerate() {
            let want = if j <= i { &h2 } else { &h1 };
            assert_eq!(&r.hash, want, "after replacing {name}: {rows:#?}");
            assert_eq!(r.active, "active", "{rows:#?}");
            assert_eq!(r.machine, before[j].machine, "{name} moved: {rows:#?}");
            let key = (r.unit.clone(), r.machine.clone());
            if j == i {
                assert_ne!(now[&key], running[&key], "{name} was not restarted");
            } else {
                assert_eq!(now[&key], running[&key], "{} restarted", r.unit);
            }
        }
        running = now;
        let f = file_row(&list_unit_files(&cluster)?, name)?;
        assert_eq!(
            (f.hash.as_str(), f.dstate.as_str()),
            (h2.as_str(), "launched")
        );
        assert_eq!(cat(&cluster, name)?, canonical(&v2)?, "cat {name}");
    }
    let out = fleetctl_ok(
        &cluster,
        &[
            "start",
            "--replace",
            &tmp.join(&names[2]).display().to_string(),
        ],
    )?;
    assert!(
        out.stdout
            .contains("Found same Unit(hello@3.service) in Registry, nothing to do"),
        "{out:?}"
    );
    assert_eq!(pids(&cluster, &list_units(&cluster)?)?, running);

    // An inactive and a loaded unit, replaced and started in one command.
    command(
        &cluster,
        &["submit"],
        &instances(&fixture("v1"), "hello", [4]),
    )?;
    command(
        &cluster,
        &["load"],
        &instances(&fixture("v1"), "hello", [5]),
    )?;
    let paths = [4, 5]
        .iter()
        .map(|i| write_unit(&tmp, &format!("hello@{i}.service"), &v2))
        .collect::<Result<Vec<_>>>()?;
    command(
        &cluster,
        &["start", "--replace", "--block-attempts", BLOCK_ATTEMPTS],
        &paths,
    )?;
    let rows = wait_units(
        &cluster,
        "5 active instances, all on the new hash",
        |rows| rows.len() == 5 && rows.iter().all(|r| r.active == "active" && r.hash == h2),
    )?;
    assert_eq!(rows.len(), 5);
    let files = list_unit_files(&cluster)?;
    assert!(
        files.iter().all(|f| f.hash == h2 && f.dstate == "launched"),
        "{files:#?}"
    );
    finish(cluster)
}

// --- serialization -------------------------------------------------------------------------

const MARKER: &str = "/run/replace-sync-marker";

/// Version `k` of `sync.service`: its ExecStopPost writes `k` into the marker after 0.3 s; its
/// ExecStartPre requires the marker to hold `k - 1` (written by the previous version's
/// ExecStopPost) and consumes it. So it starts only if the previous version was fully stopped.
fn sync_unit(k: u32) -> String {
    let pre = match k {
        0 => format!("/bin/rm -f {MARKER}"),
        _ => format!("/bin/sh -c 'grep -qx {} {MARKER} && rm {MARKER}'", k - 1),
    };
    format!(
        "[Unit]\nDescription=Serialized replace, version {k}\n\n[Service]\n\
         ExecStartPre={pre}\nExecStart=/bin/sleep infinity\n\
         ExecStopPost=/bin/sh -c 'sleep 0.3; echo {k} > {MARKER}'\n"
    )
}

/// fleet's removed `TestReplaceSerialization`, 20 times in a row.
#[test]
fn the_old_versions_exec_stop_post_always_completes_before_the_new_versions_exec_start_pre()
-> Result<()> {
    let cluster = start(1)?;
    let m = &cluster.machines()[0];
    let tmp = workdir(&cluster, "sync")?;
    let path = write_unit(&tmp, "sync.service", &sync_unit(0))?;
    fleetctl_ok(
        &cluster,
        &["start", "--block-attempts", BLOCK_ATTEMPTS, &path],
    )?;
    let cursor = m.journal(&["-n", "0", "--show-cursor"])?;
    let cursor = cursor
        .lines()
        .find_map(|l| l.strip_prefix("-- cursor: "))
        .context("no journal cursor")?
        .to_owned();
    for k in 1..=20 {
        let text = sync_unit(k);
        write_unit(&tmp, "sync.service", &text)?;
        let out = fleetctl(
            &cluster,
            &[
                "start",
                "--replace",
                "--block-attempts",
                BLOCK_ATTEMPTS,
                &path,
            ],
        )?;
        ensure!(
            out.success
                && out
                    .stdout
                    .contains("Unit sync.service replaced in place on"),
            "replace {k} of 20 failed: {out:?}\njournal: {}",
            m.journal(&["-u", "sync.service", "-o", "cat", "-n", "30"])?
        );
        let rows = list_units(&cluster)?;
        let row = row_of(&rows, "sync.service").with_context(|| format!("{rows:#?}"))?;
        assert_eq!(
            (row.active.as_str(), row.hash.as_str()),
            ("active", hash_of(&text)?.as_str()),
            "replace {k}: {rows:#?}"
        );
        assert!(is_active(m, "sync.service")?, "replace {k}: not active");
        // The new version consumed the marker the old one left.
        assert!(
            m.read_file(MARKER).is_err(),
            "replace {k}: marker still there"
        );
    }
    let after = format!("--after-cursor={cursor}");
    let journal = m.journal(&["-u", "sync.service", "-o", "cat", &after])?;
    assert!(
        !journal.contains("Failed") && !journal.contains("status=1"),
        "sync.service failed at some point:\n{journal}"
    );
    assert_eq!(
        journal.matches("Started sync.service").count(),
        20,
        "{journal}"
    );
    finish(cluster)
}

// --- placement -----------------------------------------------------------------------------

const STAY_LOG: &str = "/run/stay.log";

/// Version `v` of `stay.service`; each copy logs when it begins to start and when its stop
/// has completed (after a 0.3 s ExecStopPost), on the host's clock in nanoseconds.
fn stay_unit(v: u32, machine_id: Option<&str>) -> String {
    let mut text = format!(
        "[Unit]\nDescription=Stays in place, version {v}\n\n[Service]\n\
         ExecStartPre=/bin/sh -c 'echo \"start $(date +%%s%%N)\" >> {STAY_LOG}'\n\
         ExecStart=/bin/sleep infinity\n\
         ExecStopPost=/bin/sh -c 'sleep 0.3; echo \"stopped $(date +%%s%%N)\" >> {STAY_LOG}'\n"
    );
    if let Some(id) = machine_id {
        text.push_str(&format!("\n[X-Fleet]\nMachineID={id}\n"));
    }
    text
}

/// The periods (ns) in which a copy of stay.service existed on `machine`: from the beginning of
/// its start to the end of its stop (open-ended if it still runs).
fn stay_periods(machine: &Machine) -> Result<Vec<(u64, u64)>> {
    let log = match machine.read_file(STAY_LOG) {
        Ok(log) => log,
        Err(_) => return Ok(Vec::new()),
    };
    let mut periods = Vec::new();
    let mut since = None;
    for line in log.lines() {
        match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["start", t] => {
                ensure!(
                    since.is_none(),
                    "{}: two starts without a stop: {log}",
                    machine.name()
                );
                since = Some(t.parse::<u64>()?);
            }
            ["stopped", t] => {
                let from = since.take().with_context(|| {
                    format!("{}: a stop without a start: {log}", machine.name())
                })?;
                periods.push((from, t.parse()?));
            }
            _ => bail!("{}: bad line {line:?} in {STAY_LOG}", machine.name()),
        }
    }
    if let Some(from) = since {
        periods.push((from, u64::MAX));
    }
    Ok(periods)
}

/// Checks that no two copies of stay.service ever existed at once, on any machines.
fn assert_one_copy_at_a_time(cluster: &Cluster) -> Result<()> {
    let mut all = Vec::new();
    let mut by_machine = BTreeMap::new();
    for m in cluster.machines() {
        let periods = stay_periods(m)?;
        all.extend(periods.iter().copied());
        by_machine.insert(m.name().to_owned(), periods);
    }
    ensure!(
        max_overlap(&all) <= 1,
        "two copies of stay.service existed at once: {by_machine:#?}"
    );
    Ok(())
}

/// Waits until stay.service runs `text` on exactly one machine; returns that machine's name.
fn wait_stay(cluster: &Cluster, text: &str) -> Result<String> {
    let hash = hash_of(text)?;
    let rows = wait_units(cluster, "stay.service active with its new hash", |rows| {
        rows.len() == 1
            && row_of(rows, "stay.service").is_some_and(|r| r.active == "active" && r.hash == hash)
    })?;
    let home = rows[0].machine.clone();
    for m in cluster.machines() {
        if m.name() == home {
            ensure!(is_active(m, "stay.service")?, "not active on {home}");
        } else {
            wait_inactive(m, "stay.service")?;
        }
    }
    Ok(home)
}

#[test]
fn a_replaced_unit_stays_on_its_machine_and_moves_only_when_rescheduled_or_pinned_elsewhere()
-> Result<()> {
    let cluster = start(3)?;
    let tmp = workdir(&cluster, "stay")?;
    let text = stay_unit(1, None);
    let path = write_unit(&tmp, "stay.service", &text)?;
    fleetctl_ok(
        &cluster,
        &["start", "--block-attempts", BLOCK_ATTEMPTS, &path],
    )?;
    let home = wait_stay(&cluster, &text)?;
    let home_m = cluster.machine(&home)?;

    for v in 2..=11 {
        let text = stay_unit(v, None);
        write_unit(&tmp, "stay.service", &text)?;
        let out = fleetctl_ok(
            &cluster,
            &[
                "start",
                "--replace",
                "--block-attempts",
                BLOCK_ATTEMPTS,
                &path,
            ],
        )?;
        assert!(
            out.stdout.contains(&format!(
                "Unit stay.service replaced in place on {}",
                short(home_m)
            )),
            "version {v}: {out:?}"
        );
        assert_eq!(wait_stay(&cluster, &text)?, home, "version {v} moved");
    }
    assert_eq!(stay_periods(home_m)?.len(), 11);
    assert_one_copy_at_a_time(&cluster)?;

    // --reschedule: placed afresh, away from its machine.
    let text = stay_unit(12, None);
    write_unit(&tmp, "stay.service", &text)?;
    let out = fleetctl_ok(
        &cluster,
        &[
            "start",
            "--replace",
            "--reschedule",
            "--block-attempts",
            BLOCK_ATTEMPTS,
            &path,
        ],
    )?;
    let second = wait_stay(&cluster, &text)?;
    assert_ne!(second, home, "--reschedule left it on {home}: {out:?}");
    let second_m = cluster.machine(&second)?;
    assert!(
        out.stdout.contains(&format!(
            "Unit stay.service moved from {} to {}",
            short(home_m),
            short(second_m)
        )),
        "{out:?}"
    );
    assert_one_copy_at_a_time(&cluster)?;

    // A new version pinned to the third machine goes there.
    let third_m = cluster
        .machines()
        .iter()
        .find(|m| m.name() != home && m.name() != second)
        .context("no third machine")?;
    let text = stay_unit(13, Some(&third_m.id().to_string()));
    write_unit(&tmp, "stay.service", &text)?;
    let out = fleetctl_ok(
        &cluster,
        &[
            "start",
            "--replace",
            "--block-attempts",
            BLOCK_ATTEMPTS,
            &path,
        ],
    )?;
    assert_eq!(wait_stay(&cluster, &text)?, third_m.name(), "{out:?}");
    assert!(
        out.stdout.contains(&format!(
            "Unit stay.service moved from {} to {}",
            short(second_m),
            short(third_m)
        )),
        "{out:?}"
    );
    assert_one_copy_at_a_time(&cluster)?;
    let files = list_unit_files(&cluster)?;
    let f = file_row(&files, "stay.service")?;
    assert_eq!(
        (f.hash, f.target),
        (hash_of(&text)?, third_m.name().to_owned())
    );
    finish(cluster)
}

// --- rolling replaces of a global unit -----------------------------------------------------

/// Starts v1 of the global roll.service and waits until all machines run it; returns its
/// main PID on each machine.
fn start_roll(cluster: &Cluster) -> Result<BTreeMap<(String, String), u32>> {
    let out = fleetctl_ok(cluster, &["start", &fixture_arg("v1/roll.service")])?;
    assert!(out.stdout.contains("roll.service"), "{out:?}");
    let h1 = hash_of(&fixture_text("v1/roll.service")?)?;
    let n = cluster.machines().len();
    let rows = wait_units(cluster, "roll.service v1 on every machine", |rows| {
        rows.len() == n
            && rows.iter().all(|r| r.active == "active" && r.hash == h1)
            && rows
                .iter()
                .map(|r| &r.machine)
                .collect::<BTreeSet<_>>()
                .len()
                == n
    })?;
    pids(cluster, &rows)
}

/// Runs `fleetctl args` while a thread samples how many machines run roll.service.
fn roll_sampled(cluster: &Cluster, args: &[&str]) -> Result<(Run, Vec<usize>)> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| sample_active(cluster, "roll.service", &stop));
        let run = fleetctl(cluster, args);
        stop.store(true, Ordering::SeqCst);
        let rounds = sampler.join().unwrap_or_default();
        Ok((run?, rounds))
    })
}

#[test]
fn a_rolling_replace_of_a_global_unit_keeps_two_of_three_machines_running_and_ends_on_the_new_version()
-> Result<()> {
    let cluster = start(3)?;
    let before = start_roll(&cluster)?;
    let since = now_us();
    let v2 = fixture_arg("v2/roll.service");
    // `--rolling` last: before the unit it would take the path as its N.
    let (out, rounds) = roll_sampled(
        &cluster,
        &[
            "start",
            "--replace",
            "--block-attempts",
            BLOCK_ATTEMPTS,
            &v2,
            "--rolling",
        ],
    )?;
    ensure!(out.success, "rolling replace failed: {out:?}");
    for m in cluster.machines() {
        assert!(
            out.stdout
                .contains(&format!("Unit roll.service replaced on {}\n", short(m))),
            "{out:?}"
        );
    }
    assert!(
        out.stdout
            .contains("Unit roll.service replaced on all 3 machine(s)"),
        "{out:?}"
    );

    let h2 = hash_of(&fixture_text("v2/roll.service")?)?;
    let rows = wait_units(&cluster, "roll.service v2 on every machine", |rows| {
        rows.len() == 3 && rows.iter().all(|r| r.active == "active" && r.hash == h2)
    })?;
    let after = pids(&cluster, &rows)?;
    for (key, pid) in &before {
        assert_ne!(after.get(key), Some(pid), "{key:?} was not restarted");
    }
    assert_eq!(
        file_row(&list_unit_files(&cluster)?, "roll.service")?.hash,
        h2
    );

    // Exactly: each machine was down once, and never two at the same time.
    let mut all = Vec::new();
    let mut by_machine = BTreeMap::new();
    for m in cluster.machines() {
        let periods = wait_for_value(TIMEOUT, POLL, || {
            let events = job_events(m, "roll.service", since).ok()?;
            let periods = down_periods(&events);
            periods.iter().all(|p| p.1 != u64::MAX).then_some(periods)
        })
        .with_context(|| format!("roll.service never came back on {}", m.name()))?;
        assert_eq!(periods.len(), 1, "{}: {periods:?}", m.name());
        all.extend(periods.iter().copied());
        by_machine.insert(m.name().to_owned(), periods);
    }
    assert_eq!(
        max_overlap(&all),
        1,
        "more than one machine was down at once (µs since the epoch): {by_machine:#?}"
    );
    // Sampled one machine after the other, so only the gross failure is certain here: every
    // machine down at once (the journal check above is the exact one).
    assert!(!rounds.is_empty());
    assert!(
        rounds.iter().all(|&n| n >= 1),
        "no machine ran roll.service at some point: {rounds:?}"
    );
    finish(cluster)
}

#[test]
fn a_rolling_replace_whose_new_version_fails_stops_after_the_first_machine_and_leaves_the_others_alone()
-> Result<()> {
    let cluster = start(3)?;
    let before = start_roll(&cluster)?;
    let since = now_us();
    let h1 = hash_of(&fixture_text("v1/roll.service")?)?;
    let bad_text = fixture_text("bad/roll.service")?;
    let bad = hash_of(&bad_text)?;
    let (out, rounds) = roll_sampled(
        &cluster,
        &[
            "start",
            "--replace",
            "--block-attempts",
            BLOCK_ATTEMPTS,
            &fixture_arg("bad/roll.service"),
            "--rolling",
        ],
    )?;
    assert!(!out.success, "a failing roll exited 0: {out:?}");
    assert!(
        out.stderr.contains(
            "Rolling replace of roll.service stopped: 2 machine(s) still run the previous version"
        ),
        "{out:?}"
    );
    assert!(
        out.stderr.contains("Unit roll.service failed on "),
        "{out:?}"
    );

    let rows = list_units(&cluster)?;
    let failed: Vec<&UnitRow> = rows.iter().filter(|r| r.hash == bad).collect();
    assert_eq!(failed.len(), 1, "{rows:#?}");
    assert_ne!(failed[0].active, "active", "{rows:#?}");
    let broken = cluster.machine(&failed[0].machine)?;
    // Only after the failed machine has been retried once (a later, positive event): the roll
    // went no further.
    wait_for(TIMEOUT, POLL, || {
        job_events(broken, "roll.service", since)
            .is_ok_and(|e| e.iter().filter(|(_, id)| id == MSG_FAILED).count() >= 2)
    })
    .context("the failed machine was never retried")?;
    let rows = list_units(&cluster)?;
    assert_eq!(rows.len(), 3, "{rows:#?}");
    let mut survivors = 0;
    for r in rows.iter().filter(|r| r.machine != broken.name()) {
        assert_eq!(
            (r.active.as_str(), r.hash.as_str()),
            ("active", h1.as_str()),
            "{rows:#?}"
        );
        let m = cluster.machine(&r.machine)?;
        let key = (r.unit.clone(), r.machine.clone());
        assert_eq!(
            Some(&pid(m, &r.unit)?),
            before.get(&key),
            "{key:?} restarted"
        );
        let events = job_events(m, "roll.service", since)?;
        assert!(
            down_periods(&events).is_empty(),
            "{} stopped: {events:?}",
            m.name()
        );
        survivors += 1;
    }
    assert_eq!(survivors, 2);
    assert_eq!(
        file_row(&list_unit_files(&cluster)?, "roll.service")?.hash,
        bad
    );
    assert!(
        rounds.iter().all(|&n| n >= 2),
        "fewer than 2 machines ran roll.service at some point: {rounds:?}"
    );
    finish(cluster)
}

/// `fleetctl start --replace --rolling web.service`, as the issue and the docs write it, must
/// roll `web.service`, not read it as the optional N of `--rolling[=N]`. No cluster needed:
/// the command line is parsed before anything is asked of etcd (which is unreachable here).
#[test]
fn rolling_written_before_the_unit_is_a_flag_and_does_not_swallow_the_unit_name() -> Result<()> {
    let fleetctl = fleet_functional_tests::default_bin_dir().join("fleetctl");
    let child = Command::new(&fleetctl)
        // etcd's driver named: port 9 is not etcd's, so fleetctl would pick the API.
        .args(["--driver", "etcd", "--endpoint", "http://127.0.0.1:9"])
        .args(["start", "--replace", "--rolling", "web.service"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", fleetctl.display()))?;
    let out = collect(child, "start --replace --rolling web.service")?;
    assert!(!out.success, "etcd is unreachable: {out:?}");
    assert!(
        !out.stderr.contains("invalid value") && out.stderr.contains("etcd unreachable"),
        "the unit name was taken for --rolling's N: {out:?}"
    );
    Ok(())
}

/// A replace must reach a unit that failed and waits for its retry: going back to a working
/// version after a failed roll is the obvious next step, and must not wait for the agent's
/// retry backoff (which doubles up to 60 s).
#[test]
fn a_failing_unit_replaced_by_a_working_version_starts_at_once_not_after_its_retry_backoff()
-> Result<()> {
    let cluster = start(1)?;
    let m = &cluster.machines()[0];
    let v1 = fixture_arg("v1/mend.service");
    fleetctl_ok(
        &cluster,
        &["start", "--block-attempts", BLOCK_ATTEMPTS, &v1],
    )?;
    let since = now_us();
    let out = fleetctl(
        &cluster,
        &[
            "start",
            "--replace",
            "--block-attempts",
            BLOCK_ATTEMPTS,
            &fixture_arg("bad/mend.service"),
        ],
    )?;
    assert!(!out.success, "{out:?}");
    assert!(out.stderr.contains("failed to start"), "{out:?}");
    // Five failures: the retry delays are jittered (each drawn from [1 s, 3 x the last],
    // capped at 60 s), so the fifth comes after ~20 s on average but may take up to ~100 s;
    // after it the next retry is likely well beyond the 8 s the mend below may take.
    wait_for(Duration::from_secs(150), POLL, || {
        job_events(m, "mend.service", since)
            .is_ok_and(|e| e.iter().filter(|(_, id)| id == MSG_FAILED).count() >= 5)
    })
    .context("mend.service was not retried 4 times")?;

    let asked = Instant::now();
    // Mend it: the working version, from its own file (the registry holds the bad one).
    let tmp = workdir(&cluster, "mend")?;
    let text = format!("{}\n# mended\n", fixture_text("v1/mend.service")?);
    let path = write_unit(&tmp, "mend.service", &text)?;
    let out = fleetctl(
        &cluster,
        &["start", "--replace", "--block-attempts", "4", &path],
    )?;
    let took = asked.elapsed();
    ensure!(
        out.success,
        "the working version did not start within 8 s (the agent waits for the failed \
         version's retry backoff?): {out:?}\nfleetd about mend.service:\n{}",
        strip_ansi(&m.journal(&["-u", "fleetd", "-o", "cat"])?)
            .lines()
            .filter(|l| l.contains("mend.service") && !l.contains("executing task"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let rows = list_units(&cluster)?;
    let row = row_of(&rows, "mend.service").with_context(|| format!("{rows:#?}"))?;
    assert_eq!(
        (row.active.as_str(), row.hash.as_str()),
        ("active", hash_of(&text)?.as_str()),
        "{took:?}"
    );
    finish(cluster)
}

// --- without restart -----------------------------------------------------------------------

#[test]
fn a_replace_without_restart_keeps_the_process_loads_the_file_and_the_next_restart_runs_it()
-> Result<()> {
    let cluster = start(1)?;
    let m = &cluster.machines()[0];
    fleetctl_ok(
        &cluster,
        &[
            "start",
            "--block-attempts",
            BLOCK_ATTEMPTS,
            &fixture_arg("v1/calm.service"),
        ],
    )?;
    let h1 = hash_of(&fixture_text("v1/calm.service")?)?;
    let h2 = hash_of(&fixture_text("v2/calm.service")?)?;
    wait_units(&cluster, "calm.service v1 active", |rows| {
        row_of(rows, "calm.service").is_some_and(|r| r.active == "active" && r.hash == h1)
    })?;
    let old = pid(m, "calm.service")?;
    assert!(environ(m, old)?.lines().any(|l| l == "CALM_VERSION=1"));

    let out = fleetctl_ok(
        &cluster,
        &[
            "start",
            "--replace",
            "--no-restart",
            "--block-attempts",
            BLOCK_ATTEMPTS,
            &fixture_arg("v2/calm.service"),
        ],
    )?;
    assert!(
        out.stdout.contains(&format!(
            "Unit calm.service replaced in place on {}",
            short(m)
        )) && out.stdout.contains("without restart"),
        "{out:?}"
    );
    let rows = wait_units(
        &cluster,
        "calm.service v2 in place, restart pending",
        |rows| {
            row_of(rows, "calm.service")
                .is_some_and(|r| r.active == "active" && r.hash == h2 && r.pending == "restart")
        },
    )?;
    assert_eq!(rows.len(), 1);
    assert_eq!(pid(m, "calm.service")?, old, "the process was restarted");
    let shown = m.systemctl_ok(&["cat", "calm.service"])?;
    assert!(
        shown.contains("CALM_VERSION=2"),
        "systemd has not the new file: {shown}"
    );
    let reload = m.systemctl_ok(&[
        "show",
        "--property=NeedDaemonReload",
        "--value",
        "calm.service",
    ])?;
    assert_eq!(reload.trim(), "no", "systemd was not reloaded");
    assert!(environ(m, old)?.lines().any(|l| l == "CALM_VERSION=1"));
    assert_eq!(
        file_row(&list_unit_files(&cluster)?, "calm.service")?.hash,
        h2
    );

    let out = fleetctl_ok(
        &cluster,
        &[
            "restart",
            "--block-attempts",
            BLOCK_ATTEMPTS,
            "calm.service",
        ],
    )?;
    assert!(
        out.stdout.contains("Unit calm.service restarted on"),
        "{out:?}"
    );
    wait_units(
        &cluster,
        "calm.service v2 restarted, nothing pending",
        |rows| {
            row_of(rows, "calm.service")
                .is_some_and(|r| r.active == "active" && r.hash == h2 && r.pending == "-")
        },
    )?;
    let new = pid(m, "calm.service")?;
    assert_ne!(new, old, "restart kept the old process");
    assert!(
        environ(m, new)?.lines().any(|l| l == "CALM_VERSION=2"),
        "the restarted process is not version 2"
    );
    finish(cluster)
}

// --- templates -----------------------------------------------------------------------------

#[test]
fn replacing_a_template_leaves_its_running_instances_alone_until_each_is_replaced() -> Result<()> {
    let cluster = start(2)?;
    let t1 = fixture_text("v1/tpl@.service")?;
    let t2 = fixture_text("v2/tpl@.service")?;
    let (h1, h2) = (hash_of(&t1)?, hash_of(&t2)?);
    // No files here: instance content comes from the template in the registry.
    let none = workdir(&cluster, "tpl-none")?;
    fleetctl_ok(&cluster, &["submit", &fixture_arg("v1/tpl@.service")])?;
    command(
        &cluster,
        &["start", "--block-attempts", BLOCK_ATTEMPTS],
        &instances(&none, "tpl", 1..=3),
    )?;
    let rows = wait_units(&cluster, "tpl@1..3 active on version 1", |rows| {
        rows.len() == 3 && rows.iter().all(|r| r.active == "active" && r.hash == h1)
    })?;
    let first = pids(&cluster, &rows)?;

    let out = fleetctl_ok(
        &cluster,
        &["submit", "--replace", &fixture_arg("v2/tpl@.service")],
    )?;
    assert!(out.stdout.contains("Unit tpl@.service inactive"), "{out:?}");
    let files = list_unit_files(&cluster)?;
    assert_eq!(file_row(&files, "tpl@.service")?.hash, h2, "{files:#?}");
    for i in 1..=3 {
        let name = format!("tpl@{i}.service");
        assert_eq!(file_row(&files, &name)?.hash, h1, "{files:#?}");
        assert_eq!(cat(&cluster, &name)?, canonical(&t1)?);
    }

    // One instance takes the new template from the registry; the others are untouched.
    let out = command(
        &cluster,
        &["start", "--replace", "--block-attempts", BLOCK_ATTEMPTS],
        &instances(&none, "tpl", [2]),
    )?;
    assert!(
        out.stdout
            .contains("Unit tpl@2.service replaced in place on"),
        "{out:?}"
    );
    let rows = wait_units(&cluster, "tpl@2 on version 2, the others on 1", |rows| {
        rows.len() == 3
            && rows.iter().all(|r| {
                r.active == "active" && &r.hash == if r.unit == "tpl@2.service" { &h2 } else { &h1 }
            })
    })?;
    let second = pids(&cluster, &rows)?;
    for (key, pid) in &first {
        if key.0 == "tpl@2.service" {
            assert_ne!(second.get(key), Some(pid), "tpl@2 was not restarted");
        } else {
            assert_eq!(second.get(key), Some(pid), "{key:?} restarted");
        }
    }
    assert_eq!(cat(&cluster, "tpl@2.service")?, canonical(&t2)?);
    let files = list_unit_files(&cluster)?;
    for i in [1, 3] {
        assert_eq!(file_row(&files, &format!("tpl@{i}.service"))?.hash, h1);
    }

    // Many instances in one command: two replaced, one already new, one created.
    let out = command(
        &cluster,
        &["start", "--replace", "--block-attempts", BLOCK_ATTEMPTS],
        &instances(&none, "tpl", 1..=4),
    )?;
    assert!(
        out.stdout
            .contains("Found same Unit(tpl@2.service) in Registry, nothing to do"),
        "{out:?}"
    );
    let rows = wait_units(&cluster, "tpl@1..4 on version 2", |rows| {
        rows.len() == 4 && rows.iter().all(|r| r.active == "active" && r.hash == h2)
    })?;
    let third = pids(&cluster, &rows)?;
    for (key, pid) in &second {
        if key.0 == "tpl@2.service" {
            assert_eq!(third.get(key), Some(pid), "tpl@2 restarted");
        } else {
            assert_ne!(third.get(key), Some(pid), "{key:?} was not restarted");
        }
    }
    for i in 1..=4 {
        assert_eq!(cat(&cluster, &format!("tpl@{i}.service"))?, canonical(&t2)?);
    }
    finish(cluster)
}

/// fleet#1691: the template is in the registry and was edited locally; `start --replace` of a
/// running instance must run the local template's new content (fleet said "Found same Unit",
/// exited 0 and kept the old one). Without `--replace`, a new instance takes the registry's
/// template and fleetctl warns that the local one differs.
#[test]
fn start_replace_of_an_instance_runs_the_edited_local_template() -> Result<()> {
    let cluster = start(2)?;
    let t1 = fixture_text("v1/tpl@.service")?;
    let t2 = fixture_text("v2/tpl@.service")?;
    let (h1, h2) = (hash_of(&t1)?, hash_of(&t2)?);
    let dir = workdir(&cluster, "tpl-local")?;
    let template = write_unit(&dir, "tpl@.service", &t1)?;
    fleetctl_ok(&cluster, &["submit", &template])?;
    command(
        &cluster,
        &["start", "--block-attempts", BLOCK_ATTEMPTS],
        &instances(&dir, "tpl", [2]),
    )?;
    let rows = wait_units(&cluster, "tpl@2 active on version 1", |rows| {
        row_of(rows, "tpl@2.service").is_some_and(|r| r.active == "active" && r.hash == h1)
    })?;
    let before = pids(&cluster, &rows)?;

    write_unit(&dir, "tpl@.service", &t2)?;
    let out = command(
        &cluster,
        &["start", "--block-attempts", BLOCK_ATTEMPTS],
        &instances(&dir, "tpl", [3]),
    )?;
    assert!(
        out.stderr.contains(
            "WARNING: Unit tpl@.service in registry differs from local template unit file"
        ),
        "{out:?}"
    );

    let out = command(
        &cluster,
        &["start", "--replace", "--block-attempts", BLOCK_ATTEMPTS],
        &instances(&dir, "tpl", [2]),
    )?;
    assert!(
        out.stdout
            .contains("Unit tpl@2.service replaced in place on"),
        "{out:?}"
    );
    let rows = wait_units(&cluster, "tpl@2 on version 2, tpl@3 on 1", |rows| {
        row_of(rows, "tpl@2.service").is_some_and(|r| r.active == "active" && r.hash == h2)
            && row_of(rows, "tpl@3.service").is_some_and(|r| r.active == "active" && r.hash == h1)
    })?;
    let row = row_of(&rows, "tpl@2.service").context("tpl@2 row")?;
    let m = cluster.machine(&row.machine)?;
    let now = pid(m, "tpl@2.service")?;
    assert_ne!(
        before.get(&("tpl@2.service".to_owned(), row.machine.clone())),
        Some(&now),
        "tpl@2 was not restarted"
    );
    assert!(
        environ(m, now)?.lines().any(|l| l == "TPL_VERSION=2"),
        "the running tpl@2 is not the local template's version 2"
    );
    assert_eq!(cat(&cluster, "tpl@2.service")?, canonical(&t2)?);
    assert_eq!(
        file_row(&list_unit_files(&cluster)?, "tpl@.service")?.hash,
        h1,
        "the registry's template is left as it was"
    );
    finish(cluster)
}

// --- concurrent replaces -------------------------------------------------------------------

/// `O_NONBLOCK` (Linux): opening a FIFO for writing fails with `ENXIO` until a reader has it
/// open, instead of blocking.
const O_NONBLOCK: i32 = 0o4000;
const ENXIO: i32 = 6;

/// Two threads meeting: each waits (at most `timeout`) until both arrived.
#[derive(Debug, Default)]
struct Gate {
    arrived: Mutex<usize>,
    all: Condvar,
}

impl Gate {
    fn arrive_and_wait(&self, timeout: Duration) -> bool {
        let mut n = self.arrived.lock().unwrap_or_else(|e| e.into_inner());
        *n += 1;
        self.all.notify_all();
        let (n, _) = self
            .all
            .wait_timeout_while(n, timeout, |n| *n < 2)
            .unwrap_or_else(|e| e.into_inner());
        *n >= 2
    }
}

/// Serves `content` to the first reader of the FIFO at `path`, then leaves a regular file
/// with the same content there for any later read. The first open waits at `gate`: fleetctl
/// reads the unit from the registry before it reads the local file, so once both processes
/// have opened their FIFO, both have read the same registry revision and both will write
/// against it. Returns whether the gate met (false: no reader came before `done` or the
/// deadline, or the other one did not come within 20 s).
fn serve_fifo(path: &Path, content: &str, done: &AtomicBool, gate: &Gate) -> Result<bool> {
    let deadline = Instant::now() + FLEETCTL_TIMEOUT;
    while !done.load(Ordering::SeqCst) && Instant::now() < deadline {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(O_NONBLOCK)
            .open(path);
        let mut fifo = match file {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(ENXIO) => {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
        };
        let met = gate.arrive_and_wait(Duration::from_secs(20));
        // The FIFO is never opened again (a second writer could reach the same read): later
        // opens find a plain file. The reader holding the FIFO is not affected by the rename.
        let plain = path.with_extension("plain");
        std::fs::write(&plain, content)?;
        std::fs::rename(&plain, path)?;
        // Far below the pipe's capacity: written at once; closing it is the reader's EOF.
        fifo.write_all(content.as_bytes())?;
        return Ok(met);
    }
    Ok(false)
}

#[test]
fn of_two_clients_replacing_the_same_unit_at_once_exactly_one_wins_and_the_other_is_told()
-> Result<()> {
    let cluster = start(1)?;
    let m = &cluster.machines()[0];
    let base = workdir(&cluster, "race")?;
    let version = |who: &str| {
        format!(
            "[Unit]\nDescription=Raced unit, version {who}\n\n[Service]\n\
             Environment=RACE={who}\nExecStart=/bin/sleep infinity\n"
        )
    };
    let v0 = version("0");
    let path = write_unit(&base, "race.service", &v0)?;
    fleetctl_ok(
        &cluster,
        &["start", "--block-attempts", BLOCK_ATTEMPTS, &path],
    )?;
    wait_units(&cluster, "race.service active", |rows| {
        row_of(rows, "race.service").is_some_and(|r| r.active == "active")
    })?;

    let racers = ["a", "b"];
    let texts: Vec<String> = racers.iter().map(|who| version(who)).collect();
    let mut fifos = Vec::new();
    for who in racers {
        let dir = base.join(who);
        std::fs::create_dir_all(&dir)?;
        let fifo = dir.join("race.service");
        let out = Command::new("mkfifo").arg(&fifo).output()?;
        ensure!(out.status.success(), "mkfifo {}: {out:?}", fifo.display());
        fifos.push(fifo);
    }
    let gate = Gate::default();
    let done = AtomicBool::new(false);
    let (runs, served) = std::thread::scope(|s| -> Result<_> {
        let mut children = Vec::new();
        let mut servers = Vec::new();
        for (fifo, text) in fifos.iter().zip(&texts) {
            let arg = fifo.display().to_string();
            let child = spawn_fleetctl(
                &cluster,
                &[
                    "start",
                    "--replace",
                    "--block-attempts",
                    BLOCK_ATTEMPTS,
                    &arg,
                ],
            )?;
            let (gate, done) = (&gate, &done);
            servers.push(s.spawn(move || serve_fifo(fifo, text, done, gate)));
            children.push(child);
        }
        let runs: Vec<Result<Run>> = children
            .into_iter()
            .map(|c| collect(c, "start --replace race.service"))
            .collect();
        done.store(true, Ordering::SeqCst);
        let served: Vec<_> = servers
            .into_iter()
            .map(|t| {
                t.join()
                    .map_err(|_| anyhow::anyhow!("FIFO server panicked"))?
            })
            .collect::<Result<_>>()?;
        Ok((runs.into_iter().collect::<Result<Vec<_>>>()?, served))
    })?;
    assert!(
        served.iter().all(|met| *met),
        "the two fleetctl did not both read the registry before writing: {served:?}"
    );

    let winners: Vec<usize> = (0..2).filter(|&i| runs[i].success).collect();
    if winners.len() != 1 {
        let units = fleetctl(&cluster, &["list-units", "--full"])?;
        let files = fleetctl(&cluster, &["list-unit-files", "--full"])?;
        let log = strip_ansi(&m.journal(&["-u", "fleetd", "-o", "cat"])?);
        let log: Vec<&str> = log.lines().filter(|l| l.contains("race")).collect();
        let unit_log = m.journal(&["-u", "race.service", "-o", "short-precise"])?;
        bail!(
            "not exactly one winner: {runs:#?}\nlist-units: {}\nlist-unit-files: {}\n\
             fleetd:\n{}\nrace.service:\n{unit_log}",
            units.stdout,
            files.stdout,
            log.join("\n")
        );
    }
    let (win, lose) = (winners[0], 1 - winners[0]);
    assert!(
        runs[win]
            .stdout
            .contains("Unit race.service replaced in place on"),
        "{runs:#?}"
    );
    assert!(
        runs[lose].stderr.contains("changed concurrently")
            && runs[lose].stderr.contains("nothing was written"),
        "the loser was not told: {runs:#?}"
    );

    // Nothing of the loser's version anywhere; the winner's everywhere.
    let registry = TestRegistry::of(&cluster)?;
    let loser_hash = unit_hash(&texts[lose])?;
    let stored = registry.block_on(registry.registry().file(&loser_hash))?;
    assert!(stored.is_none(), "the loser's file was stored");
    assert_eq!(cat(&cluster, "race.service")?, canonical(&texts[win])?);
    let win_hash = hash_of(&texts[win])?;
    assert_eq!(
        file_row(&list_unit_files(&cluster)?, "race.service")?.hash,
        win_hash
    );
    let rows = wait_units(
        &cluster,
        "race.service active with the winner's hash",
        |rows| {
            rows.len() == 1
                && row_of(rows, "race.service")
                    .is_some_and(|r| r.active == "active" && r.hash == win_hash)
        },
    )?;
    assert_eq!(rows[0].machine, m.name());
    let p = pid(m, "race.service")?;
    assert!(
        environ(m, p)?
            .lines()
            .any(|l| l == format!("RACE={}", racers[win]))
    );

    // Told to try again, the loser does, and wins.
    let again = write_unit(&base, "race.service", &texts[lose])?;
    let out = fleetctl_ok(
        &cluster,
        &[
            "start",
            "--replace",
            "--block-attempts",
            BLOCK_ATTEMPTS,
            &again,
        ],
    )?;
    assert!(out.stdout.contains("replaced in place"), "{out:?}");
    assert_eq!(cat(&cluster, "race.service")?, canonical(&texts[lose])?);
    finish(cluster)
}
