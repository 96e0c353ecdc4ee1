//! `EtcdKv` and `rbac::Admin` on a real etcd with authentication on (issue 17): logging in
//! lazily, refused credentials, refusals of etcd's RBAC (never failed over, a watch
//! included), token expiry, and idempotent administration.
//!
//! Run with `cargo test -p fleet-registry --features test-etcd --test etcd_auth`.
#![cfg(feature = "test-etcd")]

use std::time::Duration;

use fleet_registry::Keys;
use fleet_registry::kv::{EtcdAuth, EtcdConfig, EtcdKv, Kv, KvError, TlsFiles, Txn, TxnOp};
use fleet_registry::rbac::{self, Access, Admin, Permission, RoleSpec};
use fleet_testing::{TestEtcd, TestEtcdCluster};
use tokio::time::Instant;

fn put(key: &str, value: &str) -> Txn {
    Txn {
        success: vec![TxnOp::Put {
            key: key.to_owned(),
            value: value.as_bytes().to_vec(),
            lease: None,
        }],
        ..Txn::default()
    }
}

/// A role reading and writing `/open/`, and reading `/shown/`.
fn open_role() -> RoleSpec {
    RoleSpec {
        name: "test-open".to_owned(),
        permissions: vec![
            Permission {
                access: Access::ReadWrite,
                key: "/open/".to_owned(),
                prefix: true,
            },
            Permission {
                access: Access::Read,
                key: "/shown/".to_owned(),
                prefix: true,
            },
        ],
    }
}

async fn kv(cfg: &EtcdConfig) -> EtcdKv {
    EtcdKv::connect(cfg).await.expect("a valid config")
}

#[tokio::test]
async fn a_user_reads_and_writes_what_its_roles_allow_and_is_refused_the_rest() {
    let etcd = TestEtcd::start_auth().await;
    let user = kv(&etcd.issue_user("alice", &[open_role()]).await).await;
    user.txn(put("/open/a", "1"))
        .await
        .expect("a permitted write");
    let read = user
        .range("/open/", true, None)
        .await
        .expect("a permitted read");
    assert_eq!(read.kvs.len(), 1);
    user.range("/shown/x", false, None)
        .await
        .expect("a permitted read");

    let err = user.txn(put("/shown/x", "1")).await.unwrap_err();
    assert!(
        matches!(&err, KvError::PermissionDenied { user, what } if user == "alice" && what == "write /shown/x"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "etcd user 'alice' may not write /shown/x (refused by etcd's RBAC: permission denied)"
    );
    assert!(!err.is_transient());
    let err = user.range("/secret/", true, None).await.unwrap_err();
    assert!(
        matches!(&err, KvError::PermissionDenied { what, .. } if what == "read prefix /secret/"),
        "{err:?}"
    );
    // Nothing was written: root reads the key absent.
    let root = etcd.kv().await;
    assert!(
        root.range("/shown/x", false, None)
            .await
            .unwrap()
            .kvs
            .is_empty()
    );
}

#[tokio::test]
async fn a_wrong_password_is_auth_failed_and_not_transient() {
    let etcd = TestEtcd::start_auth().await;
    let mut cfg = etcd.issue_user("bob", &[open_role()]).await;
    cfg.auth = Some(EtcdAuth {
        username: "bob".to_owned(),
        password: "not-his".to_owned(),
    });
    let began = Instant::now();
    let err = kv(&cfg)
        .await
        .range("/open/a", false, None)
        .await
        .unwrap_err();
    assert!(began.elapsed() < Duration::from_secs(2), "{err}");
    assert!(
        matches!(&err, KvError::AuthFailed { user, .. } if user == "bob"),
        "{err:?}"
    );
    assert!(!err.is_transient());
    let text = err.to_string();
    assert!(
        text.starts_with("etcd refused the credentials of user 'bob' (")
            && text.contains("authentication failed"),
        "{text}"
    );
}

#[tokio::test]
async fn a_client_without_credentials_is_told_that_etcd_wants_some() {
    let etcd = TestEtcd::start_auth().await;
    let err = kv(&etcd.anonymous_config())
        .await
        .range("/open/a", false, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, KvError::AuthFailed { user, .. } if user.is_empty()),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("etcd requires a user and password and none is configured"),
        "{err}"
    );
}

