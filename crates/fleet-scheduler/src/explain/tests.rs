//! `explain` and `drain_status` on the cases fleetctl's users ask about.

use super::*;
use crate::tests::{World, mid, name, two_machines};
use DesiredState::Launched;

fn explained(w: &World, unit: &str) -> Explanation {
    explain(&w.snap, &w.files, &name(unit))
}

/// machine -> first rejection message ("-" when it satisfies every rule), `*` when scheduled.
fn table(e: &Explanation) -> Vec<String> {
    e.machines
        .iter()
        .map(|v| {
            let star = if v.scheduled { "*" } else { "" };
            let why = v.rejected.as_ref().map_or("-", |r| r.message.as_str());
            format!("{}{star}: {why}", v.machine)
        })
        .collect()
}

#[test]
fn a_placed_unit_is_explained_by_the_rules_that_placed_it_and_stays() {
    let w = two_machines()
        .machine("m1", &[("tier", "web")])
        .unit("a.service", Launched, "MachineMetadata=tier=web")
        .entry("a.service", "m1");
    let e = explained(&w, "a.service");
    assert_eq!(e.status, Status::Placed);
    assert_eq!(e.rules, ["MachineMetadata=tier=web"]);
    assert_eq!(
        e.summary,
        "scheduled on m1: the machine satisfies every rule, and it stays"
    );
    assert_eq!(
        table(&e),
        ["m1*: -", "m2: machine metadata lacks tier=web",]
    );
}

#[test]
fn a_unit_waiting_on_metadata_names_the_key_each_machine_lacks() {
    let w = two_machines().machine("m2", &[("tier", "db")]).unit(
        "a.service",
        Launched,
        "MachineMetadata=tier=web",
    );
    let e = explained(&w, "a.service");
    assert_eq!(e.status, Status::Waiting);
    assert_eq!(
        table(&e),
        [
            "m1: machine metadata lacks tier=web",
            "m2: machine metadata lacks tier=web",
        ]
    );
    assert!(
        e.summary.starts_with("no machine able to run unit"),
        "{}",
        e.summary
    );
    assert_eq!(
        e.machines[0].rejected.as_ref().unwrap().violation,
        Violation::MetadataMismatch {
            key: "tier".into(),
            accepted: vec!["web".into()]
        }
    );
}

#[test]
fn a_conflicts_clash_names_the_unit_it_conflicts_with() {
    let w = World::new()
        .machine("m1", &[])
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "Conflicts=a.service")
        .entry("a.service", "m1");
    let e = explained(&w, "b.service");
    assert_eq!(e.status, Status::Waiting);
    assert_eq!(
        table(&e),
        ["m1: conflicts with unit a.service scheduled here"]
    );
    assert_eq!(
        e.summary,
        "no machine able to run unit: 1 machine runs a conflicting a.service"
    );
}

#[test]
fn a_drained_machine_is_named_for_placed_and_waiting_units() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .unit("p.service", Launched, "MachineID=m1")
        .unit("w.service", Launched, "MachineID=m1")
        .entry("a.service", "m1")
        .entry("p.service", "m1")
        .drain("m1", 1);
    let a = explained(&w, "a.service");
    assert_eq!(a.summary, "machine m1 is drained: it leaves in its turn");
    assert_eq!(table(&a), ["m1*: machine is drained", "m2: -"]);
    let p = explained(&w, "p.service");
    assert_eq!(
        p.summary,
        "stays on drained machine m1: no machine able to run unit: 1 machine is not MachineID=m1"
    );
    let waiting = explained(&w, "w.service");
    assert_eq!(waiting.status, Status::Waiting);
    assert_eq!(
        table(&waiting),
        [
            "m1: machine is drained",
            "m2: machine ID does not match required \"m1\"",
        ]
    );
}

#[test]
fn an_unknown_or_inactive_unit_says_so() {
    let w = two_machines().unit("i.service", DesiredState::Inactive, "");
    assert_eq!(explained(&w, "nope.service").status, Status::NotFound);
    let i = explained(&w, "i.service");
    assert_eq!(
        (i.status, i.summary.as_str()),
        (Status::Inactive, "target state inactive")
    );
}

#[test]
fn an_explanation_serializes_with_plain_field_names() {
    let w = World::new()
        .machine("m1", &[])
        .drain("m1", 1)
        .unit("a.service", Launched, "");
    let json = serde_json::to_value(explained(&w, "a.service")).unwrap();
    assert_eq!(json["status"], "waiting");
    assert_eq!(json["machines"][0]["machine"], "m1");
    assert_eq!(json["machines"][0]["rejected"]["rule"], "drained");
    assert_eq!(
        json["machines"][0]["rejected"]["message"],
        "machine is drained"
    );
}

#[test]
fn a_drain_status_sorts_units_into_moving_queued_stuck_and_global() {
    let mut w = two_machines()
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "")
        .unit("g.service", Launched, "Global=true")
        .unit("p.service", Launched, "MachineID=m1")
        .entry("a.service", "m1")
        .entry("b.service", "m1")
        .entry("g.service", "m1")
        .entry("g.service", "m2")
        .entry("p.service", "m1")
        .state("a.service", "m1", "active")
        .drain("m1", 1);
    w.settle();
    let s = drain_status(&w.snap, &w.files, &mid("m1"));
    assert_eq!(s.parallel, Some(1));
    assert_eq!(s.moving, [name("a.service")]);
    assert_eq!(s.queued, [name("b.service")]);
    assert_eq!(s.globals, [name("g.service")]);
    assert_eq!(s.stuck.len(), 1);
    assert_eq!(s.stuck[0].0, name("p.service"));
    assert!(!s.done);
}
