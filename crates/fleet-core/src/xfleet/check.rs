//! `[X-Fleet]` values fleet accepted silently although they can never mean what was written:
//! a `MachineID=` that is no machine ID, a `MachineOf=` that is no unit name or the unit
//! itself, a glob that is malformed or can never match a unit name, metadata that is not
//! `key=value`, a `Global=` that is neither true nor false.
//!
//! These are checked only where a unit enters the registry (fleetctl's submit, load, start and
//! replace). The engine keeps fleet's reading of units already stored (`Requirements::validate`
//! only), so a stricter check never makes a stored unit unschedulable.

use super::{CONFLICTS_KEYS, MACHINE_ID_KEYS, MACHINE_OF_KEYS, METADATA_KEYS, Values};
use crate::{MachineId, RequirementError, UnitFile, UnitName};

/// fleet's `isTruthyValue`, and the values that say false just as clearly.
const FALSY: [&str; 5] = ["false", "no", "0", "off", "f"];

/// Characters a glob may hold besides a unit name's own: Go's `path.Match` syntax.
const GLOB_SYNTAX: &str = "*?[]^-\\";

/// Checks the values of `file`'s `[X-Fleet]` section for `name`. A template is not checked:
/// its `%i` is empty, so `MachineID=%i` or `MachineOf=db@%i.service` only make sense in an
/// instance, which is checked when it is created.
pub fn check_values(name: &UnitName, file: &UnitFile) -> Result<(), RequirementError> {
    if name.is_template() {
        return Ok(());
    }
    let values = Values::of(name, file);
    for value in values.all(&MACHINE_ID_KEYS) {
        if let Err(reason) = value.parse::<MachineId>() {
            return Err(RequirementError::NotAMachineId { value, reason });
        }
    }
    for value in values.all(&MACHINE_OF_KEYS) {
        match value.parse::<UnitName>() {
            Ok(peer) if &peer == name => return Err(RequirementError::PeerIsItself),
            // A template never runs, so a unit beside one never would (issue 38).
            Ok(peer) if peer.is_template() => {
                return Err(RequirementError::PeerIsATemplate(value));
            }
            Ok(_) => {}
            Err(reason) => return Err(RequirementError::PeerNotAUnit { value, reason }),
        }
    }
    let conflicts = values.all(&CONFLICTS_KEYS);
    let conflicts = conflicts.iter().flat_map(|v| v.split_whitespace());
    for glob in conflicts {
        check_glob("Conflicts", glob)?;
    }
    for glob in values.all(&["Replaces"]) {
        check_glob("Replaces", &glob)?;
        // A unit that names itself to replace could never be placed (issue 38). A glob that
        // also matches it (`web@*.service`) is fine: the scheduler skips the unit itself.
        if glob == name.as_str() {
            return Err(RequirementError::ReplacesItself(glob));
        }
    }
    // An empty `MachineMetadata=` or `Global=` says nothing, and fleet read it as nothing.
    for pair in values
        .all(&METADATA_KEYS)
        .into_iter()
        .filter(|v| !v.is_empty())
    {
        let mut parts = pair.split('=');
        let well_formed = matches!(
            (parts.next(), parts.next(), parts.next()),
            (Some(k), Some(v), None) if !k.is_empty() && !v.is_empty()
        );
        if !well_formed {
            return Err(RequirementError::BadMetadata(pair));
        }
    }
    for value in values
        .all(&["Global"])
        .into_iter()
        .filter(|v| !v.is_empty())
    {
        let known = super::is_truthy(&value) || FALSY.iter().any(|f| value.eq_ignore_ascii_case(f));
        if !known {
            return Err(RequirementError::NotABoolean(value));
        }
    }
    Ok(())
}

/// Checks a glob of unit names (`Conflicts=`, `Replaces=`, fleetd's `deny_units`): well
/// formed, and made only of characters a unit name or Go's glob syntax can hold.
pub fn check_glob(key: &'static str, glob: &str) -> Result<(), RequirementError> {
    if !crate::glob::glob_is_valid(glob) {
        return Err(RequirementError::BadGlob {
            key,
            value: glob.to_owned(),
        });
    }
    let possible = glob
        .chars()
        .all(|c| crate::name::is_valid_char(c) || GLOB_SYNTAX.contains(c));
    if glob.is_empty() || !possible {
        return Err(RequirementError::GlobMatchesNoName {
            key,
            value: glob.to_owned(),
        });
    }
    Ok(())
}
