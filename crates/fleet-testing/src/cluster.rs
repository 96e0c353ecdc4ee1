//! [`TestEtcdCluster`]: a real etcd cluster of several members on loopback, each with its own
//! ports, data directory and log, for tests of what a client does when one member fails.
//! Members can be killed (SIGKILL) and restarted on the same ports and data; the raft leader
//! is found through etcd's maintenance status (its JSON gateway, plain HTTP).

use std::fs::{self, File};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::auth::{enable_auth, issue_user, root_auth};
use crate::etcd::{
    EtcdMember, READY_WITHIN, REQUEST_TIMEOUT, START_ATTEMPTS, etcd_binary, etcd_command,
};
use crate::{free_ports, member_status, unique_dir};
use fleet_registry::kv::{EtcdConfig, EtcdKv, Kv, TlsFiles};
use fleet_registry::rbac::RoleSpec;

/// A running multi-member etcd. Dropping it kills every member and deletes the data.
#[derive(Debug)]
pub struct TestEtcdCluster {
    dir: PathBuf,
    members: Vec<TestMember>,
    /// Whether etcd's authentication is on (see [`TestEtcdCluster::start_auth`]).
    auth: bool,
}

#[derive(Debug)]
struct TestMember {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

impl TestEtcdCluster {
    /// Starts `size` members together and waits until each answers a read (so the cluster has
    /// a leader). Panics if it cannot. A member that cannot bind its port (another test took
    /// it between [`free_ports`] and etcd's bind) fails the attempt: the whole cluster starts
    /// again on new ports, as [`TestEtcd`](crate::TestEtcd) does.
    pub async fn start(size: usize) -> TestEtcdCluster {
        assert!(size > 0, "an etcd cluster needs a member");
        let mut last_log = String::new();
        for _ in 0..START_ATTEMPTS {
            let mut cluster = TestEtcdCluster::spawn_all(size);
            let mut failed = None;
            for i in 0..size {
                if let Err(log) = cluster.ready(i).await {
                    failed = Some(log);
                    break;
                }
            }
            match failed {
                None => return cluster,
                // Dropped: every member killed, its data deleted.
                Some(log) => last_log = log,
            }
        }
        panic!(
            "test etcd cluster did not start after {START_ATTEMPTS} attempts; last log:\n{last_log}"
        );
    }

    fn spawn_all(size: usize) -> TestEtcdCluster {
        let ports = free_ports(2 * size);
        let members = (0..size)
            .map(|i| TestMember {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                child: None,
            })
            .collect();
        let mut cluster = TestEtcdCluster {
            dir: unique_dir("etcd-cluster"),
            members,
            auth: false,
        };
        for i in 0..size {
            cluster.spawn(i);
        }
        cluster
    }

    /// [`start`](Self::start), then authentication on as in
    /// [`TestEtcd::start_auth`](crate::TestEtcd::start_auth): clients log in as `root`.
    pub async fn start_auth(size: usize) -> TestEtcdCluster {
        let mut cluster = TestEtcdCluster::start(size).await;
        cluster.auth = true;
        // Root's credentials are used anonymously while auth is still off.
        enable_auth(&cluster.config_for(cluster.endpoints())).await;
        cluster
    }

    /// A user holding exactly `roles`, as [`TestEtcd::issue_user`](crate::TestEtcd::issue_user),
    /// for every member.
    pub async fn issue_user(&self, name: &str, roles: &[RoleSpec]) -> EtcdConfig {
        assert!(self.auth, "issue_user needs a cluster started with auth");
        issue_user(&self.config_for(self.endpoints()), name, roles).await
    }

    /// Every member's client URL, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Member `index`'s client URL.
    pub fn endpoint(&self, index: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[index].client_port)
    }

    /// A client configuration listing `endpoints` (URLs of [`endpoints`](Self::endpoints), in
    /// the order the test wants them tried).
    pub fn config_for(&self, endpoints: Vec<String>) -> EtcdConfig {
        EtcdConfig {
            endpoints,
            request_timeout: REQUEST_TIMEOUT,
            tls: TlsFiles::default(),
            auth: self.auth.then(root_auth),
        }
    }

    /// A client of every member, in member order.
    pub async fn kv(&self) -> EtcdKv {
        EtcdKv::connect(&self.config_for(self.endpoints()))
            .await
            .expect("a loopback etcd config is valid")
    }

