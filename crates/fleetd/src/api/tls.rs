//! The TLS configuration of the API's TCP listeners: fleetd's certificate and key, and the
//! authority every client's certificate must be signed by. A client without a certificate,
//! or with one of another authority, fails the handshake: it never reaches the router.
//!
//! Read once at startup; a file that is missing or holds no certificate or key stops fleetd
//! with the file's name, rather than serving TLS that no client could use.

use anyhow::{Context, Result, bail};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig, crypto};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::config::ApiTlsFiles;

/// The acceptor of every TLS listener.
pub fn acceptor(files: &ApiTlsFiles) -> Result<TlsAcceptor> {
    // The provider is named, not taken from the process default: that default is chosen at
    // run time and fails when more than one provider is compiled in.
    let provider = Arc::new(crypto::ring::default_provider());
    let roots = Arc::new(roots(&files.ca)?);
    let verifier = super::crl::verifier(roots, provider.clone(), files.crl.as_deref())?;
    let key = private_key(&files.key)?;
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("api tls: protocol versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs(&files.cert)?, key)
        .with_context(|| {
            format!(
                "api_certfile {} and api_keyfile {}: not a certificate and its key",
                files.cert.display(),
                files.key.display()
            )
        })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The connector of this fleetd's questions to its peers' APIs (`crate::witness`): it trusts
/// the same authority and presents fleetd's own certificate as its client certificate (which
/// therefore needs the `clientAuth` extended key usage as well as `serverAuth`).
pub fn connector(files: &ApiTlsFiles) -> Result<TlsConnector> {
    let provider = Arc::new(crypto::ring::default_provider());
    let roots = roots(&files.ca)?;
    let key = private_key(&files.key)?;
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("api tls: protocol versions")?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs(&files.cert)?, key)
        .context("api_certfile and api_keyfile: not a client certificate and its key")?;
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The authority of `api_cafile`: the roots clients are checked against, and peers too.
fn roots(ca: &Path) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in certs(ca)? {
        roots
            .add(cert)
            .with_context(|| format!("api_cafile {}: not a CA certificate", ca.display()))?;
    }
    Ok(roots)
}

/// The private key of `api_keyfile`, read capped (issue 38: `/dev/zero` is refused, not
/// read until memory runs out).
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let bytes = fleet_registry::input::read_pem_file(path).map_err(anyhow::Error::msg)?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .with_context(|| format!("api_keyfile {}: no private key", path.display()))
}

