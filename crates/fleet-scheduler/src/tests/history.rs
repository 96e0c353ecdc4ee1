//! The placement history (issue 36): only a machine a unit was scheduled on lately holds its
//! next placement back, while that machine is there; a state any other machine publishes is
//! a stray. Decision tables; `sim.rs` runs the engine among simulated agents.

use super::*;

/// Two machines and `b` on m1, so that a unit placed now goes to m2.
fn m1_busy() -> World {
    two_machines()
        .unit("b.service", Launched, "")
        .entry("b.service", "m1")
}

fn strays_of(w: &World) -> Vec<String> {
    let all = strays(&w.snap, &w.files, w.snap.states.keys());
    all.iter().map(|(u, m)| format!("{u} on {m}")).collect()
}

#[test]
fn a_stray_running_state_on_a_machine_never_scheduled_there_does_not_hold_placement() {
    let w = m1_busy()
        .unit("a.service", Launched, "")
        .state("a.service", "m1", "active");
    assert_eq!(
        lines(&w.plan()),
        ["schedule a.service on m2 (launched): target state launched and unit not scheduled"]
    );
    assert!(w.waiting().is_empty());
    assert_eq!(strays_of(&w), ["a.service on m1"]);
}

#[test]
fn a_stray_state_does_not_hold_a_unit_even_where_it_must_run_elsewhere() {
    // The hostage case: a unit pinned to m2, a state of it on m1 it was never scheduled on.
    let w = two_machines()
        .unit("a.service", Launched, "MachineID=m2")
        .state("a.service", "m1", "deactivating");
    assert_eq!(
        lines(&w.plan()),
        ["schedule a.service on m2 (launched): target state launched and unit not scheduled"]
    );
}

#[test]
fn a_copy_on_a_machine_the_unit_just_left_holds_placement_until_it_reports_stopped() {
    let mut w = two_machines()
        .unit_version("a.service", Launched, "MachineID=m2", 1)
        .entry_with("a.service", "m1", unit_file("", 0).hash(), Launched)
        .state("a.service", "m1", "active");
    assert_eq!(
        w.settle(),
        [
            "unschedule a.service from m1, recording it left: target machine m1 unable to run \
             unit: machine ID does not match required \"m2\"",
            "unschedulable a.service: waiting for the previous copy on m1 to stop",
        ]
    );
    assert!(w.snap.left[&name("a.service")].contains_key(&mid("m1")));
    assert!(strays_of(&w).is_empty(), "a copy it left is no stray");
    let mut w = w.state("a.service", "m1", "deactivating");
    assert!(w.settle().is_empty(), "still stopping");
    let mut w = w.state("a.service", "m1", "inactive");
    assert_eq!(
        w.settle(),
        [
            "schedule a.service on m2 (launched): target state launched and unit not scheduled",
            "forget a.service left m1: the copy on m1 has stopped",
            "clear a.service: unit is scheduled now",
        ]
    );
    assert!(w.snap.left.is_empty());
    assert!(w.plan().is_empty());
}

#[test]
fn a_left_copy_stops_holding_once_its_machine_is_gone() {
    let w = m1_busy()
        .machine("m3", &[])
        .unit("a.service", Launched, "MachineID=m2")
        .left("a.service", "m3")
        .state("a.service", "m3", "active");
    assert_eq!(w.waiting(), ["a.service"]);
    let w = w.without_machine("m3");
    assert_eq!(
        lines(&w.plan()),
        [
            "schedule a.service on m2 (launched): target state launched and unit not scheduled",
            "forget a.service left m3: target machine m3 went away",
        ]
    );
}

/// The engine holds such a unit while the gone machine's fence may still be stopping the copy
/// (`crate::disruption`): it stays unplaced, and its record stays with it.
#[test]
fn a_unit_that_left_a_gone_machine_stays_unplaced_and_recorded_while_held() {
    let w = m1_busy()
        .machine("m3", &[])
        .unit("a.service", Launched, "MachineID=m2")
        .left("a.service", "m3")
        .without_machine("m3");
    let held = BTreeSet::from([name("a.service")]);
    let plan = plan_holding(&w.snap, &w.files, &held);
    assert_eq!(lines(&plan.decisions), Vec::<String>::new());
    assert_eq!(
        lines(&w.plan()),
        [
            "schedule a.service on m2 (launched): target state launched and unit not scheduled",
            "forget a.service left m3: target machine m3 went away",
        ]
    );
}

