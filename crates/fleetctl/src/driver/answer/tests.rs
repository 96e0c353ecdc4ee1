use super::*;
use fleet_api_wire::wire::{ErrorEntity, Reason};

fn body(code: u16, message: &str, reason: Option<Reason>, detail: &str) -> Vec<u8> {
    serde_json::to_vec(&ErrorBody {
        error: ErrorEntity {
            code,
            message: message.into(),
            reason,
            detail: detail.into(),
        },
    })
    .unwrap()
}

fn shown(status: u16, body: &[u8], unit: Option<&str>) -> String {
    let unit: Option<UnitName> = unit.map(|u| u.parse().unwrap());
    let status = StatusCode::from_u16(status).unwrap();
    error_of(status, body, unit.as_ref()).to_string()
}

#[test]
fn a_reason_rebuilds_the_error_fleetctl_prints_over_etcd() {
    let cases = [
        (404, Reason::NoSuchUnit, "Unit a.service does not exist"),
        (
            409,
            Reason::StopInactive,
            "Unable to stop unit a.service in state inactive",
        ),
        (
            409,
            Reason::RestartInactive,
            "Unable to restart unit a.service in state inactive",
        ),
        (
            400,
            Reason::ActivateTemplate,
            "cannot activate template a.service",
        ),
        (
            409,
            Reason::Conflict,
            "unit a.service was changed concurrently by another client; nothing was written, try again",
        ),
    ];
    for (code, reason, printed) in cases {
        let b = body(code, "fleet's message", Some(reason), "the detail");
        assert_eq!(shown(code, &b, Some("a.service")), printed, "{reason:?}");
    }
}

#[test]
fn a_reason_without_its_own_variant_prints_the_servers_detail() {
    let b = body(
        409,
        "fleet's",
        Some(Reason::ReplaceLowers),
        "can not replace Unit(a.service) ...",
    );
    assert_eq!(
        shown(409, &b, Some("a.service")),
        "can not replace Unit(a.service) ..."
    );
    let b = body(
        503,
        "fleet server unable to communicate with etcd",
        Some(Reason::Registry),
        "",
    );
    assert_eq!(
        shown(503, &b, None),
        "fleet server unable to communicate with etcd"
    );
}

#[test]
fn fleets_own_answers_map_to_the_same_errors_by_status() {
    let b = body(404, "unit does not exist", None, "");
    assert_eq!(
        shown(404, &b, Some("a.service")),
        "Unit a.service does not exist"
    );
    let b = body(400, "invalid unit options: x", None, "");
    assert_eq!(
        shown(400, &b, Some("a.service")),
        "a.service: invalid unit options: x"
    );
    let b = body(404, "not found", None, "");
    assert_eq!(shown(404, &b, None), "not found");
    let b = body(
        409,
        "must provide DesiredState to update existing unit",
        None,
        "",
    );
    assert_eq!(
        shown(409, &b, Some("a.service")),
        "must provide DesiredState to update existing unit"
    );
}

#[test]
fn an_answer_without_an_error_entity_names_its_status() {
    assert_eq!(
        shown(502, b"<html>bad gateway</html>", Some("a.service")),
        "the API answered 502 Bad Gateway without an error entity"
    );
}
