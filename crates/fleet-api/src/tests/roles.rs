//! Roles over the router: a certificate's role decides before any handler runs; a refusal
//! is fleet's error entity (403) naming the role and the action, and writes nothing.

use super::*;
use crate::authz::{CertSubject, Peer, Role, Roles, Subject};

/// The router with `bob` a viewer, `olga` an operator and group `ops` an admin.
pub(super) fn with_roles() -> (Fixture, MemKv) {
    let kv = MemKv::new();
    let registry = Registry::new(kv.clone(), "/fleet/");
    let roles = Roles::new([
        (Subject::Cn("bob".into()), Role::Viewer),
        (Subject::Cn("olga".into()), Role::Operator),
        (Subject::O("ops".into()), Role::Admin),
    ])
    .unwrap();
    let api = Api::new(registry.clone(), 100, VERSION).with_roles(roles);
    (
        Fixture {
            registry,
            router: router(api),
        },
        kv,
    )
}

pub(super) fn cert(cn: &str) -> Peer {
    Peer::Certificate(Some(CertSubject {
        common_names: vec![cn.to_owned()],
        organizations: vec![],
    }))
}

/// A request as `peer` sends it; `body` JSON when given.
pub(super) fn request(
    peer: &Peer,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(path);
    if body.is_some() {
        builder = builder.header(header::CONTENT_TYPE, "application/json");
    }
    let mut req = builder
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    req.extensions_mut().insert(peer.clone());
    req
}

/// Every write the API takes, each with what a viewer's refusal says of it.
fn writes() -> Vec<(Method, &'static str, Option<Value>, &'static str)> {
    vec![
        (
            Method::PUT,
            "/fleet/v1/units/a.service",
            Some(json!({"desiredState": "launched"})),
            "start units",
        ),
        (
            Method::PUT,
            "/fleet/v1/units/b.service",
            Some(json!({"desiredState": "inactive", "options": options("/bin/true")})),
            "submit units",
        ),
        (
            Method::PUT,
            "/fleet/v1/units/a.service?op=stop",
            Some(json!({})),
            "stop units",
        ),
        (
            Method::DELETE,
            "/fleet/v1/units/a.service",
            None,
            "destroy units",
        ),
        (
            Method::PATCH,
            "/fleet/v1/machines",
            Some(json!([{"op": "add", "path": "/m1/metadata/x", "value": "y"}])),
            "change machine metadata",
        ),
        (Method::PUT, "/fleet/v1/drains/m1", None, "drain machines"),
    ]
}

#[tokio::test]
async fn a_viewer_is_refused_every_write_with_a_403_naming_it_and_nothing_is_written() {
    let (f, _kv) = with_roles();
    let created = f
        .send(request(
            &Peer::Local,
            Method::PUT,
            "/fleet/v1/units/a.service",
            Some(json!({"desiredState": "loaded", "options": options("/bin/true")})),
        ))
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let before = f.revision().await;
    let bob = cert("bob");
    for (method, path, body, action) in writes() {
        let answer = f.send(request(&bob, method.clone(), path, body)).await;
        assert_error(
            &answer,
            StatusCode::FORBIDDEN,
            &format!("role viewer may not {action}"),
        );
        assert_eq!(answer.server.as_deref(), Some("fleetd/9.9.9"));
        assert_eq!(f.revision().await, before, "{method} {path} wrote");
    }
    // Not in the full view either, and an unknown route does not tell the viewer more.
    let answer = f
        .send(request(
            &bob,
            Method::DELETE,
            "/fleet/v1/units/a.service?view=full",
            None,
        ))
        .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{answer:?}");
    assert_eq!(f.revision().await, before);
    assert_eq!(
        f.unit("a.service").await.unwrap().desired(),
        DesiredState::Loaded
    );
    // A certificate that no entry names is refused everything, reads too.
    for path in ["/fleet/v1/units", "/fleet/v1/nope", "/metrics"] {
        let answer = f.send(request(&cert("eve"), Method::GET, path, None)).await;
        assert_error(
            &answer,
            StatusCode::FORBIDDEN,
            "certificate CN=eve has no role in fleetd's configuration",
        );
    }
}

