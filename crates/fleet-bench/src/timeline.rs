//! Where the time of a lifecycle command goes on one real machine: `dbus-monitor` runs inside
//! the machine while the command runs, recording fleetd's method calls to systemd and
//! systemd's `JobRemoved` and `Reloading` signals, each with its bus timestamp. The timeline
//! says when the first and last stop and start were queued and ended, how many daemon-reloads
//! ran and how long each took.
//!
//! It only observes: the monitor is started before the command and stopped after it (a
//! process of the bench's own, killed by its PID inside the machine).

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::Machine;
use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::real::fleetd_bus_name;

/// Where the monitor writes, inside the machine (its private /run).
const LOG: &str = "/run/fleet-bench-timeline.log";

/// A `dbus-monitor` running inside one machine.
#[derive(Debug)]
pub struct Recording<'a> {
    machine: &'a Machine,
    pid: u32,
}

impl<'a> Recording<'a> {
    /// Starts recording fleetd's calls and systemd's job and reload signals in `machine`.
    pub fn start(machine: &'a Machine) -> Result<Recording<'a>> {
        let fleetd = fleetd_bus_name(machine)?;
        let systemd = "interface='org.freedesktop.systemd1.Manager'";
        let script = format!(
            "dbus-monitor --system \"type='method_call',sender='{fleetd}'\" \
             \"type='signal',{systemd},member='JobRemoved'\" \
             \"type='signal',{systemd},member='Reloading'\" >{LOG} 2>&1 & echo $!"
        );
        let pid = machine.sh(&script)?.trim().parse().context("monitor PID")?;
        // The monitor prints its own NameAcquired signal once it is connected.
        let ready = fleet_functional_tests::wait_for(
            Duration::from_secs(10),
            Duration::from_millis(10),
            || {
                machine
                    .sh(&format!("cat {LOG}"))
                    .is_ok_and(|s| !s.is_empty())
            },
        );
        let recording = Recording { machine, pid };
        ready.context("dbus-monitor did not start")?;
        Ok(recording)
    }

    /// Stops the monitor and reads what it saw, relative to `t0`.
    pub fn finish(self, t0: SystemTime) -> Result<Timeline> {
        let text = self.machine.sh(&format!("cat {LOG}"))?;
        self.stop()?;
        let origin = t0.duration_since(UNIX_EPOCH)?.as_secs_f64();
        Ok(Timeline::parse(&text, origin))
    }

    fn stop(&self) -> Result<()> {
        self.machine
            .sh(&format!("kill {} 2>/dev/null; rm -f {LOG}", self.pid))?;
        Ok(())
    }
}

/// What one machine's systemd did for a command, in seconds since the command started.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Timeline {
    /// fleetd's method calls, by member.
    pub calls: BTreeMap<String, u64>,
    pub stops: Span,
    pub starts: Span,
    /// Each daemon-reload: when fleetd called it, and when systemd said it was over.
    pub reloads: Vec<(f64, Option<f64>)>,
    /// When fleetd made its last call (of any kind: a destroy's uninstalls, a status read).
    pub last_call: Option<f64>,
    /// When fleetd made its first and last call of each member.
    pub call_spans: BTreeMap<String, (f64, f64)>,
}

/// When a kind of job was first queued, last queued and last ended.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Span {
    pub count: u64,
    pub first_queued: Option<f64>,
    pub last_queued: Option<f64>,
    pub last_ended: Option<f64>,
}

impl Span {
    fn queued(&mut self, at: f64) {
        self.count += 1;
        self.first_queued.get_or_insert(at);
        self.last_queued = Some(at);
    }
}

/// One message of dbus-monitor's output: its header line's fields and its body's strings.
#[derive(Debug, Default)]
struct Message<'a> {
    kind: &'a str,
    time: f64,
    member: &'a str,
    strings: Vec<&'a str>,
    boolean: Option<bool>,
}

