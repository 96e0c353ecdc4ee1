//! Our fleetctl over the API of fleet v1.0's own fleetd (`../shared/reference-fleet/`), which
//! has no change stream (issue 41): `list-units --watch` says at once that this fleetd
//! serves no stream, instead of polling. (A wait's fallback to polling against such a fleetd
//! is `crates/fleetctl/tests/api_driver.rs`'s: our fleetctl's writes and listings need our
//! API's extensions, which fleet's fleetd does not answer.) Needs root and the reference
//! fleet.

#[path = "migrate/fleet_v1.rs"]
#[allow(dead_code)]
mod fleet_v1;
mod support;

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{Cluster, ClusterSpec, OutputExt, cleanup_stale, reference_fleet_dir};
use std::process::{Command, Stdio};
use support::{POLL, TIMEOUT, sleeper};

/// Our fleetctl over the API of `cluster`'s first machine (fleet's fleetd there).
fn ours(cluster: &Cluster) -> Result<Command> {
    let machine = &cluster.machines()[0];
    let mut command = Command::new(cluster.fleetctl_path());
    command
        .env("FLEETCTL_DRIVER", "api")
        .env("FLEETCTL_ENDPOINT", machine.api_endpoint())
        .stdin(Stdio::null());
    Ok(command)
}

#[test]
fn against_fleets_own_fleetd_a_watch_says_there_is_no_stream() -> Result<()> {
    reference_fleet_dir()?;
    cleanup_stale()?;
    let cluster = Cluster::start(ClusterSpec::bare(1).with_etcd_v2())?;
    let machine = &cluster.machines()[0];
    // fleet's fleetd serves its API only on the sockets systemd passes it: fleet.socket.
    fleet_v1::start_fleets_fleetd(&cluster, machine, "")?;
    machine.write_file(
        "/run/systemd/system/fleet.socket",
        include_str!("../../dist/fleet.socket"),
    )?;
    // systemd starts no socket whose service runs: stopped first (no unit runs yet).
    machine.systemctl_ok(&["stop", "fleet.service"])?;
    machine.systemctl_ok(&["daemon-reload"])?;
    machine.systemctl_ok(&["start", "fleet.socket"])?;
    machine.systemctl_ok(&["start", "fleet.service"])?;
    let dir = cluster.dir().join("units");
    std::fs::create_dir_all(&dir)?;
    fleet_functional_tests::wait_for(TIMEOUT, POLL, || {
        fleet_v1::fleet(&cluster, &dir, &["list-machines", "--no-legend"])
            .is_ok_and(|o| o.stdout_text().lines().count() == 1)
    })
    .context("fleet's fleetd never joined")?;
    // Our fleetctl's writes and listings need our API's extensions, which fleet's fleetd
    // does not answer: the unit is started by fleet's own fleetctl.
    std::fs::write(dir.join("polled.service"), sleeper(3600))?;
    fleet_v1::fleet_ok(&cluster, &dir, &["start", "polled.service"])?;
    let watch = ours(&cluster)?.args(["list-units", "--watch"]).output()?;
    ensure!(
        !watch.status.success()
            && String::from_utf8_lossy(&watch.stderr).contains("serves no change stream"),
        "list-units --watch against fleet's fleetd: {}{}",
        watch.stdout_text(),
        String::from_utf8_lossy(&watch.stderr)
    );
    support::finish(cluster)
}
