//! Two clients of fleet's v1 API that know nothing of this code base, against a running
//! fleetd over its default unix socket (`/var/run/fleet.sock` inside the machine), as a script
//! on the host would use it:
//!
//! - one written only from fleet's `Documentation/api-v1.md`: create, list with pagination,
//!   set a state, patch machine metadata, destroy, discovery, and the error entities the
//!   document promises;
//! - one generated at run time from the discovery document, as fleet's docs tell users to do
//!   (and as its `Documentation/examples/api.py` does): it walks `resources`/`methods`, builds
//!   each request from the method's `path`, `httpMethod` and parameters, checks each request
//!   and response body against the document's schemas (of a `streamed` method, its first
//!   line), and calls every method it lists.
//!
//! Both speak HTTP/1.1 as plain text over a `std` `UnixStream` (one request per connection,
//! `Connection: close`): no client library stands between the document and the wire.

mod support;

use anyhow::{Context, Result, bail, ensure};
use fleet_functional_tests::{FleetdSpec, Machine, wait_for_value};
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use support::{POLL, TIMEOUT, finish, http_exchange, start};

/// A small page, so that a handful of units spans several pages.
const PAGE: usize = 2;

fn spec() -> FleetdSpec {
    FleetdSpec::default().with_env("FLEET_TOKEN_LIMIT", PAGE.to_string())
}

/// One request and its answer, over a fresh connection to a unix socket.
struct Wire {
    socket: PathBuf,
}

impl Wire {
    fn to(machine: &Machine) -> Wire {
        Wire {
            socket: machine.api_socket(),
        }
    }

    fn send(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
        let stream = UnixStream::connect(&self.socket)
            .with_context(|| format!("connecting to {}", self.socket.display()))?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        http_exchange(stream, "fleet", method, path, body)
    }

    /// The status and the first line of a streamed answer (a held response, chunked), read as
    /// it comes; the connection is then dropped.
    fn first_line(&self, method: &str, path: &str) -> Result<(u16, Value)> {
        use std::io::{Read, Write};
        let mut stream = UnixStream::connect(&self.socket)
            .with_context(|| format!("connecting to {}", self.socket.display()))?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        write!(stream, "{method} {path} HTTP/1.1\r\nHost: fleet\r\n\r\n")?;
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = stream.read(&mut buf)?;
            ensure!(n > 0, "the stream ended before a line: {raw:?}");
            raw.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&raw).into_owned();
            let Some((head, body)) = text.split_once("\r\n\r\n") else {
                continue;
            };
            let status: u16 = head
                .split_whitespace()
                .nth(1)
                .context("no status")?
                .parse()?;
            // A chunk's size line, then its data: the first line is in the first chunks.
            let data: String = body
                .split("\r\n")
                .skip(1)
                .step_by(2)
                .collect::<Vec<_>>()
                .concat();
            if let Some((line, _)) = data.split_once('\n') {
                return Ok((status, serde_json::from_str(line)?));
            }
            if status != 200 && !body.is_empty() {
                return Ok((status, serde_json::from_str(&data).unwrap_or(Value::Null)));
            }
        }
    }

    /// Waits until fleetd answers `path` with 200 and a body `accept` takes.
    fn wait(&self, path: &str, accept: impl Fn(&Value) -> bool) -> Result<Value> {
        wait_for_value(TIMEOUT, POLL, || {
            self.send("GET", path, None)
                .ok()
                .filter(|(status, body)| *status == 200 && accept(body))
                .map(|(_, body)| body)
        })
        .with_context(|| format!("GET {path} never answered as expected"))
    }
}

/// "400- and 500-level API responses may return JSON-encoded error entities": `code` is the
/// status and `message` says something.
fn is_error_entity(status: u16, body: &Value) -> bool {
    body["error"]["code"] == status
        && body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
}

