//! What the handlers check on the wire before they call [`fleet_ops::Cluster`]: a unit's
//! options as a unit file, and a metadata patch as changes. Options become a file as
//! fleetctl's API driver reads them (fleet-api-wire's `options_from_wire`), and the file's
//! `[X-Fleet]` rules are checked by fleet-ops' `check_requirements`, as on every write path.
//! What a request does to the registry is decided by fleet-ops (`RegistryCluster`), the same
//! code fleetctl's etcd driver runs, so the two can never disagree. Nothing here knows HTTP
//! beyond the entities.

use fleet_core::{UnitFile, UnitName, UnitOption};
use fleet_registry::MetadataChange;

use crate::entity;
use crate::error::ApiError;

/// Options from the wire, checked as fleetctl checks a file it submits: the text systemd
/// would read must parse back to the same options (no newline smuggled into a value, no line
/// over systemd's limit, not too big), and the `[X-Fleet]` requirements must be possible.
pub fn unit_file(name: &UnitName, options: &[entity::UnitOption]) -> Result<UnitFile, ApiError> {
    let file = fleet_api_wire::convert::options_from_wire(options);
    if let Some(bad) = file.options().iter().find(|o| !representable(o)) {
        return Err(ApiError::OptionNotRepresentable(format!(
            "{}.{}",
            bad.section, bad.name
        )));
    }
    let reread = UnitFile::parse(file.canonical().as_bytes()).map_err(ApiError::BadOptions)?;
    // Equal as unit files (canonical text): sections may come interleaved, as in fleet.
    if reread != file {
        // Whatever else the text does not keep (trailing blanks a parser trims, a final `\`).
        return Err(ApiError::OptionsChangeWhenWritten);
    }
    fleet_ops::decide::check_requirements(name, &file)?;
    Ok(file)
}

/// Whether an option can be written as a `Name=Value` line of a `[Section]` at all.
/// A value may hold continuations (`\` + newline, as a parsed file keeps them); any other
/// newline would start a line of its own. What else the text would not keep, the reread finds.
fn representable(o: &UnitOption) -> bool {
    let one_line = |s: &str| !s.contains(['\n', '\r']);
    let continued =
        |s: &str| !s.contains('\r') && s.split('\n').rev().skip(1).all(|line| line.ends_with('\\'));
    !o.section.is_empty()
        && !o.name.is_empty()
        && one_line(&o.section)
        && one_line(&o.name)
        && continued(&o.value)
        && !o.name.contains('=')
        && !o.section.contains(['[', ']'])
}

/// The changes a `PATCH /machines` asks for, every operation checked before any is applied
/// (fleet's order of checks and messages). Any machine ID is accepted, registered or not; a
/// value must be one line of printable text (it ends up in `key=value` lists).
pub fn metadata_changes(ops: &[entity::MetadataOp]) -> Result<Vec<MetadataChange>, ApiError> {
    let mut changes = Vec::with_capacity(ops.len());
    for op in ops {
        let remove = match op.op.as_str() {
            "add" | "replace" => false,
            "remove" => true,
            _ => return Err(ApiError::PatchOp),
        };
        let (machine, key) = op
            .path
            .strip_prefix('/')
            .and_then(|p| p.split_once("/metadata/"))
            .ok_or(ApiError::PatchPath)?;
        let machine = machine.parse().map_err(|_| ApiError::PatchPath)?;
        let key = key.parse().map_err(|_| ApiError::PatchPath)?;
        if remove {
            changes.push(MetadataChange::Remove { machine, key });
            continue;
        }
        let value = op.value.as_ref().map(|v| v.as_str()).unwrap_or("");
        if value.is_empty() {
            return Err(ApiError::PatchNoValue);
        }
        if value.chars().any(char::is_control) {
            return Err(ApiError::PatchBadValue);
        }
        changes.push(MetadataChange::Set {
            machine,
            key,
            value: value.to_owned(),
        });
    }
    Ok(changes)
}
