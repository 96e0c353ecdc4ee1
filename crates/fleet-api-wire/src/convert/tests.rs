use super::*;
use fleet_core::{MachineInfo, UnitHash};
use fleet_ops::model::UnitStatus;
use std::collections::BTreeMap;

fn mid(c: char) -> MachineId {
    c.to_string().repeat(32).parse().unwrap()
}

fn file(text: &str) -> UnitFile {
    UnitFile::parse(text.as_bytes()).unwrap()
}

fn view(global: bool) -> UnitView {
    let text = if global {
        "[Service]\nExecStart=/bin/true\n\n[X-Fleet]\nGlobal=true\n"
    } else {
        "[Service]\nExecStart=/bin/true\n"
    };
    let file = file(text);
    UnitView {
        status: UnitStatus {
            name: "a.service".parse().unwrap(),
            hash: file.hash(),
            desired: DesiredState::Launched,
            machines: vec![mid('a'), mid('b')],
            unscheduled: Some("why".into()),
            restart: 4,
        },
        file,
        global,
        current: DesiredState::Loaded,
    }
}

#[test]
fn default_view_of_a_unit_is_fleets_entity() {
    let unit = unit_to_wire(&view(false), false);
    assert_eq!(
        unit,
        wire::Unit {
            name: "a.service".into(),
            options: options_to_wire(&view(false).file),
            desired_state: "launched".into(),
            current_state: "loaded".into(),
            machine_id: mid('a').to_string(),
            ..wire::Unit::default()
        }
    );
    assert_eq!(unit_to_wire(&view(true), false).machine_id, "");
}

#[test]
fn full_view_of_a_unit_round_trips() {
    for global in [false, true] {
        let v = view(global);
        assert_eq!(unit_from_wire(&unit_to_wire(&v, true)).unwrap(), v);
    }
}

/// A state with every field set, the full view's ones too.
fn running_state() -> StateView {
    StateView {
        name: "a.service".parse().unwrap(),
        machine: mid('a'),
        hash: Some(UnitHash::of_bytes(b"x")),
        load: "loaded".into(),
        active: "active".into(),
        sub: "running".into(),
        restart: 2,
        restart_pending: true,
        restarts: 4,
        since: Some(1_764_912_187_123_456),
        exit: Some("exit status 3".into()),
    }
}

#[test]
fn a_borrowed_state_is_written_as_the_owned_entity_is() {
    let state = running_state();
    let variants = [
        state.clone(),
        StateView {
            hash: None,
            restart: 0,
            restart_pending: false,
            restarts: 0,
            since: None,
            exit: None,
            sub: String::new(),
            ..state.clone()
        },
        StateView {
            load: String::new(),
            active: String::new(),
            restart: 7,
            restart_pending: false,
            restarts: 0,
            since: None,
            exit: None,
            ..state
        },
    ];
    for s in &variants {
        for full in [false, true] {
            assert_eq!(
                serde_json::to_string(&state_out(s, full)).unwrap(),
                serde_json::to_string(&state_to_wire(s, full)).unwrap(),
                "{s:?}, full: {full}"
            );
        }
    }
    let owned = wire::UnitStatePage {
        states: variants.iter().map(|s| state_to_wire(s, true)).collect(),
        next_page_token: "t".into(),
        skipped: vec!["x".into()],
    };
    let borrowed = wire::UnitStatePageOut {
        states: variants.iter().map(|s| state_out(s, true)).collect(),
        next_page_token: "t".into(),
        skipped: vec!["x".into()],
    };
    assert_eq!(
        serde_json::to_string(&borrowed).unwrap(),
        serde_json::to_string(&owned).unwrap()
    );
    assert_eq!(
        serde_json::to_string(&wire::UnitStatePageOut::default()).unwrap(),
        serde_json::to_string(&wire::UnitStatePage::default()).unwrap()
    );
}

