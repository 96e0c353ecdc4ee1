//! Scenario 1, end to end on the real functional cluster: 3 machines (real systemd as PID 1
//! of each, fleetd as a service), a real etcd, the release fleetd and fleetctl, everything on
//! the harness's own bridge. Measures what a user sees from fleetctl and what fleetd costs.

use anyhow::{Result, ensure};
use fleet_functional_tests::{Cluster, TestRegistry, wait_for};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::metrics::{Metrics, received_between};
use crate::real::{
    Baseline, FleetdOptions, active_bench_units, boot, fleetctl_timed, fleetd_cpu, fleetd_rss,
    systemd_baseline, unit_dir, write_units,
};
use crate::report::{self, Table, ms, percentile, secs, verdict};
use crate::scale::fmt_map;
use crate::timeline::{self, Timeline};

/// Bound on any one blocking fleetctl command (2 s per attempt).
const BLOCK_ATTEMPTS: &str = "60";

/// What the scenario measured.
#[derive(Debug)]
struct E2e {
    runs: usize,
    units: usize,
    fleetd: String,
    leader: String,
    latencies: Vec<Duration>,
    start: Duration,
    spread: Vec<(String, usize, usize)>,
    replace: Duration,
    replace_timeline: Vec<Timeline>,
    destroy_cmd: Duration,
    destroy_all: Duration,
    destroy_timeline: Vec<Timeline>,
    /// systemd alone starting, restarting (with new files) and stopping the same units, the
    /// machines at once.
    baseline: Baseline,
    rss: [Vec<f64>; 3],
    idle: Duration,
    idle_cpu: Vec<f64>,
    idle_etcd: BTreeMap<String, u64>,
}

pub fn run(
    bin_dir: &Path,
    runs: usize,
    units: usize,
    idle: Duration,
    fleetd: &FleetdOptions,
) -> Result<String> {
    let wall = SystemTime::now();
    let started = Instant::now();
    println!(
        "e2e: booting 3 machines with fleetd from {}",
        bin_dir.display()
    );
    let (cluster, registry) = boot(3, bin_dir, fleetd)?;
    let result = measure(&cluster, &registry, runs, units, idle, fleetd);
    cluster.shutdown()?;
    let mut out = report::provenance(wall, started.elapsed());
    out.push_str(&render(&result?));
    Ok(out)
}

fn measure(
    cluster: &Cluster,
    registry: &TestRegistry,
    runs: usize,
    units: usize,
    idle: Duration,
    fleetd: &FleetdOptions,
) -> Result<E2e> {
    let rss_empty = rss_all(cluster)?;
    let dir = unit_dir("e2e")?;
    let latencies = single_starts(cluster, registry, &dir, runs)?;
    println!(
        "e2e: single start median {} p95 {}",
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 95.0))
    );

    let paths = write_units(&dir, 0..units, 1)?;
    let start = fleetctl_timed(
        cluster,
        &command("start", &["--block-attempts", BLOCK_ATTEMPTS], &paths),
    )?;
    let spread = spread_of(cluster, 1)?;
    let running: usize = spread.iter().map(|s| s.1).sum();
    ensure!(running == units, "not every unit runs: {spread:?}");
    println!("e2e: {units} units active in {}", secs(start));
    let rss_full = rss_all(cluster)?;

    println!("e2e: idle for {}", secs(idle));
    let cpu_before = cpu_all(cluster)?;
    let metrics = Metrics::fetch(&cluster.etcd_endpoint())?;
    std::thread::sleep(idle);
    let idle_cpu = cpu_all(cluster)?
        .iter()
        .zip(&cpu_before)
        .map(|(a, b)| a - b)
        .collect();
    let idle_etcd = received_between(&metrics, &Metrics::fetch(&cluster.etcd_endpoint())?);
    let leader = leader_name(cluster, registry);

    write_units(&dir, 0..units, 2)?;
    let flags = ["--replace", "--block-attempts", BLOCK_ATTEMPTS];
    let (replace, replace_timeline) = timeline::record(cluster.machines(), || {
        fleetctl_timed(cluster, &command("start", &flags, &paths))
    })?;
    let current: usize = spread_of(cluster, 2)?.iter().map(|s| s.2).sum();
    ensure!(
        current == units,
        "{current} of {units} units run their new file"
    );
    println!("e2e: {units} units replaced in {}", secs(replace));

    let ((destroy_cmd, destroy_all), destroy_timeline) =
        timeline::record(cluster.machines(), || {
            let t0 = Instant::now();
            let cmd = fleetctl_timed(cluster, &command("destroy", &[], &paths))?;
            wait_for(Duration::from_secs(120), Duration::from_millis(20), || {
                registry.unit_states().is_ok_and(|s| s.is_empty())
                    && spread_of(cluster, 2).is_ok_and(|s| s.iter().all(|m| m.1 == 0))
            })?;
            Ok((cmd, t0.elapsed()))
        })?;
    println!("e2e: destroyed in {}", secs(destroy_all));
    let baseline = systemd_baseline(cluster.machines(), units / cluster.machines().len())?;
    println!(
        "e2e: systemd alone started {units} units in {}, restarted them in {}, stopped in {}",
        secs(baseline.start),
        secs(baseline.restart),
        secs(baseline.stop)
    );
    let rss_after = rss_all(cluster)?;
    Ok(E2e {
        runs,
        units,
        fleetd: fleetd.describe(),
        leader,
        latencies,
        start,
        spread,
        replace,
        replace_timeline,
        destroy_cmd,
        destroy_all,
        destroy_timeline,
        baseline,
        rss: [rss_empty, rss_full, rss_after],
        idle,
        idle_cpu,
        idle_etcd,
    })
}

