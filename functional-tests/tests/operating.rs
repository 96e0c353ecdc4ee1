//! What an operator sees of fleetd on a machine, as fleet named it: the unit `fleet.service`,
//! whose log is in the journal natively (`journalctl -u fleet -p warning` finds the warnings,
//! `-o json` shows a plain-text MESSAGE and the fields), and whose state systemd knows
//! through sd_notify (READY once registered and reconciled, a STATUS line, the watchdog).
//! Needs root.
//!
//! Nothing sleeps for a fixed time: each check waits for the journal entry or the property
//! it is about.

use anyhow::{Context, Result, ensure};
use fleet_core::DesiredState;
use fleet_functional_tests::{FleetdSpec, Machine, wait_for_value};
use serde_json::Value;
use std::collections::BTreeMap;
mod support;
use support::{POLL, TIMEOUT, finish, sleeper, start};

/// A unit whose start fails with exit status 3 (a oneshot's start job waits for its exit).
const FAILING: &str = "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'exit 3'\n";

fn agent_only() -> FleetdSpec {
    FleetdSpec::default().with_env("FLEET_DISABLE_ENGINE", "true")
}

/// fleetd's journal entries (`journalctl -u fleet -o json`, plus `args`), parsed.
fn fleetd_entries(machine: &Machine, args: &[&str]) -> Result<Vec<Value>> {
    let mut all = vec!["-u", "fleet", "-o", "json"];
    all.extend(args);
    machine
        .journal(&all)?
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("journal line {l:?}")))
        .collect()
}

fn message(entry: &Value) -> Option<&str> {
    entry["MESSAGE"].as_str()
}

/// `systemctl show` properties of fleet.service.
fn show(machine: &Machine, properties: &str) -> Result<BTreeMap<String, String>> {
    let out = machine.systemctl_ok(&["show", "-p", properties, "fleet"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect())
}

#[test]
fn fleetds_warnings_are_warnings_in_the_journal_with_fields_and_no_colour_codes() -> Result<()> {
    let (cluster, registry) = start(1, agent_only())?;
    let m1 = &cluster.machines()[0];
    registry.submit_and_schedule(m1.id(), "broken.service", FAILING, DesiredState::Launched)?;

    let failed = wait_for_value(TIMEOUT, POLL, || {
        let entries = fleetd_entries(m1, &["-p", "warning"]).ok()?;
        entries.into_iter().find(|e| {
            e["UNIT"] == "broken.service"
                && message(e).is_some_and(|m| m.starts_with("task failed"))
        })
    })
    .context("no warning about broken.service in journalctl -u fleet -p warning")?;
    // A string (journalctl shows a byte array for a MESSAGE with control characters), with
    // the fields an operator needs and no timestamp or level of its own in front.
    let text = message(&failed).context("MESSAGE is not a string")?;
    ensure!(!text.contains('\u{1b}'), "colour codes in {text:?}");
    ensure!(
        text.contains("result exit-code, exit status 3") && text.contains("unit=broken.service"),
        "the failure does not say why: {text:?}"
    );
    ensure!(failed["PRIORITY"] == "4", "not a warning: {failed}");
    ensure!(failed["RESULT"] == "exit-code", "no RESULT field: {failed}");
    ensure!(failed["SYSLOG_IDENTIFIER"] == "fleetd", "{failed}");
    ensure!(failed["_SYSTEMD_UNIT"] == "fleet.service", "{failed}");

    // Information is information: the startup line is priority 6, not among the warnings.
    let started = fleetd_entries(m1, &[])?
        .into_iter()
        .find(|e| message(e).is_some_and(|m| m.starts_with("fleetd started")))
        .context("no 'fleetd started' entry")?;
    ensure!(started["PRIORITY"] == "6", "{started}");
    let warnings = m1.journal(&["-u", "fleet", "-p", "warning", "-o", "cat"])?;
    ensure!(
        !warnings.contains("fleetd started"),
        "info lines among the warnings:\n{warnings}"
    );
    finish(cluster)
}

#[test]
fn systemd_knows_when_fleetd_is_ready_and_what_it_is_doing() -> Result<()> {
    let (cluster, registry) = start(1, agent_only())?;
    let m1 = &cluster.machines()[0];
    registry.submit_and_schedule(
        m1.id(),
        "hello.service",
        &sleeper(1000),
        DesiredState::Launched,
    )?;
    wait_for_value(TIMEOUT, POLL, || {
        let p = show(m1, "StatusText").ok()?;
        (p["StatusText"] == "running: 1 unit here").then_some(())
    })
    .context("fleetd's status line never said it runs the unit")?;

    // As dist/fleet.service runs it: systemd waits for READY=1, which comes only once the
    // machine is registered and the agent reconciled, and expects the watchdog's pings.
    m1.write_file(
        "/run/systemd/system/fleet.service.d/notify.conf",
        "[Service]\nType=notify\nWatchdogSec=2s\n",
    )?;
    m1.systemctl_ok(&["daemon-reload"])?;
    m1.restart_fleetd()?;
    let p = show(m1, "Type,ActiveState,StatusText,MainPID")?;
    ensure!(p["Type"] == "notify", "{p:?}");
    ensure!(
        p["ActiveState"] == "active",
        "restart returned before READY: {p:?}"
    );
    ensure!(
        p["StatusText"] == "running: 1 unit here",
        "READY came before the first reconcile: {p:?}"
    );

    // Two watchdog pings, past the 2 s timeout, by the same fleetd: it was not killed.
    let ping =
        || show(m1, "WatchdogTimestampMonotonic").map(|p| p["WatchdogTimestampMonotonic"].clone());
    let mut seen = vec![ping()?];
    wait_for_value(TIMEOUT, POLL, || {
        let now = ping().ok()?;
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        (seen.len() >= 4).then_some(())
    })
    .with_context(|| format!("fleetd does not ping the watchdog: {seen:?}"))?;
    let after = show(m1, "ActiveState,MainPID")?;
    ensure!(
        after["ActiveState"] == "active" && after["MainPID"] == p["MainPID"],
        "the watchdog killed fleetd: {p:?} -> {after:?}"
    );
    finish(cluster)
}

#[test]
fn a_bad_configuration_is_an_error_in_the_journal_not_information() -> Result<()> {
    let (cluster, _registry) = start(1, agent_only())?;
    let m1 = &cluster.machines()[0];
    // Written before the subscriber exists, on stderr: its `<3>` prefix makes it an error.
    m1.write_file(
        "/run/systemd/system/fleet.service.d/bad.conf",
        "[Service]\nEnvironment=FLEET_LOG_FORMAT=xml\n",
    )?;
    m1.systemctl_ok(&["daemon-reload"])?;
    m1.restart_fleetd()?;
    let refusal = wait_for_value(TIMEOUT, POLL, || {
        let entries = fleetd_entries(m1, &["-p", "err"]).ok()?;
        entries
            .into_iter()
            .find(|e| message(e).is_some_and(|m| m.contains("bad configuration")))
    })
    .context("no error entry about the bad configuration in journalctl -u fleet -p err")?;
    let text = message(&refusal).context("MESSAGE is not a string")?;
    ensure!(
        text.starts_with("fleetd: bad configuration: invalid log_format \"xml\""),
        "{text:?}"
    );
    ensure!(refusal["PRIORITY"] == "3", "{refusal}");
    finish(cluster)
}
