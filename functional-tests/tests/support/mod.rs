//! What the fault, bad-input and TLS tests share: booting a registered cluster, reading
//! machines' journals and units in bulk, raw etcd reads and the replay of etcd's history to
//! check an invariant at every revision, and a seeded random source for fault injection.
//!
//! Each test file uses a different part of it.
#![allow(dead_code)]

use anyhow::{Context, Result, bail, ensure};
use fleet_core::MachineId;
use fleet_functional_tests::{
    Cluster, ClusterSpec, FleetdSpec, Machine, OutputExt, TestRegistry, cleanup_stale, leftovers,
    wait_for, wait_for_value,
};
use fleet_registry::kv::{EventKind, Kv, Revision, Txn, TxnOp, WatchMessage};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

pub const TIMEOUT: Duration = Duration::from_secs(30);
pub const POLL: Duration = Duration::from_millis(50);
pub const UNITS_DIR: &str = "/run/fleet/units";
pub const RUNTIME_UNIT_DIR: &str = "/run/systemd/system";
/// fleet's default key prefix, where every raw read of these tests looks.
pub const PREFIX: &str = "/_coreos.com/fleet/";

/// The systemd messages of a job on a unit (start, stop, restart, reload).
const JOB_MESSAGES: &[&str] = &[
    "Starting ",
    "Started ",
    "Stopping ",
    "Stopped ",
    "Reloading ",
    "Reloaded ",
    "Deactivated ",
];

/// A unit file running a long sleep; `seconds` makes its content (and hash) distinct.
pub fn sleeper(seconds: u32) -> String {
    format!("[Service]\nExecStart=/bin/sleep {seconds}\n")
}

/// A cluster of `machines` running fleetd as `spec` says, every machine registered, and a
/// registry client.
pub fn start(machines: usize, spec: FleetdSpec) -> Result<(Cluster, TestRegistry)> {
    cleanup_stale()?;
    let cluster = Cluster::start(ClusterSpec::with_fleetd(machines, spec))?;
    let registry = TestRegistry::of(&cluster)?;
    wait_registered(&cluster, &registry)?;
    Ok((cluster, registry))
}

/// Waits until every running machine of the cluster has a live presence.
pub fn wait_registered(cluster: &Cluster, registry: &TestRegistry) -> Result<()> {
    let ids: Vec<MachineId> = cluster
        .machines()
        .iter()
        .filter(|m| m.is_up())
        .map(|m| m.id().clone())
        .collect();
    wait_for(TIMEOUT, POLL, || {
        registry
            .machine_ids()
            .is_ok_and(|live| ids.iter().all(|id| live.contains(id)))
    })
    .context("fleetd did not register every machine")
}

/// Tears the cluster down and checks that nothing of it is left.
pub fn finish(cluster: Cluster) -> Result<()> {
    let state = cluster.state().clone();
    cluster.shutdown()?;
    let left = leftovers(&state)?;
    ensure!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}

