//! fleet's v1 HTTP API against a running fleetd (issue 15): every resource, status code and
//! error entity, pagination over more than one page, 503 while etcd is away, and a client
//! written only from fleet's `Documentation/api-v1.md` as plain HTTP/1.1 text. fleetd listens
//! on plain TCP on its machine's address (explicitly allowed, as fleet's functional tests
//! used `fleet-tcp.socket`); the test talks to it from the host.

mod support;

use anyhow::{Context, Result, bail, ensure};
use fleet_functional_tests::{EtcdAuthSpec, FleetdSpec, Machine, wait_for, wait_for_value};
use serde_json::{Value, json};
use std::net::{SocketAddr, TcpStream};
use support::{POLL, TIMEOUT, finish, fleetctl_ok, http_exchange, start};

const PORT: u16 = 54728;

fn spec() -> FleetdSpec {
    FleetdSpec::default()
        .with_env("FLEET_API_LISTEN", format!("tcp:0.0.0.0:{PORT}"))
        .with_env("FLEET_API_ALLOW_PLAIN_TCP", "true")
}

fn addr(machine: &Machine) -> SocketAddr {
    SocketAddr::from((machine.ip(), PORT))
}

/// One HTTP answer.
#[derive(Debug)]
struct Reply {
    status: u16,
    content_type: Option<String>,
    server: Option<String>,
    body: Value,
}

/// One request over a fresh connection with hyper's client.
fn call(to: SocketAddr, method: &str, path: &str, body: Option<Value>) -> Result<Reply> {
    let content_type = body.as_ref().map(|_| "application/json");
    call_as(to, method, path, content_type, body.map(|b| b.to_string()))
}

fn call_as(
    to: SocketAddr,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Option<String>,
) -> Result<Reply> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        use http_body_util::BodyExt;
        let stream = tokio::time::timeout(TIMEOUT, tokio::net::TcpStream::connect(to))
            .await
            .context("connecting to fleetd's API timed out")??;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", to.to_string());
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let req = req.body(http_body_util::Full::new(bytes::Bytes::from(
            body.unwrap_or_default(),
        )))?;
        let resp = tokio::time::timeout(TIMEOUT, send.send_request(req))
            .await
            .context("fleetd's API did not answer in time")??;
        let header = |h: &str| {
            resp.headers()
                .get(h)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let (status, content_type, server) = (
            resp.status().as_u16(),
            header("content-type"),
            header("server"),
        );
        let bytes = resp.into_body().collect().await?.to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).with_context(|| format!("body {bytes:?}"))?
        };
        Ok(Reply {
            status,
            content_type,
            server,
            body,
        })
    })
}

/// `reply` is fleet's error entity for `status`, as JSON; its message contains `message`.
fn check_error(reply: &Reply, status: u16, message: &str) -> Result<()> {
    ensure!(reply.status == status, "expected {status}, got {reply:?}");
    ensure!(
        reply.content_type.as_deref() == Some("application/json"),
        "error without JSON content type: {reply:?}"
    );
    ensure!(
        reply.body["error"]["code"] == status,
        "no error entity: {reply:?}"
    );
    let got = reply.body["error"]["message"].as_str().unwrap_or_default();
    ensure!(got.contains(message), "message {got:?} lacks {message:?}");
    Ok(())
}

fn sleeper_options(seconds: u32) -> Value {
    json!([
        {"section": "Unit", "name": "Description", "value": "api test"},
        {"section": "Service", "name": "ExecStart", "value": format!("/bin/sleep {seconds}")},
    ])
}

/// Waits until GET `path` answers 200 with a body `accept` takes.
fn wait_body(to: SocketAddr, path: &str, accept: impl Fn(&Value) -> bool) -> Result<Value> {
    wait_for_value(TIMEOUT, POLL, || {
        call(to, "GET", path, None)
            .ok()
            .filter(|r| r.status == 200 && accept(&r.body))
            .map(|r| r.body)
    })
    .with_context(|| format!("GET {path} never answered as expected"))
}

