//! The documents against their documentation: every field docs/operating.md lists under
//! "JSON output" is in a fully populated document, of the type it says, and nothing else is.

use super::*;
use fleet_core::{DesiredState, MachineId, UnitFile};
use fleet_ops::{StateView, UnitStatus, UnitView};
use serde_json::Value;
use std::collections::BTreeSet;

const OPERATING: &str = include_str!("../../../../docs/operating.md");

/// The table of docs/operating.md's "JSON output": command -> field path -> type.
fn documented() -> BTreeMap<String, BTreeMap<String, String>> {
    let section = OPERATING
        .split("\n## JSON output\n")
        .nth(1)
        .expect("docs/operating.md has a \"JSON output\" section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // `| command | `field` | type | meaning |` splits into six cells.
        let [_, command, field, kind, _, _] = cells.as_slice() else {
            continue;
        };
        let Some(path) = field.strip_prefix('`').and_then(|f| f.strip_suffix('`')) else {
            continue;
        };
        let old = out
            .entry((*command).to_owned())
            .or_default()
            .insert(path.to_owned(), (*kind).to_owned());
        assert!(old.is_none(), "{command} {path} is documented twice");
    }
    out
}

/// Every field path of `value` with its type; a `map` of `documented` is not descended into.
/// An object is not a path of its own (an entity in a list is its fields).
fn shape(value: &Value, documented: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    fn walk(
        value: &Value,
        path: &str,
        documented: &BTreeMap<String, String>,
        out: &mut BTreeMap<String, String>,
    ) {
        let is_map = documented.get(path).is_some_and(|t| t == "map");
        let entity = value.is_object() && !is_map;
        if !path.is_empty() && !entity {
            let kind = match value {
                Value::Null => "null",
                Value::Bool(_) => "bool",
                Value::Number(_) => "number",
                Value::String(_) => "string",
                Value::Array(_) => "array",
                Value::Object(_) => "map",
            };
            if let Some(other) = out.insert(path.to_owned(), kind.to_owned()) {
                assert_eq!(other, kind, "{path} has two types");
            }
        }
        match value {
            Value::Object(fields) if !is_map => {
                for (k, v) in fields {
                    let child = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(v, &child, documented, out);
                }
            }
            Value::Array(items) => {
                for item in items {
                    walk(item, &format!("{path}[]"), documented, out);
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    walk(value, "", documented, &mut out);
    out
}

fn id(s: &str) -> MachineId {
    s.parse().unwrap()
}

/// A machine with every field set.
fn machine(s: &str, version: &str) -> MachineInfo {
    MachineInfo {
        id: id(s),
        public_ip: "10.0.0.1".into(),
        metadata: BTreeMap::from([("region".into(), "us".into())]),
        version: version.into(),
        disable_engine: true,
        api: "https://10.0.0.1:8443".into(),
        fence_at: None,
    }
}

fn unit_files() -> UnitFiles {
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/true\n").unwrap();
    let view = UnitView {
        status: UnitStatus {
            name: "a.service".parse().unwrap(),
            hash: file.hash(),
            desired: DesiredState::Launched,
            machines: vec![id("m1")],
            unscheduled: Some("no machine has region=eu".into()),
            restart: 2,
        },
        file,
        global: false,
        current: DesiredState::Launched,
    };
    UnitFiles::of(&UnitListing {
        units: vec![view],
        skipped: vec!["/_coreos.com/fleet/job/b.service/object: not JSON".into()],
    })
}

fn units() -> Units {
    let state = StateView {
        name: "a.service".parse().unwrap(),
        machine: id("m1"),
        hash: Some(
            UnitFile::parse(b"[Service]\nExecStart=/bin/true\n")
                .unwrap()
                .hash(),
        ),
        load: "loaded".into(),
        active: "active".into(),
        sub: "running".into(),
        restart: 2,
        restart_pending: true,
        restarts: 3,
        since: Some(1_764_912_187_123_456),
        exit: Some("exit status 3".into()),
    };
    Units::of(&StateListing {
        states: vec![state],
        skipped: vec!["/_coreos.com/fleet/unit-state/m1/b.service: not JSON".into()],
    })
}

fn machines() -> Machines {
    Machines::of(&MachineListing {
        machines: vec![machine("m1", "0.1.0")],
        skipped: vec!["/_coreos.com/fleet/machines/m2/object: not JSON".into()],
        notice: Some("rescheduling held".into()),
        leader_notice: Some("the engine leader key names machine ghost".into()),
        drained: vec![fleet_registry::DrainRecord {
            machine: id("m1"),
            parallel: 2,
            since: 1_700_000_000,
        }],
        leader: Some(id("m1")),
    })
}

#[test]
fn every_documented_field_is_in_the_documents_with_its_type_and_nothing_else() {
    let docs = documented();
    let reached = [machine("m1", "0.1.0")];
    let unreached = Version::of("0.1.0", Err("etcd is away".into()));
    let cases: [(&str, Vec<Value>); 4] = [
        (
            "list-unit-files",
            vec![serde_json::to_value(unit_files()).unwrap()],
        ),
        ("list-units", vec![serde_json::to_value(units()).unwrap()]),
        (
            "list-machines",
            vec![serde_json::to_value(machines()).unwrap()],
        ),
        (
            "version",
            vec![
                serde_json::to_value(Version::of("0.1.0", Ok(&reached))).unwrap(),
                serde_json::to_value(unreached).unwrap(),
            ],
        ),
    ];
    assert_eq!(
        docs.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        cases.iter().map(|(c, _)| *c).collect(),
        "the documented commands"
    );
    for (command, values) in cases {
        let documented = &docs[command];
        let mut seen = BTreeMap::new();
        for value in &values {
            seen.extend(shape(value, documented));
        }
        assert_eq!(
            &seen, documented,
            "{command}: documents vs docs/operating.md"
        );
    }
}

#[test]
fn empty_listings_keep_their_lists_and_leave_empty_fields_out() {
    let empty = serde_json::to_value(UnitFiles::of(&UnitListing::default())).unwrap();
    assert_eq!(empty, serde_json::json!({"units": [], "skipped": []}));
    let empty = serde_json::to_value(Machines::of(&MachineListing::default())).unwrap();
    assert_eq!(
        empty,
        serde_json::json!({"machines": [], "drains": [], "skipped": []})
    );
    let bare = MachineInfo {
        metadata: BTreeMap::new(),
        public_ip: String::new(),
        version: String::new(),
        disable_engine: false,
        api: String::new(),
        ..machine("m1", "")
    };
    let listing = MachineListing {
        machines: vec![bare],
        ..MachineListing::default()
    };
    let value = serde_json::to_value(Machines::of(&listing)).unwrap();
    assert_eq!(value["machines"], serde_json::json!([{"id": "m1"}]));
}

#[test]
fn the_documents_use_the_apis_full_view_names() {
    let value = serde_json::to_value(unit_files()).unwrap();
    let api = serde_json::to_value(fleet_api_wire::wire::UnitPage {
        units: unit_files().units,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(value["units"], api["units"]);
    assert_eq!(value["units"][0]["machineIDs"], serde_json::json!(["m1"]));
}

#[test]
fn versions_are_grouped_the_most_common_first() {
    let machines = [
        machine("m1", "0.2.0"),
        machine("m2", "0.1.0"),
        machine("m3", "0.1.0"),
        machine("m4", ""),
    ];
    let v = Version::of("0.2.0", Ok(&machines));
    assert_eq!(
        v.text(),
        "fleetctl version 0.2.0\nfleetd 0.1.0: 2 machines\nfleetd (version unknown): 1 machine\n\
         fleetd 0.2.0: 1 machine\n"
    );
    let groups = v.fleetds.as_ref().unwrap();
    assert_eq!(groups[0].machine_ids, ["m2", "m3"]);
    assert_eq!(
        Version::of("0.2.0", Ok(&[])).text(),
        "fleetctl version 0.2.0\nfleetd: no machine registered\n"
    );
}

#[test]
fn an_unreachable_cluster_leaves_fleetctls_version_alone() {
    let v = Version::of("0.2.0", Err("connection refused".into()));
    assert_eq!(v.text(), "fleetctl version 0.2.0\n");
    assert_eq!(
        serde_json::to_value(&v).unwrap(),
        serde_json::json!({"fleetctl": "0.2.0", "error": "connection refused"})
    );
}

#[test]
fn rendered_documents_are_pretty_and_end_in_a_newline() {
    let text = render(&Units::of(&StateListing::default())).unwrap();
    assert_eq!(text, "{\n  \"states\": [],\n  \"skipped\": []\n}\n");
}