/// What a fleetctl run printed.
#[derive(Debug, Clone)]
pub struct Run {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

pub fn fleetctl<S: AsRef<str>>(cluster: &Cluster, args: &[S]) -> Result<Run> {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    let out = cluster.fleetctl(&args)?;
    Ok(Run {
        success: out.status.success(),
        stdout: out.stdout_text(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Runs fleetctl and requires exit 0.
pub fn fleetctl_ok<S: AsRef<str>>(cluster: &Cluster, args: &[S]) -> Result<Run> {
    let run = fleetctl(cluster, args)?;
    let line: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    ensure!(run.success, "fleetctl {} failed: {run:?}", line.join(" "));
    Ok(run)
}

/// Removes terminal colour codes (fleetd's log is coloured).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The machine journal's current end, to read only what comes after it.
pub fn journal_cursor(machine: &Machine) -> Result<String> {
    let out = machine.journal(&["-n", "0", "--show-cursor"])?;
    out.lines()
        .find_map(|l| l.strip_prefix("-- cursor: "))
        .map(str::to_owned)
        .with_context(|| format!("no cursor in {out:?}"))
}

/// What the journal says about `unit` after `cursor` (message text only).
pub fn journal_after(machine: &Machine, unit: &str, cursor: &str) -> Result<String> {
    let after = format!("--after-cursor={cursor}");
    let text = machine.journal(&["-u", unit, "-o", "cat", &after])?;
    Ok(strip_ansi(&text))
}

/// fleetd's log after `cursor`.
pub fn fleetd_log(machine: &Machine, cursor: &str) -> Result<String> {
    journal_after(machine, "fleet.service", cursor)
}

/// fleetd's whole log since the machine booted: for a line that can only come after a step
/// of the test, so that no cursor is needed. A line logged within milliseconds of a cursor
/// taken with `journalctl -n 0 --show-cursor` was seen to fall before it (the agent's refusal
/// of a unit scheduled just after the cursor, once its passes read only what changed).
pub fn fleetd_log_all(machine: &Machine) -> Result<String> {
    let text = machine.journal(&["-u", "fleet.service", "-o", "cat"])?;
    Ok(strip_ansi(&text))
}

/// fleetd's warnings and errors after `cursor`: under systemd it logs natively, so the level
/// is the entry's priority, not a word in the text.
pub fn fleetd_warnings(machine: &Machine, cursor: &str) -> Result<String> {
    let after = format!("--after-cursor={cursor}");
    let args = ["-u", "fleet.service", "-p", "warning", "-o", "cat", &after];
    Ok(strip_ansi(&machine.journal(&args)?))
}

/// Whether `log` has a line with `message` about `unit` (fleetd logs `unit=<name>`).
pub fn logged(log: &str, message: &str, unit: &str) -> bool {
    let field = format!("unit={unit}");
    log.lines()
        .any(|l| l.contains(message) && l.split_whitespace().any(|w| w == field))
}

/// Waits until everything systemd logged so far is in the journal: it logs about a transient
/// unit started now, through the same socket, after everything it logged before.
pub fn journal_barrier(machine: &Machine) -> Result<()> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let unit = format!(
        "journal-barrier-{}.service",
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    machine
        .exec("systemd-run", ["--quiet", "--unit", &unit, "/bin/true"])?
        .checked()
        .context("systemd-run of a journal barrier")?;
    wait_for(TIMEOUT, POLL, || {
        machine
            .journal(&["-u", &unit, "-o", "cat"])
            .is_ok_and(|log| !log.trim().is_empty())
    })
    .with_context(|| format!("{unit} never showed in the journal"))
}

/// Every systemd job message (start, stop, ...) about a unit matching `pattern` (a journalctl
/// `-u` glob) after `cursor`, as `(unit, message)`, once systemd's messages so far are all in
/// the journal.
pub fn jobs_after(machine: &Machine, pattern: &str, cursor: &str) -> Result<Vec<(String, String)>> {
    Ok(timed_jobs_after(machine, pattern, cursor)?
        .into_iter()
        .map(|j| (j.unit, j.message))
        .collect())
}

/// One systemd job message, with when it was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub unit: String,
    pub message: String,
    /// Microseconds since the epoch: the sender's time where the journal has it
    /// (`_SOURCE_REALTIME_TIMESTAMP`), else its arrival. Every machine shares the host's clock.
    pub at: u64,
}

/// [`jobs_after`], with each message's time.
///
/// The journal after `cursor` is read whole and filtered here: journalctl 252's `-u PATTERN`
/// together with `--after-cursor` returns only some of the matching entries (seen in
/// drain.rs: one "Started" of three).
pub fn timed_jobs_after(machine: &Machine, pattern: &str, cursor: &str) -> Result<Vec<Job>> {
    journal_barrier(machine)?;
    let after = format!("--after-cursor={cursor}");
    let text = machine.journal(&[
        "-o",
        "json",
        "--output-fields=MESSAGE,UNIT,_PID,_SOURCE_REALTIME_TIMESTAMP",
        &after,
    ])?;
    let mut jobs = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let entry: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("journal entry {line:?}"))?;
        let field = |k: &str| entry.get(k).and_then(|v| v.as_str()).unwrap_or_default();
        let message = field("MESSAGE");
        let unit = field("UNIT");
        if field("_PID") != "1"
            || !glob(pattern, unit)
            || !JOB_MESSAGES.iter().any(|m| message.starts_with(m))
        {
            continue;
        }
        let at = [
            field("_SOURCE_REALTIME_TIMESTAMP"),
            field("__REALTIME_TIMESTAMP"),
        ]
        .into_iter()
        .find_map(|t| t.parse().ok())
        .with_context(|| format!("journal entry without a time: {line:?}"))?;
        jobs.push(Job {
            unit: unit.to_owned(),
            message: message.to_owned(),
            at,
        });
    }
    Ok(jobs)
}

/// Whether `name` matches `pattern`, a journalctl `-u` glob (`*` and `?`). A pattern without
/// a unit type matches `.service` units, as journalctl's does.
fn glob(pattern: &str, name: &str) -> bool {
    fn matches(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => matches(&p[1..], n) || (!n.is_empty() && matches(p, &n[1..])),
            (Some(b'?'), Some(_)) => matches(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => matches(&p[1..], &n[1..]),
            _ => false,
        }
    }
    if name.is_empty() {
        return false;
    }
    let typed = pattern.contains('.') || pattern.ends_with('*');
    let pattern = if typed {
        pattern.to_owned()
    } else {
        format!("{pattern}.service")
    };
    matches(pattern.as_bytes(), name.as_bytes())
}

/// systemd's view of one unit on one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitView {
    pub load: String,
    pub active: String,
    pub sub: String,
    pub main_pid: String,
    pub invocation: String,
}

impl UnitView {
    pub fn is_active(&self) -> bool {
        self.active == "active"
    }

