//! `GET /fleet/v1/events` (issue 41): a viewer reads the events; the writes of a certificate
//! are recorded with its subject, a refused one records nothing; a followed stream yields an
//! event written after it opened; the machine entity says who leads.

use super::*;
use crate::authz::{CertSubject, Peer, Role, Roles, Subject};
use fleet_registry::{EventConfig, EventLog, EventStats, MachineRole};

/// The router with `bob` a viewer and `olga` an operator, recording users' writes.
fn recording() -> (Fixture, EventLog) {
    let registry = Registry::new(MemKv::new(), "/fleet/");
    let roles = Roles::new([
        (Subject::Cn("bob".into()), Role::Viewer),
        (Subject::Cn("olga".into()), Role::Operator),
    ])
    .unwrap();
    let log =
        UnitsRole::new(registry.clone()).event_log(EventConfig::default(), EventStats::default());
    let api = Api::new(registry.clone(), 100, VERSION)
        .with_roles(roles)
        .with_events(log.sink());
    let router = router(api);
    (Fixture { registry, router }, log)
}

fn as_cert(cn: &str, method: Method, path: &str, body: Option<Value>) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(path);
    if body.is_some() {
        builder = builder.header(header::CONTENT_TYPE, "application/json");
    }
    let mut req = builder
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    req.extensions_mut()
        .insert(Peer::Certificate(Some(CertSubject {
            common_names: vec![cn.to_owned()],
            organizations: vec![],
        })));
    req
}

/// The events of `unit` as the viewer reads them, once the writer wrote what it was handed.
async fn viewed(f: &Fixture, unit: &str) -> Vec<Value> {
    for _ in 0..100 {
        let answer = f
            .send(as_cert(
                "bob",
                Method::GET,
                &format!("/fleet/v1/events?unit={unit}"),
                None,
            ))
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        let events = answer.body["events"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if !events.is_empty() {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Vec::new()
}

#[tokio::test]
async fn a_viewer_reads_the_events_of_an_operators_writes_and_its_refused_write_records_none() {
    let (f, _log) = recording();
    let created = f
        .send(as_cert(
            "olga",
            Method::PUT,
            "/fleet/v1/units/a.service",
            Some(json!({"desiredState": "loaded", "options": options("/bin/true")})),
        ))
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let refused = f
        .send(as_cert(
            "bob",
            Method::DELETE,
            "/fleet/v1/units/a.service",
            None,
        ))
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let events = viewed(&f, "a.service").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["kind"], "submitted");
    assert_eq!(events[0]["who"], "CN=olga");
    assert_eq!(events[0]["source"], "user");
    assert_eq!(events[0]["reason"], "desired state loaded");
    let bad = f.get("/fleet/v1/events?since=ten").await;
    assert_error(
        &bad,
        StatusCode::BAD_REQUEST,
        "since must be a number and a unit (s, m, h, d), got \"ten\"",
    );
}

#[tokio::test]
async fn a_followed_stream_yields_an_event_written_after_it_opened() {
    let (f, _log) = recording();
    let req = as_cert(
        "bob",
        Method::GET,
        "/fleet/v1/events?follow=true&unit=b.service",
        None,
    );
    let resp = f.router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers().get(header::CONTENT_TYPE).unwrap(),
        "application/x-ndjson"
    );
    let created = f
        .send(as_cert(
            "olga",
            Method::PUT,
            "/fleet/v1/units/b.service",
            Some(json!({"desiredState": "launched", "options": options("/bin/true")})),
        ))
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let mut body = resp.into_body();
    let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("an event within 5 s")
        .unwrap()
        .unwrap();
    let line = frame.into_data().unwrap();
    assert!(line.ends_with(b"\n"), "{line:?}");
    let event: Value = serde_json::from_slice(&line).unwrap();
    assert_eq!(event["kind"], "submitted");
    assert_eq!(event["unit"], "b.service");
}

#[tokio::test]
async fn the_machine_whose_engine_leads_carries_the_leader_flag() {
    let (f, _log) = recording();
    for id in ["m1", "m2"] {
        let info = fleet_core::MachineInfo {
            id: id.parse().unwrap(),
            public_ip: "10.0.0.1".into(),
            metadata: Default::default(),
            version: "test".into(),
            disable_engine: false,
            api: String::new(),
            fence_at: None,
        };
        MachineRole::new(f.registry.clone(), info.id.clone())
            .register(&info, Duration::from_secs(60), None)
            .await
            .unwrap();
    }
    fleet_registry::EngineRole::new(f.registry.clone())
        .campaign(&"m2".parse().unwrap(), Duration::from_secs(60))
        .await
        .unwrap()
        .expect("m2 leads");
    let answer = f.get("/fleet/v1/machines").await;
    let machines = answer.body["machines"].as_array().unwrap();
    let leaders: Vec<&Value> = machines.iter().filter(|m| m["leader"] == true).collect();
    assert_eq!(leaders.len(), 1, "{machines:?}");
    assert_eq!(leaders[0]["id"], "m2");
    assert!(
        machines
            .iter()
            .any(|m| m["id"] == "m1" && m.get("leader").is_none())
    );
}
