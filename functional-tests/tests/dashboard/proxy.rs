//! A local TLS-terminating proxy that presents one client certificate to fleetd: the browser
//! speaks plain HTTP to it on loopback, fleetd sees a TLS client with that certificate and
//! decides the role from it, as it would for a browser holding the certificate.
//!
//! Why not the browser's own certificate: chromium takes client certificates only from an
//! NSS database (`pk12util`/`certutil`, Debian's libnss3-tools, which `make deps` does not
//! install) plus the `AutoSelectCertificateForUrls` policy under /etc/chromium; the proxy
//! needs neither and puts nothing on the host. What it leaves untested is the browser's TLS
//! handshake, which is rustls' and tested by tls.rs with fleetctl.

use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto};

/// The proxy's loopback address; it serves until the runtime that started it ends.
pub async fn start(
    ca: &Path,
    identity: &(impl AsRef<Path>, impl AsRef<Path>),
    upstream: SocketAddr,
) -> Result<SocketAddr> {
    let provider = Arc::new(crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)? {
        roots.add(cert?)?;
    }
    let chain =
        CertificateDer::pem_file_iter(identity.0.as_ref())?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(identity.1.as_ref())?;
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    let connector = TlsConnector::from(Arc::new(config));
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((browser, _)) = listener.accept().await {
            let connector = connector.clone();
            tokio::spawn(async move {
                if let Err(e) = carry(browser, &connector, upstream).await {
                    eprintln!("dashboard proxy: {e:#}");
                }
            });
        }
    });
    Ok(addr)
}

/// One browser connection, carried over its own TLS connection to fleetd until either side
/// closes.
async fn carry(
    mut browser: TcpStream,
    connector: &TlsConnector,
    upstream: SocketAddr,
) -> Result<()> {
    let tcp = TcpStream::connect(upstream)
        .await
        .context("connecting to fleetd")?;
    let name = ServerName::IpAddress(upstream.ip().into());
    let mut tls = connector
        .connect(name, tcp)
        .await
        .context("TLS handshake with fleetd")?;
    // A browser that closes a held stream resets the copy: not an error of the test's.
    let _ = tokio::io::copy_bidirectional(&mut browser, &mut tls).await;
    Ok(())
}