    /// MainPID and InvocationID: together they say "the very same run of the unit".
    pub fn identity(&self) -> (String, String) {
        (self.main_pid.clone(), self.invocation.clone())
    }
}

/// systemd's view of `units` on `machine`, in one `systemctl show` (unknown units come back
/// `not-found`/`inactive`).
pub fn units_on(machine: &Machine, units: &[String]) -> Result<BTreeMap<String, UnitView>> {
    if units.is_empty() {
        return Ok(BTreeMap::new());
    }
    let mut args = vec![
        "show".to_owned(),
        "-p".to_owned(),
        "Id,LoadState,ActiveState,SubState,MainPID,InvocationID".to_owned(),
    ];
    args.extend(units.iter().cloned());
    let out = machine
        .systemctl(&args)?
        .checked()
        .with_context(|| format!("in machine {}: systemctl show of {units:?}", machine.name()))?;
    let mut views = BTreeMap::new();
    for block in out.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let props: BTreeMap<&str, &str> = block.lines().filter_map(|l| l.split_once('=')).collect();
        let get = |k: &str| props.get(k).copied().unwrap_or_default().to_owned();
        views.insert(
            get("Id"),
            UnitView {
                load: get("LoadState"),
                active: get("ActiveState"),
                sub: get("SubState"),
                main_pid: get("MainPID"),
                invocation: get("InvocationID"),
            },
        );
    }
    Ok(views)
}

/// The files in `machine`'s units directory.
pub fn unit_files_on(machine: &Machine) -> Result<BTreeSet<String>> {
    let out = machine.sh(&format!("ls -A {UNITS_DIR} 2>/dev/null || true"))?;
    Ok(out.lines().map(str::to_owned).collect())
}

pub fn file_exists(machine: &Machine, path: &str) -> Result<bool> {
    Ok(machine.exec("test", ["-e", path])?.status.success()
        || machine.exec("test", ["-L", path])?.status.success())
}

/// Every key under `prefix` with its value, and the revision of that read.
pub fn dump(
    registry: &TestRegistry,
    prefix: &str,
) -> Result<(Revision, BTreeMap<String, Vec<u8>>)> {
    let res = registry
        .block_on(registry.registry().raw_kv().range(prefix, true, None))
        .with_context(|| format!("reading {prefix}"))?;
    let kvs = res.kvs.into_iter().map(|kv| (kv.key, kv.value)).collect();
    Ok((res.revision, kvs))
}

