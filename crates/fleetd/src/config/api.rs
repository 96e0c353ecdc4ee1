//! The API's keys (issue 15): page size, the default unix socket, extra listeners. Each is a
//! row of [`KEYS`](super::KEYS), with its default; here are their setters, and [`resolve`],
//! the checks across them once every key is read.
//!
//! - `token_limit`: entries per page (fleet's key, default 100).
//! - `api_socket`: the unix socket served when systemd passes none (default
//!   `/var/run/fleet.sock`, mode 0660; empty: none).
//! - `api_listen`: more listeners, comma-separated, each `unix:PATH` or `tcp:HOST:PORT`
//!   (a bare `HOST:PORT` is TCP).
//! - `api_cafile`, `api_certfile`, `api_keyfile` (all three or none): every TCP listener
//!   (`api_listen`'s and systemd's) speaks TLS with this certificate and key, and requires a
//!   client certificate signed by the CA. Unix sockets stay plain: their file mode guards them.
//! - `api_crlfile`: PEM revocation lists of `api_cafile`'s authority; a revoked client
//!   certificate fails the handshake; read again when it changes (`crate::api::crl`).
//! - `api_deny`: subjects (`CN=` or `O=`) refused everything whatever role their other
//!   names give (issue 37).
//! - `api_allow_plain_tcp`: plain TCP listeners serve anyone who can reach them, as admin, so
//!   without TLS only loopback addresses are taken unless this is true: `api_listen`'s here,
//!   the TCP sockets systemd passes when fleetd starts (`crate::api::listeners`, issue 37).
//! - `api_advertise`: the URL other machines' fleetctl reach this fleetd's API at
//!   (`https://HOST:PORT` or `http://HOST:PORT`), published in this machine's presence for
//!   `fleetctl status` and `journal` (issue 16). Unset: derived from the first TCP listener
//!   (`https://` with TLS, the listener's IP, or `public_ip` for a wildcard address); empty:
//!   none is published.
//! - `api_admins`, `api_operators`, `api_viewers` (issue 17): comma-separated subjects,
//!   `CN=<name>` or `O=<group>`, whose TLS client certificates hold that role
//!   (`fleet_api::authz`). They need TLS; a subject in two roles stops fleetd. With TLS and
//!   none of them, no certificate has a role: every request over TCP is refused (403).
//! - `api_socket_group`, `api_socket_mode`: the group (name or number; default `fleet` when
//!   that group exists, else the socket keeps fleetd's own, root's) and mode (octal, default
//!   0660) of the unix sockets fleetd makes. Sockets systemd passes keep the `.socket` unit's
//!   `SocketGroup=`/`SocketMode=`.
//! - `api_held_view`: the listing of every unit is served from a view of the registry the
//!   API holds while listings come (`fleet_api::held`; default true); false: every page
//!   reads etcd, and no fleetd holds a copy of the registry for its API.

use anyhow::{Result, anyhow};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use super::Raw;
use super::key::{Parsed, invalid};
use fleet_api::authz::{Role, Roles, RolesError, Subject};

pub const DEFAULT_SOCKET: &str = "/var/run/fleet.sock";

/// The group of the unix sockets when `api_socket_group` is unset, if it exists (fleet's).
pub const DEFAULT_SOCKET_GROUP: &str = "fleet";

/// The mode of the unix sockets when `api_socket_mode` is unset.
pub const DEFAULT_SOCKET_MODE: u32 = 0o660;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiConfig {
    pub token_limit: u16,
    /// None: no default socket.
    pub socket: Option<PathBuf>,
    pub listen: Vec<ListenAddr>,
    /// None: TCP listeners are plain.
    pub tls: Option<ApiTlsFiles>,
    pub advertise: Advertise,
    /// Client certificate subjects and their roles (empty: none has one).
    pub roles: Roles,
    /// The unix sockets' owner group and mode.
    pub socket_access: SocketAccess,
    /// Whether unit listings come from a held view of the registry.
    pub held_view: bool,
    /// `api_allow_plain_tcp`: plain TCP on other than loopback addresses, `api_listen`'s and
    /// those systemd passes.
    pub allow_plain_tcp: bool,
}

/// Who may use the unix sockets fleetd makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketAccess {
    pub group: SocketGroup,
    pub mode: u32,
}

impl Default for SocketAccess {
    fn default() -> Self {
        SocketAccess {
            group: SocketGroup::Default,
            mode: DEFAULT_SOCKET_MODE,
        }
    }
}