/// Every item of a paginated collection, following `nextPageToken`; the page sizes seen.
fn all_pages(to: SocketAddr, path: &str, field: &str) -> Result<(Vec<Value>, Vec<usize>)> {
    let mut items = Vec::new();
    let mut sizes = Vec::new();
    let mut url = path.to_owned();
    loop {
        let reply = call(to, "GET", &url, None)?;
        ensure!(reply.status == 200, "GET {url}: {reply:?}");
        let page = reply.body[field].as_array().cloned().unwrap_or_default();
        sizes.push(page.len());
        items.extend(page);
        match reply.body["nextPageToken"].as_str() {
            Some(token) => url = format!("{path}?nextPageToken={token}"),
            None => return Ok((items, sizes)),
        }
        ensure!(sizes.len() < 100, "pagination never ends");
    }
}

#[test]
fn api_contract_over_http_against_a_running_fleetd() -> Result<()> {
    let (mut cluster, registry) = start(2, spec())?;
    let to = addr(&cluster.machines()[0]);

    // Machines: both, with their IP and metadata, on every prefix.
    let body = wait_body(to, "/fleet/v1/machines", |b| {
        b["machines"].as_array().is_some_and(|m| m.len() == 2)
    })?;
    for machine in cluster.machines() {
        let entity = body["machines"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == machine.id().as_str())
            .with_context(|| format!("{} not listed: {body}", machine.name()))?;
        ensure!(entity["primaryIP"] == machine.ip().to_string(), "{entity}");
        ensure!(entity["metadata"]["hostname"] == machine.name(), "{entity}");
    }
    let reply = call(to, "GET", "/v1-alpha/machines?alt=json", None)?;
    ensure!(reply.status == 200, "{reply:?}");
    ensure!(
        reply.content_type.as_deref() == Some("application/json"),
        "{reply:?}"
    );
    ensure!(
        reply.server.as_deref() == Some(concat!("fleetd/", env!("CARGO_PKG_VERSION"))),
        "{reply:?}"
    );
    check_error(
        &call(to, "GET", "/fleet/v1/machines?nextPageToken=EwBMLg==", None)?,
        400,
        "token limit must be 100",
    )?;

    // Paths and methods.
    check_error(&call(to, "GET", "/", None)?, 405, "")?;
    check_error(&call(to, "GET", "/fleet/v1", None)?, 405, "")?;
    check_error(&call(to, "GET", "/fleet/v1/nothing", None)?, 404, "")?;
    check_error(&call(to, "GET", "/fleet/v1/units/", None)?, 404, "")?;
    check_error(
        &call(to, "POST", "/fleet/v1/units", None)?,
        405,
        "only GET supported against this resource",
    )?;
    check_error(
        &call(to, "PATCH", "/fleet/v1/units/a.service", None)?,
        405,
        "only GET, PUT and DELETE supported",
    )?;
    check_error(
        &call(to, "POST", "/fleet/v1/discovery", None)?,
        400,
        "only HTTP GET",
    )?;
    let discovery = call(to, "GET", "/fleet/v1/discovery", None)?;
    ensure!(
        discovery.body["resources"]["Units"]["methods"]["Set"]["httpMethod"] == "PUT",
        "{discovery:?}"
    );

    // A unit's life: created launched, scheduled and running, its state listed.
    let unit = "/fleet/v1/units/api-hello.service";
    let reply = call(
        to,
        "PUT",
        unit,
        Some(
            json!({"name": "api-hello.service", "desiredState": "launched",
                    "options": sleeper_options(1001)}),
        ),
    )?;
    ensure!(reply.status == 201, "{reply:?}");
    let body = wait_body(to, unit, |b| b["currentState"] == "launched")?;
    let machine_id = body["machineID"].as_str().unwrap_or_default().to_owned();
    ensure!(
        cluster.machine_by_id(&machine_id).is_ok(),
        "scheduled to no machine of the cluster: {body}"
    );
    ensure!(body["options"] == sleeper_options(1001), "{body}");
    let states = wait_body(to, "/fleet/v1/state?unitName=api-hello.service", |b| {
        b["states"][0]["systemdActiveState"] == "active"
    })?;
    ensure!(states["states"][0]["machineID"] == machine_id, "{states}");
    let filtered = call(
        to,
        "GET",
        &format!("/fleet/v1/state?machineID={machine_id}&unitName=api-hello.service"),
        None,
    )?;
    ensure!(
        filtered.body["states"].as_array().map(Vec::len) == Some(1),
        "{filtered:?}"
    );
    // fleetctl sees what the API wrote: one registry.
    let listed = fleetctl_ok(
        &cluster,
        &["list-unit-files", "--no-legend", "--fields", "unit,dstate"],
    )?;
    ensure!(
        listed
            .stdout
            .lines()
            .any(|l| l.split_whitespace().eq(["api-hello.service", "launched"])),
        "{listed:?}"
    );

    // Refusals, each with its code and entity, writing nothing.
    check_error(
        &call(
            to,
            "PUT",
            unit,
            Some(json!({"options": sleeper_options(1001)})),
        )?,
        409,
        "must provide DesiredState",
    )?;
    check_error(
        &call(
            to,
            "PUT",
            "/fleet/v1/units/api-new.service",
            Some(json!({"desiredState": "launched"})),
        )?,
        409,
        "options field empty",
    )?;
    check_error(
        &call(to, "PUT", unit, Some(json!({"desiredState": "running"})))?,
        400,
        "invalid state",
    )?;
    check_error(
        &call(
            to,
            "PUT",
            "/fleet/v1/units/api-t@.service",
            Some(json!({"desiredState": "launched", "options": sleeper_options(1)})),
        )?,
        400,
        "cannot activate template",
    )?;
    check_error(
        &call(
            to,
            "PUT",
            unit,
            Some(json!({"name": "other.service", "desiredState": "loaded"})),
        )?,
        400,
        "differs from unit name",
    )?;
    check_error(
        &call_as(to, "PUT", unit, Some("text/plain"), Some("{}".into()))?,
        415,
        "application/json",
    )?;
    check_error(
        &call_as(to, "PUT", unit, Some("application/json"), Some("{".into()))?,
        400,
        "unable to decode body",
    )?;
    let gone = call(to, "GET", "/fleet/v1/units/api-new.service", None)?;
    check_error(&gone, 404, "unit does not exist")?;

    // New content replaces the old on its machine; a state change only changes the state.
    let reply = call(
        to,
        "PUT",
        unit,
        Some(json!({"desiredState": "launched", "options": sleeper_options(1002)})),
    )?;
    ensure!(reply.status == 201, "{reply:?}");
    wait_body(to, unit, |b| {
        b["options"] == sleeper_options(1002) && b["currentState"] == "launched"
    })?;
    let reply = call(to, "PUT", unit, Some(json!({"desiredState": "inactive"})))?;
    ensure!(reply.status == 204, "{reply:?}");
    wait_body(to, unit, |b| b["currentState"] == "inactive")?;
    let reply = call(to, "DELETE", unit, None)?;
    ensure!(reply.status == 204, "{reply:?}");
    check_error(&call(to, "GET", unit, None)?, 404, "unit does not exist")?;
    check_error(&call(to, "DELETE", unit, None)?, 404, "unit does not exist")?;

    // 150 units: two pages (100 and 50), sorted, the token round-tripping.
    for i in 0..150 {
        let name = format!("api-page-{i:03}.service");
        let reply = call(
            to,
            "PUT",
            &format!("/fleet/v1/units/{name}"),
            Some(json!({"options": sleeper_options(2000 + i)})),
        )?;
        ensure!(reply.status == 201, "{name}: {reply:?}");
    }
    let (units, sizes) = all_pages(to, "/fleet/v1/units", "units")?;
    ensure!(sizes == [100, 50], "page sizes {sizes:?}");
    let names: Vec<&str> = units.iter().filter_map(|u| u["name"].as_str()).collect();
    let want: Vec<String> = (0..150)
        .map(|i| format!("api-page-{i:03}.service"))
        .collect();
    ensure!(names == want, "units out of order or missing: {names:?}");
    let (units, _) = all_pages(to, "/v1-alpha/units", "units")?;
    ensure!(units.len() == 150, "alias lists {}", units.len());

    // Dynamic metadata, as fleet's machines_test sends it (no Content-Type, `Value`).
    let (m0, m1) = (&cluster.machines()[0], &cluster.machines()[1]);
    let patch = json!([
        {"op": "add", "path": format!("/{}/metadata/foo", m0.id()), "Value": {"value": "bar"}},
        {"op": "replace", "path": format!("/{}/metadata/ping", m1.id()), "Value": {"value": "splat"}},
    ]);
    let reply = call_as(
        to,
        "PATCH",
        "/fleet/v1/machines",
        None,
        Some(patch.to_string()),
    )?;
    ensure!(reply.status == 204, "{reply:?}");
    ensure!(
        reply.content_type.as_deref() == Some("application/json"),
        "{reply:?}"
    );
    let machines = call(to, "GET", "/fleet/v1/machines", None)?.body;
    let metadata_of = |m: &Machine| {
        machines["machines"]
            .as_array()
            .and_then(|all| all.iter().find(|e| e["id"] == m.id().as_str()))
            .map(|e| e["metadata"].clone())
    };
    ensure!(
        metadata_of(m0) == Some(json!({"foo": "bar", "hostname": m0.name()})),
        "{machines}"
    );
    ensure!(
        metadata_of(m1) == Some(json!({"ping": "splat", "hostname": m1.name()})),
        "{machines}"
    );
    let bad = json!([{"op": "noop", "path": format!("/{}/metadata/foo", m0.id()), "value": {"value": "x"}}]);
    check_error(
        &call_as(
            to,
            "PATCH",
            "/fleet/v1/machines",
            None,
            Some(bad.to_string()),
        )?,
        400,
        "invalid op",
    )?;
    let remove = json!([
        {"op": "remove", "path": format!("/{}/metadata/foo", m0.id())},
        {"op": "remove", "path": format!("/{}/metadata/ping", m1.id())},
    ]);
    let reply = call_as(
        to,
        "PATCH",
        "/fleet/v1/machines",
        None,
        Some(remove.to_string()),
    )?;
    ensure!(reply.status == 204, "{reply:?}");
    let machines = call(to, "GET", "/fleet/v1/machines", None)?.body;
    for entity in machines["machines"].as_array().into_iter().flatten() {
        ensure!(
            entity["metadata"].as_object().map(|m| m.len()) == Some(1),
            "{entity}"
        );
    }

    // A patch gets a waiting unit scheduled: no machine has `tier=api` until one is given it.
    let waiting = "/fleet/v1/units/api-tier.service";
    let mut options = sleeper_options(1002);
    options
        .as_array_mut()
        .expect("options are a list")
        .push(json!({"section": "X-Fleet", "name": "MachineMetadata", "value": "tier=api"}));
    let body = json!({"name": "api-tier.service", "desiredState": "launched", "options": options});
    let reply = call(to, "PUT", waiting, Some(body))?;
    ensure!(reply.status == 201, "{reply:?}");
    let reason = wait_for_value(TIMEOUT, POLL, || {
        let snap = registry.block_on(registry.registry().snapshot()).ok()?;
        snap.unscheduled
            .get(&"api-tier.service".parse().ok()?)
            .cloned()
    })
    .context("the engine never said why api-tier.service waits")?;
    ensure!(
        call(to, "GET", waiting, None)?.body["machineID"].is_null(),
        "placed before any machine had tier=api ({reason})"
    );
    let patch = json!([
        {"op": "add", "path": format!("/{}/metadata/tier", m1.id()), "value": {"value": "api"}},
    ]);
    let reply = call_as(
        to,
        "PATCH",
        "/fleet/v1/machines",
        None,
        Some(patch.to_string()),
    )?;
    ensure!(reply.status == 204, "{reply:?}");
    wait_body(to, waiting, |b| b["machineID"] == m1.id().as_str())?;

    // etcd away: 503 with fleet's message, and back once etcd is.
    cluster.stop_etcd()?;
    let reply = wait_for_value(TIMEOUT, POLL, || {
        call(to, "GET", "/fleet/v1/units", None)
            .ok()
            .filter(|r| r.status == 503)
    })
    .context("no 503 while etcd is down")?;
    check_error(&reply, 503, "fleet server unable to communicate with etcd")?;
    cluster.start_etcd()?;
    wait_body(to, "/fleet/v1/units", |b| b["units"].is_array())?;
    finish(cluster)
}

