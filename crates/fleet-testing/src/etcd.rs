//! [`TestEtcd`]: a real single-member etcd on loopback with its own free ports and its own
//! data directory, with fast raft timings; it can be killed and restarted on the same ports
//! and data to test outages. With TLS ([`TestEtcd::start_tls`]) it requires client
//! certificates of [`TestCerts`](crate::TestCerts)' authority; with authentication
//! ([`TestEtcd::start_auth`]) user `root` holds role `root`.
//!
//! Also what every test etcd, alone or in a [`TestEtcdCluster`](crate::TestEtcdCluster), is
//! launched with: the binary and the arguments.

use std::fs::{self, File};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep};
use tracing::debug;

use fleet_registry::kv::{EtcdConfig, EtcdKv, Kv, Revision, TlsFiles};
use fleet_registry::rbac::{Admin, RoleSpec};

use crate::auth::{enable_auth, issue_user, root_auth};
use crate::{TestCerts, free_ports, http_exchange, unique_dir};

/// The etcd binary; `$FLEET_TEST_ETCD` overrides it.
const DEFAULT_ETCD: &str = "etcd";
/// How long a fresh server may take to answer (it is ~0.1 s with these timings).
pub(crate) const READY_WITHIN: Duration = Duration::from_secs(45);
/// Ports are found by binding them and released before etcd binds them; another process
/// may take one in between, so a failed start is retried on new ports.
pub(crate) const START_ATTEMPTS: u32 = 5;
/// Fast elections, for every test etcd here and the functional harness's: a leader ~0.5 s
/// after start or after the leader died (1.2 s by default), at most one TTL's worth of
/// leaderless time. Not faster: with 10/100 ms, a loaded CI machine (fsync stalls, starved
/// CPU) kept a 3-member cluster electing for over 15 s (CI, 2026-12-02). Pre-vote keeps a
/// member that fell behind from deposing a working leader.
pub const ETCD_FAST_ELECTIONS: [&str; 3] = [
    "--heartbeat-interval=50",
    "--election-timeout=500",
    "--pre-vote",
];
/// The request timeout of clients made by [`TestEtcd::kv`].
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A running throwaway etcd. Dropping it kills the server and deletes its data.
#[derive(Debug)]
pub struct TestEtcd {
    child: Option<Child>,
    dir: PathBuf,
    /// The address clients connect to.
    host: IpAddr,
    client_port: u16,
    peer_port: u16,
    /// With TLS: the certificates it serves and trusts.
    tls: Option<ServerTls>,
    /// With etcd's authentication: how it was asked for, and whether it is on yet.
    auth: Option<AuthSetup>,
    /// More server flags, e.g. a benchmark's `--quota-backend-bytes` and `--max-txn-ops`.
    extra_args: Vec<String>,
    /// With TLS: the port of its plain-HTTP `/metrics` (`--listen-metrics-urls`).
    metrics_port: Option<u16>,
}

/// How [`TestEtcd::start_shaped`] starts a benchmark's etcd.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shaped<'a> {
    /// TLS with client certificates, as docs/deploy.md runs etcd: certificates made for
    /// loopback (ECDSA P-256) and kept as long as the server.
    pub tls: bool,
    /// etcd's authentication on, user `root` as [`TestEtcd::start_auth`] makes it (or as
    /// `data` holds it).
    pub auth: bool,
    /// More server flags.
    pub args: &'a [String],
    /// A data directory to start on a copy of ([`TestEtcd::copy_data`] kept it).
    pub data: Option<&'a Path>,
}

/// A test etcd's authentication (etcd's simple tokens).
#[derive(Debug, Clone, Copy)]
struct AuthSetup {
    /// `--auth-token-ttl`: how long an unused token lives (etcd's default is 300 s).
    token_ttl: Option<Duration>,
    /// Turned on by [`Admin::enable_auth`] once the server answered.
    enabled: bool,
}

/// The files a TLS test etcd runs with, and those its clients get.
#[derive(Debug, Clone)]
struct ServerTls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    client: TlsFiles,
    /// The certificates, when the server owns them ([`TestEtcd::start_shaped`]): etcd reads
    /// its files at each handshake, and clients at each connection.
    _owned: Option<Arc<TestCerts>>,
}

