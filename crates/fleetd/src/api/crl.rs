//! Revoked client certificates (issue 37, item 5): `api_crlfile` holds the certificate
//! revocation lists of `api_cafile`'s authority (PEM). A client certificate they list fails
//! the TLS handshake. The file is read at startup (a file that holds no list stops fleetd,
//! naming it) and again whenever it changes ([`RELOAD_EVERY`]), so revoking a certificate
//! needs no restart; a new file that cannot be read keeps the lists before it, at error.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tokio_rustls::rustls::client::danger::HandshakeSignatureValid;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, CertificateRevocationListDer, UnixTime};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::{
    DigitallySignedStruct, DistinguishedName, Error, RootCertStore, SignatureScheme,
};
use tracing::{error, info};

/// How often the CRL file is looked at for a change.
pub const RELOAD_EVERY: Duration = Duration::from_secs(5);

/// The client certificate verifier of the API's TLS listeners: the authority's roots, and
/// the revocation lists of `crl` when given.
pub fn verifier(
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
    crl: Option<&Path>,
) -> Result<Arc<dyn ClientCertVerifier>> {
    let Some(crl) = crl else {
        return WebPkiClientVerifier::builder_with_provider(roots, provider)
            .build()
            .context("api_cafile: building the client certificate verifier");
    };
    let lists = read_crls(crl)?;
    let inner = build(&roots, &provider, lists)
        .with_context(|| format!("api_crlfile {}", crl.display()))?;
    let reloading = Arc::new(Reloading {
        hints: inner.root_hint_subjects().to_vec(),
        current: RwLock::new(inner),
    });
    let watched = Watched {
        path: crl.to_path_buf(),
        seen: stamp(crl),
        roots,
        provider,
        verifier: reloading.clone(),
    };
    tokio::spawn(watched.run());
    Ok(reloading)
}

fn build(
    roots: &Arc<RootCertStore>,
    provider: &Arc<CryptoProvider>,
    lists: Vec<CertificateRevocationListDer<'static>>,
) -> Result<Arc<dyn ClientCertVerifier>> {
    WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        .with_crls(lists)
        .build()
        .context("building the client certificate verifier with its revocation lists")
}

/// Every revocation list of a PEM file; none is an error.
fn read_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>> {
    let bytes = fleet_registry::input::read_pem_file(path).map_err(anyhow::Error::msg)?;
    let lists = CertificateRevocationListDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("api_crlfile {}: reading revocation lists", path.display()))?;
    if lists.is_empty() {
        anyhow::bail!("api_crlfile {} holds no revocation list", path.display());
    }
    Ok(lists)
}

/// What tells a changed file: its modification time and length.
fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// The CRL file, looked at every [`RELOAD_EVERY`].
struct Watched {
    path: PathBuf,
    seen: Option<(SystemTime, u64)>,
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
    verifier: Arc<Reloading>,
}

impl Watched {
    async fn run(mut self) {
        loop {
            tokio::time::sleep(RELOAD_EVERY).await;
            let now = stamp(&self.path);
            if now == self.seen {
                continue;
            }
            self.seen = now;
            let rebuilt =
                read_crls(&self.path).and_then(|lists| build(&self.roots, &self.provider, lists));
            match rebuilt {
                Ok(inner) => {
                    *self
                        .verifier
                        .current
                        .write()
                        .unwrap_or_else(|e| e.into_inner()) = inner;
                    info!(path = %self.path.display(), "api_crlfile read again: revoked client certificates are refused from now on");
                }
                Err(e) => {
                    error!(path = %self.path.display(), error = %format!("{e:#}"), "api_crlfile changed but cannot be read; the revocation lists before it stay");
                }
            }
        }
    }
}

/// A verifier whose revocation lists can be replaced while listeners hold it.
#[derive(Debug)]
struct Reloading {
    /// The roots' names, the same for every list (the authority does not change).
    hints: Vec<DistinguishedName>,
    current: RwLock<Arc<dyn ClientCertVerifier>>,
}

impl Reloading {
    fn current(&self) -> Arc<dyn ClientCertVerifier> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl ClientCertVerifier for Reloading {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        self.current()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().supported_verify_schemes()
    }
}
