//! The TLS side of [`EtcdKv`] against a real etcd requiring client certificates: what
//! promise 6 of `docs/guarantees.md` rests on. And a server started on a copy of another's
//! data (the benchmark's etcd users, made once).

use super::*;
use fleet_registry::kv::KvError;

fn loopback() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

/// A read with `tls` against `etcd`'s endpoint.
async fn read_with(etcd: &TestEtcd, tls: TlsFiles) -> Result<(), KvError> {
    let cfg = EtcdConfig {
        request_timeout: Duration::from_secs(2),
        tls,
        auth: None,
        ..etcd.config()
    };
    let kv = EtcdKv::connect(&cfg).await?;
    kv.range("k", false, None).await.map(drop)
}

#[tokio::test]
async fn a_client_with_the_servers_ca_and_its_own_certificate_reads_and_writes() {
    let certs = TestCerts::generate(&[loopback()]);
    let etcd = TestEtcd::start_tls(&certs, loopback()).await;
    assert!(etcd.endpoint().starts_with("https://127.0.0.1:"));
    let kv = etcd.kv().await;
    let put = fleet_registry::kv::Txn {
        success: vec![fleet_registry::kv::TxnOp::Put {
            key: "k".into(),
            value: b"v".to_vec(),
            lease: None,
        }],
        ..Default::default()
    };
    kv.txn(put).await.expect("a write over TLS");
    let got = kv.range("k", false, None).await.expect("a read over TLS");
    assert_eq!(got.kvs[0].value, b"v");
}

#[tokio::test]
async fn a_client_trusting_another_ca_refuses_the_server_and_says_why() {
    let certs = TestCerts::generate(&[loopback()]);
    let etcd = TestEtcd::start_tls(&certs, loopback()).await;
    let tls = TlsFiles {
        ca_file: Some(certs.wrong_ca()),
        ..certs.client_files()
    };
    let err = read_with(&etcd, tls).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("invalid peer certificate") && text.contains("UnknownIssuer"),
        "{text}"
    );
    assert!(text.contains(&etcd.endpoint()), "{text}");
}

#[tokio::test]
async fn a_server_certificate_for_another_name_is_refused() {
    // Valid for 127.0.0.1 only; reached as ::ffff:127.0.0.1, the same server under
    // another name. (Not `localhost`: a bare Debian without /etc/hosts cannot resolve it.)
    let certs = TestCerts::generate(&[loopback()]);
    let etcd = TestEtcd::start_tls(&certs, loopback()).await;
    let cfg = EtcdConfig {
        endpoints: vec![etcd.endpoint().replace("127.0.0.1", "[::ffff:127.0.0.1]")],
        request_timeout: Duration::from_secs(2),
        tls: certs.client_files(),
        auth: None,
    };
    let kv = EtcdKv::connect(&cfg).await.unwrap();
    let err = kv.range("k", false, None).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("certificate not valid for name"), "{text}");
}

#[tokio::test]
async fn the_server_refuses_a_client_without_a_certificate_of_its_ca() {
    let certs = TestCerts::generate(&[loopback()]);
    let etcd = TestEtcd::start_tls(&certs, loopback()).await;
    let none = TlsFiles {
        ca_file: Some(certs.ca()),
        cert_file: None,
        key_file: None,
    };
    let err = read_with(&etcd, none).await.unwrap_err().to_string();
    assert!(
        err.contains("no TLS client certificate is configured"),
        "{err}"
    );
    let other = TlsFiles {
        ca_file: Some(certs.ca()),
        cert_file: Some(certs.wrong_client_cert()),
        key_file: Some(certs.wrong_client_key()),
    };
    assert!(read_with(&etcd, other).await.is_err());
    // The server is fine: a proper client still gets in.
    read_with(&etcd, certs.client_files()).await.unwrap();
}

#[tokio::test]
async fn a_client_certificate_and_key_that_do_not_belong_together_are_named() {
    let certs = TestCerts::generate(&[loopback()]);
    let etcd = TestEtcd::start_tls(&certs, loopback()).await;
    let cases = [
        (certs.wrong_client_key(), "KeyMismatch"),
        (certs.client_cert(), "PrivateKeyParseError"),
    ];
    for (key, cause) in cases {
        let tls = TlsFiles {
            key_file: Some(key.clone()),
            ..certs.client_files()
        };
        let err = read_with(&etcd, tls).await.unwrap_err();
        let text = err.to_string();
        let files = format!(
            "the TLS client certificate {} and key {} cannot be used (",
            certs.client_cert().display(),
            key.display()
        );
        assert!(text.contains(&files) && text.contains(cause), "{text}");
    }
}

