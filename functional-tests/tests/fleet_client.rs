//! fleet v1.0's own fleetctl (`../shared/reference-fleet/`) as a client of our API, unchanged
//! (issue 38): every command an operator of fleet types, over one machine's fleetd API socket.
//! `start --replace` is the one that hung: fleet's fleetctl sends the new options in a `PUT`
//! without a desired state, then waits for `currentState` `inactive` before it launches. Ours
//! answers such a request as fleet did (the unit inactive with its new content) and brings
//! the unit back to the machine it ran on, with the real systemd of every machine polled
//! throughout for a second copy. Needs root.

mod support;

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{Cluster, FleetdSpec, Machine, OutputExt, reference_fleetctl_ok};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use support::{POLL, TIMEOUT, units_on};

const UNIT: &str = "hello.service";

fn hello(version: u32) -> String {
    format!(
        "[Unit]\nDescription=hello v{version}\n\n[Service]\nExecStart=/bin/sleep {version}000\n"
    )
}

/// fleet's fleetctl against `machine`'s fleetd API socket, run in `dir`, which must succeed
/// (killed if it hangs); its stdout.
fn fleet_ok(machine: &Machine, dir: &Path, args: &[&str]) -> Result<String> {
    reference_fleetctl_ok(&[api_endpoint(machine)], dir, args)
}

fn api_endpoint(machine: &Machine) -> String {
    format!("--endpoint={}", machine.api_endpoint())
}

/// The machines whose systemd runs `unit` now.
fn running_on(cluster: &Cluster, unit: &str) -> Result<Vec<String>> {
    let mut on = Vec::new();
    for m in cluster.machines() {
        if units_on(m, &[unit.to_owned()])?
            .get(unit)
            .is_some_and(|v| v.is_active())
        {
            on.push(m.name().to_owned());
        }
    }
    Ok(on)
}

/// Runs `body` while another thread polls every machine's systemd for `unit`; fails if it
/// ever ran on two machines at once.
fn never_twice<T>(cluster: &Cluster, unit: &str, body: impl FnOnce() -> Result<T>) -> Result<T> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let sampler = scope.spawn(|| -> Result<()> {
            while !stop.load(Ordering::Relaxed) {
                let on = running_on(cluster, unit)?;
                ensure!(on.len() <= 1, "{unit} ran on {on:?} at once");
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(())
        });
        let out = body();
        stop.store(true, Ordering::Relaxed);
        sampler
            .join()
            .map_err(|_| anyhow::anyhow!("the sampler panicked"))??;
        out
    })
}

fn description(machine: &Machine) -> Result<String> {
    Ok(machine
        .systemctl(["show", "-p", "Description", "--value", UNIT])?
        .stdout_text()
        .trim()
        .to_owned())
}

#[test]
fn fleets_own_fleetctl_drives_our_api_through_a_whole_life_start_replace_included() -> Result<()> {
    let (cluster, _registry) = support::start(2, FleetdSpec::default())?;
    let dir = cluster.dir().join("fleet-client");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(UNIT), hello(1))?;
    let via = &cluster.machines()[0];

    let machines = fleet_ok(via, &dir, &["list-machines", "--no-legend", "--full"])?;
    for m in cluster.machines() {
        ensure!(machines.contains(&m.id().to_string()), "{machines}");
    }
    fleet_ok(via, &dir, &["submit", UNIT])?;
    let files = fleet_ok(via, &dir, &["list-unit-files", "--no-legend"])?;
    ensure!(files.contains(UNIT), "{files}");
    ensure!(fleet_ok(via, &dir, &["cat", UNIT])?.contains("hello v1"));
    fleet_ok(via, &dir, &["load", UNIT])?;
    fleet_ok(via, &dir, &["start", UNIT])?;
    let on = fleet_client_wait(&cluster, "hello v1")?;
    let units = fleet_ok(via, &dir, &["list-units", "--no-legend"])?;
    ensure!(units.contains(UNIT) && units.contains("running"), "{units}");

    // Ballast pinned to the unit's machine makes it the busier one: least-loaded placement
    // alone would take the replaced unit elsewhere.
    let home = cluster.machine_by_id(&on)?;
    for i in 0..2 {
        let name = format!("ballast{i}.service");
        let text = format!(
            "[Service]\nExecStart=/bin/sleep {}\n\n[X-Fleet]\nMachineID={}\n",
            3000 + i,
            home.id()
        );
        std::fs::write(dir.join(&name), text)?;
        fleet_ok(via, &dir, &["start", &name])?;
    }
    let before = units_on(home, &[UNIT.to_owned()])?[UNIT].main_pid.clone();

    std::fs::write(dir.join(UNIT), hello(2))?;
    never_twice(&cluster, UNIT, || {
        fleet_ok(via, &dir, &["start", "--replace", UNIT])?;
        let now = fleet_client_wait(&cluster, "hello v2")?;
        ensure!(
            now == on,
            "the replaced unit came back on {now}, not on its machine {on}"
        );
        Ok(())
    })?;
    let after = units_on(home, &[UNIT.to_owned()])?[UNIT].main_pid.clone();
    ensure!(after != before, "the old copy was not restarted: {before}");
    ensure!(fleet_ok(via, &dir, &["cat", UNIT])?.contains("hello v2"));

    fleet_ok(via, &dir, &["stop", UNIT])?;
    ensure!(running_on(&cluster, UNIT)?.is_empty());
    fleet_ok(via, &dir, &["unload", UNIT])?;
    fleet_ok(via, &dir, &["destroy", UNIT])?;
    let files = fleet_ok(via, &dir, &["list-unit-files", "--no-legend"])?;
    ensure!(!files.contains(UNIT), "{files}");
    support::finish(cluster)
}

/// Waits until one machine's systemd runs the unit with `description`; that machine's ID.
fn fleet_client_wait(cluster: &Cluster, description_is: &str) -> Result<String> {
    let mut last = BTreeMap::new();
    fleet_functional_tests::wait_for_value(TIMEOUT, POLL, || {
        last.clear();
        for m in cluster.machines() {
            let view = units_on(m, &[UNIT.to_owned()]).ok()?;
            if view.get(UNIT).is_some_and(|v| v.is_active()) {
                last.insert(m.id().to_string(), description(m).ok()?);
            }
        }
        match last.iter().next() {
            Some((id, d)) if last.len() == 1 && d == description_is => Some(id.clone()),
            _ => None,
        }
    })
    .with_context(|| format!("{UNIT} never ran as {description_is:?} on one machine: {last:?}"))
}