#[tokio::test]
async fn a_viewer_reads_and_an_operator_and_an_admin_group_write() {
    let (f, _kv) = with_roles();
    let bob = cert("bob");
    for path in [
        "/fleet/v1/units",
        "/fleet/v1/state",
        "/fleet/v1/machines",
        "/fleet/v1/discovery",
        "/fleet/v1/drains",
    ] {
        let answer = f.send(request(&bob, Method::GET, path, None)).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}: {answer:?}");
    }
    // A viewer's read of what does not exist is the router's 404, not a refusal.
    let answer = f
        .send(request(
            &bob,
            Method::GET,
            "/fleet/v1/units/x.service",
            None,
        ))
        .await;
    assert_error(&answer, StatusCode::NOT_FOUND, "unit does not exist");

    let olga = cert("olga");
    let put = |peer: &Peer, body: Value| {
        request(peer, Method::PUT, "/fleet/v1/units/a.service", Some(body))
    };
    let answer = f
        .send(put(
            &olga,
            json!({"desiredState": "launched", "options": options("/bin/true")}),
        ))
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    let answer = f
        .send(request(
            &olga,
            Method::PUT,
            "/fleet/v1/units/a.service?op=stop",
            Some(json!({})),
        ))
        .await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT, "{answer:?}");
    assert_eq!(
        f.unit("a.service").await.unwrap().desired(),
        DesiredState::Loaded
    );
    let ops_member = Peer::Certificate(Some(CertSubject {
        common_names: vec!["someone".into()],
        organizations: vec!["ops".into()],
    }));
    let answer = f
        .send(request(
            &ops_member,
            Method::DELETE,
            "/fleet/v1/units/a.service",
            None,
        ))
        .await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT, "{answer:?}");
    assert!(f.unit("a.service").await.is_none());
}

#[tokio::test]
async fn etcd_refusing_fleetds_own_user_is_a_403_saying_so() {
    use fleet_ops::OpsError;
    use fleet_registry::RegistryError;
    use fleet_registry::kv::KvError;
    let refused = crate::ApiError::Ops(OpsError::Registry(RegistryError::Kv {
        op: "writing unit",
        cause: KvError::PermissionDenied {
            user: "fleet-host-m1".into(),
            what: "write /fleet/unit/a.service".into(),
        },
    }));
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let resp = refused.response(false);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body,
        json!({"error": {"code": 403, "message":
            "fleetd's etcd user 'fleet-host-m1' may not write /fleet/unit/a.service \
             (refused by etcd's RBAC)"}})
    );
}

/// A machine that last reached etcd `ago` before now.
#[derive(Debug)]
struct ReachedAgo(Duration);

impl crate::health::Reach for ReachedAgo {
    fn reached_within(
        &self,
        within: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>> {
        let reached = self.0 <= within;
        Box::pin(async move { reached })
    }
}

/// Issue 36: a peer fleetd asks with its own API certificate, which no role names; it gets
/// its answer, and nothing else of the API.
#[tokio::test]
async fn any_certificate_asks_whether_this_machine_reaches_etcd_and_nothing_more() {
    let kv = MemKv::new();
    let registry = Registry::new(kv.clone(), "/fleet/");
    let health = crate::health::Health {
        machine: "m1".into(),
        reach: std::sync::Arc::new(ReachedAgo(Duration::from_millis(700))),
    };
    let api = Api::new(registry.clone(), 100, VERSION)
        .with_roles(Roles::new([(Subject::Cn("bob".into()), Role::Viewer)]).unwrap())
        .with_health(health);
    let f = Fixture {
        registry,
        router: router(api),
    };
    let peer = cert("m2 fleetd");
    let ask = |q: &str| request(&peer, Method::GET, &format!("/fleet/v1/health?{q}"), None);
    let a = f.send(ask("within=1000")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body, json!({"machineID": "m1", "etcdReached": true}));
    let a = f.send(ask("within=500")).await;
    assert_eq!(a.body, json!({"machineID": "m1", "etcdReached": false}));
    for bad in ["", "within=0", "within=soon"] {
        let a = f.send(ask(bad)).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let a = f
        .send(request(&peer, Method::GET, "/fleet/v1/units", None))
        .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    // Without a health source (a library caller), there is no such path.
    let (plain, _) = fixture(100);
    assert_eq!(
        plain.get("/fleet/v1/health?within=10").await.status,
        StatusCode::NOT_FOUND
    );
}
