//! HTTP/1.1 requests to fleetd's API over a unix socket, TCP or TLS (hyper's client; no
//! HTTP written by hand). Idle connections are kept (up to one per request in flight) and
//! reused while fresh, so a listing of many pages, a poll, or 100,000 creates sent 32 at a
//! time do not connect for each request.
//!
//! The endpoint is fleet's: `unix:///path` (or `file:///path`), `http://host[:port][/base]`
//! or `https://host[:port][/base]`. Only the first of comma-separated endpoints is used,
//! as in fleet. `https://` needs `--ca-file` (there is no system trust store here) and takes
//! `--cert-file`/`--key-file` for the client certificate fleetd requires.

use bytes::Bytes;
use fleet_registry::kv::TlsFiles;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;

use fleet_ops::OpsError;

use super::unreached::{self, Guide, Place};

mod endpoint;
use endpoint::*;

/// A kept connection older than this is not reused: fleetd closes connections idle for
/// 10 s (`fleet_api::serve::HEADER_TIMEOUT`), and a request sent as it closes one would fail.
const REUSE_WITHIN: Duration = Duration::from_secs(5);

/// Kept-alive connections held for reuse: as many as requests a command sends at once
/// (`fleet_ops::CREATES_IN_FLIGHT`), so 100,000 creates reuse 32 connections instead of
/// opening one per request.
const IDLE_KEPT: usize = fleet_ops::CREATES_IN_FLIGHT;

/// The largest answer read (a page of 65,535 units in the full view is tens of MB): a
/// server that sends more is cut off rather than filling this process's memory.
const MAX_ANSWER: usize = 512 * 1024 * 1024;

/// The `Host` of requests over a unix socket (fleet's client sends the same).
const UNIX_HOST: &str = "domain-sock";

/// Why an endpoint or its TLS files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("endpoint {endpoint:?}: {why}")]
    Endpoint { endpoint: String, why: String },
    #[error("TLS file {}: {why}", path.display())]
    TlsFile { path: PathBuf, why: String },
}

/// Where the API is, and how to talk to it.
#[derive(Debug)]
pub struct Transport {
    target: Target,
    /// The endpoint as given, for messages.
    shown: String,
    /// `Host` header.
    host: String,
    /// The endpoint's path, before `/fleet/v1` (empty, or `/base` without a trailing `/`).
    base: String,
    timeout: Duration,
    /// Whether a failed connect says how to point fleetctl elsewhere ([`Transport::guiding`]).
    guide: Guide,
    idle: Mutex<Vec<(SendRequest<Full<Bytes>>, Instant)>>,
}

enum Target {
    Unix(PathBuf),
    Tcp(String),
    Tls {
        addr: String,
        name: ServerName<'static>,
        connector: TlsConnector,
    },
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Unix(p) => write!(f, "Unix({})", p.display()),
            Target::Tcp(a) => write!(f, "Tcp({a})"),
            Target::Tls { addr, .. } => write!(f, "Tls({addr})"),
        }
    }
}

/// A response: its status and whole body.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
}

