//! The JSON documents fleetctl prints with `--output json`: one per call, made of the API's
//! full-view entities (`fleet_api_wire::wire`, the names `GET /fleet/v1/...?view=full` prints), so
//! a script reads the same fields from fleetctl as from the API. docs/operating.md, "JSON
//! output", documents every field; the tests below hold the two together.
//!
//! Inside an entity, an empty field is left out as the API leaves it out (fleet's
//! `omitempty`); the top-level lists are always there, empty or not, so `jq '.units[]'`
//! works on an empty cluster.

use fleet_api_wire::convert;
use fleet_api_wire::wire;
use fleet_core::MachineInfo;
use fleet_ops::{MachineListing, StateListing, UnitListing};
use serde::Serialize;
use std::collections::BTreeMap;

/// `list-unit-files --output json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnitFiles {
    pub units: Vec<wire::Unit>,
    /// Registry values left out of the listing, each naming its key.
    pub skipped: Vec<String>,
}

/// `list-units --output json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Units {
    pub states: Vec<wire::UnitState>,
    pub skipped: Vec<String>,
}

/// `list-machines --output json`: the machines, and the drain marks (`GET /drains`'s).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Machines {
    pub machines: Vec<wire::Machine>,
    pub drains: Vec<fleet_registry::DrainRecord>,
    pub skipped: Vec<String>,
    /// The engine's disruption notice, when it holds rescheduling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disruption_notice: Option<String>,
    /// What is wrong with the engine leader key, when it leads nothing fleet knows of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_leader_notice: Option<String>,
}

impl UnitFiles {
    pub fn of(listing: &UnitListing) -> UnitFiles {
        UnitFiles {
            units: listing
                .units
                .iter()
                .map(|u| convert::unit_to_wire(u, true))
                .collect(),
            skipped: listing.skipped.clone(),
        }
    }
}

impl Units {
    pub fn of(listing: &StateListing) -> Units {
        Units {
            states: listing
                .states
                .iter()
                .map(|s| convert::state_to_wire(s, true))
                .collect(),
            skipped: listing.skipped.clone(),
        }
    }
}

impl Machines {
    pub fn of(listing: &MachineListing) -> Machines {
        Machines {
            machines: listing
                .machines
                .iter()
                .map(|m| fleet_api_wire::wire::Machine {
                    leader: listing.leader.as_ref() == Some(&m.id),
                    ..convert::machine_to_wire(m, true)
                })
                .collect(),
            drains: listing.drained.clone(),
            skipped: listing.skipped.clone(),
            disruption_notice: listing.notice.clone(),
            engine_leader_notice: listing.leader_notice.clone(),
        }
    }
}

/// `version --output json`: fleetctl's version and, once the cluster was read, the versions
/// its live fleetds publish; `error` instead when it could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Version {
    pub fleetctl: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleetds: Option<Vec<VersionGroup>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The live machines whose fleetd publishes one version (`""`: it publishes none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VersionGroup {
    pub version: String,
    #[serde(rename = "machineIDs")]
    pub machine_ids: Vec<String>,
}

impl Version {
    /// fleetctl's `version`, and what reading the cluster's machines gave.
    pub fn of(fleetctl: &str, machines: Result<&[MachineInfo], String>) -> Version {
        let (fleetds, error) = match machines {
            Ok(machines) => (Some(version_groups(machines)), None),
            Err(e) => (None, Some(e)),
        };
        Version {
            fleetctl: fleetctl.to_owned(),
            fleetds,
            error,
        }
    }

    /// The text of `fleetctl version`: fleet's first line, then one line per fleetd version
    /// (`fleetd 0.1.0: 3 machines`). Nothing about the cluster when it was not read.
    pub fn text(&self) -> String {
        let mut out = format!("fleetctl version {}\n", self.fleetctl);
        match self.fleetds.as_deref() {
            None => {}
            Some([]) => out.push_str("fleetd: no machine registered\n"),
            Some(groups) => {
                for g in groups {
                    let version = if g.version.is_empty() {
                        "(version unknown)"
                    } else {
                        &g.version
                    };
                    let n = g.machine_ids.len();
                    let noun = if n == 1 { "machine" } else { "machines" };
                    out.push_str(&format!("fleetd {version}: {n} {noun}\n"));
                }
            }
        }
        out
    }
}

/// Machines grouped by the version they publish: the most common first, then by version.
pub fn version_groups(machines: &[MachineInfo]) -> Vec<VersionGroup> {
    let mut by_version: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for m in machines {
        by_version
            .entry(m.version.as_str())
            .or_default()
            .push(m.id.to_string());
    }
    let mut groups: Vec<VersionGroup> = by_version
        .into_iter()
        .map(|(version, mut machine_ids)| {
            machine_ids.sort();
            VersionGroup {
                version: version.to_owned(),
                machine_ids,
            }
        })
        .collect();
    groups.sort_by(|a, b| {
        b.machine_ids
            .len()
            .cmp(&a.machine_ids.len())
            .then_with(|| a.version.cmp(&b.version))
    });
    groups
}

/// `doc` as fleetctl prints it: pretty, as `explain --output=json`, ending in a newline.
pub fn render<T: Serialize>(doc: &T) -> Result<String, serde_json::Error> {
    let mut text = serde_json::to_string_pretty(doc)?;
    text.push('\n');
    Ok(text)
}

#[cfg(test)]
mod tests;