/// `api_socket_group`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SocketGroup {
    /// Unset: [`DEFAULT_SOCKET_GROUP`] if the host has it, else left as made (fleetd's).
    #[default]
    Default,
    /// A group name, which must exist.
    Name(String),
    Gid(u32),
}

/// What this machine publishes as its API address (`MachineInfo::api`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Advertise {
    /// From the first TCP listener (`api_advertise` unset).
    #[default]
    Derived,
    /// `api_advertise=` (empty): no address is published.
    Nothing,
    /// `api_advertise`'s URL, checked: `http(s)://HOST:PORT`.
    Url(String),
}

/// The PEM files of the API's TLS listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiTlsFiles {
    /// The authority a client's certificate must be signed by.
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// `api_crlfile`: revocation lists of `ca`'s authority (`crate::api::crl`).
    pub crl: Option<PathBuf>,
}

/// A listener fleetd opens itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

/// What `resolve` combines of the API's keys: the TLS files (all three or none) and the
/// subjects of the role keys (they need TLS, and a subject holds one role).
#[derive(Debug, Default)]
pub struct Parts {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub crl: Option<PathBuf>,
    /// In the role keys' order (admins, operators, viewers), which a refusal follows.
    roles: Vec<(Subject, Role)>,
    denied: Vec<Subject>,
}

pub fn set_token_limit(p: &mut Parsed, v: &str) -> Result<(), String> {
    p.config.api.token_limit = v
        .trim()
        .parse::<u16>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or("expected a whole number from 1 to 65535")?;
    Ok(())
}

pub fn set_socket(p: &mut Parsed, v: &str) -> Result<(), String> {
    p.config.api.socket = match v {
        "" => None,
        v if !v.starts_with('/') => return Err("expected an absolute path".into()),
        v => Some(PathBuf::from(v)),
    };
    Ok(())
}

/// Each listener parsed; whether a TCP one may be plain is `resolve`'s (it needs the TLS
/// files and `api_allow_plain_tcp`).
pub fn set_listen(p: &mut Parsed, v: &str) -> Result<(), String> {
    p.config.api.listen = v
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(parse_listen)
        .collect::<Result<_, _>>()?;
    Ok(())
}

pub fn set_advertise(p: &mut Parsed, v: &str) -> Result<(), String> {
    p.config.api.advertise = match v.trim() {
        "" => Advertise::Nothing,
        v => Advertise::Url(advertise_url(v)?),
    };
    Ok(())
}

/// `api_admins`, `api_operators`, `api_viewers`: their subjects get `role`.
pub fn add_role(p: &mut Parsed, v: &str, role: Role) -> Result<(), String> {
    p.api
        .roles
        .extend(subjects(v)?.into_iter().map(|s| (s, role)));
    Ok(())
}

pub fn set_deny(p: &mut Parsed, v: &str) -> Result<(), String> {
    p.api.denied = subjects(v)?;
    Ok(())
}

pub fn set_socket_group(p: &mut Parsed, v: &str) -> Result<(), String> {
    p.config.api.socket_access.group =
        socket_group(v.trim()).ok_or("expected a group name or number")?;
    Ok(())
}

pub fn set_socket_mode(p: &mut Parsed, v: &str) -> Result<(), String> {
    p.config.api.socket_access.mode = u32::from_str_radix(v.trim(), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or("expected an octal mode like 0660")?;
    Ok(())
}

/// Comma-separated subjects, `CN=<name>` or `O=<group>`.
fn subjects(v: &str) -> Result<Vec<Subject>, String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| item.parse().map_err(|e: RolesError| e.to_string()))
        .collect()
}

/// The checks across the API's keys, once every key is read: the TLS files go together,
/// plain TCP takes only loopback addresses unless allowed, and roles need TLS.
pub fn resolve(api: &mut ApiConfig, parts: Parts, raw: &BTreeMap<String, Raw>) -> Result<()> {
    let Parts {
        ca,
        cert,
        key,
        crl,
        roles,
        denied,
    } = parts;
    api.tls = tls_files([ca, cert, key], crl)?;
    let plain = |l: &ListenAddr| match l {
        ListenAddr::Tcp(a) if !a.ip().is_loopback() => Some(*a),
        ListenAddr::Tcp(_) | ListenAddr::Unix(_) => None,
    };
    if api.tls.is_none()
        && !api.allow_plain_tcp
        && let Some(a) = api.listen.iter().find_map(plain)
    {
        let why = format!(
            "{a} is not a loopback address: plain TCP would serve anyone who reaches it \
             (set api_cafile, api_certfile and api_keyfile to serve TLS, or \
             api_allow_plain_tcp=true)"
        );
        return Err(match raw.get("api_listen") {
            Some(r) => invalid("api_listen", r, &why),
            None => anyhow!("invalid api_listen: {why}"),
        });
    }
    let roles = Roles::new(roles)
        .map(|roles| roles.denying(denied))
        .map_err(|e| anyhow!("invalid api roles: {e}"))?;
    if !roles.is_empty() && api.tls.is_none() {
        return Err(anyhow!(
            "api_admins, api_operators and api_viewers give roles to TLS client certificates: \
             they need api_cafile, api_certfile and api_keyfile"
        ));
    }
    api.roles = roles;
    Ok(())
}

