//! Throwaway etcd servers for tests, and what other test support the crates share: a
//! dev-dependency only (`publish = false`), so no production crate links a test launcher.
//!
//! [`TestEtcd`] runs a real single-member etcd on loopback with its own free ports and its own
//! data directory (never under /tmp: a namespaced systemd in other tests may empty it), with
//! fast raft timings. It can be killed and restarted on the same ports and data to test
//! outages. Test code only: failures panic with the server's log attached.
//!
//! [`TestEtcd::start_tls`] serves clients over TLS and requires client certificates, with a
//! certificate authority, server and client certificates made by [`TestCerts::generate`]
//! (the `openssl` command line tool, on `PATH`).
//!
//! [`TestEtcdCluster`] runs several members, for tests of a member failing under a client.
//!
//! Environment: `$FLEET_TEST_DIR` is where data directories go (default
//! `<workspace>/target/test-etcd`), `$FLEET_TEST_ETCD` the etcd binary (default `etcd` on
//! `PATH`).

use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rand::Rng;
use tokio::time::{Instant, sleep};
use tracing::debug;

use fleet_core::UnitName;

use fleet_registry::Registry;
use fleet_registry::kv::{EtcdAuth, EtcdConfig, EtcdKv, Kv, Revision, TlsFiles};
use fleet_registry::rbac::{Admin, ROOT_USER, RoleSpec};

mod cluster;
pub use cluster::TestEtcdCluster;

/// The etcd binary; `$FLEET_TEST_ETCD` overrides it.
const DEFAULT_ETCD: &str = "etcd";
/// How long a fresh server may take to answer (it is ~0.1 s with these timings).
const READY_WITHIN: Duration = Duration::from_secs(45);
/// Ports are found by binding them and released before etcd binds them; another process
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
}

/// A test etcd's authentication (etcd's simple tokens).
#[derive(Debug, Clone, Copy)]
struct AuthSetup {
    /// `--auth-token-ttl`: how long an unused token lives (etcd's default is 300 s).
    token_ttl: Option<Duration>,
    /// Turned on by [`Admin::enable_auth`] once the server answered.
    enabled: bool,
}

/// The password of user `root` on a test etcd with authentication.
pub const ROOT_PASSWORD: &str = "fleet-test-root-password";