/// A client written from fleet's API document alone: plain HTTP/1.1 text over TCP, one
/// request per connection (`Connection: close`), JSON bodies.
struct DocClient {
    to: SocketAddr,
}

impl DocClient {
    fn send(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
        let stream = TcpStream::connect_timeout(&self.to, TIMEOUT)?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        http_exchange(stream, &self.to.to_string(), method, path, body)
    }
}

#[test]
fn a_client_written_from_fleets_api_document_works() -> Result<()> {
    let (cluster, _registry) = start(1, spec())?;
    let client = DocClient {
        to: addr(&cluster.machines()[0]),
    };
    let ready = wait_for_value(TIMEOUT, POLL, || {
        client
            .send("GET", "/fleet/v1/machines", None)
            .ok()
            .filter(|(status, body)| *status == 200 && body["machines"].is_array())
    });
    let (_, machines) = ready.context("the API never listed the machine")?;
    ensure!(
        machines["machines"][0]["id"] == cluster.machines()[0].id().as_str(),
        "{machines}"
    );
    // "creating and launching a new unit foo.service could be done like so"
    let create = json!({
        "desiredState": "launched",
        "options": [{"section": "Service", "name": "ExecStart", "value": "/usr/bin/sleep 3000"}]
    });
    let (status, _) = client.send("PUT", "/fleet/v1/units/foo.service", Some(&create))?;
    ensure!(status == 201, "create answered {status}");
    let (status, _) = client.send("PUT", "/fleet/v1/units/bar.service", Some(&json!({})))?;
    ensure!(status == 409, "create without options answered {status}");
    let unit = wait_for_value(TIMEOUT, POLL, || {
        client
            .send("GET", "/fleet/v1/units/foo.service", None)
            .ok()
            .filter(|(s, b)| *s == 200 && b["currentState"] == "launched")
            .map(|(_, b)| b)
    })
    .context("foo.service never launched")?;
    ensure!(unit["desiredState"] == "launched", "{unit}");
    let (status, states) = client.send("GET", "/fleet/v1/state?unitName=foo.service", None)?;
    ensure!(status == 200, "state answered {status}");
    let state = &states["states"][0];
    for field in [
        "name",
        "hash",
        "machineID",
        "systemdLoadState",
        "systemdActiveState",
        "systemdSubState",
    ] {
        ensure!(state[field].is_string(), "{field} missing in {state}");
    }
    let (status, units) = client.send("GET", "/fleet/v1/units", None)?;
    ensure!(
        status == 200 && units["units"][0]["name"] == "foo.service",
        "{units}"
    );
    // "unloading an existing Unit ... could look like this"
    let (status, _) = client.send(
        "PUT",
        "/fleet/v1/units/foo.service",
        Some(&json!({"desiredState": "inactive"})),
    )?;
    ensure!(status == 204, "state change answered {status}");
    let (status, _) = client.send("DELETE", "/fleet/v1/units/foo.service", None)?;
    ensure!(status == 204, "destroy answered {status}");
    let (status, body) = client.send("GET", "/fleet/v1/units/foo.service", None)?;
    if status != 404 {
        bail!("destroyed unit answered {status}: {body}");
    }
    finish(cluster)
}