#[allow(
    clippy::too_many_lines,
    reason = "a report's text, written top to bottom as it reads"
)]
fn render(r: &E2e) -> String {
    let (runs, units) = (r.runs, r.units);
    let mut out = format!(
        "\n3 machines, fleetd (agent + engine candidate) in each with {}, \
         engine leader on {}. Units are `[Service] ExecStart=/bin/sleep infinity`.\n\n",
        r.fleetd, r.leader
    );
    let median = percentile(&r.latencies, 50.0);
    let mut t = Table::new(&["figure", "measured", "target", ""]);
    t.row(vec![
        format!("`fleetctl start` of one unit until it returns with the unit active ({runs} runs)"),
        format!(
            "median {}, p95 {}, min {}, max {}",
            ms(median),
            ms(percentile(&r.latencies, 95.0)),
            ms(percentile(&r.latencies, 0.0)),
            ms(percentile(&r.latencies, 100.0))
        ),
        "median < 150 ms".into(),
        verdict(median < Duration::from_millis(150)).into(),
    ]);
    let spread: Vec<String> = r
        .spread
        .iter()
        .map(|(m, n, _)| format!("{m} {n}"))
        .collect();
    t.row(vec![
        format!("`fleetctl start` of {units} units (one command) until all active"),
        format!("{} (per machine: {})", secs(r.start), spread.join(", ")),
        "< 3 s".into(),
        verdict(r.start < Duration::from_secs(3)).into(),
    ]);
    let per_machine = units / r.spread.len().max(1);
    let b = &r.baseline;
    t.row(vec![
        format!(
            "systemd alone, the same {per_machine} units in each machine (all machines at \
             once): `systemctl start` / `daemon-reload` + `restart` with new files / `stop`"
        ),
        format!("{} / {} / {}", secs(b.start), secs(b.restart), secs(b.stop)),
        String::new(),
        String::new(),
    ]);
    let ratio = |fleet: Duration, alone: Duration| {
        let ratio = fleet.as_secs_f64() / alone.as_secs_f64().max(1e-3);
        format!("{ratio:.2}× systemd alone")
    };
    let start_ratio = r.start.as_secs_f64() / b.start.as_secs_f64().max(1e-3);
    t.row(vec![
        format!("fleet's start of {units} units next to systemd alone"),
        format!("{start_ratio:.2}×"),
        "≤ 1.5×".into(),
        verdict(start_ratio <= 1.5).into(),
    ]);
    t.row(vec![
        format!("`fleetctl start --replace` of {units} changed units until all run the new file"),
        format!("{} ({})", secs(r.replace), ratio(r.replace, b.restart)),
        "≤ 1.5 s".into(),
        verdict(r.replace <= Duration::from_millis(1500)).into(),
    ]);
    t.row(vec![
        format!("`fleetctl destroy` of {units} units: command / until stopped everywhere"),
        format!(
            "{} / {} ({})",
            secs(r.destroy_cmd),
            secs(r.destroy_all),
            ratio(r.destroy_all, b.stop)
        ),
        "≤ 1 s until stopped".into(),
        verdict(r.destroy_all <= Duration::from_secs(1)).into(),
    ]);
    let [empty, full, after] = &r.rss;
    t.row(vec![
        format!("fleetd RSS per machine: 0 units / {units} units / 0 again"),
        format!("{} / {} / {}", mib(empty), mib(full), mib(after)),
        "< 20 MB".into(),
        verdict(full.iter().all(|r| r * 1048576.0 < 20e6)).into(),
    ]);
    let cpu: Vec<String> = r.idle_cpu.iter().map(|c| format!("{c:.2} s")).collect();
    t.row(vec![
        format!(
            "fleetd CPU time over {} idle s with {units} units, per machine",
            r.idle.as_secs()
        ),
        cpu.join(" / "),
        String::new(),
        String::new(),
    ]);
    out.push_str(&t.render());
    out.push_str(&format!(
        "\netcd requests received during the idle {} s (all 3 fleetd): {}\n",
        r.idle.as_secs(),
        fmt_map(&r.idle_etcd)
    ));
    out.push_str(&timelines("replace", &r.spread, &r.replace_timeline));
    out.push_str(&timelines("destroy", &r.spread, &r.destroy_timeline));
    out
}