impl ServerTls {
    fn of(certs: &TestCerts) -> ServerTls {
        ServerTls {
            ca: certs.ca(),
            cert: certs.server_cert(),
            key: certs.server_key(),
            client: certs.client_files(),
            _owned: None,
        }
    }

    fn owning(certs: TestCerts) -> ServerTls {
        let certs = Arc::new(certs);
        ServerTls {
            _owned: Some(certs.clone()),
            ..ServerTls::of(&certs)
        }
    }
}

impl TestEtcd {
    /// Starts a server and waits until it answers a read. Panics if it cannot.
    pub async fn start() -> TestEtcd {
        TestEtcd::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST), None, None, &[]).await
    }

    /// [`start`](Self::start) with more server flags (`--quota-backend-bytes=...`): for a
    /// benchmark's own etcd; fleet itself must work with etcd's defaults.
    pub async fn start_with_args(args: &[String]) -> TestEtcd {
        TestEtcd::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST), None, None, args).await
    }

    /// Starts a server with etcd's authentication on: user `root` (password
    /// [`ROOT_PASSWORD`](crate::ROOT_PASSWORD)) holds role `root`, and [`config`](Self::config) logs in as it.
    /// [`issue_user`](Self::issue_user) makes users with fleet's roles.
    pub async fn start_auth() -> TestEtcd {
        TestEtcd::start_auth_with(None).await
    }

    /// [`start_auth`](Self::start_auth) with tokens that expire after `token_ttl` unused
    /// (whole seconds), to prove clients log in again.
    pub async fn start_auth_token_ttl(token_ttl: Duration) -> TestEtcd {
        TestEtcd::start_auth_with(Some(token_ttl)).await
    }

    /// [`start_auth`](Self::start_auth) with more server flags: a benchmark's etcd in the
    /// shape of a production cluster (issue 43).
    pub async fn start_auth_with_args(args: &[String]) -> TestEtcd {
        TestEtcd::start_auth_with_ttl_and_args(None, args).await
    }

    async fn start_auth_with(token_ttl: Option<Duration>) -> TestEtcd {
        TestEtcd::start_auth_with_ttl_and_args(token_ttl, &[]).await
    }

    async fn start_auth_with_ttl_and_args(
        token_ttl: Option<Duration>,
        args: &[String],
    ) -> TestEtcd {
        let auth = AuthSetup {
            token_ttl,
            enabled: false,
        };
        let mut etcd =
            TestEtcd::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST), None, Some(auth), args).await;
        etcd.enable_auth().await;
        etcd
    }

    /// Turns on the authentication the server was started for, unless it is on already.
    async fn enable_auth(&mut self) {
        if self.auth.is_some_and(|a| !a.enabled) {
            enable_auth(&self.config()).await;
            if let Some(auth) = &mut self.auth {
                auth.enabled = true;
            }
        }
    }

    /// Starts a server on a copy of `data` (a data directory [`copy_data`](Self::copy_data)
    /// kept), with authentication on when it was on there, and the flags `args`. A
    /// benchmark's way to set up etcd's users once and start many servers holding them.
    pub async fn start_from_data(data: &Path, auth: bool, args: &[String]) -> TestEtcd {
        TestEtcd::start_shaped(Shaped {
            auth,
            args,
            data: Some(data),
            ..Shaped::default()
        })
        .await
    }

    /// A benchmark's etcd as `shape` says (issue 43's production shape: TLS, auth, flags),
    /// on loopback. With TLS its `/metrics` is served over plain HTTP on a port of its own
    /// ([`metrics_endpoint`](Self::metrics_endpoint)). Panics if it cannot start.
    pub async fn start_shaped(shape: Shaped<'_>) -> TestEtcd {
        let host = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let tls = shape
            .tls
            .then(|| ServerTls::owning(TestCerts::generate(&[host])));
        let auth = shape.auth.then_some(AuthSetup {
            token_ttl: None,
            enabled: shape.data.is_some(),
        });
        let mut etcd = TestEtcd::start_tls_seeded(host, tls, auth, shape.args, shape.data).await;
        etcd.enable_auth().await;
        etcd
    }

    /// Keeps a copy of the server's data in `to` (a new directory): kills the server, so
    /// that what it wrote is whole on disk (its WAL is synced), copies, and starts it again.
    pub async fn copy_data(&mut self, to: &Path) -> std::io::Result<()> {
        self.stop();
        let copied = copy_dir(&self.data_dir(), to);
        self.restart().await;
        copied
    }

    /// Creates (or updates) `roles` and user `name` holding exactly them, with a password of
    /// its own, and returns a client configuration that logs in as it. Needs
    /// [`start_auth`](Self::start_auth).
    pub async fn issue_user(&self, name: &str, roles: &[RoleSpec]) -> EtcdConfig {
        assert!(
            self.auth.is_some(),
            "issue_user needs a server started with auth"
        );
        issue_user(&self.config(), name, roles).await
    }

    /// etcd's administration as `root` (or anonymously without auth).
    pub async fn admin(&self) -> Admin {
        Admin::connect(&self.config())
            .await
            .expect("a loopback etcd config is valid")
    }

    /// Starts a server for clients on `https://<host>:<port>` with `certs`' server
    /// certificate, accepting only clients with a certificate of `certs`' authority
    /// (`--client-cert-auth`). `host` must be one of the server certificate's addresses (a
    /// local address: loopback, or a bridge the test made). Panics if it cannot start.
    pub async fn start_tls(certs: &TestCerts, host: IpAddr) -> TestEtcd {
        TestEtcd::start_on(host, Some(ServerTls::of(certs)), None, &[]).await
    }

    async fn start_on(
        host: IpAddr,
        tls: Option<ServerTls>,
        auth: Option<AuthSetup>,
        extra_args: &[String],
    ) -> TestEtcd {
        TestEtcd::start_tls_seeded(host, tls, auth, extra_args, None).await
    }

    /// Starts a server; on a copy of `data` when given. A copied member keeps its old peer
    /// URL in its membership, which a single member never dials.
    async fn start_tls_seeded(
        host: IpAddr,
        tls: Option<ServerTls>,
        auth: Option<AuthSetup>,
        extra_args: &[String],
        data: Option<&Path>,
    ) -> TestEtcd {
        let mut last_log = String::new();
        for attempt in 1..=START_ATTEMPTS {
            let [client_port, peer_port, metrics_port] = free_ports(3)[..] else {
                unreachable!("free_ports returns as many ports as asked")
            };
            let mut etcd = TestEtcd {
                child: None,
                dir: unique_dir("etcd"),
                host,
                client_port,
                peer_port,
                tls: tls.clone(),
                auth,
                extra_args: extra_args.to_vec(),
                metrics_port: tls.is_some().then_some(metrics_port),
            };
            if let Some(data) = data {
                copy_dir(data, &etcd.data_dir())
                    .unwrap_or_else(|e| panic!("copying etcd data {}: {e}", data.display()));
            }
            etcd.spawn();
            if etcd.wait_ready().await {
                debug!(endpoint = %etcd.endpoint(), attempt, "test etcd ready");
                return etcd;
            }
            last_log = etcd.log();
        }
        panic!("test etcd did not start after {START_ATTEMPTS} attempts; last log:\n{last_log}");
    }

    /// The client URL: `http://127.0.0.1:<port>`, or `https://<host>:<port>` with TLS.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let host = match self.host {
            IpAddr::V6(v6) => format!("[{v6}]"),
            IpAddr::V4(v4) => v4.to_string(),
        };
        format!("{scheme}://{host}:{}", self.client_port)
    }

    /// A client configuration for this server (with TLS: its CA and a client certificate;
    /// with auth: user `root`).
    pub fn config(&self) -> EtcdConfig {
        EtcdConfig {
            endpoints: vec![self.endpoint()],
            request_timeout: REQUEST_TIMEOUT,
            tls: self
                .tls
                .as_ref()
                .map_or_else(TlsFiles::default, |t| t.client.clone()),
            auth: self.auth.map(|_| root_auth()),
        }
    }

    /// fleetctl's flags for this server's TLS (`--ca-file=…`, `--cert-file=…` and
    /// `--key-file=…`, those it has): none without TLS.
    pub fn fleetctl_tls_flags(&self) -> Vec<String> {
        let tls = self.config().tls;
        [
            ("--ca-file", &tls.ca_file),
            ("--cert-file", &tls.cert_file),
            ("--key-file", &tls.key_file),
        ]
        .into_iter()
        .filter_map(|(flag, path)| Some(format!("{flag}={}", path.as_ref()?.display())))
        .collect()
    }

    /// [`config`](Self::config) without credentials.
    pub fn anonymous_config(&self) -> EtcdConfig {
        EtcdConfig {
            auth: None,
            ..self.config()
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

    /// Where its `/metrics` is served over plain HTTP: the client URL, or with TLS a port
    /// of its own on loopback.
    pub fn metrics_endpoint(&self) -> String {
        match self.metrics_port {
            Some(port) => format!("http://127.0.0.1:{port}"),
            None => self.endpoint(),
        }
    }

    /// How many watchers the server holds (its `etcd_debugging_mvcc_watcher_total` gauge).
    /// Plain-HTTP servers, and those [`start_shaped`](Self::start_shaped) started.
    pub async fn watcher_count(&self) -> u64 {
        let port = match (&self.tls, self.metrics_port) {
            (_, Some(port)) => port,
            (None, None) => self.client_port,
            (Some(_), None) => panic!("watcher_count reads metrics over plain HTTP"),
        };
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
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let member = EtcdMember {
            name: "test",
            data_dir: self.data_dir(),
            client: self.endpoint(),
            initial_cluster: format!("test={peer}"),
            peer,
            token: None,
        };
        let mut command = etcd_command(&member, log);
        command.args(&self.extra_args);
        if let Some(ttl) = self.auth.and_then(|a| a.token_ttl) {
            command.arg(format!("--auth-token-ttl={}", ttl.as_secs().max(1)));
        }
        if let Some(tls) = &self.tls {
            command
                .arg(format!("--cert-file={}", tls.cert.display()))
                .arg(format!("--key-file={}", tls.key.display()))
                .arg("--client-cert-auth")
                .arg(format!("--trusted-ca-file={}", tls.ca.display()));
        }
        if let Some(port) = self.metrics_port {
            command.arg(format!("--listen-metrics-urls=http://127.0.0.1:{port}"));
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", etcd_binary()));
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

/// One etcd server to launch: a single test server, or a member of a test cluster.
pub(crate) struct EtcdMember<'a> {
    pub name: &'a str,
    pub data_dir: PathBuf,
    /// Its client URL.
    pub client: String,
    /// Its peer URL.
    pub peer: String,
    /// `<name>=<peer URL>` of every member.
    pub initial_cluster: String,
    /// A cluster token of its own, so that members of other test clusters never join it.
    pub token: Option<String>,
}

/// The etcd binary tests run: `$FLEET_TEST_ETCD`, or the one the machine setup installs.
pub(crate) fn etcd_binary() -> String {
    std::env::var("FLEET_TEST_ETCD").unwrap_or_else(|_| DEFAULT_ETCD.to_owned())
}

/// The command that starts `member`, logging to `log`: every test etcd, alone or in a
/// cluster, runs with these arguments (TLS ones are added by the caller).
pub(crate) fn etcd_command(member: &EtcdMember<'_>, log: File) -> Command {
    let mut command = Command::new(etcd_binary());
    // The server's configuration is its arguments only, whatever the test's environment.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("ETCD_") {
            command.env_remove(name);
        }
    }
    let EtcdMember {
        name,
        data_dir,
        client,
        peer,
        initial_cluster,
        token,
    } = member;
    command
        .arg(format!("--name={name}"))
        .arg(format!("--data-dir={}", data_dir.display()))
        .arg(format!("--listen-client-urls={client}"))
        .arg(format!("--advertise-client-urls={client}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster={initial_cluster}"))
        .arg("--initial-cluster-state=new")
        .args(["--logger=zap", "--log-outputs=stderr"])
        .args(ETCD_FAST_ELECTIONS)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    if let Some(token) = token {
        command.arg(format!("--initial-cluster-token={token}"));
    }
    command
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        self.stop();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Copies directory `from` into `to` (created), files and subdirectories.
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    let request =
        format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    http_exchange(addr, &request, REQUEST_TIMEOUT)
}

#[cfg(test)]
mod tests;
