//! The parts of an event key, `P/event/<source>/<subject>/<stamp>` (issue 41): who wrote it
//! (the prefix its etcd role may write), what it is about, and when.
//!
//! The source comes first so that each writer's events are one prefix, one etcd permission:
//! `event/user/` (the operator role: fleetctl, the API), `event/engine/` (the engine role),
//! `event/machine/<M>/` (machine `M` alone). The subject comes next so that one unit's events
//! of one writer are one prefix too; the stamp last, so that within it key order is time
//! order. A reader of several prefixes merges them by time ([`EventStamp`] orders so).

use fleet_core::{MachineId, UnitName};
use std::fmt;

/// Who wrote an event: the prefix of the event keys its etcd role may write.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventSource {
    /// A user's action, through fleetctl or the API (the operator role).
    User,
    /// The engine leader's decision (the engine role).
    Engine,
    /// What the agent of this machine saw systemd do (its machine role).
    Machine(MachineId),
}

impl EventSource {
    /// The key segment(s): `user`, `engine`, `machine/<M>`.
    pub fn segment(&self) -> String {
        match self {
            EventSource::User => "user".to_owned(),
            EventSource::Engine => "engine".to_owned(),
            EventSource::Machine(m) => format!("machine/{m}"),
        }
    }

    /// The source's name in listings: `user`, `engine`, `machine`.
    pub fn as_str(&self) -> &'static str {
        match self {
            EventSource::User => "user",
            EventSource::Engine => "engine",
            EventSource::Machine(_) => "machine",
        }
    }

    /// The source of a key's rest after `event/`, and what follows it.
    pub(super) fn split(rest: &str) -> Option<(EventSource, &str)> {
        let (first, rest) = rest.split_once('/')?;
        match first {
            "user" => Some((EventSource::User, rest)),
            "engine" => Some((EventSource::Engine, rest)),
            "machine" => {
                let (m, rest) = rest.split_once('/')?;
                Some((EventSource::Machine(m.parse().ok()?), rest))
            }
            _ => None,
        }
    }
}

/// What an event is about: one unit, one machine (a drain, metadata), or the cluster (a
/// rescheduling hold).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventSubject {
    Unit(UnitName),
    Machine(MachineId),
    Cluster,
}

impl EventSubject {
    /// The key segment(s): `unit/<name>`, `machine/<M>`, `cluster`.
    pub fn segment(&self) -> String {
        match self {
            EventSubject::Unit(u) => format!("unit/{u}"),
            EventSubject::Machine(m) => format!("machine/{m}"),
            EventSubject::Cluster => "cluster".to_owned(),
        }
    }

    /// The subject at the start of `rest`, and the stamp after it.
    pub(super) fn split(rest: &str) -> Option<(EventSubject, &str)> {
        let (first, rest) = rest.split_once('/')?;
        match first {
            "cluster" => Some((EventSubject::Cluster, rest)),
            "unit" => {
                let (u, rest) = rest.split_once('/')?;
                Some((EventSubject::Unit(u.parse().ok()?), rest))
            }
            "machine" => {
                let (m, rest) = rest.split_once('/')?;
                Some((EventSubject::Machine(m.parse().ok()?), rest))
            }
            _ => None,
        }
    }
}

/// When an event happened (microseconds since the epoch, by the writer's clock) and a nonce
/// that keeps two events of one microsecond apart. `<micros, 20 digits>-<nonce, 16 hex>`:
/// fixed width, so key order is time order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventStamp {
    pub micros: u64,
    pub nonce: u64,
}

impl fmt::Display for EventStamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:020}-{:016x}", self.micros, self.nonce)
    }
}

impl std::str::FromStr for EventStamp {
    type Err = ();

    fn from_str(s: &str) -> Result<EventStamp, ()> {
        let (micros, nonce) = s.split_once('-').ok_or(())?;
        let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        let digits = micros.bytes().all(|b| b.is_ascii_digit()) && nonce.bytes().all(hex);
        if micros.len() != 20 || nonce.len() != 16 || !digits {
            return Err(());
        }
        Ok(EventStamp {
            micros: micros.parse().map_err(|_| ())?,
            nonce: u64::from_str_radix(nonce, 16).map_err(|_| ())?,
        })
    }
}
