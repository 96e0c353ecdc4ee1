//! `GET /fleet/v1/events` (extension, issue 41): the event entity, its page, the query, and
//! their conversions from and to the registry's [`Event`]. fleetctl's `events --output json`
//! prints the same entities.
//!
//! Query: `unit`, `machine` (exact names), `since` (a duration back from now: `90s`, `10m`,
//! `2h`), `follow=true` (the page's events, then each new one: newline-delimited JSON, one
//! entity a line, over a held response).

use fleet_core::fence::{parse_rfc3339_micros, rfc3339_micros};
use fleet_ops::OpsError;
use fleet_registry::{Event, EventKind, EventSource};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The path, under `/fleet/v1`.
pub const PATH: &str = "/events";
pub const UNIT: &str = "unit";
pub const MACHINE: &str = "machine";
pub const SINCE: &str = "since";
pub const FOLLOW: &str = "follow";
/// The content type of a followed stream: one JSON entity a line.
pub const NDJSON: &str = "application/x-ndjson";

/// One event on the wire. `time` is RFC 3339 in UTC with microseconds; `source` is `user`,
/// `engine` or `machine` (the agent of `machine`); empty fields are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventEntity {
    pub time: String,
    pub kind: String,
    pub source: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub unit: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub machine: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub from: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub who: String,
}

/// `GET /events`' page: every event the query matches, oldest first, and the keys that could
/// not be read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventPage {
    pub events: Vec<EventEntity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

pub fn event_to_wire(e: &Event) -> EventEntity {
    fn text<T: ToString>(v: &Option<T>) -> String {
        v.as_ref().map(ToString::to_string).unwrap_or_default()
    }
    let machine = match (&e.machine, &e.source) {
        (Some(m), _) | (None, Some(EventSource::Machine(m))) => m.to_string(),
        (None, _) => String::new(),
    };
    EventEntity {
        time: rfc3339_micros(e.time),
        kind: e.kind.to_string(),
        source: e.source.as_ref().map_or("", EventSource::as_str).to_owned(),
        unit: text(&e.unit),
        machine,
        from: text(&e.from),
        reason: e.reason.clone(),
        who: e.who.clone().unwrap_or_default(),
    }
}

fn bad(what: &str, detail: impl std::fmt::Display) -> OpsError {
    OpsError::Api {
        code: 0,
        message: format!("the API answered an event with a bad {what}: {detail}"),
    }
}

pub fn event_from_wire(w: &EventEntity) -> Result<Event, OpsError> {
    let name = |s: &str| -> Result<Option<_>, OpsError> {
        (!s.is_empty())
            .then(|| s.parse().map_err(|e| bad("machine", e)))
            .transpose()
    };
    let machine = name(&w.machine)?;
    let source = match w.source.as_str() {
        "user" => Some(EventSource::User),
        "engine" => Some(EventSource::Engine),
        "machine" => machine.clone().map(EventSource::Machine),
        _ => None,
    };
    let kind: EventKind = serde_json::from_value(serde_json::Value::String(w.kind.clone()))
        .unwrap_or(EventKind::Unknown);
    Ok(Event {
        time: parse_rfc3339_micros(&w.time).ok_or_else(|| bad("time", &w.time))?,
        kind,
        unit: match w.unit.as_str() {
            "" => None,
            u => Some(u.parse().map_err(|e| bad("unit", e))?),
        },
        machine,
        from: name(&w.from)?,
        reason: w.reason.clone(),
        who: (!w.who.is_empty()).then(|| w.who.clone()),
        source,
    })
}

/// A `since` of the query and of `fleetctl events --since`: a whole number with a unit (`s`,
/// `m`, `h`, `d`), back from now.
pub fn parse_since(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return None,
    };
    n.checked_mul(secs).map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reads_back_from_the_wire_as_it_was() {
        let mut e = Event::now(EventKind::Moved, "machine m1 lost")
            .unit(&"a.service".parse().unwrap())
            .on(&"m2".parse().unwrap())
            .from(&"m1".parse().unwrap())
            .by(Some("CN=ops"));
        e.source = Some(EventSource::Engine);
        let wire = event_to_wire(&e);
        assert_eq!(wire.kind, "moved");
        assert_eq!(wire.source, "engine");
        assert_eq!(event_from_wire(&wire).unwrap(), e);
        let json = serde_json::to_value(&wire).unwrap();
        assert_eq!(json["from"], "m1");
    }

    #[test]
    fn an_agent_event_names_its_machine_and_an_unknown_kind_reads_as_unknown() {
        let mut e = Event::now(EventKind::Failed, "exit code 3");
        e.source = Some(EventSource::Machine("m3".parse().unwrap()));
        let wire = event_to_wire(&e);
        assert_eq!(wire.machine, "m3");
        let mut newer = wire.clone();
        newer.kind = "something-new".into();
        assert_eq!(event_from_wire(&newer).unwrap().kind, EventKind::Unknown);
    }

    #[test]
    fn since_takes_a_number_and_a_unit() {
        assert_eq!(parse_since("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_since("10m"), Some(Duration::from_secs(600)));
        assert_eq!(parse_since("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_since("1d"), Some(Duration::from_secs(86_400)));
        for bad in ["", "m", "10", "10x", "-1m", "1.5h"] {
            assert_eq!(parse_since(bad), None, "{bad}");
        }
    }
}