impl Transport {
    /// Parses the endpoint and reads the TLS files; connects to nothing yet.
    pub fn new(
        endpoint: &str,
        tls: &TlsFiles,
        timeout: Duration,
    ) -> Result<Transport, EndpointError> {
        let first = endpoint.split(',').next().unwrap_or("").trim();
        let (target, host, base) = locate(first, tls)?;
        Ok(Transport {
            target,
            shown: first.to_owned(),
            host,
            base,
            timeout,
            guide: Guide::None,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Another service than a fleetd (fleet v1's etcd): a refused connect names no fleetd.
    pub fn not_fleetd(mut self) -> Transport {
        self.guide = Guide::NotFleetd;
        self
    }

    /// The driver's own endpoint, which the user chose: a failed connect also says how to
    /// point fleetctl at another fleetd or at etcd.
    pub fn guiding(mut self) -> Transport {
        self.guide = Guide::Elsewhere;
        self
    }

    /// Sends one request to `/fleet/v1<path_and_query>` and reads the whole answer, within
    /// the request timeout.
    pub async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, OpsError> {
        let uri = format!("{}/fleet/v1{path_and_query}", self.base);
        // The message names the resource, not the query (pageSize, view and the names).
        let path = uri.split('?').next().unwrap_or(&uri);
        let what = || format!("{method} {path} at {}", self.shown);
        match tokio::time::timeout(self.timeout, self.exchange(&method, &uri, body, None)).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(OpsError::Transport {
                what: what(),
                cause: explained(chain(e.as_ref())).into(),
            }),
            Err(elapsed) => Err(OpsError::Transport {
                what: format!("{} (request timeout {:?})", what(), self.timeout),
                cause: Box::new(elapsed),
            }),
        }
    }

    /// Sends a `GET` of `path_and_query` as it is (not under `/fleet/v1`: another service
    /// than fleet's API, such as etcd's v2 keys), with `authorization` as that header.
    pub async fn get_raw(
        &self,
        path_and_query: &str,
        authorization: Option<&str>,
    ) -> Result<Answer, OpsError> {
        let uri = format!("{}{path_and_query}", self.base);
        let path = uri.split('?').next().unwrap_or(&uri).to_owned();
        let exchange = self.exchange(&Method::GET, &uri, None, authorization);
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(OpsError::Transport {
                what: format!("GET {path} at {}", self.shown),
                cause: explained(chain(e.as_ref())).into(),
            }),
            Err(elapsed) => Err(OpsError::Transport {
                what: format!(
                    "GET {path} at {} (request timeout {:?})",
                    self.shown, self.timeout
                ),
                cause: Box::new(elapsed),
            }),
        }
    }

    async fn exchange(
        &self,
        method: &Method,
        uri: &str,
        body: Option<Vec<u8>>,
        authorization: Option<&str>,
    ) -> Result<Answer, BoxError> {
        let mut sender = match self.take_idle() {
            Some(s) => s,
            None => self.connect().await?,
        };
        let mut request = Request::builder()
            .method(method.clone())
            .uri(uri)
            .header(header::HOST, &self.host)
            .header(header::ACCEPT, "application/json");
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        let request = request.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER)
            .collect()
            .await?
            .to_bytes();
        self.put_idle(sender);
        Ok(Answer { status, body })
    }

    /// Sends a `GET /fleet/v1<path_and_query>` on a connection of its own and returns the
    /// answer as soon as its head arrives (within the request timeout), its body unread: a
    /// journal followed for hours streams through it. Dropping the body closes the
    /// connection, which is how a client leaves a stream.
    pub async fn open(
        &self,
        path_and_query: &str,
        accept: &str,
    ) -> Result<(StatusCode, Incoming), OpsError> {
        let uri = format!("{}/fleet/v1{path_and_query}", self.base);
        let path = uri.split('?').next().unwrap_or(&uri);
        let what = || format!("GET {path} at {}", self.shown);
        let head = async {
            let mut sender = self.connect().await?;
            let request = Request::builder()
                .method(Method::GET)
                .uri(&uri)
                .header(header::HOST, &self.host)
                .header(header::ACCEPT, accept)
                .body(Full::new(Bytes::new()))?;
            let response = sender.send_request(request).await?;
            Ok::<_, BoxError>((response.status(), response.into_body()))
        };
        match tokio::time::timeout(self.timeout, head).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(OpsError::Transport {
                what: what(),
                cause: explained(chain(e.as_ref())).into(),
            }),
            Err(elapsed) => Err(OpsError::Transport {
                what: format!("{} (request timeout {:?})", what(), self.timeout),
                cause: Box::new(elapsed),
            }),
        }
    }

    /// The endpoint as given, for messages.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// The request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().ok()?;
        while let Some((sender, since)) = idle.pop() {
            if since.elapsed() < REUSE_WITHIN && sender.is_ready() {
                return Some(sender);
            }
        }
        None
    }

    fn put_idle(&self, sender: SendRequest<Full<Bytes>>) {
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < IDLE_KEPT
        {
            idle.push((sender, Instant::now()));
        }
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, BoxError> {
        let unreached = |place, e: std::io::Error| -> BoxError {
            unreached::explain(place, &e, self.guide).into()
        };
        match &self.target {
            Target::Unix(path) => {
                let io = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|e| unreached(Place::Socket(path), e))?;
                handshake(io).await
            }
            Target::Tcp(addr) => {
                let io = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(|e| unreached(Place::Address(addr), e))?;
                handshake(io).await
            }
            Target::Tls {
                addr,
                name,
                connector,
            } => {
                let tcp = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(|e| unreached(Place::Address(addr), e))?;
                handshake(connector.connect(name.clone(), tcp).await?).await
            }
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An error and its causes in one line: hyper's errors keep the reason (a refused connect,
/// a TLS alert) in their source, and `OpsError::Transport` carries no source.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        let text = err.to_string();
        if parts.last().is_none_or(|last| !last.contains(&text)) {
            parts.push(text);
        }
        next = err.source();
    }
    parts.join(": ")
}

