use super::*;
use fleet_core::{MachineInfo, SystemdState, UnitFile, UnitName};
use fleet_registry::{DrainRecord, ScheduleEntry, Unit, UnitRecord, UnitStateRecord};

fn id(s: &str) -> MachineId {
    s.parse().unwrap()
}

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

/// Puts unit `n` in `snap`, scheduled on `machines`, with the engine's reason `why`.
fn unit(snap: &mut Snapshot, n: &str, machines: &[&str], desired: DesiredState, why: Option<&str>) {
    static HASH: std::sync::LazyLock<fleet_core::UnitHash> = std::sync::LazyLock::new(|| {
        UnitFile::parse(b"[Service]\nExecStart=/bin/true\n")
            .unwrap()
            .hash()
    });
    let hash = *HASH;
    let record = UnitRecord {
        name: name(n),
        hash,
        desired,
        restart: 0,
        replace: Default::default(),
    };
    snap.units.insert(
        name(n),
        Unit {
            record,
            mod_revision: 1,
        },
    );
    for m in machines {
        let entry = ScheduleEntry {
            name: name(n),
            machine: id(m),
            hash,
            desired,
            restart: 0,
            no_restart: false,
            placement: 0,
        };
        snap.schedule
            .entry(name(n))
            .or_default()
            .insert(id(m), entry);
    }
    if let Some(why) = why {
        snap.unscheduled.insert(name(n), why.to_owned());
    }
}

fn state(snap: &mut Snapshot, n: &str, machine: &str, active: &str) {
    let record = UnitStateRecord {
        name: name(n),
        machine: id(machine),
        hash: None,
        systemd: SystemdState {
            load: "loaded".into(),
            active: active.into(),
            sub: "x".into(),
        },
        drop_ins: vec![],
        restart: 0,
        restart_pending: false,
        restarts: 0,
        since: None,
        exit: None,
    };
    snap.states
        .entry(name(n))
        .or_default()
        .insert(id(machine), record);
}

fn machine(m: &str, role: &str) -> MachineInfo {
    MachineInfo {
        id: id(m),
        public_ip: format!("10.0.0.{}", &m[1..]),
        metadata: BTreeMap::from([("role".to_owned(), role.to_owned())]),
        version: String::new(),
        disable_engine: false,
        api: String::new(),
        fence_at: None,
    }
}

struct Fixture {
    snap: Snapshot,
    leader: MachineId,
}

fn fixture() -> Fixture {
    let launched = DesiredState::Launched;
    let mut snap = Snapshot::default();
    unit(&mut snap, "a.service", &["m1"], launched, None);
    unit(&mut snap, "b.service", &["m1"], launched, None);
    unit(&mut snap, "c.service", &["m2"], launched, None);
    unit(&mut snap, "d.service", &["m2"], launched, None);
    unit(
        &mut snap,
        "e.service",
        &[],
        launched,
        Some("no machine offers role=db"),
    );
    unit(&mut snap, "f.service", &[], DesiredState::Inactive, None);
    state(&mut snap, "a.service", "m1", "active");
    state(&mut snap, "b.service", "m1", "failed");
    state(&mut snap, "c.service", "m2", "activating");
    for (m, role) in [("m1", "web"), ("m2", "cache"), ("m3", "web")] {
        snap.machines.insert(id(m), machine(m, role));
    }
    let drain = DrainRecord {
        machine: id("m3"),
        parallel: 1,
        since: 0,
    };
    snap.drained.insert(id("m3"), drain);
    Fixture {
        snap,
        leader: id("m2"),
    }
}

fn read(f: &Fixture) -> Read<'_> {
    Read {
        snap: &f.snap,
        leader: Some(&f.leader),
    }
}