/// Every certificate of a PEM file, read capped; none is an error.
fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = fleet_registry::input::read_pem_file(path).map_err(anyhow::Error::msg)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("reading certificates from {}", path.display()))?;
    if certs.is_empty() {
        bail!("{} holds no certificate", path.display());
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_api::{Api, Listener};
    use fleet_registry::Registry;
    use fleet_registry::kv::MemKv;
    use fleet_testing::TestCerts;
    use std::net::{IpAddr, Ipv4Addr};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::TlsConnector;
    use tokio_rustls::rustls::ClientConfig;
    use tokio_rustls::rustls::pki_types::ServerName;

    const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn files(certs: &TestCerts) -> ApiTlsFiles {
        ApiTlsFiles {
            ca: certs.ca(),
            cert: certs.server_cert(),
            key: certs.server_key(),
            crl: None,
        }
    }

    /// fleetd's API on a TLS listener of 127.0.0.1 over an empty registry; its address.
    async fn serve(certs: &TestCerts) -> std::net::SocketAddr {
        serve_api(
            certs,
            Api::new(Registry::new(MemKv::new(), "/t/"), 100, "0"),
        )
        .await
    }

    async fn serve_api(certs: &TestCerts, api: Api<MemKv>) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind((LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = acceptor(&files(certs)).unwrap();
        let router = fleet_api::router(api);
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            fleet_api::serve(Listener::Tls(listener, acceptor), router, shutdown).await;
            drop(stop);
        });
        addr
    }

    /// A client trusting `ca`, presenting `identity` (certificate, key) if any.
    fn client(ca: &Path, identity: Option<(&Path, &Path)>) -> TlsConnector {
        let provider = Arc::new(crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for cert in certs(ca).unwrap() {
            roots.add(cert).unwrap();
        }
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    certs(cert).unwrap(),
                    PrivateKeyDer::from_pem_file(key).unwrap(),
                )
                .unwrap(),
        };
        TlsConnector::from(Arc::new(config))
    }

    /// The status line of `GET /fleet/v1/machines`, or why there was none.
    async fn get_machines(
        addr: std::net::SocketAddr,
        client: TlsConnector,
    ) -> Result<String, String> {
        let request = "GET /fleet/v1/machines HTTP/1.1\r\nHost: fleet\r\nConnection: close\r\n\r\n";
        let answer = exchange(addr, client, request).await?;
        match answer.lines().next() {
            Some(status) if !status.is_empty() => Ok(status.to_owned()),
            _ => Err("no answer".into()),
        }
    }

    /// The whole answer to `request`, or why there was none.
    async fn exchange(
        addr: std::net::SocketAddr,
        client: TlsConnector,
        request: &str,
    ) -> Result<String, String> {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::IpAddress(LOCALHOST.into());
        let mut tls = client
            .connect(name, tcp)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tls.write_all(request.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut answer = Vec::new();
        tls.read_to_end(&mut answer)
            .await
            .map_err(|e| format!("read: {e}"))?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    }

    #[tokio::test]
    async fn a_client_certificate_gets_the_role_its_subject_has() {
        use fleet_api::authz::{Role, Roles, Subject};
        let certs = TestCerts::generate(&[LOCALHOST]);
        let registry = Registry::new(MemKv::new(), "/t/");
        // TestCerts' client certificate is `CN=fleet test client`.
        let viewer = Roles::new([(Subject::Cn("fleet test client".into()), Role::Viewer)]);
        let api = Api::new(registry.clone(), 100, "0").with_roles(viewer.unwrap());
        let addr = serve_api(&certs, api).await;
        let identity = (certs.client_cert(), certs.client_key());
        let client = || client(&certs.ca(), Some((&identity.0, &identity.1)));
        assert_eq!(
            get_machines(addr, client()).await.unwrap(),
            "HTTP/1.1 200 OK"
        );
        let body = r#"{"desiredState":"launched","options":[{"section":"Service","name":"ExecStart","value":"/bin/true"}]}"#;
        let put = format!(
            "PUT /fleet/v1/units/a.service HTTP/1.1\r\nHost: fleet\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let answer = exchange(addr, client(), &put).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 403 Forbidden"), "{answer}");
        assert!(
            answer
                .ends_with(r#"{"error":{"code":403,"message":"role viewer may not start units"}}"#),
            "{answer}"
        );
        assert!(registry.units().await.unwrap().items.is_empty());

        // With roles that do not name it, the same certificate may do nothing.
        let api = Api::new(registry.clone(), 100, "0").with_roles(Roles::default());
        let addr = serve_api(&certs, api).await;
        let answer = exchange(
            addr,
            client(),
            "GET /fleet/v1/units HTTP/1.1\r\nHost: fleet\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        assert!(answer.starts_with("HTTP/1.1 403 Forbidden"), "{answer}");
        assert!(
            answer
                .contains("certificate CN=fleet test client has no role in fleetd's configuration"),
            "{answer}"
        );
    }

    #[tokio::test]
    async fn serves_a_client_whose_certificate_the_ca_signed() {
        let certs = TestCerts::generate(&[LOCALHOST]);
        let addr = serve(&certs).await;
        let identity = (certs.client_cert(), certs.client_key());
        let client = client(&certs.ca(), Some((&identity.0, &identity.1)));
        assert_eq!(get_machines(addr, client).await.unwrap(), "HTTP/1.1 200 OK");
    }

    #[tokio::test]
    async fn refuses_a_client_without_a_certificate() {
        let certs = TestCerts::generate(&[LOCALHOST]);
        let addr = serve(&certs).await;
        let answer = get_machines(addr, client(&certs.ca(), None)).await;
        assert!(answer.is_err(), "{answer:?}");
    }

    #[tokio::test]
    async fn refuses_a_client_certificate_of_another_ca() {
        let certs = TestCerts::generate(&[LOCALHOST]);
        let addr = serve(&certs).await;
        let identity = (certs.wrong_client_cert(), certs.wrong_client_key());
        let answer =
            get_machines(addr, client(&certs.ca(), Some((&identity.0, &identity.1)))).await;
        assert!(answer.is_err(), "{answer:?}");
        // And the refused client did not stop the listener.
        let identity = (certs.client_cert(), certs.client_key());
        let client = client(&certs.ca(), Some((&identity.0, &identity.1)));
        assert_eq!(get_machines(addr, client).await.unwrap(), "HTTP/1.1 200 OK");
    }

    #[tokio::test]
    async fn a_plain_http_request_to_a_tls_listener_gets_no_answer() {
        let certs = TestCerts::generate(&[LOCALHOST]);
        let addr = serve(&certs).await;
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET /fleet/v1/machines HTTP/1.1\r\nHost: fleet\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let _ = tcp.read_to_end(&mut answer).await;
        assert!(
            !answer.starts_with(b"HTTP/"),
            "{:?}",
            String::from_utf8_lossy(&answer)
        );
    }

    #[test]
    fn names_the_file_that_holds_no_certificate_or_key() {
        let certs = TestCerts::generate(&[LOCALHOST]);
        let mut bad = files(&certs);
        bad.cert = certs.server_key();
        let e = format!("{:#}", acceptor(&bad).err().unwrap());
        assert!(e.contains("holds no certificate"), "{e}");
        let mut bad = files(&certs);
        bad.key = certs.server_cert();
        let e = format!("{:#}", acceptor(&bad).err().unwrap());
        assert!(e.contains("api_keyfile"), "{e}");
        let mut bad = files(&certs);
        bad.ca = certs.dir().join("missing.pem");
        let e = format!("{:#}", acceptor(&bad).err().unwrap());
        assert!(e.contains("missing.pem"), "{e}");
    }

    /// `openssl ca` over the test authority in `dir`: a CRL revoking `revoked`, into `out`.
    fn write_crl(certs: &TestCerts, revoked: &[&Path], out: &Path) {
        let dir = certs.dir();
        let run = |args: &[&str]| {
            let status = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap();
            assert!(status.success(), "openssl {args:?}");
        };
        std::fs::write(dir.join("index.txt"), "").unwrap();
        std::fs::write(dir.join("crlnumber"), "01\n").unwrap();
        std::fs::write(
            dir.join("ca.cnf"),
            "[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\ncrlnumber = crlnumber\n\
             default_md = sha256\ndefault_crl_days = 30\n",
        )
        .unwrap();
        for cert in revoked {
            let cert = cert.display().to_string();
            run(&[
                "ca", "-config", "ca.cnf", "-keyfile", "ca.key", "-cert", "ca.pem", "-revoke",
                &cert,
            ]);
        }
        let out = out.display().to_string();
        run(&[
            "ca", "-config", "ca.cnf", "-keyfile", "ca.key", "-cert", "ca.pem", "-gencrl", "-out",
            &out,
        ]);
    }

    /// Issue 37, item 5: a certificate the authority revoked fails the handshake once it is
    /// in `api_crlfile`, read again when the file changes, without a restart.
    #[tokio::test]
    async fn a_revoked_client_certificate_is_refused_once_the_crl_file_lists_it() {
        let certs = TestCerts::generate(&[LOCALHOST]);
        let crl = certs.dir().join("api.crl");
        write_crl(&certs, &[], &crl);
        let mut tls = files(&certs);
        tls.crl = Some(crl.clone());
        let listener = tokio::net::TcpListener::bind((LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let api = Api::new(Registry::new(MemKv::new(), "/t/"), 100, "0");
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let served = acceptor(&tls).unwrap();
        tokio::spawn(fleet_api::serve(
            Listener::Tls(listener, served),
            fleet_api::router(api),
            shutdown,
        ));
        let revoked = || {
            client(
                &certs.ca(),
                Some((&certs.client_cert(), &certs.client_key())),
            )
        };
        assert_eq!(
            get_machines(addr, revoked()).await.unwrap(),
            "HTTP/1.1 200 OK"
        );

        write_crl(&certs, &[&certs.client_cert()], &crl);
        let deadline = tokio::time::Instant::now() + 3 * super::super::crl::RELOAD_EVERY;
        loop {
            if get_machines(addr, revoked()).await.is_err() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the revoked client is still served"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        // Another certificate of the authority still is (the server's has clientAuth).
        let other = client(
            &certs.ca(),
            Some((&certs.server_cert(), &certs.server_key())),
        );
        assert_eq!(get_machines(addr, other).await.unwrap(), "HTTP/1.1 200 OK");
        // A file that holds no list stops fleetd at startup, naming it.
        std::fs::write(&crl, "").unwrap();
        let Err(e) = acceptor(&tls) else {
            panic!("an empty api_crlfile was taken");
        };
        assert!(
            format!("{e:#}").contains("holds no revocation list"),
            "{e:#}"
        );
    }
}
