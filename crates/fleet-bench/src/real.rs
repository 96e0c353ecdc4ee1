//! Helpers for the scenarios on real functional-test clusters (`e2e`, `one-agent`): boot one
//! on the release binaries, time fleetctl, read fleetd's memory and CPU time inside a machine.

use anyhow::{Context, Result, bail, ensure};
use fleet_functional_tests::{
    Cluster, ClusterSpec, FleetdSpec, Machine, OutputExt, TestRegistry, cleanup_stale, wait_for,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::report;
use crate::scale::{cpu_of_stat, rss_of_status};
use crate::sim::unit_text;

/// A booted cluster on the release binaries, with a registry client.
/// How fleetd runs in the benchmark's machines.
#[derive(Debug, Clone)]
pub struct FleetdOptions {
    /// fleetd's `agent_ttl` (`30s`, its default; the harness's own default is 3 s, for tests).
    pub agent_ttl: String,
    /// More environment for fleetd, `KEY=VALUE`.
    pub env: Vec<String>,
}

impl FleetdOptions {
    /// `agent_ttl 30s`, plus `MALLOC_ARENA_MAX=2` if given.
    pub fn describe(&self) -> String {
        let mut text = format!("`agent_ttl` {}", self.agent_ttl);
        for e in &self.env {
            text.push_str(&format!(", `{e}`"));
        }
        text
    }
}

pub fn boot(
    machines: usize,
    bin_dir: &Path,
    options: &FleetdOptions,
) -> Result<(Cluster, TestRegistry)> {
    cleanup_stale()?;
    let mut spec = FleetdSpec {
        bin_dir: bin_dir.to_path_buf(),
        agent_ttl: options.agent_ttl.clone(),
        ..FleetdSpec::default()
    };
    for e in &options.env {
        let (k, v) = e.split_once('=').context("--fleetd-env takes KEY=VALUE")?;
        spec = spec.with_env(k, v);
    }
    let cluster = Cluster::start(ClusterSpec::with_fleetd(machines, spec))?;
    let registry = TestRegistry::of(&cluster)?;
    wait_for(Duration::from_secs(30), Duration::from_millis(50), || {
        registry.machine_ids().is_ok_and(|m| m.len() == machines)
            && registry
                .block_on(registry.registry().leader())
                .is_ok_and(|l| l.is_some())
    })
    .context("fleetd did not register every machine and elect an engine")?;
    Ok((cluster, registry))
}

/// fleetd's main PID inside `machine`.
pub fn fleetd_pid(machine: &Machine) -> Result<u32> {
    let pid = machine.systemctl_ok(&["show", "--property=MainPID", "--value", "fleet.service"])?;
    let pid: u32 = pid.trim().parse().context("fleetd's MainPID")?;
    ensure!(pid != 0, "fleetd is not running in {}", machine.name());
    Ok(pid)
}

/// fleetd's resident memory in `machine`, MiB.
pub fn fleetd_rss(machine: &Machine) -> Result<f64> {
    let pid = fleetd_pid(machine)?;
    Ok(rss_of_status(
        &machine.sh(&format!("cat /proc/{pid}/status"))?,
    ))
}

/// fleetd's CPU time (user + system) so far in `machine`, seconds.
pub fn fleetd_cpu(machine: &Machine) -> Result<f64> {
    let pid = fleetd_pid(machine)?;
    Ok(cpu_of_stat(&machine.sh(&format!("cat /proc/{pid}/stat"))?))
}

/// Runs fleetctl with `args`; how long it took. Fails if it fails.
pub fn fleetctl_timed<S: AsRef<std::ffi::OsStr>>(
    cluster: &Cluster,
    args: &[S],
) -> Result<Duration> {
    let t0 = Instant::now();
    let out = cluster.fleetctl(args)?;
    let took = t0.elapsed();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        let tail: String = text.lines().rev().take(5).collect::<Vec<_>>().join(" / ");
        bail!("fleetctl {} failed: {tail}", first_arg(args));
    }
    Ok(took)
}