/// A group name as `groupadd` takes them, or a number.
fn socket_group(value: &str) -> Option<SocketGroup> {
    if let Ok(gid) = value.parse::<u32>() {
        return Some(SocketGroup::Gid(gid));
    }
    let mut chars = value.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = value.len() <= 32
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    (first_ok && rest_ok).then(|| SocketGroup::Name(value.to_owned()))
}

/// `http://HOST:PORT` or `https://HOST:PORT` (a trailing `/` is dropped): HOST a name or an
/// IP address (IPv6 in brackets), PORT 1 to 65535, nothing after it. Clients add the API's
/// paths to it, so a path, query or credentials would only mislead them.
fn advertise_url(value: &str) -> Result<String, String> {
    let value = value.strip_suffix('/').unwrap_or(value);
    let Some((scheme, rest)) = value.split_once("://") else {
        return Err("expected https://HOST:PORT or http://HOST:PORT".to_owned());
    };
    if scheme != "https" && scheme != "http" {
        return Err(format!("scheme {scheme:?} is not https or http"));
    }
    // Before HOST:PORT is split: `https://h:1/path` is a URL with a path, not port "1/path".
    if let Some(at) = rest.find(['/', '?', '#']) {
        return Err(format!(
            "has a path or query ({:?}); clients add the API's paths themselves: give only https://HOST:PORT",
            &rest[at..]
        ));
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() => (host, port),
        _ => return Err(format!("{rest:?} is not HOST:PORT")),
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => {}
        _ => return Err(format!("port {port:?} is not a number from 1 to 65535")),
    }
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        host.parse::<std::net::Ipv4Addr>().is_ok() || is_dns_name(host)
    };
    if !host_ok {
        return Err(format!("host {host:?} is no IP address or DNS name"));
    }
    Ok(value.to_owned())
}

/// Letters, digits, `-` and `.`, in labels of 1 to 63 bytes not starting or ending with `-`.
fn is_dns_name(host: &str) -> bool {
    host.len() <= 253
        && host.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// `api_cafile`, `api_certfile` and `api_keyfile`: all three, or none. One or two alone would
/// serve TLS without client certificates, or not at all, against what was asked.
fn tls_files(files: [Option<PathBuf>; 3], crl: Option<PathBuf>) -> Result<Option<ApiTlsFiles>> {
    const KEYS: [&str; 3] = ["api_cafile", "api_certfile", "api_keyfile"];
    let missing: Vec<&str> = KEYS
        .iter()
        .zip(&files)
        .filter(|(_, f)| f.is_none())
        .map(|(k, _)| *k)
        .collect();
    match files {
        [None, None, None] if crl.is_some() => Err(anyhow!(
            "api_crlfile needs TLS: set api_cafile, api_certfile and api_keyfile"
        )),
        [None, None, None] => Ok(None),
        [Some(ca), Some(cert), Some(key)] => Ok(Some(ApiTlsFiles { ca, cert, key, crl })),
        _ => Err(anyhow!(
            "TLS for the API needs api_cafile, api_certfile and api_keyfile together; \
             missing {}",
            missing.join(", ")
        )),
    }
}

fn parse_listen(item: &str) -> Result<ListenAddr, String> {
    if let Some(path) = item.strip_prefix("unix:") {
        if !path.starts_with('/') {
            return Err(format!("unix socket {path:?} is not an absolute path"));
        }
        return Ok(ListenAddr::Unix(PathBuf::from(path)));
    }
    let addr = item.strip_prefix("tcp:").unwrap_or(item);
    addr.parse::<SocketAddr>()
        .map(ListenAddr::Tcp)
        .map_err(|_| format!("{addr:?} is not unix:PATH or tcp:IP:PORT"))
}

#[cfg(test)]
mod tests;
