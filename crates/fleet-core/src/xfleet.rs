//! fleet's `[X-Fleet]` placement options, parsed from a unit file, with fleet's validation and
//! the per-pair tests the scheduler and agents build on (machine ID, metadata, conflicts,
//! replaces).
//!
//! Parsing resolves deprecated aliases, quoted multi-values and the `%n %N %p %i` specifiers
//! (`job/job.go`). It never decides placement: which machine may run what is the engine's
//! scheduler's business, this module only answers questions about one unit or one pair.

use crate::quote::quote;
use crate::{MachineId, UnitFile, UnitName};
use std::collections::BTreeMap;

pub use crate::glob::glob_match;

/// The section fleet reads.
pub const SECTION: &str = "X-Fleet";

/// Every key fleet knows in `[X-Fleet]` (`job.validRequirements`); others are only warned about.
pub const KNOWN_KEYS: [&str; 11] = [
    "MachineID",
    "X-ConditionMachineID",
    "X-ConditionMachineBootID",
    "X-ConditionMachineOf",
    "MachineOf",
    "X-Conflicts",
    "Conflicts",
    "X-ConditionMachineMetadata",
    "MachineMetadata",
    "Global",
    "Replaces",
];

/// Where `MachineID=` may be spelled, most preferred first; only the first present counts.
const MACHINE_ID_KEYS: [&str; 3] = [
    "MachineID",
    "X-ConditionMachineID",
    "X-ConditionMachineBootID",
];
/// Deprecated spelling first: fleet lists its values first.
const MACHINE_OF_KEYS: [&str; 2] = ["X-ConditionMachineOf", "MachineOf"];
const CONFLICTS_KEYS: [&str; 2] = ["X-Conflicts", "Conflicts"];
const METADATA_KEYS: [&str; 2] = ["X-ConditionMachineMetadata", "MachineMetadata"];

/// A unit's placement requirements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requirements {
    /// `MachineID=` (full or 8-char short ID): the first value of the first key present among
    /// `MachineID`, `X-ConditionMachineID`, `X-ConditionMachineBootID`.
    pub machine_id: Option<String>,
    /// `MachineOf=` (and `X-ConditionMachineOf=`): units this one must share a machine with.
    /// Values are not globs and not whitespace-split; an empty value is kept, as fleet does.
    pub machine_of: Vec<String>,
    /// `MachineMetadata=`: key -> accepted values (same key OR, different keys AND). Values that
    /// are not `k=v` with both sides non-empty are dropped.
    pub metadata: BTreeMap<String, Vec<String>>,
    /// `Conflicts=` (and `X-Conflicts=`), split on whitespace: globs of units this one may not
    /// share a machine with.
    pub conflicts: Vec<String>,
    /// `Replaces=`: globs of units this one displaces.
    pub replaces: Vec<String>,
    /// `Global=`: runs on every machine whose metadata matches. The last value decides.
    pub global: bool,
    /// Keys in `[X-Fleet]` that fleet does not know (a warning, not an error), in file order.
    pub unknown: Vec<String>,
}