#[test]
fn full_view_of_a_state_and_a_machine_round_trip() {
    let state = running_state();
    assert_eq!(
        state_from_wire(&state_to_wire(&state, true)).unwrap(),
        state
    );
    let fleet = state_to_wire(&state, false);
    assert_eq!(
        (fleet.restart_generation, fleet.restart_pending),
        (0, false)
    );
    assert_eq!(
        (fleet.restarts, &fleet.since, &fleet.exit),
        (0, &None, &None)
    );
    let full = state_to_wire(&state, true);
    assert_eq!(full.since.as_deref(), Some("2025-12-05T05:23:07.123456Z"));
    let no_hash = StateView {
        hash: None,
        ..state
    };
    assert_eq!(
        state_from_wire(&state_to_wire(&no_hash, true)).unwrap(),
        no_hash
    );
    let machine = MachineInfo {
        id: mid('b'),
        public_ip: "10.0.0.2".into(),
        metadata: BTreeMap::from([("tier".into(), "api".into())]),
        version: "0.1.0".into(),
        disable_engine: true,
        api: String::new(),
        fence_at: None,
    };
    assert_eq!(
        machine_from_wire(&machine_to_wire(&machine, true)).unwrap(),
        machine
    );
    assert_eq!(machine_to_wire(&machine, false).version, "");
}

#[test]
fn write_results_round_trip() {
    let v = view(false);
    for outcome in [
        PutOutcome::Created(v.clone()),
        PutOutcome::Replaced(v.clone()),
        PutOutcome::StateChanged(v.clone()),
        PutOutcome::Unchanged(v.clone()),
    ] {
        assert_eq!(put_from_wire(&put_to_wire(&outcome)).unwrap(), outcome);
    }
    assert_eq!(
        set_state_from_wire(&set_state_to_wire(Some(&v))).unwrap(),
        Some(v.clone())
    );
    assert_eq!(set_state_from_wire(&set_state_to_wire(None)).unwrap(), None);
    for r in [Restarted::Generation(7), Restarted::Launched] {
        assert_eq!(restart_from_wire(&restart_to_wire(r)).unwrap(), r);
    }
    for d in [
        Destroyed::Unit,
        Destroyed::Unreadable("bad json".into()),
        Destroyed::Missing,
    ] {
        assert_eq!(destroyed_from_wire(&destroyed_to_wire(&d)).unwrap(), d);
    }
    assert_eq!(
        rollout_advanced_from_wire(&rollout_advanced_to_wire(&v)).unwrap(),
        v
    );
    assert!(matches!(
        restart_from_wire(&destroyed_to_wire(&Destroyed::Unit)),
        Err(OpsError::Transport { .. })
    ));
}

#[test]
fn errors_with_a_reason_come_back_as_their_variant() {
    let name: UnitName = "a.service".parse().unwrap();
    for e in [
        OpsError::NoSuchUnit(name.clone()),
        OpsError::Conflict(name.clone()),
        OpsError::StopInactive(name.clone()),
        OpsError::RestartInactive(name.clone()),
        OpsError::ActivateTemplate(name.clone()),
        OpsError::NoOptions(name.clone()),
    ] {
        let entity = wire::ErrorEntity {
            code: 409,
            message: "fleet's".into(),
            reason: reason_of(&e),
            detail: e.to_string(),
        };
        let back = error_from_wire(Some(&name), &entity);
        assert_eq!(back.to_string(), e.to_string());
        assert_eq!(reason_of(&back), reason_of(&e));
    }
    let lowers = OpsError::ReplaceLowers {
        name: name.clone(),
        existing: DesiredState::Launched,
        asked: DesiredState::Inactive,
    };
    let entity = wire::ErrorEntity {
        code: 409,
        message: "fleet's".into(),
        reason: reason_of(&lowers),
        detail: lowers.to_string(),
    };
    let back = error_from_wire(Some(&name), &entity);
    assert!(matches!(back, OpsError::Api { code: 409, .. }));
    assert_eq!(back.to_string(), lowers.to_string());
    let fleet = wire::ErrorEntity {
        code: 404,
        message: "not found".into(),
        reason: None,
        detail: String::new(),
    };
    assert_eq!(error_from_wire(None, &fleet).to_string(), "not found");
}