#[tokio::test]
async fn connecting_with_credentials_is_lazy_about_a_down_etcd() {
    let cfg = EtcdConfig {
        endpoints: vec!["http://127.0.0.1:9".to_owned()],
        request_timeout: Duration::from_secs(2),
        tls: TlsFiles::default(),
        auth: Some(EtcdAuth {
            username: "carol".to_owned(),
            password: "secret".to_owned(),
        }),
    };
    let kv = EtcdKv::connect(&cfg)
        .await
        .expect("no round trip on connect");
    let err = kv.range("/k", false, None).await.unwrap_err();
    assert!(matches!(err, KvError::Unavailable { .. }), "{err:?}");
    assert!(!format!("{cfg:?}").contains("secret"));
}

#[tokio::test]
async fn credentials_on_an_etcd_without_auth_are_used_anonymously_until_auth_is_on() {
    let etcd = TestEtcd::start().await;
    let cfg = EtcdConfig {
        auth: Some(EtcdAuth {
            username: "root".to_owned(),
            password: "root-secret".to_owned(),
        }),
        ..etcd.config()
    };
    let client = kv(&cfg).await;
    client.txn(put("/k", "1")).await.expect("auth is off");
    Admin::connect(&etcd.config())
        .await
        .unwrap()
        .enable_auth("root-secret")
        .await
        .expect("auth on");
    // The same client, refused as anonymous, logs in and goes on.
    client.txn(put("/k", "2")).await.expect("logged in as root");
    let read = client.range("/k", false, None).await.unwrap();
    assert_eq!(read.kvs[0].value, b"2");
}

#[tokio::test]
async fn a_watch_refused_by_rbac_is_permission_denied_not_a_broken_watch() {
    let etcd = TestEtcd::start_auth().await;
    let user = kv(&etcd.issue_user("dave", &[open_role()]).await).await;
    let err = user.watch("/secret/", true, 1).await.unwrap_err();
    assert!(
        matches!(&err, KvError::PermissionDenied { what, .. } if what == "watch prefix /secret/"),
        "{err:?}"
    );
    user.watch("/open/", true, 1)
        .await
        .expect("a permitted watch");
}

#[tokio::test]
async fn calls_and_watches_after_the_token_expired_log_in_again() {
    let etcd = TestEtcd::start_auth_token_ttl(Duration::from_secs(1)).await;
    let user = kv(&etcd.issue_user("erin", &[open_role()]).await).await;
    user.txn(put("/open/a", "1")).await.expect("logged in");
    // A token unused for its TTL expires; nothing but time shows it (etcd's simple tokens
    // are checked every second or so).
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let mut watch = user
        .watch("/open/", true, 1)
        .await
        .expect("a watch after expiry");
    assert!(watch.rx.recv().await.is_some());
    tokio::time::sleep(Duration::from_millis(3500)).await;
    user.txn(put("/open/a", "2"))
        .await
        .expect("a write after expiry");
    let read = user.range("/open/a", false, None).await.expect("a read");
    assert_eq!(read.kvs[0].value, b"2");
}

#[tokio::test]
async fn a_refusal_is_not_failed_over_and_a_dead_member_is() {
    let mut cluster = TestEtcdCluster::start_auth(3).await;
    let cfg = cluster.issue_user("frank", &[open_role()]).await;
    let user = kv(&cfg).await;
    user.txn(put("/open/a", "1")).await.expect("a write");
    let first = user.current_endpoint().to_owned();
    let err = user.txn(put("/shown/a", "1")).await.unwrap_err();
    assert!(matches!(err, KvError::PermissionDenied { .. }), "{err:?}");
    assert_eq!(user.current_endpoint(), first, "a refusal moved the client");
    let index = cluster
        .endpoints()
        .iter()
        .position(|e| *e == first)
        .unwrap();
    cluster.kill(index);
    // The next member logs this client in on its first call (a read: a write on a member
    // that just died may have been applied, so it is not repeated elsewhere).
    let read = user.range("/open/a", false, None).await.expect("a read");
    assert_eq!(read.kvs[0].value, b"1");
    assert_ne!(user.current_endpoint(), first);
    user.txn(put("/open/a", "2"))
        .await
        .expect("a write on another member");
}

