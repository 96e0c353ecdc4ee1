//! Issue 41's figures of events at scale: what writing them costs the launch (the same
//! convergence on a fresh simulation with the event writers switched the other way), the
//! space they take in etcd, and whether `fleetctl events --follow` keeps up with 1,000 events
//! a second.

use anyhow::{Context, Result};
use fleet_core::UnitName;
use fleet_registry::{Event, EventKind};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;

use super::{Converged, ScaleArgs, converge};
use crate::sim::Sim;

/// The follow check's rate.
pub const FOLLOW_RATE: u64 = 1000;
/// Kept up: every event printed within this long after the last was emitted.
pub const FOLLOW_LAG: Duration = Duration::from_secs(1);
/// The space events may take, keys and values, per unit launched: a launch writes about four
/// events a unit (submitted, scheduled, started, active) of under 512 bytes each.
pub const SPACE_PER_UNIT: u64 = 2048;
/// The most the launch may slow down with events on, against off.
pub const COST_WITHIN: f64 = 0.05;
/// The follow check's units are named `bench-follow-N.service`.
const FOLLOW_PREFIX: &str = "bench-follow-";

/// The same convergence with the events switched the other way, on a fresh simulation.
pub(super) async fn other_way(a: &ScaleArgs) -> Result<Converged> {
    let mut shape = a.shape.clone();
    shape.events = !shape.events;
    let on_off = if shape.events { "on" } else { "off" };
    println!(
        "scale: again with events {on_off}: starting {} machines",
        a.machines
    );
    let sim = Sim::start(a.spec(shape)).await?;
    let c = converge(&sim, a.units).await;
    sim.stop().await;
    let c = c?;
    println!(
        "scale: with events {on_off}: {} units launched in {}",
        a.units,
        crate::report::secs(c.launched_in)
    );
    Ok(c)
}

/// What the follow check saw.
#[derive(Debug, Clone, Copy)]
pub struct Follow {
    pub emitted: u64,
    pub seen: u64,
    /// From the last event emitted to the last one printed (`None`: not all were printed
    /// within 10 s).
    pub lag: Option<Duration>,
}

impl Follow {
    pub fn kept_up(&self) -> bool {
        self.seen >= self.emitted && self.lag.is_some_and(|l| l <= FOLLOW_LAG)
    }
}

/// Runs `fleetctl events --follow --output json` as the viewer and emits [`FOLLOW_RATE`]
/// events a second for `window` through fleetctl's own event writer.
pub(super) async fn follow_check(sim: &Sim, fleetctl: &Path, window: Duration) -> Result<Follow> {
    let mut args = sim.fleetctl_args(true)?;
    args.extend(["events", "--follow", "--output", "json"].map(str::to_owned));
    let mut child = tokio::process::Command::new(fleetctl)
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("running fleetctl events --follow")?;
    let stdout = child.stdout.take().context("fleetctl's stdout")?;
    let seen = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let last_us = Arc::new(AtomicU64::new(0));
    let reader = tokio::spawn(count_lines(stdout, seen.clone(), last_us.clone(), t0));
    let emit = |i: u64| {
        let unit: UnitName = format!("{FOLLOW_PREFIX}{i}.service")
            .parse()
            .expect("a valid unit name");
        sim.client_events
            .emit(Event::now(EventKind::DesiredChanged, "bench follow check").unit(&unit));
    };
    // The follower watches once it printed an event.
    let mut emitted = 0u64;
    while seen.load(Ordering::Relaxed) == 0 && t0.elapsed() < Duration::from_secs(30) {
        emit(emitted);
        emitted += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let per_tick = FOLLOW_RATE / 100;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let start = Instant::now();
    while start.elapsed() < window {
        tick.tick().await;
        (0..per_tick).for_each(|k| emit(emitted + k));
        emitted += per_tick;
    }
    let last_emit = t0.elapsed();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.load(Ordering::Relaxed) < emitted && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = seen.load(Ordering::Relaxed);
    let last = Duration::from_micros(last_us.load(Ordering::Relaxed));
    let _ = child.kill().await;
    reader.abort();
    Ok(Follow {
        emitted,
        seen,
        lag: (seen >= emitted).then(|| last.saturating_sub(last_emit)),
    })
}

/// Counts the distinct check events printed (a listing and the watch may both print one),
/// and when the last new one was printed.
async fn count_lines(
    stdout: tokio::process::ChildStdout,
    seen: Arc<AtomicU64>,
    last_us: Arc<AtomicU64>,
    t0: Instant,
) {
    let mut distinct = std::collections::HashSet::new();
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(n) = follow_number(&line)
            && distinct.insert(n)
        {
            seen.fetch_add(1, Ordering::Relaxed);
            last_us.store(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
    }
}

/// N of the `bench-follow-N.service` a line names.
fn follow_number(line: &str) -> Option<u64> {
    let rest = &line[line.find(FOLLOW_PREFIX)? + FOLLOW_PREFIX.len()..];
    rest.split('.').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_number_of_a_check_event_from_its_json_line() {
        let line = r#"{"time":"x","kind":"desired-changed","unit":"bench-follow-42.service"}"#;
        assert_eq!(follow_number(line), Some(42));
        assert_eq!(follow_number(r#"{"unit":"other.service"}"#), None);
    }

    #[test]
    fn the_follower_keeps_up_only_when_it_printed_everything_within_a_second() {
        let f = |seen, lag| Follow {
            emitted: 100,
            seen,
            lag,
        };
        assert!(f(100, Some(Duration::from_millis(300))).kept_up());
        assert!(!f(100, Some(Duration::from_millis(1500))).kept_up());
        assert!(!f(99, None).kept_up());
    }
}
