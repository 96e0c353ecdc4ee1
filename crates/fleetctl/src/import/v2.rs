//! fleet v1's registry as it lies in etcd's v2 keyspace, read from one recursive `GET` of its
//! prefix (`/v2/keys/_coreos.com/fleet/?recursive=true`). Pure: it takes the response's bytes
//! and says what fleet holds; it never talks to etcd, and it decides nothing.
//!
//! fleet v1 (`registry/` in its code) writes, under its prefix:
//!
//! | key                          | value                                             |
//! |------------------------------|---------------------------------------------------|
//! | `job/<name>/object`          | `{"Name": name, "UnitHash": [20 bytes]}`          |
//! | `job/<name>/target-state`    | `inactive`, `loaded` or `launched`                |
//! | `job/<name>/target`          | the machine a non-global unit is scheduled on     |
//! | `unit/<hex hash>`            | `{"Raw": the unit file's text}`                   |
//! | `machines/<id>/object`       | the machine's presence (on its TTL)               |
//! | `states/<name>/<machine>`    | what that machine's systemd says (on its TTL)     |
//!
//! A value that cannot be read is kept as the reason, for the plan to refuse that unit by name:
//! fleet's registry has been written by many versions over the years.

use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

/// Why the response as a whole cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum V2Error {
    #[error("etcd's v2 answer is not its JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("etcd's v2 answer has no node under {0} (is it fleet's prefix?)")]
    NotFleet(String),
}

/// One unit as fleet holds it. Each field is what its key says, or why it could not be read;
/// `None`: the key is not there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetJob {
    /// The hash named by `object`, in hex.
    pub hash: Option<Result<String, String>>,
    pub target_state: Option<String>,
    pub target: Option<String>,
}

/// What one machine's systemd said of a unit (fleet's `states/<name>/<machine>`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FleetState {
    #[serde(rename = "activeState", default)]
    pub active: String,
    #[serde(rename = "unitHash", default)]
    pub hash: String,
}

/// fleet's registry: its units by name, their files by hash, and where machines report them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetRegistry {
    pub jobs: BTreeMap<String, FleetJob>,
    /// Each file's text by its hex hash, or why it could not be read.
    pub files: BTreeMap<String, Result<String, String>>,
    /// Unit name → machine → its state there.
    pub states: BTreeMap<String, BTreeMap<String, FleetState>>,
    /// The machines present in fleet (their presence keys).
    pub machines: BTreeSet<String>,
}

#[derive(Deserialize)]
struct Response {
    node: Node,
}

#[derive(Deserialize)]
struct Node {
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    nodes: Vec<Node>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct JobObject {
    unit_hash: Vec<u8>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct UnitObject {
    raw: String,
}

impl FleetRegistry {
    /// Reads the answer to a recursive `GET` of `prefix` (`/_coreos.com/fleet/`). An answer
    /// of etcd's "key not found" (no fleet there) is an empty registry, as fleet reads it.
    pub fn from_v2(body: &[u8], prefix: &str) -> Result<FleetRegistry, V2Error> {
        if let Ok(error) = serde_json::from_slice::<serde_json::Value>(body)
            && error.get("errorCode").and_then(serde_json::Value::as_u64) == Some(100)
        {
            return Ok(FleetRegistry::default());
        }
        let response: Response = serde_json::from_slice(body).map_err(V2Error::NotJson)?;
        let root = prefix.trim_end_matches('/');
        if response.node.key.trim_end_matches('/') != root {
            return Err(V2Error::NotFleet(root.to_owned()));
        }
        let mut registry = FleetRegistry::default();
        let mut leaves = Vec::new();
        collect_leaves(&response.node, &mut leaves);
        for (key, value) in leaves {
            let Some(rest) = key.strip_prefix(root) else {
                continue;
            };
            let parts: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
            registry.take(&parts, value);
        }
        Ok(registry)
    }

    /// Records one key (its path under the prefix, split) and its value.
    fn take(&mut self, parts: &[&str], value: &str) {
        match parts {
            ["job", name, "object"] => {
                self.job(name).hash = Some(job_hash(value));
            }
            ["job", name, "target-state"] => {
                self.job(name).target_state = Some(value.to_owned());
            }
            ["job", name, "target"] => self.job(name).target = Some(value.to_owned()),
            ["unit", hash] => {
                let raw = serde_json::from_str::<UnitObject>(value)
                    .map(|u| u.raw)
                    .map_err(|e| format!("its file's record is not fleet's JSON: {e}"));
                self.files.insert((*hash).to_owned(), raw);
            }
            ["machines", id, "object"] => {
                self.machines.insert((*id).to_owned());
            }
            ["states", name, machine] => {
                if let Ok(state) = serde_json::from_str::<FleetState>(value) {
                    let states = self.states.entry((*name).to_owned()).or_default();
                    states.insert((*machine).to_owned(), state);
                }
            }
            // Machine metadata, the engine's lease, legacy `state/` keys: each host's own
            // fleetd says those again.
            _ => {}
        }
    }

    fn job(&mut self, name: &str) -> &mut FleetJob {
        self.jobs.entry(name.to_owned()).or_default()
    }
}

/// The hex hash a job's `object` names.
fn job_hash(value: &str) -> Result<String, String> {
    let object: JobObject = serde_json::from_str(value)
        .map_err(|e| format!("its job record is not fleet's JSON: {e}"))?;
    if object.unit_hash.len() != 20 {
        return Err(format!(
            "its job record names a hash of {} bytes, not 20",
            object.unit_hash.len()
        ));
    }
    Ok(object
        .unit_hash
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

fn collect_leaves<'n>(node: &'n Node, out: &mut Vec<(&'n str, &'n str)>) {
    if let Some(value) = &node.value {
        out.push((&node.key, value));
    }
    for child in &node.nodes {
        collect_leaves(child, out);
    }
}
