//! The router driven end to end over the in-memory registry: every status code and error
//! entity, pagination, and what each `PUT` writes (or, refused, does not).

use axum::Router;
use axum::body::Body;
use fleet_core::{DesiredState, MachineInfo, UnitFile, UnitHash, UnitName};
use fleet_registry::kv::MemKv;
use fleet_registry::{Registry, ScheduleEntry, UnitsRole};
use fleet_testing::machine_running;
use http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::time::Duration;
use tower::ServiceExt;

use crate::{Api, router};

const VERSION: &str = "9.9.9";

struct Fixture {
    registry: Registry<MemKv>,
    router: Router,
}

fn fixture(token_limit: u16) -> (Fixture, MemKv) {
    let kv = MemKv::new();
    let registry = Registry::new(kv.clone(), "/fleet/");
    let router = router(Api::new(registry.clone(), token_limit, VERSION));
    (Fixture { registry, router }, kv)
}

/// A response as a test reads it.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    content_type: Option<String>,
    server: Option<String>,
    body: Value,
}

impl Fixture {
    async fn send(&self, req: Request<Body>) -> Answer {
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let header = |h| {
            resp.headers()
                .get(h)
                .map(|v: &http::HeaderValue| v.to_str().unwrap().to_owned())
        };
        let content_type = header(header::CONTENT_TYPE);
        let server = header(header::SERVER);
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        Answer {
            status,
            content_type,
            server,
            body,
        }
    }

    async fn request(&self, method: Method, path: &str) -> Answer {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        self.send(req).await
    }

    async fn get(&self, path: &str) -> Answer {
        self.request(Method::GET, path).await
    }

    async fn put(&self, path: &str, body: Value) -> Answer {
        self.with_json(Method::PUT, path, body).await
    }

    async fn post(&self, path: &str, body: Value) -> Answer {
        self.with_json(Method::POST, path, body).await
    }

    async fn with_json(&self, method: Method, path: &str, body: Value) -> Answer {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        self.send(req).await
    }

    async fn unit(&self, name: &str) -> Option<fleet_registry::Unit> {
        self.registry.unit(&name.parse().unwrap()).await.unwrap()
    }

    async fn revision(&self) -> i64 {
        self.registry.snapshot().await.unwrap().revision
    }
}

fn options(exec: &str) -> Value {
    json!([
        {"section": "Unit", "name": "Description", "value": "test"},
        {"section": "Service", "name": "ExecStart", "value": exec},
    ])
}

pub(crate) fn file(exec: &str) -> UnitFile {
    UnitFile::parse(format!("[Unit]\nDescription=test\n\n[Service]\nExecStart={exec}\n").as_bytes())
        .unwrap()
}

/// The error entity `answer` must be, with a JSON content type.
fn assert_error(answer: &Answer, status: StatusCode, message: &str) {
    assert_eq!(answer.status, status, "{answer:?}");
    assert_eq!(answer.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        answer.body,
        json!({"error": {"code": status.as_u16(), "message": message}}),
        "{answer:?}"
    );
}

#[tokio::test]
async fn every_response_names_the_server_and_version() {
    let (f, _) = fixture(100);
    for path in ["/fleet/v1/units", "/nowhere", "/", "/v1-alpha/machines"] {
        let answer = f.get(path).await;
        assert_eq!(answer.server.as_deref(), Some("fleetd/9.9.9"), "{path}");
    }
}

#[tokio::test]
async fn unknown_paths_are_404_and_roots_are_405() {
    let (f, _) = fixture(100);
    for path in [
        "/nowhere",
        "/fleet/v1/",
        "/fleet/v1/nothing",
        "/fleet/v1/units/",
        "/fleet/v1/units/a/b.service",
        "/fleet/v1/discovery/",
    ] {
        assert_error(&f.get(path).await, StatusCode::NOT_FOUND, "not found");
    }
    for path in ["/", "/fleet/v1", "/v1-alpha"] {
        assert_error(
            &f.get(path).await,
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        );
    }
}

#[tokio::test]
async fn wrong_methods_are_405_naming_the_methods_a_resource_takes() {
    let (f, _) = fixture(100);
    let only_get = "only GET supported against this resource";
    for (method, path, message) in [
        (Method::POST, "/fleet/v1/units", only_get),
        (Method::DELETE, "/fleet/v1/state", only_get),
        (Method::PUT, "/fleet/v1/state/a.service", only_get),
        (
            Method::POST,
            "/fleet/v1/machines",
            "only GET and PATCH supported against this resource",
        ),
        (
            Method::POST,
            "/fleet/v1/units/a.service",
            "only GET, PUT and DELETE supported against this resource",
        ),
    ] {
        let answer = f.request(method.clone(), path).await;
        assert_error(&answer, StatusCode::METHOD_NOT_ALLOWED, message);
    }
    // fleet answers a 400 here, and its clients expect nothing else.
    assert_error(
        &f.request(Method::POST, "/fleet/v1/discovery").await,
        StatusCode::BAD_REQUEST,
        "only HTTP GET supported against this resource",
    );
}

