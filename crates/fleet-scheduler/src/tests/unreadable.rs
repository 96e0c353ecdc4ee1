//! Decision tables for registry values that cannot be read (`Snapshot::skipped`): a unit or
//! machine whose record does not decode is never taken for one that is gone, and an
//! unreadable schedule entry is deleted.

use super::*;
use fleet_registry::{Key, Keys, Skipped};

impl World {
    fn skip(mut self, key: String, named: Key) -> World {
        let skipped = Skipped {
            key: key.clone(),
            mod_revision: 7,
            detail: "expected value at line 1 column 1".to_owned(),
            named: Some(Box::new(named)),
        };
        self.snap.skipped.insert(key, skipped);
        self
    }

    /// `unit`'s record is overwritten with a value that does not decode.
    fn corrupt_unit(mut self, unit: &str) -> World {
        self.snap.units.remove(&name(unit));
        let key = Keys::default().unit(&name(unit));
        self.skip(key, Key::Unit(name(unit)))
    }

    /// `machine`'s presence record is overwritten with a value that does not decode.
    fn corrupt_machine(mut self, machine: &str) -> World {
        self.snap.machines.remove(&mid(machine));
        let key = Keys::default().machine(&mid(machine));
        self.skip(key, Key::Machine(mid(machine)))
    }

    /// An entry of `unit` on `machine` that does not decode (and so is not in the schedule).
    fn corrupt_entry(mut self, unit: &str, machine: &str) -> World {
        if let Some(entries) = self.snap.schedule.get_mut(&name(unit)) {
            entries.remove(&mid(machine));
        }
        let key = Keys::default().schedule(&mid(machine), &name(unit));
        let named = Key::Schedule {
            machine: mid(machine),
            unit: name(unit),
        };
        self.skip(key, named)
    }
}

#[test]
fn a_running_unit_whose_record_becomes_unreadable_keeps_its_machine() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .entry("a.service", "m1")
        .state("a.service", "m1", "active")
        .unit("b.service", Launched, "MachineMetadata=role=db")
        .corrupt_unit("a.service");
    let mut w = w;
    w.snap
        .unscheduled
        .insert(name("b.service"), "no machine".to_owned());
    let w = w.corrupt_unit("b.service");
    assert_eq!(lines(&w.plan()), Vec::<String>::new());
    assert_eq!(w.placement(), placed(&[("a.service", &["m1"])]));
}

#[test]
fn a_unit_whose_record_is_unreadable_is_never_placed() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .corrupt_unit("a.service");
    assert_eq!(lines(&w.plan()), Vec::<String>::new());
}

#[test]
fn a_unit_whose_unreadable_record_is_destroyed_is_unscheduled() {
    let mut w = two_machines()
        .unit("a.service", Launched, "")
        .entry("a.service", "m1")
        .corrupt_unit("a.service");
    w.snap.skipped.clear();
    assert_eq!(
        lines(&w.plan()),
        ["unschedule a.service from m1, recording it left unpublished: unit destroyed"]
    );
}

#[test]
fn units_on_a_machine_whose_record_becomes_unreadable_stay_and_it_gets_no_new_unit() {
    let w = two_machines()
        .machine("m1", &[("role", "db")])
        .unit("a.service", Launched, "MachineMetadata=role=db")
        .entry("a.service", "m1")
        .state("a.service", "m1", "active")
        .unit("g.service", Launched, "Global=true")
        .entry("g.service", "m1")
        .entry("g.service", "m2")
        .corrupt_machine("m1")
        .unit("c.service", Launched, "");
    let mut w = w;
    let plan = w.settle();
    assert_eq!(
        plan,
        ["schedule c.service on m2 (launched): target state launched and unit not scheduled"]
    );
    assert_eq!(w.settle(), Vec::<String>::new());
    assert_eq!(
        w.placement(),
        placed(&[
            ("a.service", &["m1"]),
            ("c.service", &["m2"]),
            ("g.service", &["m1", "m2"]),
        ])
    );
}

#[test]
fn a_destroyed_unit_on_a_machine_whose_record_is_unreadable_is_still_unscheduled() {
    let mut w = two_machines()
        .unit("a.service", Launched, "")
        .entry("a.service", "m1")
        .corrupt_machine("m1");
    w.snap.units.remove(&name("a.service"));
    assert_eq!(
        lines(&w.plan()),
        ["unschedule a.service from m1, recording it left unpublished: unit destroyed"]
    );
}

#[test]
fn a_machine_whose_record_is_unreadable_holds_a_unit_back_while_it_runs_a_copy() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .left("a.service", "m1")
        .state("a.service", "m1", "deactivating")
        .corrupt_machine("m1");
    assert_eq!(w.waiting(), ["a.service"]);
}

#[test]
fn an_unreadable_schedule_entry_is_deleted_when_its_unit_goes_elsewhere() {
    let mut w = two_machines()
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "")
        .entry("b.service", "m1")
        .corrupt_entry("a.service", "m1");
    let decisions = w.plan();
    assert_eq!(
        lines(&decisions),
        [
            "unschedule a.service from m1: registry value at /_coreos.com/fleet/schedule/m1/a.service cannot be read",
            "schedule a.service on m2 (launched): target state launched and unit not scheduled",
        ]
    );
    w.apply(&decisions);
    w.snap.skipped.clear();
    assert_eq!(w.settle(), Vec::<String>::new());
}

#[test]
fn an_unreadable_schedule_entry_is_overwritten_when_its_unit_goes_back_there() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .corrupt_entry("a.service", "m1");
    assert_eq!(
        lines(&w.plan()),
        ["schedule a.service on m1 (launched): target state launched and unit not scheduled"]
    );
}

#[test]
fn an_unreadable_schedule_entry_of_a_unit_that_is_gone_is_deleted() {
    let w = two_machines().corrupt_entry("x.service", "m2");
    assert_eq!(
        lines(&w.plan()),
        [
            "unschedule x.service from m2: registry value at /_coreos.com/fleet/schedule/m2/x.service cannot be read"
        ]
    );
}
