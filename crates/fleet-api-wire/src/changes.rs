//! `GET /fleet/v1/changes` (extension, issue 41): the registry's changes as a held response
//! of newline-delimited JSON, one [`ChangeEntity`] a line, each naming the parts that changed
//! so that a client re-reads only what it shows.
//!
//! - The first line names every part: the stream is open, and anything read from then on is
//!   at least as new as its `revision` (read what you show then).
//! - Then a line after each change, coalesced (the first after a quiet spell at once, then
//!   at most one every 50 ms), naming `units`, `states`, `machines` and/or `events`.
//! - A line that names nothing is a keep-alive, every [`KEEP_ALIVE`] while idle: a client
//!   that hears nothing for longer can tell a lost stream from a quiet cluster.
//! - The stream ends (cleanly) when etcd's watch does; a client reconnects and reads again.
//!
//! A part name this version does not know (a newer server's) is ignored.

use fleet_registry::{Changed, Part};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The path, under `/fleet/v1`.
pub const PATH: &str = "/changes";

/// How often an idle stream says it is still there.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// One line of the stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeEntity {
    /// The registry's revision the change is at (an etcd revision).
    pub revision: i64,
    /// What changed: `units`, `states`, `machines`, `events`; none on a keep-alive.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<String>,
}

pub fn change_to_wire(c: &Changed) -> ChangeEntity {
    ChangeEntity {
        revision: c.revision,
        changed: c.parts.iter().map(|p| p.as_str().to_owned()).collect(),
    }
}

/// The keep-alive line at `revision`.
pub fn keep_alive(revision: i64) -> ChangeEntity {
    ChangeEntity {
        revision,
        changed: Vec::new(),
    }
}

/// The change a line says (a keep-alive: no part); names of newer parts are left out.
pub fn change_from_wire(w: &ChangeEntity) -> Changed {
    Changed {
        revision: w.revision,
        parts: w.changed.iter().filter_map(|p| Part::parse(p)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_reads_back_from_its_line_and_a_newer_part_is_ignored() {
        let change = Changed {
            revision: 42,
            parts: [Part::Units, Part::States].into_iter().collect(),
        };
        let line = serde_json::to_string(&change_to_wire(&change)).unwrap();
        assert_eq!(line, r#"{"revision":42,"changed":["units","states"]}"#);
        let back: ChangeEntity =
            serde_json::from_str(r#"{"revision":42,"changed":["units","leases","states"]}"#)
                .unwrap();
        assert_eq!(change_from_wire(&back), change);
    }

    #[test]
    fn a_keep_alive_names_nothing() {
        let line = serde_json::to_string(&keep_alive(7)).unwrap();
        assert_eq!(line, r#"{"revision":7}"#);
        let back: ChangeEntity = serde_json::from_str(&line).unwrap();
        assert!(change_from_wire(&back).parts.is_empty());
    }
}
