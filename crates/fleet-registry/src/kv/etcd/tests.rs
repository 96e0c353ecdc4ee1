use super::pages::{PAGE_PER_SECOND, PAGE_RETRIES, after, next_page_keys, smaller_page, split};
use super::*;

fn cfg(endpoints: &[&str], tls: TlsFiles) -> EtcdConfig {
    EtcdConfig {
        endpoints: endpoints.iter().map(|e| (*e).to_owned()).collect(),
        request_timeout: Duration::from_secs(1),
        tls,
        auth: None,
    }
}

#[test]
fn ends_a_prefix_range_after_every_key_with_that_prefix() {
    assert_eq!(prefix_end(b"/p/unit/"), b"/p/unit0");
    assert_eq!(prefix_end(b"a\xff\xff"), b"b");
    assert_eq!(prefix_end(b"\xff"), b"\0");
    assert_eq!(after(b"/p/unit/a"), b"/p/unit/a\0");
}

#[test]
fn sizes_the_next_page_by_the_bytes_of_the_last() {
    let kv = |value_len: usize| super::super::KeyValue {
        key: "/_coreos.com/fleet/file/x".to_owned(),
        value: vec![b'x'; value_len],
        create_revision: 1,
        mod_revision: 1,
        version: 1,
        lease: 0,
    };
    let fleetd = PageSize::for_deadline(Duration::from_secs(1));
    assert_eq!(next_page_keys(&vec![kv(100); 500], fleetd), 10_000);
    assert_eq!(next_page_keys(&vec![kv(1 << 20); 3], fleetd), 3);
    assert_eq!(next_page_keys(&[kv(8 << 20)], fleetd), 1);
    let fleetctl = PageSize::for_deadline(Duration::from_secs(3));
    assert_eq!(next_page_keys(&vec![kv(1 << 20); 3], fleetctl), 11);
    assert_eq!(next_page_keys(&vec![kv(100); 500], fleetctl), 30_000);
}

#[test]
fn a_page_past_its_deadline_is_asked_again_for_half_its_keys_twice() {
    let fleetd = PageSize::for_deadline(Duration::from_secs(1)).keys;
    let asked: Vec<usize> = std::iter::successors(Some(fleetd), |k| Some(smaller_page(*k)))
        .take(1 + PAGE_RETRIES as usize)
        .collect();
    assert_eq!(asked, [10_000, 5_000, 2_500]);
    assert_eq!(smaller_page(1), 1, "never a page of no keys");
}

#[test]
fn pages_grow_with_the_request_deadline_within_bounds() {
    let at = |ms: u64| PageSize::for_deadline(Duration::from_millis(ms));
    assert_eq!(at(200), PAGE_PER_SECOND, "no smaller than a second's page");
    assert_eq!(at(1_000), PAGE_PER_SECOND, "fleetd's default deadline");
    assert_eq!(
        at(3_000),
        PageSize {
            bytes: 12 << 20,
            keys: 30_000
        },
        "fleetctl's default deadline"
    );
    let most = PageSize {
        bytes: 16 << 20,
        keys: 40_000,
    };
    assert_eq!(at(4_000), most);
    assert_eq!(at(60_000), most, "no larger past 4 s");
}

#[test]
fn the_rest_of_a_prefix_read_is_cut_into_intervals_that_cover_it_once() {
    let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
    let cut = |from: &str, end: &[u8]| -> Vec<(String, String)> {
        split(b"/p/", from.as_bytes().to_vec(), end.to_vec())
            .iter()
            .map(|(s, e)| (text(s), text(e)))
            .collect()
    };
    let end = prefix_end(b"/p/");
    assert_eq!(
        cut("/p/0a\0", &end),
        [
            ("/p/0a\0", "/p/4"),
            ("/p/4", "/p/8"),
            ("/p/8", "/p/c"),
            ("/p/c", "/p/i"),
            ("/p/i", "/p/p"),
            ("/p/p", "/p0"),
        ]
        .map(|(s, e)| (s.to_owned(), e.to_owned()))
    );
    // Cuts at or before where the rest starts are left out.
    assert_eq!(
        cut("/p/k", &end),
        [("/p/k", "/p/p"), ("/p/p", "/p0")].map(|(s, e)| (s.to_owned(), e.to_owned()))
    );
    // A prefix with no end reads every key from it on.
    assert_eq!(
        split(b"", b"z".to_vec(), vec![0]),
        [(b"z".to_vec(), vec![0])]
    );
}

#[test]
fn rounds_lease_ttl_up_to_whole_seconds() {
    assert_eq!(whole_seconds(Duration::ZERO), 1);
    assert_eq!(whole_seconds(Duration::from_millis(100)), 1);
    assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
    assert_eq!(whole_seconds(Duration::from_millis(2001)), 3);
}

