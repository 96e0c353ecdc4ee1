//! Decision tables for replacing units (`fleetctl ... --replace`): the replace options copied
//! into entries, staying in place, `--reschedule`, rolling replaces, and never two copies of
//! a non-global unit running at once.

use super::*;
use fleet_registry::Rollout;

fn hash(xfleet: &str, version: u32) -> UnitHash {
    unit_file(&xfleet.replace(';', "\n"), version).hash()
}

fn three_machines() -> World {
    two_machines().machine("m3", &[])
}

/// A rolling replace from `previous` that has reached `updated`.
fn rolling(previous: UnitHash, updated: &[&str]) -> ReplaceState {
    let rollout = Rollout {
        previous,
        updated: updated.iter().map(|m| mid(m)).collect(),
    };
    ReplaceState {
        rollout: Some(rollout),
        ..ReplaceState::default()
    }
}

/// A `--reschedule` replace: placement generation `generation`, away from `avoid`.
fn reschedule(generation: u64, avoid: Option<&str>) -> ReplaceState {
    ReplaceState {
        placement: generation,
        avoid: avoid.map(mid),
        ..ReplaceState::default()
    }
}

fn no_restart() -> ReplaceState {
    ReplaceState {
        no_restart: true,
        ..ReplaceState::default()
    }
}

/// A global unit on m1..m3, every entry on version 0.
fn global_on_three_machines() -> World {
    let v0 = hash("Global=true", 0);
    let mut w = three_machines().unit_version("g.service", Launched, "Global=true", 1);
    for m in ["m1", "m2", "m3"] {
        w = w.entry_with("g.service", m, v0, Launched);
    }
    w
}

/// Machine -> the short hash its entry of `unit` names.
fn versions(w: &World, unit: &str) -> BTreeMap<String, String> {
    w.snap.schedule[&name(unit)]
        .iter()
        .map(|(m, e)| (m.to_string(), e.hash.short().to_string()))
        .collect()
}

fn short(h: UnitHash) -> String {
    h.short().to_string()
}

// ---- replace options copied into entries ------------------------------------------------------

#[test]
fn copies_no_restart_and_the_placement_generation_into_a_new_entry() {
    let w = two_machines().unit("a.service", Launched, "");
    let mut w = w.replace(
        "a.service",
        ReplaceState {
            no_restart: true,
            placement: 3,
            ..ReplaceState::default()
        },
    );
    w.settle();
    let entry = w.entry_of("a.service", "m1");
    assert!(entry.no_restart);
    assert_eq!(entry.placement, 3);
}

#[test]
fn a_replace_without_restart_is_one_update_carrying_the_new_file_and_no_restart() {
    let old = hash("", 0);
    let w = two_machines().unit_version("a.service", Launched, "", 1);
    let mut w = w
        .replace("a.service", no_restart())
        .entry_with("a.service", "m2", old, Launched);
    assert_eq!(
        w.settle(),
        [format!(
            "update a.service on m2 (launched): unit file changed from {} to {}",
            short(old),
            short(hash("", 1))
        )]
    );
    let entry = w.entry_of("a.service", "m2");
    assert!(entry.no_restart);
    assert_eq!(entry.hash, hash("", 1));
}

#[test]
fn updates_an_entry_whose_no_restart_differs_from_the_unit() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .entry("a.service", "m1")
        .with_entry("a.service", "m1", |e| e.no_restart = true);
    assert_eq!(
        lines(&w.plan()),
        ["update a.service on m1 (launched): no-restart changed to false"]
    );
}

#[test]
fn a_global_unit_takes_a_new_placement_generation_in_place_on_every_machine() {
    let w = three_machines().unit("g.service", Launched, "Global=true");
    let mut w = w
        .entry("g.service", "m1")
        .entry("g.service", "m2")
        .entry("g.service", "m3")
        .replace("g.service", reschedule(1, Some("m1")));
    assert_eq!(
        w.settle(),
        [
            "update g.service on m1 (launched): reschedule 1 requested",
            "update g.service on m2 (launched): reschedule 1 requested",
            "update g.service on m3 (launched): reschedule 1 requested",
        ]
    );
    assert!(w.plan().is_empty());
}

