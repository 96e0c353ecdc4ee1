//! Serving the router on listeners: HTTP/1.1 over TCP, TLS over TCP or unix stream sockets,
//! one task per connection (a TLS handshake runs in the connection's task, never in the
//! accept loop). Serving never touches the registry itself, so a slow client or a flood of
//! requests costs only this task's time, never the agent's or the engine's. A listener holds
//! at most [`MAX_CONNECTIONS`] connections (more wait in the kernel's backlog), and a client
//! gets [`HEADER_TIMEOUT`] for its TLS handshake and again to send a request's headers, so
//! idle or slow clients cannot take every file descriptor fleetd has. Each request carries
//! the [`Peer`] its connection came from (a TLS client certificate's subject), which the
//! router's authorization reads.

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

/// How long a connection may take to send a request's headers (also the idle limit between
/// requests on a kept-alive connection).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause after a failed `accept` (out of file descriptors): retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `router` on `listener` until `shutdown` turns true.
pub async fn serve(listener: Listener, router: Router, mut shutdown: watch::Receiver<bool>) {
    let name = listener.describe();
    info!(listener = %name, "serving fleet api");
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => break,
            accepted = async {
                let slot = slots.clone().acquire_owned().await.expect("never closed");
                (slot, accept(&listener).await)
            } => accepted,
        };
        match accepted {
            (slot, Ok(conn)) => {
                let router = router.clone();
                tokio::spawn(async move {
                    serve_connection(conn, router).await;
                    drop(slot);
                });
            }
            (_, Err(e)) => {
                warn!(listener = %name, error = %e, "failed accepting api connection");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
    debug!(listener = %name, "fleet api listener stopped");
}

/// An accepted connection of either kind.
enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
    Tls(tokio::net::TcpStream, TlsAcceptor),
}

async fn accept(listener: &Listener) -> std::io::Result<Conn> {
    Ok(match listener {
        Listener::Tcp(l) => Conn::Tcp(l.accept().await?.0),
        Listener::Unix(l) => Conn::Unix(l.accept().await?.0),
        Listener::Tls(l, acceptor) => Conn::Tls(l.accept().await?.0, acceptor.clone()),
    })
}

async fn serve_connection(conn: Conn, router: Router) {
    match conn {
        Conn::Tcp(s) => serve_io(s, router, Peer::Plain).await,
        Conn::Unix(s) => serve_io(s, router, Peer::Local).await,
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
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = res {
        debug!(error = %e, "api connection ended with an error");
    }
}