/// The machine ID in the engine's leader key, if any.
pub fn leader(registry: &TestRegistry) -> Result<Option<String>> {
    let key = registry.registry().keys().leader();
    let res = registry
        .block_on(registry.registry().raw_kv().range(&key, false, None))
        .context("reading the leader key")?;
    Ok(res
        .kvs
        .first()
        .map(|kv| String::from_utf8_lossy(&kv.value).trim().to_owned()))
}

/// A key under fleet's prefix that nothing in fleet reads: [`replay`] writes it to mark the
/// end of the history it checks.
const SENTINEL: &str = "/_coreos.com/fleet/zz-test-replay-end";

/// Replays etcd's history of everything under fleet's prefix from revision `from` (the state
/// read at `from` is the starting point) up to now, calling `check` with the revision and
/// every key and value after each revision. Returns how many revisions were checked. Needs a
/// history without compaction (the test etcd never compacts).
pub fn replay(
    registry: &TestRegistry,
    from: Revision,
    mut check: impl FnMut(Revision, &BTreeMap<String, Vec<u8>>) -> Result<()>,
) -> Result<usize> {
    let kv = registry.registry().raw_kv();
    // The end of the history: a write of ours, so the watch below has a last event to see.
    let put = Txn {
        compares: vec![],
        success: vec![TxnOp::Put {
            key: SENTINEL.to_owned(),
            value: Vec::new(),
            lease: None,
        }],
        failure: vec![],
    };
    let end = registry
        .block_on(kv.txn(put))
        .context("writing the replay sentinel")?
        .revision;
    let start = registry
        .block_on(kv.range(PREFIX, true, Some(from)))
        .with_context(|| format!("reading {PREFIX} at revision {from}"))?;
    let mut state: BTreeMap<String, Vec<u8>> =
        start.kvs.into_iter().map(|kv| (kv.key, kv.value)).collect();
    check(from, &state)?;
    let mut watch = registry
        .block_on(kv.watch(PREFIX, true, from + 1))
        .context("watching history")?;
    // Events grouped by revision: a transaction's events share one.
    let mut pending: Option<Revision> = None;
    let mut checked = 1;
    loop {
        let message = registry
            .block_on(async { tokio::time::timeout(TIMEOUT, watch.rx.recv()).await })
            .context("history watch stalled")?
            .context("history watch ended")?;
        let events = match message {
            WatchMessage::Events { events, .. } => events,
            WatchMessage::Compacted { compact_revision } => {
                bail!("history compacted at {compact_revision}")
            }
            WatchMessage::Broken => bail!("history watch broken"),
        };
        for event in events {
            let revision = event.kv.mod_revision;
            if let Some(p) = pending.filter(|p| *p != revision) {
                check(p, &state)?;
                checked += 1;
                pending = None;
            }
            if event.kv.key == SENTINEL {
                // An earlier replay's sentinel is not part of the cluster's history.
                if revision < end {
                    continue;
                }
                drop(watch);
                registry.delete_raw(SENTINEL)?;
                // Every revision in between changed something under the prefix (the test
                // etcd serves nothing else), so every one was checked.
                ensure!(
                    checked as i64 >= end - from,
                    "replayed {checked} revisions of {from}..{end}"
                );
                return Ok(checked);
            }
            pending = Some(revision);
            match event.kind {
                EventKind::Put => {
                    state.insert(event.kv.key, event.kv.value);
                }
                EventKind::Delete => {
                    state.remove(&event.kv.key);
                }
            }
        }
    }
}

/// The current revision of the cluster's etcd.
pub fn revision(registry: &TestRegistry) -> Result<Revision> {
    let res = registry
        .block_on(registry.registry().raw_kv().range("/", false, None))
        .context("reading the revision")?;
    Ok(res.revision)
}

