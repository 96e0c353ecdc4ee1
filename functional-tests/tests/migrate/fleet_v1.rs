//! A real fleet v1.0 cluster inside the harness's machines, and the cutover to ours.
//!
//! Each machine runs fleet's own `fleetd` (`../shared/reference-fleet/`) as `fleet.service`,
//! configured by fleet's config file; the cutover replaces it, machine by machine, by our
//! fleetd reading the very same file. Nothing here decides what passes: the test does.

use anyhow::{Context, Result};
use fleet_functional_tests::{
    Cluster, MACHINE_BIN_DIR, Machine, OutputExt, reference_fleet_dir, reference_fleetctl_ok,
    reference_fleetctl_run, wait_for,
};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

/// fleet's configuration file in every machine, read by both fleetds (`--config`).
pub const FLEET_CONF: &str = "/run/fleet/fleet.conf";
const SERVICE_PATH: &str = "/run/systemd/system/fleet.service";
/// fleet's own default agent TTL: the time the cutover's kills have before fleet's surviving
/// engine would count a killed machine gone and schedule its units elsewhere.
const AGENT_TTL: &str = "30s";

/// How long our fleetd may take to serve or to stop.
const HUNG: Duration = Duration::from_secs(60);

/// fleet's config file for `machine`: the keys an operator of fleet sets, in fleet's syntax
/// (`units_directory` as fleet's default spells it, with its trailing slash).
pub fn fleet_conf(cluster: &Cluster, machine: &Machine, metadata: &str) -> String {
    format!(
        "# fleet v1 configuration (fleet.conf.sample's keys)\n\
         etcd_servers={etcd}\n\
         public_ip={ip}\n\
         metadata={metadata}\n\
         agent_ttl={AGENT_TTL}\n\
         units_directory=/run/fleet/units/\n",
        etcd = cluster.etcd_endpoint(),
        ip = machine.ip(),
    )
}

/// `fleet.service` running `binary` with fleet's config file. `KillMode=process`, as the
/// harness's own unit: stopping fleetd never touches the units (they have cgroups of their
/// own anyway). No `Restart=`: a fleetd killed by the cutover stays dead.
fn fleet_service(binary: &str) -> String {
    format!(
        "[Unit]\nDescription=fleet daemon\nWants=dbus.service\nAfter=dbus.service\n\n\
         [Service]\nExecStart={binary} --config={FLEET_CONF}\nKillMode=process\n"
    )
}

/// Installs fleet's config file and fleet's fleetd as `fleet.service` in `machine`, starts it.
pub fn start_fleets_fleetd(cluster: &Cluster, machine: &Machine, metadata: &str) -> Result<()> {
    let dir = reference_fleet_dir()?.canonicalize()?;
    let binary = dir.join("fleetd");
    machine.write_file(FLEET_CONF, fleet_conf(cluster, machine, metadata))?;
    install_and_start(machine, &binary.display().to_string())
}

/// The cutover's step 2 on `machine`: fleet's fleetd killed with SIGKILL (its graceful stop
/// would stop every unit it runs), then waited for.
pub fn kill_fleets_fleetd(machine: &Machine) -> Result<()> {
    machine.systemctl_ok(&["kill", "-s", "SIGKILL", "fleet.service"])?;
    wait_for(Duration::from_secs(10), super::POLL, || {
        machine
            .systemctl(["is-active", "fleet.service"])
            .is_ok_and(|o| o.stdout_text().trim() != "active")
    })
    .with_context(|| format!("fleet's fleetd on {} outlived SIGKILL", machine.name()))
}

/// The cutover's step 3 on `machine`: our fleetd as `fleet.service`, with fleet's file.
pub fn start_our_fleetd(machine: &Machine) -> Result<()> {
    install_and_start(machine, &format!("{MACHINE_BIN_DIR}/fleetd"))
}

/// A machine outside fleet's cluster whose fleetd of ours serves the API on its unix socket
/// (admin), for `import-fleet --driver api` before any fleet machine runs ours. No engine
/// (`disable_engine=true`): nothing of ours schedules before the cutover.
pub fn start_api_fleetd(cluster: &mut Cluster) -> Result<&Machine> {
    cluster.add_machine()?;
    let cluster: &Cluster = cluster;
    let machine = cluster.machines().last().context("no machine added")?;
    let conf = fleet_conf(cluster, machine, "hostname=api") + "disable_engine=true\n";
    machine.write_file(FLEET_CONF, conf)?;
    start_our_fleetd(machine)?;
    wait_for(HUNG, super::POLL, || {
        fleet_functional_tests::serves(&machine.api_socket())
    })
    .with_context(|| format!("{}'s fleetd never served its API", machine.name()))?;
    Ok(machine)
}

