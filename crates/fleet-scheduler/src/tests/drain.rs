//! Draining: decision tables for one drain step by step, and properties over generated
//! clusters whose agents are simulated (a copy starts only once it has an entry, and stops
//! over a few steps once it lost it): never two copies, never more than `parallel` moves on
//! their way, globals untouched, and a drain ends with no movable non-global unit left.

use super::*;
use proptest::prelude::*;

fn drained_pair() -> World {
    two_machines()
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "")
        .entry("a.service", "m1")
        .entry("b.service", "m1")
        .state("a.service", "m1", "active")
        .state("b.service", "m1", "active")
        .drain("m1", 1)
}

#[test]
fn a_drained_machine_takes_no_new_non_global_unit() {
    let w = two_machines()
        .drain("m1", 1)
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "");
    assert_eq!(
        lines(&w.plan()),
        [
            "schedule a.service on m2 (launched): target state launched and unit not scheduled",
            "schedule b.service on m2 (launched): target state launched and unit not scheduled",
        ]
    );
}

#[test]
fn units_leave_one_at_a_time_each_stopped_here_before_it_starts_elsewhere() {
    let mut w = drained_pair();
    assert_eq!(
        w.settle(),
        [
            "moving a.service from m1: machine m1 is drained",
            "unschedule a.service from m1, recording it left: machine m1 is drained",
            "unschedulable a.service: waiting for the previous copy on m1 to stop",
        ]
    );
    assert_eq!(w.waiting(), ["a.service"]);
    w = w.state("a.service", "m1", "deactivating");
    assert_eq!(w.settle(), Vec::<String>::new(), "still stopping on m1");
    w = w.without_state("a.service", "m1");
    assert_eq!(
        w.settle(),
        [
            "schedule a.service on m2 (launched): machine m1 is drained",
            "forget a.service left m1: the copy on m1 has stopped",
            "clear a.service: unit is scheduled now",
        ]
    );
    w = w.state("a.service", "m2", "activating");
    assert_eq!(
        w.settle(),
        Vec::<String>::new(),
        "b waits until a is active"
    );
    assert_eq!(w.waiting(), ["a.service"], "a's state changes matter");
    w = w.state("a.service", "m2", "active");
    assert_eq!(
        w.settle(),
        [
            "moving b.service from m1: machine m1 is drained",
            "unschedule b.service from m1, recording it left: machine m1 is drained",
            "unschedulable b.service: waiting for the previous copy on m1 to stop",
            "move over a.service: move off drained machine m1 is over",
        ]
    );
}

#[test]
fn parallel_moves_start_together() {
    let mut w = drained_pair().drain("m1", 2);
    let plan = w.settle();
    assert_eq!(plan.iter().filter(|l| l.starts_with("moving")).count(), 2);
    assert_eq!(w.snap.moving.len(), 2);
}

#[test]
fn a_move_recorded_by_a_previous_leader_counts_against_parallel() {
    let mut w = drained_pair();
    w.snap.schedule.remove(&name("a.service"));
    w = w
        .entry("a.service", "m2")
        .without_state("a.service", "m1")
        .state("a.service", "m2", "activating");
    w.snap.moving.insert(
        name("a.service"),
        MoveRecord {
            unit: name("a.service"),
            from: mid("m1"),
        },
    );
    assert_eq!(w.plan(), vec![], "b waits for a");
}

#[test]
fn a_recorded_move_whose_unit_is_still_there_is_made_again() {
    let mut w = drained_pair();
    w.snap.moving.insert(
        name("b.service"),
        MoveRecord {
            unit: name("b.service"),
            from: mid("m1"),
        },
    );
    assert_eq!(
        w.settle(),
        [
            "unschedule b.service from m1, recording it left: machine m1 is drained",
            "unschedulable b.service: waiting for the previous copy on m1 to stop",
        ]
    );
}

