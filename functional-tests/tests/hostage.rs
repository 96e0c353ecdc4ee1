//! Issue 36, item 4: one host cannot hold placement hostage. A machine's etcd credentials
//! may write any unit state under its own prefix (`P/unit-state/<M>/<unit>`); a state there
//! for a unit never scheduled on M holds nothing back. The unit starts on another machine at
//! once, the leader reports the stray state, and the unit never runs on two machines. Three
//! machines of real systemd and a real etcd with its auth on, as `fleetctl auth setup` makes
//! it: the false states are written with the lying machine's own credentials, the one
//! foothold a compromised host holds (issue 37). Needs root.

use anyhow::{Context, Result, ensure};
use fleet_core::{MachineId, SystemdState};
use fleet_functional_tests::auth::host_credentials;
use fleet_functional_tests::{Cluster, EtcdAuthSpec, FleetdSpec, TestRegistry, wait_for};
use fleet_registry::{Keys, UnitStateRecord};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
mod support;
use support::{
    POLL, PREFIX, TIMEOUT, finish, fleetctl_ok, fleetd_log_all, leader, logged, sleeper, start,
    units_on, write_units,
};

/// How soon a unit must be active once started.
const WITHIN: Duration = Duration::from_secs(15);

/// How long a unit is watched after it started, for a second copy that comes late.
const AFTER: Duration = Duration::from_secs(3);

/// Writes, as machine `on`'s own etcd user, what `on` would publish if it ran `unit`:
/// `loaded/active/running`.
fn fake_running(cluster: &Cluster, on: &MachineId, unit: &str) -> Result<()> {
    let registry =
        TestRegistry::connect_as(&cluster.etcd_endpoint(), PREFIX, Some(host_credentials(on)))?;
    let state = UnitStateRecord {
        name: unit.parse()?,
        machine: on.clone(),
        hash: None,
        systemd: SystemdState {
            load: "loaded".into(),
            active: "active".into(),
            sub: "running".into(),
        },
        drop_ins: Vec::new(),
        restart: 0,
        restart_pending: false,
        restarts: 0,
        since: None,
        exit: None,
    };
    let key = Keys::new(PREFIX).state(on, &state.name);
    registry.put_raw(&key, &serde_json::to_vec(&state)?)
}

/// The machines (by name) whose systemd may be running one of `units` (any ActiveState but
/// `inactive` and `failed`), with that ActiveState, by unit.
fn running(cluster: &Cluster, units: &[String]) -> Result<BTreeMap<String, Vec<(String, String)>>> {
    let mut on: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for machine in cluster.machines() {
        for (unit, view) in units_on(machine, units)? {
            if !["inactive", "failed"].contains(&view.active.as_str()) {
                let here = (machine.name().to_owned(), view.active);
                on.entry(unit).or_default().push(here);
            }
        }
    }
    Ok(on)
}

/// Polls every machine's systemd until each of `units` is active somewhere (within
/// [`WITHIN`] of `started`), then for [`AFTER`] more; at every poll no unit may run on two
/// machines. The machine each unit is active on, by name.
fn active_on_one_machine(
    cluster: &Cluster,
    units: &[String],
    started: Instant,
) -> Result<BTreeMap<String, String>> {
    let mut settled: Option<Instant> = None;
    loop {
        let on = running(cluster, units)?;
        let mut active = BTreeMap::new();
        for (unit, machines) in &on {
            ensure!(machines.len() == 1, "{unit} runs on {machines:?}");
            if let [(machine, state)] = &machines[..]
                && state == "active"
            {
                active.insert(unit.clone(), machine.clone());
            }
        }
        if active.len() == units.len() {
            let since = *settled.get_or_insert_with(Instant::now);
            if since.elapsed() >= AFTER {
                return Ok(active);
            }
        } else {
            ensure!(settled.is_none(), "a unit stopped after it started: {on:?}");
            ensure!(
                started.elapsed() < WITHIN,
                "not every unit active within {WITHIN:?}: {on:?}"
            );
        }
        std::thread::sleep(POLL);
    }
}

#[test]
fn a_state_a_machine_publishes_for_a_unit_never_scheduled_there_holds_nothing_back() -> Result<()> {
    let spec = FleetdSpec::default().with_etcd_auth(EtcdAuthSpec::default());
    let (cluster, registry) = start(3, spec)?;
    let (m1, m2) = (cluster.machine("m1")?, cluster.machine("m2")?);
    // m1 claims to run both units, m2 the free one too: before this rule either claim held
    // the unit back for good (the pinned one cannot go to m1, so the claim always came
    // from another machine; the free one, wherever it went, had a claim elsewhere).
    fake_running(&cluster, m1.id(), "pinned.service")?;
    fake_running(&cluster, m1.id(), "free.service")?;
    fake_running(&cluster, m2.id(), "free.service")?;
    let pinned = format!("{}\n[X-Fleet]\nMachineID={}\n", sleeper(360_001), m2.id());
    let texts: BTreeMap<String, String> = [
        ("pinned.service".to_owned(), pinned),
        ("free.service".to_owned(), sleeper(360_002)),
    ]
    .into();
    let paths = write_units(&cluster.dir().join("units"), &texts)?;
    let started = Instant::now();
    fleetctl_ok(
        &cluster,
        &[
            "start",
            "--no-block",
            paths["pinned.service"].as_str(),
            paths["free.service"].as_str(),
        ],
    )?;
    let units: Vec<String> = texts.keys().cloned().collect();
    let on = active_on_one_machine(&cluster, &units, started)?;
    ensure!(on["pinned.service"] == "m2", "pinned.service on {on:?}");
    let leader = leader(&registry)?.context("no engine leader")?;
    let leader = cluster.machine_by_id(&leader)?;
    wait_for(TIMEOUT, POLL, || {
        fleetd_log_all(leader).is_ok_and(|log| {
            logged(&log, "ignoring a stray unit state", "pinned.service")
                && log.contains(&format!("from={}", m1.id()))
        })
    })
    .with_context(|| format!("{} did not report m1's stray state", leader.name()))?;
    finish(cluster)
}