/// Every entity of a collection, following `nextPageToken` as "Pagination" says; the size of
/// each page.
fn collect(wire: &Wire, path: &str, field: &str) -> Result<(Vec<Value>, Vec<usize>)> {
    let mut items = Vec::new();
    let mut sizes = Vec::new();
    let mut next = path.to_owned();
    loop {
        let (status, page) = wire.send("GET", &next, None)?;
        ensure!(status == 200, "GET {next} answered {status}: {page}");
        let entities = page[field].as_array().cloned().unwrap_or_default();
        sizes.push(entities.len());
        items.extend(entities);
        let Some(token) = page["nextPageToken"].as_str() else {
            return Ok((items, sizes));
        };
        let sep = if path.contains('?') { '&' } else { '?' };
        next = format!("{path}{sep}nextPageToken={}", encode(token));
        ensure!(sizes.len() < 100, "pagination never ends at {next}");
    }
}

/// A query value, percent-encoded (a token may hold `+`, `/` or `=`).
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn sleeper(seconds: u32) -> Value {
    json!([{"section": "Service", "name": "ExecStart", "value": format!("/bin/sleep {seconds}")}])
}

#[test]
fn a_client_written_from_fleets_api_document_does_every_operation() -> Result<()> {
    let (cluster, _registry) = start(1, spec())?;
    let machine = &cluster.machines()[0];
    let wire = Wire::to(machine);

    // "Capability Discovery": served from the API itself, at the /discovery endpoint.
    let discovery = wire.wait("/fleet/v1/discovery", |d| d["kind"].is_string())?;
    ensure!(
        discovery["kind"] == "discovery#restDescription" && discovery["servicePath"] == "fleet/v1/",
        "{discovery}"
    );

    // "Create a Unit": 201, no body; without options 409.
    let names: Vec<String> = (1..=5).map(|i| format!("doc{i}.service")).collect();
    for (i, name) in names.iter().enumerate() {
        let create = json!({"desiredState": "inactive", "options": sleeper(1000 + i as u32)});
        let (status, body) = wire.send("PUT", &format!("/fleet/v1/units/{name}"), Some(&create))?;
        ensure!(
            status == 201 && body.is_null(),
            "create {name}: {status} {body}"
        );
    }
    let (status, body) = wire.send("PUT", "/fleet/v1/units/none.service", Some(&json!({})))?;
    ensure!(
        status == 409 && is_error_entity(409, &body),
        "{status} {body}"
    );
    let (status, body) = wire.send(
        "PUT",
        "/fleet/v1/units/doc1.service",
        Some(&json!({"name": "other.service", "desiredState": "launched"})),
    )?;
    ensure!(
        status == 400 && is_error_entity(400, &body),
        "name mismatch: {status} {body}"
    );

    // "List Units" with "Pagination": pages until one has no nextPageToken.
    let (units, sizes) = collect(&wire, "/fleet/v1/units", "units")?;
    let listed: Vec<&str> = units.iter().filter_map(|u| u["name"].as_str()).collect();
    ensure!(listed == names, "listed {listed:?}");
    ensure!(sizes == [PAGE, PAGE, 1], "page sizes {sizes:?}");
    let (status, body) = wire.send("GET", "/fleet/v1/units?nextPageToken=8fefec2c", None)?;
    ensure!(
        status == 400 && is_error_entity(400, &body),
        "bad token: {status} {body}"
    );

    // "Modify a Unit's desiredState": 204; the UnitState entity then tells what runs.
    let (status, _) = wire.send(
        "PUT",
        "/fleet/v1/units/doc2.service",
        Some(&json!({"desiredState": "launched"})),
    )?;
    ensure!(status == 204, "launch answered {status}");
    let unit = wire.wait("/fleet/v1/units/doc2.service", |u| {
        u["currentState"] == "launched"
    })?;
    ensure!(unit["machineID"] == machine.id().as_str(), "{unit}");
    let states = wire.wait("/fleet/v1/state?unitName=doc2.service", |s| {
        s["states"][0]["systemdActiveState"] == "active"
    })?;
    let state = &states["states"][0];
    ensure!(
        state["name"] == "doc2.service"
            && state["machineID"] == machine.id().as_str()
            && state["hash"].as_str().is_some_and(|h| h.len() == 40)
            && state["systemdLoadState"] == "loaded"
            && state["systemdSubState"] == "running",
        "{state}"
    );
    let path = format!("/fleet/v1/state?machineID={}", machine.id());
    let (by_machine, _) = collect(&wire, &path, "states")?;
    ensure!(
        by_machine.iter().any(|s| s["name"] == "doc2.service"),
        "{by_machine:?}"
    );

    // "Edit Machine Metadata": add, replace, remove; 204 each; a bad path is a 400.
    let key = format!("/{}/metadata/tier", machine.id());
    let steps = [
        (
            json!([{"op": "add", "path": key, "value": "api"}]),
            Some("api"),
        ),
        (
            json!([{"op": "replace", "path": key, "value": "web"}]),
            Some("web"),
        ),
        (json!([{"op": "remove", "path": key}]), None),
    ];
    for (patch, expect) in steps {
        let (status, body) = wire.send("PATCH", "/fleet/v1/machines", Some(&patch))?;
        ensure!(status == 204, "{patch}: {status} {body}");
        let machines = wire.wait("/fleet/v1/machines", |m| {
            m["machines"][0]["metadata"]
                .get("tier")
                .and_then(Value::as_str)
                == expect
        })?;
        ensure!(
            machines["machines"][0]["metadata"]["hostname"] == machine.name(),
            "{machines}"
        );
    }
    let bad = json!([{"op": "add", "path": "/metadata/tier", "value": "api"}]);
    let (status, body) = wire.send("PATCH", "/fleet/v1/machines", Some(&bad))?;
    ensure!(
        status == 400 && is_error_entity(400, &body),
        "bad path: {status} {body}"
    );

    // "Destroy a Unit": 204, then 404 for it.
    let (status, _) = wire.send("DELETE", "/fleet/v1/units/doc2.service", None)?;
    ensure!(status == 204, "destroy answered {status}");
    let (status, body) = wire.send("GET", "/fleet/v1/units/doc2.service", None)?;
    ensure!(
        status == 404 && is_error_entity(404, &body),
        "{status} {body}"
    );
    let (status, body) = wire.send("DELETE", "/fleet/v1/units/doc2.service", None)?;
    ensure!(
        status == 404 && is_error_entity(404, &body),
        "{status} {body}"
    );
    let (units, _) = collect(&wire, "/fleet/v1/units", "units")?;
    ensure!(units.len() == names.len() - 1, "{units:?}");
    finish(cluster)
}