/// The files a TLS test etcd runs with, and those its clients get.
#[derive(Debug, Clone)]
struct ServerTls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    client: TlsFiles,
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
    /// [`ROOT_PASSWORD`]) holds role `root`, and [`config`](Self::config) logs in as it.
    /// [`issue_user`](Self::issue_user) makes users with fleet's roles.
    pub async fn start_auth() -> TestEtcd {
        TestEtcd::start_auth_with(None).await
    }

    /// [`start_auth`](Self::start_auth) with tokens that expire after `token_ttl` unused
    /// (whole seconds), to prove clients log in again.
    pub async fn start_auth_token_ttl(token_ttl: Duration) -> TestEtcd {
        TestEtcd::start_auth_with(Some(token_ttl)).await
    }

    async fn start_auth_with(token_ttl: Option<Duration>) -> TestEtcd {
        let auth = AuthSetup {
            token_ttl,
            enabled: false,
        };
        let mut etcd =
            TestEtcd::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST), None, Some(auth), &[]).await;
        enable_auth(&etcd.config()).await;
        if let Some(auth) = &mut etcd.auth {
            auth.enabled = true;
        }
        etcd
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
        let tls = ServerTls {
            ca: certs.ca(),
            cert: certs.server_cert(),
            key: certs.server_key(),
            client: certs.client_files(),
        };
        TestEtcd::start_on(host, Some(tls), None, &[]).await
    }

    async fn start_on(
        host: IpAddr,
        tls: Option<ServerTls>,
        auth: Option<AuthSetup>,
        extra_args: &[String],
    ) -> TestEtcd {
        let mut last_log = String::new();
        for attempt in 1..=START_ATTEMPTS {
            let [client_port, peer_port] = free_ports(2)[..] else {
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

    /// How many watchers the server holds (its `etcd_debugging_mvcc_watcher_total` gauge).
    /// Plain-HTTP servers only.
    pub async fn watcher_count(&self) -> u64 {
        assert!(
            self.tls.is_none(),
            "watcher_count reads metrics over plain HTTP"
        );
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

/// User `root` with [`ROOT_PASSWORD`].
pub(crate) fn root_auth() -> EtcdAuth {
    EtcdAuth {
        username: ROOT_USER.to_owned(),
        password: ROOT_PASSWORD.to_owned(),
    }
}

/// Turns authentication on through `cfg` (root's credentials, used anonymously while auth is
/// off).
pub(crate) async fn enable_auth(cfg: &EtcdConfig) {
    let admin = Admin::connect(cfg)
        .await
        .expect("a loopback etcd config is valid");
    if let Err(err) = admin.enable_auth(ROOT_PASSWORD).await {
        panic!("enabling auth on test etcd: {err}");
    }
}

/// See [`TestEtcd::issue_user`]; `root` is root's configuration.
pub(crate) async fn issue_user(root: &EtcdConfig, name: &str, roles: &[RoleSpec]) -> EtcdConfig {
    let admin = Admin::connect(root)
        .await
        .expect("a loopback etcd config is valid");
    for role in roles {
        if let Err(err) = admin.ensure_role(role).await {
            panic!("creating role {} on test etcd: {err}", role.name);
        }
    }
    let password = format!("{name}-{:08x}", rand::rng().random::<u32>());
    let names: Vec<String> = roles.iter().map(|r| r.name.clone()).collect();
    if let Err(err) = admin.ensure_user(name, Some(&password), &names).await {
        panic!("creating user {name} on test etcd: {err}");
    }
    EtcdConfig {
        auth: Some(EtcdAuth {
            username: name.to_owned(),
            password,
        }),
        ..root.clone()
    }
}

/// A machine for the tests of the readers: registers `info` (on a lease of `ttl`) and
/// publishes, for each `(unit, hash, up)`, the state its agent would: loaded, and active and
/// running when `up`, else inactive and dead.
pub async fn machine_running<K: Kv>(
    registry: &Registry<K>,
    info: &fleet_core::MachineInfo,
    ttl: Duration,
    units: &[(UnitName, fleet_core::UnitHash, bool)],
) {
    let role = fleet_registry::MachineRole::new(registry.clone(), info.id.clone());
    let presence = role
        .register(info, ttl, None)
        .await
        .expect("machine registers");
    for (name, hash, up) in units {
        let state = fleet_registry::UnitStateRecord {
            name: name.clone(),
            machine: info.id.clone(),
            hash: Some(*hash),
            systemd: fleet_core::SystemdState {
                load: "loaded".into(),
                active: if *up { "active" } else { "inactive" }.into(),
                sub: if *up { "running" } else { "dead" }.into(),
            },
            drop_ins: vec![],
            restart: 0,
            restart_pending: false,
        };
        role.publish_state(&presence, &state)
            .await
            .expect("state published");
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
        // Fast elections (the harness's timings, functional-tests/src/etcd.rs), at most one
        // TTL's worth of leaderless time; 10/100 ms kept electing on a loaded CI machine.
        .args([
            "--heartbeat-interval=50",
            "--election-timeout=500",
            "--pre-vote",
        ])
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

/// Certificates for a TLS test etcd, made with the `openssl` command line tool: a certificate
/// authority, a server certificate for given IP addresses, a client certificate, and a second,
/// unrelated authority with a client certificate of its own (what a wrong CA looks like).
/// ECDSA P-256 keys: generating them takes milliseconds. Dropping it deletes the files.
#[derive(Debug)]
pub struct TestCerts {
    dir: PathBuf,
}

impl TestCerts {
    /// Generates everything into a new directory under the test directory; the server
    /// certificate is valid for `server_ips` (its subject alternative names). Panics if
    /// `openssl` fails.
    pub fn generate(server_ips: &[IpAddr]) -> TestCerts {
        let certs = TestCerts {
            dir: unique_dir("certs"),
        };
        let san = server_ips
            .iter()
            .map(|ip| format!("IP:{ip}"))
            .collect::<Vec<_>>()
            .join(",");
        certs.authority("ca");
        certs.authority("other-ca");
        certs.leaf("server", "ca", "serverAuth,clientAuth", Some(&san));
        certs.leaf("client", "ca", "clientAuth", None);
        certs.leaf("other-client", "other-ca", "clientAuth", None);
        certs
    }

    /// The directory holding every file (`<name>.pem`, `<name>.key`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The certificate authority etcd trusts and its server certificate is signed by.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Another certificate authority, which signed neither the server's certificate nor the
    /// client's: a client trusting it must refuse the server.
    pub fn wrong_ca(&self) -> PathBuf {
        self.dir.join("other-ca.pem")
    }

    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.pem")
    }

    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// A client certificate of [`TestCerts::ca`], which etcd accepts.
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.pem")
    }

    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// A client certificate of [`TestCerts::wrong_ca`], which etcd refuses.
    pub fn wrong_client_cert(&self) -> PathBuf {
        self.dir.join("other-client.pem")
    }

    pub fn wrong_client_key(&self) -> PathBuf {
        self.dir.join("other-client.key")
    }

    /// The files a client of a [`TestEtcd::start_tls`] server needs.
    pub fn client_files(&self) -> TlsFiles {
        TlsFiles {
            ca_file: Some(self.ca()),
            cert_file: Some(self.client_cert()),
            key_file: Some(self.client_key()),
        }
    }

    fn authority(&self, name: &str) {
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-subj",
            &format!("/CN=fleet test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
    }

    fn leaf(&self, name: &str, ca: &str, usage: &str, san: Option<&str>) {
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN=fleet test {name}"),
        ]);
        let mut ext = format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage={usage}\n"
        );
        if let Some(san) = san {
            ext.push_str(&format!("subjectAltName={san}\n"));
        }
        let ext_file = self.dir.join(format!("{name}.ext"));
        fs::write(&ext_file, ext).unwrap_or_else(|e| panic!("writing {}: {e}", ext_file.display()));
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
        ]);
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running openssl (apt-get install openssl): {e}"));
        assert!(
            out.status.success(),
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// `$FLEET_TEST_DIR/<kind>-<unique>`, else `<workspace>/target/test-etcd/<kind>-<unique>`.
fn unique_dir(kind: &str) -> PathBuf {
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
        "{kind}-{}-{}-{:08x}",
        std::process::id(),
        SERVERS.fetch_add(1, Ordering::Relaxed),
        rand::rng().random::<u32>()
    );
    let dir = base.join(name);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// Where test ports are picked: below Linux's ephemeral range (32768–60999 by default). A port
/// of that range, released by the picker, can be taken by any outgoing connection (an etcd
/// member dialling its peers, a client) before the server binds it; ports here are only ever
/// taken by a bind.
const TEST_PORTS: std::ops::Range<u16> = 20000..32768;

/// `count` distinct ports nobody listens on right now, on any address, all held until every
/// one is picked (so none is picked twice). Another process may still bind one before the
/// server does: callers retry a failed start on new ports.
pub fn free_ports(count: usize) -> Vec<u16> {
    let mut held: Vec<TcpListener> = Vec::with_capacity(count);
    let mut rng = rand::rng();
    for _ in 0..count * 200 {
        if held.len() == count {
            break;
        }
        let port = rng.random_range(TEST_PORTS);
        if let Ok(listener) = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)) {
            held.push(listener);
        }
    }
    // A crowded range: the kernel's own pick, still distinct while held.
    while held.len() < count {
        held.push(TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("binding a free port"));
    }
    held.iter()
        .map(|l| l.local_addr().expect("bound socket has an address").port())
        .collect()
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

#[cfg(test)]
mod tests {
    //! The TLS side of [`EtcdKv`] against a real etcd requiring client certificates: what
    //! promise 6 of `docs/guarantees.md` rests on.

    use super::*;
    use fleet_registry::kv::KvError;

    fn loopback() -> IpAddr {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }

    /// A read with `tls` against `etcd`'s endpoint.
    async fn read_with(etcd: &TestEtcd, tls: TlsFiles) -> Result<(), KvError> {
        let cfg = EtcdConfig {
            request_timeout: Duration::from_secs(2),
            tls,
            auth: None,
            ..etcd.config()
        };
        let kv = EtcdKv::connect(&cfg).await?;
        kv.range("k", false, None).await.map(drop)
    }

    #[tokio::test]
    async fn a_client_with_the_servers_ca_and_its_own_certificate_reads_and_writes() {
        let certs = TestCerts::generate(&[loopback()]);
        let etcd = TestEtcd::start_tls(&certs, loopback()).await;
        assert!(etcd.endpoint().starts_with("https://127.0.0.1:"));
        let kv = etcd.kv().await;
        let put = fleet_registry::kv::Txn {
            success: vec![fleet_registry::kv::TxnOp::Put {
                key: "k".into(),
                value: b"v".to_vec(),
                lease: None,
            }],
            ..Default::default()
        };
        kv.txn(put).await.expect("a write over TLS");
        let got = kv.range("k", false, None).await.expect("a read over TLS");
        assert_eq!(got.kvs[0].value, b"v");
    }

    #[tokio::test]
    async fn a_client_trusting_another_ca_refuses_the_server_and_says_why() {
        let certs = TestCerts::generate(&[loopback()]);
        let etcd = TestEtcd::start_tls(&certs, loopback()).await;
        let tls = TlsFiles {
            ca_file: Some(certs.wrong_ca()),
            ..certs.client_files()
        };
        let err = read_with(&etcd, tls).await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("invalid peer certificate") && text.contains("UnknownIssuer"),
            "{text}"
        );
        assert!(text.contains(&etcd.endpoint()), "{text}");
    }

    #[tokio::test]
    async fn a_server_certificate_for_another_name_is_refused() {
        // Valid for 127.0.0.1 only; reached as ::ffff:127.0.0.1, the same server under
        // another name. (Not `localhost`: a bare Debian without /etc/hosts cannot resolve it.)
        let certs = TestCerts::generate(&[loopback()]);
        let etcd = TestEtcd::start_tls(&certs, loopback()).await;
        let cfg = EtcdConfig {
            endpoints: vec![etcd.endpoint().replace("127.0.0.1", "[::ffff:127.0.0.1]")],
            request_timeout: Duration::from_secs(2),
            tls: certs.client_files(),
            auth: None,
        };
        let kv = EtcdKv::connect(&cfg).await.unwrap();
        let err = kv.range("k", false, None).await.unwrap_err();
        let text = err.to_string();
        assert!(text.contains("certificate not valid for name"), "{text}");
    }

    #[tokio::test]
    async fn the_server_refuses_a_client_without_a_certificate_of_its_ca() {
        let certs = TestCerts::generate(&[loopback()]);
        let etcd = TestEtcd::start_tls(&certs, loopback()).await;
        let none = TlsFiles {
            ca_file: Some(certs.ca()),
            cert_file: None,
            key_file: None,
        };
        let err = read_with(&etcd, none).await.unwrap_err().to_string();
        assert!(
            err.contains("no TLS client certificate is configured"),
            "{err}"
        );
        let other = TlsFiles {
            ca_file: Some(certs.ca()),
            cert_file: Some(certs.wrong_client_cert()),
            key_file: Some(certs.wrong_client_key()),
        };
        assert!(read_with(&etcd, other).await.is_err());
        // The server is fine: a proper client still gets in.
        read_with(&etcd, certs.client_files()).await.unwrap();
    }

    #[tokio::test]
    async fn a_client_certificate_and_key_that_do_not_belong_together_are_named() {
        let certs = TestCerts::generate(&[loopback()]);
        let etcd = TestEtcd::start_tls(&certs, loopback()).await;
        let cases = [
            (certs.wrong_client_key(), "KeyMismatch"),
            (certs.client_cert(), "PrivateKeyParseError"),
        ];
        for (key, cause) in cases {
            let tls = TlsFiles {
                key_file: Some(key.clone()),
                ..certs.client_files()
            };
            let err = read_with(&etcd, tls).await.unwrap_err();
            let text = err.to_string();
            let files = format!(
                "the TLS client certificate {} and key {} cannot be used (",
                certs.client_cert().display(),
                key.display()
            );
            assert!(text.contains(&files) && text.contains(cause), "{text}");
        }
    }

    #[tokio::test]
    async fn a_plain_http_client_of_a_tls_server_fails() {
        let certs = TestCerts::generate(&[loopback()]);
        let etcd = TestEtcd::start_tls(&certs, loopback()).await;
        let cfg = EtcdConfig {
            endpoints: vec![etcd.endpoint().replace("https://", "http://")],
            request_timeout: Duration::from_secs(2),
            tls: TlsFiles::default(),
            auth: None,
        };
        let kv = EtcdKv::connect(&cfg).await.unwrap();
        assert!(kv.range("k", false, None).await.is_err());
    }
}
