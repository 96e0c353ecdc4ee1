//! Serving fleet's HTTP API from fleetd: which sockets, and the task that serves them.
//!
//! Sockets systemd passes (`LISTEN_FDS`, as fleet's `fleet.socket`) replace the default unix
//! socket; `api_listen` adds more either way. The API runs on its own tasks and reads the
//! registry with its own requests, so it never waits on, or holds up, the agent or the
//! engine; while etcd is away it answers 503.
//!
//! The address this machine publishes for its API (`MachineInfo::api`, issue 16) is
//! `api_advertise`, or derived from the first TCP listener ([`advertised`]).

use anyhow::{Context, Result, bail};
use fleet_api::{Api, Listener};
use fleet_registry::kv::Kv;
use fleet_registry::{Registry, SharedStore};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::config::{Advertise, ApiConfig, ListenAddr, SocketAccess, SocketGroup};

mod crl;
pub(crate) mod tls;

/// Sockets passed by systemd, taken (and the variables cleared) before any thread starts.
#[derive(Debug, Default)]
pub struct Activated {
    listeners: Vec<ActivatedSocket>,
}

#[derive(Debug)]
enum ActivatedSocket {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

impl Activated {
    /// Reads `LISTEN_PID`/`LISTEN_FDS` (fds 3 onwards). Must run while the process has one
    /// thread: it clears the variables. A passed fd that is no stream socket is an error.
    pub fn from_env() -> Result<Activated> {
        let mut fds = listenfd::ListenFd::from_env();
        let mut listeners = Vec::new();
        for idx in 0..fds.len() {
            if let Ok(Some(l)) = fds.take_tcp_listener(idx) {
                listeners.push(ActivatedSocket::Tcp(l));
                continue;
            }
            match fds.take_unix_listener(idx) {
                Ok(Some(l)) => listeners.push(ActivatedSocket::Unix(l)),
                Ok(None) => {}
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "socket activation: fd {} is no TCP or unix stream socket",
                            idx + 3
                        )
                    });
                }
            }
        }
        Ok(Activated { listeners })
    }
}

/// Every listener the API serves: the activated ones or the default socket, then
/// `api_listen`'s. TCP ones serve TLS when the config has its files.
pub fn listeners(config: &ApiConfig, activated: Activated) -> Result<Vec<Listener>> {
    let acceptor = config.tls.as_ref().map(tls::acceptor).transpose()?;
    let tcp = |l: tokio::net::TcpListener| match &acceptor {
        Some(a) => Listener::Tls(l, a.clone()),
        None => Listener::Tcp(l),
    };
    let access = socket_access(&config.socket_access)?;
    let mut out = Vec::new();
    for socket in activated.listeners {
        out.push(match socket {
            ActivatedSocket::Tcp(l) => {
                let addr = l.local_addr().context("a TCP socket systemd passed")?;
                if let Some(why) = plain_refused(config, addr) {
                    bail!("systemd passed TCP socket {addr}: {why}");
                }
                l.set_nonblocking(true)?;
                tcp(tokio::net::TcpListener::from_std(l)?)
            }
            ActivatedSocket::Unix(l) => {
                l.set_nonblocking(true)?;
                Listener::Unix(tokio::net::UnixListener::from_std(l)?)
            }
        });
    }
    if out.is_empty()
        && let Some(path) = &config.socket
    {
        // The default socket is a convenience: a host where it cannot be made (not root, a
        // read-only /var/run) still runs its units, so this is a warning, not a failure.
        match unix_socket(path, access) {
            Ok(l) => out.push(l),
            Err(e) => {
                warn!(socket = %path.display(), error = %format!("{e:#}"), "fleet api default socket not served")
            }
        }
    }
    for addr in &config.listen {
        out.push(match addr {
            ListenAddr::Unix(path) => unix_socket(path, access)?,
            ListenAddr::Tcp(a) => tcp(std::net::TcpListener::bind(a)
                .and_then(|l| {
                    l.set_nonblocking(true)?;
                    tokio::net::TcpListener::from_std(l)
                })
                .with_context(|| format!("listening on {a}"))?),
        });
    }
    Ok(out)
}

/// Why a plain TCP listener on `addr` is refused, if it is (issue 37): without TLS, plain TCP
/// serves everyone who reaches it as admin, so only loopback is taken unless
/// `api_allow_plain_tcp=true`. The same rule as `api_listen`'s (`crate::config::api`).
fn plain_refused(config: &ApiConfig, addr: std::net::SocketAddr) -> Option<String> {
    (config.tls.is_none() && !addr.ip().is_loopback() && !config.allow_plain_tcp).then(|| {
        format!(
            "{} is not a loopback address and fleetd has no TLS: plain TCP would serve anyone \
             who reaches it as admin (set api_cafile, api_certfile and api_keyfile to serve \
             TLS, or api_allow_plain_tcp=true)",
            addr.ip()
        )
    })
}

