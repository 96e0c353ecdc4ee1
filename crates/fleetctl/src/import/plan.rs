//! What `import-fleet` does with each unit fleet holds: a pure decision on fleet's registry
//! ([`FleetRegistry`]) and the units ours already has. It writes nothing and prints nothing;
//! the command does both from the plan.
//!
//! A unit is imported with the same file (so the same hash: the hash fleet's key names must be
//! the one ours computes, or our agent would take the running unit for another version and
//! restart it), its desired state, and for a non-global unit fleet placed, its machine; a
//! global unit with the machines fleet's states say run it. A unit ours cannot represent (a
//! name or option ours refuses, a record fleet's own code could not read) is refused by name
//! with the reason; the rest goes on.

use fleet_core::{DesiredState, MachineId, Requirements, UnitFile, UnitHash, UnitName};
use fleet_registry::FileRefusal;
use std::collections::BTreeMap;
use std::fmt;

use super::v2::{FleetJob, FleetRegistry};

/// A unit to write into ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    pub name: UnitName,
    pub file: UnitFile,
    pub desired: DesiredState,
    /// Where fleet placed a non-global unit (`None`: not placed, or global).
    pub machine: Option<MachineId>,
    /// For a global unit, the machines fleet's states say it is on.
    pub global_on: Vec<MachineId>,
    /// Ours has the unit with another file, and `--replace` was given.
    pub replaces: Option<UnitHash>,
}

/// What happens to one unit fleet holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Import(Import),
    /// Ours already has it with the same file: a second import changes nothing.
    Unchanged {
        name: UnitName,
    },
    /// Not imported; the reason is printed with its name.
    Refused {
        name: String,
        reason: Refusal,
    },
}

/// Why a unit is not imported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Ours refuses the name.
    Name(String),
    /// fleet's record of it cannot be read (missing or not fleet's JSON).
    Record(String),
    /// Ours refuses the file (its syntax or an `[X-Fleet]` option).
    File(String),
    /// fleet names the file by a hash ours does not compute from the same text.
    HashDiffers { fleet: String, ours: UnitHash },
    /// Ours already has a unit of that name with another file (`--replace` overrides).
    Exists { ours: UnitHash, fleet: UnitHash },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(e) => write!(f, "ours refuses its name: {e}"),
            Self::Record(e) => write!(f, "fleet's record of it cannot be read: {e}"),
            Self::File(e) => write!(f, "ours refuses its file: {e}"),
            Self::HashDiffers { fleet, ours } => write!(
                f,
                "fleet's hash of its file is {fleet}, ours {ours}: our agent would restart it at \
                 the cutover (report it: docs/migrating.md)"
            ),
            Self::Exists { ours, fleet } => write!(
                f,
                "ours already has it with another file ({}, fleet's {}); --replace takes fleet's",
                ours.short(),
                fleet.short()
            ),
        }
    }
}

/// The verdict on every unit fleet holds, in name order. `ours`: the units ours has and
/// their hashes.
pub fn plan(
    fleet: &FleetRegistry,
    ours: &BTreeMap<UnitName, UnitHash>,
    replace: bool,
) -> Vec<Verdict> {
    fleet
        .jobs
        .iter()
        .map(|(name, job)| {
            verdict(fleet, name, job, ours, replace).unwrap_or_else(|reason| Verdict::Refused {
                name: name.clone(),
                reason,
            })
        })
        .collect()
}

fn verdict(
    fleet: &FleetRegistry,
    raw_name: &str,
    job: &FleetJob,
    ours: &BTreeMap<UnitName, UnitHash>,
    replace: bool,
) -> Result<Verdict, Refusal> {
    let name: UnitName = raw_name
        .parse()
        .map_err(|e| Refusal::Name(format!("{e}")))?;
    let file = file_of(fleet, &name, job)?;
    let global = Requirements::from_unit(&name, &file).global;
    let desired = match job.target_state.as_deref() {
        // fleet reads a job without one as inactive.
        None | Some("") => DesiredState::Inactive,
        Some(state) => state
            .parse()
            .map_err(|_| Refusal::Record(format!("its target-state {state:?} is no state")))?,
    };
    let replaces = match ours.get(&name) {
        Some(hash) if *hash == file.hash() => return Ok(Verdict::Unchanged { name }),
        Some(hash) if !replace => {
            return Err(Refusal::Exists {
                ours: *hash,
                fleet: file.hash(),
            });
        }
        other => other.copied(),
    };
    let placed = desired != DesiredState::Inactive && !name.is_template();
    let machine = match job.target.as_deref().filter(|_| placed && !global) {
        None | Some("") => None,
        Some(id) => Some(
            id.parse::<MachineId>()
                .map_err(|e| Refusal::Record(format!("its target {id:?} is no machine ID: {e}")))?,
        ),
    };
    let global_on = if placed && global {
        running_on(fleet, raw_name)
    } else {
        Vec::new()
    };
    Ok(Verdict::Import(Import {
        name,
        file,
        desired,
        machine,
        global_on,
        replaces,
    }))
}

/// The unit's file as fleet holds it, checked against the hash fleet names it by, as the
/// registry's import takes it ([`fleet_registry::check_file`]).
fn file_of(fleet: &FleetRegistry, name: &UnitName, job: &FleetJob) -> Result<UnitFile, Refusal> {
    let hash = match &job.hash {
        None => return Err(Refusal::Record("it has no job record (`object`)".into())),
        Some(Err(e)) => return Err(Refusal::Record(e.clone())),
        Some(Ok(hash)) => hash,
    };
    let raw = match fleet.files.get(hash) {
        None => {
            return Err(Refusal::Record(format!(
                "its file ({hash}) is not in fleet's registry"
            )));
        }
        Some(Err(e)) => return Err(Refusal::Record(e.clone())),
        Some(Ok(raw)) => raw,
    };
    fleet_registry::check_file(name, raw.as_bytes(), hash).map_err(|e| match e {
        FileRefusal::File(e) => Refusal::File(e),
        FileRefusal::HashDiffers { claimed, ours } => Refusal::HashDiffers {
            fleet: claimed,
            ours,
        },
    })
}

/// The machines whose fleet agent reports the unit active (a global unit's copies).
fn running_on(fleet: &FleetRegistry, name: &str) -> Vec<MachineId> {
    fleet
        .states
        .get(name)
        .into_iter()
        .flatten()
        .filter(|(_, state)| state.active == "active")
        .filter_map(|(machine, _)| machine.parse().ok())
        .collect()
}