impl Timeline {
    /// Parses dbus-monitor's default output; `origin` is the command's start, in seconds since
    /// the epoch (the bus timestamps' clock).
    pub fn parse(text: &str, origin: f64) -> Timeline {
        let mut timeline = Timeline::default();
        // The kind of the last job fleetd queued for each unit: JobRemoved names only the unit.
        let mut last_job: BTreeMap<&str, bool> = BTreeMap::new();
        for m in messages(text) {
            let at = m.time - origin;
            match (m.kind, m.member) {
                ("method call", member) => {
                    timeline.last_call = Some(at);
                    let span = timeline.call_spans.entry(member.to_owned());
                    span.or_insert((at, at)).1 = at;
                    *timeline.calls.entry(member.to_owned()).or_insert(0) += 1;
                    let unit = m.strings.first().copied().unwrap_or_default();
                    match member {
                        "StopUnit" => {
                            timeline.stops.queued(at);
                            last_job.insert(unit, false);
                        }
                        "StartUnit" => {
                            timeline.starts.queued(at);
                            last_job.insert(unit, true);
                        }
                        "Reload" => timeline.reloads.push((at, None)),
                        _ => {}
                    }
                }
                ("signal", "JobRemoved") => {
                    let unit = m.strings.first().copied().unwrap_or_default();
                    match last_job.get(unit) {
                        Some(true) => timeline.starts.last_ended = Some(at),
                        Some(false) => timeline.stops.last_ended = Some(at),
                        None => {}
                    }
                }
                ("signal", "Reloading") if m.boolean == Some(false) => {
                    if let Some(open) = timeline.reloads.iter_mut().rev().find(|r| r.1.is_none()) {
                        open.1 = Some(at);
                    }
                }
                _ => {}
            }
        }
        timeline
    }
}

/// dbus-monitor's messages: a header line (`method call time=… member=X`) and indented body
/// lines (`   string "…"`, `   boolean false`).
fn messages(text: &str) -> Vec<Message<'_>> {
    let mut out: Vec<Message<'_>> = Vec::new();
    for line in text.lines() {
        if let Some(body) = line.strip_prefix("   ") {
            let Some(m) = out.last_mut() else { continue };
            let body = body.trim();
            if let Some(s) = body.strip_prefix("string \"") {
                m.strings.push(s.trim_end_matches('"'));
            } else if let Some(b) = body.strip_prefix("boolean ") {
                m.boolean = Some(b == "true");
            }
            continue;
        }
        let kind = ["method call", "signal", "method return", "error"]
            .into_iter()
            .find(|k| line.starts_with(k));
        let Some(kind) = kind else { continue };
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .map(|v| v.trim_end_matches(';'))
        };
        out.push(Message {
            kind,
            time: field("time=").and_then(|t| t.parse().ok()).unwrap_or(0.0),
            member: field("member=").unwrap_or(""),
            ..Message::default()
        });
    }
    out
}

/// Records `op` on every machine of `machines`; the timelines, in the same order.
pub fn record<T>(
    machines: &[Machine],
    op: impl FnOnce() -> Result<T>,
) -> Result<(T, Vec<Timeline>)> {
    let recordings: Vec<Recording<'_>> = machines
        .iter()
        .map(Recording::start)
        .collect::<Result<_>>()?;
    let t0 = SystemTime::now();
    let result = op();
    let mut timelines = Vec::with_capacity(recordings.len());
    for r in recordings {
        timelines.push(r.finish(t0)?);
    }
    ensure!(timelines.len() == machines.len(), "a recording is missing");
    Ok((result?, timelines))
}