#[tokio::test]
async fn discovery_document_is_served_as_json() {
    let (f, _) = fixture(100);
    let answer = f.get("/fleet/v1/discovery").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.content_type.as_deref(), Some("application/json"));
    assert_eq!(answer.body["kind"], "discovery#restDescription");
    assert_eq!(
        answer.body["resources"]["Units"]["methods"]["Set"]["httpMethod"],
        "PUT"
    );
}

#[tokio::test]
async fn creating_a_unit_answers_201_and_reading_it_back_gives_fleets_entity() {
    let (f, _) = fixture(100);
    let answer = f
        .put(
            "/fleet/v1/units/hello.service",
            json!({"name": "hello.service", "options": options("/bin/true")}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    let unit = f.unit("hello.service").await.unwrap();
    assert_eq!(unit.desired(), DesiredState::Inactive);
    assert_eq!(unit.hash(), file("/bin/true").hash());
    let answer = f.get("/fleet/v1/units/hello.service").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        answer.body,
        json!({"name": "hello.service", "options": options("/bin/true"),
               "desiredState": "inactive", "currentState": "inactive"})
    );
}

#[tokio::test]
async fn a_value_with_continuation_lines_is_stored_as_a_file_holding_them() {
    let (f, _) = fixture(100);
    // As fleetctl parses `ExecStart=/bin/echo a \` then `  b`: the `\` and newline are kept.
    let exec = "/bin/echo a \\\n  b";
    let answer = f
        .put(
            "/fleet/v1/units/hello.service",
            json!({"options": options(exec)}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    let unit = f.unit("hello.service").await.unwrap();
    assert_eq!(unit.hash(), file(exec).hash());
}

#[tokio::test]
async fn a_unit_name_escaped_in_the_path_is_found() {
    let (f, _) = fixture(100);
    let answer = f
        .put(
            "/v1-alpha/units/web%40.service",
            json!({"options": options("/bin/true")}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    assert_eq!(
        f.get("/fleet/v1/units/web%40.service").await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn missing_units_are_404_for_get_and_delete() {
    let (f, _) = fixture(100);
    for method in [Method::GET, Method::DELETE] {
        for path in ["/fleet/v1/units/nope.service", "/fleet/v1/units/not-a-name"] {
            let answer = f.request(method.clone(), path).await;
            assert_error(&answer, StatusCode::NOT_FOUND, "unit does not exist");
        }
    }
    assert_error(
        &f.get("/fleet/v1/state/nope.service").await,
        StatusCode::NOT_FOUND,
        "unit state does not exist",
    );
}

#[tokio::test]
async fn deleting_a_unit_answers_204_and_removes_it() {
    let (f, _) = fixture(100);
    f.put(
        "/fleet/v1/units/a.service",
        json!({"options": options("/bin/true")}),
    )
    .await;
    let answer = f.request(Method::DELETE, "/fleet/v1/units/a.service").await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT);
    assert!(f.unit("a.service").await.is_none());
}

#[tokio::test]
async fn a_body_that_is_not_json_is_415_and_writes_nothing() {
    let (f, _) = fixture(100);
    let body = json!({"options": options("/bin/true")}).to_string();
    let cases: [(Option<&str>, &str); 3] = [
        (None, "expected 1 Content-Type, got 0"),
        (
            Some("text/plain"),
            "only acceptable Content-Type is application/json",
        ),
        (
            Some("application/jsonx"),
            "only acceptable Content-Type is application/json",
        ),
    ];
    for (content_type, message) in cases {
        let mut req = Request::builder()
            .method(Method::PUT)
            .uri("/fleet/v1/units/a.service");
        if let Some(ct) = content_type {
            req = req.header(header::CONTENT_TYPE, ct);
        }
        let answer = f.send(req.body(Body::from(body.clone())).unwrap()).await;
        assert_error(&answer, StatusCode::UNSUPPORTED_MEDIA_TYPE, message);
    }
    let req = Request::builder()
        .method(Method::PUT)
        .uri("/fleet/v1/units/a.service")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.clone()))
        .unwrap();
    assert_error(
        &f.send(req).await,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "expected 1 Content-Type, got 2",
    );
    let req = Request::builder()
        .method(Method::PUT)
        .uri("/fleet/v1/units/a.service")
        .header(header::CONTENT_TYPE, "application/json; charset=utf-8")
        .body(Body::from(body))
        .unwrap();
    assert_eq!(f.send(req).await.status, StatusCode::CREATED);
}

#[tokio::test]
async fn invalid_bodies_names_states_and_options_are_400_and_write_nothing() {
    let (f, _) = fixture(100);
    let before = f.revision().await;
    let req = Request::builder()
        .method(Method::PUT)
        .uri("/fleet/v1/units/a.service")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from("{not json"))
        .unwrap();
    let answer = f.send(req).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    let message = answer.body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("unable to decode body: "), "{message}");

    let cases = [
        (
            "/fleet/v1/units/a.service",
            json!({"name": "b.service", "options": options("/bin/true")}),
            r#"name in URL "a.service" differs from unit name in request body "b.service""#,
        ),
        (
            "/fleet/v1/units/a.nope",
            json!({"options": options("/bin/true")}),
            r#"invalid unit type: "nope""#,
        ),
        (
            "/fleet/v1/units/a.service",
            json!({"options": options("/bin/true"), "desiredState": "running"}),
            r#"invalid state "running": expected inactive, loaded or launched"#,
        ),
        (
            "/fleet/v1/units/a.service",
            json!({"options": [
                {"section": "X-Fleet", "name": "MachineID", "value": "abc"},
                {"section": "X-Fleet", "name": "Global", "value": "true"},
            ]}),
            "MachineID cannot be used with Global",
        ),
        (
            "/fleet/v1/units/a.service",
            json!({"options": [{"section": "Service", "name": "ExecStart", "value": "a\nb"}]}),
            r#"invalid unit options: option "Service.ExecStart" cannot be written in a unit file"#,
        ),
        (
            "/fleet/v1/units/web@.service",
            json!({"options": options("/bin/true"), "desiredState": "launched"}),
            r#"cannot activate template "web@.service""#,
        ),
    ];
    for (path, body, message) in cases {
        assert_error(&f.put(path, body).await, StatusCode::BAD_REQUEST, message);
    }
    assert_eq!(
        f.revision().await,
        before,
        "a refused request wrote something"
    );
}

#[tokio::test]
async fn a_new_unit_without_options_or_a_state_change_without_state_is_409() {
    let (f, _) = fixture(100);
    assert_error(
        &f.put(
            "/fleet/v1/units/a.service",
            json!({"desiredState": "launched"}),
        )
        .await,
        StatusCode::CONFLICT,
        "unit does not exist and options field empty",
    );
    f.put(
        "/fleet/v1/units/a.service",
        json!({"options": options("/bin/true")}),
    )
    .await;
    let before = f.revision().await;
    for body in [json!({}), json!({"options": options("/bin/true")})] {
        assert_error(
            &f.put("/fleet/v1/units/a.service", body).await,
            StatusCode::CONFLICT,
            "must provide DesiredState to update existing unit",
        );
    }
    assert_eq!(f.revision().await, before);
}

#[tokio::test]
async fn setting_the_desired_state_answers_204_and_keeps_the_content() {
    let (f, _) = fixture(100);
    f.put(
        "/fleet/v1/units/a.service",
        json!({"options": options("/bin/true")}),
    )
    .await;
    for body in [
        json!({"name": "a.service", "desiredState": "launched"}),
        json!({"options": options("/bin/true"), "desiredState": "loaded"}),
    ] {
        let desired = body["desiredState"].as_str().unwrap().to_owned();
        let answer = f.put("/fleet/v1/units/a.service", body).await;
        assert_eq!(answer.status, StatusCode::NO_CONTENT, "{answer:?}");
        let unit = f.unit("a.service").await.unwrap();
        assert_eq!(unit.desired().as_str(), desired);
        assert_eq!(unit.hash(), file("/bin/true").hash());
    }
}

#[tokio::test]
async fn a_template_can_be_created_inactive_but_never_activated() {
    let (f, _) = fixture(100);
    let answer = f
        .put(
            "/fleet/v1/units/web@.service",
            json!({"options": options("/bin/true"), "desiredState": "inactive"}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_error(
        &f.put(
            "/fleet/v1/units/web@.service",
            json!({"desiredState": "loaded"}),
        )
        .await,
        StatusCode::BAD_REQUEST,
        r#"cannot activate template "web@.service""#,
    );
}

#[tokio::test]
async fn other_options_in_fleets_form_replace_the_content_and_leave_the_unit_inactive() {
    // fleet's fleetctl sends `start --replace` so, then waits for `inactive` (issue 38).
    let (f, _) = fixture(100);
    f.put(
        "/fleet/v1/units/a.service",
        json!({"options": options("/bin/true"), "desiredState": "launched"}),
    )
    .await;
    let answer = f
        .put(
            "/fleet/v1/units/a.service",
            json!({"options": options("/bin/false")}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    let unit = f.unit("a.service").await.unwrap();
    assert_eq!(unit.hash(), file("/bin/false").hash());
    assert_eq!(unit.desired(), DesiredState::Inactive);
    // The old file is gone with its last reference.
    assert!(
        f.registry
            .file(&file("/bin/true").hash())
            .await
            .unwrap()
            .is_none()
    );
    // A state asked with them is taken as asked.
    for (exec, state, desired) in [
        ("/bin/sleep 1", "launched", DesiredState::Launched),
        ("/bin/sleep 2", "loaded", DesiredState::Loaded),
    ] {
        let answer = f
            .put(
                "/fleet/v1/units/a.service",
                json!({"options": options(exec), "desiredState": state}),
            )
            .await;
        assert_eq!(answer.status, StatusCode::CREATED);
        assert_eq!(f.unit("a.service").await.unwrap().desired(), desired);
    }
}

#[tokio::test]
async fn other_options_in_the_full_view_replace_the_content_and_keep_or_raise_the_state() {
    let (f, _) = fixture(100);
    f.put(
        "/fleet/v1/units/a.service",
        json!({"options": options("/bin/true"), "desiredState": "loaded"}),
    )
    .await;
    let answer = f
        .put(
            "/fleet/v1/units/a.service?view=full",
            json!({"options": options("/bin/false")}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let unit = f.unit("a.service").await.unwrap();
    assert_eq!(unit.hash(), file("/bin/false").hash());
    assert_eq!(
        unit.desired(),
        DesiredState::Loaded,
        "a replace kept the state"
    );
    let answer = f
        .put(
            "/fleet/v1/units/a.service?view=full",
            json!({"options": options("/bin/sleep 1"), "desiredState": "launched"}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        f.unit("a.service").await.unwrap().desired(),
        DesiredState::Launched
    );
}

#[tokio::test]
async fn a_replace_naming_any_replace_parameter_is_ours_whatever_its_value() {
    let (f, _) = fixture(100);
    f.put(
        "/fleet/v1/units/a.service",
        json!({"options": options("/bin/true"), "desiredState": "launched"}),
    )
    .await;
    for (i, query) in ["reschedule=false", "noRestart=0", "rolling=no"]
        .iter()
        .enumerate()
    {
        let answer = f
            .put(
                &format!("/fleet/v1/units/a.service?{query}"),
                json!({"options": options(&format!("/bin/sleep {i}"))}),
            )
            .await;
        assert_eq!(answer.status, StatusCode::CREATED, "{query}: {answer:?}");
        let unit = f.unit("a.service").await.unwrap();
        assert_eq!(unit.desired(), DesiredState::Launched, "{query}");
    }
}

#[tokio::test]
async fn a_replace_in_the_full_view_that_would_lower_the_state_is_409_and_writes_nothing() {
    let (f, _) = fixture(100);
    f.put(
        "/fleet/v1/units/a.service",
        json!({"options": options("/bin/true"), "desiredState": "launched"}),
    )
    .await;
    let before = f.revision().await;
    let answer = f
        .put(
            "/fleet/v1/units/a.service?view=full",
            json!({"options": options("/bin/false"), "desiredState": "inactive"}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CONFLICT, "{answer:?}");
    assert_eq!(
        answer.body["error"]["reason"], "replaceLowers",
        "{answer:?}"
    );
    assert_eq!(f.revision().await, before);
}

#[tokio::test]
async fn an_unreachable_etcd_is_503_with_fleets_message() {
    let (f, kv) = fixture(100);
    kv.set_unavailable(true);
    for answer in [
        f.get("/fleet/v1/units").await,
        f.get("/fleet/v1/machines").await,
        f.get("/fleet/v1/state").await,
        f.get("/fleet/v1/units/a.service").await,
        f.put(
            "/fleet/v1/units/a.service",
            json!({"options": options("/bin/true")}),
        )
        .await,
    ] {
        assert_error(
            &answer,
            StatusCode::SERVICE_UNAVAILABLE,
            "fleet server unable to communicate with etcd",
        );
    }
    kv.set_unavailable(false);
    assert_eq!(f.get("/fleet/v1/units").await.status, StatusCode::OK);
}

/// Follows `nextPageToken` from `path` to the end; every page but the last is full.
async fn collect_pages(f: &Fixture, path: &str, field: &str, limit: usize) -> Vec<Value> {
    let mut items = Vec::new();
    let mut url = path.to_owned();
    loop {
        let answer = f.get(&url).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        let page = answer.body[field].as_array().cloned().unwrap_or_default();
        let Some(token) = answer.body["nextPageToken"].as_str() else {
            assert!(page.len() <= limit);
            items.extend(page);
            return items;
        };
        assert_eq!(page.len(), limit);
        items.extend(page);
        let sep = if path.contains('?') { '&' } else { '?' };
        url = format!("{path}{sep}nextPageToken={token}");
    }
}

#[tokio::test]
async fn units_come_in_pages_of_token_limit_sorted_by_name() {
    let (f, _) = fixture(4);
    for i in (0..10).rev() {
        let name = format!("u{i:02}.service");
        UnitsRole::new(f.registry.clone())
            .create_unit(
                &name.parse().unwrap(),
                &file("/bin/true"),
                DesiredState::Inactive,
            )
            .await
            .unwrap();
    }
    let units = collect_pages(&f, "/fleet/v1/units", "units", 4).await;
    let names: Vec<&str> = units.iter().map(|u| u["name"].as_str().unwrap()).collect();
    let want: Vec<String> = (0..10).map(|i| format!("u{i:02}.service")).collect();
    assert_eq!(names, want);
}

#[tokio::test]
async fn a_token_for_another_limit_or_a_malformed_one_is_400() {
    let (f, _) = fixture(100);
    for path in ["/fleet/v1/units", "/fleet/v1/machines", "/fleet/v1/state"] {
        assert_error(
            &f.get(&format!("{path}?nextPageToken=EwBMLg==")).await,
            StatusCode::BAD_REQUEST,
            "token limit must be 100",
        );
        assert_error(
            &f.get(&format!("{path}?nextPageToken=%%%")).await,
            StatusCode::BAD_REQUEST,
            "page token is not base64url",
        );
        assert_error(
            &f.get(&format!(
                "{path}?nextPageToken=ZAACAA==&nextPageToken=ZAACAA=="
            ))
            .await,
            StatusCode::BAD_REQUEST,
            "too many values for page token",
        );
    }
    // fleet's page 2 token at limit 100 is accepted (and past the end, empty).
    let answer = f.get("/fleet/v1/units?nextPageToken=ZAACAA==").await;
    assert_eq!((answer.status, answer.body), (StatusCode::OK, json!({})));
}

async fn create_units(f: &Fixture, names: &[&str]) {
    for name in names {
        UnitsRole::new(f.registry.clone())
            .create_unit(
                &name.parse().unwrap(),
                &file("/bin/true"),
                DesiredState::Inactive,
            )
            .await
            .unwrap();
    }
}

fn names_of(answer: &Answer) -> Vec<String> {
    answer.body["units"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|u| u["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_listing_in_pages_shows_the_units_as_they_were_at_its_first_page() {
    let (f, _) = fixture(2);
    create_units(&f, &["a.service", "b.service", "c.service", "d.service"]).await;
    let first = f.get("/fleet/v1/units").await;
    assert_eq!(names_of(&first), ["a.service", "b.service"]);
    let token = first.body["nextPageToken"].as_str().unwrap().to_owned();
    create_units(&f, &["bb.service"]).await;
    let second = f
        .get(&format!("/fleet/v1/units?nextPageToken={token}"))
        .await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(names_of(&second), ["c.service", "d.service"]);
    assert_eq!(second.body.get("nextPageToken"), None, "the last page");
    // fleet's own token of page 2 reads the present and skips to it, as fleet did.
    let fleets = f.get("/fleet/v1/units?nextPageToken=AgACAA==").await;
    assert_eq!(names_of(&fleets), ["bb.service", "c.service"]);
    assert_eq!(fleets.body["nextPageToken"], "AgADAA==");
}

#[tokio::test]
async fn a_page_whose_revision_was_compacted_goes_on_from_its_cursor_at_the_present() {
    let (f, kv) = fixture(2);
    create_units(&f, &["a.service", "b.service", "c.service"]).await;
    let first = f.get("/fleet/v1/units").await;
    let token = first.body["nextPageToken"].as_str().unwrap().to_owned();
    create_units(&f, &["bb.service"]).await;
    let now = f.registry.snapshot().await.unwrap().revision;
    kv.compact(now).unwrap();
    let second = f
        .get(&format!("/fleet/v1/units?nextPageToken={token}"))
        .await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(names_of(&second), ["bb.service", "c.service"]);
}

#[tokio::test]
async fn a_unit_token_with_a_malformed_cursor_is_400() {
    use crate::page::{Cursor, PageToken, UnitsToken};
    use base64::Engine;
    let (f, _) = fixture(100);
    let token = |revision: i64, after: &str| {
        UnitsToken {
            page: PageToken {
                limit: 100,
                page: 2,
            },
            cursor: Some(Cursor {
                revision,
                after: after.to_owned(),
            }),
        }
        .encode()
    };
    for (token, message) in [
        (
            token(0, "a.service"),
            "page token's revision must be greater than zero",
        ),
        (
            token(3, "a/b"),
            "page token's cursor is not a unit key segment",
        ),
        (
            base64::engine::general_purpose::URL_SAFE.encode([100, 0, 2, 0, 9]),
            "page token must be 4 bytes, or 13 or more with a cursor, got 5",
        ),
    ] {
        assert_error(
            &f.get(&format!("/fleet/v1/units?nextPageToken={token}"))
                .await,
            StatusCode::BAD_REQUEST,
            message,
        );
    }
    // A cursor token is the unit listing's own: the other listings take fleet's only.
    assert_error(
        &f.get(&format!(
            "/fleet/v1/state?nextPageToken={}",
            token(3, "a.service")
        ))
        .await,
        StatusCode::BAD_REQUEST,
        "page token must be 4 bytes, got 21",
    );
}

async fn cluster(f: &Fixture) {
    let hash = file("/bin/true").hash();
    let units: Vec<(UnitName, UnitHash, bool)> = ["a.service", "b.service"]
        .iter()
        .map(|u| (u.parse().unwrap(), hash, true))
        .collect();
    for (id, ip) in [("m1", "10.0.0.1"), ("m2", "10.0.0.2")] {
        let info = MachineInfo {
            id: id.parse().unwrap(),
            public_ip: ip.into(),
            metadata: [("role".to_owned(), id.to_owned())].into(),
            version: VERSION.into(),
            disable_engine: false,
            api: String::new(),
            fence_at: None,
        };
        machine_running(&f.registry, &info, Duration::from_secs(60), &units).await;
    }
}

#[tokio::test(start_paused = true)]
async fn machines_are_listed_with_ip_and_metadata() {
    let (f, _) = fixture(1);
    cluster(&f).await;
    let machines = collect_pages(&f, "/fleet/v1/machines", "machines", 1).await;
    assert_eq!(
        machines,
        vec![
            json!({"id": "m1", "primaryIP": "10.0.0.1", "metadata": {"role": "m1"}}),
            json!({"id": "m2", "primaryIP": "10.0.0.2", "metadata": {"role": "m2"}}),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn states_are_listed_and_filtered_by_machine_and_unit() {
    let (f, _) = fixture(3);
    cluster(&f).await;
    let all = collect_pages(&f, "/fleet/v1/state", "states", 3).await;
    assert_eq!(all.len(), 4);
    assert_eq!(
        all[0],
        json!({"name": "a.service", "hash": file("/bin/true").hash().to_string(),
               "machineID": "m1", "systemdLoadState": "loaded",
               "systemdActiveState": "active", "systemdSubState": "running"})
    );
    let on_m2 = collect_pages(&f, "/fleet/v1/state?machineID=m2", "states", 3).await;
    assert_eq!(on_m2.len(), 2);
    assert!(on_m2.iter().all(|s| s["machineID"] == "m2"));
    let both = collect_pages(
        &f,
        "/fleet/v1/state?machineID=m2&unitName=b.service",
        "states",
        3,
    )
    .await;
    assert_eq!(both.len(), 1);
    assert_eq!(both[0]["name"], "b.service");
    let one = f.get("/fleet/v1/state/b.service").await;
    assert_eq!(
        (one.status, &one.body["machineID"]),
        (StatusCode::OK, &json!("m1"))
    );
}

/// Issue 37, item 4: the whole listing of units is written a chunk at a time, and reads as
/// the same JSON as pages of it: every unit once, in order, across chunk boundaries.
#[tokio::test(start_paused = true)]
async fn a_whole_listing_streams_in_chunks_and_reads_as_every_page_together() {
    let (f, _) = fixture(100);
    let names: Vec<String> = (0..1100).map(|i| format!("u{i:04}.service")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    create_units(&f, &refs).await;
    let whole = f.get("/fleet/v1/units?view=full&pageSize=0").await;
    assert_eq!(whole.status, StatusCode::OK);
    assert_eq!(whole.content_type.as_deref(), Some("application/json"));
    assert_eq!(names_of(&whole), names);
    let first = f.get("/fleet/v1/units?view=full&pageSize=1100").await;
    assert_eq!(whole.body["units"], first.body["units"]);
}

/// The full view's `pageSize=0`: states, machines and units whole, in one page without a
/// token (fleetctl's ask); not with a token, and not in fleet's view, where `pageSize`
/// means nothing.
#[tokio::test(start_paused = true)]
async fn the_full_view_lists_states_machines_and_units_whole_with_page_size_zero() {
    let (f, _) = fixture(1);
    cluster(&f).await;
    let states = f.get("/fleet/v1/state?view=full&pageSize=0").await.body;
    assert_eq!(states["states"].as_array().unwrap().len(), 4);
    assert!(states.get("nextPageToken").is_none(), "{states}");
    let on_m2 = f
        .get("/fleet/v1/state?view=full&pageSize=0&machineID=m2")
        .await
        .body;
    assert_eq!(on_m2["states"].as_array().unwrap().len(), 2);
    let machines = f.get("/fleet/v1/machines?view=full&pageSize=0").await.body;
    assert_eq!(machines["machines"].as_array().unwrap().len(), 2);
    assert!(machines.get("nextPageToken").is_none(), "{machines}");

    let paged = f.get("/fleet/v1/state?view=full&pageSize=1").await.body;
    let token = paged["nextPageToken"].as_str().unwrap();
    assert_error(
        &f.get(&format!(
            "/fleet/v1/state?view=full&pageSize=0&nextPageToken={token}"
        ))
        .await,
        StatusCode::BAD_REQUEST,
        "pageSize 0 (the whole listing) takes no nextPageToken",
    );
    let fleet = f.get("/fleet/v1/state?pageSize=0").await.body;
    assert_eq!(
        fleet["states"].as_array().unwrap().len(),
        1,
        "token_limit 1"
    );
    create_units(&f, &["a.service", "b.service", "c.service"]).await;
    let units = f.get("/fleet/v1/units?view=full&pageSize=0").await;
    assert_eq!(units.status, StatusCode::OK);
    assert_eq!(names_of(&units), ["a.service", "b.service", "c.service"]);
    assert!(
        units.body.get("nextPageToken").is_none(),
        "{:?}",
        units.body
    );
    let named = f
        .get("/fleet/v1/units?view=full&pageSize=0&unitName=b.service&unitName=c.service")
        .await;
    assert_eq!(names_of(&named), ["b.service", "c.service"]);
    assert_error(
        &f.get(&format!(
            "/fleet/v1/units?view=full&pageSize=0&nextPageToken={token}"
        ))
        .await,
        StatusCode::BAD_REQUEST,
        "pageSize 0 (the whole listing) takes no nextPageToken",
    );
}

#[tokio::test(start_paused = true)]
async fn a_scheduled_unit_shows_its_machine_and_current_state() {
    let (f, _) = fixture(100);
    cluster(&f).await;
    let name: UnitName = "a.service".parse().unwrap();
    UnitsRole::new(f.registry.clone())
        .create_unit(&name, &file("/bin/true"), DesiredState::Launched)
        .await
        .unwrap();
    let entry = ScheduleEntry {
        name: name.clone(),
        machine: "m2".parse().unwrap(),
        hash: file("/bin/true").hash(),
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    f.registry.write_schedule(&[entry], &[]).await.unwrap();
    let unit = f.get("/fleet/v1/units/a.service").await.body;
    assert_eq!(unit["machineID"], "m2");
    assert_eq!(unit["currentState"], "launched");
    assert_eq!(unit["desiredState"], "launched");
}

#[tokio::test]
async fn serves_http_on_tcp_and_unix_listeners_until_shutdown() {
    use hyper_util::rt::TokioIo;
    let (f, _) = fixture(100);
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let dir = std::env::temp_dir().join(format!("fleet-api-serve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("api.sock");
    let unix = tokio::net::UnixListener::bind(&path).unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let tcp_task = tokio::spawn(crate::serve(
        crate::Listener::Tcp(tcp),
        f.router.clone(),
        stopped.clone(),
    ));
    let unix_task = tokio::spawn(crate::serve(
        crate::Listener::Unix(unix),
        f.router.clone(),
        stopped,
    ));
    async fn get<S>(stream: S, host: &str) -> (StatusCode, Option<String>)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = Request::get("/fleet/v1/units?alt=json")
            .header(header::HOST, host)
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        let server = resp
            .headers()
            .get(header::SERVER)
            .map(|v| v.to_str().unwrap().to_owned());
        (resp.status(), server)
    }
    let over_tcp = get(tokio::net::TcpStream::connect(addr).await.unwrap(), "x").await;
    let over_unix = get(
        tokio::net::UnixStream::connect(&path).await.unwrap(),
        "domain-sock",
    )
    .await;
    for answer in [over_tcp, over_unix] {
        assert_eq!(answer, (StatusCode::OK, Some("fleetd/9.9.9".to_owned())));
    }
    stop.send(true).unwrap();
    tcp_task.await.unwrap();
    unix_task.await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

impl Fixture {
    /// A PATCH as fleet's functional tests send it: no Content-Type.
    async fn patch(&self, body: Value) -> Answer {
        let req = Request::builder()
            .method(Method::PATCH)
            .uri("/fleet/v1/machines")
            .body(Body::from(body.to_string()))
            .unwrap();
        self.send(req).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_metadata_patch_is_204_and_wins_over_configured_values() {
    let (f, _) = fixture(100);
    cluster(&f).await;
    // fleet's wire form (`Value` capitalised, nested), and its document's plain string.
    let answer = f
        .patch(json!([
            {"op": "add", "path": "/m1/metadata/foo", "Value": {"value": "bar"}},
            {"op": "replace", "path": "/m2/metadata/role", "value": "db"},
            {"op": "add", "path": "/m9/metadata/early", "value": {"value": "bird"}},
        ]))
        .await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT, "{answer:?}");
    assert_eq!(answer.content_type.as_deref(), Some("application/json"));
    let machines = f.get("/fleet/v1/machines").await.body;
    assert_eq!(
        machines["machines"],
        json!([
            {"id": "m1", "primaryIP": "10.0.0.1", "metadata": {"foo": "bar", "role": "m1"}},
            {"id": "m2", "primaryIP": "10.0.0.2", "metadata": {"role": "db"}},
        ])
    );
    let answer = f
        .patch(json!([{"op": "remove", "path": "/m2/metadata/role"}]))
        .await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT);
    let machines = f.get("/fleet/v1/machines").await.body;
    assert_eq!(machines["machines"][1]["metadata"], json!({"role": "m2"}));
    // A machine not registered yet keeps what was set for it.
    let dynamic = f.registry.dynamic_metadata().await.unwrap().items;
    assert_eq!(dynamic[&"m9".parse().unwrap()]["early"], "bird");
}

#[tokio::test]
async fn a_bad_patch_operation_is_400_and_nothing_of_the_patch_is_applied() {
    let (f, _) = fixture(100);
    let good = json!({"op": "add", "path": "/m1/metadata/foo", "value": {"value": "bar"}});
    let before = f.revision().await;
    for (bad, message) in [
        (
            json!({"op": "noop", "path": "/m1/metadata/foo", "value": {"value": "x"}}),
            "invalid op: expect add, remove, or replace",
        ),
        (
            json!({"op": "add", "path": "/m1/foo", "value": {"value": "x"}}),
            "machine metadata path invalid",
        ),
        (
            json!({"op": "add", "path": "/m1/metadata/a=b", "value": {"value": "x"}}),
            "machine metadata path invalid",
        ),
        (
            json!({"op": "add", "path": "/m1/metadata/foo", "value": {"value": ""}}),
            "invalid value: add and replace require a value",
        ),
        (
            json!({"op": "replace", "path": "/m1/metadata/foo"}),
            "invalid value: add and replace require a value",
        ),
        (
            json!({"op": "add", "path": "/m1/metadata/foo", "value": "a\nb"}),
            "invalid value: metadata values are one line of printable text",
        ),
        // Issue 38: 3.85 MB of metadata was etcd's refusal, a 500.
        (
            json!({"op": "add", "path": "/m1/metadata/big", "value": "x".repeat(3_850_000)}),
            "a metadata value of 3850000 bytes, more than the 4096 allowed",
        ),
    ] {
        let answer = f.patch(json!([good.clone(), bad])).await;
        assert_error(&answer, StatusCode::BAD_REQUEST, message);
    }
    let answer = f.patch(json!({"op": "add"})).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        f.revision().await,
        before,
        "a refused patch wrote something"
    );
    let req = Request::builder()
        .method(Method::PATCH)
        .uri("/fleet/v1/machines")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from(json!([good]).to_string()))
        .unwrap();
    assert_eq!(f.send(req).await.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_sends_no_request_is_disconnected() {
    use tokio::io::AsyncReadExt;
    let (f, _) = fixture(100);
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(crate::serve(
        crate::Listener::Tcp(tcp),
        f.router.clone(),
        stopped,
    ));
    let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
    let started = tokio::time::Instant::now();
    let mut rest = Vec::new();
    // Ends (EOF, perhaps after a 408) once the header timeout passes, not before.
    let _ = idle.read_to_end(&mut rest).await;
    assert!(started.elapsed() >= crate::serve::HEADER_TIMEOUT);
}

#[tokio::test]
async fn options_of_interleaved_sections_are_one_unit_file_and_trailing_blanks_are_refused() {
    let (f, _) = fixture(100);
    let interleaved = json!([
        {"section": "Unit", "name": "Description", "value": "test"},
        {"section": "Service", "name": "ExecStart", "value": "/bin/true"},
        {"section": "Unit", "name": "After", "value": "b.service"},
    ]);
    let answer = f
        .put("/fleet/v1/units/a.service", json!({"options": interleaved}))
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    // fleet's hash: options grouped by section, in order of first appearance.
    let grouped = "[Unit]\nDescription=test\nAfter=b.service\n\n[Service]\nExecStart=/bin/true\n";
    let grouped = UnitFile::parse(grouped.as_bytes()).unwrap();
    assert_eq!(f.unit("a.service").await.unwrap().hash(), grouped.hash());
    for value in ["/bin/true ", "/bin/true \\"] {
        let options = json!([{"section": "Service", "name": "ExecStart", "value": value}]);
        let answer = f
            .put("/fleet/v1/units/b.service", json!({"options": options}))
            .await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{value:?}: {answer:?}"
        );
    }
}

mod events;
mod extensions;
mod http_edges;
mod import;
mod inspect;
mod roles;
mod ui;

/// Issue 38, item 9: serde would take a JSON array for a struct; fleet answered 400, and so
/// does this API, writing nothing.
#[tokio::test]
async fn arrays_where_entities_are_objects_are_a_400_and_write_nothing() {
    let (f, _) = fixture(100);
    let unit = json!(["x.service", [{"section": "Service", "name": "ExecStart", "value": "/bin/true"}], "launched"]);
    let answer = f.put("/fleet/v1/units/x.service", unit).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    let nested =
        json!({"desiredState": "launched", "options": [["Service", "ExecStart", "/bin/true"]]});
    let answer = f.put("/fleet/v1/units/x.service", nested).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    assert!(
        answer.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("holds an array where an object belongs"),
        "{answer:?}"
    );
    assert!(f.get("/fleet/v1/units/x.service").await.status == StatusCode::NOT_FOUND);
}

/// Issue 38, item 10: a body past the API's limit is the client's request being too large:
/// 413 with fleet's error entity, not a 400.
#[tokio::test]
async fn a_body_past_the_limit_is_a_413_with_the_error_entity() {
    let (f, _) = fixture(100);
    let big = "x".repeat(5 * 1024 * 1024);
    let answer = f
        .put("/fleet/v1/units/x.service", json!({ "desiredState": big }))
        .await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE, "{answer:?}");
    assert_eq!(
        answer.body["error"]["message"],
        "the request body is larger than 4194304 bytes"
    );
}

/// Issue 38, item 4: a unit record whose file is gone from the registry answered 409
/// "changed concurrently, try again" on every read. It is an error that says what is wrong;
/// `destroy` still removes the unit.
#[tokio::test]
async fn a_unit_whose_file_is_missing_is_reported_as_such_and_destroy_removes_it() {
    use fleet_registry::kv::{Kv, Txn, TxnOp};
    let (f, kv) = fixture(100);
    create_units(&f, &["a.service"]).await;
    let hash = file("/bin/true").hash();
    let delete = Txn {
        compares: vec![],
        success: vec![TxnOp::Delete {
            key: f.registry.keys().file(&hash),
            prefix: false,
        }],
        failure: vec![],
    };
    kv.txn(delete).await.unwrap();
    let answer = f.get("/fleet/v1/units/a.service").await;
    assert_ne!(answer.status, StatusCode::CONFLICT, "{answer:?}");
    let message = answer.body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("is missing from the registry"),
        "{answer:?}"
    );
    let answer = f.request(Method::DELETE, "/fleet/v1/units/a.service").await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT, "{answer:?}");
    assert_eq!(
        f.get("/fleet/v1/units/a.service").await.status,
        StatusCode::NOT_FOUND
    );
}
