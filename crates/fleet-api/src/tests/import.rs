//! `POST /import` (docs/api.md "Import from fleet v1"): an admin's plan is written with its
//! marks and placement; an operator or a viewer is refused and nothing is written; a plan
//! that lies about a file's hash is a 400 that writes nothing; fleetd's own etcd user
//! without the engine's role is a 403 naming that user.

use super::roles::{cert, request, with_roles};
use super::*;
use crate::authz::{CertSubject, Peer};
use fleet_registry::kv::{Kv, Rbac};

const M1: &str = "4dad8cf7a1b24c3e9c0d1e2f3a4b5c6d";
const PATH: &str = "/fleet/v1/import";

fn admin() -> Peer {
    Peer::Certificate(Some(CertSubject {
        common_names: vec!["someone".into()],
        organizations: vec!["ops".into()],
    }))
}

/// A plan of two units, one placed on M1 (which it marks), one left to the engine.
fn plan() -> Value {
    let web = file("/bin/sleep 1");
    let spare = file("/bin/sleep 2");
    json!({
        "marks": [{"machine": M1, "since": 1, "units": 1}],
        "units": [
            {"name": "web.service", "file": web.canonical(), "hash": web.hash().to_string(),
             "desiredState": "launched", "machineIDs": [M1]},
            {"name": "spare.service", "file": spare.canonical(), "hash": spare.hash().to_string(),
             "desiredState": "loaded"},
        ],
    })
}

/// Whether `key` (under the registry's prefix) is in the store.
async fn has_key(kv: &MemKv, key: &str) -> bool {
    !kv.range(key, false, None).await.unwrap().kvs.is_empty()
}

#[tokio::test]
async fn an_admin_imports_units_with_their_machines_after_marking_them() {
    let (f, kv) = with_roles();
    let answer = f
        .send(request(&admin(), Method::POST, PATH, Some(plan())))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    assert_eq!(
        answer.body,
        json!({"results": [{"name": "web.service", "written": true},
                           {"name": "spare.service", "written": true}]})
    );
    let keys = f.registry.keys();
    let m1 = M1.parse().unwrap();
    assert!(has_key(&kv, &keys.migrating(&m1)).await);
    assert!(has_key(&kv, &keys.schedule(&m1, &"web.service".parse().unwrap())).await);
    assert_eq!(
        f.unit("web.service").await.unwrap().hash(),
        file("/bin/sleep 1").hash()
    );
    assert_eq!(
        f.unit("spare.service").await.unwrap().desired(),
        DesiredState::Loaded
    );
    // The same plan again finds the units there: nothing is written over them.
    let before = f.revision().await;
    let again = f
        .send(request(&Peer::Local, Method::POST, PATH, Some(plan())))
        .await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert_eq!(
        again.body["results"][0],
        json!({"name": "web.service", "written": false})
    );
    // Only the marks are rewritten.
    assert_eq!(f.revision().await, before + 1);
}

#[tokio::test]
async fn an_operator_and_a_viewer_are_refused_an_import_and_nothing_is_written() {
    let (f, _kv) = with_roles();
    let before = f.revision().await;
    for (who, role) in [("olga", "operator"), ("bob", "viewer")] {
        let answer = f
            .send(request(&cert(who), Method::POST, PATH, Some(plan())))
            .await;
        assert_error(
            &answer,
            StatusCode::FORBIDDEN,
            &format!("role {role} may not import units from fleet with their machines"),
        );
    }
    assert_eq!(f.revision().await, before);
    assert!(f.unit("web.service").await.is_none());
}

#[tokio::test]
async fn a_plan_whose_hash_is_not_its_files_is_400_and_writes_nothing() {
    let (f, _kv) = with_roles();
    let before = f.revision().await;
    let mut lying = plan();
    lying["units"][1]["hash"] = json!("0".repeat(40));
    let answer = f
        .send(request(&admin(), Method::POST, PATH, Some(lying)))
        .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    let message = answer.body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("invalid import: unit spare.service: its file hashes to"),
        "{message}"
    );
    assert_eq!(f.revision().await, before, "a refused plan wrote");
    // Nor a name or an option ours refuses.
    let mut odd = plan();
    odd["units"][0]["name"] = json!("web");
    let answer = f
        .send(request(&admin(), Method::POST, PATH, Some(odd)))
        .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    assert_eq!(f.revision().await, before);
    let answer = f.send(request(&admin(), Method::GET, PATH, None)).await;
    assert_error(
        &answer,
        StatusCode::METHOD_NOT_ALLOWED,
        "only POST supported against this resource",
    );
}

#[tokio::test]
async fn fleetds_etcd_user_without_the_engines_role_is_a_403_naming_it() {
    let kv = MemKv::new();
    let keys = fleet_registry::Keys::new("/fleet/");
    let roles = vec![
        fleet_registry::rbac::operator(&keys),
        fleet_registry::rbac::machine(&keys, &M1.parse().unwrap()),
    ];
    let confined = Rbac::new(kv.clone(), "fleet-host-m1", roles);
    let router = router(Api::new(Registry::new(confined, "/fleet/"), 100, VERSION));
    let f = Fixture {
        registry: Registry::new(kv.clone(), "/fleet/"),
        router,
    };
    let answer = f
        .send(request(&Peer::Local, Method::POST, PATH, Some(plan())))
        .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{answer:?}");
    let message = answer.body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("fleetd's etcd user 'fleet-host-m1' may not write /fleet/"),
        "{message}"
    );
    assert!(f.unit("web.service").await.is_none());
}
