//! Issue 37, item 3, the attack: a network peer holds 600 idle connections to a machine's TLS
//! API, and a second peer (another address) trickles 50 requests' headers at one byte a
//! second, with a certificate of the cluster, and opens 10 connections that never start
//! their TLS handshake. fleetd closes what one address holds past its share at once, drops
//! the trickles at the header limit and the silent ones at the handshake limit, so another
//! client (fleetctl on another machine, over the same listener) lists units within 5 s
//! throughout. Needs root.

mod support;

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{ApiCerts, EtcdAuthSpec, FleetdSpec, MACHINE_BIN_DIR};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{finish, start};
use tokio::io::AsyncWriteExt;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto};

const PORT: u16 = 49158;
const IDLE: usize = 600;
const TRICKLING: usize = 50;
/// Connections that never start their TLS handshake, from the trickling peer.
const SILENT: usize = 10;
/// How fast another client must be answered meanwhile.
const ANSWERED_WITHIN: Duration = Duration::from_secs(5);

fn connector(certs: &ApiCerts) -> Result<TlsConnector> {
    let provider = Arc::new(crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(certs.ca())? {
        roots.add(c?)?;
    }
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(
            CertificateDer::pem_file_iter(certs.client_cert())?.collect::<Result<Vec<_>, _>>()?,
            PrivateKeyDer::from_pem_file(certs.client_key())?,
        )?;
    Ok(TlsConnector::from(Arc::new(config)))
}

/// A TCP connection to `addr` from this host's address `from`.
async fn connect_from(from: Ipv4Addr, addr: SocketAddr) -> Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    Ok(socket.connect(addr).await?)
}

/// Whether fleetd has closed `s`: a closed connection reads its end at once, an open one has
/// nothing to read.
async fn closed_by_peer(s: &tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 1];
    let ready = tokio::time::timeout(Duration::from_millis(50), s.readable()).await;
    ready.is_ok() && matches!(s.try_read(&mut buf), Ok(0) | Err(_))
}

/// How long a trickle goes on at most: well past fleetd's header limit (10 s) however late
/// the loaded host started it. The check waits for the trickles to end, not for a fixed
/// time: in one CI run 4 of 50, started late behind the 600 idle connections, were still
/// within their limit when a fixed 15 s stopped them.
const TRICKLE_GIVES_UP: Duration = Duration::from_secs(60);

/// One trickle, from `from`: a TLS request's headers a byte a second until fleetd closes it
/// (true) or `give_up` (false).
async fn trickle(
    from: Ipv4Addr,
    addr: SocketAddr,
    connector: TlsConnector,
    give_up: tokio::time::Instant,
) -> Result<bool> {
    let tcp = connect_from(from, addr).await?;
    let mut tls = connector
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await?;
    let request = b"GET /fleet/v1/units HTTP/1.1\r\nHost: fleet\r\nX-Slow: ";
    for byte in request.iter().chain(std::iter::repeat(&b'a')) {
        if tokio::time::Instant::now() >= give_up {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        if tls.write_all(&[*byte]).await.is_err() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// How many connections of each part of the attack fleetd had closed by its end.
#[derive(Debug, Default)]
struct Closed {
    idle: usize,
    trickling: usize,
    silent: usize,
}

/// The attack, until `stop`: IDLE plain connections from this host's bridge address that
/// never speak; from `peer` (a second address), TRICKLING TLS connections sending a
/// request's headers a byte a second (each until fleetd closes it, or it gives up) and
/// SILENT ones that never start their handshake.
async fn attack(
    addr: SocketAddr,
    peer: Ipv4Addr,
    connector: TlsConnector,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Closed> {
    let mut idle = Vec::new();
    for _ in 0..IDLE {
        if let Ok(s) = tokio::net::TcpStream::connect(addr).await {
            idle.push(s);
        }
    }
    let mut silent = Vec::new();
    for _ in 0..SILENT {
        silent.push(connect_from(peer, addr).await?);
    }
    let give_up = tokio::time::Instant::now() + TRICKLE_GIVES_UP;
    let trickles: Vec<_> = (0..TRICKLING)
        .map(|_| tokio::spawn(trickle(peer, addr, connector.clone(), give_up)))
        .collect();
    let mut stop = stop;
    stop.wait_for(|s| *s).await?;
    let mut closed = Closed::default();
    // Each ends when fleetd closes it, or gives up.
    for t in trickles {
        if matches!(t.await, Ok(Ok(true))) {
            closed.trickling += 1;
        }
    }
    for s in &idle {
        closed.idle += usize::from(closed_by_peer(s).await);
    }
    for s in &silent {
        closed.silent += usize::from(closed_by_peer(s).await);
    }
    Ok(closed)
}

#[test]
fn idle_and_trickling_connections_from_one_peer_leave_the_api_answering_others() -> Result<()> {
    let spec = FleetdSpec::default()
        .with_etcd_auth(EtcdAuthSpec::default())
        .with_api_tls(PORT);
    let (cluster, _registry) = start(2, spec)?;
    let (target, client) = (&cluster.machines()[0], &cluster.machines()[1]);
    let peer = cluster.second_host_address()?;
    let addr = SocketAddr::from((target.ip(), PORT));
    let certs: ApiCerts = cluster.api_certs().context("no certificates")?;
    // fleetctl on the other machine, with fleetctl's certificate, over the target's TLS API.
    for (name, path) in [
        ("ca.pem", certs.ca()),
        ("client.pem", certs.client_cert()),
        ("client.key", certs.client_key()),
    ] {
        client.write_file(&format!("/run/attack/{name}"), std::fs::read(&path)?)?;
    }
    let endpoint = format!("FLEETCTL_ENDPOINT=https://{addr}");
    let fleetctl = format!("{MACHINE_BIN_DIR}/fleetctl");
    let list = || -> Result<Duration> {
        let started = Instant::now();
        let out = client.exec(
            "env",
            [
                endpoint.as_str(),
                "FLEETCTL_DRIVER=api",
                "FLEETCTL_CA_FILE=/run/attack/ca.pem",
                "FLEETCTL_CERT_FILE=/run/attack/client.pem",
                "FLEETCTL_KEY_FILE=/run/attack/client.key",
                &fleetctl,
                "list-units",
            ],
        )?;
        let took = started.elapsed();
        ensure!(out.status.success(), "fleetctl failed: {out:?}");
        Ok(took)
    };
    list().context("before the attack")?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let attacker = rt.spawn(attack(addr, peer, connector(&certs)?, stopped));
    // Through the whole attack, past the header and handshake limits (10 s each) that end
    // the trickles and the silent connections.
    let mut slowest = Duration::ZERO;
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(15) {
        let took = list().context("during the attack")?;
        slowest = slowest.max(took);
        std::thread::sleep(Duration::from_millis(500));
    }
    stop.send_replace(true);
    let closed = rt.block_on(attacker)??;
    eprintln!("slowest answer during the attack {slowest:?}; closed by fleetd: {closed:?}");
    ensure!(
        slowest < ANSWERED_WITHIN,
        "another client waited {slowest:?} during the attack"
    );
    // One address keeps at most its share (64) of the idle ones; the other's slow requests
    // and silent handshakes, all within its share, end at their limits.
    ensure!(
        closed.idle >= IDLE - 64,
        "fleetd kept {} of one address's idle connections",
        IDLE - closed.idle
    );
    ensure!(
        closed.trickling == TRICKLING && closed.silent == SILENT,
        "fleetd kept slow requests or silent handshakes past their limits: {closed:?}"
    );
    finish(cluster)
}