/// A method of the discovery document, as a generated client holds it.
#[derive(Debug, Clone)]
struct Method {
    id: String,
    http: String,
    path: String,
    /// Parameters by name: `(location, required)`.
    params: Vec<(String, String, bool)>,
    request: Option<String>,
    response: Option<String>,
    /// The answer is a held stream of the response entity, one a line (`streamed`).
    streamed: bool,
}

/// The client surface built from the document alone, as `examples/api.py`'s `build` does.
struct Generated {
    wire: Wire,
    service_path: String,
    schemas: Map<String, Value>,
    methods: Vec<Method>,
}

impl Generated {
    fn from_discovery(wire: Wire, doc: &Value) -> Result<Generated> {
        let mut methods = Vec::new();
        walk(doc, &mut methods)?;
        Ok(Generated {
            wire,
            service_path: doc["servicePath"]
                .as_str()
                .context("no servicePath")?
                .to_owned(),
            schemas: doc["schemas"].as_object().context("no schemas")?.clone(),
            methods,
        })
    }

    /// Calls method `id` with `args` (path and query parameters) and `body`: the URL is the
    /// method's path with its path parameters expanded, the other arguments as the query.
    /// The body is checked against the request schema and the answer against the response
    /// schema.
    fn call(&self, id: &str, args: &[(&str, &str)], body: Option<Value>) -> Result<(u16, Value)> {
        let method = self
            .methods
            .iter()
            .find(|m| m.id == id)
            .with_context(|| format!("the document has no method {id}"))?;
        let mut path = method.path.clone();
        let mut query = Vec::new();
        for (name, location, required) in &method.params {
            let value = args.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
            match (location.as_str(), value) {
                ("path", Some(v)) => path = path.replace(&format!("{{{name}}}"), v),
                ("path", None) => bail!("{id}: path parameter {name} missing"),
                ("query", Some(v)) => query.push(format!("{name}={}", encode(v))),
                (_, None) if *required => bail!("{id}: parameter {name} is required"),
                (_, None) => {}
                (other, Some(_)) => bail!("{id}: parameter {name} in unknown location {other}"),
            }
        }
        for (name, _) in args {
            ensure!(
                method.params.iter().any(|(n, _, _)| n == name),
                "{id} takes no parameter {name}"
            );
        }
        let mut url = format!("/{}{path}", self.service_path);
        if !query.is_empty() {
            url = format!("{url}?{}", query.join("&"));
        }
        match (&method.request, &body) {
            (Some(schema), Some(b)) => self.conforms(b, &json!({"$ref": schema}), id)?,
            (None, Some(_)) => bail!("{id} takes no request body"),
            (Some(_), None) | (None, None) => {}
        }
        let (status, answer) = if method.streamed {
            self.wire.first_line(&method.http, &url)?
        } else {
            self.wire.send(&method.http, &url, body.as_ref())?
        };
        if let (Some(schema), 200) = (&method.response, status) {
            self.conforms(&answer, &json!({"$ref": schema}), id)?;
        }
        Ok((status, answer))
    }

