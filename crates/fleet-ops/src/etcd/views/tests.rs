use super::*;
use fleet_core::{MachineId, SystemdState, UnitHash};
use fleet_registry::{ReplaceState, ScheduleEntry, UnitRecord};

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn machine(s: &str) -> MachineId {
    s.parse().unwrap()
}

fn file() -> UnitFile {
    UnitFile::parse(b"[Service]\nExecStart=/bin/true\n").unwrap()
}

fn unit(n: &str, desired: DesiredState) -> Unit {
    Unit {
        record: UnitRecord {
            name: name(n),
            hash: file().hash(),
            desired,
            restart: 3,
            replace: ReplaceState::default(),
        },
        mod_revision: 1,
    }
}

fn entry(n: &str, m: &str, desired: DesiredState) -> ScheduleEntry {
    ScheduleEntry {
        name: name(n),
        machine: machine(m),
        hash: file().hash(),
        desired,
        restart: 0,
        no_restart: false,
        placement: 0,
    }
}

fn state(n: &str, m: &str, active: &str) -> UnitStateRecord {
    UnitStateRecord {
        name: name(n),
        machine: machine(m),
        hash: Some(UnitHash::of_bytes(b"x")),
        systemd: SystemdState {
            load: "loaded".into(),
            active: active.into(),
            sub: "-".into(),
        },
        drop_ins: vec![],
        restart: 1,
        restart_pending: true,
        restarts: 0,
        since: None,
        exit: None,
    }
}

fn snapshot(entries: &[ScheduleEntry], states: &[UnitStateRecord]) -> Snapshot {
    let mut snap = Snapshot::default();
    for u in ["a.service", "b.service"] {
        snap.units.insert(name(u), unit(u, DesiredState::Launched));
    }
    for e in entries {
        snap.schedule
            .entry(e.name.clone())
            .or_default()
            .insert(e.machine.clone(), e.clone());
    }
    for s in states {
        snap.states
            .entry(s.name.clone())
            .or_default()
            .insert(s.machine.clone(), s.clone());
    }
    snap
}

#[test]
fn current_state_is_launched_only_where_a_machine_told_to_launch_reports_active() {
    let a = name("a.service");
    let none = snapshot(&[], &[state("a.service", "m1", "active")]);
    assert_eq!(
        current_state(&none, &a),
        DesiredState::Inactive,
        "not scheduled"
    );
    let loaded = snapshot(
        &[entry("a.service", "m1", DesiredState::Loaded)],
        &[state("a.service", "m1", "active")],
    );
    assert_eq!(current_state(&loaded, &a), DesiredState::Loaded);
    let launched = snapshot(
        &[
            entry("a.service", "m1", DesiredState::Launched),
            entry("a.service", "m2", DesiredState::Launched),
        ],
        &[
            state("a.service", "m1", "failed"),
            state("a.service", "m2", "active"),
        ],
    );
    assert_eq!(current_state(&launched, &a), DesiredState::Launched);
    let elsewhere = snapshot(
        &[entry("a.service", "m1", DesiredState::Launched)],
        &[state("a.service", "m2", "active")],
    );
    assert_eq!(current_state(&elsewhere, &a), DesiredState::Inactive);
}

#[test]
fn a_status_has_every_scheduled_machine_sorted_the_reason_and_the_generation() {
    let mut snap = snapshot(
        &[
            entry("a.service", "m2", DesiredState::Launched),
            entry("a.service", "m1", DesiredState::Launched),
        ],
        &[],
    );
    snap.unscheduled
        .insert(name("b.service"), "no machine".into());
    let a = status_of(&snap, &snap.units[&name("a.service")]);
    assert_eq!(a.machines, vec![machine("m1"), machine("m2")]);
    assert_eq!((a.unscheduled, a.restart), (None, 3));
    let b = status_of(&snap, &snap.units[&name("b.service")]);
    assert!(b.machines.is_empty());
    assert_eq!(b.unscheduled.as_deref(), Some("no machine"));
}

#[test]
fn a_wait_view_holds_only_the_watched_units_that_exist_and_their_states() {
    let snap = snapshot(
        &[entry("a.service", "m1", DesiredState::Launched)],
        &[
            state("a.service", "m1", "active"),
            state("b.service", "m1", "active"),
        ],
    );
    let names: BTreeSet<UnitName> = [name("a.service"), name("gone.service")].into();
    let view = wait_view(&snap, &names);
    assert_eq!(view.units.keys().collect::<Vec<_>>(), [&name("a.service")]);
    assert_eq!(view.states.keys().collect::<Vec<_>>(), [&name("a.service")]);
    let s = &view.states[&name("a.service")][&machine("m1")];
    assert_eq!((s.restart, s.restart_pending), (1, true));
}

#[test]
fn a_wait_view_from_whole_listings_is_the_one_from_the_snapshot() {
    let snap = snapshot(
        &[entry("a.service", "m1", DesiredState::Launched)],
        &[
            state("a.service", "m1", "active"),
            state("b.service", "m1", "active"),
        ],
    );
    let names: BTreeSet<UnitName> = [name("a.service"), name("gone.service")].into();
    // What the HTTP side reads: every unit, every state, every machine, unpicked.
    let units = snap
        .units
        .values()
        .map(|u| (u.name().clone(), status_of(&snap, u)));
    let states = snap
        .states
        .values()
        .flat_map(|pm| pm.iter().map(|(_, s)| state_view(s)));
    let machines = snap.machines.values().cloned();
    let listed = WaitView::of(&names, units, states, machines);
    assert_eq!(listed, wait_view(&snap, &names));
}

#[test]
fn a_written_view_has_no_placement() {
    let view = written_view(&unit("a.service", DesiredState::Launched), &file());
    assert!(view.status.machines.is_empty());
    assert_eq!(view.current, DesiredState::Inactive);
    assert!(!view.global);
}
