//! Machines imported from fleet v1 that have not joined ours yet (`P/migrating/<machine>`):
//! copies fleet started run there with no fence of ours, so their entries stay while they
//! are absent, and a unit that leaves one waits for it before it runs anywhere else.

use super::*;
use fleet_registry::{Key, Keys, MigrationRecord, Skipped};

impl World {
    /// `machine`'s units were imported from fleet and it has not joined yet.
    fn migrating(mut self, machine: &str) -> World {
        let record = MigrationRecord {
            machine: mid(machine),
            since: 0,
            units: 1,
        };
        self.snap.migrating.insert(mid(machine), record);
        self
    }

    /// `machine`'s migration mark is there but does not decode.
    fn corrupt_migrating(mut self, machine: &str) -> World {
        let key = Keys::default().migrating(&mid(machine));
        let skipped = Skipped {
            key: key.clone(),
            mod_revision: 7,
            detail: "expected value at line 1 column 1".to_owned(),
            named: Some(Box::new(Key::Migrating(mid(machine)))),
        };
        self.snap.skipped.insert(key, skipped);
        self
    }
}

fn imported_on_m3() -> World {
    two_machines()
        .unit("a.service", Launched, "")
        .unit("g.service", Launched, "Global=true")
        .entry("a.service", "m3")
        .entry("g.service", "m3")
        .entry("g.service", "m1")
        .entry("g.service", "m2")
}

#[test]
fn keeps_every_entry_of_a_machine_that_has_not_joined_since_its_import() {
    let w = imported_on_m3().migrating("m3");
    assert_eq!(lines(&w.plan()), Vec::<String>::new());
    // The same absent machine without the mark is one that went away.
    let w = imported_on_m3();
    let plan = lines(&w.plan());
    assert!(
        plan.contains(&"unschedule a.service from m3: target machine m3 went away".to_owned()),
        "{plan:?}"
    );
}

#[test]
fn a_migration_mark_that_cannot_be_read_holds_as_one_that_can() {
    let w = imported_on_m3().corrupt_migrating("m3");
    assert_eq!(lines(&w.plan()), Vec::<String>::new());
}

#[test]
fn a_unit_stopped_while_its_machine_migrates_waits_for_that_machine_before_running_elsewhere() {
    let mut w = imported_on_m3()
        .migrating("m3")
        .desired("a.service", Inactive);
    let plan = w.plan();
    assert_eq!(
        lines(&plan),
        ["unschedule a.service from m3, recording it left unpublished: target state inactive"]
    );
    w.apply(&plan);
    let w = w.desired("a.service", Launched);
    assert_eq!(
        lines(&w.plan()),
        ["unschedulable a.service: waiting for the previous copy on m3 to stop"]
    );
    // Once the machine has joined and its agent is seen to have stopped the copy, the unit
    // goes where the rules put it.
    let w = w.machine("m3", &[]).state("a.service", "m3", "inactive");
    let mut w = w;
    w.snap.migrating.clear();
    let placed: Vec<String> = lines(&w.plan())
        .into_iter()
        .filter(|l| l.starts_with("schedule a.service"))
        .collect();
    assert_eq!(placed.len(), 1, "{placed:?}");
}

#[test]
fn a_migrating_machine_is_never_a_place_for_a_new_unit() {
    let w = World::new().unit("b.service", Launched, "").migrating("m3");
    let plan = lines(&w.plan());
    assert!(plan.iter().all(|l| !l.contains("on m3")), "{plan:?}");
}

/// Seen in the functional migration (functional-tests/tests/migrate.rs): the first engine of
/// ours unscheduled fleet's `MachineMetadata=` unit from a machine still running fleet, whose
/// metadata it cannot know before that machine joins, and found no place for it.
#[test]
fn keeps_a_metadata_bound_unit_on_a_machine_that_has_not_joined_since_its_import() {
    let w = two_machines()
        .unit("meta.service", Launched, "MachineMetadata=role=special")
        .entry("meta.service", "m3")
        .migrating("m3");
    assert_eq!(lines(&w.plan()), Vec::<String>::new());
}

#[test]
fn a_machine_that_joined_is_held_to_its_metadata_again() {
    let w = two_machines()
        .machine("m3", &[("role", "web")])
        .unit("meta.service", Launched, "MachineMetadata=role=special")
        .entry("meta.service", "m3")
        .migrating("m3");
    let plan = lines(&w.plan());
    assert!(
        plan.iter()
            .any(|l| l.starts_with("unschedule meta.service from m3")),
        "{plan:?}"
    );
}
