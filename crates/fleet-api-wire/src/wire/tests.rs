use super::*;
use serde_json::json;

#[test]
fn unit_uses_fleets_field_names_and_leaves_out_empty_ones() {
    let unit = Unit {
        name: "a.service".into(),
        options: vec![UnitOption {
            section: "Service".into(),
            name: "ExecStart".into(),
            value: "/bin/true".into(),
        }],
        desired_state: "launched".into(),
        machine_id: "m1".into(),
        ..Unit::default()
    };
    assert_eq!(
        serde_json::to_value(&unit).unwrap(),
        json!({"name": "a.service", "desiredState": "launched", "machineID": "m1",
               "options": [{"section": "Service", "name": "ExecStart", "value": "/bin/true"}]})
    );
}

#[test]
fn unit_state_and_machine_use_fleets_field_names() {
    let state = UnitState {
        name: "a.service".into(),
        hash: "ab".into(),
        machine_id: "m1".into(),
        systemd_load_state: "loaded".into(),
        systemd_active_state: "active".into(),
        systemd_sub_state: "running".into(),
        ..UnitState::default()
    };
    assert_eq!(
        serde_json::to_value(&state).unwrap(),
        json!({"name": "a.service", "hash": "ab", "machineID": "m1",
               "systemdLoadState": "loaded", "systemdActiveState": "active",
               "systemdSubState": "running"})
    );
    let machine = Machine {
        id: "m1".into(),
        primary_ip: "10.0.0.1".into(),
        metadata: BTreeMap::from([("a".into(), "b".into())]),
        ..Machine::default()
    };
    assert_eq!(
        serde_json::to_value(&machine).unwrap(),
        json!({"id": "m1", "primaryIP": "10.0.0.1", "metadata": {"a": "b"}})
    );
}

#[test]
fn pages_carry_next_page_token_only_when_there_is_more() {
    assert_eq!(
        serde_json::to_value(UnitPage::default()).unwrap(),
        json!({})
    );
    let page = MachinePage {
        next_page_token: "ZAACAA==".into(),
        ..MachinePage::default()
    };
    assert_eq!(
        serde_json::to_value(&page).unwrap(),
        json!({"nextPageToken": "ZAACAA=="})
    );
}

#[test]
fn extension_fields_have_camel_case_names() {
    let unit = Unit {
        name: "a.service".into(),
        hash: "ab".into(),
        machine_ids: vec!["m1".into(), "m2".into()],
        unscheduled_reason: "no machine".into(),
        restart_generation: 2,
        ..Unit::default()
    };
    assert_eq!(
        serde_json::to_value(&unit).unwrap(),
        json!({"name": "a.service", "hash": "ab", "machineIDs": ["m1", "m2"],
               "unscheduledReason": "no machine", "restartGeneration": 2})
    );
    let state = UnitState {
        restart_generation: 1,
        restart_pending: true,
        restarts: 0,
        since: None,
        exit: None,
        ..UnitState::default()
    };
    assert_eq!(
        serde_json::to_value(&state).unwrap(),
        json!({"restartGeneration": 1, "restartPending": true})
    );
    let page = MachinePage {
        machines: vec![Machine {
            id: "m1".into(),
            version: "0.1.0".into(),
            disable_engine: true,
            ..Machine::default()
        }],
        skipped: vec!["bad".into()],
        disruption_notice: "held".into(),
        ..MachinePage::default()
    };
    assert_eq!(
        serde_json::to_value(&page).unwrap(),
        json!({"machines": [{"id": "m1", "version": "0.1.0", "disableEngine": true}],
               "skipped": ["bad"], "disruptionNotice": "held"})
    );
}

#[test]
fn ops_and_outcomes_have_their_query_and_json_names() {
    for op in Op::ALL {
        assert_eq!(Op::parse(op.as_str()), Some(op));
        assert_eq!(serde_json::to_value(op).unwrap(), json!(op.as_str()));
    }
    assert_eq!(Op::parse("Stop"), None);
    let result = WriteResult {
        outcome: Outcome::Restarted,
        unit: None,
        restart_generation: 3,
        detail: String::new(),
    };
    assert_eq!(
        serde_json::to_value(&result).unwrap(),
        json!({"outcome": "restarted", "restartGeneration": 3})
    );
    assert_eq!(
        serde_json::to_value(Outcome::StateChanged).unwrap(),
        json!("stateChanged")
    );
}

#[test]
fn error_entity_is_fleets_unless_it_carries_a_reason() {
    let plain = ErrorBody {
        error: ErrorEntity {
            code: 404,
            message: "unit does not exist".into(),
            reason: None,
            detail: String::new(),
        },
    };
    assert_eq!(
        serde_json::to_value(&plain).unwrap(),
        json!({"error": {"code": 404, "message": "unit does not exist"}})
    );
    let full: ErrorBody = serde_json::from_value(json!({"error": {"code": 409,
        "message": "m", "reason": "stopInactive", "detail": "d"}}))
    .unwrap();
    assert_eq!(full.error.reason, Some(Reason::StopInactive));
    assert_eq!(full.error.detail, "d");
}