/// An impossible combination of options. Messages are fleet's, `%q` quoting included.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementError {
    #[error("MachineID cannot be used with {0}")]
    MachineIdWith(&'static str),
    #[error("Global cannot be used with {0}")]
    GlobalWith(&'static str),
    #[error("Conflicts cannot be used with Replaces")]
    ConflictsWithReplaces,
    #[error(
        "unresolvable requirements: peer {} matches conflict {}",
        quote(peer),
        quote(conflict)
    )]
    PeerMatchesConflict { peer: String, conflict: String },
    #[error(
        "unresolvable requirements: peer {} matches replace {}",
        quote(peer),
        quote(replace)
    )]
    PeerMatchesReplace { peer: String, replace: String },
    /// The checks of [`check_values`], which fleet did not make.
    #[error("MachineID {} is not a machine ID: {reason}", quote(value))]
    NotAMachineId {
        value: String,
        reason: crate::machine::MachineIdError,
    },
    #[error("MachineOf {} is not a unit name: {reason}", quote(value))]
    PeerNotAUnit {
        value: String,
        reason: crate::name::NameError,
    },
    #[error("MachineOf cannot name the unit itself")]
    PeerIsItself,
    #[error("MachineOf {} names a template, which never runs: name one of its instances", quote(.0))]
    PeerIsATemplate(String),
    #[error("Replaces {} names the unit itself, which could never be placed", quote(.0))]
    ReplacesItself(String),
    #[error("{key} {} is not a valid glob", quote(value))]
    BadGlob { key: &'static str, value: String },
    #[error("{key} {} can never match a unit name", quote(value))]
    GlobMatchesNoName { key: &'static str, value: String },
    #[error("MachineMetadata {} is not key=value", quote(.0))]
    BadMetadata(String),
    #[error("Global {} is not true or false", quote(.0))]
    NotABoolean(String),
}

impl Requirements {
    /// Reads the `[X-Fleet]` section of `file`, substituting specifiers from `name`.
    pub fn from_unit(name: &UnitName, file: &UnitFile) -> Requirements {
        let mut unknown: Vec<String> = Vec::new();
        for option in file.options().iter().filter(|o| o.section == SECTION) {
            let key = option.name.as_str();
            if !KNOWN_KEYS.contains(&key) && !unknown.iter().any(|k| k == key) {
                unknown.push(key.to_owned());
            }
        }
        let values = Values::of(name, file);
        let all = |keys: &[&str]| values.all(keys);
        let values = &values.0;
        Requirements {
            machine_id: MACHINE_ID_KEYS
                .iter()
                .find_map(|k| values.get(k).and_then(|v| v.first()).cloned()),
            machine_of: all(&MACHINE_OF_KEYS),
            metadata: parse_metadata(all(&METADATA_KEYS)),
            conflicts: all(&CONFLICTS_KEYS)
                .iter()
                .flat_map(|v| v.split_whitespace().map(str::to_owned))
                .collect(),
            replaces: all(&["Replaces"]),
            global: values
                .get("Global")
                .and_then(|v| v.last())
                .is_some_and(|v| is_truthy(v)),
            unknown,
        }
    }

    /// `Global=` alone, read as [`Requirements::from_unit`] reads it (the last value, after
    /// quoted splitting and specifiers), without reading the other keys: listings ask it of
    /// every unit, and most files have no `Global=` at all (no allocation then).
    pub fn global(name: &UnitName, file: &UnitFile) -> bool {
        file.values(SECTION, "Global")
            .flat_map(split_multivalue)
            .last()
            .is_some_and(|v| is_truthy(&substitute_specifiers(&v, name)))
    }

    /// fleet's `ValidateOptions`: refuses combinations that can never be scheduled. As in
    /// fleet, a peer caught by this unit's own Conflicts or Replaces globs is reported before
    /// any forbidden pair of options.
    pub fn validate(&self) -> Result<(), RequirementError> {
        for peer in &self.machine_of {
            if let Some(conflict) = self.conflicts.iter().find(|c| glob_match(c, peer)) {
                return Err(RequirementError::PeerMatchesConflict {
                    peer: peer.clone(),
                    conflict: conflict.clone(),
                });
            }
            if let Some(replace) = self.replaces.iter().find(|r| glob_match(r, peer)) {
                return Err(RequirementError::PeerMatchesReplace {
                    peer: peer.clone(),
                    replace: replace.clone(),
                });
            }
        }
        let peers = !self.machine_of.is_empty();
        let conflicts = !self.conflicts.is_empty();
        let replaces = !self.replaces.is_empty();
        if self.machine_id.is_some() {
            let with = [
                (peers, "MachineOf"),
                (conflicts, "Conflicts"),
                (self.global, "Global"),
                (replaces, "Replaces"),
            ];
            if let Some((_, other)) = with.into_iter().find(|(present, _)| *present) {
                return Err(RequirementError::MachineIdWith(other));
            }
        }
        if self.global && peers {
            return Err(RequirementError::GlobalWith("MachineOf"));
        }
        if self.global && replaces {
            return Err(RequirementError::GlobalWith("Replaces"));
        }
        if conflicts && replaces {
            return Err(RequirementError::ConflictsWithReplaces);
        }
        Ok(())
    }

    /// Whether this unit's `Conflicts=` globs match `other`. Conflicts are symmetric in
    /// fleet; [`units_conflict`] asks both ways.
    pub fn conflicts_with(&self, other: &UnitName) -> bool {
        self.conflicts.iter().any(|c| glob_match(c, other.as_str()))
    }

    /// Whether this unit's `Replaces=` globs match `other`.
    pub fn replaces_name(&self, other: &UnitName) -> bool {
        self.replaces.iter().any(|r| glob_match(r, other.as_str()))
    }

    /// Whether a machine with `machine_metadata` satisfies `MachineMetadata=`: for every
    /// required key the machine has that key with one of the accepted values. No requirement
    /// matches every machine.
    pub fn metadata_matches(&self, machine_metadata: &BTreeMap<String, String>) -> bool {
        self.metadata.iter().all(|(key, accepted)| {
            machine_metadata
                .get(key)
                .is_some_and(|have| accepted.contains(have))
        })
    }

    /// Whether `machine` satisfies `MachineID=` (its full ID or its 8-character short form).
    /// No requirement matches every machine.
    pub fn machine_id_matches(&self, machine: &MachineId) -> bool {
        self.machine_id
            .as_deref()
            .is_none_or(|wanted| machine.matches(wanted))
    }
}

/// fleet's conflict test for two units on one machine (`AgentState.HasConflict`): either
/// unit's globs match the other's name. A unit does not conflict with itself.
pub fn units_conflict(a: (&UnitName, &Requirements), b: (&UnitName, &Requirements)) -> bool {
    a.0 != b.0 && (a.1.conflicts_with(b.0) || b.1.conflicts_with(a.0))
}

/// fleet's replace test for two units on one machine (`AgentState.hasReplace`): exactly one
/// of them replaces the other. Two units that replace each other are ignored, since
/// displacing either would loop forever; a unit does not replace itself.
pub fn units_replace(a: (&UnitName, &Requirements), b: (&UnitName, &Requirements)) -> bool {
    a.0 != b.0 && (a.1.replaces_name(b.0) != b.1.replaces_name(a.0))
}

/// The `[X-Fleet]` values of a unit by key, split and with specifiers substituted, in file
/// order.
struct Values<'f>(BTreeMap<&'f str, Vec<String>>);

