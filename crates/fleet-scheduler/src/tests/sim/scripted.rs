//! Scripted histories of the simulation, each a documented limit or a bug found once.

use super::*;

/// `unit` gets `desired` and the `[X-Fleet]` lines `xfleet` (a new file).
fn set(sim: &mut Sim, unit: &str, desired: DesiredState, xfleet: &str) {
    sim.w = std::mem::take(&mut sim.w).unit_version(unit, desired, xfleet, 1);
}

/// What the engine and the agents did, one line each, and the first pair of copies found.
fn two_copies(sim: &Sim) -> Option<String> {
    sim.check_one_copy().err().map(|e| e.to_string())
}

/// `fleetctl drain` (here: a new `MachineID=`) moves `a` off m1 while it runs; its stop is
/// slow; m1's fleetd dies before it is over. The engine must not start `a` on m2 before m1's
/// fence has stopped the copy, though m1's states went with its lease.
#[test]
fn a_unit_that_left_a_vanished_machine_waits_for_its_fence() {
    let mut sim = Sim::of(two_machines().unit("a.service", Launched, ""));
    let (m1, m2) = (mid("m1"), mid("m2"));
    sim.tick();
    sim.engine();
    assert_eq!(sim.w.placement()["a.service"], ["m1"]);
    sim.act(&m1).unwrap();
    sim.publish(&m1);
    set(&mut sim, "a.service", Launched, "MachineID=m2");
    sim.tick();
    sim.engine();
    assert!(sim.w.snap.schedule.is_empty(), "waits for the copy on m1");
    sim.act(&m1).unwrap();
    sim.publish(&m1);
    sim.vanish(&m1);
    for _ in 0..5 {
        sim.tick();
        sim.engine();
        let _ = sim.act(&m2);
        assert_eq!(two_copies(&sim), None);
    }
    assert_eq!(sim.w.placement()["a.service"], ["m2"]);
    assert!(sim.w.snap.left.is_empty());
}

/// m1's agent starts `a` and has not published it yet when `a` leaves m1 (here: unloaded);
/// it publishes the copy after. Started again, pinned to m2, `a` must wait for that copy.
#[test]
fn a_copy_published_after_its_unit_left_holds_the_unit_back() {
    let mut sim = Sim::of(two_machines().unit("a.service", Launched, ""));
    let (m1, m2) = (mid("m1"), mid("m2"));
    sim.tick();
    sim.engine();
    sim.act(&m1).unwrap();
    set(&mut sim, "a.service", Inactive, "");
    sim.tick();
    sim.engine();
    assert!(sim.w.snap.schedule.is_empty());
    sim.publish(&m1);
    set(&mut sim, "a.service", Launched, "MachineID=m2");
    sim.tick();
    sim.engine();
    sim.act(&m2).unwrap();
    assert_eq!(two_copies(&sim), None);
    assert_eq!(sim.w.waiting(), ["a.service"]);
    for _ in 0..3 {
        sim.tick();
        sim.engine();
        for m in [&m1, &m2] {
            sim.act(m).unwrap();
            sim.publish(m);
        }
    }
    assert_eq!(sim.w.placement()["a.service"], ["m2"]);
    assert!(sim.w.snap.left.is_empty());
}

/// The same with a state from before the start: `a` was loaded only (m1 published it
/// `inactive`), then started, and moved before m1 published the start.
#[test]
fn a_copy_started_after_its_last_published_state_holds_the_unit_back() {
    let mut sim = Sim::of(two_machines().unit("a.service", Loaded, ""));
    let (m1, m2) = (mid("m1"), mid("m2"));
    sim.tick();
    sim.engine();
    sim.act(&m1).unwrap();
    sim.publish(&m1);
    assert_eq!(
        sim.w.snap.states[&name("a.service")][&m1].systemd.active,
        "inactive"
    );
    set(&mut sim, "a.service", Launched, "");
    sim.tick();
    sim.engine();
    sim.act(&m1).unwrap();
    set(&mut sim, "a.service", Inactive, "");
    sim.tick();
    sim.engine();
    assert!(sim.w.snap.schedule.is_empty());
    sim.publish(&m1);
    set(&mut sim, "a.service", Launched, "MachineID=m2");
    sim.tick();
    sim.engine();
    sim.act(&m2).unwrap();
    assert_eq!(two_copies(&sim), None);
    assert_eq!(sim.w.waiting(), ["a.service"]);
}
