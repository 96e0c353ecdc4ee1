//! fleetd's runtime directory, /run/fleet, against a local user without privileges (issue 36):
//! nobody (uid 65534, through `setpriv`) can open anything in it, and one who holds the lock
//! file anyway, opened while the directory still let them in (an older fleetd made it 0755
//! and the lock 0644), cannot keep fleetd down: the restarted fleetd takes the lock over, is
//! back and registered within seconds, and the units it runs keep running. Units still work
//! with their files below a 0700 directory (systemd reads them as root). Needs root.
//!
//! The restart is a stop, then a start once the squatter (waiting on the lock since before
//! the stop) holds it: in a `systemctl restart` it wins the lock too, but only almost always.

use anyhow::{Context, Result, ensure};
use fleet_core::DesiredState;
use fleet_functional_tests::{
    EtcdAuthSpec, FleetdSpec, Machine, OutputExt, wait_for, wait_for_value,
};
use std::time::{Duration, Instant};
mod support;
use support::{
    POLL, TIMEOUT, finish, fleetctl_ok, fleetd_log, journal_cursor, sleeper, start, units_on,
};

const RUNTIME_DIR: &str = "/run/fleet";
const LOCK: &str = "/run/fleet/fleetd.lock";
/// `setpriv`'s arguments for a `flock` as nobody: no privilege, no group of root's.
const NOBODY_FLOCK: [&str; 4] = ["--reuid=65534", "--regid=65534", "--clear-groups", "flock"];
const SQUATTER: &str = "lock-squatter.service";
/// How soon fleetd must be back: a few agent TTLs at most, so that the lease survives.
const BACK_WITHIN: Duration = Duration::from_secs(10);

/// `stat`'s octal mode and owner of `path` in the machine, as `700 0`.
fn mode_and_owner(machine: &Machine, path: &str) -> Result<String> {
    Ok(machine
        .sh(&format!("stat -c '%a %u' {path}"))?
        .trim()
        .to_owned())
}

/// The MainPID of a running `unit`.
fn running_pid(machine: &Machine, unit: &str) -> Option<String> {
    let views = units_on(machine, &[unit.to_owned()]).ok()?;
    let view = views.get(unit)?;
    (view.is_active() && view.main_pid != "0").then(|| view.main_pid.clone())
}

/// Whether root can take the lock now (nobody holds it).
fn lock_free(machine: &Machine) -> Result<bool> {
    Ok(machine
        .exec("flock", ["-n", LOCK, "true"])?
        .status
        .success())
}

