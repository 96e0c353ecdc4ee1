//! Reading stored values back: each record is decoded and checked against the key it was
//! found under, and a listing leaves out what fails, naming its key, instead of failing.
//!
//! One bad value (written by hand, by a buggy client, by a newer version) must not make the
//! whole cluster unlistable or stop the engine: listings and snapshots return it as
//! [`Skipped`] and go on. Reading one record by name still fails with
//! [`RegistryError::Corrupt`], since the caller asked for that record. Nothing here logs: the
//! caller that decides what a skip means (fleetctl prints it, the engine and agents log it
//! once per change) reports it.

use fleet_core::{MachineId, MachineInfo, UnitFile, UnitHash, UnitName};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::fmt;

use crate::error::RegistryError;
use crate::keys::{Key, Keys};
use crate::kv::{KeyValue, Revision};
use crate::records::{
    DrainRecord, LeftCopy, MigrationRecord, MoveRecord, ScheduleEntry, Unit, UnitRecord,
    UnitStateRecord,
};

/// A stored value a listing left out: it does not parse, or it names another key than the
/// one it is stored under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub key: String,
    /// The revision the value was written at (a new value at the key is a new skip).
    pub mod_revision: Revision,
    pub detail: String,
    /// What the key names, when the key itself parses: the engine keeps a unit whose record
    /// cannot be read where it is, and a machine whose record cannot be read counts as there.
    /// Boxed: every read returns a `Result` with this as its error.
    pub named: Option<Box<Key>>,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "skipped corrupt registry value at {}: {}",
            self.key, self.detail
        )
    }
}

impl From<Skipped> for RegistryError {
    fn from(s: Skipped) -> RegistryError {
        RegistryError::Corrupt {
            key: s.key,
            detail: s.detail,
        }
    }
}

/// What a listing read at one revision: the values that parse, and those it skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing<T> {
    pub revision: Revision,
    pub items: T,
    pub skipped: Vec<Skipped>,
}

pub(crate) fn skipped(keys: &Keys, kv: &KeyValue, detail: impl fmt::Display) -> Skipped {
    Skipped {
        key: kv.key.clone(),
        mod_revision: kv.mod_revision,
        detail: detail.to_string(),
        named: Key::parse(keys, &kv.key).map(Box::new),
    }
}

fn json<T: DeserializeOwned>(keys: &Keys, kv: &KeyValue) -> Result<T, Skipped> {
    serde_json::from_slice(&kv.value).map_err(|e| skipped(keys, kv, e))
}

/// A record must be stored under the key its own fields make: a record read at another key
/// would make a destroy or a schedule act on the wrong unit.
fn at_own_key<T>(keys: &Keys, kv: &KeyValue, record: T, own: String) -> Result<T, Skipped> {
    if kv.key == own {
        Ok(record)
    } else {
        Err(skipped(keys, kv, format!("the record belongs at {own}")))
    }
}

pub(crate) fn unit(keys: &Keys, kv: &KeyValue) -> Result<Unit, Skipped> {
    let record: UnitRecord = json(keys, kv)?;
    let own = keys.unit(&record.name);
    let record = at_own_key(keys, kv, record, own)?;
    Ok(Unit {
        record,
        mod_revision: kv.mod_revision,
    })
}

pub(crate) fn schedule_entry(keys: &Keys, kv: &KeyValue) -> Result<ScheduleEntry, Skipped> {
    let e: ScheduleEntry = json(keys, kv)?;
    let own = keys.schedule(&e.machine, &e.name);
    at_own_key(keys, kv, e, own)
}

/// The largest unit state record read (issue 37): one is a few hundred bytes (its drop-ins'
/// names included); a machine's credentials may write any value under its own prefix, and
/// every engine's and API's view would hold it.
pub const MAX_STATE_BYTES: usize = 16 * 1024;

/// The largest presence record read: its configured metadata included.
pub const MAX_MACHINE_BYTES: usize = 64 * 1024;

/// The most keys one machine's state prefix (`P/unit-state/<M>/`) is read for (issue 37):
/// a machine's etcd role may write any number of keys there, and every engine's and API's
/// view would hold them. An agent publishes one state per unit it runs and never more than
/// this (`fleet-agent`'s publish), far above what one machine runs (the benchmarks run 3,000
/// units on one machine; systemd slows down long before 10,000). Every key there counts,
/// readable or not, so that unreadable values past the bound cost nothing either.
pub const MAX_STATES_PER_MACHINE: usize = 10_000;

/// How many keys of each machine's state prefix a reader took in (each one read, readable
/// or skipped on its own), and how many past [`MAX_STATES_PER_MACHINE`] it left out unread.
/// Which keys are taken is the order the reader meets them: key order in a read (a
/// machine's prefix is read in order, one interval of the read), arrival order in a view
/// that follows the watch (a key freed later does not bring in one left out before).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateBound {
    taken: BTreeMap<MachineId, usize>,
    past: BTreeMap<MachineId, usize>,
}