/// Warns of each plain TCP listener: whoever reaches it is admin (every local user, for a
/// loopback one).
pub fn warn_plain(listeners: &[Listener]) {
    for l in listeners {
        if let Listener::Tcp(tcp) = l
            && let Ok(addr) = tcp.local_addr()
        {
            warn!(listener = %addr, "plain TCP api listener: whoever reaches it (every local user, on loopback) may do everything (admin); serve TLS for roles");
        }
    }
}

/// The group (None: leave it) and mode of the unix sockets fleetd makes. The default group
/// is fleet's, `fleet`, when the host has it; else the socket keeps fleetd's own group (root's).
fn socket_access(access: &SocketAccess) -> Result<(Option<u32>, u32)> {
    let gid = match &access.group {
        SocketGroup::Gid(gid) => Some(*gid),
        SocketGroup::Name(name) => Some(
            group_id(name)?
                .with_context(|| format!("api_socket_group: no group {name:?} in /etc/group"))?,
        ),
        SocketGroup::Default => {
            let gid = group_id(crate::config::DEFAULT_SOCKET_GROUP).unwrap_or(None);
            if gid.is_none() {
                info!(
                    group = crate::config::DEFAULT_SOCKET_GROUP,
                    "no such group: the api's unix sockets keep fleetd's own group"
                );
            }
            gid
        }
    };
    Ok((gid, access.mode))
}

/// The ID of group `name` in /etc/group (fleetd reads no other group database).
fn group_id(name: &str) -> Result<Option<u32>> {
    let groups = std::fs::read_to_string("/etc/group").context("reading /etc/group")?;
    Ok(groups.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next()? == name).then_some(())?;
        fields.nth(1)?.parse().ok()
    }))
}

/// A unix socket at `path`, with `access`'s group (if any) and mode (fleet's `fleet.socket`
/// is root:fleet 0660: that group may use the API). A stale socket from an earlier fleetd is
/// replaced; any other file is not.
fn unix_socket(path: &Path, (gid, mode): (Option<u32>, u32)) -> Result<Listener> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!("{} is served by another process", path.display());
            }
            std::fs::remove_file(path)
                .with_context(|| format!("removing stale socket {}", path.display()))?
        }
        Ok(_) => bail!("{} exists and is not a socket", path.display()),
        Err(_) => {}
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let listener = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("listening on {}", path.display()))?;
    if let Some(gid) = gid {
        std::os::unix::fs::chown(path, None, Some(gid))
            .with_context(|| format!("setting the group of {} to {gid}", path.display()))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    Ok(Listener::Unix(listener))
}

/// The URL this machine publishes for its API: `api_advertise`'s, or from the first TCP
/// listener (`https://` when it serves TLS; its IP, or `public_ip` for a wildcard address);
/// empty when there is none to publish.
pub fn advertised(config: &ApiConfig, listeners: &[Listener], public_ip: &str) -> String {
    match &config.advertise {
        Advertise::Url(url) => url.clone(),
        Advertise::Nothing => String::new(),
        Advertise::Derived => {
            let first_tcp = listeners.iter().find_map(|l| match l {
                Listener::Tcp(t) => t.local_addr().ok().map(|a| (a, false)),
                Listener::Tls(t, _) => t.local_addr().ok().map(|a| (a, true)),
                Listener::Unix(_) => None,
            });
            match first_tcp {
                Some((addr, tls)) => derive_url(addr, tls, public_ip),
                None => String::new(),
            }
        }
    }
}

/// `scheme://host:port` of a listener on `addr`; a wildcard address is reached at
/// `public_ip` (empty if that is unknown too).
fn derive_url(addr: std::net::SocketAddr, tls: bool, public_ip: &str) -> String {
    let scheme = if tls { "https" } else { "http" };
    let host = if addr.ip().is_unspecified() {
        match public_ip.parse::<std::net::IpAddr>() {
            Ok(ip) => ip,
            Err(_) => return String::new(),
        }
    } else {
        addr.ip()
    };
    // SocketAddr's Display puts an IPv6 address in brackets.
    format!(
        "{scheme}://{}",
        std::net::SocketAddr::new(host, addr.port())
    )
}

/// What the status and journal routes need: this machine, its inspector, and the units its
/// agent refuses (`deny_units`).
pub type Inspection = (
    fleet_core::MachineId,
    Arc<dyn fleet_api::Inspector>,
    Vec<String>,
);

