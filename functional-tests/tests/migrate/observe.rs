//! What the migration test looks at: each machine's systemd (which unit runs where, as which
//! process and invocation) and our v3 keyspace, read raw.

use super::support::{TIMEOUT, units_on};
use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{Cluster, Machine, TestRegistry, wait_for};
use fleet_registry::Key;
use fleet_registry::kv::Kv;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// One run of a unit: systemd's MainPID and InvocationID.
pub type Run = (String, String);
/// A unit-file listing: unit -> (hash, desired state).
pub type UnitFilesTable = BTreeMap<String, (String, String)>;
/// Every active run of the units looked at: unit -> machine name -> run.
pub type Runs = BTreeMap<String, BTreeMap<String, Run>>;

/// The active runs of `units` on every machine, from each machine's systemd.
pub fn runs(cluster: &Cluster, units: &[String]) -> Result<Runs> {
    let mut out = Runs::new();
    for machine in cluster.machines() {
        for (unit, view) in units_on(machine, units)? {
            if view.is_active() {
                out.entry(unit)
                    .or_default()
                    .insert(machine.name().to_owned(), view.identity());
            }
        }
    }
    Ok(out)
}

/// Fails if a unit of `single` (none of them global) is active on two machines at once.
pub fn assert_single(cluster: &Cluster, single: &[String]) -> Result<()> {
    for (unit, on) in runs(cluster, single)? {
        ensure!(
            on.len() <= 1,
            "{unit} runs on {:?} at once",
            on.keys().collect::<Vec<_>>()
        );
    }
    Ok(())
}

/// [`assert_single`], sampled for `period`.
pub fn watch_single(cluster: &Cluster, single: &[String], period: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        assert_single(cluster, single)?;
        if start.elapsed() >= period {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until every unit of `launched` is active on exactly one machine and every unit of
/// `global` on all of them; those runs.
pub fn wait_running(cluster: &Cluster, launched: &[String], global: &[String]) -> Result<Runs> {
    let all: Vec<String> = launched.iter().chain(global).cloned().collect();
    let machines = cluster.machines().len();
    let mut last = Runs::new();
    wait_for(TIMEOUT * 4, Duration::from_millis(250), || {
        let Ok(now) = runs(cluster, &all) else {
            return false;
        };
        last = now;
        launched
            .iter()
            .all(|u| last.get(u).is_some_and(|on| on.len() == 1))
            && global
                .iter()
                .all(|u| last.get(u).is_some_and(|on| on.len() == machines))
    })
    .with_context(|| format!("the units never all ran: {last:#?}"))?;
    Ok(last)
}

/// The machines on which `unit` is loaded (its file linked) but not active.
pub fn loaded_only_on(cluster: &Cluster, unit: &str) -> Result<Vec<String>> {
    let mut on = Vec::new();
    for machine in cluster.machines() {
        let view = &units_on(machine, &[unit.to_owned()])?[unit];
        if view.load == "loaded" && !view.is_active() {
            on.push(machine.name().to_owned());
        }
    }
    Ok(on)
}

/// Every key of our v3 keyspace under fleet's prefix, with its value and mod revision.
pub fn keyspace(registry: &TestRegistry) -> Result<Vec<(String, Vec<u8>, i64)>> {
    let kvs = registry
        .block_on(
            registry
                .registry()
                .raw_kv()
                .range(fleet_registry::DEFAULT_PREFIX, true, None),
        )
        .context("reading our keyspace")?;
    Ok(kvs
        .kvs
        .into_iter()
        .map(|kv| (kv.key, kv.value, kv.mod_revision))
        .collect())
}

/// Whether `machine`'s migration mark (`P/migrating/<machine>`) is in our registry.
pub fn has_mark(registry: &TestRegistry, machine: &Machine) -> Result<bool> {
    let key = registry.registry().keys().migrating(machine.id());
    let found = registry
        .block_on(registry.registry().raw_kv().range(&key, false, None))
        .context("reading a migration mark")?;
    Ok(!found.kvs.is_empty())
}

/// `list-unit-files --no-legend --full --fields=unit,hash,dstate` as unit -> (hash, dstate):
/// fleet's and ours print the same table.
pub fn unit_files_table(text: &str) -> UnitFilesTable {
    text.lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            match cols.as_slice() {
                [unit, hash, dstate] => Some((
                    (*unit).to_owned(),
                    ((*hash).to_owned(), (*dstate).to_owned()),
                )),
                _ => None,
            }
        })
        .collect()
}

/// Our schedule as (unit, machine) pairs, read raw (each entry's key).
pub fn schedule(registry: &TestRegistry) -> Result<BTreeSet<(String, String)>> {
    let keys = registry.registry().keys();
    let found = registry
        .block_on(
            registry
                .registry()
                .raw_kv()
                .range(&keys.schedules(), true, None),
        )
        .context("reading our schedule")?;
    found
        .kvs
        .iter()
        .map(|kv| match Key::parse(keys, &kv.key) {
            Some(Key::Schedule { machine, unit }) => Ok((unit.to_string(), machine.to_string())),
            _ => anyhow::bail!("not a schedule key: {}", kv.key),
        })
        .collect()
}

/// How many machines' presences our registry holds.
pub fn machine_count(registry: &TestRegistry) -> Result<usize> {
    let keys = registry.registry().keys();
    let found = registry
        .block_on(
            registry
                .registry()
                .raw_kv()
                .range(&keys.machines(), true, None),
        )
        .context("reading our machines")?;
    Ok(found.kvs.len())
}

/// The keys whose value or mod revision differ between two [`keyspace`] reads, or that only
/// one holds, one a line.
pub fn keyspace_diff(
    before: &[(String, Vec<u8>, i64)],
    after: &[(String, Vec<u8>, i64)],
) -> String {
    let index = |kvs: &[(String, Vec<u8>, i64)]| -> BTreeMap<String, (Vec<u8>, i64)> {
        kvs.iter()
            .map(|(k, v, r)| (k.clone(), (v.clone(), *r)))
            .collect()
    };
    let (before, after) = (index(before), index(after));
    let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| {
            let rev = |m: &BTreeMap<String, (Vec<u8>, i64)>| m.get(k).map(|(_, r)| *r);
            format!("{k}: revision {:?} -> {:?}", rev(&before), rev(&after))
        })
        .collect::<Vec<_>>()
        .join("\n")
}
