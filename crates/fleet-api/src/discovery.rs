//! The Google discovery document of the API (`GET /fleet/v1/discovery`), built here from a
//! table of methods and schemas, so it describes exactly what the router serves. A client
//! generated from it at run time (Google's client libraries, as fleet's docs suggest) can
//! call every method.

use http::HeaderValue;
use serde_json::{Map, Value, json};

/// One method of one resource.
struct Method {
    resource: &'static str,
    name: &'static str,
    http: &'static str,
    /// Relative to the service path; `{unitName}` is a path parameter.
    path: &'static str,
    description: &'static str,
    /// Query parameters: name and description.
    query: &'static [(&'static str, &'static str)],
    request: Option<&'static str>,
    response: Option<&'static str>,
}

const PAGE: (&str, &str) = (
    "nextPageToken",
    "Token of the page to return, as given in the previous page's nextPageToken.",
);

/// The extensions (docs/api.md "Extensions"): fleetctl's API driver asks for them.
const VIEW: (&str, &str) = (
    "view",
    "Extension: full adds what fleetctl shows beyond fleet's entities; writes then answer 200 with a WriteResult.",
);

const PAGE_SIZE: (&str, &str) = (
    "pageSize",
    "Extension, with view=full: entries per page (1 to 65535) instead of the server's token_limit.",
);

const METHODS: &[Method] = &[
    Method {
        resource: "Machines",
        name: "List",
        http: "GET",
        path: "machines",
        description: "Lists the live machines of the cluster, sorted by ID.",
        query: &[PAGE, VIEW, PAGE_SIZE],
        request: None,
        response: Some("MachinePage"),
    },
    Method {
        resource: "Machines",
        name: "Patch",
        http: "PATCH",
        path: "machines",
        description: "Adds, replaces or removes dynamic metadata of machines (JSON Patch on /<machineID>/metadata/<key>), all or nothing.",
        query: &[],
        request: Some("MachineMetadataPatch"),
        response: None,
    },
    Method {
        resource: "Units",
        name: "List",
        http: "GET",
        path: "units",
        description: "Lists every unit, sorted by name.",
        query: &[
            PAGE,
            VIEW,
            (
                "unitName",
                "Extension, with view=full: only these units (repeated).",
            ),
        ],
        request: None,
        response: Some("UnitPage"),
    },
    Method {
        resource: "Units",
        name: "Get",
        http: "GET",
        path: "units/{unitName}",
        description: "Returns one unit.",
        query: &[VIEW],
        request: None,
        response: Some("Unit"),
    },
    Method {
        resource: "Units",
        name: "Set",
        http: "PUT",
        path: "units/{unitName}",
        description: "Creates a unit (options required), replaces its content (other options), or sets its desired state.",
        query: &[
            VIEW,
            (
                "op",
                "Extension: stop, unload, raise, restart, advanceRollout or finishRollout instead of fleet's PUT.",
            ),
            (
                "noRestart",
                "Extension: true to replace without restarting the running unit.",
            ),
            (
                "reschedule",
                "Extension: true to place the replaced unit afresh, away from its machine.",
            ),
            (
                "rolling",
                "Extension: true to roll a global unit's replace out machine by machine.",
            ),
            (
                "machineID",
                "Extension, with op=advanceRollout: a machine that takes the new version (repeated).",
            ),
        ],
        request: Some("Unit"),
        // fleet's 201/204 have no body; the full view's WriteResult is in the schemas.
        response: None,
    },
    Method {
        resource: "Units",
        name: "Delete",
        http: "DELETE",
        path: "units/{unitName}",
        description: "Destroys a unit.",
        query: &[VIEW],
        request: None,
        response: None,
    },
    Method {
        resource: "UnitState",
        name: "List",
        http: "GET",
        path: "state",
        description: "Lists the states machines publish about the units they run.",
        query: &[
            PAGE,
            VIEW,
            PAGE_SIZE,
            ("machineID", "Only the states published by this machine."),
            (
                "unitName",
                "Only the states of this unit (with view=full: of any of these, repeated).",
            ),
        ],
        request: None,
        response: Some("UnitStatePage"),
    },
    Method {
        resource: "Changes",
        name: "Watch",
        http: "GET",
        path: "changes",
        description: "Extension: the registry's changes as they happen, over a response held open: newline-delimited JSON, one Change a line (the first names every part; one naming none is a keep-alive, every 15 s when idle). Re-read what a line names.",
        query: &[],
        request: None,
        response: Some("Change"),
    },
];