    /// `value` is what `schema` (a document schema, with `$ref`s) describes: types, enums,
    /// and no property the schema does not declare.
    fn conforms(&self, value: &Value, schema: &Value, at: &str) -> Result<()> {
        if let Some(name) = schema["$ref"].as_str() {
            let target = self
                .schemas
                .get(name)
                .with_context(|| format!("{at}: no schema {name}"))?;
            return self.conforms(value, target, &format!("{at}<{name}>"));
        }
        if let Some(allowed) = schema["enum"].as_array() {
            ensure!(allowed.contains(value), "{at}: {value} not in {allowed:?}");
        }
        match schema["type"].as_str() {
            Some("string") => ensure!(value.is_string(), "{at}: {value} is no string"),
            Some("boolean") => ensure!(value.is_boolean(), "{at}: {value} is no boolean"),
            Some("integer") => ensure!(value.is_i64(), "{at}: {value} is no integer"),
            Some("array") => {
                let items = value
                    .as_array()
                    .with_context(|| format!("{at}: {value} is no array"))?;
                for (i, item) in items.iter().enumerate() {
                    self.conforms(item, &schema["items"], &format!("{at}[{i}]"))?;
                }
            }
            Some("object") => {
                let fields = value
                    .as_object()
                    .with_context(|| format!("{at}: {value} is no object"))?;
                for (key, field) in fields {
                    let declared = schema["properties"]
                        .get(key)
                        .or_else(|| schema.get("additionalProperties"))
                        .with_context(|| format!("{at}: property {key} is not in the document"))?;
                    self.conforms(field, declared, &format!("{at}.{key}"))?;
                }
            }
            other => bail!("{at}: schema type {other:?} unknown to this client"),
        }
        Ok(())
    }
}

/// Every method under `resources`, recursively.
fn walk(node: &Value, out: &mut Vec<Method>) -> Result<()> {
    for resource in node["resources"]
        .as_object()
        .into_iter()
        .flat_map(Map::values)
    {
        for method in resource["methods"]
            .as_object()
            .into_iter()
            .flat_map(Map::values)
        {
            let text = |field: &str| -> Result<String> {
                method[field]
                    .as_str()
                    .map(str::to_owned)
                    .with_context(|| format!("method without {field}: {method}"))
            };
            let params = method["parameters"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(name, p)| {
                    (
                        name.clone(),
                        p["location"].as_str().unwrap_or_default().to_owned(),
                        p["required"] == true,
                    )
                })
                .collect();
            out.push(Method {
                id: text("id")?,
                http: text("httpMethod")?,
                path: text("path")?,
                params,
                request: method["request"]["$ref"].as_str().map(str::to_owned),
                response: method["response"]["$ref"].as_str().map(str::to_owned),
                streamed: method["streamed"].is_string(),
            });
        }
        walk(resource, out)?;
    }
    Ok(())
}