/// A small seeded random source (xorshift64*): fault injection must be reproducible, so the
/// seed is printed and `FLEET_FAULT_SEED` replays a run.
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn from_env_or_time(test: &str) -> Rng {
        let seed = std::env::var("FLEET_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        eprintln!("{test}: FLEET_FAULT_SEED={seed}");
        Rng::from_seed(seed)
    }

    pub fn from_seed(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Waits until `machine`'s fleetd runs with a main PID other than `old`.
pub fn wait_fleetd_restarted(machine: &Machine, old: u32) -> Result<u32> {
    wait_for_value(TIMEOUT, POLL, || {
        machine
            .main_pid("fleet.service")
            .ok()
            .flatten()
            .filter(|pid| *pid != old)
    })
    .with_context(|| format!("fleetd on {} was not restarted", machine.name()))
}

/// What a unit should be, cluster-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Not in the registry (never submitted, or destroyed).
    Gone,
    /// In the registry, desired `inactive`: on no machine.
    Inactive,
    /// Desired `loaded`: its file on exactly one machine, not running.
    Loaded,
    /// Desired `launched`: running on exactly one machine.
    Launched,
}

/// Where a unit is in place, and which run of it (for launched units).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub machine: String,
    pub identity: (String, String),
}

/// Every running unit of `placed` is still active with the same MainPID and InvocationID
/// on the same machine.
pub fn unchanged(cluster: &Cluster, placed: &BTreeMap<String, Placed>) -> Result<()> {
    let names: Vec<String> = placed.keys().cloned().collect();
    for m in cluster.machines() {
        let views = units_on(m, &names)?;
        for (unit, was) in placed.iter().filter(|(_, p)| p.machine == m.name()) {
            let now = &views[unit];
            ensure!(
                now.is_active() && now.identity() == was.identity,
                "{unit} on {} changed: {was:?} -> {now:?}",
                m.name()
            );
        }
    }
    Ok(())
}

/// Checks that the cluster is exactly as `want` says, on the machines (systemd, units
/// directories) and in what agents publish; returns where each loaded or launched unit is.
/// `Err` says what is not there yet.
pub fn converged(
    cluster: &Cluster,
    registry: &TestRegistry,
    want: &BTreeMap<String, Want>,
) -> Result<BTreeMap<String, Placed>, String> {
    let names: Vec<String> = want.keys().cloned().collect();
    let mut views = BTreeMap::new();
    let mut files = BTreeMap::new();
    for m in cluster.machines().iter().filter(|m| m.is_up()) {
        views.insert(
            m.name().to_owned(),
            units_on(m, &names).map_err(|e| format!("{e:#}"))?,
        );
        files.insert(
            m.name().to_owned(),
            unit_files_on(m).map_err(|e| format!("{e:#}"))?,
        );
    }
    let states = registry.unit_states().map_err(|e| format!("{e:#}"))?;
    let units = registry
        .block_on(registry.registry().units())
        .map_err(|e| format!("{e:#}"))?;
    let hashes: BTreeMap<String, _> = units
        .items
        .iter()
        .map(|u| (u.name().to_string(), u.hash()))
        .collect();
    let machine_name = |id: &MachineId| {
        cluster
            .machines()
            .iter()
            .find(|m| m.id() == id)
            .map_or_else(|| id.to_string(), |m| m.name().to_owned())
    };
    let mut placed = BTreeMap::new();
    for (unit, want) in want {
        let with_file: Vec<&String> = files
            .iter()
            .filter(|(_, f)| f.contains(unit))
            .map(|(m, _)| m)
            .collect();
        let active: Vec<&String> = views
            .iter()
            .filter(|(_, v)| v.get(unit).is_some_and(UnitView::is_active))
            .map(|(m, _)| m)
            .collect();
        let published: Vec<_> = states
            .iter()
            .filter(|s| s.name.as_str() == unit)
            .map(|s| (machine_name(&s.machine), s))
            .collect();
        let in_registry = hashes.contains_key(unit);
        let shown = || {
            format!(
                "{unit} (want {want:?}): file on {with_file:?}, active on {active:?}, \
                 published {:?}, in registry {in_registry}",
                published
                    .iter()
                    .map(|(m, s)| format!("{m}:{}/{}", s.systemd.active, s.systemd.sub))
                    .collect::<Vec<_>>()
            )
        };
        match want {
            Want::Gone | Want::Inactive => {
                let ok = with_file.is_empty()
                    && active.is_empty()
                    && published.is_empty()
                    && in_registry == (*want == Want::Inactive);
                if !ok {
                    return Err(shown());
                }
            }
            Want::Loaded | Want::Launched => {
                let [machine] = with_file.as_slice() else {
                    return Err(shown());
                };
                let launched = *want == Want::Launched;
                let runs_there = if launched {
                    active.as_slice() == [*machine]
                } else {
                    active.is_empty()
                };
                let expected_active = if launched { "active" } else { "inactive" };
                let published_ok = matches!(
                    published.as_slice(),
                    [(m, s)] if m == *machine
                        && s.systemd.active == expected_active
                        && s.hash.is_some()
                        && s.hash == hashes.get(unit).copied()
                );
                if !(runs_there && published_ok) {
                    return Err(shown());
                }
                let view = &views[*machine][unit];
                placed.insert(
                    unit.clone(),
                    Placed {
                        machine: (*machine).clone(),
                        identity: view.identity(),
                    },
                );
            }
        }
    }
    Ok(placed)
}

