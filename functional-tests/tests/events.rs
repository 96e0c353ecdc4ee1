//! Events (issue 41), end to end on real fleetds, etcd and systemd: a start shows who submitted
//! the unit, where the engine placed it and that its agent started it in `fleetctl events
//! --unit`; `events --follow`
//! sees a start within a second; a machine loss shows the unit moved, naming both machines;
//! `list-machines --fields machine,leader` marks the one leader. Over the TLS API with etcd's
//! auth on, a destroy by an operator's certificate records its subject, one refused to a
//! viewer records nothing, and events expire after the (short) retention. Needs root.

mod support;

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{Cluster, EtcdAuthSpec, FleetdSpec, OutputExt, wait_for};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::{POLL, TIMEOUT, finish, fleetctl_ok, leader, sleeper, start, units_on};

const PORT: u16 = 49155;

/// The unit file `name` in the cluster's directory, written with a long sleep; its path.
fn unit_file(cluster: &Cluster, name: &str, seconds: u32) -> Result<String> {
    let dir = cluster.dir().join("units");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(name), sleeper(seconds))?;
    Ok(dir.join(name).display().to_string())
}

/// `fleetctl events --output json [args]`: the events, oldest first.
fn events(cluster: &Cluster, args: &[&str]) -> Result<Vec<Value>> {
    let mut all = vec!["events", "--output", "json"];
    all.extend_from_slice(args);
    let run = fleetctl_ok(cluster, &all)?;
    let page: Value = serde_json::from_str(&run.stdout).context("events --output json")?;
    Ok(page["events"].as_array().cloned().unwrap_or_default())
}

fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// Waits until `unit`'s events hold one of `kind`; returns it.
fn wait_event(cluster: &Cluster, unit: &str, kind: &str) -> Result<Value> {
    let mut found = None;
    let mut last = Vec::new();
    wait_for(TIMEOUT, POLL, || {
        last = events(cluster, &["--unit", unit]).unwrap_or_default();
        found = last.iter().find(|e| e["kind"] == kind).cloned();
        found.is_some()
    })
    .with_context(|| format!("no {kind} event of {unit}; events: {:?}", kinds(&last)))?;
    Ok(found.expect("waited for"))
}

/// The machines whose systemd runs `unit` now.
fn running(cluster: &Cluster, unit: &str) -> Result<BTreeSet<String>> {
    let mut on = BTreeSet::new();
    for m in cluster.machines().iter().filter(|m| m.is_up()) {
        let views = units_on(m, &[unit.to_owned()])?;
        if views
            .get(unit)
            .is_some_and(|v| v.active != "inactive" && v.active != "failed")
        {
            on.insert(m.name().to_owned());
        }
    }
    Ok(on)
}

/// `fleetctl events --follow --output json`, its lines sent on a channel as they come.
/// Events of different writers arrive in the order they were written, not by time (the
/// engine may write `scheduled` before fleetctl, on its way out, writes `submitted`, though
/// stamped later): what was read is kept for later waits.
struct Follow {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: std::cell::RefCell<Vec<Value>>,
}