impl<'f> Values<'f> {
    fn of(name: &UnitName, file: &'f UnitFile) -> Values<'f> {
        let mut values: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for option in file.options().iter().filter(|o| o.section == SECTION) {
            let parsed = split_multivalue(&option.value)
                .into_iter()
                .map(|v| substitute_specifiers(&v, name));
            values
                .entry(option.name.as_str())
                .or_default()
                .extend(parsed);
        }
        Values(values)
    }

    /// Every value of `keys`, key by key.
    fn all(&self, keys: &[&str]) -> Vec<String> {
        keys.iter()
            .flat_map(|k| self.0.get(k).into_iter().flatten().cloned())
            .collect()
    }
}

/// fleet's `parseMultivalueLine`: a value that starts and ends with `"` is split on spaces
/// outside quotes, the quotes dropped (empty pieces kept); any other value is one value.
fn split_multivalue(value: &str) -> Vec<String> {
    if !(value.starts_with('"') && value.ends_with('"')) {
        return vec![value.to_owned()];
    }
    let mut values = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in value.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => values.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    values.push(current);
    values
}

/// fleet's `unitPrintf`: plain replacements, in this order, with no escaping (`%%n` is `%` and
/// the name).
fn substitute_specifiers(value: &str, name: &UnitName) -> String {
    value
        .replace("%n", name.as_str())
        .replace("%N", name.stem())
        .replace("%p", name.prefix())
        .replace("%i", name.instance())
}

/// `k=v` pairs with exactly one `=` and both sides non-empty; anything else is ignored.
fn parse_metadata(pairs: Vec<String>) -> BTreeMap<String, Vec<String>> {
    let mut metadata: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pair in &pairs {
        let mut parts = pair.split('=');
        let (Some(key), Some(value), None) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if key.is_empty() || value.is_empty() {
            continue;
        }
        let accepted = metadata.entry(key.to_owned()).or_default();
        if !accepted.iter().any(|v| v == value) {
            accepted.push(value.to_owned());
        }
    }
    metadata
}

/// fleet's `isTruthyValue`.
fn is_truthy(value: &str) -> bool {
    ["true", "yes", "1", "on", "t"]
        .iter()
        .any(|t| value.eq_ignore_ascii_case(t))
}

mod check;
pub use check::{check_glob, check_values};

#[cfg(test)]
mod tests;