/// A new leader knows only the registry: a plan of a fresh snapshot holding the record,
/// and nothing of the plan that wrote it, still waits for the copy.
#[test]
fn the_history_survives_a_new_leader() {
    let fresh = || {
        m1_busy()
            .unit("a.service", Launched, "")
            .state("a.service", "m1", "active")
    };
    assert_eq!(fresh().waiting(), Vec::<String>::new(), "a stray alone");
    let w = fresh().left("a.service", "m1");
    assert_eq!(
        lines(&w.plan()),
        ["unschedulable a.service: waiting for the previous copy on m1 to stop"]
    );
    assert_eq!(w.waiting(), ["a.service"]);
    let plan = plan(&w.snap, &w.files);
    assert_eq!(plan.previous_copies[&name("a.service")], mid("m1"));
}

#[test]
fn explain_names_the_copy_a_unit_waits_for_and_ignores_a_stray() {
    let held = m1_busy()
        .unit("a.service", Launched, "")
        .left("a.service", "m1")
        .state("a.service", "m1", "active");
    let why = explain(&held.snap, &held.files, &name("a.service"));
    assert_eq!(why.status, Status::Waiting);
    assert_eq!(why.summary, "waiting for the previous copy on m1 to stop");
    let mut stray = held;
    stray.snap.left.clear();
    let why = explain(&stray.snap, &stray.files, &name("a.service"));
    assert_eq!(
        why.summary,
        "a machine can take it: the engine places it in its next pass"
    );
}

#[test]
fn a_unit_stopped_and_started_again_waits_for_the_copy_it_left() {
    let mut w = m1_busy()
        .unit("a.service", Launched, "")
        .entry("a.service", "m1")
        .state("a.service", "m1", "active");
    w.snap
        .units
        .get_mut(&name("a.service"))
        .unwrap()
        .record
        .desired = Inactive;
    assert_eq!(
        w.settle(),
        ["unschedule a.service from m1, recording it left: target state inactive"]
    );
    assert!(w.plan().is_empty(), "the record waits for its copy to stop");
    w.snap
        .units
        .get_mut(&name("a.service"))
        .unwrap()
        .record
        .desired = Launched;
    assert_eq!(
        lines(&w.plan()),
        ["unschedulable a.service: waiting for the previous copy on m1 to stop"]
    );
}

#[test]
fn a_record_whose_copy_stopped_is_forgotten_even_for_a_unit_placed_nowhere() {
    let w = two_machines()
        .unit("a.service", Inactive, "")
        .left("a.service", "m1")
        .state("a.service", "m1", "failed");
    assert_eq!(
        lines(&w.plan()),
        ["forget a.service left m1: the copy on m1 has stopped"]
    );
    let w = two_machines().left("gone.service", "m1");
    assert_eq!(
        lines(&w.plan()),
        ["forget gone.service left m1: the copy on m1 has stopped"]
    );
}

#[test]
fn a_unit_placed_back_on_the_machine_it_left_drops_the_record() {
    let w = two_machines()
        .unit("b.service", Launched, "")
        .entry("b.service", "m2")
        .unit("a.service", Launched, "")
        .left("a.service", "m1")
        .state("a.service", "m1", "deactivating");
    assert_eq!(
        lines(&w.plan()),
        [
            "schedule a.service on m1 (launched): target state launched and unit not scheduled",
            "forget a.service left m1: scheduled on m1 again",
        ]
    );
}

#[test]
fn a_global_unit_leaves_no_record() {
    let w = two_machines()
        .machine("m1", &[("role", "web")])
        .unit(
            "g.service",
            Launched,
            "Global=true;MachineMetadata=role=web",
        )
        .entry("g.service", "m1")
        .entry("g.service", "m2")
        .state("g.service", "m2", "active");
    assert_eq!(
        lines(&w.plan()),
        [
            "unschedule g.service from m2: target machine m2 unable to run unit: machine \
             metadata lacks role=web"
        ]
    );
}

