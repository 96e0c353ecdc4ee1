//! Serving fleet's HTTP API from fleetd: which sockets, and the task that serves them.
//!
//! Sockets systemd passes (`LISTEN_FDS`, as fleet's `fleet.socket`) replace the default unix
//! socket; `api_listen` adds more either way. The API runs on its own tasks and reads the
//! registry with its own requests, so it never waits on, or holds up, the agent or the
//! engine; while etcd is away it answers 503.

use anyhow::{Context, Result, bail};
use fleet_api::{Api, Listener};
use fleet_registry::Registry;
use fleet_registry::kv::Kv;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::config::{ApiConfig, ListenAddr};

mod tls;

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
    let mut out = Vec::new();
    for socket in activated.listeners {
        out.push(match socket {
            ActivatedSocket::Tcp(l) => {
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
        match unix_socket(path) {
            Ok(l) => out.push(l),
            Err(e) => {
                warn!(socket = %path.display(), error = %format!("{e:#}"), "fleet api default socket not served")
            }
        }
    }
    for addr in &config.listen {
        out.push(match addr {
            ListenAddr::Unix(path) => unix_socket(path)?,
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

/// A unix socket at `path`, mode 0660 (its group may use the API, as with fleet's
/// `fleet.socket`). A stale socket from an earlier fleetd is replaced; any other file is not.
fn unix_socket(path: &Path) -> Result<Listener> {
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
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    Ok(Listener::Unix(listener))
}

/// Serves the API on every listener, one task each, until `shutdown`.
pub fn spawn<K: Kv>(
    tasks: &mut JoinSet<Result<()>>,
    registry: Registry<K>,
    config: &ApiConfig,
    listeners: Vec<Listener>,
    version: &str,
    shutdown: watch::Receiver<bool>,
    metrics: &crate::metrics::Metrics,
) {
    if listeners.is_empty() {
        info!("fleet api not served: no listener");
        return;
    }
    let api = Api::new(registry, config.token_limit, version)
        .with_metrics(metrics.api.clone(), metrics.exposed.clone());
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
        }
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
        assert!(unix_socket(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
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
        let certs = fleet_registry::testing::TestCerts::generate(&["127.0.0.1".parse().unwrap()]);
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
        assert!(unix_socket(&path).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
