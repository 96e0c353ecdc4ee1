use super::*;
use fleet_core::UnitFile;

fn keys() -> Keys {
    Keys::new("/p")
}

fn every_key() -> Vec<Key> {
    let (m, u): (MachineId, UnitName) = ("m1".parse().unwrap(), "a.service".parse().unwrap());
    let hash = UnitFile::parse(b"[Service]\nExecStart=/bin/true\n")
        .unwrap()
        .hash();
    vec![
        Key::Unit(u.clone()),
        Key::File(hash),
        Key::FileRef {
            hash,
            unit: u.clone(),
        },
        Key::Schedule {
            machine: m.clone(),
            unit: u.clone(),
        },
        Key::Machine(m.clone()),
        Key::State {
            machine: m,
            unit: u.clone(),
        },
        Key::Leader,
        Key::Disruption,
        Key::Unscheduled(u.clone()),
        Key::Drain("m3".parse().unwrap()),
        Key::Migrating("m4".parse().unwrap()),
        Key::Moving(u.clone()),
        Key::Placement {
            unit: u.clone(),
            machine: "m4".parse().unwrap(),
        },
        Key::Left {
            unit: u,
            machine: "m5".parse().unwrap(),
        },
        Key::Metadata {
            machine: "m2".parse().unwrap(),
            key: "tier".parse().unwrap(),
        },
        Key::Event {
            source: EventSource::User,
            subject: EventSubject::Unit("a.service".parse().unwrap()),
            stamp: EventStamp {
                micros: 1_764_000_000_000_000,
                nonce: 0xabc,
            },
        },
        Key::Event {
            source: EventSource::Machine("m6".parse().unwrap()),
            subject: EventSubject::Machine("m7".parse().unwrap()),
            stamp: EventStamp {
                micros: 1,
                nonce: 0,
            },
        },
        Key::Event {
            source: EventSource::Engine,
            subject: EventSubject::Cluster,
            stamp: EventStamp {
                micros: u64::MAX,
                nonce: u64::MAX,
            },
        },
    ]
}

#[test]
fn every_built_key_parses_back_to_what_built_it() {
    let k = keys();
    for key in every_key() {
        let built = key.build(&k);
        assert_eq!(Key::parse(&k, &built), Some(key.clone()), "{built}");
        assert_eq!(k.kind(&built), Some(key.kind()), "{built}");
    }
}

#[test]
fn the_builders_and_the_parser_agree_on_the_schema() {
    let k = keys();
    let (m, u): (MachineId, UnitName) = ("m1".parse().unwrap(), "a.service".parse().unwrap());
    assert_eq!(k.unit(&u), "/p/unit/a.service");
    assert_eq!(k.schedule(&m, &u), "/p/schedule/m1/a.service");
    assert_eq!(k.state(&m, &u), "/p/unit-state/m1/a.service");
    assert_eq!(k.machine_states(&m), "/p/unit-state/m1/");
    assert_eq!(k.left(&u, &m), "/p/left/a.service/m1");
    assert_eq!(k.migrating(&m), "/p/migrating/m1");
    assert!(k.left(&u, &m).starts_with(&k.lefts()));
    assert_eq!(
        Key::parse(&k, &k.schedule(&m, &u)),
        Some(Key::Schedule {
            machine: m.clone(),
            unit: u.clone()
        })
    );
    assert_eq!(
        Key::parse(&k, &k.state(&m, &u)),
        Some(Key::State {
            machine: m.clone(),
            unit: u.clone()
        })
    );
    // The old layout names nothing (it is not read any more).
    assert_eq!(Key::parse(&k, &k.legacy_state(&u, &m)), None);
    assert_eq!(k.kind(&k.legacy_state(&u, &m)), None);
}

#[test]
fn a_key_whose_parts_do_not_parse_names_nothing_but_keeps_its_kind() {
    let k = keys();
    for (key, kind) in [
        ("/p/unit/bad name", Some(Kind::Unit)),
        ("/p/unit/", Some(Kind::Unit)),
        ("/p/machine/a/b", Some(Kind::Machine)),
        ("/p/schedule/m1", Some(Kind::Schedule)),
        ("/p/schedule/m1/not a unit", Some(Kind::Schedule)),
        ("/p/unit-state/m1", Some(Kind::State)),
        ("/p/unit-state/a.service/not a machine", Some(Kind::State)),
        ("/p/file-ref/nothex/a.service", Some(Kind::FileRef)),
        ("/p/engine/other", Some(Kind::Engine)),
        ("/p/left/a.service", Some(Kind::Left)),
        ("/p/drain/a/b", Some(Kind::Drain)),
        ("/p/migrating/a/b", Some(Kind::Migrating)),
        ("/p/moving/not a unit", Some(Kind::Moving)),
        ("/p/event/user/unit/a.service/1-2", Some(Kind::Event)),
        (
            "/p/event/other/cluster/00000000000000000001-0000000000000000",
            Some(Kind::Event),
        ),
        (
            "/p/event/engine/unit/a.service/00000000000000000001-+000000000000000",
            Some(Kind::Event),
        ),
        ("/p/unit", None),
        ("/p/other/a.service", None),
        ("/q/unit/a.service", None),
    ] {
        assert_eq!(Key::parse(&k, key), None, "{key}");
        assert_eq!(k.kind(key), kind, "{key}");
    }
}

/// Issue 41: each writer's events are one prefix (one etcd permission), and within one
/// writer and subject, key order is time order.
#[test]
fn event_keys_group_by_writer_then_subject_then_time() {
    let k = keys();
    let u: UnitName = "a.service".parse().unwrap();
    let m1: MachineId = "m1".parse().unwrap();
    let at = |micros| EventStamp { micros, nonce: 7 };
    let key = k.event(
        &EventSource::Machine(m1.clone()),
        &EventSubject::Unit(u.clone()),
        at(5),
    );
    assert_eq!(
        key,
        "/p/event/machine/m1/unit/a.service/00000000000000000005-0000000000000007"
    );
    assert!(key.starts_with(&k.source_events(&EventSource::Machine(m1))));
    assert!(!key.starts_with(&k.source_events(&EventSource::Machine("m".parse().unwrap()))));
    assert!(key.starts_with(&k.events()));
    let early = k.event(&EventSource::User, &EventSubject::Unit(u.clone()), at(9));
    let late = k.event(&EventSource::User, &EventSubject::Unit(u), at(10));
    assert!(early < late);
}
