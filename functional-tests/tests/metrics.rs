//! fleetd's `GET /metrics` on a running cluster (issue 16): read over each machine's default
//! API socket before and after a scheduling burst, the counters an operator watches move
//! (scheduling decisions, agent tasks, registry operations, API requests), and exactly one
//! machine says it leads. Needs root.
//!
//! Nothing sleeps for a fixed time: each check waits for the value it is about.

mod support;

use anyhow::{Context, Result, ensure};
use fleet_core::DesiredState;
use fleet_functional_tests::metrics::{Scrape, scrape};
use fleet_functional_tests::{FleetdSpec, Machine, wait_for, wait_for_value};
use support::{POLL, TIMEOUT, finish, sleeper, start};

/// Units the burst starts.
const BURST: usize = 20;

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
