//! `trust_engine_files` on a real cluster (issue 43): with it on every host, the engine writes
//! each unit file of at most 2 KiB into the schedule entries that name it, and the agents run
//! it from there; a larger file is read from the registry as before. Whatever the file's
//! source, every unit runs on exactly one machine's systemd at every poll. Needs root.

use anyhow::{Context, Result, bail, ensure};
use fleet_functional_tests::FleetdSpec;
use std::collections::BTreeMap;
use std::time::Instant;

mod support;
use support::{
    POLL, PREFIX, TIMEOUT, dump, finish, fleetctl_ok, sleeper, start, units_on, write_units,
};

/// How many machines' systemd run each of `units` now.
fn copies(cluster: &fleet_functional_tests::Cluster, units: &[String]) -> Result<Vec<usize>> {
    let mut counts = vec![0; units.len()];
    for machine in cluster.machines().iter().filter(|m| m.is_up()) {
        let views = units_on(machine, units)?;
        for (i, unit) in units.iter().enumerate() {
            if views.get(unit).is_some_and(support::UnitView::is_active) {
                counts[i] += 1;
            }
        }
    }
    Ok(counts)
}

/// Polls every machine's systemd until each of `units` runs `want` times (1 or 0), failing
/// at once if one ever runs on two machines.
fn wait_copies(
    cluster: &fleet_functional_tests::Cluster,
    units: &[String],
    want: usize,
) -> Result<()> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let counts = copies(cluster, units)?;
        if let Some(i) = counts.iter().position(|&n| n > 1) {
            bail!("{} runs on {} machines at once", units[i], counts[i]);
        }
        if counts.iter().all(|&n| n == want) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("not every unit of {units:?} runs {want} times: {counts:?}");
        }
        std::thread::sleep(POLL);
    }
}

#[test]
fn trusted_engine_files_ride_in_the_entries_and_every_unit_runs_once() -> Result<()> {
    let spec = FleetdSpec::default().with_env("FLEET_TRUST_ENGINE_FILES", "true");
    let (cluster, registry) = start(3, spec)?;
    let mut texts: BTreeMap<String, String> = (0..6)
        .map(|i| (format!("small{i}.service"), sleeper(100_000 + i)))
        .collect();
    // Past the 2 KiB an entry carries: its agent reads it from the registry.
    let pad = "Environment=PAD=".to_owned() + &"x".repeat(64) + "\n";
    let big = sleeper(100_100) + &pad.repeat(40);
    ensure!(big.len() > fleet_registry::MAX_CARRIED_TEXT);
    texts.insert("big.service".to_owned(), big);
    let paths = write_units(&cluster.dir().join("units"), &texts)?;
    let mut args = vec!["start".to_owned(), "--no-block".to_owned()];
    args.extend(paths.values().cloned());
    fleetctl_ok(&cluster, &args)?;
    let units: Vec<String> = texts.keys().cloned().collect();
    wait_copies(&cluster, &units, 1)?;

    let (_, entries) = dump(&registry, &format!("{PREFIX}schedule/"))?;
    ensure!(entries.len() == units.len(), "{:?}", entries.keys());
    for (key, value) in &entries {
        let entry: serde_json::Value = serde_json::from_slice(value).context("an entry")?;
        let carried = entry.get("text").and_then(serde_json::Value::as_str);
        let name = key.rsplit('/').next().unwrap_or_default();
        match carried {
            Some(text) => ensure!(
                name != "big.service" && texts[name].trim_end() == text.trim_end(),
                "{key} carries {text:?}"
            ),
            None => ensure!(name == "big.service", "{key} carries no file"),
        }
    }

    let mut destroy = vec!["destroy".to_owned()];
    destroy.extend(units.iter().cloned());
    fleetctl_ok(&cluster, &destroy)?;
    wait_copies(&cluster, &units, 0)?;
    finish(cluster)
}