impl Follow {
    fn start(cluster: &Cluster) -> Result<Follow> {
        let mut child = cluster
            .fleetctl_command(cluster.driver())?
            .args(["events", "--follow", "--output", "json"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let out = child.stdout.take().context("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Follow {
            child,
            lines,
            seen: std::cell::RefCell::new(Vec::new()),
        })
    }

    /// The first line naming `unit` with `kind`, within `within`.
    fn wait(&self, unit: &str, kind: &str, within: Duration) -> Result<Value> {
        let matches = |e: &Value| e["unit"] == unit && e["kind"] == kind;
        if let Some(e) = self.seen.borrow().iter().find(|e| matches(e)) {
            return Ok(e.clone());
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .with_context(|| format!("no {kind} event of {unit} followed within {within:?}"))?;
            let event: Value = serde_json::from_str(&line)?;
            self.seen.borrow_mut().push(event.clone());
            if matches(&event) {
                return Ok(event);
            }
        }
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_units_events_tell_its_start_its_move_and_who_leads() -> Result<()> {
    let (cluster, registry) = start(3, FleetdSpec::default())?;
    // Exactly one machine leads, the one the leader key names.
    let leader_id = {
        let mut id = None;
        wait_for(TIMEOUT, POLL, || {
            id = leader(&registry).ok().flatten();
            id.is_some()
        })?;
        id.expect("waited for")
    };
    let run = fleetctl_ok(
        &cluster,
        &[
            "list-machines",
            "--full",
            "--no-legend",
            "--fields",
            "machine,leader",
        ],
    )?;
    let leaders: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("yes"))
        .collect();
    ensure!(leaders.len() == 1, "one leader: {}", run.stdout);
    ensure!(
        leaders[0].starts_with(&leader_id),
        "{leaders:?} vs {leader_id}"
    );
    let default = fleetctl_ok(&cluster, &["list-machines", "--no-legend"])?;
    ensure!(
        !default.stdout.contains("yes"),
        "default table: {}",
        default.stdout
    );

    // A start, followed as it happens.
    let follow = Follow::start(&cluster)?;
    std::thread::sleep(Duration::from_millis(500));
    let unit = "evented.service";
    let path = unit_file(&cluster, unit, 3600)?;
    fleetctl_ok(&cluster, &["start", "--no-block", &path])?;
    let started = Instant::now();
    follow.wait(unit, "submitted", Duration::from_secs(1))?;
    ensure!(
        started.elapsed() <= Duration::from_secs(1),
        "followed after {:?}",
        started.elapsed()
    );
    let scheduled = follow.wait(unit, "scheduled", TIMEOUT)?;
    let first = scheduled["machine"].as_str().unwrap_or("").to_owned();
    let started = follow.wait(unit, "started", TIMEOUT)?;
    ensure!(
        started["source"] == "machine" && started["machine"] == first.as_str(),
        "{started}"
    );
    let story = kinds(&events(&cluster, &["--unit", unit])?);
    // Events of different writers are ordered by their own stamps, and a user's action is
    // stamped when its write is sent: before the engine, woken by that write, stamps its
    // "scheduled".
    let first_two = story.iter().take(2).map(String::as_str).collect::<Vec<_>>();
    ensure!(
        first_two == ["submitted", "scheduled"] && story.contains(&"started".to_owned()),
        "{story:?}"
    );
    let listed = events(&cluster, &["--unit", unit])?;
    let submitted = listed
        .iter()
        .find(|e| e["kind"] == "submitted")
        .context("no submitted event")?;
    ensure!(submitted["source"] == "user" && !submitted["who"].as_str().unwrap_or("").is_empty());
    let text = fleetctl_ok(&cluster, &["events", "--unit", unit])?.stdout;
    ensure!(
        text.starts_with("TIME") && text.contains("submitted"),
        "{text}"
    );

    // Its machine is lost: the unit moves, and the event names both machines.
    wait_for(TIMEOUT, POLL, || {
        running(&cluster, unit).is_ok_and(|on| on.len() == 1)
    })?;
    let lost = cluster
        .machines()
        .iter()
        .find(|m| m.id().as_str() == first)
        .context("the scheduled machine")?;
    lost.poweroff()?;
    let mut doubles = Vec::new();
    let mut moved = None;
    wait_for(Duration::from_secs(60), POLL, || {
        if let Ok(on) = running(&cluster, unit)
            && on.len() > 1
        {
            doubles.push(on);
        }
        moved = events(&cluster, &["--unit", unit])
            .unwrap_or_default()
            .into_iter()
            .find(|e| e["kind"] == "moved");
        moved.is_some()
    })
    .context("no moved event")?;
    ensure!(doubles.is_empty(), "ran twice: {doubles:?}");
    let moved = moved.expect("waited for");
    ensure!(moved["from"] == first.as_str(), "{moved}");
    ensure!(
        moved["machine"] != first.as_str() && moved["machine"] != "",
        "{moved}"
    );
    ensure!(
        moved["reason"].as_str().unwrap_or("").contains("lost"),
        "{moved}"
    );
    let text = fleetctl_ok(&cluster, &["events", "--unit", unit])?.stdout;
    let line = text.lines().find(|l| l.contains("moved")).unwrap_or("");
    ensure!(
        line.contains(&first) && line.contains(moved["machine"].as_str().unwrap_or("?")),
        "{text}"
    );
    drop(follow);
    finish(cluster)
}

/// fleetctl over the TLS API as the holder of a client certificate.
fn fleetctl_as(cluster: &Cluster, identity: &(PathBuf, PathBuf), args: &[&str]) -> Result<Output> {
    Ok(cluster
        .fleetctl_tls_command()?
        .env("FLEETCTL_CERT_FILE", &identity.0)
        .env("FLEETCTL_KEY_FILE", &identity.1)
        .args(args)
        .stdin(Stdio::null())
        .output()?)
}

#[test]
fn a_destroy_records_the_operators_subject_a_refused_one_nothing_and_events_expire() -> Result<()> {
    let spec = FleetdSpec::default()
        .with_etcd_auth(EtcdAuthSpec::default())
        .with_api_tls(PORT)
        .with_env("FLEET_API_OPERATORS", "CN=olga")
        .with_env("FLEET_API_VIEWERS", "CN=vera")
        .with_env("FLEET_EVENT_RETENTION", "4s");
    let (cluster, _registry) = start(1, spec)?;
    let certs = cluster.api_certs().context("no certificates")?;
    let viewer = certs.client("vera", "vera", &[])?;
    let operator = certs.client("olga", "olga", &[])?;
    let unit = "audited.service";
    let path = unit_file(&cluster, unit, 3600)?;
    let o = fleetctl_as(&cluster, &operator, &["submit", &path])?;
    ensure!(
        o.status.success(),
        "submit: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let submitted = wait_event(&cluster, unit, "submitted")?;
    ensure!(submitted["who"] == "CN=olga", "{submitted}");

    // A viewer reads the events, and its refused destroy records nothing.
    let o = fleetctl_as(&cluster, &viewer, &["events", "--unit", unit])?;
    ensure!(
        o.status.success() && o.stdout_text().contains("submitted"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = fleetctl_as(&cluster, &viewer, &["destroy", unit])?;
    ensure!(!o.status.success(), "a viewer destroyed {unit}");
    let o = fleetctl_as(&cluster, &operator, &["destroy", unit])?;
    ensure!(
        o.status.success(),
        "destroy: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let destroyed = wait_event(&cluster, unit, "destroyed")?;
    ensure!(destroyed["who"] == "CN=olga", "{destroyed}");
    let all = events(&cluster, &["--unit", unit])?;
    let destroys = all.iter().filter(|e| e["kind"] == "destroyed").count();
    ensure!(destroys == 1, "{:?}", kinds(&all));

    // A unit that exits with status 3 a second after it starts: its agent says so when it
    // starts it again.
    let crashy = "crashy.service";
    let dir = cluster.dir().join("units");
    std::fs::write(
        dir.join(crashy),
        "[Service]\nExecStart=/bin/sh -c 'sleep 1; exit 3'\n",
    )?;
    let path = dir.join(crashy).display().to_string();
    let o = fleetctl_as(&cluster, &operator, &["start", "--no-block", &path])?;
    ensure!(
        o.status.success(),
        "start: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let crashed = wait_event(&cluster, crashy, "failed")?;
    ensure!(
        crashed["reason"]
            .as_str()
            .unwrap_or("")
            .contains("exit status 3")
            && crashed["source"] == "machine",
        "{crashed}"
    );
    let o = fleetctl_as(&cluster, &operator, &["destroy", crashy])?;
    ensure!(
        o.status.success(),
        "destroy: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    // Retention 4 s (and its lease window of 1 s): gone by themselves.
    wait_for(Duration::from_secs(20), POLL, || {
        events(&cluster, &["--unit", unit]).is_ok_and(|e| e.is_empty())
    })
    .context("events outlived their retention")?;
    finish(cluster)
}