/// TLS alerts a server sends when it refuses the client's certificate (none, or one it does
/// not trust). With TLS 1.3 they arrive with the first answer, after the client's side of
/// the handshake is done, so the error alone does not say who refused what.
const CERT_REFUSALS: [&str; 7] = [
    "CertificateRequired",
    "BadCertificate",
    "UnknownCA",
    "CertificateUnknown",
    "UnsupportedCertificate",
    "CertificateExpired",
    "AccessDenied",
];

/// The cause of a failed exchange, saying so when the server refused the client certificate.
fn explained(cause: String) -> String {
    let refused = cause
        .split("received fatal alert: ")
        .skip(1)
        .any(|rest| CERT_REFUSALS.iter().any(|a| rest.starts_with(a)));
    if refused {
        format!("the server refused the client certificate (--cert-file, --key-file): {cause}")
    } else {
        cause
    }
}

async fn handshake<S>(io: S) -> Result<SendRequest<Full<Bytes>>, BoxError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    // The connection's task ends when the sender is dropped or the server closes it.
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "api connection ended with an error");
        }
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_certificate_alert_from_the_server_says_the_client_certificate_was_refused() {
        let refused = super::explained(
            "connection error: received fatal alert: CertificateRequired".to_owned(),
        );
        assert!(
            refused.starts_with("the server refused the client certificate"),
            "{refused}"
        );
        assert!(refused.ends_with("CertificateRequired"), "{refused}");
        let other = "invalid peer certificate: UnknownIssuer".to_owned();
        assert_eq!(super::explained(other.clone()), other);
    }

    use super::*;
    use std::path::Path;

    fn parse(endpoint: &str) -> Result<Transport, EndpointError> {
        Transport::new(endpoint, &TlsFiles::default(), Duration::from_secs(1))
    }

    #[test]
    fn reads_fleets_endpoint_forms() {
        let t = parse("unix:///var/run/fleet.sock").unwrap();
        assert!(matches!(&t.target, Target::Unix(p) if p == Path::new("/var/run/fleet.sock")));
        assert_eq!((t.host.as_str(), t.base.as_str()), ("domain-sock", ""));
        let t = parse("file:///run/f.sock,http://ignored:1").unwrap();
        assert!(matches!(&t.target, Target::Unix(p) if p == Path::new("/run/f.sock")));
        let t = parse("http://10.0.0.1:49153/").unwrap();
        assert!(matches!(&t.target, Target::Tcp(a) if a == "10.0.0.1:49153"));
        assert_eq!(t.host, "10.0.0.1:49153");
        let t = parse("http://fleet.example.com/proxy/").unwrap();
        assert!(matches!(&t.target, Target::Tcp(a) if a == "fleet.example.com:80"));
        assert_eq!(t.base, "/proxy");
        let t = parse("http://[::1]:8080").unwrap();
        assert!(matches!(&t.target, Target::Tcp(a) if a == "[::1]:8080"));
    }

    #[test]
    fn refuses_endpoints_that_cannot_work() {
        for (endpoint, why) in [
            ("/var/run/fleet.sock", "URL scheme undefined"),
            ("unix://var/run/fleet.sock", "absolute path"),
            ("ftp://h:1", "unsupported scheme"),
            ("http://h:99999", "not a port number"),
            ("http://:80", "no host"),
            ("https://127.0.0.1:1", "needs --ca-file"),
        ] {
            let e = parse(endpoint).unwrap_err().to_string();
            assert!(e.contains(why), "{endpoint}: {e}");
        }
    }

    #[test]
    fn refuses_tls_files_without_an_https_endpoint() {
        let tls = TlsFiles {
            ca_file: Some("/etc/ca.pem".into()),
            ..TlsFiles::default()
        };
        let e = Transport::new("unix:///run/fleet.sock", &tls, Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "TLS file /etc/ca.pem: given, but the endpoint is unix://; TLS needs an https:// endpoint"
        );
    }
}
