//! Watching instead of polling (issue 41), end to end on a real fleetd, etcd and systemd:
//! `fleetctl list-units --watch` prints a unit's start within a second over either driver
//! (etcd's watch, fleetd's `GET /fleet/v1/changes`), and a blocking `start` over the API
//! follows the change stream: fleetd counts one stream and a handful of state reads, where
//! polling read the states every 20 to 250 ms. Needs root.

mod support;

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::metrics::scrape;
use fleet_functional_tests::{Cluster, Driver, FleetdSpec};
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::{TIMEOUT, finish, sleeper, start};

/// The unit file `name` in the cluster's directory; its path.
fn unit_file(cluster: &Cluster, name: &str, text: &str) -> Result<String> {
    let dir = cluster.dir().join("units");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(name), text)?;
    Ok(dir.join(name).display().to_string())
}

/// A fleetctl left running, its stdout's and stderr's lines sent on channels as they come.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    errors: mpsc::Receiver<String>,
}

/// Sends each line of `from` on a new channel, from a thread of its own.
fn lines_of(from: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// The first line of `lines` that `accept` takes within `within`.
fn wait_line(
    lines: &mpsc::Receiver<String>,
    within: Duration,
    accept: impl Fn(&str) -> bool,
) -> Result<String> {
    let until = Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if accept(&line) => return Ok(line),
            Ok(line) => seen.push(line),
            Err(_) => anyhow::bail!("nothing accepted within {within:?}; saw {seen:?}"),
        }
    }
}

impl Running {
    fn start(cluster: &Cluster, driver: Driver, args: &[&str]) -> Result<Running> {
        let mut child = cluster
            .fleetctl_command(driver)?
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let lines = lines_of(child.stdout.take().context("no stdout")?);
        let errors = lines_of(child.stderr.take().context("no stderr")?);
        Ok(Running {
            child,
            lines,
            errors,
        })
    }

    /// The first line of stdout `accept` takes within `within`.
    fn wait(&self, within: Duration, accept: impl Fn(&str) -> bool) -> Result<String> {
        wait_line(&self.lines, within, accept)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn list_units_watch_prints_a_start_within_a_second_over_either_driver() -> Result<()> {
    let (cluster, _registry) = start(1, FleetdSpec::default())?;
    for driver in Driver::ALL {
        let unit = format!("watched-{driver:?}.service").to_lowercase();
        let path = unit_file(&cluster, &unit, &sleeper(3600))?;
        let watch = Running::start(
            &cluster,
            driver,
            &["list-units", "--watch", "--fields", "unit,active"],
        )?;
        watch
            .wait(TIMEOUT, |l| l.starts_with("UNIT"))
            .with_context(|| format!("{driver:?}: the first listing"))?;
        let run = cluster
            .fleetctl_command(driver)?
            .args(["start", &path])
            .stdin(Stdio::null())
            .output()?;
        ensure!(run.status.success(), "{driver:?}: start failed: {run:?}");
        // The start returned once the unit was active: the watch says so within a second.
        let started = Instant::now();
        watch
            .wait(Duration::from_secs(1), |l| {
                l.starts_with(&unit) && l.contains("active")
            })
            .with_context(|| format!("{driver:?}: the watch after {:?}", started.elapsed()))?;
        if driver == Driver::Api {
            reconnects_after_fleetd_restarts(&cluster, &watch)?;
        }
    }
    finish(cluster)
}

/// The API's fleetd restarts under a `--watch`: it says it lost the stream, reconnects, and
/// prints the next change.
fn reconnects_after_fleetd_restarts(cluster: &Cluster, watch: &Running) -> Result<()> {
    cluster.api_machine()?.restart_fleetd()?;
    wait_line(&watch.errors, TIMEOUT, |l| {
        l.starts_with("The change stream was lost")
    })?;
    wait_line(&watch.errors, TIMEOUT, |l| {
        l == "Reconnected to the change stream"
    })?;
    let path = unit_file(cluster, "after-restart.service", &sleeper(3600))?;
    let run = cluster
        .fleetctl_command(Driver::Api)?
        .args(["start", &path])
        .stdin(Stdio::null())
        .output()?;
    ensure!(
        run.status.success(),
        "start after the restart failed: {run:?}"
    );
    watch
        .wait(Duration::from_secs(1), |l| {
            l.starts_with("after-restart.service") && l.contains("active")
        })
        .context("the watch after it reconnected")?;
    Ok(())
}

#[test]
fn a_blocking_start_over_the_api_follows_the_change_stream_instead_of_polling() -> Result<()> {
    let (cluster, _registry) = start(1, FleetdSpec::default())?;
    let machine = cluster.api_machine()?;
    // Three seconds between the start and the unit's being active: polling read the states
    // at least 22 times meanwhile (ten every 20 ms, then every 250 ms at most).
    let slow = "[Service]\nExecStartPre=/bin/sleep 3\nExecStart=/bin/sleep 3600\n";
    let path = unit_file(&cluster, "slow.service", slow)?;
    let count = |route: &str| -> Result<f64> {
        Ok(scrape(machine)?.sum("fleet_api_requests_total", &[&format!("route=\"{route}\"")]))
    };
    let (states, streams) = (count("/state")?, count("/changes")?);
    let began = Instant::now();
    let run = cluster
        .fleetctl_command(Driver::Api)?
        .args(["start", &path])
        .stdin(Stdio::null())
        .output()?;
    ensure!(run.status.success(), "start failed: {run:?}");
    ensure!(
        began.elapsed() >= Duration::from_secs(3),
        "too quick a start"
    );
    let (states, streams) = (count("/state")? - states, count("/changes")? - streams);
    ensure!(streams == 1.0, "{streams} change streams");
    ensure!(states <= 10.0, "{states} state reads in a start of 3 s");
    finish(cluster)
}