/// Waits until [`converged`] holds; returns the placement.
pub fn wait_converged(
    cluster: &Cluster,
    registry: &TestRegistry,
    want: &BTreeMap<String, Want>,
    timeout: Duration,
) -> Result<BTreeMap<String, Placed>> {
    let mut last = String::new();
    wait_for_value(timeout, Duration::from_millis(200), || {
        match converged(cluster, registry, want) {
            Ok(placed) => Some(placed),
            Err(why) => {
                last = why;
                None
            }
        }
    })
    .with_context(|| {
        format!(
            "the cluster did not converge: {last}\n{}",
            fleetd_tails(cluster, 25)
        )
    })
}

/// The last `lines` lines of every running machine's fleetd log, for failure messages.
pub fn fleetd_tails(cluster: &Cluster, lines: usize) -> String {
    let n = lines.to_string();
    cluster
        .machines()
        .iter()
        .filter(|m| m.is_up())
        .map(|m| {
            let log = m
                .journal(&["-u", "fleet.service", "-o", "cat", "-n", &n])
                .map_or_else(|e| format!("{e:#}"), |l| strip_ansi(&l));
            format!("--- fleetd on {} ---\n{log}", m.name())
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes `<dir>/<name>` for each unit, for fleetctl to submit; returns the paths by name.
pub fn write_units(
    dir: &std::path::Path,
    units: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut paths = BTreeMap::new();
    for (name, text) in units {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        paths.insert(name.clone(), path.display().to_string());
    }
    Ok(paths)
}

/// One HTTP/1.1 request as plain text over `stream` (`Connection: close`, a JSON body), and
/// its status and JSON body (`Null` when empty): the clients that are written from fleet's
/// API document alone, with no client library between the document and the wire.
pub fn http_exchange(
    mut stream: impl std::io::Read + std::io::Write,
    host: &str,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<(u16, serde_json::Value)> {
    let body = body.map(serde_json::Value::to_string).unwrap_or_default();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8(raw)?;
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("no header end in {text:?}"))?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .context("no status")?
        .parse()?;
    let chunked = head
        .lines()
        .any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked"));
    let payload = if chunked {
        dechunk(rest)?
    } else {
        rest.to_owned()
    };
    let value = if payload.trim().is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_str(&payload).with_context(|| format!("body {payload:?}"))?
    };
    Ok((status, value))
}

fn dechunk(mut rest: &str) -> Result<String> {
    let mut out = String::new();
    loop {
        let (size, tail) = rest.split_once("\r\n").context("bad chunk")?;
        let size = usize::from_str_radix(size.trim(), 16)?;
        if size == 0 {
            return Ok(out);
        }
        out.push_str(tail.get(..size).context("short chunk")?);
        rest = tail.get(size + 2..).context("short chunk end")?;
    }
}
