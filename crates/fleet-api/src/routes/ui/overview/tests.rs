use super::*;
use fleet_core::{MachineInfo, UnitFile, UnitName};
use fleet_ops::{StateView, UnitStatus, UnitView};

fn id(s: &str) -> MachineId {
    s.parse().unwrap()
}

fn unit(name: &str, machines: &[&str], desired: DesiredState, why: Option<&str>) -> UnitView {
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/true\n").unwrap();
    UnitView {
        status: UnitStatus {
            name: name.parse::<UnitName>().unwrap(),
            hash: file.hash(),
            desired,
            machines: machines.iter().map(|m| id(m)).collect(),
            unscheduled: why.map(str::to_owned),
            restart: 0,
        },
        file,
        global: false,
        current: DesiredState::Inactive,
    }
}

fn state(name: &str, machine: &str, active: &str) -> StateView {
    StateView {
        name: name.parse().unwrap(),
        machine: id(machine),
        hash: None,
        load: "loaded".into(),
        active: active.into(),
        sub: "x".into(),
        restart: 0,
        restart_pending: false,
        restarts: 0,
        since: None,
        exit: None,
    }
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
    units: UnitListing,
    states: StateListing,
    machines: MachineListing,
    leader: MachineId,
}

fn fixture() -> Fixture {
    let launched = DesiredState::Launched;
    Fixture {
        units: UnitListing {
            units: vec![
                unit("a.service", &["m1"], launched, None),
                unit("b.service", &["m1"], launched, None),
                unit("c.service", &["m2"], launched, None),
                unit("d.service", &["m2"], launched, None),
                unit(
                    "e.service",
                    &[],
                    launched,
                    Some("no machine offers role=db"),
                ),
                unit("f.service", &[], DesiredState::Inactive, None),
            ],
            skipped: vec![],
        },
        states: StateListing {
            states: vec![
                state("a.service", "m1", "active"),
                state("b.service", "m1", "failed"),
                state("c.service", "m2", "activating"),
            ],
            skipped: vec![],
        },
        machines: MachineListing {
            machines: vec![
                machine("m1", "web"),
                machine("m2", "cache"),
                machine("m3", "web"),
            ],
            skipped: vec![],
            notice: None,
            leader_notice: None,
            leader: Some(id("m2")),
            drained: vec![fleet_registry::DrainRecord {
                machine: id("m3"),
                parallel: 1,
                since: 0,
            }],
        },
        leader: id("m2"),
    }
}

fn read(f: &Fixture) -> Read<'_> {
    Read {
        units: &f.units,
        states: &f.states,
        machines: &f.machines,
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