#[test]
fn a_drained_machine_keeps_its_global_units() {
    let w = two_machines()
        .unit("g.service", Launched, "Global=true")
        .entry("g.service", "m1")
        .entry("g.service", "m2")
        .state("g.service", "m1", "active")
        .drain("m1", 1);
    assert_eq!(w.plan(), vec![]);
}

#[test]
fn a_pinned_unit_stays_with_a_reason_that_names_the_drain() {
    let w = two_machines()
        .unit("p.service", Launched, "MachineID=m1")
        .entry("p.service", "m1")
        .drain("m1", 1);
    assert_eq!(
        lines(&w.plan()),
        [
            "unschedulable p.service: stays on drained machine m1: no machine able to run unit: 1 machine is not MachineID=m1",
        ]
    );
}

#[test]
fn a_unit_with_no_other_machine_stays_and_its_reason_goes_with_the_drain() {
    let mut w = World::new()
        .machine("m1", &[])
        .unit("a.service", Launched, "")
        .entry("a.service", "m1")
        .drain("m1", 1);
    assert_eq!(
        w.settle(),
        ["unschedulable a.service: stays on drained machine m1: no other machine"]
    );
    w = w.undrain("m1");
    assert_eq!(w.settle(), ["clear a.service: unit is scheduled now"]);
}

#[test]
fn undraining_moves_nothing_back_and_ends_the_moves() {
    let mut w = drained_pair();
    w.settle();
    w = w.without_state("a.service", "m1");
    w.settle();
    w = w.undrain("m1");
    assert_eq!(
        w.settle(),
        ["move over a.service: move off drained machine m1 is over"]
    );
    assert_eq!(
        w.placement(),
        placed(&[("a.service", &["m2"]), ("b.service", &["m1"])])
    );
    assert_eq!(w.plan(), vec![]);
}

// ---- properties -----------------------------------------------------------------------------

const MACHINES: [&str; 3] = ["m0", "m1", "m2"];

#[derive(Debug, Clone)]
struct GenUnit {
    kind: u8,
    at: Option<usize>,
    conflicts: Option<usize>,
    desired: DesiredState,
}

fn gen_unit() -> impl Strategy<Value = GenUnit> {
    (
        // 0..=5 free, 6 global, 7 pinned to the drained machine.
        0u8..8,
        prop::option::of(0..MACHINES.len()),
        prop::option::weighted(0.3, 0..8usize),
        prop::sample::select(vec![Launched, Launched, Loaded]),
    )
        .prop_map(|(kind, at, conflicts, desired)| GenUnit {
            kind,
            at,
            conflicts,
            desired,
        })
}

fn world(units: &[GenUnit], parallel: u32) -> World {
    let mut w = World::new();
    for m in MACHINES {
        w = w.machine(m, &[]);
    }
    for (i, u) in units.iter().enumerate() {
        let mut xfleet = Vec::new();
        match u.kind {
            6 => xfleet.push("Global=true".to_owned()),
            7 => xfleet.push("MachineID=m0".to_owned()),
            _ => {}
        }
        if let Some(c) = u.conflicts.filter(|c| *c != i && u.kind != 6) {
            xfleet.push(format!("Conflicts=u{c}.service"));
        }
        let unit = format!("u{i}.service");
        w = w.unit(&unit, u.desired, &xfleet.join(";"));
        if let Some(m) = u.at {
            w = w
                .entry(&unit, MACHINES[m])
                .state(&unit, MACHINES[m], "active");
        }
    }
    w.drain("m0", parallel)
}

