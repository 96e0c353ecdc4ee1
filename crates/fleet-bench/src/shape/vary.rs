//! `--vary FACTOR=VALUE`: one factor of a shape changed from what the shape says, to see what
//! each factor costs (issue 43: "what breaks first"). A varied run's shape line says so.
//!
//! Pure: parsing and applying; the process keeps the parsed list for
//! [`ShapeSpec::from_env`](super::ShapeSpec::from_env).

use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

use super::ShapeSpec;

/// One factor changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vary {
    /// `connections=N`: the machines share N etcd connections.
    Connections(usize),
    /// `auth=on|off`: etcd's authentication and the machines' roles.
    Auth(bool),
    /// `tls=on|off`: etcd's clients over TLS with client certificates.
    Tls(bool),
    /// `events=on|off`: the roles' event writers.
    Events(bool),
    /// `deadline=15s`: fleetd's roles' request deadline.
    Deadline(Duration),
    /// `client-deadline=15s`: fleetctl's.
    ClientDeadline(Duration),
    /// `engine-files=trusted|read`: fleetd's `trust_engine_files` on (engines carry small
    /// files in the schedule entries, agents take them) or off (fleetd's default).
    EngineFiles(bool),
}

/// What `--vary` takes.
pub const FACTORS: &str = "connections=N, auth=on|off, tls=on|off, events=on|off, \
                           deadline=Ns, client-deadline=Ns, engine-files=trusted|read";

impl FromStr for Vary {
    type Err = String;

    fn from_str(s: &str) -> Result<Vary, String> {
        let (factor, value) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected FACTOR=VALUE, one of {FACTORS}"))?;
        let bad = |what: &str| format!("{s:?}: {what}");
        match factor {
            "connections" => match value.parse::<usize>() {
                Ok(n) if n > 0 => Ok(Vary::Connections(n)),
                _ => Err(bad("connections takes a number above 0")),
            },
            "auth" => on_off(value)
                .map(Vary::Auth)
                .ok_or_else(|| bad("on or off")),
            "tls" => on_off(value).map(Vary::Tls).ok_or_else(|| bad("on or off")),
            "events" => on_off(value)
                .map(Vary::Events)
                .ok_or_else(|| bad("on or off")),
            "deadline" => seconds(value)
                .map(Vary::Deadline)
                .ok_or_else(|| bad("seconds, e.g. 15s")),
            "client-deadline" => seconds(value)
                .map(Vary::ClientDeadline)
                .ok_or_else(|| bad("seconds, e.g. 15s")),
            "engine-files" => match value {
                "trusted" => Ok(Vary::EngineFiles(true)),
                "read" => Ok(Vary::EngineFiles(false)),
                _ => Err(bad("trusted or read")),
            },
            _ => Err(format!("{s:?}: unknown factor; one of {FACTORS}")),
        }
    }
}

fn on_off(v: &str) -> Option<bool> {
    match v {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    }
}

fn seconds(v: &str) -> Option<Duration> {
    let n: f64 = v.strip_suffix('s').unwrap_or(v).parse().ok()?;
    (n > 0.0 && n.is_finite()).then(|| Duration::from_secs_f64(n))
}

impl Vary {
    /// As the shape line names it: `auth off`.
    fn describe(self) -> String {
        let word = |on: bool| if on { "on" } else { "off" };
        match self {
            Vary::Connections(n) => format!("connections {n}"),
            Vary::Auth(on) => format!("auth {}", word(on)),
            Vary::Tls(on) => format!("tls {}", word(on)),
            Vary::Events(on) => format!("events {}", word(on)),
            Vary::Deadline(d) => format!("deadline {} s", d.as_secs_f64()),
            Vary::ClientDeadline(d) => format!("client deadline {} s", d.as_secs_f64()),
            Vary::EngineFiles(true) => "engine files trusted".to_owned(),
            Vary::EngineFiles(false) => "engine files read".to_owned(),
        }
    }
}