#[test]
fn every_scheduled_unit_is_a_chip_coloured_by_its_published_state_and_counted() {
    let f = fixture();
    let o = overview(&read(&f), &Ask::default());
    let shades: Vec<(&str, &str, Shade)> = o
        .machines
        .iter()
        .flat_map(|m| {
            m.units
                .iter()
                .map(move |c| (m.id.as_str(), c.name.as_str(), c.shade))
        })
        .collect();
    assert_eq!(
        shades,
        [
            ("m1", "a.service", Shade::Active),
            ("m1", "b.service", Shade::Failed),
            ("m2", "c.service", Shade::Activating),
            ("m2", "d.service", Shade::Inactive),
        ]
    );
    let c = &o.counts;
    assert_eq!(
        (
            c.machines,
            c.units,
            c.active,
            c.activating,
            c.failed,
            c.inactive,
            c.unscheduled
        ),
        (3, 6, 1, 1, 1, 1, 1)
    );
    assert_eq!(
        o.unscheduled,
        [Unscheduled {
            name: "e.service".into(),
            reason: "no machine offers role=db".into()
        }],
        "a unit meant to be inactive is not waiting for a machine"
    );
    let flags: Vec<(bool, bool)> = o.machines.iter().map(|m| (m.leader, m.drained)).collect();
    assert_eq!(flags, [(false, false), (true, false), (false, true)]);
}

#[test]
fn the_filter_keeps_matching_machines_whole_and_otherwise_only_matching_units() {
    let f = fixture();
    let ask = |filter: &str| Ask {
        filter: filter.into(),
        ..Ask::default()
    };
    let ids = |o: &Overview| o.machines.iter().map(|m| m.id.clone()).collect::<Vec<_>>();
    let web = overview(&read(&f), &ask("role=web"));
    assert_eq!(ids(&web), ["m1", "m3"]);
    assert_eq!(web.machines[0].units.len(), 2);
    let one = overview(&read(&f), &ask("c.serv"));
    assert_eq!(ids(&one), ["m2"]);
    assert_eq!(one.machines[0].units.len(), 1, "only the matching unit");
    assert_eq!(one.counts.units, 6, "the counts stay the cluster's");
}

#[test]
fn a_page_holds_at_most_its_size_and_a_page_past_the_end_is_the_last() {
    let f = fixture();
    let ask = |page, per_page| Ask {
        page,
        per_page,
        filter: String::new(),
    };
    let first = overview(&read(&f), &ask(0, 2));
    assert_eq!((first.page, first.pages, first.machines.len()), (0, 2, 2));
    let past = overview(&read(&f), &ask(9, 2));
    assert_eq!((past.page, past.machines.len()), (1, 1));
    assert_eq!(past.machines[0].id, "m3");
    assert_eq!(overview(&read(&f), &ask(0, 10_000)).per_page, MAX_PER_PAGE);
}

/// Issue 42's size: 5,000 machines and 100,000 units. The answer holds one page of cards,
/// and only their units become chips; the counts are the cluster's.
#[test]
fn a_cluster_of_100_000_units_answers_one_page_with_the_clusters_counts() {
    let mut snap = Snapshot::default();
    let machines: Vec<String> = (0..5_000).map(|i| format!("m{i:04}")).collect();
    for m in &machines {
        snap.machines.insert(id(m), machine(m, "web"));
    }
    for i in 0..100_000 {
        let n = format!("u{i:06}.service");
        let on = &machines[i % machines.len()];
        unit(&mut snap, &n, &[on], DesiredState::Launched, None);
        if i % 10 != 0 {
            state(&mut snap, &n, on, "active");
        }
    }
    let began = std::time::Instant::now();
    let o = overview(
        &Read {
            snap: &snap,
            leader: None,
        },
        &Ask::default(),
    );
    eprintln!(
        "the overview of 100,000 units took {:?} (debug build)",
        began.elapsed()
    );
    assert_eq!((o.counts.machines, o.counts.units), (5_000, 100_000));
    assert_eq!((o.counts.active, o.counts.inactive), (90_000, 10_000));
    assert_eq!((o.machines.len(), o.pages), (PER_PAGE, 100));
    let chips: usize = o.machines.iter().map(|m| m.units.len()).sum();
    assert_eq!(chips, PER_PAGE * 20, "only the page's units");
}