impl fmt::Display for Timeline {
    /// `stops 100 queued 0.21–0.30 s, ended by 0.45 s; 1 daemon-reload (0.52 s, 0.19 s);
    /// starts 100 queued 0.72–0.80 s, ended by 0.95 s; last call at 0.97 s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let span = |f: &mut fmt::Formatter<'_>, what: &str, s: &Span| match s {
            Span { count: 0, .. } => write!(f, "no {what}"),
            Span {
                count,
                first_queued,
                last_queued,
                last_ended,
            } => write!(
                f,
                "{count} {what} queued {}–{} s, ended by {} s",
                at(*first_queued),
                at(*last_queued),
                at(*last_ended)
            ),
        };
        span(f, "stops", &self.stops)?;
        let reloads: Vec<String> = self
            .reloads
            .iter()
            .map(|(called, done)| match done {
                Some(done) => format!("at {called:.2} s for {:.2} s", done - called),
                None => format!("at {called:.2} s"),
            })
            .collect();
        match reloads.len() {
            0 => write!(f, "; no daemon-reload; ")?,
            n => write!(f, "; {n} daemon-reload ({}); ", reloads.join(", "))?,
        }
        span(f, "starts", &self.starts)?;
        write!(f, "; last call at {} s", at(self.last_call))
    }
}

fn at(t: Option<f64>) -> String {
    t.map_or_else(|| "?".to_owned(), |t| format!("{t:.2}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
signal time=100.000000 sender=org.freedesktop.DBus -> destination=:1.9 serial=2 path=/org/freedesktop/DBus; interface=org.freedesktop.DBus; member=NameAcquired
   string \":1.9\"
method call time=100.100000 sender=:1.5 -> destination=org.freedesktop.systemd1 serial=7 path=/org/freedesktop/systemd1; interface=org.freedesktop.systemd1.Manager; member=StopUnit
   string \"a.service\"
   string \"replace\"
signal time=100.200000 sender=:1.0 -> destination=(null destination) serial=9 path=/org/freedesktop/systemd1; interface=org.freedesktop.systemd1.Manager; member=JobRemoved
   uint32 12
   object path \"/org/freedesktop/systemd1/job/12\"
   string \"a.service\"
   string \"done\"
method call time=100.300000 sender=:1.5 -> destination=org.freedesktop.systemd1 serial=8 path=/org/freedesktop/systemd1; interface=org.freedesktop.systemd1.Manager; member=Reload
signal time=100.310000 sender=:1.0 -> destination=(null destination) serial=10 path=/org/freedesktop/systemd1; interface=org.freedesktop.systemd1.Manager; member=Reloading
   boolean true
signal time=100.450000 sender=:1.0 -> destination=(null destination) serial=11 path=/org/freedesktop/systemd1; interface=org.freedesktop.systemd1.Manager; member=Reloading
   boolean false
method call time=100.500000 sender=:1.5 -> destination=org.freedesktop.systemd1 serial=9 path=/org/freedesktop/systemd1; interface=org.freedesktop.systemd1.Manager; member=StartUnit
   string \"a.service\"
   string \"replace\"
signal time=100.600000 sender=:1.0 -> destination=(null destination) serial=12 path=/org/freedesktop/systemd1; interface=org.freedesktop.systemd1.Manager; member=JobRemoved
   uint32 13
   object path \"/org/freedesktop/systemd1/job/13\"
   string \"a.service\"
   string \"done\"
";

    #[test]
    fn reads_stops_reloads_and_starts_from_dbus_monitor_output() {
        let t = Timeline::parse(SAMPLE, 100.0);
        let near = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-6);
        assert_eq!(t.stops.count, 1);
        assert!(near(t.stops.first_queued, 0.1), "{t:?}");
        assert!(near(t.stops.last_ended, 0.2), "{t:?}");
        assert_eq!(t.reloads.len(), 1);
        assert!(near(t.reloads[0].1, 0.45), "{t:?}");
        assert_eq!(t.starts.count, 1);
        assert!(near(t.starts.last_ended, 0.6), "{t:?}");
        assert!(near(t.last_call, 0.5), "{t:?}");
        assert!(near(Some(t.call_spans["StartUnit"].0), 0.5), "{t:?}");
        assert_eq!(t.calls["StopUnit"], 1);
        assert!(!t.calls.contains_key("NameAcquired"));
    }
}
