//! fleetd's `GET /metrics` on a running cluster (issue 16): read over each machine's default
//! API socket before and after a scheduling burst, the counters an operator watches move
//! (scheduling decisions, agent tasks, registry operations, API requests), and exactly one
//! machine says it leads. Needs root.
//!
//! Nothing sleeps for a fixed time: each check waits for the value it is about.

mod support;

use anyhow::{Context, Result, ensure};
use fleet_core::DesiredState;
use fleet_functional_tests::{FleetdSpec, Machine, wait_for, wait_for_value};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use support::{POLL, TIMEOUT, finish, sleeper, start};

/// Units the burst starts.
const BURST: usize = 20;

/// One scrape: every sample, keyed by its series (`name{labels}` as written).
#[derive(Debug, Default)]
struct Scrape {
    samples: BTreeMap<String, f64>,
}

impl Scrape {
    /// Parses the Prometheus text format (version 0.0.4): comments skipped, each other line
    /// `series value`, the labels' values free of spaces here.
    fn parse(text: &str) -> Result<Scrape> {
        let mut samples = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (series, value) = line
                .rsplit_once(' ')
                .with_context(|| format!("no value in {line:?}"))?;
            let value: f64 = value
                .parse()
                .with_context(|| format!("bad value in {line:?}"))?;
            samples.insert(series.to_owned(), value);
        }
        Ok(Scrape { samples })
    }

    /// The sum of the samples of metric `name` whose labels include every one of `labels`
    /// (each `key="value"`).
    fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.samples
            .iter()
            .filter(|(series, _)| {
                let (n, rest) = series.split_once('{').unwrap_or((series, ""));
                n == name && labels.iter().all(|l| rest.contains(l))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

/// `GET /metrics` over the machine's default API socket, as plain HTTP/1.1.
fn scrape(machine: &Machine) -> Result<Scrape> {
    let path = machine.api_socket();
    let mut stream =
        UnixStream::connect(&path).with_context(|| format!("connecting to {}", path.display()))?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: fleet\r\nConnection: close\r\n\r\n")?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .with_context(|| format!("no header end in {raw:?}"))?;
    ensure!(head.starts_with("HTTP/1.1 200"), "{head}");
    ensure!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    ensure!(
        !head.to_ascii_lowercase().contains("transfer-encoding"),
        "{head}"
    );
    Scrape::parse(body)
}

fn scrape_all(machines: &[Machine]) -> Result<Vec<Scrape>> {
    machines.iter().map(scrape).collect()
}

fn total(scrapes: &[Scrape], name: &str, labels: &[&str]) -> f64 {
    scrapes.iter().map(|s| s.sum(name, labels)).sum()
}

#[test]
fn metrics_move_with_a_scheduling_burst_and_one_machine_leads() -> Result<()> {
    let (cluster, registry) = start(3, FleetdSpec::default())?;
    let machines = cluster.machines();
    // Exactly one leader, once the election is over.
    let leaders = |scrapes: &[Scrape]| {
        scrapes
            .iter()
            .filter(|s| s.sum("fleet_engine_leader", &[]) == 1.0)
            .count()
    };
    let before = wait_for_value(TIMEOUT, POLL, || {
        let scrapes = scrape_all(machines).ok()?;
        (leaders(&scrapes) == 1).then_some(scrapes)
    })
    .context("no single machine reports fleet_engine_leader 1")?;

    for i in 0..BURST {
        registry.create_unit(
            &format!("burst-{i}.service"),
            &sleeper(1000 + i as u32),
            DesiredState::Launched,
        )?;
    }
    wait_for(TIMEOUT, POLL, || {
        registry.unit_states().is_ok_and(|states| {
            states
                .iter()
                .filter(|s| s.name.as_str().starts_with("burst-") && s.systemd.active == "active")
                .count()
                == BURST
        })
    })
    .context("the burst's units did not all become active")?;
    // States are published at the end of a pass; its metrics are recorded then too.
    let after = wait_for_value(TIMEOUT, POLL, || {
        let scrapes = scrape_all(machines).ok()?;
        let active = total(&scrapes, "fleet_agent_units", &["state=\"active\""]);
        (active >= BURST as f64).then_some(scrapes)
    })
    .context("fleet_agent_units{state=\"active\"} never counted the burst")?;

    let moved = |name: &str, labels: &[&str]| {
        let (b, a) = (total(&before, name, labels), total(&after, name, labels));
        (b, a)
    };
    let (b, a) = moved(
        "fleet_engine_scheduling_decisions_total",
        &["outcome=\"placed\""],
    );
    ensure!(a - b >= BURST as f64, "placements {b} -> {a}");
    let (b, a) = moved(
        "fleet_agent_task_count_total",
        &["kind=\"start\"", "result=\"succeeded\""],
    );
    ensure!(a - b >= BURST as f64, "agent starts {b} -> {a}");
    let (b, a) = moved("fleet_registry_operation_count_total", &["type=\"txn\""]);
    ensure!(a > b, "registry transactions {b} -> {a}");
    let (b, a) = moved("fleet_engine_reconcile_count_total", &[]);
    ensure!(a > b, "engine passes {b} -> {a}");
    // Each machine's first scrape is counted by the time it answers the second.
    for (m, s) in machines.iter().zip(&after) {
        let scrapes = s.sum(
            "fleet_api_requests_total",
            &["route=\"/metrics\"", "code=\"200\""],
        );
        ensure!(scrapes >= 1.0, "{}: /metrics requests {scrapes}", m.name());
    }
    ensure!(
        leaders(&after) == 1,
        "not exactly one leader after the burst"
    );
    // Issue 38: what a dashboard and an alert need from a fleetd that never failed: its
    // version, the process's standard metrics, and failure series at 0 (not absent).
    for (m, s) in machines.iter().zip(&after) {
        let version = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
        ensure!(
            s.sum("fleet_build_info", &[&version]) == 1.0,
            "{}: no fleet_build_info{{{version}}} 1",
            m.name()
        );
        for name in [
            "process_resident_memory_bytes",
            "process_start_time_seconds",
            "process_open_fds",
            "process_max_fds",
        ] {
            ensure!(
                s.sum(name, &[]) > 0.0,
                "{}: {name} is not positive",
                m.name()
            );
        }
        for series in [
            "fleet_agent_dbus_errors_total{type=\"start\"}",
            "fleet_engine_reconcile_failure_count_total{type=\"registry\"}",
            "fleet_registry_etcd_errors_total{type=\"txn\",error=\"unavailable\"}",
        ] {
            ensure!(
                s.samples.contains_key(series),
                "{}: no series {series}",
                m.name()
            );
        }
    }
    finish(cluster)
}