/// `dist/fleet.socket`, with a TCP listener added by a drop-in, hands fleetd its sockets:
/// fleetd serves them (no `api_listen` is configured, so the TCP port answers only through
/// systemd) instead of opening its own.
///
/// The attack of issue 37, item 1: a TCP socket on every address while fleetd has no TLS
/// would serve every host of the network as admin. fleetd refuses to start and names the
/// socket; only `api_allow_plain_tcp=true` makes it serve that socket plain.
#[test]
fn a_passed_tcp_socket_without_tls_is_refused_unless_plain_tcp_is_allowed_then_served() -> Result<()>
{
    const ACTIVATED_PORT: u16 = 54729;
    // etcd's auth on, as the attack meets a deployed host (issue 37, Tests).
    let spec = FleetdSpec::default().with_etcd_auth(EtcdAuthSpec::default());
    let (cluster, _registry) = start(1, spec)?;
    let machine = &cluster.machines()[0];
    machine.stop_fleetd()?;
    machine.write_file(
        "/run/systemd/system/fleet.socket",
        include_str!("../../dist/fleet.socket"),
    )?;
    machine.write_file(
        "/run/systemd/system/fleet.socket.d/tcp.conf",
        format!("[Socket]\nListenStream=0.0.0.0:{ACTIVATED_PORT}\n"),
    )?;
    machine.systemctl_ok(&["daemon-reload"])?;
    machine.systemctl_ok(&["start", "fleet.socket"])?;
    machine.start_fleetd()?;
    let refusal = format!("systemd passed TCP socket 0.0.0.0:{ACTIVATED_PORT}");
    wait_for(TIMEOUT, POLL, || {
        support::fleetd_log_all(machine).is_ok_and(|log| log.contains(&refusal))
    })
    .with_context(|| format!("fleetd did not refuse the plain socket: {refusal:?}"))?;
    let log = support::fleetd_log_all(machine)?;
    ensure!(
        log.contains("api_allow_plain_tcp=true"),
        "fleetd did not say how to fix it:\n{log}"
    );
    machine.stop_fleetd()?;
    machine.write_file(
        "/run/systemd/system/fleet.service.d/plain.conf",
        "[Service]\nEnvironment=FLEET_API_ALLOW_PLAIN_TCP=true\n",
    )?;
    machine.systemctl_ok(&["daemon-reload"])?;
    machine.start_fleetd()?;
    let to = SocketAddr::from((machine.ip(), ACTIVATED_PORT));
    let body = wait_body(to, "/fleet/v1/machines", |b| {
        b["machines"][0]["id"] == machine.id().as_str()
    })?;
    ensure!(
        body["machines"].as_array().map(Vec::len) == Some(1),
        "{body}"
    );
    let socket = machine.sh("stat -c %F:%a /var/run/fleet.sock")?;
    ensure!(socket.trim() == "socket:660", "fleet.sock is {socket:?}");
    finish(cluster)
}