    /// Kills member `index` (SIGKILL), keeping its data for [`restart`](Self::restart).
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes member `index` (SIGSTOP): its connections stay open and nothing answers, as
    /// with a hung process or a frozen VM. [`thaw`](Self::thaw) resumes it.
    pub fn freeze(&self, index: usize) {
        self.signal(index, "STOP");
    }

    /// Resumes a member frozen by [`freeze`](Self::freeze) (SIGCONT).
    pub fn thaw(&self, index: usize) {
        self.signal(index, "CONT");
    }

    fn signal(&self, index: usize, signal: &str) {
        let child = self.members[index].child.as_ref();
        let pid = child
            .unwrap_or_else(|| panic!("etcd member {index} is not running"))
            .id();
        // bash's builtin kill, as the functional harness does: /bin/kill is procps's, which a
        // minimal Debian lacks (functional-tests/tests/packages.rs).
        let status = Command::new("bash")
            .args(["-c", "kill -s \"$1\" -- \"$2\"", "kill"])
            .arg(signal)
            .arg(pid.to_string())
            .status()
            .unwrap_or_else(|e| panic!("running kill: {e}"));
        assert!(status.success(), "kill -{signal} {pid} failed");
    }

    /// Starts member `index` again on its ports and data, and waits until it answers.
    pub async fn restart(&mut self, index: usize) {
        self.kill(index);
        self.spawn(index);
        self.wait_ready(index).await;
    }

    /// The index of the raft leader, as the live members report it; waits (up to the ready
    /// timeout) while an election is under way. Panics if no leader shows up.
    pub async fn leader(&self) -> usize {
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            if let Some(leader) = self.find_leader().await {
                return leader;
            }
            sleep(Duration::from_millis(20)).await;
        }
        panic!("no etcd leader within {READY_WITHIN:?}");
    }

    async fn find_leader(&self) -> Option<usize> {
        let ports: Vec<(usize, u16)> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.child.is_some())
            .map(|(i, m)| (i, m.client_port))
            .collect();
        tokio::task::spawn_blocking(move || {
            ports.into_iter().find_map(|(index, port)| {
                let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                let status = member_status(addr).ok()?;
                (status.leader != 0 && status.leader == status.id).then_some(index)
            })
        })
        .await
        .ok()
        .flatten()
    }

    fn member_dir(&self, index: usize) -> PathBuf {
        self.dir.join(&self.members[index].name)
    }

    fn log_path(&self, index: usize) -> PathBuf {
        self.member_dir(index).join("etcd.log")
    }

    fn spawn(&mut self, index: usize) {
        let dir = self.member_dir(index);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let initial_cluster = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let token = dir
            .parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path(index))
            .unwrap_or_else(|e| panic!("creating {}: {e}", self.log_path(index).display()));
        let member = &self.members[index];
        let launch = EtcdMember {
            name: &member.name,
            data_dir: dir.join("data"),
            client: format!("http://127.0.0.1:{}", member.client_port),
            peer: format!("http://127.0.0.1:{}", member.peer_port),
            initial_cluster,
            token: Some(token),
        };
        let child = etcd_command(&launch, log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", etcd_binary()));
        self.members[index].child = Some(child);
    }

    /// Polls member `index` alone with a real read until it answers.
    async fn wait_ready(&mut self, index: usize) {
        if let Err(log) = self.ready(index).await {
            panic!("test etcd member {index} did not get ready; log:\n{log}");
        }
    }

    /// Polls member `index` alone with a real read until it answers; its log if it exits or
    /// does not answer in time.
    async fn ready(&mut self, index: usize) -> Result<(), String> {
        let deadline = Instant::now() + READY_WITHIN;
        let cfg = EtcdConfig {
            request_timeout: Duration::from_millis(500),
            ..self.config_for(vec![self.endpoint(index)])
        };
        let kv = EtcdKv::connect(&cfg).await.expect("valid config");
        while Instant::now() < deadline {
            let exited = self.members[index]
                .child
                .as_mut()
                .is_none_or(|c| !matches!(c.try_wait(), Ok(None)));
            if exited {
                break;
            }
            if kv.range("health", false, None).await.is_ok() {
                return Ok(());
            }
            sleep(Duration::from_millis(20)).await;
        }
        Err(fs::read_to_string(self.log_path(index)).unwrap_or_default())
    }
}

impl Drop for TestEtcdCluster {
    fn drop(&mut self) {
        for index in 0..self.members.len() {
            // A frozen member dies of SIGKILL all the same.
            self.kill(index);
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}