// ---- staying in place -------------------------------------------------------------------------

#[test]
fn a_replaced_unit_stays_on_its_machine_across_ten_replaces() {
    let mut w = three_machines()
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "")
        .entry("a.service", "m1")
        .entry("b.service", "m1");
    for version in 1..=10 {
        w = w.unit_version("a.service", Launched, "", version);
        let plan = w.settle();
        assert_eq!(plan.len(), 1, "replace {version}: {plan:?}");
        assert!(plan[0].starts_with("update a.service on m1"), "{plan:?}");
        assert_eq!(w.placement()["a.service"], ["m1"], "replace {version}");
    }
}

#[test]
fn a_replaced_unit_stays_when_the_new_version_still_accepts_its_machine() {
    let w = World::new()
        .machine("m1", &[("role", "web")])
        .machine("m2", &[("role", "web")])
        .unit_version("a.service", Launched, "MachineMetadata=role=web", 1);
    let w = w.entry_with("a.service", "m1", hash("", 0), Launched);
    let plan = lines(&w.plan());
    assert_eq!(plan.len(), 1);
    assert!(plan[0].starts_with("update a.service on m1"), "{plan:?}");
}

#[test]
fn a_replace_whose_machine_id_names_another_machine_moves_the_unit_there() {
    let w = three_machines().unit_version("a.service", Launched, "MachineID=m3", 1);
    let mut w = w.entry_with("a.service", "m1", hash("", 0), Launched);
    w.settle();
    assert_eq!(w.placement()["a.service"], ["m3"]);
    assert_eq!(w.entry_of("a.service", "m3").hash, hash("MachineID=m3", 1));
}

// ---- --reschedule -----------------------------------------------------------------------------

#[test]
fn a_new_placement_generation_moves_the_unit_to_the_least_loaded_other_machine() {
    let w = three_machines()
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "")
        .entry("a.service", "m1")
        .entry("b.service", "m2");
    let mut w = w.replace("a.service", reschedule(1, Some("m1")));
    assert_eq!(
        w.settle(),
        [
            "unschedule a.service from m1, recording it left unpublished: reschedule 1 requested",
            "schedule a.service on m3 (launched): reschedule 1 requested",
        ]
    );
    assert_eq!(w.entry_of("a.service", "m3").placement, 1);
    assert!(w.plan().is_empty());
}

#[test]
fn the_avoided_machine_comes_last_even_when_it_is_the_least_loaded() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "")
        .unit("c.service", Launched, "")
        .entry("a.service", "m1")
        .entry("b.service", "m2")
        .entry("c.service", "m2");
    let mut w = w.replace("a.service", reschedule(1, Some("m1")));
    w.settle();
    assert_eq!(w.placement()["a.service"], ["m2"]);
}

#[test]
fn a_new_placement_generation_falls_back_to_the_avoided_machine_when_no_other_can_run_it() {
    let w = World::new()
        .machine("m1", &[("role", "db")])
        .machine("m2", &[])
        .unit("a.service", Launched, "MachineMetadata=role=db")
        .entry("a.service", "m1");
    let mut w = w.replace("a.service", reschedule(1, Some("m1")));
    assert_eq!(
        w.settle(),
        ["update a.service on m1 (launched): reschedule 1 requested"]
    );
    assert!(w.plan().is_empty());
}

#[test]
fn a_new_placement_generation_without_a_machine_to_avoid_places_on_the_least_loaded() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "")
        .entry("a.service", "m1")
        .entry("b.service", "m1");
    let mut w = w.replace("a.service", reschedule(1, None));
    w.settle();
    assert_eq!(w.placement()["a.service"], ["m2"]);
}

#[test]
fn an_entry_already_placed_under_the_current_generation_stays() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .entry("a.service", "m1")
        .with_entry("a.service", "m1", |e| e.placement = 2)
        .replace("a.service", reschedule(2, Some("m1")));
    assert!(w.plan().is_empty());
}