/// One step of every agent: a copy with an entry starts (activating, then active), a copy
/// without one stops (deactivating, then its state is withdrawn). Whether anything changed.
fn agents_step(w: &mut World) -> bool {
    let mut changed = false;
    let units: Vec<UnitName> = w.snap.units.keys().cloned().collect();
    for unit in &units {
        for m in MACHINES {
            let machine = mid(m);
            let entry = w
                .snap
                .schedule
                .get(unit)
                .is_some_and(|es| es.contains_key(&machine));
            let state = w
                .snap
                .states
                .get(unit)
                .and_then(|s| s.get(&machine))
                .map(|s| s.systemd.active.clone());
            let next = match (entry, state.as_deref()) {
                (true, None) => Some("activating"),
                (true, Some("activating" | "deactivating")) => Some("active"),
                (false, Some("active" | "activating")) => Some("deactivating"),
                (false, Some(_)) => None,
                (true, Some(_)) | (false, None) => continue,
            };
            changed = true;
            *w = match next {
                Some(active) => w.clone().state(unit.as_str(), m, active),
                None => w.clone().without_state(unit.as_str(), m),
            };
        }
    }
    changed
}

fn is_global(w: &World, unit: &UnitName) -> bool {
    let hash = w.snap.units[unit].hash();
    Requirements::from_unit(unit, &w.files[&hash]).global
}

/// Machines where a non-global unit has an entry or a copy that may be running.
fn copies(w: &World, unit: &UnitName) -> usize {
    MACHINES
        .iter()
        .filter(|m| {
            let machine = mid(m);
            let entry = w
                .snap
                .schedule
                .get(unit)
                .is_some_and(|es| es.contains_key(&machine));
            let running = w
                .snap
                .states
                .get(unit)
                .and_then(|s| s.get(&machine))
                .is_some_and(|s| s.systemd.active_state().may_be_running());
            entry || running
        })
        .count()
}

use fleet_core::Requirements;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn a_drain_never_runs_two_copies_keeps_globals_and_leaves_nothing_movable(
        units in prop::collection::vec(gen_unit(), 1..8),
        parallel in 1u32..4,
    ) {
        let mut w = world(&units, parallel);
        // Let the cluster settle first without a drain: the generated entries may break rules.
        w = w.undrain("m0");
        for _ in 0..60 {
            let plan = w.plan();
            w.apply(&plan);
            if !agents_step(&mut w) && plan.is_empty() {
                break;
            }
        }
        let globals_before: Vec<UnitName> = w
            .snap
            .schedule
            .iter()
            .filter(|(u, es)| is_global(&w, u) && es.contains_key(&mid("m0")))
            .map(|(u, _)| u.clone())
            .collect();
        w = w.drain("m0", parallel);
        let mut settled = false;
        for _ in 0..200 {
            let plan = w.plan();
            for d in &plan {
                if let DecisionKind::Unschedule { unit, machine, .. } = &d.kind {
                    prop_assert!(
                        !(is_global(&w, unit) && machine.as_str() == "m0"),
                        "global {unit} left the drained machine"
                    );
                }
            }
            w.apply(&plan);
            for unit in w.snap.units.keys().filter(|u| !is_global(&w, u)) {
                prop_assert!(copies(&w, unit) <= 1, "two copies of {unit}: {:?}", w.snap);
            }
            prop_assert!(
                w.snap.moving.len() <= parallel as usize,
                "{} moves on their way, parallel {parallel}",
                w.snap.moving.len()
            );
            let moved = agents_step(&mut w);
            if !moved && plan.is_empty() {
                settled = true;
                break;
            }
        }
        prop_assert!(settled, "the drain never settled: {:?}", w.snap);
        for g in &globals_before {
            prop_assert!(w.snap.schedule[g].contains_key(&mid("m0")), "global {g} kept");
        }
        let none = BTreeSet::new();
        let c = crate::Cluster::new(&w.snap, &w.files, &none);
        for unit in c.units_on(&mid("m0")).filter(|u| !c.is_global(u)) {
            prop_assert!(
                crate::drain::stuck(&c, unit, &mid("m0")).is_some(),
                "{unit} could leave the drained machine but stayed"
            );
            prop_assert!(w.snap.unscheduled.contains_key(unit), "{unit} stays without a reason");
        }
    }
}