impl ShapeSpec {
    /// This shape with `varies` applied, in order; connections never exceed `machines`.
    pub fn varied(mut self, varies: &[Vary], machines: usize) -> ShapeSpec {
        for v in varies {
            match *v {
                Vary::Connections(n) => {
                    self.connections = n.min(machines.max(1));
                    self.shared_because = None;
                }
                Vary::Auth(on) => self.auth = on,
                Vary::Tls(on) => self.tls = on,
                Vary::Events(on) => self.events = on,
                Vary::Deadline(d) => self.daemon_deadline = d,
                Vary::ClientDeadline(d) => self.client_deadline = d,
                Vary::EngineFiles(trust) => self.trust_engine_files = trust,
            }
            self.varied.push(v.describe());
        }
        self
    }
}

/// `(varied: deadline 5 s, events off)`, the words a varied run's section name ends with;
/// `None` when nothing was varied.
pub fn varied_suffix(varies: &[Vary]) -> Option<String> {
    let words: Vec<String> = varies.iter().map(|v| v.describe()).collect();
    (!words.is_empty()).then(|| format!("(varied: {})", words.join(", ")))
}

static VARIES: OnceLock<Vec<Vary>> = OnceLock::new();

/// Sets this process's `--vary` list (once, before any scenario builds a shape).
pub fn set(varies: Vec<Vary>) {
    let _ = VARIES.set(varies);
}

/// This process's `--vary` list.
pub fn current() -> &'static [Vary] {
    VARIES.get().map_or(&[], Vec::as_slice)
}

#[cfg(test)]
mod tests {
    use super::super::Shape;
    use super::*;

    #[test]
    fn parses_each_factor_and_refuses_the_rest_by_name() {
        assert_eq!("connections=16".parse(), Ok(Vary::Connections(16)));
        assert_eq!("auth=off".parse(), Ok(Vary::Auth(false)));
        assert_eq!("tls=off".parse(), Ok(Vary::Tls(false)));
        assert_eq!("events=on".parse(), Ok(Vary::Events(true)));
        assert_eq!(
            "deadline=15s".parse(),
            Ok(Vary::Deadline(Duration::from_secs(15)))
        );
        assert_eq!(
            "client-deadline=0.5".parse(),
            Ok(Vary::ClientDeadline(Duration::from_millis(500)))
        );
        assert_eq!("engine-files=trusted".parse(), Ok(Vary::EngineFiles(true)));
        for bad in [
            "auth",
            "auth=maybe",
            "engine-files=yes",
            "connections=0",
            "deadline=-1s",
            "tls=yes",
            "compression=on",
        ] {
            let err = bad.parse::<Vary>().unwrap_err();
            assert!(err.contains(bad.split('=').next().unwrap()), "{err}");
        }
    }

    #[test]
    fn a_varied_shape_changes_that_factor_and_its_line_says_so() {
        let s = ShapeSpec::new(Shape::Production, 5000, 20_000, vec![], &[])
            .varied(&[Vary::Auth(false), Vary::Connections(16)], 5000);
        assert!(!s.auth);
        assert_eq!(s.connections, 16);
        assert!(s.events, "the factors not varied keep the shape's");
        let line = s.line(5000);
        assert_eq!(
            varied_suffix(&[Vary::Auth(false), Vary::Connections(16)]).as_deref(),
            Some("(varied: auth off, connections 16)")
        );
        assert_eq!(varied_suffix(&[]), None);
        assert!(
            line.starts_with("shape: production (varied: auth off, connections 16), 16 etcd"),
            "{line}"
        );
    }

    #[test]
    fn connections_never_exceed_the_machines() {
        let s = ShapeSpec::new(Shape::Lab, 10, 20_000, vec![], &[])
            .varied(&[Vary::Connections(5000)], 10);
        assert_eq!(s.connections, 10);
    }
}
