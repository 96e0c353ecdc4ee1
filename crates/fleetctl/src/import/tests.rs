use super::plan::{Refusal, Verdict, plan};
use super::v2::FleetRegistry;
use fleet_core::{DesiredState, MachineId, UnitHash, UnitName};
use std::collections::BTreeMap;

/// A recursive GET of fleet v1's prefix, recorded from etcd 3.4 (`--enable-v2`) after fleet
/// v1.0's own fleetctl submitted `web`, `app@` (a template with `Conflicts`), `glob` (global),
/// `spare` and `plain`, loaded `app@1` and `app@2` and started `web` and `glob`; the targets,
/// machines and states a fleet engine and agents write were added through the same v2 API.
const RECORDED: &[u8] = include_bytes!("recorded.json");
const PREFIX: &str = "/_coreos.com/fleet/";
const A: &str = "4dad8cf7a1b24c3e9c0d1e2f3a4b5c6d";
const B: &str = "9f1e2a10b2c34d5e6f708192a3b4c5d6";

fn recorded() -> FleetRegistry {
    FleetRegistry::from_v2(RECORDED, PREFIX).expect("the recording reads")
}

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn imported(verdicts: &[Verdict], unit: &str) -> super::plan::Import {
    verdicts
        .iter()
        .find_map(|v| match v {
            Verdict::Import(i) if i.name.as_str() == unit => Some(i.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{unit} not imported: {verdicts:?}"))
}

#[test]
fn the_recorded_registry_reads_every_job_with_its_file_target_and_states() {
    let fleet = recorded();
    let names: Vec<&str> = fleet.jobs.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "app@.service",
            "app@1.service",
            "app@2.service",
            "glob.service",
            "plain.service",
            "spare.service",
            "web.service"
        ]
    );
    let web = &fleet.jobs["web.service"];
    assert_eq!(
        web.hash,
        Some(Ok("9a961667e62798ca0bd193964909899864d5e414".into()))
    );
    assert_eq!(web.target_state.as_deref(), Some("launched"));
    assert_eq!(web.target.as_deref(), Some(A));
    assert_eq!(fleet.files.len(), 5);
    assert_eq!(fleet.machines.len(), 2);
    assert_eq!(fleet.states["glob.service"].len(), 2);
}

#[test]
fn every_unit_is_imported_with_fleet_s_hash_state_and_machine() {
    let verdicts = plan(&recorded(), &BTreeMap::new(), false);
    assert_eq!(verdicts.len(), 7, "{verdicts:?}");
    let web = imported(&verdicts, "web.service");
    assert_eq!(
        web.file.hash().to_string(),
        "9a961667e62798ca0bd193964909899864d5e414"
    );
    assert_eq!(web.desired, DesiredState::Launched);
    assert_eq!(web.machine, Some(A.parse::<MachineId>().unwrap()));
    let app1 = imported(&verdicts, "app@1.service");
    assert_eq!(app1.desired, DesiredState::Loaded);
    assert_eq!(app1.machine, Some(B.parse::<MachineId>().unwrap()));
    // Loaded but not placed by fleet: no machine, the engine places it.
    assert_eq!(imported(&verdicts, "app@2.service").machine, None);
    let template = imported(&verdicts, "app@.service");
    assert_eq!(
        (template.desired, template.machine),
        (DesiredState::Inactive, None)
    );
    let glob = imported(&verdicts, "glob.service");
    assert_eq!(glob.machine, None);
    assert_eq!(glob.global_on.len(), 2);
    assert_eq!(
        imported(&verdicts, "spare.service").desired,
        DesiredState::Inactive
    );
}

#[test]
fn a_second_import_changes_nothing_and_another_file_is_refused_unless_replace() {
    let fleet = recorded();
    let first = plan(&fleet, &BTreeMap::new(), false);
    let ours: BTreeMap<UnitName, UnitHash> = first
        .iter()
        .filter_map(|v| match v {
            Verdict::Import(i) => Some((i.name.clone(), i.file.hash())),
            _ => None,
        })
        .collect();
    let second = plan(&fleet, &ours, false);
    assert!(
        second
            .iter()
            .all(|v| matches!(v, Verdict::Unchanged { .. })),
        "{second:?}"
    );
    let other: UnitHash = "0000000000000000000000000000000000000001".parse().unwrap();
    let ours = BTreeMap::from([(name("web.service"), other)]);
    let refused = plan(&fleet, &ours, false);
    assert!(refused.iter().any(|v| matches!(
        v,
        Verdict::Refused { name, reason: Refusal::Exists { .. } } if name == "web.service"
    )));
    let replaced = imported(&plan(&fleet, &ours, true), "web.service");
    assert_eq!(replaced.replaces, Some(other));
}

/// A registry edited by hand or by old fleets: each bad record refuses its own unit only.
#[test]
fn a_unit_ours_cannot_represent_is_refused_by_name_and_the_rest_imported() {
    let fleet_json = String::from_utf8(RECORDED.to_vec()).unwrap();
    // A name ours refuses, a target that is no machine ID, a job naming no file.
    let broken = fleet_json.replace("/job/spare.service", "/job/sp are.service");
    let mut fleet = FleetRegistry::from_v2(broken.as_bytes(), PREFIX).unwrap();
    fleet.jobs.get_mut("web.service").unwrap().target = Some("not a machine!".into());
    fleet.jobs.get_mut("app@1.service").unwrap().hash = Some(Ok("00".repeat(20)));
    let verdicts = plan(&fleet, &BTreeMap::new(), false);
    let refused: BTreeMap<&str, &Refusal> = verdicts
        .iter()
        .filter_map(|v| match v {
            Verdict::Refused { name, reason } => Some((name.as_str(), reason)),
            _ => None,
        })
        .collect();
    assert!(
        matches!(refused["sp are.service"], Refusal::Name(_)),
        "{refused:?}"
    );
    assert!(
        matches!(refused["web.service"], Refusal::Record(_)),
        "{refused:?}"
    );
    assert!(
        matches!(refused["app@1.service"], Refusal::Record(_)),
        "{refused:?}"
    );
    assert_eq!(refused.len(), 3, "{refused:?}");
    imported(&verdicts, "glob.service");
}

#[test]
fn a_file_whose_hash_ours_computes_otherwise_is_refused_naming_both() {
    let mut fleet = recorded();
    let hash = "9a961667e62798ca0bd193964909899864d5e414".to_owned();
    fleet
        .files
        .insert(hash.clone(), Ok("[Service]\nExecStart=/bin/other\n".into()));
    let verdicts = plan(&fleet, &BTreeMap::new(), false);
    let web = verdicts.iter().find_map(|v| match v {
        Verdict::Refused { name, reason } if name == "web.service" => Some(reason.clone()),
        _ => None,
    });
    let Some(Refusal::HashDiffers { fleet: theirs, .. }) = web else {
        panic!("{verdicts:?}");
    };
    assert_eq!(theirs, hash);
}

#[test]
fn no_fleet_registry_at_all_is_an_empty_one_and_another_prefix_is_refused() {
    let missing =
        br#"{"errorCode":100,"message":"Key not found","cause":"/_coreos.com/fleet","index":3}"#;
    let fleet = FleetRegistry::from_v2(missing, PREFIX).unwrap();
    assert!(fleet.jobs.is_empty());
    assert!(FleetRegistry::from_v2(RECORDED, "/other/").is_err());
    assert!(FleetRegistry::from_v2(b"<html>", PREFIX).is_err());
}

/// What the command writes, over either driver: a mark on each machine that gets units,
/// counting them, and each imported unit with its machines and what it replaces.
#[test]
fn the_written_plan_marks_every_machine_given_units_and_places_each_unit() {
    use crate::commands::import_fleet::import_plan;
    let fleet = recorded();
    let other: UnitHash = "0000000000000000000000000000000000000001".parse().unwrap();
    let ours = BTreeMap::from([(name("spare.service"), other)]);
    let written = import_plan(&plan(&fleet, &ours, true), 42);
    let (a, b): (MachineId, MachineId) = (A.parse().unwrap(), B.parse().unwrap());
    // web and glob on A; app@1 and glob on B.
    let marks: Vec<(MachineId, u64, u64)> = written
        .marks
        .iter()
        .map(|m| (m.machine.clone(), m.since, m.units))
        .collect();
    assert_eq!(marks, [(a.clone(), 42, 2), (b.clone(), 42, 2)]);
    let placed: BTreeMap<&str, Vec<MachineId>> = written
        .units
        .iter()
        .map(|u| (u.name.as_str(), u.machines.clone()))
        .collect();
    assert_eq!(placed.len(), 7, "{placed:?}");
    assert_eq!(placed["web.service"], std::slice::from_ref(&a));
    assert_eq!(placed["app@1.service"], std::slice::from_ref(&b));
    assert!(placed["app@2.service"].is_empty());
    assert_eq!(placed["glob.service"].len(), 2);
    let spare = written
        .units
        .iter()
        .find(|u| u.name.as_str() == "spare.service");
    assert_eq!(spare.map(|u| u.replaces), Some(Some(other)));
    // A dry run plans the same and writes nothing; a second run has nothing to write.
    let again: BTreeMap<UnitName, UnitHash> = written
        .units
        .iter()
        .map(|u| (u.name.clone(), u.file.hash()))
        .collect();
    let second = import_plan(&plan(&fleet, &again, false), 43);
    assert!(
        second.marks.is_empty() && second.units.is_empty(),
        "{second:?}"
    );
}