fn first_arg<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> String {
    args.first()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A fresh directory for a scenario's unit files, under target/bench.
pub fn unit_dir(name: &str) -> Result<PathBuf> {
    let dir = report::work_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Writes `bench-<i>.service` for every i in `range` (generation `generation`); their paths.
pub fn write_units(
    dir: &Path,
    range: std::ops::Range<usize>,
    generation: u32,
) -> Result<Vec<PathBuf>> {
    range
        .map(|i| {
            let path = dir.join(format!("bench-{i:05}.service"));
            std::fs::write(&path, unit_text(i, generation))?;
            Ok(path)
        })
        .collect()
}

/// How many `bench-*` units `machine`'s systemd has active (running), and how many of them
/// run generation `generation` (their description says which).
pub fn active_bench_units(machine: &Machine, generation: u32) -> Result<(usize, usize)> {
    let out = machine
        .systemctl([
            "list-units",
            "bench-*",
            "--state=active",
            "--no-legend",
            "--plain",
        ])?
        .checked()?;
    let lines: Vec<&str> = out.lines().filter(|l| l.contains(" running ")).collect();
    let tag = format!("generation {generation}");
    let current = lines.iter().filter(|l| l.contains(&tag)).count();
    Ok((lines.len(), current))
}

/// fleetd's unique name on `machine`'s system bus (for dbus-monitor).
pub fn fleetd_bus_name(machine: &Machine) -> Result<String> {
    let pid = fleetd_pid(machine)?.to_string();
    let out = machine.exec("busctl", ["--system", "list", "--no-legend", "--no-pager"])?;
    let out = out.checked()?;
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cols| cols.len() > 1 && cols[0].starts_with(':') && cols[1] == pid)
        .map(|cols| cols[0].to_owned())
        .context("fleetd has no connection on the system bus")
}

/// Counts the D-Bus method calls `sender` makes over `window`, by member, with dbus-monitor
/// inside `machine`.
pub fn count_method_calls(
    machine: &Machine,
    sender: &str,
    window: Duration,
) -> Result<std::collections::BTreeMap<String, u64>> {
    let script = format!(
        "timeout {} dbus-monitor --system \"type='method_call',sender='{sender}'\" || true",
        window.as_secs()
    );
    let out = machine.sh(&script)?;
    let mut by_member = std::collections::BTreeMap::new();
    for line in out.lines().filter(|l| l.starts_with("method call")) {
        let member = line
            .split("member=")
            .nth(1)
            .map_or("?", |m| m.split_whitespace().next().unwrap_or("?"));
        *by_member.entry(member.to_owned()).or_insert(0) += 1;
    }
    Ok(by_member)
}

/// systemd alone, for comparison with fleet's start, replace and destroy, on the machines
/// of `machines` at once (each machine's commands in a thread of its own).
#[derive(Debug, Clone, Copy, Default)]
pub struct Baseline {
    /// `systemctl start` of every unit, until every machine's command returned (systemctl
    /// waits for every job).
    pub start: Duration,
    /// New content written, then `systemctl daemon-reload` and `systemctl restart` of
    /// every unit: what fleet's `start --replace` does.
    pub restart: Duration,
    /// `systemctl stop` of every unit: what fleet's `destroy` does.
    pub stop: Duration,
}

/// Measures [`Baseline`] with `per_machine` units like the bench's in each machine, written
/// into `/run/systemd/system`; they are removed afterwards.
pub fn systemd_baseline(machines: &[Machine], per_machine: usize) -> Result<Baseline> {
    let names: Vec<String> = (0..per_machine)
        .map(|i| format!("base-{i:05}.service"))
        .collect();
    let write = |generation: u32| -> Result<()> {
        for m in machines {
            for (i, name) in names.iter().enumerate() {
                m.write_file(
                    &format!("/run/systemd/system/{name}"),
                    unit_text(i, generation),
                )?;
            }
        }
        Ok(())
    };
    let all = |verb: &'static str| {
        let mut args = vec![verb];
        args.extend(names.iter().map(String::as_str));
        args
    };
    write(1)?;
    at_once(machines, |m| m.systemctl_ok(&["daemon-reload"]).map(|_| ()))?;
    let start = at_once(machines, |m| m.systemctl_ok(&all("start")).map(|_| ()))?;
    write(2)?;
    let restart = at_once(machines, |m| {
        m.systemctl_ok(&["daemon-reload"])?;
        m.systemctl_ok(&all("restart")).map(|_| ())
    })?;
    let stop = at_once(machines, |m| m.systemctl_ok(&all("stop")).map(|_| ()))?;
    for m in machines {
        m.sh("rm -f /run/systemd/system/base-*.service && systemctl daemon-reload")?;
    }
    Ok(Baseline {
        start,
        restart,
        stop,
    })
}

/// Runs `f` on every machine at once; how long until the last one returned.
fn at_once(machines: &[Machine], f: impl Fn(&Machine) -> Result<()> + Sync) -> Result<Duration> {
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let runs: Vec<_> = machines.iter().map(|m| s.spawn(|| f(m))).collect();
        runs.into_iter()
            .try_for_each(|r| r.join().expect("a machine's thread panicked"))
    })?;
    Ok(t0.elapsed())
}
