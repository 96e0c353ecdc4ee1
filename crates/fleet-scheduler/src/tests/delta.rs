//! Planning only the units a change touched (`plan_delta`): when it answers, and that its
//! answer is the whole plan's (the property test in `props.rs` checks the latter broadly).

use super::*;

/// Three machines, four plain units settled on them (m1 and m2 carry two, m3 none after
/// its units went: the least loaded).
fn settled() -> World {
    let mut w = World::new()
        .machine("m1", &[])
        .machine("m2", &[])
        .machine("m3", &[])
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "")
        .unit("c.service", Launched, "")
        .unit("d.service", Launched, "")
        .entry("a.service", "m1")
        .entry("b.service", "m1")
        .entry("c.service", "m2")
        .entry("d.service", "m2");
    assert!(w.settle().is_empty(), "already at a fixed point");
    w
}

fn delta(w: &World, before: &Entangled, touched: &[&str]) -> Option<Plan> {
    let touched: BTreeSet<UnitName> = touched.iter().map(|u| name(u)).collect();
    plan_delta(&w.snap, &w.files, &touched, before)
}

#[test]
fn a_new_plain_unit_is_planned_alone_against_the_load_of_the_others() {
    let w = settled();
    let before = Entangled::of(&w.snap, &w.files);
    let w = w.unit("e.service", Launched, "");
    let part = delta(&w, &before, &["e.service"]).expect("planned alone");
    assert_eq!(
        lines(&part.decisions),
        ["schedule e.service on m3 (launched): target state launched and unit not scheduled"]
    );
    assert_eq!(part, plan(&w.snap, &w.files));
}

#[test]
fn a_destroyed_or_stopped_plain_unit_is_planned_alone() {
    let mut w = settled();
    let before = Entangled::of(&w.snap, &w.files);
    w.snap.units.remove(&name("a.service"));
    w.snap
        .units
        .get_mut(&name("c.service"))
        .unwrap()
        .record
        .desired = Loaded;
    let part = delta(&w, &before, &["a.service", "c.service"]).expect("planned alone");
    assert_eq!(part, plan(&w.snap, &w.files));
    assert_eq!(part.decisions.len(), 2, "{:?}", lines(&part.decisions));
}

#[test]
fn a_unit_tied_to_others_is_planned_with_the_whole() {
    // A unit with Conflicts= arrives.
    let w = settled();
    let before = Entangled::of(&w.snap, &w.files);
    let w = w.unit("e.service", Launched, "Conflicts=a.service");
    assert_eq!(delta(&w, &before, &["e.service"]), None);

    // A plain unit arrives that an existing unit's Conflicts= (or Replaces=, MachineOf=)
    // names.
    for xfleet in ["Conflicts=e*", "Replaces=e.service", "MachineOf=e.service"] {
        let mut w = settled().unit("x.service", Launched, xfleet);
        w.settle();
        let before = Entangled::of(&w.snap, &w.files);
        assert_eq!(before.len(), 1);
        let w = w.unit("e.service", Launched, "");
        assert_eq!(delta(&w, &before, &["e.service"]), None, "{xfleet}");
        // One it does not name is planned alone.
        let w = w.unit("f.service", Launched, "");
        assert!(delta(&w, &before, &["f.service"]).is_some(), "{xfleet}");
    }

    // An entangled unit destroyed.
    let mut w = settled().unit("x.service", Launched, "Conflicts=a.service");
    w.settle();
    let before = Entangled::of(&w.snap, &w.files);
    w.snap.units.remove(&name("x.service"));
    assert_eq!(delta(&w, &before, &["x.service"]), None);
}

#[test]
fn a_drained_machine_means_the_whole_plan() {
    let w = settled();
    let before = Entangled::of(&w.snap, &w.files);
    let drained = w.clone().drain("m3", 1).unit("e.service", Launched, "");
    assert_eq!(delta(&drained, &before, &["e.service"]), None);
}

#[test]
fn a_load_kept_across_passes_is_the_load_counted_again() {
    let mut w = settled();
    let touched: BTreeSet<UnitName> = [name("a.service"), name("e.service")].into();
    let load = Load::of(&w.snap);
    let mut kept = load.without(&w.snap, &touched);
    // The pass moves a.service to m3 and places the new e.service there too.
    w = w.unit("e.service", Launched, "");
    w.snap.schedule.remove(&name("a.service"));
    w = w.entry("a.service", "m3").entry("e.service", "m3");
    kept.add(&w.snap, &touched);
    assert_eq!(kept, Load::of(&w.snap));
    // Taking every unit out leaves nothing.
    let all: BTreeSet<UnitName> = w.snap.schedule.keys().cloned().collect();
    assert_eq!(Load::of(&w.snap).without(&w.snap, &all), Load::default());
}

/// The planner's property test found it (issue 43's stop 57): a unit that became held is in
/// no touched set, and the whole plan gives a held unit no requirements. A held unit that
/// replaces a global one let the global come back to its machine in the whole plan, while
/// the delta of the same change decided nothing.
#[test]
fn a_held_unit_tied_to_others_means_the_whole_plan() {
    let mut w = settled().unit("g.service", Launched, "Global=true").unit(
        "x.service",
        Launched,
        "Replaces=g.service",
    );
    w.settle();
    let x_on = w.placement()["x.service"].clone();
    let before = Entangled::of(&w.snap, &w.files);
    let held: BTreeSet<UnitName> = [name("x.service")].into();
    let whole = plan_holding(&w.snap, &w.files, &held);
    assert_eq!(
        lines(&whole.decisions),
        [format!(
            "schedule g.service on {} (launched): global unit and the machine qualifies",
            x_on[0]
        )],
        "the whole plan places the global beside the held unit that replaces it"
    );
    let none = BTreeSet::new();
    assert_eq!(
        plan_delta_holding(&w.snap, &w.files, &none, &before, &held),
        None
    );

    // A held unit that nothing names and that names nothing is planned around.
    let held: BTreeSet<UnitName> = [name("a.service")].into();
    let part = plan_delta_holding(&w.snap, &w.files, &none, &before, &held).expect("alone");
    assert_eq!(part, plan_holding(&w.snap, &w.files, &held));
}
