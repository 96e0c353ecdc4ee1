//! etcd's plain-HTTP side, which needs no client library: one request on a socket. Which
//! member leads is read from its maintenance status on the JSON gateway, by the test clusters
//! here and by the functional harness's.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long a member's gateway may take to connect, and to each read and write.
const GATEWAY_TIMEOUT: Duration = Duration::from_millis(500);

/// One HTTP/1.0 exchange with `addr`: `request` (head and body) sent whole, the whole response
/// (head and body) read until the server closes; `timeout` bounds the connection, each read
/// and each write.
pub fn http_exchange(
    addr: SocketAddr,
    request: &str,
    timeout: Duration,
) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(request.as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

/// `POST <path>` of the JSON `body` to an etcd member's gateway at `addr`; the response's body.
pub fn post_json(addr: SocketAddr, path: &str, body: &str) -> std::io::Result<String> {
    let request = format!(
        "POST {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let response = http_exchange(addr, &request, GATEWAY_TIMEOUT)?;
    Ok(response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned()))
}

/// What a member says about itself: its ID and the leader it knows (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberStatus {
    pub id: u64,
    pub leader: u64,
}

/// `POST /v3/maintenance/status` on the gateway of the member at `addr`. IDs are uint64s,
/// which the gateway writes as JSON strings.
pub fn member_status(addr: SocketAddr) -> std::io::Result<MemberStatus> {
    let body = post_json(addr, "/v3/maintenance/status", "{}")?;
    let json: serde_json::Value = serde_json::from_str(&body)
        .map_err(|e| std::io::Error::other(format!("etcd status is not JSON ({e}): {body}")))?;
    let id = |v: &serde_json::Value| v.as_str().and_then(|s| s.parse::<u64>().ok());
    let Some(member) = id(&json["header"]["member_id"]) else {
        return Err(std::io::Error::other(format!(
            "etcd status without a member ID: {body}"
        )));
    };
    Ok(MemberStatus {
        id: member,
        leader: id(&json["leader"]).unwrap_or(0),
    })
}