/// The methods whose answer is a stream of their response entity, one a line, held open
/// (`streamed` in the document: a client reads lines as they come, not one body).
const STREAMED: &[&str] = &["Changes.Watch"];

fn string() -> Value {
    json!({"type": "string"})
}

fn boolean() -> Value {
    json!({"type": "boolean"})
}

fn integer() -> Value {
    json!({"type": "integer", "format": "uint64"})
}

fn strings() -> Value {
    json!({"type": "array", "items": {"type": "string"}})
}

fn object(id: &str, properties: Value) -> Value {
    json!({"id": id, "type": "object", "properties": properties})
}

fn array_of(schema: &str) -> Value {
    json!({"type": "array", "items": {"$ref": schema}})
}

fn schemas() -> Value {
    json!({
        "Machine": object("Machine", json!({
            "id": string(),
            "primaryIP": string(),
            "metadata": {"type": "object", "additionalProperties": string()},
            "version": string(),
            "disableEngine": boolean(),
            "leader": boolean(),
        })),
        "MachinePage": object("MachinePage", json!({
            "machines": array_of("Machine"),
            "nextPageToken": string(),
            "skipped": strings(),
            "disruptionNotice": string(),
            "engineLeaderNotice": string(),
        })),
        "MachineMetadataPatch": {
            "id": "MachineMetadataPatch",
            "type": "array",
            "items": {"$ref": "MachineMetadataOp"},
        },
        "MachineMetadataOp": object("MachineMetadataOp", json!({
            "op": {"type": "string", "enum": ["add", "remove", "replace"]},
            "path": {"type": "string", "description": "/<machineID>/metadata/<key>"},
            "value": object("MachineMetadataValue", json!({"value": string()})),
        })),
        "UnitOption": object("UnitOption", json!({
            "section": string(),
            "name": string(),
            "value": string(),
        })),
        "Unit": object("Unit", json!({
            "name": string(),
            "options": array_of("UnitOption"),
            "desiredState": {"type": "string", "enum": ["inactive", "loaded", "launched"]},
            "currentState": {"type": "string", "enum": ["inactive", "loaded", "launched"]},
            "machineID": string(),
            "hash": string(),
            "machineIDs": strings(),
            "unscheduledReason": string(),
            "restartGeneration": integer(),
        })),
        "UnitPage": object("UnitPage", json!({
            "units": array_of("Unit"),
            "nextPageToken": string(),
            "skipped": strings(),
        })),
        "WriteResult": object("WriteResult", json!({
            "outcome": {"type": "string", "enum": [
                "created", "replaced", "stateChanged", "unchanged", "restarted", "launched",
                "rolloutAdvanced", "rolloutFinished", "destroyed", "unreadable", "missing",
            ]},
            "unit": {"$ref": "Unit"},
            "restartGeneration": integer(),
            "detail": string(),
        })),
        "UnitState": object("UnitState", json!({
            "name": string(),
            "hash": string(),
            "machineID": string(),
            "systemdLoadState": string(),
            "systemdActiveState": string(),
            "systemdSubState": string(),
            "restartGeneration": integer(),
            "restartPending": boolean(),
            "restarts": integer(),
            "since": string(),
            "exit": string(),
        })),
        "Change": object("Change", json!({
            "revision": {"type": "integer", "format": "int64"},
            "changed": {"type": "array", "items": {"type": "string", "enum": [
                "units", "states", "machines", "events",
            ]}},
        })),
        "UnitStatePage": object("UnitStatePage", json!({
            "states": array_of("UnitState"),
            "nextPageToken": string(),
        })),
    })
}