/// A stopped copy holds nothing back, but its state may predate a start its agent has not
/// published yet: the record stays until the machine withdraws the state (its agent unloads
/// the unit only once stopped), and a copy published running meanwhile holds the unit.
#[test]
fn a_copy_published_stopped_is_recorded_until_its_machine_withdraws_the_state() {
    let mut w = m1_busy()
        .unit("a.service", Launched, "")
        .entry("a.service", "m1")
        .state("a.service", "m1", "inactive")
        .desired("a.service", Inactive);
    assert_eq!(
        w.settle(),
        ["unschedule a.service from m1, recording it left stopped: target state inactive"]
    );
    assert_eq!(
        w.snap.left[&name("a.service")][&mid("m1")],
        LeftCopy::Stopped
    );
    let mut w = w.state("a.service", "m1", "failed");
    assert!(w.settle().is_empty(), "still published, stopped or not");
    let mut w = w
        .state("a.service", "m1", "active")
        .desired("a.service", Launched);
    assert_eq!(
        w.settle(),
        ["unschedulable a.service: waiting for the previous copy on m1 to stop"]
    );
    let mut w = w.without_state("a.service", "m1");
    assert_eq!(
        w.settle(),
        [
            "schedule a.service on m2 (launched): target state launched and unit not scheduled",
            "forget a.service left m1: the copy on m1 has stopped",
            "clear a.service: unit is scheduled now",
        ]
    );
}

/// The copy m1's agent started and has not published yet when the unit leaves (issue 36):
/// recorded as unpublished, it stays recorded while m1 publishes nothing, holds the unit once
/// published running (and is then recorded as running), and goes once stopped.
#[test]
fn a_copy_unpublished_when_its_unit_left_holds_the_unit_once_published() {
    let mut w = m1_busy()
        .unit("a.service", Launched, "")
        .entry("a.service", "m1")
        .desired("a.service", Inactive);
    assert_eq!(
        w.settle(),
        ["unschedule a.service from m1, recording it left unpublished: target state inactive"]
    );
    assert_eq!(
        w.snap.left[&name("a.service")][&mid("m1")],
        LeftCopy::Unpublished
    );
    assert!(w.settle().is_empty(), "m1 has published nothing yet");
    let mut w = w.state("a.service", "m1", "active");
    assert!(strays_of(&w).is_empty(), "no stray: a left m1");
    assert_eq!(
        w.settle(),
        ["record a.service left m1 running: the copy on m1 is published"]
    );
    let mut w = w.desired("a.service", Launched);
    assert_eq!(
        w.settle(),
        ["unschedulable a.service: waiting for the previous copy on m1 to stop"]
    );
    let mut w = w.without_state("a.service", "m1");
    assert_eq!(
        w.settle(),
        [
            "schedule a.service on m2 (launched): target state launched and unit not scheduled",
            "forget a.service left m1: the copy on m1 has stopped",
            "clear a.service: unit is scheduled now",
        ]
    );
}

#[test]
fn an_unpublished_copy_published_stopped_is_forgotten() {
    let w = m1_busy()
        .unit("a.service", Launched, "MachineID=m2")
        .left_as("a.service", "m1", LeftCopy::Unpublished)
        .state("a.service", "m1", "inactive");
    assert_eq!(
        lines(&w.plan()),
        [
            "schedule a.service on m2 (launched): target state launched and unit not scheduled",
            "forget a.service left m1: the copy on m1 has stopped",
        ]
    );
}

/// An unpublished copy holds nothing back while unpublished: the unit is placed (the limit
/// docs/engine.md states), and the record stays for the copy that may still show up.
#[test]
fn an_unpublished_copy_holds_nothing_back_until_published() {
    let w = m1_busy()
        .unit("a.service", Launched, "MachineID=m2")
        .left_as("a.service", "m1", LeftCopy::Unpublished);
    assert_eq!(
        lines(&w.plan()),
        ["schedule a.service on m2 (launched): target state launched and unit not scheduled"]
    );
}

#[test]
fn only_placeable_units_running_on_a_live_machine_have_strays() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .unit("g.service", Launched, "Global=true")
        .unit("off.service", Inactive, "")
        .state("a.service", "m1", "inactive")
        .state("a.service", "m9", "active")
        .state("g.service", "m1", "active")
        .state("off.service", "m1", "active")
        .state("nofile.service", "m1", "active");
    assert!(strays_of(&w).is_empty(), "{:?}", strays_of(&w));
    let w = w.state("a.service", "m2", "activating");
    assert_eq!(strays_of(&w), ["a.service on m2"]);
}
