//! Serving the router on listeners: HTTP/1.1 over TCP, TLS over TCP or unix stream sockets,
//! one task per connection (a TLS handshake runs in the connection's task, never in the
//! accept loop). Serving never touches the registry itself, so a slow client or a flood of
//! requests costs only this task's time, never the agent's or the engine's. A listener holds
//! at most [`MAX_CONNECTIONS`] connections (more wait in the kernel's backlog), and a client
//! gets [`HEADER_TIMEOUT`] for its TLS handshake and again to send a request's headers, so
//! idle or slow clients cannot take every file descriptor fleetd has. Each request carries
//! the [`Peer`] its connection came from (a TLS client certificate's subject), which the
//! router's authorization reads.
//!
//! Issue 37, item 3: connections are accepted as they come, and one over the listener's
//! [`MAX_CONNECTIONS`], or over [`guard::MAX_PER_PEER`] from one address, is closed at once,
//! so idle clients cannot leave the others waiting in the kernel's backlog. A TLS handshake
//! and a request's headers each get [`HEADER_TIMEOUT`]; a body [`BODY_TIMEOUT`] (the
//! handlers' reads); a write that waits [`guard::WRITE_STALL`] for the client to read ends
//! the connection.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use crate::authz::{CertSubject, Peer};

mod bare;
mod guard;
use bare::BareErrors;
pub use guard::{MAX_PER_PEER, WRITE_STALL};
use guard::{PeerSlots, Stalled};

/// A listening socket the API is served on.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
    /// TCP whose connections speak TLS with the acceptor's configuration (which decides
    /// whether a client certificate is required).
    Tls(TcpListener, TlsAcceptor),
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Listener").field(&self.describe()).finish()
    }
}

impl Listener {
    /// Where it listens, for logs.
    pub fn describe(&self) -> String {
        match self {
            Self::Tcp(l) => match l.local_addr() {
                Ok(a) => format!("tcp {a}"),
                Err(_) => "tcp".into(),
            },
            Self::Tls(l, _) => match l.local_addr() {
                Ok(a) => format!("tls {a}"),
                Err(_) => "tls".into(),
            },
            Self::Unix(l) => match l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
            {
                Some(p) => format!("unix {p}"),
                None => "unix".into(),
            },
        }
    }
}

/// Connections served at once per listener.
pub const MAX_CONNECTIONS: usize = 512;

/// How long a connection may take for its TLS handshake, and to send a request's headers
/// (also the idle limit between requests on a kept-alive connection).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request's body may take to arrive, whole (a 4 MiB body at 1 Mbit/s takes 32 s).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// Pause after a failed `accept` (out of file descriptors): retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `router` on `listener` until `shutdown` turns true.
pub async fn serve(listener: Listener, router: Router, mut shutdown: watch::Receiver<bool>) {
    let name = listener.describe();
    info!(listener = %name, "serving fleet api");
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let peers = PeerSlots::default();
    let mut refused = Refusals::default();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => break,
            accepted = accept(&listener) => accepted,
        };
        let (conn, ip) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                warn!(listener = %name, error = %e, "failed accepting api connection");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Over either bound the connection is closed at once (dropped), never queued.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused.note(
                &name,
                "the listener serves its most connections already",
                ip,
            );
            continue;
        };
        let peer_slot = match ip {
            Some(ip) => match peers.take(ip) {
                Some(s) => Some(s),
                None => {
                    refused.note(
                        &name,
                        "this address holds its most connections already",
                        ip.into(),
                    );
                    continue;
                }
            },
            None => None,
        };
        let router = router.clone();
        tokio::spawn(async move {
            serve_connection(conn, router).await;
            drop((slot, peer_slot));
        });
    }
    debug!(listener = %name, "fleet api listener stopped");
}

/// Refused connections, warned of at most once a minute per listener with a count.
#[derive(Debug, Default)]
struct Refusals {
    since_warned: u64,
    warned: Option<tokio::time::Instant>,
}

impl Refusals {
    fn note(&mut self, listener: &str, why: &str, peer: Option<std::net::IpAddr>) {
        self.since_warned += 1;
        let due = self
            .warned
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(60));
        if due {
            warn!(listener = %listener, peer = ?peer, refused = self.since_warned, reason = why, "api connections closed at once");
            self.since_warned = 0;
            self.warned = Some(tokio::time::Instant::now());
        }
    }
}

/// An accepted connection of either kind.
enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
    Tls(tokio::net::TcpStream, TlsAcceptor),
}

/// The next connection, with its peer's address (none over a unix socket).
async fn accept(listener: &Listener) -> std::io::Result<(Conn, Option<std::net::IpAddr>)> {
    Ok(match listener {
        Listener::Tcp(l) => {
            let (s, a) = l.accept().await?;
            (Conn::Tcp(s), Some(a.ip()))
        }
        Listener::Unix(l) => (Conn::Unix(l.accept().await?.0), None),
        Listener::Tls(l, acceptor) => {
            let (s, a) = l.accept().await?;
            (Conn::Tls(s, acceptor.clone()), Some(a.ip()))
        }
    })
}

async fn serve_connection(conn: Conn, router: Router) {
    match conn {
        Conn::Tcp(s) => serve_io(s, router, Peer::Plain).await,
        Conn::Unix(s) => {
            // Who connected, for the events of their actions (issue 41).
            let uid = crate::authz::LocalUid(s.peer_cred().ok().map(|c| c.uid()));
            serve_io(s, router.layer(axum::Extension(uid)), Peer::Local).await;
        }
        Conn::Tls(s, acceptor) => {
            // A client without a certificate the acceptor trusts ends here (the handshake
            // fails), before any request reaches the router.
            match tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(s)).await {
                Ok(Ok(tls)) => {
                    let peer = Peer::Certificate(client_subject(&tls));
                    serve_io(tls, router, peer).await
                }
                Ok(Err(e)) => debug!(error = %e, "api tls handshake failed"),
                Err(_) => debug!("api tls handshake timed out"),
            }
        }
    }
}

/// The subject of the client's certificate (the first of its chain, which the handshake
/// verified); `None` when there is none to read (an acceptor that asks for none).
fn client_subject(
    tls: &tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
) -> Option<CertSubject> {
    let leaf = tls.get_ref().1.peer_certificates()?.first()?;
    CertSubject::from_der(leaf.as_ref())
}

/// Serves one connection; every request carries `peer` ([`crate::authz`] decides on it).
async fn serve_io<S>(stream: S, router: Router, peer: Peer)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(router.layer(axum::Extension(peer)));
    let res = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(BareErrors::new(Stalled::new(stream))), service)
        .await;
    if let Err(e) = res {
        debug!(error = %e, "api connection ended with an error");
    }
}