#[test]
fn dependents_follow_a_rescheduled_peer() {
    let w = three_machines()
        .unit("db.service", Launched, "")
        .unit("side.service", Launched, "MachineOf=db.service")
        .unit("x.service", Launched, "")
        .entry("db.service", "m1")
        .entry("side.service", "m1")
        .entry("x.service", "m2");
    let mut w = w.replace("db.service", reschedule(1, Some("m1")));
    w.settle();
    assert_eq!(w.placement()["db.service"], ["m3"]);
    assert_eq!(w.placement()["side.service"], ["m3"]);
    assert!(w.plan().is_empty());
}

// ---- rolling replaces -------------------------------------------------------------------------

#[test]
fn a_rolling_replace_that_has_reached_no_machine_changes_nothing() {
    let w = global_on_three_machines().replace("g.service", rolling(hash("Global=true", 0), &[]));
    assert!(w.plan().is_empty(), "{:?}", lines(&w.plan()));
}

#[test]
fn a_rolling_replace_updates_only_the_machines_it_has_reached() {
    let (v0, v1) = (hash("Global=true", 0), hash("Global=true", 1));
    let mut w = global_on_three_machines().replace("g.service", rolling(v0, &["m2"]));
    assert_eq!(
        w.settle(),
        [format!(
            "update g.service on m2 (launched): unit file changed from {} to {}",
            short(v0),
            short(v1)
        )]
    );
    let expected = [("m1", v0), ("m2", v1), ("m3", v0)];
    let expected = expected.map(|(m, h)| (m.to_owned(), short(h)));
    assert_eq!(versions(&w, "g.service"), BTreeMap::from(expected));
}

#[test]
fn the_end_of_a_rolling_replace_gives_every_machine_the_new_version() {
    let v0 = hash("Global=true", 0);
    let mut w = global_on_three_machines().replace("g.service", rolling(v0, &["m1", "m2"]));
    w.settle();
    let mut w = w.replace("g.service", ReplaceState::default());
    assert_eq!(w.settle().len(), 1, "only m3 is left");
    let v1 = short(hash("Global=true", 1));
    assert!(versions(&w, "g.service").values().all(|h| *h == v1));
}

#[test]
fn a_machine_joining_during_a_rolling_replace_gets_the_new_version() {
    let v0 = hash("Global=true", 0);
    let w = global_on_three_machines().replace("g.service", rolling(v0, &[]));
    let mut w = w.machine("m4", &[]);
    assert_eq!(
        w.settle(),
        ["schedule g.service on m4 (launched): global unit and the machine qualifies"]
    );
    assert_eq!(w.entry_of("g.service", "m4").hash, hash("Global=true", 1));
    assert_eq!(w.entry_of("g.service", "m1").hash, v0);
}

#[test]
fn a_rolling_replace_never_takes_a_machine_back_to_the_previous_version() {
    let v0 = hash("Global=true", 0);
    let w = global_on_three_machines()
        .with_entry("g.service", "m3", |e| e.hash = hash("Global=true", 1))
        .replace("g.service", rolling(v0, &[]));
    assert!(w.plan().is_empty(), "{:?}", lines(&w.plan()));
}

#[test]
fn a_machine_on_an_older_version_goes_to_the_previous_one_until_the_roll_reaches_it() {
    let older = hash("Global=true", 7);
    let v0 = hash("Global=true", 0);
    let mut w = global_on_three_machines()
        .with_entry("g.service", "m3", |e| e.hash = older)
        .replace("g.service", rolling(v0, &[]));
    assert_eq!(
        w.settle(),
        [format!(
            "update g.service on m3 (launched): unit file changed from {} to {}",
            short(older),
            short(v0)
        )]
    );
}

#[test]
fn a_rolling_replace_still_applies_a_new_desired_state_to_machines_not_yet_updated() {
    let v0 = hash("Global=true", 0);
    let w = global_on_three_machines()
        .unit_version("g.service", Loaded, "Global=true", 1)
        .replace("g.service", rolling(v0, &["m1"]));
    let mut w = w;
    w.settle();
    let expected = [("m1", hash("Global=true", 1)), ("m2", v0), ("m3", v0)];
    let expected = expected.map(|(m, h)| (m.to_owned(), short(h)));
    assert_eq!(versions(&w, "g.service"), BTreeMap::from(expected));
    for m in ["m1", "m2", "m3"] {
        assert_eq!(w.entry_of("g.service", m).desired, Loaded);
    }
}