impl StateBound {
    /// Whether one more key of `machine`'s states may be read; counted either way.
    pub(crate) fn take(&mut self, machine: &MachineId) -> bool {
        let taken = self.taken.entry(machine.clone()).or_default();
        if *taken < MAX_STATES_PER_MACHINE {
            *taken += 1;
            return true;
        }
        *self.past.entry(machine.clone()).or_default() += 1;
        false
    }

    /// A key of `machine`'s states that was taken in is gone.
    pub(crate) fn release_taken(&mut self, machine: &MachineId) {
        decrement(&mut self.taken, machine);
    }

    /// A key of `machine`'s states that was left out is gone; how many are left out now.
    pub(crate) fn release_past(&mut self, machine: &MachineId) -> usize {
        decrement(&mut self.past, machine)
    }

    /// How many of `machine`'s state keys were left out.
    pub fn past(&self, machine: &MachineId) -> usize {
        self.past.get(machine).copied().unwrap_or(0)
    }

    /// How many state keys were left out, over every machine.
    pub fn past_total(&self) -> usize {
        self.past.values().sum()
    }

    /// Takes in the counts of a part read apart (of other machines' keys).
    pub(crate) fn absorb(&mut self, part: StateBound) {
        for (machine, n) in part.taken {
            *self.taken.entry(machine).or_default() += n;
        }
        for (machine, n) in part.past {
            *self.past.entry(machine).or_default() += n;
        }
    }
}

/// `machine`'s count less one (gone at zero); what is left.
fn decrement(counts: &mut BTreeMap<MachineId, usize>, machine: &MachineId) -> usize {
    let Some(n) = counts.get_mut(machine) else {
        return 0;
    };
    *n = n.saturating_sub(1);
    let left = *n;
    if left == 0 {
        counts.remove(machine);
    }
    left
}

/// How many keys of a machine's states a reader left out past the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Past {
    /// That many: the reader read the machine's whole prefix.
    Exactly(usize),
    /// At least that many: the reader stopped reading there (a page of units).
    AtLeast(usize),
}

impl fmt::Display for Past {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Past::Exactly(n) => write!(f, "{n}"),
            Past::AtLeast(n) => write!(f, "at least {n}"),
        }
    }
}

/// What a reader reports of `machine`'s states past the bound: one value skipped at its
/// state prefix, however many keys are left out (`past`), so that a host writing a million
/// keys costs one report, not a million. `mod_revision` is that of the last key left out.
pub(crate) fn states_past_bound(
    keys: &Keys,
    machine: &MachineId,
    past: Past,
    mod_revision: Revision,
) -> Skipped {
    Skipped {
        key: keys.machine_states(machine),
        mod_revision,
        detail: format!(
            "machine {machine} publishes more unit states than a machine may \
             ({MAX_STATES_PER_MACHINE}); {past} past the bound left out unread"
        ),
        named: None,
    }
}

/// `kv` is skipped, unread, when its value is larger than a `what` may be.
fn bounded(keys: &Keys, kv: &KeyValue, max: usize, what: &str) -> Result<(), Skipped> {
    if kv.value.len() <= max {
        return Ok(());
    }
    Err(skipped(
        keys,
        kv,
        format!(
            "{} bytes, more than a {what} may hold ({max})",
            kv.value.len()
        ),
    ))
}