#[tokio::test]
async fn connect_rejects_empty_endpoints() {
    let err = EtcdKv::connect(&cfg(&[], TlsFiles::default()))
        .await
        .unwrap_err();
    assert!(matches!(err, KvError::Config(_)), "{err}");
}

#[tokio::test]
async fn connect_names_a_missing_ca_file() {
    let tls = TlsFiles {
        ca_file: Some("/nonexistent/fleet-ca.pem".into()),
        ..TlsFiles::default()
    };
    let err = EtcdKv::connect(&cfg(&["https://127.0.0.1:2379"], tls))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, KvError::Config(m) if m.contains("/nonexistent/fleet-ca.pem")),
        "{err}"
    );
}

#[tokio::test]
async fn connect_names_a_file_that_is_not_pem() {
    let path = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"));
    let tls = TlsFiles {
        ca_file: Some(path.clone()),
        ..TlsFiles::default()
    };
    let err = EtcdKv::connect(&cfg(&["https://127.0.0.1:2379"], tls))
        .await
        .unwrap_err();
    let name = path.display().to_string();
    assert!(
        matches!(&err, KvError::Config(m) if m.contains(&name)),
        "{err}"
    );
}

#[tokio::test]
async fn connect_rejects_a_certificate_without_key() {
    let tls = TlsFiles {
        ca_file: Some("/nonexistent/ca.pem".into()),
        cert_file: Some("/nonexistent/cert.pem".into()),
        key_file: None,
    };
    // The CA is read first; a missing CA is reported before the pairing problem.
    let err = EtcdKv::connect(&cfg(&["https://127.0.0.1:2379"], tls))
        .await
        .unwrap_err();
    assert!(matches!(err, KvError::Config(_)), "{err}");
}

#[tokio::test]
async fn connect_rejects_mixed_schemes() {
    let err = EtcdKv::connect(&cfg(
        &["https://127.0.0.1:2379", "http://127.0.0.1:2380"],
        TlsFiles::default(),
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, KvError::Config(_)), "{err}");
}

#[tokio::test]
async fn connect_rejects_a_malformed_endpoint() {
    let err = EtcdKv::connect(&cfg(&["http://[::1"], TlsFiles::default()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, KvError::Config(m) if m.contains("http://[::1")),
        "{err}"
    );
}

#[tokio::test]
async fn a_call_to_dead_endpoints_fails_at_once_naming_each_one() {
    let mut config = cfg(
        &["http://127.0.0.1:9", "http://127.0.0.1:7"],
        TlsFiles::default(),
    );
    config.request_timeout = Duration::from_secs(5);
    let kv = EtcdKv::connect(&config).await.unwrap();
    let began = Instant::now();
    let err = kv.range("k", false, None).await.unwrap_err();
    assert!(began.elapsed() < Duration::from_secs(2), "{err}");
    let KvError::Unavailable { detail, .. } = &err else {
        panic!("{err}");
    };
    assert!(
        detail.contains("127.0.0.1:9: ") && detail.contains("127.0.0.1:7: "),
        "{err}"
    );
    let err = kv.txn(Txn::default()).await.unwrap_err();
    assert!(matches!(err, KvError::Unavailable { .. }), "{err}");
}

#[tokio::test]
async fn an_http_server_at_the_endpoint_is_named_as_not_etcd() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            // As a web server does: answer, and keep the connection for the next request;
            // one thread each, so a client that reconnects is answered too.
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buf = [0u8; 512];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
                while stream.read(&mut buf).is_ok_and(|n| n > 0) {}
            });
        }
    });
    let endpoint = format!("http://127.0.0.1:{port}");
    // The client tries again in rounds until its deadline and then says what the last
    // try met: the HTTP/1 answer.
    let config = EtcdConfig {
        request_timeout: Duration::from_secs(2),
        ..cfg(&[&endpoint], TlsFiles::default())
    };
    let kv = EtcdKv::connect(&config).await.unwrap();
    let err = kv.range("k", false, None).await.unwrap_err().to_string();
    assert!(err.contains(NOT_GRPC_HINT), "{err}");
}

#[tokio::test]
async fn connect_is_lazy_about_an_unreachable_endpoint() {
    let kv = EtcdKv::connect(&cfg(&["http://127.0.0.1:9"], TlsFiles::default())).await;
    assert_eq!(kv.unwrap().endpoints(), "http://127.0.0.1:9");
}

#[test]
fn a_ping_may_go_unanswered_ten_seconds_not_just_the_request_deadline() {
    let s = Duration::from_secs;
    assert_eq!(ping_timeout(s(1)), s(10));
    assert_eq!(ping_timeout(s(30)), s(30));
}