#[test]
fn a_non_global_unit_is_updated_only_once_the_rolling_replace_reaches_its_machine() {
    let v0 = hash("", 0);
    let w = two_machines().unit_version("a.service", Launched, "", 1);
    let w = w
        .entry_with("a.service", "m1", v0, Launched)
        .replace("a.service", rolling(v0, &[]));
    assert!(w.plan().is_empty());
    let mut w = w.replace("a.service", rolling(v0, &["m1"]));
    w.settle();
    assert_eq!(w.entry_of("a.service", "m1").hash, hash("", 1));
}

#[test]
fn a_non_global_unit_placed_afresh_during_a_rolling_replace_gets_the_new_version() {
    let v0 = hash("", 0);
    let w = two_machines().unit_version("a.service", Launched, "", 1);
    let w = w
        .entry_with("a.service", "m1", v0, Launched)
        .replace("a.service", rolling(v0, &[]));
    let mut w = w.without_machine("m1");
    w.settle();
    assert_eq!(w.entry_of("a.service", "m2").hash, hash("", 1));
}

// ---- never two copies at once -----------------------------------------------------------------

#[test]
fn a_moved_unit_waits_for_its_previous_copy_to_stop() {
    let w = three_machines().unit_version("a.service", Launched, "MachineID=m3", 1);
    let mut w = w
        .entry_with("a.service", "m1", hash("", 0), Launched)
        .state("a.service", "m1", "active");
    assert_eq!(
        w.settle(),
        [
            "unschedule a.service from m1, recording it left: target machine m1 unable to run \
             unit: machine ID does not match required \"m3\"",
            "unschedulable a.service: waiting for the previous copy on m1 to stop",
        ]
    );
    assert_eq!(w.waiting(), ["a.service"]);
    assert!(w.plan().is_empty(), "waiting is settled");
    let mut w = w.state("a.service", "m1", "deactivating");
    assert!(w.settle().is_empty(), "still stopping");
    let mut w = w.without_state("a.service", "m1");
    assert_eq!(
        w.settle(),
        [
            "schedule a.service on m3 (launched): target state launched and unit not scheduled",
            "forget a.service left m1: the copy on m1 has stopped",
            "clear a.service: unit is scheduled now",
        ]
    );
    assert!(w.waiting().is_empty());
    assert!(w.snap.left.is_empty());
}

#[test]
fn every_active_state_but_inactive_and_failed_holds_a_unit_back() {
    for (active, holds) in [
        ("active", true),
        ("activating", true),
        ("deactivating", true),
        ("reloading", true),
        ("maintenance", true),
        ("inactive", false),
        ("failed", false),
    ] {
        let w = two_machines()
            .unit("a.service", Launched, "")
            .left("a.service", "m1")
            .state("a.service", "m1", active)
            .unit("b.service", Launched, "")
            .entry("b.service", "m1");
        let waiting = !w.waiting().is_empty();
        assert_eq!(waiting, holds, "ActiveState {active}");
    }
}

#[test]
fn a_rescheduled_unit_waits_for_its_copy_on_the_avoided_machine() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .entry("a.service", "m1")
        .state("a.service", "m1", "active");
    let mut w = w.replace("a.service", reschedule(1, Some("m1")));
    assert_eq!(
        w.settle(),
        [
            "unschedule a.service from m1, recording it left: reschedule 1 requested",
            "unschedulable a.service: waiting for the previous copy on m1 to stop",
        ]
    );
    let mut w = w.state("a.service", "m1", "inactive");
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
fn a_dead_machine_never_holds_a_unit_back() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .entry("a.service", "m1")
        .state("a.service", "m1", "active");
    let w = w.without_machine("m1");
    assert_eq!(
        lines(&w.plan()),
        [
            "unschedule a.service from m1: target machine m1 went away",
            "schedule a.service on m2 (launched): target machine m1 went away",
        ]
    );
}