/// GET `path` and read its body until it holds `wanted`, run `meanwhile`, then hang up, as
/// `fleetctl journal -f` does when interrupted. Returns what was read.
fn read_stream_until(
    to: SocketAddr,
    path: &str,
    wanted: &str,
    meanwhile: impl FnOnce() -> Result<()>,
) -> Result<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        use http_body_util::BodyExt;
        let stream = tokio::net::TcpStream::connect(to).await?;
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        let conn = tokio::spawn(conn);
        let req = hyper::Request::get(path)
            .header("host", to.to_string())
            .body(http_body_util::Empty::<bytes::Bytes>::new())?;
        let resp = tokio::time::timeout(TIMEOUT, send.send_request(req))
            .await
            .context("fleetd's API did not answer in time")??;
        ensure!(resp.status() == 200, "GET {path}: {}", resp.status());
        let content_type = resp.headers().get("content-type").cloned();
        ensure!(
            content_type.as_ref().and_then(|v| v.to_str().ok())
                == Some("text/plain; charset=utf-8"),
            "{content_type:?}"
        );
        let mut body = resp.into_body();
        let mut text = String::new();
        let reading = async {
            while !text.contains(wanted) {
                let Some(frame) = body.frame().await else {
                    bail!("the stream ended before {wanted:?}: {text:?}");
                };
                if let Ok(data) = frame?.into_data() {
                    text.push_str(&String::from_utf8_lossy(&data));
                }
            }
            Ok(())
        };
        tokio::time::timeout(TIMEOUT, reading)
            .await
            .with_context(|| format!("no {wanted:?} streamed in time"))??;
        meanwhile()?;
        drop(body);
        conn.abort();
        Ok(text)
    })
}

