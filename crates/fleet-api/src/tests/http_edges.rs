//! What the HTTP layer answers to requests malformed below the router: expectations, chunk
//! framing, a path or a header block too large. Every one gets fleet's JSON error entity
//! (docs/api.md) and a status that names the problem (issue 38). Raw bytes over TCP, as a
//! hostile or broken client sends them.

use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serves the fixture's router on a loopback port until dropped.
struct Served {
    addr: std::net::SocketAddr,
    _stop: tokio::sync::watch::Sender<bool>,
}

async fn served() -> Served {
    let (f, _) = fixture(100);
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(crate::serve(crate::Listener::Tcp(tcp), f.router, stopped));
    Served { addr, _stop: stop }
}

/// Sends `request` and reads what comes back until the server closes or 2 s pass.
async fn exchange(s: &Served, request: &[u8]) -> String {
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), tcp.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// The status line and the JSON error entity of a response.
fn status_and_entity(response: &str) -> (String, Option<Value>) {
    let status = response.lines().next().unwrap_or_default().to_owned();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or("");
    (status, serde_json::from_str(body.trim()).ok())
}

fn put_head(extra: &str) -> String {
    format!(
        "PUT /fleet/v1/units/a.service HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
    )
}

/// `response` is `status` with fleet's error entity of that code.
fn assert_entity(response: &str, status: u16) {
    let (line, entity) = status_and_entity(response);
    assert!(
        line.starts_with(&format!("HTTP/1.1 {status} ")),
        "{response}"
    );
    let entity = entity.unwrap_or_else(|| panic!("no error entity: {response}"));
    assert_eq!(entity["error"]["code"], status, "{response}");
    assert!(
        entity["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
}

#[tokio::test]
async fn a_body_announced_too_large_is_413_without_100_continue_first() {
    let s = served().await;
    let head = put_head("Expect: 100-continue\r\nContent-Length: 9000000\r\n\r\n");
    let response = exchange(&s, head.as_bytes()).await;
    assert!(!response.contains("100 Continue"), "{response}");
    assert_entity(&response, 413);
}

#[tokio::test]
async fn an_expectation_other_than_100_continue_is_417() {
    let s = served().await;
    let head = put_head("Expect: teapot\r\nContent-Length: 2\r\n\r\n{}");
    assert_entity(&exchange(&s, head.as_bytes()).await, 417);
}

#[tokio::test]
async fn bad_chunk_framing_is_400_with_the_entity() {
    let s = served().await;
    let head = put_head("Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n");
    assert_entity(&exchange(&s, head.as_bytes()).await, 400);
}

#[tokio::test]
async fn what_hyper_refuses_before_the_router_carries_the_entity_too() {
    let s = served().await;
    let long = format!(
        "GET /fleet/v1/units/{}.service HTTP/1.1\r\nHost: x\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    assert_entity(&exchange(&s, long.as_bytes()).await, 414);
    let mut many = "GET /fleet/v1/units HTTP/1.1\r\nHost: x\r\n".to_owned();
    for i in 0..150 {
        many.push_str(&format!("X-H{i}: v\r\n"));
    }
    many.push_str("\r\n");
    assert_entity(&exchange(&s, many.as_bytes()).await, 431);
    assert_entity(&exchange(&s, b"GET\x01 / HTTP/1.1\r\n\r\n").await, 400);
    // A well-formed request on the same server is answered as ever.
    let fine = exchange(
        &s,
        b"GET /fleet/v1/units HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(fine.starts_with("HTTP/1.1 200 "), "{fine}");
}