#[test]
fn a_copy_on_the_chosen_machine_itself_does_not_hold_the_unit_back() {
    let w = World::new()
        .machine("m1", &[])
        .unit("a.service", Launched, "")
        .state("a.service", "m1", "deactivating");
    assert_eq!(
        lines(&w.plan()),
        ["schedule a.service on m1 (launched): target state launched and unit not scheduled"]
    );
}

#[test]
fn a_unit_that_stays_in_place_is_never_held_back() {
    let w = two_machines().unit_version("a.service", Launched, "", 1);
    let w = w
        .entry_with("a.service", "m1", hash("", 0), Launched)
        .state("a.service", "m1", "active")
        .state("a.service", "m2", "active");
    let plan = lines(&w.plan());
    assert_eq!(plan.len(), 1);
    assert!(plan[0].starts_with("update a.service on m1"), "{plan:?}");
}

#[test]
fn a_global_unit_is_never_held_back() {
    let w = two_machines()
        .unit("g.service", Launched, "Global=true")
        .state("g.service", "m1", "active");
    assert_eq!(
        lines(&w.plan()),
        [
            "schedule g.service on m1 (launched): global unit and the machine qualifies",
            "schedule g.service on m2 (launched): global unit and the machine qualifies",
        ]
    );
}

#[test]
fn a_displaced_unit_waits_for_its_copy_while_the_replacing_unit_takes_the_machine() {
    let w = two_machines()
        .unit("old.service", Launched, "")
        .unit("x.service", Launched, "")
        .entry("old.service", "m1")
        .entry("x.service", "m2")
        .state("old.service", "m1", "active")
        .unit("new.service", Launched, "Replaces=old.service");
    assert_eq!(
        lines(&w.plan()),
        [
            "unschedule old.service from m1, recording it left: replaced by unit new.service on \
             machine m1",
            "schedule new.service on m1 (launched): target state launched and unit not scheduled",
            "unschedulable old.service: waiting for the previous copy on m1 to stop",
        ]
    );
}

#[test]
fn a_dependent_of_a_held_peer_waits_for_the_peer() {
    let w = two_machines()
        .unit_version("db.service", Launched, "MachineID=m2", 1)
        .unit("side.service", Launched, "MachineOf=db.service")
        .entry_with("db.service", "m1", hash("", 0), Launched)
        .entry("side.service", "m1")
        .state("db.service", "m1", "active");
    let mut w = w;
    w.settle();
    assert_eq!(
        w.snap.unscheduled[&name("side.service")],
        "required peer unit db.service is not scheduled"
    );
    let mut w = w.without_state("db.service", "m1");
    w.settle();
    assert_eq!(w.placement()["db.service"], ["m2"]);
    assert_eq!(w.placement()["side.service"], ["m2"]);
}

/// A replace in fleet's form: the unit went inactive, and comes back to `machine`.
fn prefer(machine: &str) -> ReplaceState {
    ReplaceState {
        prefer: Some(mid(machine)),
        ..ReplaceState::default()
    }
}

#[test]
fn a_unit_replaced_in_fleets_form_is_launched_again_on_its_machine_though_it_is_busier() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "")
        .unit("c.service", Launched, "")
        .entry("b.service", "m1")
        .entry("c.service", "m1");
    let mut w = w.replace("a.service", prefer("m1"));
    w.settle();
    assert_eq!(w.placement()["a.service"], ["m1"]);
}

#[test]
fn the_machine_a_replace_in_fleets_form_kept_is_skipped_when_it_cannot_run_the_unit_or_is_gone() {
    let w = World::new()
        .machine("m1", &[("role", "db")])
        .machine("m2", &[("role", "web")])
        .unit("a.service", Launched, "MachineMetadata=role=web")
        .unit("b.service", Launched, "");
    let mut w = w
        .replace("a.service", prefer("m1"))
        .replace("b.service", prefer("m9"));
    w.settle();
    assert_eq!(w.placement()["a.service"], ["m2"]);
    assert_eq!(w.placement()["b.service"], ["m1"]);
}