/// How many journalctl processes inside `machine` read `unit`'s journal.
fn journalctls_of(machine: &Machine, unit: &str) -> Result<usize> {
    let script = format!(
        "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done \
         | grep -c '^journalctl --unit={unit} ' || true"
    );
    Ok(machine.sh(&script)?.trim().parse().unwrap_or(0))
}

/// Issue 16 (fleet#1123): a unit's status and journal come from its own machine's fleetd,
/// which each machine's presence names; any other machine's refuses with where it runs.
/// A followed journal streams what the unit prints after the call, and its journalctl ends
/// when the client hangs up.
#[test]
fn status_and_journal_are_served_by_the_units_own_machine() -> Result<()> {
    let (cluster, _registry) = start(2, spec())?;
    let (here, other) = (&cluster.machines()[0], &cluster.machines()[1]);
    let (to, elsewhere) = (addr(here), addr(other));

    // Each machine publishes its API's address: the wildcard listener at its public IP.
    let body = wait_body(to, "/fleet/v1/machines?view=full", |b| {
        b["machines"].as_array().is_some_and(|m| m.len() == 2)
    })?;
    for machine in cluster.machines() {
        let entity = body["machines"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == machine.id().as_str())
            .with_context(|| format!("{} not listed: {body}", machine.name()))?;
        let expected = format!("http://{}:{PORT}", machine.ip());
        ensure!(entity["api"] == expected.as_str(), "{entity}");
    }

    let unit = "api-ticker.service";
    let options = json!([
        {"section": "Service", "name": "ExecStart",
         "value": "/bin/sh -c 'while :; do echo tick; sleep 0.3; done'"},
        {"section": "X-Fleet", "name": "MachineID", "value": here.id().as_str()},
    ]);
    let reply = call(
        to,
        "PUT",
        &format!("/fleet/v1/units/{unit}"),
        Some(json!({"desiredState": "launched", "options": options})),
    )?;
    ensure!(reply.status == 201, "{reply:?}");
    wait_body(to, &format!("/fleet/v1/units/{unit}"), |b| {
        b["currentState"] == "launched"
    })?;

    let status = call(
        to,
        "GET",
        &format!("/fleet/v1/units/{unit}/status?lines=3"),
        None,
    )?;
    ensure!(status.status == 200, "{status:?}");
    let b = &status.body;
    ensure!(
        b["machineID"] == here.id().as_str() && b["name"] == unit,
        "{b}"
    );
    let text = b["text"].as_str().unwrap_or_default();
    ensure!(
        text.contains(unit) && text.contains("active (running)"),
        "{text}"
    );
    ensure!(b["properties"]["ActiveState"] == "active", "{b}");
    ensure!(b["properties"]["Id"] == unit, "{b}");
    let main_pid = here.main_pid(unit)?.context("no MainPID")?;
    let pid = main_pid.to_string();
    ensure!(b["properties"]["MainPID"].as_str() == Some(&pid), "{b}");
    // Every property as `systemctl show` prints it (counters that move between the two
    // reads aside; the machines' clocks are UTC, as fleetd prints timestamps).
    const MOVING: [&str; 6] = [
        "CPUUsageNSec",
        "MemoryCurrent",
        "MemoryAvailable",
        "TasksCurrent",
        "IOReadBytes",
        "IOWriteBytes",
    ];
    let shown = here.systemctl_ok(&["show", unit])?;
    let differ: Vec<String> = shown
        .lines()
        .filter_map(|line| line.split_once('='))
        .filter(|(k, _)| !MOVING.contains(k))
        .filter(|(k, v)| b["properties"][*k].as_str() != Some(*v))
        .map(|(k, v)| format!("{k}: systemctl {v:?}, fleetd {}", b["properties"][k]))
        .collect();
    ensure!(
        differ.is_empty(),
        "properties differ:\n{}",
        differ.join("\n")
    );

    check_error(
        &call(
            elsewhere,
            "GET",
            &format!("/fleet/v1/units/{unit}/status"),
            None,
        )?,
        404,
        &format!(
            "unit {unit} is scheduled on machine {}, not on this one ({})",
            here.id(),
            other.id()
        ),
    )?;
    check_error(
        &call(to, "GET", "/fleet/v1/units/sshd.service/journal", None)?,
        404,
        "unit does not exist",
    )?;
    check_error(
        &call(
            to,
            "GET",
            &format!("/fleet/v1/units/{unit}/journal?output=x"),
            None,
        )?,
        400,
        "output must be one of",
    )?;

    // Journal: the last lines, then a follow that sees lines printed after it started.
    let path = format!("/fleet/v1/units/{unit}/journal?lines=2&output=cat");
    // `--unit` also has systemd's own lines about the unit ("Started ...").
    let last = read_stream_until(to, &path, "tick\n", || Ok(()))?;
    ensure!(last.lines().count() <= 2, "{last:?}");
    let path = format!("/fleet/v1/units/{unit}/journal?lines=0&follow=true&output=cat");
    read_stream_until(to, &path, "tick\ntick\n", || {
        let running = journalctls_of(here, unit)?;
        ensure!(
            running == 1,
            "{running} journalctl processes while following"
        );
        Ok(())
    })?;
    wait_for_value(TIMEOUT, POLL, || {
        (journalctls_of(here, unit).ok()? == 0).then_some(())
    })
    .context("journalctl still runs after the client hung up")?;
    finish(cluster)
}
