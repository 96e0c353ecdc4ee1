//! Scenario 2, one agent with many units on real systemd: one functional-test machine running
//! the release fleetd (agent and engine). Times `fleetctl start` of 3,000 units (the default) until all are
//! active and published, counts fleetd's D-Bus method calls and etcd requests over an idle
//! minute, and times the agent's passes with nothing to do by running it in-process inside the
//! machine (`agent-probe`) in place of the stopped fleetd.

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{Cluster, MACHINE_BIN_DIR, Machine, OutputExt};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::metrics::{Metrics, received_between};
use crate::probe::{PassSample, ProbeResult};
use crate::real::{
    Baseline, FleetdOptions, active_bench_units, boot, count_method_calls, fleetctl_timed,
    fleetd_bus_name, fleetd_cpu, fleetd_rss, systemd_baseline, unit_dir, write_units,
};
use crate::report::{self, Table, ms, secs, verdict};
use crate::scale::cpu_of_stat;
use crate::scale::fmt_map;

/// What the scenario measured.
#[derive(Debug)]
struct OneAgent {
    units: usize,
    fleetd: String,
    start: Duration,
    /// systemd alone with as many units like them, in the same machine, before fleet's.
    baseline: Baseline,
    /// CPU seconds during fleet's start: fleetd, the machine's systemd (its PID 1), etcd.
    start_cpu: [f64; 3],
    rss_empty: f64,
    rss_full: f64,
    /// After the idle minute (which holds one periodic resync).
    rss_idle: f64,
    idle: Duration,
    dbus_calls: BTreeMap<String, u64>,
    idle_cpu: f64,
    idle_etcd: BTreeMap<String, u64>,
    probe: ProbeResult,
}

pub fn run(bin_dir: &Path, units: usize, idle: Duration, fleetd: &FleetdOptions) -> Result<String> {
    let wall = SystemTime::now();
    let started = Instant::now();
    println!(
        "one-agent: booting 1 machine with fleetd from {}",
        bin_dir.display()
    );
    let (cluster, _registry) = boot(1, bin_dir, fleetd)?;
    let result = measure(&cluster, units, idle, fleetd);
    cluster.shutdown()?;
    let result = result?;
    let verdict = crate::verdict::one_agent(result.units, result.start, result.baseline.start);
    println!("{}", verdict.line());
    let mut out = report::provenance(wall, started.elapsed());
    out.push_str(&render(&result));
    out.push_str("\nGoal (issue 43):\n\n");
    out.push_str(&crate::verdict::table(&[verdict]));
    Ok(out)
}

fn measure(
    cluster: &Cluster,
    units: usize,
    idle: Duration,
    fleetd: &FleetdOptions,
) -> Result<OneAgent> {
    let machine = &cluster.machines()[0];
    let rss_empty = fleetd_rss(machine)?;
    let baseline = systemd_baseline(cluster.machines(), units)?;
    println!(
        "one-agent: systemd alone started {units} units in {}",
        secs(baseline.start)
    );
    let dir = unit_dir("one-agent")?;
    let paths = write_units(&dir, 0..units, 1)?;
    let mut args: Vec<OsString> = vec!["start".into(), "--block-attempts".into(), "120".into()];
    args.extend(paths.iter().map(|p| p.clone().into_os_string()));
    let cpu_before = start_cpu(cluster, machine)?;
    let start = fleetctl_timed(cluster, &args)?;
    let cpu_after = start_cpu(cluster, machine)?;
    let start_cpu = [0, 1, 2].map(|i| cpu_after[i] - cpu_before[i]);
    let (active, _) = active_bench_units(machine, 1)?;
    ensure!(active == units, "{active} of {units} units active");
    println!(
        "one-agent: {units} units active and published in {}",
        secs(start)
    );
    let rss_full = fleetd_rss(machine)?;

    println!("one-agent: idle for {} under dbus-monitor", secs(idle));
    let bus_name = fleetd_bus_name(machine)?;
    let cpu = fleetd_cpu(machine)?;
    let metrics = Metrics::fetch(&cluster.etcd_endpoint())?;
    let dbus_calls = count_method_calls(machine, &bus_name, idle)?;
    let idle_cpu = fleetd_cpu(machine)? - cpu;
    let idle_etcd = received_between(&metrics, &Metrics::fetch(&cluster.etcd_endpoint())?);
    let rss_idle = fleetd_rss(machine)?;

    println!("one-agent: timing the agent's passes in-process");
    machine.stop_fleetd()?;
    let probe = run_probe(machine, &cluster.etcd_endpoint(), &fleetd.agent_ttl)?;
    Ok(OneAgent {
        units,
        fleetd: fleetd.describe(),
        start,
        baseline,
        start_cpu,
        rss_empty,
        rss_full,
        rss_idle,
        idle,
        dbus_calls,
        idle_cpu,
        idle_etcd,
        probe,
    })
}