#[test]
fn an_unprivileged_user_holding_the_lock_file_cannot_keep_fleetd_down() -> Result<()> {
    let (cluster, registry) = start(
        1,
        // etcd's auth on, as the attack meets a deployed host (issue 37, Tests).
        FleetdSpec::default()
            .with_env("FLEET_DISABLE_ENGINE", "true")
            .with_etcd_auth(EtcdAuthSpec::default()),
    )?;
    let m1 = &cluster.machines()[0];
    registry.submit_and_schedule(
        m1.id(),
        "hello.service",
        &sleeper(100_000),
        DesiredState::Launched,
    )?;
    let hello = wait_for_value(TIMEOUT, POLL, || running_pid(m1, "hello.service"))
        .context("hello.service, linked from below a 0700 directory, never ran")?;

    // fleetd's directory and lock are root's alone.
    ensure!(mode_and_owner(m1, RUNTIME_DIR)? == "700 0");
    ensure!(mode_and_owner(m1, LOCK)? == "600 0");
    let paths = m1.sh(&format!("find {RUNTIME_DIR}"))?;
    for wanted in ["fleetd.lock", "fleetd.lease", "units/hello.service"] {
        let path = format!("{RUNTIME_DIR}/{wanted}");
        ensure!(paths.lines().any(|p| p == path), "no {path} in:\n{paths}");
    }
    for path in paths.lines() {
        let mut args = NOBODY_FLOCK.to_vec();
        args.extend(["-n", path, "true"]);
        let out = m1.exec("setpriv", &args)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && stderr.contains("Permission denied"),
            "nobody could open {path} (exit {:?}): {stderr}",
            out.status.code()
        );
    }

    // As an older fleetd left them, so that nobody opens the lock and waits for fleetd's
    // restart to take it.
    m1.sh(&format!("chmod 0755 {RUNTIME_DIR} && chmod 0644 {LOCK}"))?;
    let mut squat = vec!["--quiet", "--unit", SQUATTER, "--", "setpriv"];
    squat.extend(NOBODY_FLOCK);
    squat.extend([LOCK, "sleep", "infinity"]);
    m1.exec("systemd-run", &squat)?
        .checked()
        .context("systemd-run of the squatter")?;
    let fleetd = m1
        .main_pid("fleet.service")?
        .context("fleetd not running")?;
    m1.stop_fleetd()?;
    wait_for(TIMEOUT, POLL, || lock_free(m1).is_ok_and(|free| !free)).with_context(|| {
        let log = m1.journal(&["-u", SQUATTER, "-o", "cat"]);
        format!("nobody never took the lock fleetd let go: {log:?}")
    })?;
    let squatter = m1.main_pid(SQUATTER)?.context("the squatter is gone")?;

    let cursor = journal_cursor(m1)?;
    let restarted = Instant::now();
    m1.start_fleetd()?;
    let ip = m1.ip().to_string();
    let mut last = String::new();
    wait_for(BACK_WITHIN, POLL, || {
        let back = m1
            .main_pid("fleet.service")
            .is_ok_and(|p| p.is_some_and(|p| p != fleetd))
            && fleetd_log(m1, &cursor).is_ok_and(|log| log.contains("fleetd started"));
        last = fleetctl_ok(&cluster, &["list-machines", "--no-legend"])
            .map_or_else(|e| format!("{e:#}"), |r| r.stdout);
        back && last.contains(&ip)
    })
    .with_context(|| {
        format!(
            "fleetd not back within {BACK_WITHIN:?}; list-machines: {last}\nits log:\n{}",
            fleetd_log(m1, &cursor).unwrap_or_default()
        )
    })?;
    eprintln!("fleetd back and listed after {:?}", restarted.elapsed());

    let log = fleetd_log(m1, &cursor)?;
    let taken = log
        .lines()
        .find(|l| l.contains("taking it over"))
        .with_context(|| format!("no take-over in fleetd's log:\n{log}"))?;
    for field in [format!("pid={squatter}"), "uid=65534".to_owned()] {
        ensure!(taken.contains(&field), "{field} not in {taken:?}");
    }
    ensure!(
        log.contains("old_mode=0755") && log.contains("old_mode=0644"),
        "the old modes are not named:\n{log}"
    );
    ensure!(mode_and_owner(m1, RUNTIME_DIR)? == "700 0");
    ensure!(mode_and_owner(m1, LOCK)? == "600 0");
    ensure!(
        running_pid(m1, "hello.service").as_ref() == Some(&hello),
        "hello.service did not keep its MainPID {hello}"
    );
    // The restarted fleetd works: a unit scheduled now runs.
    registry.submit_and_schedule(
        m1.id(),
        "after.service",
        &sleeper(100_001),
        DesiredState::Launched,
    )?;
    wait_for_value(TIMEOUT, POLL, || running_pid(m1, "after.service"))
        .context("a unit scheduled after the take-over never ran")?;
    // The squatter holds a file no path leads to: the lock is fleetd's.
    ensure!(m1.main_pid(SQUATTER)? == Some(squatter));
    ensure!(!lock_free(m1)?, "fleetd does not hold {LOCK}");

    m1.systemctl_ok(&["stop", SQUATTER])?;
    finish(cluster)
}