/// One call of the generated client: method ID, arguments, body, the status it must get.
type Call<'a> = (&'a str, Vec<(&'a str, &'a str)>, Option<Value>, u16);

#[test]
fn a_client_generated_from_the_discovery_document_calls_every_method() -> Result<()> {
    let (cluster, _registry) = start(1, spec())?;
    let machine = &cluster.machines()[0];
    let wire = Wire::to(machine);
    let doc = wire.wait("/fleet/v1/discovery", |d| d["resources"].is_object())?;
    let client = Generated::from_discovery(wire, &doc)?;
    let id = machine.id().to_string();
    let unit = [("unitName", "disco.service")];

    // (method, arguments, body, expected status), in an order where each makes sense.
    let create = json!({"desiredState": "launched", "options": sleeper(2000)});
    let patch =
        json!([{"op": "add", "path": format!("/{id}/metadata/tier"), "value": {"value": "api"}}]);
    let calls: Vec<Call> = vec![
        ("fleet.Units.Set", unit.to_vec(), Some(create), 201),
        ("fleet.Units.Get", unit.to_vec(), None, 200),
        ("fleet.Units.List", vec![], None, 200),
        (
            "fleet.UnitState.List",
            vec![("unitName", "disco.service"), ("machineID", &id)],
            None,
            200,
        ),
        ("fleet.Machines.List", vec![], None, 200),
        ("fleet.Changes.Watch", vec![], None, 200),
        ("fleet.Machines.Patch", vec![], Some(patch), 204),
        (
            "fleet.Units.Set",
            unit.to_vec(),
            Some(json!({"desiredState": "loaded"})),
            204,
        ),
        ("fleet.Units.Delete", unit.to_vec(), None, 204),
        ("fleet.Units.Get", unit.to_vec(), None, 404),
        ("fleet.Units.Delete", unit.to_vec(), None, 404),
    ];
    let mut called = BTreeSet::new();
    for (method, args, body, expect) in calls {
        let (status, answer) = client.call(method, &args, body)?;
        ensure!(
            status == expect,
            "{method} {args:?}: {status}, not {expect}: {answer}"
        );
        if status >= 400 {
            ensure!(is_error_entity(status, &answer), "{method}: {answer}");
        }
        called.insert(method.to_owned());
    }
    let (_, page) = client.call("fleet.Machines.List", &[], None)?;
    ensure!(page["machines"][0]["metadata"]["tier"] == "api", "{page}");

    // Pagination through the generated List: the token goes back as its documented parameter.
    let names: Vec<String> = (1..=3).map(|i| format!("page{i}.service")).collect();
    for (i, name) in names.iter().enumerate() {
        let create = json!({"desiredState": "inactive", "options": sleeper(3000 + i as u32)});
        let (status, _) = client.call("fleet.Units.Set", &[("unitName", name)], Some(create))?;
        ensure!(status == 201, "create {name}: {status}");
    }
    let mut listed = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..10 {
        let args: Vec<(&str, &str)> = token
            .iter()
            .map(|t| ("nextPageToken", t.as_str()))
            .collect();
        let (status, page) = client.call("fleet.Units.List", &args, None)?;
        ensure!(status == 200, "{page}");
        listed.extend(
            page["units"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|u| u["name"].clone()),
        );
        token = page["nextPageToken"].as_str().map(str::to_owned);
        if token.is_none() {
            break;
        }
    }
    ensure!(token.is_none() && listed == names, "listed {listed:?}");
    let documented: BTreeSet<String> = client.methods.iter().map(|m| m.id.clone()).collect();
    ensure!(
        called == documented,
        "the document lists {documented:?}, the client called {called:?}"
    );
    finish(cluster)
}
