//! fleet's v1 entities with fleet's JSON names (`schema/v1.json`). Empty fields are left out,
//! as fleet's generated Go types do (`omitempty`), and missing ones read as empty, so fleet's
//! clients and ours read each other's bodies.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

fn is_empty(s: &str) -> bool {
    s.is_empty()
}

/// One `Name=Value` line of a unit file's section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitOption {
    #[serde(default)]
    pub section: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub value: String,
}

/// A unit: its file as options, what the user wants, and where it runs.
///
/// States stay strings on the wire: an unknown `desiredState` must be a 400 naming it, not a
/// decoding error.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unit {
    #[serde(default, skip_serializing_if = "is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<UnitOption>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub desired_state: String,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub current_state: String,
    #[serde(rename = "machineID", default, skip_serializing_if = "is_empty")]
    pub machine_id: String,
}

/// What one machine's systemd says about a unit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitState {
    #[serde(default, skip_serializing_if = "is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub hash: String,
    #[serde(rename = "machineID", default, skip_serializing_if = "is_empty")]
    pub machine_id: String,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub systemd_load_state: String,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub systemd_active_state: String,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub systemd_sub_state: String,
}

/// A live machine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    #[serde(default, skip_serializing_if = "is_empty")]
    pub id: String,
    #[serde(rename = "primaryIP", default, skip_serializing_if = "is_empty")]
    pub primary_ip: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitPage {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<Unit>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub next_page_token: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitStatePage {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<UnitState>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub next_page_token: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachinePage {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machines: Vec<Machine>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub next_page_token: String,
}

/// One operation of a `PATCH /machines` body (JSON Patch on `/<machineID>/metadata/<key>`).
/// Field names match case-insensitively in fleet (Go's decoder): its own tests send `Value`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataOp {
    #[serde(default, alias = "Op", alias = "OP")]
    pub op: String,
    #[serde(default, alias = "Path")]
    pub path: String,
    #[serde(default, alias = "Value", skip_serializing_if = "Option::is_none")]
    pub value: Option<MetadataValue>,
}

/// The value of an `add` or `replace`: fleet's code and tests send `{"value": "…"}`; its
/// document shows a plain string, which fleet refused and is taken here too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MetadataValue {
    Wrapped {
        #[serde(default, alias = "Value")]
        value: String,
    },
    Plain(String),
}

impl MetadataValue {
    pub fn as_str(&self) -> &str {
        match self {
            Self::Wrapped { value } | Self::Plain(value) => value,
        }
    }
}

/// Every error body: `{"error":{"code":N,"message":"…"}}` (Google's error shape).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorEntity,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorEntity {
    pub code: u16,
    #[serde(default)]
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unit_uses_fleets_field_names_and_leaves_out_empty_ones() {
        let unit = Unit {
            name: "a.service".into(),
            options: vec![UnitOption {
                section: "Service".into(),
                name: "ExecStart".into(),
                value: "/bin/true".into(),
            }],
            desired_state: "launched".into(),
            current_state: String::new(),
            machine_id: "m1".into(),
        };
        assert_eq!(
            serde_json::to_value(&unit).unwrap(),
            json!({"name": "a.service", "desiredState": "launched", "machineID": "m1",
                   "options": [{"section": "Service", "name": "ExecStart", "value": "/bin/true"}]})
        );
    }

    #[test]
    fn unit_state_and_machine_use_fleets_field_names() {
        let state = UnitState {
            name: "a.service".into(),
            hash: "ab".into(),
            machine_id: "m1".into(),
            systemd_load_state: "loaded".into(),
            systemd_active_state: "active".into(),
            systemd_sub_state: "running".into(),
        };
        assert_eq!(
            serde_json::to_value(&state).unwrap(),
            json!({"name": "a.service", "hash": "ab", "machineID": "m1",
                   "systemdLoadState": "loaded", "systemdActiveState": "active",
                   "systemdSubState": "running"})
        );
        let machine = Machine {
            id: "m1".into(),
            primary_ip: "10.0.0.1".into(),
            metadata: BTreeMap::from([("a".into(), "b".into())]),
        };
        assert_eq!(
            serde_json::to_value(&machine).unwrap(),
            json!({"id": "m1", "primaryIP": "10.0.0.1", "metadata": {"a": "b"}})
        );
    }

    #[test]
    fn pages_carry_next_page_token_only_when_there_is_more() {
        let page = UnitPage {
            units: vec![],
            next_page_token: String::new(),
        };
        assert_eq!(serde_json::to_value(&page).unwrap(), json!({}));
        let page = MachinePage {
            machines: vec![],
            next_page_token: "ZAACAA==".into(),
        };
        assert_eq!(
            serde_json::to_value(&page).unwrap(),
            json!({"nextPageToken": "ZAACAA=="})
        );
    }
}
