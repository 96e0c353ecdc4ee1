//! Where a transport's endpoint is and how to reach it: fleet's URL forms parsed
//! (`unix:///path`, `http://host[:port][/base]`, `https://...`), and the TLS connector an
//! `https://` endpoint needs, built from the files given. Nothing connects here.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto};

use super::{EndpointError, Target, TlsFiles, UNIX_HOST};

/// Where `endpoint` is: how to connect, the `Host` header, and the path before `/fleet/v1`.
pub(super) fn locate(
    endpoint: &str,
    tls: &TlsFiles,
) -> Result<(Target, String, String), EndpointError> {
    let bad = |why: &str| EndpointError::Endpoint {
        endpoint: fleet_registry::input::shorten(endpoint),
        why: why.to_owned(),
    };
    let Some((scheme, rest)) = endpoint.split_once("://") else {
        return Err(bad(
            "URL scheme undefined; expected unix:///PATH, http://HOST:PORT or https://HOST:PORT",
        ));
    };
    let given_tls = [&tls.ca_file, &tls.cert_file, &tls.key_file]
        .into_iter()
        .flatten()
        .next();
    if scheme != "https"
        && let Some(file) = given_tls
    {
        return Err(EndpointError::TlsFile {
            path: file.clone(),
            why: format!("given, but the endpoint is {scheme}://; TLS needs an https:// endpoint"),
        });
    }
    match scheme {
        "unix" | "file" => {
            // `unix://var/run/fleet.sock` (one slash short) names host "var".
            if !rest.starts_with('/') {
                return Err(bad("a unix socket needs an absolute path: unix:///PATH"));
            }
            let target = Target::Unix(PathBuf::from(rest));
            Ok((target, UNIX_HOST.to_owned(), String::new()))
        }
        "http" => {
            let at = HttpAddress::parse(rest, 80).map_err(|why| bad(&why))?;
            Ok((Target::Tcp(at.addr), at.authority, at.base))
        }
        "https" => {
            let at = HttpAddress::parse(rest, 443).map_err(|why| bad(&why))?;
            let Some(ca) = &tls.ca_file else {
                return Err(bad(
                    "an https:// endpoint needs --ca-file, the authority of fleetd's certificate",
                ));
            };
            let name = ServerName::try_from(at.hostname.clone())
                .map_err(|_| bad("not a host name or IP address"))?;
            let target = Target::Tls {
                addr: at.addr,
                name,
                connector: connector(ca, tls)?,
            };
            Ok((target, at.authority, at.base))
        }
        _ => Err(bad(
            "unsupported scheme; expected unix://, http:// or https://",
        )),
    }
}

/// The part of an `http(s)://` endpoint after the scheme.
pub(super) struct HttpAddress {
    /// `host:port` to connect to.
    addr: String,
    hostname: String,
    /// As given: the `Host` header.
    authority: String,
    /// The path, without a trailing `/`.
    base: String,
}

impl HttpAddress {
    fn parse(rest: &str, default_port: u16) -> Result<HttpAddress, String> {
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (hostname, port) = split_authority(authority)?;
        Ok(HttpAddress {
            addr: format!("{}:{}", bracketed(hostname), port.unwrap_or(default_port)),
            hostname: hostname.to_owned(),
            authority: authority.to_owned(),
            base: path.to_owned(),
        })
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`.
pub(super) fn split_authority(authority: &str) -> Result<(&str, Option<u16>), String> {
    let port = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| format!("{p:?} is not a port number"))
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or("an IPv6 address lacks its closing \"]\"")?;
        match after.strip_prefix(':') {
            Some(p) => (host, Some(port(p)?)),
            None if after.is_empty() => (host, None),
            None => return Err(format!("unexpected {after:?} after the address")),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, p)) => (host, Some(port(p)?)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    if host.contains('@') {
        return Err("user names are not supported in the endpoint".into());
    }
    Ok((host, port))
}

pub(super) fn bracketed(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

/// The TLS client of `https://` endpoints: trusts `ca` (`--ca-file`) and presents the client
/// certificate if one is given.
pub(super) fn connector(ca: &Path, tls: &TlsFiles) -> Result<TlsConnector, EndpointError> {
    let mut roots = RootCertStore::empty();
    for cert in certs(ca)? {
        roots.add(cert).map_err(|e| EndpointError::TlsFile {
            path: ca.to_path_buf(),
            why: format!("not a CA certificate: {e}"),
        })?;
    }
    let provider = Arc::new(crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| EndpointError::TlsFile {
            path: ca.to_path_buf(),
            why: e.to_string(),
        })?
        .with_root_certificates(roots);
    let config = match (&tls.cert_file, &tls.key_file) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let chain = certs(cert)?;
            let key_bytes = fleet_registry::input::read_pem_file(key).map_err(|why| {
                EndpointError::TlsFile {
                    path: key.clone(),
                    why,
                }
            })?;
            let key_der =
                PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| EndpointError::TlsFile {
                    path: key.clone(),
                    why: format!("no private key: {e}"),
                })?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| EndpointError::TlsFile {
                    path: cert.clone(),
                    why: format!("not a certificate of the key {}: {e}", key.display()),
                })?
        }
        (Some(file), None) | (None, Some(file)) => {
            return Err(EndpointError::TlsFile {
                path: file.clone(),
                why: "a client certificate needs its key: give --cert-file and --key-file".into(),
            });
        }
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

pub(super) fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, EndpointError> {
    let err = |why: String| EndpointError::TlsFile {
        path: path.to_path_buf(),
        why,
    };
    // Capped (issue 38): `--ca-file /dev/zero` is refused, not read until memory runs out.
    let bytes = fleet_registry::input::read_pem_file(path).map_err(err)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("holds no certificate".into()));
    }
    Ok(certs)
}