#[allow(
    clippy::too_many_lines,
    reason = "a report's text, written top to bottom as it reads"
)]
fn render(r: &OneAgent) -> String {
    let (units, idle) = (r.units, r.idle.as_secs());
    let mut out = format!(
        "\n1 machine, fleetd (agent + engine) as a service of the machine's systemd, \
         {}. Units are `[Service] ExecStart=/bin/sleep infinity`.\n\n",
        r.fleetd
    );
    let mut t = Table::new(&["figure", "measured", "target", ""]);
    let mut row = |figure: String, measured: String, goal: &str, met: Option<bool>| {
        let verdict = met.map_or("", verdict).to_owned();
        t.row(vec![figure, measured, goal.to_owned(), verdict]);
    };
    let goal = Goals::for_units(units);
    row(
        format!("`fleetctl start` of {units} units until all active and published"),
        secs(r.start),
        goal.start_text,
        Some(r.start < goal.start),
    );
    row(
        format!(
            "systemd alone: `systemctl start` of {units} units like them in the same machine, \
             until all active"
        ),
        secs(r.baseline.start),
        "",
        None,
    );
    row(
        format!("fleet's start of {units} units next to systemd alone"),
        format!(
            "{:.2}×",
            r.start.as_secs_f64() / r.baseline.start.as_secs_f64().max(1e-3)
        ),
        "",
        None,
    );
    row(
        "CPU time during fleet's start: fleetd / the machine's systemd (PID 1) / etcd".into(),
        format!(
            "{:.1} s / {:.1} s / {:.1} s",
            r.start_cpu[0], r.start_cpu[1], r.start_cpu[2]
        ),
        "",
        None,
    );
    row(
        format!("fleetd RSS: 0 units / {units} units / after the idle minute"),
        format!(
            "{:.1} MiB / {:.1} MiB / {:.1} MiB",
            r.rss_empty, r.rss_full, r.rss_idle
        ),
        goal.rss_text,
        Some(r.rss_full.max(r.rss_idle) * 1048576.0 < goal.rss_bytes),
    );
    let dbus_total: u64 = r.dbus_calls.values().sum();
    row(
        format!("fleetd D-Bus method calls over {idle} idle s"),
        format!("{dbus_total} ({})", fmt_map(&r.dbus_calls)),
        "",
        None,
    );
    row(
        format!("fleetd CPU time over {idle} idle s"),
        format!("{:.2} s", r.idle_cpu),
        "< 0.1 s per minute",
        Some(r.idle_cpu * 60.0 / (idle.max(1) as f64) < 0.1),
    );
    let p = &r.probe;
    row(
        "agent boot with the units already running (preload, adopt, publish)".into(),
        format!(
            "{:.0} ms ({} units, lease resumed: {})",
            p.boot_ms, p.units, p.resumed
        ),
        "",
        None,
    );
    // The probe's signals are a transient unit's (`systemd-run /bin/true`): a unit that is
    // not fleet's, which makes no pass since issue 19.
    let light = match p.light.is_empty() {
        true => "none: signals about a unit not fleet's (the probe's `systemd-run /bin/true`) \
                 make no pass"
            .to_owned(),
        false => summary(&p.light),
    };
    row(
        "reconcile pass woken by a systemd signal about a unit that is not fleet's".into(),
        light,
        "",
        None,
    );
    row(
        "reconcile pass with nothing to do, periodic resync (every 60 s by default)".into(),
        summary(&p.full),
        "",
        None,
    );
    out.push_str(&t.render());
    out.push_str(&format!(
        "\netcd requests received during the idle {idle} s: {}\n",
        fmt_map(&r.idle_etcd)
    ));
    out
}

/// The targets: issue 6's for up to 1,000 units, issue 19's for more (3,000 units).
struct Goals {
    start: Duration,
    start_text: &'static str,
    rss_bytes: f64,
    rss_text: &'static str,
}

impl Goals {
    fn for_units(units: usize) -> Goals {
        match units <= 1000 {
            true => Goals {
                start: Duration::from_secs(10),
                start_text: "< 10 s",
                rss_bytes: 20e6,
                rss_text: "< 20 MB",
            },
            false => Goals {
                start: Duration::from_secs(15),
                start_text: "< 15 s",
                rss_bytes: 40.0 * 1048576.0,
                rss_text: "< 40 MiB",
            },
        }
    }
}

/// `median 12 ms (n=5, min …, max …); per pass: …`.
fn summary(samples: &[PassSample]) -> String {
    let Some(last) = samples.last() else {
        return "no pass observed".to_owned();
    };
    let mut sorted: Vec<f64> = samples.iter().map(|s| s.ms).collect();
    sorted.sort_by(f64::total_cmp);
    let at = |ms_value: f64| ms(Duration::from_secs_f64(ms_value / 1000.0));
    format!(
        "median {} (n={}, min {}, max {}); per pass: {} status calls, {} details calls, \
         {} etcd requests",
        at(sorted[sorted.len() / 2]),
        samples.len(),
        at(sorted[0]),
        at(sorted[sorted.len() - 1]),
        last.status_calls,
        last.details_calls,
        last.etcd_requests
    )
}

/// CPU seconds so far: fleetd, the machine's systemd (PID 1), etcd (its own counter).
fn start_cpu(cluster: &Cluster, machine: &Machine) -> Result<[f64; 3]> {
    let pid1 = std::fs::read_to_string(format!("/proc/{}/stat", machine.pid1()))?;
    let etcd = Metrics::fetch(&cluster.etcd_endpoint())?.sum("process_cpu_seconds_total", &[]);
    Ok([fleetd_cpu(machine)?, cpu_of_stat(&pid1), etcd])
}

fn run_probe(machine: &Machine, etcd: &str, agent_ttl: &str) -> Result<ProbeResult> {
    let probe = PathBuf::from(MACHINE_BIN_DIR).join("fleet-bench");
    let args = ["agent-probe", "--etcd", etcd, "--agent-ttl", agent_ttl];
    let out = machine
        .exec(&probe.to_string_lossy(), args)?
        .checked()
        .context("agent-probe inside the machine")?;
    let line = out.lines().last().unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("agent-probe printed {line:?}"))
}