/// Each machine's timeline of one command, from `dbus-monitor` inside the machine (seconds
/// since the command started), with fleetd's calls to systemd.
fn timelines(what: &str, spread: &[(String, usize, usize)], timelines: &[Timeline]) -> String {
    let mut out = format!(
        "\nTimeline of the {what} (dbus-monitor in each machine, seconds since fleetctl started):\n\n"
    );
    for ((machine, _, _), t) in spread.iter().zip(timelines) {
        let calls: Vec<String> = t
            .calls
            .iter()
            .map(|(member, n)| match t.call_spans.get(member) {
                Some((first, last)) => format!("{member} {n} ({first:.2}–{last:.2} s)"),
                None => format!("{member} {n}"),
            })
            .collect();
        out.push_str(&format!("- {machine}: {t}; calls: {}\n", calls.join(", ")));
    }
    out
}

/// `fleetctl <verb> <flags> <paths>`.
fn command(verb: &str, flags: &[&str], paths: &[PathBuf]) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![verb.into()];
    args.extend(flags.iter().map(OsString::from));
    args.extend(paths.iter().map(|p| p.clone().into_os_string()));
    args
}

/// `runs` times: start one new unit (blocking), then destroy it and wait until it is gone.
fn single_starts(
    cluster: &Cluster,
    registry: &TestRegistry,
    dir: &Path,
    runs: usize,
) -> Result<Vec<Duration>> {
    let mut latencies = Vec::with_capacity(runs);
    for i in 0..runs {
        let path = write_units(dir, 90_000 + i..90_001 + i, 1)?;
        let start = command("start", &["--block-attempts", BLOCK_ATTEMPTS], &path);
        latencies.push(fleetctl_timed(cluster, &start)?);
        fleetctl_timed(cluster, &command("destroy", &[], &path))?;
        wait_for(Duration::from_secs(30), Duration::from_millis(10), || {
            registry.unit_states().is_ok_and(|s| s.is_empty())
        })?;
    }
    Ok(latencies)
}

/// Per machine: (name, bench units active, of which running `generation`).
fn spread_of(cluster: &Cluster, generation: u32) -> Result<Vec<(String, usize, usize)>> {
    cluster
        .machines()
        .iter()
        .map(|m| {
            let (active, current) = active_bench_units(m, generation)?;
            Ok((m.name().to_owned(), active, current))
        })
        .collect()
}

fn rss_all(cluster: &Cluster) -> Result<Vec<f64>> {
    cluster.machines().iter().map(fleetd_rss).collect()
}

fn cpu_all(cluster: &Cluster) -> Result<Vec<f64>> {
    cluster.machines().iter().map(fleetd_cpu).collect()
}

fn mib(values: &[f64]) -> String {
    let parts: Vec<String> = values.iter().map(|v| format!("{v:.1}")).collect();
    format!("{} MiB", parts.join(", "))
}

fn leader_name(cluster: &Cluster, registry: &TestRegistry) -> String {
    let leader = registry
        .block_on(registry.registry().leader())
        .ok()
        .flatten();
    leader
        .and_then(|id| cluster.machine_by_id(id.as_str()).ok())
        .map_or_else(|| "?".to_owned(), |m| m.name().to_owned())
}
