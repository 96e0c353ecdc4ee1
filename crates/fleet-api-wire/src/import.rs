//! `POST /fleet/v1/import`, this API's extension for `fleetctl --driver api import-fleet`
//! (docs/api.md "Import from fleet v1"): the plan the client made from fleet v1's registry,
//! as JSON, and back into the [`ImportPlan`] that [`fleet_registry::Importer::apply`] writes.
//!
//! The client reads fleet's registry and plans; the server writes. The server trusts the plan
//! for nothing it can check: [`plan_of`] parses every name, state and machine ID again and
//! takes every file through [`fleet_registry::check_file`], the same check the etcd driver's
//! plan made, so a hash that is not the file's, or a file ours cannot represent, is refused
//! before anything is written.

use fleet_core::{MachineId, NameError, StateError, UnitHash, UnitName};
use fleet_registry::{FileRefusal, ImportPlan, ImportedUnit, MigrationRecord};
use serde::{Deserialize, Serialize};

/// The route, under the API's prefix.
pub const PATH: &str = "/import";

/// Most units in one request: a plan of more goes in several.
pub const MAX_UNITS: usize = 1_000;

/// A request's units stop growing past this many bytes of JSON (a single bigger unit goes
/// alone: a file is at most 1 MiB, and the server reads bodies of up to 4 MiB).
pub const BYTES_PER_REQUEST: usize = 1 << 20;

/// The body of `POST /import`: the marks to write first, then the units.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportRequest {
    #[serde(default)]
    pub marks: Vec<MigrationRecord>,
    #[serde(default)]
    pub units: Vec<UnitImport>,
}

/// One unit of a plan, as the client says it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitImport {
    pub name: String,
    /// The file's text (ours stores its canonical text; any text that hashes to `hash`).
    pub file: String,
    /// The hash fleet named the file by.
    pub hash: String,
    pub desired_state: String,
    /// The machines it is scheduled on; none: the engine places it.
    #[serde(default, rename = "machineIDs")]
    pub machine_ids: Vec<String>,
    /// The hash of the file ours had when the plan was made (`--replace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<String>,
}

/// The answer: one result per unit, in the order asked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportResults {
    #[serde(default)]
    pub results: Vec<ImportResult>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportResult {
    pub name: String,
    /// `false`: ours changed since the plan was made (the unit appeared, or its file is not
    /// the one replaced); nothing of it was written.
    pub written: bool,
}

/// Why a request's plan is refused (400), before anything is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("a request imports at most {max} units, got {got}")]
    TooMany { got: usize, max: usize },
    #[error("unit {name:?}: {source}")]
    Name {
        name: String,
        #[source]
        source: NameError,
    },
    #[error("unit {name}: {source}")]
    File {
        name: UnitName,
        #[source]
        source: FileRefusal,
    },
    #[error("unit {name}: {source}")]
    State {
        name: UnitName,
        #[source]
        source: StateError,
    },
    #[error("unit {name}: machine ID {id:?} is none")]
    Machine { name: UnitName, id: String },
    #[error("unit {name}: replaces {hash:?}, which is no unit file hash")]
    Replaces { name: UnitName, hash: String },
}

/// The wire form of `unit`.
pub fn unit_to_wire(unit: &ImportedUnit) -> UnitImport {
    UnitImport {
        name: unit.name.to_string(),
        file: unit.file.canonical(),
        hash: unit.file.hash().to_string(),
        desired_state: unit.desired.to_string(),
        machine_ids: unit.machines.iter().map(ToString::to_string).collect(),
        replaces: unit.replaces.map(|h| h.to_string()),
    }
}

/// The plan `request` asks for, every unit checked; the first that fails refuses it all.
pub fn plan_of(request: ImportRequest) -> Result<ImportPlan, PlanError> {
    if request.units.len() > MAX_UNITS {
        return Err(PlanError::TooMany {
            got: request.units.len(),
            max: MAX_UNITS,
        });
    }
    let units = request
        .units
        .into_iter()
        .map(unit_from_wire)
        .collect::<Result<_, _>>()?;
    Ok(ImportPlan {
        marks: request.marks,
        units,
    })
}