/// fleetd's API over `registry`, counting into `metrics`; with `inspection` it serves the
/// status and journal of this machine's units. Its held view takes the process's store of the
/// registry from `stores`, which the engine leader shares.
pub fn build<K: Kv>(
    registry: Registry<K>,
    stores: SharedStore<K>,
    config: &ApiConfig,
    version: &str,
    inspection: Option<Inspection>,
    metrics: &crate::metrics::Metrics,
) -> Api<K> {
    let mut api = Api::new(registry, config.token_limit, version)
        .with_metrics(metrics.api.clone(), metrics.exposed.clone());
    if config.held_view {
        api = api.with_held_view_sharing(fleet_api::held::HELD_VIEW_IDLE, stores);
    }
    // With TLS, a certificate has the role the config gives it, and none by default; the
    // unix socket and plain TCP (only without TLS) are admin.
    if config.tls.is_some() {
        if config.roles.is_empty() {
            warn!(
                "api_admins, api_operators and api_viewers are empty: every request over tls is refused"
            );
        }
        api = api.with_roles(config.roles.clone());
    }
    match inspection {
        Some((machine, inspector, deny_units)) => {
            api.with_inspector(machine, inspector).refusing(deny_units)
        }
        None => api,
    }
}

/// Serves `api` on every listener, one task each, until `shutdown`.
pub fn spawn<K: Kv>(
    tasks: &mut JoinSet<Result<()>>,
    api: Api<K>,
    listeners: Vec<Listener>,
    shutdown: watch::Receiver<bool>,
) {
    if listeners.is_empty() {
        info!("fleet api not served: no listener");
        return;
    }
    let router = fleet_api::router(api);
    for listener in listeners {
        let router = router.clone();
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            fleet_api::serve(listener, router, shutdown.clone()).await;
            // A listener ends only on shutdown; otherwise fleetd reports it as stopped.
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("fleetd-api-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn config(socket: &Path) -> ApiConfig {
        ApiConfig {
            token_limit: 100,
            socket: Some(socket.to_path_buf()),
            listen: vec![],
            tls: None,
            advertise: Advertise::Derived,
            roles: Default::default(),
            socket_access: SocketAccess::default(),
            held_view: true,
            allow_plain_tcp: false,
        }
    }

    /// Issue 37, item 1: a TCP socket systemd passes follows `api_listen`'s rule. Without
    /// TLS, one on a wildcard address would serve every host of the network as admin: fleetd
    /// refuses to start and names it, unless `api_allow_plain_tcp=true`; loopback is taken.
    #[tokio::test]
    async fn a_passed_plain_tcp_socket_off_loopback_is_refused_unless_plain_tcp_is_allowed() {
        let dir = temp_dir("passed");
        let mut cfg = config(&dir.join("fleet.sock"));
        let passed = |addr: &str| Activated {
            listeners: vec![ActivatedSocket::Tcp(
                std::net::TcpListener::bind(addr).unwrap(),
            )],
        };
        let e = listeners(&cfg, passed("0.0.0.0:0"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("systemd passed TCP socket 0.0.0.0:"), "{e}");
        assert!(e.contains("api_allow_plain_tcp=true"), "{e}");
        let served = listeners(&cfg, passed("127.0.0.1:0")).unwrap();
        assert!(matches!(served[..], [Listener::Tcp(_)]), "{served:?}");
        cfg.allow_plain_tcp = true;
        let served = listeners(&cfg, passed("0.0.0.0:0")).unwrap();
        assert!(matches!(served[..], [Listener::Tcp(_)]), "{served:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_advertised_url_comes_from_the_listener_or_public_ip() {
        let at = |a: &str, tls| derive_url(a.parse().unwrap(), tls, "10.0.0.9");
        assert_eq!(at("127.0.0.1:8080", false), "http://127.0.0.1:8080");
        assert_eq!(at("10.1.2.3:49153", true), "https://10.1.2.3:49153");
        assert_eq!(at("0.0.0.0:49153", true), "https://10.0.0.9:49153");
        assert_eq!(at("[::]:49153", true), "https://10.0.0.9:49153");
        assert_eq!(at("[::1]:1", false), "http://[::1]:1");
        assert_eq!(derive_url("0.0.0.0:1".parse().unwrap(), true, ""), "");
        assert_eq!(
            derive_url("[::]:443".parse().unwrap(), true, "fe80::1"),
            "https://[fe80::1]:443"
        );
    }

    #[tokio::test]
    async fn the_first_tcp_listener_is_advertised_unless_the_config_says_otherwise() {
        let dir = temp_dir("advertise");
        let mut cfg = config(&dir.join("fleet.sock"));
        let none = listeners(&cfg, Activated::default()).unwrap();
        assert_eq!(advertised(&cfg, &none, "10.0.0.9"), "");
        drop(none);
        cfg.listen = vec![
            ListenAddr::Unix(dir.join("more.sock")),
            ListenAddr::Tcp("127.0.0.1:0".parse().unwrap()),
            ListenAddr::Tcp("127.0.0.1:0".parse().unwrap()),
        ];
        let served = listeners(&cfg, Activated::default()).unwrap();
        // The default socket may or may not be served here (a warning, not a failure, when
        // it cannot be made), so the TCP listeners are found by kind, not by position.
        let ports: Vec<u16> = served
            .iter()
            .filter_map(|l| match l {
                Listener::Tcp(t) => Some(t.local_addr().unwrap().port()),
                _ => None,
            })
            .collect();
        assert_eq!(ports.len(), 2, "{served:?}");
        let port = ports[0];
        assert_eq!(
            advertised(&cfg, &served, "10.0.0.9"),
            format!("http://127.0.0.1:{port}")
        );
        cfg.advertise = Advertise::Url("https://fleet.example:443".into());
        assert_eq!(
            advertised(&cfg, &served, "10.0.0.9"),
            "https://fleet.example:443"
        );
        cfg.advertise = Advertise::Nothing;
        assert_eq!(advertised(&cfg, &served, "10.0.0.9"), "");
        drop(served);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn default_socket_is_made_group_writable_and_replaces_a_stale_one() {
        let dir = temp_dir("stale");
        let path = dir.join("fleet.sock");
        std::fs::create_dir_all(&dir).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let listeners = listeners(&config(&path), Activated::default()).unwrap();
        assert_eq!(listeners.len(), 1);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o660);
        // A socket someone serves is not taken over.
        assert!(unix_socket(&path, (None, 0o660)).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn sockets_get_the_configured_group_and_mode() {
        use std::os::unix::fs::MetadataExt;
        let dir = temp_dir("access");
        let mut cfg = config(&dir.join("fleet.sock"));
        // The test's own group: one any user may give its files.
        let own_gid = std::fs::metadata("/proc/self").unwrap().gid();
        cfg.socket_access = SocketAccess {
            group: SocketGroup::Gid(own_gid),
            mode: 0o600,
        };
        cfg.listen = vec![ListenAddr::Unix(dir.join("more.sock"))];
        let served = listeners(&cfg, Activated::default()).unwrap();
        assert_eq!(served.len(), 2);
        for name in ["fleet.sock", "more.sock"] {
            let meta = std::fs::metadata(dir.join(name)).unwrap();
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{name}");
            assert_eq!(meta.gid(), own_gid, "{name}");
        }
        drop(served);
        // A group that does not exist stops fleetd, naming the key.
        cfg.socket_access.group = SocketGroup::Name("no-such-group-fleet-test".into());
        let e = listeners(&cfg, Activated::default()).unwrap_err();
        assert!(format!("{e:#}").contains("api_socket_group"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn groups_are_found_by_name_in_etc_group() {
        assert_eq!(group_id("root").unwrap(), Some(0));
        assert_eq!(group_id("no-such-group-fleet-test").unwrap(), None);
    }

    #[tokio::test]
    async fn extra_listeners_are_added_to_the_default_socket() {
        let dir = temp_dir("extra");
        let mut cfg = config(&dir.join("fleet.sock"));
        cfg.listen = vec![
            ListenAddr::Unix(dir.join("more.sock")),
            ListenAddr::Tcp("127.0.0.1:0".parse().unwrap()),
        ];
        let listeners = listeners(&cfg, Activated::default()).unwrap();
        assert_eq!(listeners.len(), 3);
        assert!(matches!(listeners[2], Listener::Tcp(_)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn tcp_listeners_serve_tls_when_the_config_has_its_files() {
        let certs = fleet_testing::TestCerts::generate(&["127.0.0.1".parse().unwrap()]);
        let dir = temp_dir("tls");
        let mut cfg = config(&dir.join("fleet.sock"));
        cfg.listen = vec![
            ListenAddr::Unix(dir.join("more.sock")),
            ListenAddr::Tcp("127.0.0.1:0".parse().unwrap()),
        ];
        cfg.tls = Some(crate::config::ApiTlsFiles {
            ca: certs.ca(),
            cert: certs.server_cert(),
            key: certs.server_key(),
            crl: None,
        });
        let served = listeners(&cfg, Activated::default()).unwrap();
        assert!(matches!(served[0], Listener::Unix(_)));
        assert!(matches!(served[1], Listener::Unix(_)));
        assert!(matches!(served[2], Listener::Tls(..)));
        drop(served);
        // A key that is no key stops fleetd before it serves anything.
        cfg.tls.as_mut().unwrap().key = certs.ca();
        let e = listeners(&cfg, Activated::default()).unwrap_err();
        assert!(format!("{e:#}").contains("api_keyfile"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_file_in_the_sockets_place_is_left_alone() {
        let dir = temp_dir("file");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("fleet.sock");
        std::fs::write(&path, "not a socket").unwrap();
        assert!(unix_socket(&path, (None, 0o660)).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
