//! fleetctl's `--output json` and machine metadata on a real cluster (issue 16): every
//! listing's document, over both drivers, has only the fields docs/operating.md "JSON output"
//! documents, of the types it says; `set-metadata` gets a unit waiting on `MachineMetadata=`
//! placed, and `unset-metadata` shows in `list-machines` and moves the unit off again. Needs
//! root.
//!
//! Nothing sleeps for a fixed time: each step waits for what it is about.

use anyhow::{Context, Result, bail, ensure};
use fleet_functional_tests::{Cluster, Driver, FleetdSpec, wait_for_value};
use serde_json::Value;
use std::collections::BTreeMap;
mod support;
use support::{POLL, TIMEOUT, finish, sleeper, units_on, write_units};

const OPERATING: &str = include_str!("../../docs/operating.md");

/// docs/operating.md's "JSON output" table: command -> field path -> type.
fn documented() -> Result<BTreeMap<String, BTreeMap<String, String>>> {
    let section = OPERATING
        .split("\n## JSON output\n")
        .nth(1)
        .context("docs/operating.md has no \"JSON output\" section")?;
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, command, field, kind, _, _] = cells.as_slice() else {
            continue;
        };
        if let Some(path) = field.strip_prefix('`').and_then(|f| f.strip_suffix('`')) {
            out.entry((*command).to_owned())
                .or_default()
                .insert(path.to_owned(), (*kind).to_owned());
        }
    }
    ensure!(!out.is_empty(), "no field documented");
    Ok(out)
}

