//! A crash-looping unit is visible at a glance (issue 41), end to end on real fleetds, etcd and
//! systemd: one unit restarted by systemd's own `Restart=`, one without it that fleet's agent
//! revives, both exiting with status 3 a second after they start. `list-units --fields
//! unit,restarts,exit` shows their restarts and `exit status 3`; `events --unit` tells
//! `restarted-by-systemd` and `failed` with that exit; `fleetctl status` prints the unit's
//! events before systemd's status (over each machine's TLS API); fleet's default table is
//! unchanged. Needs root.

mod support;

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{Cluster, Driver, FleetdSpec, wait_for};
use serde_json::Value;
use std::time::Duration;
use support::{POLL, finish, fleetctl_ok};

/// The port of every machine's TLS API listener (for `fleetctl status`).
const PORT: u16 = 49161;
const WAIT: Duration = Duration::from_secs(90);

const LOOPING: &str =
    "[Service]\nExecStart=/bin/sh -c 'sleep 1; exit 3'\nRestart=always\nRestartSec=1\n";
const DYING: &str = "[Service]\nExecStart=/bin/sh -c 'sleep 1; exit 3'\n";

/// `list-units --no-legend --fields unit,restarts,exit,since`: per unit, its restarts, exit
/// and time in state.
fn history(cluster: &Cluster) -> Result<Vec<(String, u64, String, String)>> {
    let run = fleetctl_ok(
        cluster,
        &[
            "list-units",
            "--no-legend",
            "--fields",
            "unit,restarts,since,exit",
        ],
    )?;
    let mut rows = Vec::new();
    for line in run.stdout.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let [unit, restarts, since, exit @ ..] = cols.as_slice() else {
            continue;
        };
        let restarts = restarts
            .parse()
            .with_context(|| format!("restarts: {line}"))?;
        rows.push((
            (*unit).to_owned(),
            restarts,
            exit.join(" "),
            (*since).to_owned(),
        ));
    }
    Ok(rows)
}

/// `fleetctl events --output json --unit unit`.
fn events(cluster: &Cluster, unit: &str) -> Result<Vec<Value>> {
    let run = fleetctl_ok(cluster, &["events", "--output", "json", "--unit", unit])?;
    let page: Value = serde_json::from_str(&run.stdout).context("events --output json")?;
    Ok(page["events"].as_array().cloned().unwrap_or_default())
}

/// Waits for an event of `unit` of `kind` whose reason says `exit status 3`.
fn wait_exit_event(cluster: &Cluster, unit: &str, kind: &str) -> Result<Value> {
    let mut last = Vec::new();
    let mut found = None;
    wait_for(WAIT, POLL, || {
        last = events(cluster, unit).unwrap_or_default();
        found = last
            .iter()
            .find(|e| {
                e["kind"] == kind && e["reason"].as_str().unwrap_or("").contains("exit status 3")
            })
            .cloned();
        found.is_some()
    })
    .with_context(|| format!("no {kind} event with exit status 3 of {unit}: {last:?}"))?;
    Ok(found.expect("waited for"))
}

#[test]
fn a_crash_looping_unit_shows_its_restarts_its_exit_and_its_events() -> Result<()> {
    let (cluster, _registry) = support::start(2, FleetdSpec::default().with_api_tls(PORT))?;
    let dir = cluster.dir().join("units");
    std::fs::create_dir_all(&dir)?;
    let mut paths = Vec::new();
    for (name, text) in [("looping.service", LOOPING), ("dying.service", DYING)] {
        std::fs::write(dir.join(name), text)?;
        paths.push(dir.join(name).display().to_string());
    }
    let mut start = vec!["start", "--no-block"];
    start.extend(paths.iter().map(String::as_str));
    fleetctl_ok(&cluster, &start)?;

    let mut last = Vec::new();
    wait_for(WAIT, POLL, || {
        last = history(&cluster).unwrap_or_default();
        ["looping.service", "dying.service"].iter().all(|u| {
            last.iter().any(|(unit, restarts, exit, _)| {
                unit == u && *restarts > 0 && exit == "exit status 3"
            })
        })
    })
    .with_context(|| format!("restarts and exits never shown: {last:?}"))?;
    for (unit, _, _, since) in &last {
        ensure!(
            since.ends_with('s') || since.ends_with('m'),
            "{unit}'s time in state: {since:?}"
        );
    }
    let table = fleetctl_ok(&cluster, &["list-units", "--no-legend"])?.stdout;
    for line in table.lines() {
        ensure!(
            line.split_whitespace().count() == 4,
            "default table: {table}"
        );
    }

    let restarted = wait_exit_event(&cluster, "looping.service", "restarted-by-systemd")?;
    ensure!(restarted["source"] == "machine", "{restarted}");
    let failed = wait_exit_event(&cluster, "dying.service", "failed")?;
    ensure!(
        failed["reason"]
            .as_str()
            .unwrap_or("")
            .contains("exit-code"),
        "{failed}"
    );
    // The agent revived it: started again, and its failure told once a crash, not twice.
    let told = events(&cluster, "dying.service")?;
    let kinds: Vec<&str> = told.iter().filter_map(|e| e["kind"].as_str()).collect();
    ensure!(kinds.contains(&"active"), "{kinds:?}");
    let first_failure = told
        .iter()
        .position(|e| e["kind"] == "failed")
        .context("failed")?;
    ensure!(
        told.get(first_failure + 1)
            .is_none_or(|e| e["kind"] != "failed"),
        "one crash told twice: {kinds:?}"
    );

    // `fleetctl status`: the unit's events, then systemd's status.
    // Over the API, the TLS listener (a unix socket's client has no certificate to offer the
    // unit's machine); over etcd, with the API's certificates for that machine.
    let mut command = match cluster.driver() {
        Driver::Api => cluster.fleetctl_tls_command()?,
        Driver::Etcd => {
            let certs = cluster.api_certs().context("TLS API certificates")?;
            let mut command = cluster.fleetctl_command(Driver::Etcd)?;
            command
                .env("FLEETCTL_API_CA_FILE", certs.ca())
                .env("FLEETCTL_API_CERT_FILE", certs.client_cert())
                .env("FLEETCTL_API_KEY_FILE", certs.client_key());
            command
        }
    };
    let out = command.args(["status", "looping.service"]).output()?;
    let status = String::from_utf8_lossy(&out.stdout).into_owned();
    let events_at = status.find("restarted-by-systemd");
    let systemd_at = status.find("Loaded:");
    ensure!(
        status.starts_with("TIME")
            && events_at.is_some()
            && systemd_at.is_some()
            && events_at < systemd_at,
        "status: {status}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    for unit in ["looping.service", "dying.service"] {
        fleetctl_ok(&cluster, &["destroy", unit])?;
    }
    finish(cluster)
}