/// `kv` is skipped when a string in it holds a control character (C0, DEL or C1). What a
/// host publishes about itself (its metadata, IP, unit states) reaches operators' terminals
/// through `list-machines` and `list-units`, where an escape sequence would be obeyed, not
/// shown; nothing fleetd writes holds one (fleetd refuses such metadata). The quick scan
/// finds no escape, DEL or C1 lead byte in nearly every value, which is then not parsed twice.
fn printable(keys: &Keys, kv: &KeyValue) -> Result<(), Skipped> {
    let may_hold = |b: &u8| *b == b'\\' || *b == 0x7f || *b == 0xc2 || *b < 0x20;
    if !kv.value.iter().any(may_hold) {
        return Ok(());
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(&kv.value) else {
        return Ok(()); // the record's own decoding reports it
    };
    match first_control(&value) {
        None => Ok(()),
        Some(c) => Err(skipped(
            keys,
            kv,
            format!(
                "a string in it holds the control character U+{:04X}, which a terminal would obey",
                u32::from(c)
            ),
        )),
    }
}

fn first_control(value: &serde_json::Value) -> Option<char> {
    use serde_json::Value;
    let in_str = |s: &str| s.chars().find(|c| c.is_control() && *c != '\t');
    match value {
        Value::String(s) => in_str(s),
        Value::Array(items) => items.iter().find_map(first_control),
        Value::Object(map) => map
            .iter()
            .find_map(|(k, v)| in_str(k).or_else(|| first_control(v))),
        Value::Null | Value::Bool(_) | Value::Number(_) => None,
    }
}

pub(crate) fn state(keys: &Keys, kv: &KeyValue) -> Result<UnitStateRecord, Skipped> {
    bounded(keys, kv, MAX_STATE_BYTES, "unit state")?;
    printable(keys, kv)?;
    let s: UnitStateRecord = json(keys, kv)?;
    let own = keys.state(&s.machine, &s.name);
    at_own_key(keys, kv, s, own)
}

pub(crate) fn machine(keys: &Keys, kv: &KeyValue) -> Result<MachineInfo, Skipped> {
    bounded(keys, kv, MAX_MACHINE_BYTES, "presence record")?;
    printable(keys, kv)?;
    let m: MachineInfo = json(keys, kv)?;
    let own = keys.machine(&m.id);
    at_own_key(keys, kv, m, own)
}

pub(crate) fn drain(keys: &Keys, kv: &KeyValue) -> Result<DrainRecord, Skipped> {
    let d: DrainRecord = json(keys, kv)?;
    let own = keys.drain(&d.machine);
    at_own_key(keys, kv, d, own)
}

pub(crate) fn migrating(keys: &Keys, kv: &KeyValue) -> Result<MigrationRecord, Skipped> {
    let m: MigrationRecord = json(keys, kv)?;
    let own = keys.migrating(&m.machine);
    at_own_key(keys, kv, m, own)
}

pub(crate) fn moving(keys: &Keys, kv: &KeyValue) -> Result<MoveRecord, Skipped> {
    let m: MoveRecord = json(keys, kv)?;
    let own = keys.moving(&m.unit);
    at_own_key(keys, kv, m, own)
}

/// A unit file stored under `file/<hash>`: its text must hash to its key. The reader takes
/// what fleet takes (almost any bytes read as some unit file, perhaps an empty one), so the
/// hash is what tells a unit file from a value that was damaged or written by something else.
pub(crate) fn file(keys: &Keys, kv: &KeyValue) -> Result<(UnitHash, UnitFile), Skipped> {
    let hash: UnitHash = key_part(keys, kv, &keys.files())?;
    let file = keyed_file(&hash, &kv.value).map_err(|e| skipped(keys, kv, e))?;
    Ok((hash, file))
}

/// The unit file stored as `hash`, if `bytes` are one whose text hashes to it: every read of
/// `file/<hash>` (listings, one file, an agent's batch) checks the same.
pub(crate) fn keyed_file(hash: &UnitHash, bytes: &[u8]) -> Result<UnitFile, String> {
    let file = UnitFile::parse(bytes).map_err(|e| e.to_string())?;
    let read = file.hash();
    if read != *hash {
        return Err(format!("its content hashes to {read}, not to its key"));
    }
    Ok(file)
}

/// An `unscheduled/<name>` reason.
pub(crate) fn unscheduled(keys: &Keys, kv: &KeyValue) -> Result<(UnitName, String), Skipped> {
    let name: UnitName = key_part(keys, kv, &keys.unscheduled_all())?;
    Ok((name, String::from_utf8_lossy(&kv.value).into_owned()))
}

/// A `left/<name>/<machine>` record of the placement history: what the machine had
/// published of the copy when the unit left it.
pub(crate) fn left(
    keys: &Keys,
    kv: &KeyValue,
) -> Result<(UnitName, fleet_core::MachineId, LeftCopy), Skipped> {
    let Some(Key::Left { unit, machine }) = Key::parse(keys, &kv.key) else {
        return Err(skipped(keys, kv, "the key names no unit and machine"));
    };
    let copy = LeftCopy::from_value(&kv.value)
        .ok_or_else(|| skipped(keys, kv, "not a kind of copy a unit left"))?;
    Ok((unit, machine, copy))
}

/// The part of the key after `base`, parsed.
pub(crate) fn key_part<T>(keys: &Keys, kv: &KeyValue, base: &str) -> Result<T, Skipped>
where
    T: std::str::FromStr,
    T::Err: fmt::Display,
{
    let Some(part) = kv.key.strip_prefix(base) else {
        return Err(skipped(keys, kv, format!("the key is not under {base}")));
    };
    part.parse().map_err(|e: T::Err| skipped(keys, kv, e))
}

/// Decodes every value with `read`, keeping what parses and skipping the rest.
pub(crate) fn all<T>(
    kvs: &[KeyValue],
    mut read: impl FnMut(&KeyValue) -> Result<T, Skipped>,
    skipped: &mut Vec<Skipped>,
) -> Vec<T> {
    let mut items = Vec::with_capacity(kvs.len());
    for kv in kvs {
        match read(kv) {
            Ok(item) => items.push(item),
            Err(s) => skipped.push(s),
        }
    }
    items
}

/// Decodes the states of `kvs`, in the order given, at most [`MAX_STATES_PER_MACHINE`] keys
/// of each machine: the rest are left out unread, reported once per machine.
pub(crate) fn states(
    keys: &Keys,
    kvs: &[KeyValue],
    skipped: &mut Vec<Skipped>,
) -> Vec<UnitStateRecord> {
    let mut bound = StateBound::default();
    let mut last_past: BTreeMap<MachineId, Revision> = BTreeMap::new();
    let mut items = Vec::with_capacity(kvs.len().min(MAX_STATES_PER_MACHINE));
    for kv in kvs {
        if let Some(machine) = keys.state_machine(&kv.key)
            && !bound.take(&machine)
        {
            let rev = last_past.entry(machine).or_default();
            *rev = (*rev).max(kv.mod_revision);
            continue;
        }
        match state(keys, kv) {
            Ok(s) => items.push(s),
            Err(s) => skipped.push(s),
        }
    }
    for (machine, rev) in last_past {
        skipped.push(states_past_bound(
            keys,
            &machine,
            Past::Exactly(bound.past(&machine)),
            rev,
        ));
    }
    items
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A key-value pair as etcd would return it, at revision 1.
    pub(crate) fn kv(key: &str, value: Vec<u8>) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value,
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
        }
    }

    /// Issue 37, item 7: a host may write any value under its own prefix; a state or a
    /// presence record past its bound is skipped unread (named by its key, so the engine
    /// keeps the machine as there), whatever it holds.
    #[test]
    fn a_state_or_presence_past_its_bound_is_skipped_unread_naming_its_key() {
        let keys = Keys::new("/p/");
        let padding = "x".repeat(MAX_STATE_BYTES);
        let state = format!(
            r#"{{"name":"a.service","machine":"m1","hash":null,"systemd":{{"load":"loaded","active":"active","sub":"running"}},"pad":"{padding}"}}"#
        );
        let s =
            super::state(&keys, &kv("/p/unit-state/m1/a.service", state.into_bytes())).unwrap_err();
        assert!(
            s.detail.contains("more than a unit state may hold"),
            "{}",
            s.detail
        );
        assert!(matches!(s.named.as_deref(), Some(Key::State { .. })));
        let big = vec![b' '; MAX_MACHINE_BYTES + 1];
        let m = super::machine(&keys, &kv("/p/machine/m1", big)).unwrap_err();
        assert!(
            m.detail.contains("more than a presence record may hold"),
            "{}",
            m.detail
        );
        assert!(matches!(m.named.as_deref(), Some(Key::Machine(_))));
    }

    /// Issue 37, item 8: a host's own records reach operators' terminals; one holding a
    /// control character is skipped, named by its key (so the machine still counts as there),
    /// and a record with an escaped quote or a tab is read as before.
    #[test]
    fn a_state_or_presence_holding_a_control_character_is_skipped_naming_its_key() {
        let keys = Keys::new("/p/");
        let state = |sub: &str| {
            format!(
                r#"{{"name":"a.service","machine":"m1","hash":null,"systemd":{{"load":"loaded","active":"active","sub":"{sub}"}}}}"#
            )
            .into_bytes()
        };
        let s = super::state(
            &keys,
            &kv("/p/unit-state/m1/a.service", state("run\\u001b[2J")),
        )
        .unwrap_err();
        assert!(s.detail.contains("U+001B"), "{}", s.detail);
        assert!(matches!(s.named.as_deref(), Some(Key::State { .. })));
        super::state(
            &keys,
            &kv("/p/unit-state/m1/a.service", state("a\\\"b\\tc")),
        )
        .unwrap();
        let machine = |ip: &str| {
            format!(r#"{{"id":"m1","public_ip":"{ip}","metadata":{{"role":"web"}}}}"#).into_bytes()
        };
        for hostile in ["10.0.0.1\\u0007", "10.0.0.1\u{9b}31m", "\\u007f"] {
            let m = super::machine(&keys, &kv("/p/machine/m1", machine(hostile))).unwrap_err();
            assert!(m.detail.contains("control character"), "{}", m.detail);
            assert!(matches!(m.named.as_deref(), Some(Key::Machine(_))));
        }
        assert_eq!(
            super::machine(&keys, &kv("/p/machine/m1", machine("10.0.0.1")))
                .unwrap()
                .public_ip,
            "10.0.0.1"
        );
    }
}
