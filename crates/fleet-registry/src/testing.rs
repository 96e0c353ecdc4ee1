//! Throwaway etcd servers for tests.
//!
//! [`TestEtcd`] runs a real single-member etcd on loopback with its own free ports and its own
//! data directory (never under /tmp: a namespaced systemd in other tests may empty it), with
//! fast raft timings. It can be killed and restarted on the same ports and data to test
//! outages. Test code only: failures panic with the server's log attached.
//!
//! Environment: `$FLEET_TEST_DIR` is where data directories go (default
//! `<workspace>/target/test-etcd`), `$FLEET_TEST_ETCD` the etcd binary (default `etcd` on
//! `PATH`).

use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rand::Rng;
use tokio::time::{Instant, sleep};
use tracing::debug;

use crate::kv::{EtcdConfig, EtcdKv, Kv, Revision, TlsFiles};

/// The etcd binary; `$FLEET_TEST_ETCD` overrides it.
const DEFAULT_ETCD: &str = "etcd";
/// How long a fresh server may take to answer (it is ~0.1 s with these timings).
const READY_WITHIN: Duration = Duration::from_secs(20);
/// Ports are found by binding port 0 and released before etcd binds them; another process
/// may take one in between, so a failed start is retried on new ports.
const START_ATTEMPTS: u32 = 5;
/// The request timeout of clients made by [`TestEtcd::kv`].
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

static SERVERS: AtomicU32 = AtomicU32::new(0);

/// A running throwaway etcd. Dropping it kills the server and deletes its data.
#[derive(Debug)]
pub struct TestEtcd {
    child: Option<Child>,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
}

impl TestEtcd {
    /// Starts a server and waits until it answers a read. Panics if it cannot.
    pub async fn start() -> TestEtcd {
        let mut last_log = String::new();
        for attempt in 1..=START_ATTEMPTS {
            let (client_port, peer_port) = free_ports();
            let mut etcd = TestEtcd {
                child: None,
                dir: unique_dir(),
                client_port,
                peer_port,
            };
            etcd.spawn();
            if etcd.wait_ready().await {
                debug!(endpoint = %etcd.endpoint(), attempt, "test etcd ready");
                return etcd;
            }
            last_log = etcd.log();
        }
        panic!("test etcd did not start after {START_ATTEMPTS} attempts; last log:\n{last_log}");
    }

    /// The client URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// A client configuration for this server.
    pub fn config(&self) -> EtcdConfig {
        EtcdConfig {
            endpoints: vec![self.endpoint()],
            request_timeout: REQUEST_TIMEOUT,
            tls: TlsFiles::default(),
        }
    }

    /// A new client of this server.
    pub async fn kv(&self) -> EtcdKv {
        EtcdKv::connect(&self.config())
            .await
            .expect("a loopback etcd config is valid")
    }

    /// The directory holding the server's data and its log (`etcd.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Kills the server (SIGKILL), keeping its data for [`restart`](Self::restart).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same ports and data, and waits until it answers.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn();
        if !self.wait_ready().await {
            panic!("test etcd did not restart; log:\n{}", self.log());
        }
    }

    /// Compacts the server's history up to `revision`.
    pub async fn compact(&self, revision: Revision) {
        let kv = self.kv().await;
        if let Err(err) = kv.compact(revision).await {
            panic!("compacting test etcd at {revision}: {err}");
        }
    }

    /// How many watchers the server holds (its `etcd_debugging_mvcc_watcher_total` gauge).
    pub async fn watcher_count(&self) -> u64 {
        let port = self.client_port;
        let metrics = tokio::task::spawn_blocking(move || http_get(port, "/metrics"))
            .await
            .expect("the metrics reader does not panic")
            .unwrap_or_else(|e| panic!("reading test etcd metrics: {e}"));
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watcher_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            // A gauge of whole watchers, printed as a float.
            .map_or_else(|| panic!("no watcher gauge in metrics"), |v| v as u64)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }

    fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn spawn(&mut self) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap_or_else(|e| panic!("creating {}: {e}", self.log_path().display()));
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let etcd = std::env::var("FLEET_TEST_ETCD").unwrap_or_else(|_| DEFAULT_ETCD.to_owned());
        let mut command = Command::new(&etcd);
        // The server's configuration is its arguments only, whatever the test's environment.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("ETCD_") {
                command.env_remove(name);
            }
        }
        let child = command
            .arg("--name=test")
            .arg(format!("--data-dir={}", self.data_dir().display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .args(["--logger=zap", "--log-outputs=stderr"])
            .args(["--heartbeat-interval=10", "--election-timeout=100"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {etcd}: {e}"));
        self.child = Some(child);
    }

    /// Polls with a real read until the server answers; `false` if it exited or took too long.
    async fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + READY_WITHIN;
        let cfg = EtcdConfig {
            request_timeout: Duration::from_millis(500),
            ..self.config()
        };
        let kv = EtcdKv::connect(&cfg).await.expect("valid config");
        while Instant::now() < deadline {
            let exited = self
                .child
                .as_mut()
                .is_none_or(|c| !matches!(c.try_wait(), Ok(None)));
            if exited {
                return false;
            }
            if kv.range("health", false, None).await.is_ok() {
                return true;
            }
            sleep(Duration::from_millis(20)).await;
        }
        false
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// `$FLEET_TEST_DIR/<unique>`, else `<workspace>/target/test-etcd/<unique>`.
fn unique_dir() -> PathBuf {
    let base = std::env::var_os("FLEET_TEST_DIR").map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../target/test-etcd"
            ))
        },
        PathBuf::from,
    );
    let name = format!(
        "etcd-{}-{}-{:08x}",
        std::process::id(),
        SERVERS.fetch_add(1, Ordering::Relaxed),
        rand::rng().random::<u32>()
    );
    let dir = base.join(name);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// Two distinct free loopback ports (both held while the second is picked).
fn free_ports() -> (u16, u16) {
    let bind = || TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    let (a, b) = (bind(), bind());
    let port = |l: &TcpListener| l.local_addr().expect("bound socket has an address").port();
    (port(&a), port(&b))
}

fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    Ok(body)
}