#[tokio::test]
async fn administration_is_idempotent_and_makes_roles_exact() {
    let etcd = TestEtcd::start_auth().await;
    let admin = etcd.admin().await;
    let keys = Keys::new("/p/");
    let viewer = rbac::viewer(&keys);
    let operator = rbac::operator(&keys);
    for _ in 0..2 {
        admin.ensure_role(&viewer).await.expect("viewer role");
        admin.ensure_role(&operator).await.expect("operator role");
        admin
            .ensure_user(
                "gina",
                Some("pw"),
                &[viewer.name.clone(), operator.name.clone()],
            )
            .await
            .expect("user");
    }
    // Fewer permissions and roles than before: the extra ones go.
    let narrowed = RoleSpec {
        permissions: operator.permissions[..2].to_vec(),
        ..operator.clone()
    };
    admin.ensure_role(&narrowed).await.expect("narrowed role");
    admin
        .ensure_user("gina", None, std::slice::from_ref(&operator.name))
        .await
        .expect("narrowed user");
    let users = admin.users().await.expect("users");
    let gina = users
        .iter()
        .find(|u| u.name == "gina")
        .expect("gina listed");
    assert_eq!(gina.roles, vec![operator.name.clone()]);
    // What the narrowed role lost is refused now (only the first unit-writing prefix stays).
    let mut cfg = etcd.config();
    cfg.auth = Some(EtcdAuth {
        username: "gina".to_owned(),
        password: "pw".to_owned(),
    });
    let gina = kv(&cfg).await;
    gina.txn(put(&format!("{}a.service", keys.units()), "x"))
        .await
        .expect("units stay writable");
    let err = gina
        .txn(put(&format!("{}x", keys.files()), "x"))
        .await
        .unwrap_err();
    assert!(matches!(err, KvError::PermissionDenied { .. }), "{err:?}");

    admin.remove_user("gina").await.expect("remove");
    admin.remove_user("gina").await.expect("remove again");
    admin.remove_role(&viewer.name).await.expect("remove role");
    admin
        .remove_role(&viewer.name)
        .await
        .expect("remove role again");
    admin
        .enable_auth(fleet_testing::ROOT_PASSWORD)
        .await
        .expect("enable again");
}

#[tokio::test]
async fn a_user_without_root_cannot_administer_and_is_told_so() {
    let etcd = TestEtcd::start_auth().await;
    let cfg = etcd.issue_user("hank", &[open_role()]).await;
    let admin = Admin::connect(&cfg).await.unwrap();
    // etcd 3.4 lets a user read its own roles, and nothing else of its administration.
    let err = admin
        .ensure_role(&rbac::viewer(&Keys::new("/p/")))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, KvError::PermissionDenied { user, .. } if user == "hank"),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.starts_with("etcd user 'hank' may not ") && text.contains("role fleet-viewer"),
        "{text}"
    );
}

#[tokio::test]
async fn a_restarted_etcd_forgets_its_tokens_and_clients_log_in_again() {
    let mut etcd = TestEtcd::start_auth().await;
    let user = kv(&etcd.issue_user("ivan", &[open_role()]).await).await;
    user.txn(put("/open/a", "1")).await.expect("logged in");
    // Simple tokens live in the member's memory only.
    etcd.restart().await;
    user.txn(put("/open/a", "2"))
        .await
        .expect("a write after the restart");
    let read = user.range("/open/a", false, None).await.expect("a read");
    assert_eq!(read.kvs[0].value, b"2");
}

/// etcd checks a password with bcrypt: at a high cost (or on a busy etcd at its default) a
/// login takes longer than a call's deadline. The login then finishes for the next call
/// rather than being cut and paid for again on every call (issue 43: thousands of fleetds
/// logging in at once never got through).
#[tokio::test]
async fn a_login_slower_than_a_calls_deadline_is_finished_for_the_next_call() {
    let etcd = TestEtcd::start_auth_with_args(&["--bcrypt-cost=14".to_owned()]).await;
    let mut cfg = etcd.issue_user("slow", &[open_role()]).await;
    let admin = kv(&etcd.issue_user("timer", &[open_role()]).await).await;
    let start = Instant::now();
    admin.range("/open/", true, None).await.expect("a login");
    let login = start.elapsed();
    cfg.request_timeout = login / 4;
    let user = kv(&cfg).await;
    let start = Instant::now();
    let mut calls = 0;
    loop {
        calls += 1;
        match user.range("/open/", true, None).await {
            Ok(_) => break,
            Err(e) => assert!(e.is_transient(), "{e:?}"),
        }
        assert!(
            start.elapsed() < login * 10,
            "no call got through in {:?} ({calls} calls; a login takes {login:?})",
            start.elapsed()
        );
    }
    eprintln!(
        "a login took {login:?}; a client with deadlines of {:?} got through after {calls} calls in {:?}",
        cfg.request_timeout,
        start.elapsed()
    );
}