#[tokio::test]
async fn a_plain_http_client_of_a_tls_server_fails() {
    let certs = TestCerts::generate(&[loopback()]);
    let etcd = TestEtcd::start_tls(&certs, loopback()).await;
    let cfg = EtcdConfig {
        endpoints: vec![etcd.endpoint().replace("https://", "http://")],
        request_timeout: Duration::from_secs(2),
        tls: TlsFiles::default(),
        auth: None,
    };
    let kv = EtcdKv::connect(&cfg).await.unwrap();
    assert!(kv.range("k", false, None).await.is_err());
}

#[tokio::test]
async fn a_server_started_on_a_copy_of_anothers_data_holds_its_users_and_keys() {
    let mut etcd = TestEtcd::start_auth().await;
    let viewer = fleet_registry::rbac::viewer(&fleet_registry::Keys::new("/fleet/"));
    let user = etcd.issue_user("copied-viewer", &[viewer]).await;
    let put = fleet_registry::kv::Txn {
        success: vec![fleet_registry::kv::TxnOp::Put {
            key: "/fleet/k".into(),
            value: b"v".to_vec(),
            lease: None,
        }],
        ..Default::default()
    };
    etcd.kv().await.txn(put).await.expect("root writes");
    let copy = crate::unique_dir("etcd-copy");
    etcd.copy_data(&copy).await.expect("copying the data");
    // The original serves again after its copy.
    etcd.kv()
        .await
        .range("/fleet/k", false, None)
        .await
        .expect("the original reads");
    let copied = TestEtcd::start_from_data(&copy, true, &[]).await;
    assert_ne!(copied.endpoint(), etcd.endpoint());
    let cfg = EtcdConfig {
        endpoints: vec![copied.endpoint()],
        ..user
    };
    let kv = EtcdKv::connect(&cfg).await.expect("a valid config");
    let got = kv
        .range("/fleet/k", false, None)
        .await
        .expect("the copied user reads");
    assert_eq!(got.kvs[0].value, b"v");
    let _ = fs::remove_dir_all(&copy);
}

/// The benchmark's production shape (issue 43): TLS with client certificates and auth at
/// once, its metrics over plain HTTP on their own port; a copy of its data starts in the
/// same shape and a user made on the first logs in to it.
#[tokio::test]
async fn a_shaped_server_takes_tls_and_auth_and_serves_its_metrics_plainly() {
    let mut etcd = TestEtcd::start_shaped(Shaped {
        tls: true,
        auth: true,
        ..Shaped::default()
    })
    .await;
    assert!(etcd.endpoint().starts_with("https://127.0.0.1:"));
    assert_ne!(etcd.metrics_endpoint(), etcd.endpoint());
    let viewer = fleet_registry::rbac::viewer(&fleet_registry::Keys::new("/fleet/"));
    let user = etcd.issue_user("shaped-viewer", &[viewer]).await;
    assert!(user.tls.cert_file.is_some(), "{:?}", user.tls);
    let kv = EtcdKv::connect(&user).await.expect("a valid config");
    kv.range("/fleet/k", false, None)
        .await
        .expect("the user reads over TLS");
    let anonymous = EtcdKv::connect(&etcd.anonymous_config()).await.unwrap();
    assert!(
        anonymous.range("/fleet/k", false, None).await.is_err(),
        "auth is on"
    );
    assert!(etcd.watcher_count().await < 10);
    let copy = crate::unique_dir("etcd-shaped-copy");
    etcd.copy_data(&copy).await.expect("copying the data");
    let copied = TestEtcd::start_shaped(Shaped {
        tls: true,
        auth: true,
        data: Some(&copy),
        ..Shaped::default()
    })
    .await;
    let cfg = EtcdConfig {
        endpoints: vec![copied.endpoint()],
        tls: copied.config().tls,
        ..user
    };
    let kv = EtcdKv::connect(&cfg).await.expect("a valid config");
    kv.range("/fleet/k", false, None)
        .await
        .expect("the copied user reads with the copy's certificates");
    let _ = fs::remove_dir_all(&copy);
}
