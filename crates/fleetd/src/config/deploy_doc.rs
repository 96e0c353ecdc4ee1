//! docs/deploy.md's certificates, made as the page says and taken as fleetd takes them, so
//! that the page cannot drift from what fleetd accepts: every `sh` block of the page that
//! runs openssl is run as written (in a scratch directory), the page's `fleet.conf` (its
//! `ini` block, with `/etc/fleet/tls/` pointing there) is read by fleetd's own parser, and
//! the API certificates it names then serve and pass TLS handshakes: a person's, a deployer's,
//! Prometheus's, and a peer fleetd's, each getting the role the page says.

use super::{Raw, api, file};
use fleet_api::{Api, Listener};
use fleet_registry::Registry;
use fleet_registry::kv::MemKv;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto};

fn deploy_md() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/deploy.md");
    std::fs::read_to_string(path).unwrap()
}

/// The bodies of the page's fenced blocks of `lang`.
fn blocks(doc: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        match &mut current {
            None if line.trim_start() == format!("```{lang}") => current = Some(String::new()),
            Some(_) if line.trim_start() == "```" => out.extend(current.take()),
            Some(body) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {}
        }
    }
    out
}

/// A scratch directory of this test, empty.
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fleetd-deploy-doc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn openssl_verify(dir: &Path, ca: &str, purpose: &str, cert: &str) {
    let out = Command::new("openssl")
        .args(["verify", "-CAfile", ca, "-purpose", purpose, cert])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cert} is not a {purpose} certificate of {ca}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A client of the API's CA presenting `name`.crt/.key from `dir`.
fn client(dir: &Path, name: &str) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(dir.join("api-ca.crt")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let certs = CertificateDer::pem_file_iter(dir.join(format!("{name}.crt")))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join(format!("{name}.key"))).unwrap();
    let config = ClientConfig::builder_with_provider(Arc::new(crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .unwrap();
    TlsConnector::from(Arc::new(config))
}

/// The status line of the answer to `method path` (with `body`) through `client`, or why
/// there was none. The server is reached at 127.0.0.1 under the name its certificate has,
/// node1's IP.
async fn ask(
    addr: SocketAddr,
    client: TlsConnector,
    method: &str,
    path: &str,
    body: &str,
) -> Result<String, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::IpAddress(IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1)).into());
    let mut tls = client
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: fleet\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer)
        .await
        .map_err(|e| format!("read: {e}"))?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    Ok(answer.lines().next().unwrap_or_default().to_owned())
}

/// Runs every `sh` block of `doc` that runs openssl, as written, in `dir`.
fn run_openssl_blocks(doc: &str, dir: &Path) {
    let scripts: Vec<String> = blocks(doc, "sh")
        .into_iter()
        .filter(|b| b.contains("openssl "))
        .collect();
    assert!(
        scripts.len() >= 4,
        "deploy.md has {} openssl blocks",
        scripts.len()
    );
    for script in &scripts {
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "deploy.md's\n{script}\nfailed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The page's fleet.conf, its `/etc/fleet/tls/` files and its etcd password file (made here,
/// mode 0600: the page has root write it) in `dir`, as fleetd reads it.
fn fleet_conf(doc: &str, dir: &Path) -> BTreeMap<String, Raw> {
    use std::os::unix::fs::PermissionsExt;
    let ini = blocks(doc, "ini")
        .into_iter()
        .find(|b| b.contains("api_certfile"))
        .expect("deploy.md's fleet.conf");
    let password = dir.join("etcd-password");
    std::fs::write(&password, "s3cret\n").unwrap();
    std::fs::set_permissions(&password, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ini = ini
        .replace("/etc/fleet/tls/", &format!("{}/", dir.display()))
        .replace("/etc/fleet/etcd-password", &password.display().to_string());
    file::parse_file(Path::new("deploy.md"), &ini).unwrap()
}

/// fleetd's API as `config` sets it up, on a TLS listener of 127.0.0.1; its address.
async fn serve(config: api::ApiConfig) -> SocketAddr {
    let files = config.tls.expect("deploy.md's fleet.conf serves TLS");
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = crate::api::tls::acceptor(&files).unwrap();
    let api = Api::new(Registry::new(MemKv::new(), "/t/"), 100, "0")
        .with_roles(config.roles)
        .with_metrics(fleet_api::Metrics::default(), Arc::default());
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        fleet_api::serve(
            Listener::Tls(listener, acceptor),
            fleet_api::router(api),
            shutdown,
        )
        .await;
        drop(stop);
    });
    addr
}

#[tokio::test]
async fn the_certificates_deploy_md_makes_are_the_ones_fleetd_and_etcd_accept() {
    let doc = deploy_md();
    let dir = scratch();
    run_openssl_blocks(&doc, &dir);
    let raw = fleet_conf(&doc, &dir);

    // etcd's files: fleetd's client certificate, the admin's, the members' (server and peer).
    let value = |key: &str| raw[key].value.clone();
    assert!(Path::new(&value("etcd_keyfile")).is_file());
    openssl_verify(
        &dir,
        &value("etcd_cafile"),
        "sslclient",
        &value("etcd_certfile"),
    );
    openssl_verify(&dir, "etcd-ca.crt", "sslclient", "admin.crt");
    for member in ["etcd1.crt", "etcd2.crt", "etcd3.crt"] {
        openssl_verify(&dir, "etcd-ca.crt", "sslserver", member);
        openssl_verify(&dir, "etcd-ca.crt", "sslclient", member);
    }

    // The whole page's fleet.conf is a configuration fleetd takes; its API part serves.
    let config = super::build(&raw, &mut vec![]).unwrap().api;
    let files = config.tls.clone().unwrap();
    let addr = serve(config).await;
    let get = |who: &str, path: &'static str| ask(addr, client(&dir, who), "GET", path, "");
    let start = |who: &str| {
        let unit = format!("/fleet/v1/units/{who}.service");
        let body = r#"{"desiredState":"launched","options":[{"section":"Service","name":"ExecStart","value":"/bin/true"}]}"#;
        let client = client(&dir, who);
        async move { ask(addr, client, "PUT", &unit, body).await }
    };
    // alice is an admin by name, ci an operator by group, Prometheus a viewer by group:
    // every one reads (metrics too), the first two write, Prometheus is refused a write.
    let ok = "HTTP/1.1 200 OK";
    for who in ["alice", "ci", "prometheus"] {
        assert_eq!(get(who, "/fleet/v1/units").await.unwrap(), ok, "{who}");
    }
    assert_eq!(get("prometheus", "/metrics").await.unwrap(), ok);
    for who in ["alice", "ci"] {
        let status = start(who).await.unwrap();
        assert!(status.starts_with("HTTP/1.1 20"), "{who}: {status}");
    }
    assert_eq!(start("prometheus").await.unwrap(), "HTTP/1.1 403 Forbidden");

    // A peer fleetd asks with its own server certificate (clientAuth), through fleetd's
    // connector: the handshake passes and the health route answers it.
    let node2 = api::ApiTlsFiles {
        cert: dir.join("node2-api.crt"),
        key: dir.join("node2-api.key"),
        ..files
    };
    let peer = crate::api::tls::connector(&node2).unwrap();
    let health = ask(addr, peer, "GET", "/fleet/v1/health", "")
        .await
        .unwrap();
    assert!(health.starts_with("HTTP/1.1 "), "{health:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