fn method(m: &Method) -> Value {
    let mut parameters = Map::new();
    let mut order = Vec::new();
    if m.path.contains("{unitName}") {
        parameters.insert(
            "unitName".into(),
            json!({"type": "string", "required": true, "location": "path",
                   "description": "The unit's name, such as hello.service."}),
        );
        order.push("unitName");
    }
    for (name, description) in m.query {
        parameters.insert(
            (*name).into(),
            json!({"type": "string", "location": "query", "description": description}),
        );
    }
    let mut value = json!({
        "id": format!("fleet.{}.{}", m.resource, m.name),
        "httpMethod": m.http,
        "path": m.path,
        "description": m.description,
        "parameters": parameters,
        "parameterOrder": order,
    });
    if let Some(r) = m.request {
        value["request"] = json!({"$ref": r});
    }
    if let Some(r) = m.response {
        value["response"] = json!({"$ref": r});
    }
    if STREAMED.contains(&format!("{}.{}", m.resource, m.name).as_str()) {
        value["streamed"] = json!("application/x-ndjson");
    }
    value
}

fn resources() -> Value {
    let mut resources = Map::new();
    for m in METHODS {
        let resource = resources
            .entry(m.resource)
            .or_insert_with(|| json!({"methods": {}}));
        resource["methods"][m.name] = method(m);
    }
    Value::Object(resources)
}

/// The document. With the request's `Host`, its root URL points back at this server, so a
/// client built from it needs no endpoint of its own; without, it keeps fleet's `$ENDPOINT`.
pub fn document(host: Option<&HeaderValue>) -> Value {
    let root = host
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty())
        .map(|h| format!("http://{h}/"))
        .unwrap_or_else(|| "$ENDPOINT/".to_owned());
    json!({
        "kind": "discovery#restDescription",
        "discoveryVersion": "v1",
        "id": "fleet:v1",
        "name": "fleet",
        "version": "v1",
        "title": "fleet API",
        "description": "Units, their states and the machines of a fleet cluster.",
        "protocol": "rest",
        "rootUrl": root,
        "servicePath": "fleet/v1/",
        "baseUrl": format!("{root}fleet/v1/"),
        "basePath": "/fleet/v1/",
        "batchPath": "batch",
        "parameters": {},
        "schemas": schemas(),
        "resources": resources(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_every_method_with_its_schemas() {
        let doc = document(None);
        let res = &doc["resources"];
        for (resource, method, http) in [
            ("Machines", "List", "GET"),
            ("Machines", "Patch", "PATCH"),
            ("Units", "List", "GET"),
            ("Units", "Get", "GET"),
            ("Units", "Set", "PUT"),
            ("Units", "Delete", "DELETE"),
            ("UnitState", "List", "GET"),
            ("Changes", "Watch", "GET"),
        ] {
            let m = &res[resource]["methods"][method];
            assert_eq!(m["httpMethod"], http, "{resource}.{method}");
            for schema in [&m["request"]["$ref"], &m["response"]["$ref"]] {
                if let Some(name) = schema.as_str() {
                    assert!(doc["schemas"][name].is_object(), "{name}");
                }
            }
        }
        assert_eq!(res["Units"]["methods"]["Set"]["request"]["$ref"], "Unit");
        assert_eq!(
            res["UnitState"]["methods"]["List"]["parameters"]["machineID"]["location"],
            "query"
        );
        assert_eq!(doc["rootUrl"], "$ENDPOINT/");
        let set = &res["Units"]["methods"]["Set"]["parameters"];
        for extension in [
            "view",
            "op",
            "noRestart",
            "reschedule",
            "rolling",
            "machineID",
        ] {
            assert_eq!(set[extension]["location"], "query", "{extension}");
        }
        assert!(doc["schemas"]["WriteResult"]["properties"]["outcome"].is_object());
        assert_eq!(
            res["Changes"]["methods"]["Watch"]["streamed"],
            "application/x-ndjson"
        );
        assert!(res["Units"]["methods"]["List"].get("streamed").is_none());
    }

    #[test]
    fn root_url_points_at_the_host_asked() {
        let host = HeaderValue::from_static("10.0.0.1:54728");
        let doc = document(Some(&host));
        assert_eq!(doc["rootUrl"], "http://10.0.0.1:54728/");
        assert_eq!(doc["baseUrl"], "http://10.0.0.1:54728/fleet/v1/");
    }
}