/// Checks every field of `value` against `documented` (path -> type): each must be there
/// with its type. An entity in a list is its fields; a `map` is not descended into.
fn check_fields(value: &Value, path: &str, documented: &BTreeMap<String, String>) -> Result<()> {
    let kind = documented.get(path).map(String::as_str);
    let entity = value.is_object() && kind != Some("map");
    if !path.is_empty() && !entity {
        let actual = match value {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "map",
        };
        match kind {
            None => bail!("field {path} ({actual}) is not documented"),
            Some(k) if k != actual => bail!("field {path} is {actual}, documented {k}"),
            Some(_) => {}
        }
    }
    match value {
        Value::Object(fields) if entity => {
            for (k, v) in fields {
                let child = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                check_fields(v, &child, documented)?;
            }
        }
        Value::Array(items) => {
            for item in items {
                check_fields(item, &format!("{path}[]"), documented)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// `fleetctl <args> --output=json` over both drivers: the same bytes, one document, nothing
/// on stderr, every field documented for `command`. Returns the document.
fn json_doc(cluster: &Cluster, args: &[&str]) -> Result<Value> {
    let docs = documented()?;
    let command = args[0];
    let fields = docs
        .get(command)
        .with_context(|| format!("{command} has no documented fields"))?;
    let mut all: Vec<&str> = args.to_vec();
    all.push("--output=json");
    let mut outputs = Vec::new();
    for driver in Driver::ALL {
        let out = cluster.fleetctl_over(driver, &all)?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        ensure!(
            out.status.success() && stderr.is_empty(),
            "{all:?} over {driver:?}: {stdout}{stderr}"
        );
        outputs.push(stdout);
    }
    ensure!(
        outputs[0] == outputs[1],
        "{all:?}: etcd and api differ:\n{}\n{}",
        outputs[0],
        outputs[1]
    );
    let value: Value = serde_json::from_str(&outputs[0])
        .with_context(|| format!("{all:?} is not one JSON document: {}", outputs[0]))?;
    check_fields(&value, "", fields).with_context(|| format!("{all:?}: {value}"))?;
    Ok(value)
}

fn fleetctl_ok(cluster: &Cluster, driver: Driver, args: &[&str]) -> Result<String> {
    let out = cluster.fleetctl_over(driver, args)?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "fleetctl {args:?} over {driver:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// The unit `name` of a list-unit-files document.
fn unit<'a>(doc: &'a Value, name: &str) -> Option<&'a Value> {
    doc["units"].as_array()?.iter().find(|u| u["name"] == name)
}

#[test]
fn set_metadata_places_a_waiting_unit_and_every_json_listing_has_only_documented_fields()
-> Result<()> {
    let (cluster, _registry) = support::start(2, FleetdSpec::default())?;
    let m2 = &cluster.machines()[1];
    let m2_id = m2.id().to_string();
    let dir = cluster.dir().join("json-units");
    let texts = BTreeMap::from([
        (
            "tier.service".to_owned(),
            format!("{}\n[X-Fleet]\nMachineMetadata=tier=api\n", sleeper(4000)),
        ),
        ("plain.service".to_owned(), sleeper(4001)),
    ]);
    let paths = write_units(&dir, &texts)?;
    fleetctl_ok(
        &cluster,
        Driver::Etcd,
        &[
            "start",
            "--no-block",
            &paths["tier.service"],
            &paths["plain.service"],
        ],
    )?;

    // No machine has tier=api: the unit waits, and says why.
    let waiting = wait_for_value(TIMEOUT, POLL, || {
        let doc = json_doc(&cluster, &["list-unit-files"]).ok()?;
        let u = unit(&doc, "tier.service")?;
        u["unscheduledReason"].as_str().map(str::to_owned)
    })
    .context("tier.service never said why it waits")?;
    ensure!(waiting.contains("tier"), "{waiting}");

    // set-metadata over the API driver, by a prefix of the machine's ID: placed there.
    let prefix = &m2_id[..12];
    let said = fleetctl_ok(&cluster, Driver::Api, &["set-metadata", prefix, "tier=api"])?;
    ensure!(said == format!("Machine {m2_id}: set tier=api\n"), "{said}");
    let names = vec!["tier.service".to_owned()];
    wait_for_value(TIMEOUT, POLL, || {
        units_on(m2, &names)
            .ok()?
            .get("tier.service")
            .filter(|v| v.is_active())
            .cloned()
    })
    .context("tier.service did not start on the machine given tier=api")?;
    let placed = wait_for_value(TIMEOUT, POLL, || {
        let doc = json_doc(&cluster, &["list-units"]).ok()?;
        let states = doc["states"].as_array()?.clone();
        states
            .iter()
            .any(|s| {
                s["name"] == "tier.service"
                    && s["machineID"] == m2_id.as_str()
                    && s["systemdActiveState"] == "active"
            })
            .then_some(doc)
    })
    .context("list-units never showed tier.service active on its machine")?;
    ensure!(placed["skipped"] == serde_json::json!([]), "{placed}");

    // Every listing, and version, against the documentation, over both drivers.
    let files = json_doc(&cluster, &["list-unit-files"])?;
    let tier = unit(&files, "tier.service").context("tier.service listed")?;
    ensure!(tier["machineID"] == m2_id.as_str(), "{tier}");
    ensure!(tier.get("unscheduledReason").is_none(), "{tier}");
    let machines = json_doc(&cluster, &["list-machines"])?;
    let listed = machines["machines"]
        .as_array()
        .context("machines")?
        .iter()
        .find(|m| m["id"] == m2_id.as_str())
        .context("m2 listed")?;
    ensure!(listed["metadata"]["tier"] == "api", "{listed}");
    ensure!(listed["metadata"]["hostname"] == m2.name(), "{listed}");
    let version = json_doc(&cluster, &["version"])?;
    let groups = version["fleetds"].as_array().context("fleetds")?;
    ensure!(
        groups.len() == 1 && groups[0]["machineIDs"].as_array().map(Vec::len) == Some(2),
        "both fleetds publish one version: {version}"
    );

    // unset-metadata over the etcd driver: list-machines shows it, and the unit leaves.
    fleetctl_ok(&cluster, Driver::Etcd, &["unset-metadata", &m2_id, "tier"])?;
    let machines = json_doc(&cluster, &["list-machines"])?;
    let listed = machines["machines"]
        .as_array()
        .context("machines")?
        .iter()
        .find(|m| m["id"] == m2_id.as_str())
        .context("m2 listed")?;
    ensure!(listed["metadata"].get("tier").is_none(), "{listed}");
    let text = fleetctl_ok(
        &cluster,
        Driver::Api,
        &["list-machines", "--full", "--no-legend"],
    )?;
    ensure!(
        text.lines()
            .any(|l| l.starts_with(&m2_id) && !l.contains("tier=")),
        "{text}"
    );
    wait_for_value(TIMEOUT, POLL, || {
        let doc = json_doc(&cluster, &["list-unit-files"]).ok()?;
        let u = unit(&doc, "tier.service")?;
        u.get("machineIDs").is_none().then_some(())
    })
    .context("tier.service stayed on the machine that lost tier=api")?;
    finish(cluster)
}