fn unit_from_wire(unit: UnitImport) -> Result<ImportedUnit, PlanError> {
    let name: UnitName = unit.name.parse().map_err(|source| PlanError::Name {
        name: unit.name.clone(),
        source,
    })?;
    let file =
        fleet_registry::check_file(&name, unit.file.as_bytes(), &unit.hash).map_err(|source| {
            PlanError::File {
                name: name.clone(),
                source,
            }
        })?;
    let desired = unit
        .desired_state
        .parse()
        .map_err(|source| PlanError::State {
            name: name.clone(),
            source,
        })?;
    let machines = unit
        .machine_ids
        .iter()
        .map(|id| {
            id.parse::<MachineId>().map_err(|_| PlanError::Machine {
                name: name.clone(),
                id: id.clone(),
            })
        })
        .collect::<Result<_, _>>()?;
    let replaces = unit
        .replaces
        .map(|hash| {
            hash.parse::<UnitHash>().map_err(|_| PlanError::Replaces {
                name: name.clone(),
                hash,
            })
        })
        .transpose()?;
    Ok(ImportedUnit {
        name,
        file,
        desired,
        machines,
        replaces,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::{DesiredState, UnitFile};

    fn unit() -> ImportedUnit {
        ImportedUnit {
            name: "web@1.service".parse().unwrap(),
            file: UnitFile::parse(b"[Service]\r\nExecStart=/bin/sleep \\\n  1000\n").unwrap(),
            desired: DesiredState::Launched,
            machines: vec!["4dad8cf7a1b24c3e9c0d1e2f3a4b5c6d".parse().unwrap()],
            replaces: Some(
                UnitFile::parse(b"[Service]\nExecStart=/bin/true\n")
                    .unwrap()
                    .hash(),
            ),
        }
    }

    #[test]
    fn a_plan_goes_to_the_wire_and_back_unchanged() {
        let request = ImportRequest {
            marks: vec![MigrationRecord {
                machine: "4dad8cf7a1b24c3e9c0d1e2f3a4b5c6d".parse().unwrap(),
                since: 7,
                units: 1,
            }],
            units: vec![unit_to_wire(&unit())],
        };
        let json = serde_json::to_string(&request).unwrap();
        assert!(json.contains("\"machineIDs\""), "{json}");
        let back: ImportRequest = serde_json::from_str(&json).unwrap();
        let plan = plan_of(back).unwrap();
        assert_eq!(plan.units, vec![unit()]);
        assert_eq!(plan.marks, request.marks);
    }

    #[test]
    fn a_hash_that_is_not_the_files_refuses_the_whole_plan() {
        let mut lying = unit_to_wire(&unit());
        lying.hash = "0".repeat(40);
        let honest = unit_to_wire(&unit());
        let e = plan_of(ImportRequest {
            marks: vec![],
            units: vec![honest, lying],
        })
        .unwrap_err();
        assert!(
            matches!(
                &e,
                PlanError::File {
                    source: FileRefusal::HashDiffers { .. },
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with("unit web@1.service: its file hashes to"),
            "{e}"
        );
    }

    /// A change that makes a unit of the plan one the server refuses.
    type Change = fn(&mut UnitImport);

    #[test]
    fn names_states_machines_and_options_ours_refuses_are_refused() {
        let cases: [(&str, Change); 5] = [
            ("unit \"no-suffix\"", |u| u.name = "no-suffix".into()),
            ("unit web@1.service: ", |u| {
                u.desired_state = "running".into()
            }),
            ("machine ID \"m 1\" is none", |u| {
                u.machine_ids = vec!["m 1".into()];
            }),
            ("which is no unit file hash", |u| {
                u.replaces = Some("x".into())
            }),
            ("ours refuses its file", |u| {
                let file = UnitFile::parse(b"[X-Fleet]\nMachineOf=web@1.service\n").unwrap();
                u.hash = file.hash().to_string();
                u.file = file.canonical();
            }),
        ];
        for (want, change) in cases {
            let mut u = unit_to_wire(&unit());
            change(&mut u);
            let e = plan_of(ImportRequest {
                marks: vec![],
                units: vec![u],
            })
            .unwrap_err()
            .to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