/// The way back's step on `machine` (docs/migrating.md, "The way back"): ours killed with
/// SIGKILL (its graceful stop would arm its fence), its fence timers stopped, fleet's fleetd
/// started again with its config file.
pub fn kill_ours_for_fleet(machine: &Machine) -> Result<()> {
    machine.systemctl_ok(&["kill", "-s", "SIGKILL", "fleet.service"])?;
    machine.systemctl_ok(&["stop", "fleet-fence-*.timer"])?;
    wait_for(HUNG, super::POLL, || {
        machine
            .systemctl(["is-active", "fleet.service"])
            .is_ok_and(|o| o.stdout_text().trim() != "active")
    })
    .with_context(|| format!("our fleetd on {} outlived SIGKILL", machine.name()))
}

fn install_and_start(machine: &Machine, binary: &str) -> Result<()> {
    install(machine, binary)?;
    machine.systemctl_ok(&["start", "fleet.service"])?;
    Ok(())
}

fn install(machine: &Machine, binary: &str) -> Result<()> {
    machine.write_file(SERVICE_PATH, fleet_service(binary))?;
    machine.systemctl_ok(&["daemon-reload"])?;
    Ok(())
}

/// The way back (docs/migrating.md): fleet's fleetd installed again on every machine of
/// `machines` (each with its `metadata=`) and started on all of them, with `extra` added
/// to its config file (`disable_engine=true`: fleet's engine moves the units of every
/// machine it does not see, and started together the fleetds still ran a unit twice).
pub fn start_fleets_fleetds(
    cluster: &Cluster,
    machines: &[(&Machine, &str)],
    extra: &str,
) -> Result<()> {
    let binary = reference_fleet_dir()?.canonicalize()?.join("fleetd");
    for (machine, metadata) in machines {
        let conf = fleet_conf(cluster, machine, metadata) + extra;
        machine.write_file(FLEET_CONF, conf)?;
        install(machine, &binary.display().to_string())?;
    }
    for (machine, _) in machines {
        machine.systemctl_ok(&["start", "--no-block", "fleet.service"])?;
    }
    Ok(())
}

/// fleet's own fleetctl over its etcd driver, run in `dir` (where the unit files are),
/// killed if it hangs.
pub fn fleet(cluster: &Cluster, dir: &Path, args: &[&str]) -> Result<Output> {
    reference_fleetctl_run(&etcd_driver(cluster), dir, args)
}

/// The same, which must succeed; its stdout.
pub fn fleet_ok(cluster: &Cluster, dir: &Path, args: &[&str]) -> Result<String> {
    reference_fleetctl_ok(&etcd_driver(cluster), dir, args)
}

/// fleetctl's arguments for the cluster's etcd.
fn etcd_driver(cluster: &Cluster) -> [String; 2] {
    [
        "--driver=etcd".to_owned(),
        format!("--endpoint={}", cluster.etcd_endpoint()),
    ]
}

/// One unit of the cluster and what the test does with it under fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `fleetctl start`: runs on one machine.
    Launched,
    /// `Global=true`: runs on every machine.
    Global,
    /// `fleetctl load`: loaded on one machine, not started.
    Loaded,
    /// `fleetctl submit`: in the registry only.
    Submitted,
}

/// The unit files: name, text, role. Template instances come from `web@.service`.
pub fn unit_files() -> Vec<(&'static str, String, Role)> {
    let sleeper = |what: &str, secs: u32, fleet: &str| {
        format!("[Unit]\nDescription={what}\n\n[Service]\nExecStart=/bin/sleep {secs}\n{fleet}")
    };
    vec![
        (
            "plain1.service",
            sleeper("plain 1", 10001, ""),
            Role::Launched,
        ),
        (
            "plain2.service",
            sleeper("plain 2", 10002, ""),
            Role::Launched,
        ),
        (
            "web@.service",
            "[Unit]\nDescription=web %i\n\n[Service]\nExecStart=/bin/sleep 2000%i\n\n\
             [X-Fleet]\nConflicts=web@*.service\n"
                .to_owned(),
            Role::Submitted,
        ),
        (
            "global.service",
            sleeper("global", 10003, "\n[X-Fleet]\nGlobal=true\n"),
            Role::Global,
        ),
        (
            "pair-a.service",
            sleeper("pair a", 10004, ""),
            Role::Launched,
        ),
        (
            "pair-b.service",
            sleeper("pair b", 10005, "\n[X-Fleet]\nMachineOf=pair-a.service\n"),
            Role::Launched,
        ),
        (
            "meta.service",
            sleeper("meta", 10006, "\n[X-Fleet]\nMachineMetadata=role=special\n"),
            Role::Launched,
        ),
        (
            "submitted.service",
            sleeper("submitted", 10007, ""),
            Role::Submitted,
        ),
        ("loaded.service", sleeper("loaded", 10008, ""), Role::Loaded),
    ]
}

/// The template's instances the test starts, one per machine (they conflict).
pub const WEB_INSTANCES: [&str; 3] = ["web@1.service", "web@2.service", "web@3.service"];
