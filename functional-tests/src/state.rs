//! What a cluster is made of, recorded on disk in `<run dir>/cluster.json` BEFORE each resource
//! is created, so that whoever tears the cluster down (its own `Drop`, `fleet-cluster down`, or
//! `cleanup_stale` after a crash) knows every name and every process the harness started, and
//! nothing else.
//!
//! Also where things live: run directories under `<target>/functional/`, never /tmp (a machine
//! that boots without a private /tmp empties it). `<target>` is cargo's target directory, wherever
//! `CARGO_TARGET_DIR` or a cargo config put it.

use crate::fleetd::FleetdSpec;
use crate::proc::ProcId;
use anyhow::{Context, Result, bail};
use fleet_core::MachineId;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Read;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// The state file's name inside a run directory. Renamed to [`DOWN_FILE`] once torn down.
pub const STATE_FILE: &str = "cluster.json";
pub const DOWN_FILE: &str = "cluster.down.json";

/// Prefix of every host resource name (bridge, veths, network namespaces, cgroups).
pub const PREFIX: &str = "flt";

/// The workspace this crate belongs to.
pub fn workspace_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Cargo's target directory: the one the running executable was built into. A test binary
/// is `<target>/<profile>/deps/<name>-<hash>`, a binary `<target>/<profile>/<name>`; cargo puts
/// both wherever `CARGO_TARGET_DIR` (or `build.target-dir`) says, so the executable's own path
/// is the only answer that is always right. Falls back to `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    profile_dir()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| workspace_dir().join("target"))
}

/// `<target>/<profile>` of the running executable (`debug` for tests, `release` for the bench).
fn profile_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let dir = if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent()?
    } else {
        dir
    };
    Some(dir.to_path_buf())
}

/// `<target>/functional`: every run's directory is in here.
pub fn functional_dir() -> PathBuf {
    target_dir().join("functional")
}

/// The machine boot script (see its header).
pub fn machine_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join("machine.sh")
}

/// Where fleetd and fleetctl are: `$FLEET_BIN_DIR`, else `<target>/debug` of cargo's target
/// directory (the workspace's debug build, also for a release-built caller).
pub fn default_bin_dir() -> PathBuf {
    std::env::var_os("FLEET_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("debug"))
}

/// A short random id naming one cluster's resources: 6 lowercase hex digits, so that
/// `flt<id>m<n>` fits Linux's 15-character interface names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RunId(String);

impl RunId {
    pub fn random() -> Result<RunId> {
        let mut bytes = [0u8; 3];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .context("cannot read /dev/urandom")?;
        Ok(RunId(bytes.iter().map(|b| format!("{b:02x}")).collect()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The bridge's name, also the prefix of every other resource of this run.
    pub fn bridge(&self) -> String {
        format!("{PREFIX}{}", self.0)
    }

    /// Name of machine `index`'s network namespace, host-side veth and cgroup directory.
    pub fn machine_resource(&self, index: u32) -> String {
        format!("{PREFIX}{}m{index}", self.0)
    }

    /// The run id in a resource name made by [`RunId::bridge`] or [`RunId::machine_resource`].
    pub fn from_resource(name: &str) -> Option<RunId> {
        let id = name.strip_prefix(PREFIX)?.get(..6)?;
        let rest = &name[PREFIX.len() + 6..];
        let rest_ok = rest.is_empty()
            || rest
                .strip_prefix('m')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        (rest_ok && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| RunId(id.to_owned()))
    }
}

impl TryFrom<String> for RunId {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        RunId::from_resource(&format!("{PREFIX}{s}")).ok_or_else(|| format!("bad run id {s:?}"))
    }
}

impl From<RunId> for String {
    fn from(id: RunId) -> String {
        id.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Everything one cluster is made of.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterState {
    pub run_id: RunId,
    /// The run directory: this file, logs, etcd's data.
    pub dir: PathBuf,
    /// The process whose `Drop` tears the cluster down; `None` once detached
    /// (`fleet-cluster up`), when only `down` does.
    pub owner: Option<ProcId>,
    /// Third byte of the cluster's subnet 10.251.<subnet>.0/24, once allocated.
    pub subnet: Option<u8>,
    pub bridge: String,
    /// Where fleetctl (and fleetd, when run) come from.
    pub bin_dir: PathBuf,
    pub fleetd: Option<FleetdSpec>,
    /// Machines get an overlay root they can write to (`ClusterSpec::writable_root`).
    #[serde(default)]
    pub writable_root: bool,
    /// etcd serves its v2 API too (`ClusterSpec::etcd_v2`).
    #[serde(default)]
    pub etcd_v2: bool,
    pub etcd: EtcdState,
    pub machines: Vec<MachineState>,
}

/// The cluster's etcd: member 0 in the first fields (all a single-member cluster has), the
/// other members in `peers`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EtcdState {
    pub client_port: u16,
    pub peer_port: u16,
    /// The running server, if any.
    pub process: Option<ProcId>,
    /// Members 1, 2, ... of a multi-member etcd.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<EtcdMember>,
}

/// One member of a multi-member etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdMember {
    pub client_port: u16,
    pub peer_port: u16,
    /// The running server, if any.
    pub process: Option<ProcId>,
}

impl EtcdState {
    pub fn member_count(&self) -> usize {
        1 + self.peers.len()
    }

    /// Member `index` (0 is the first fields).
    pub fn member(&self, index: usize) -> Option<EtcdMember> {
        match index {
            0 => Some(EtcdMember {
                client_port: self.client_port,
                peer_port: self.peer_port,
                process: self.process,
            }),
            i => self.peers.get(i - 1).copied(),
        }
    }

    /// Records member `index`'s running process.
    pub fn set_process(&mut self, index: usize, process: Option<ProcId>) {
        match index {
            0 => self.process = process,
            i => {
                if let Some(peer) = self.peers.get_mut(i - 1) {
                    peer.process = process;
                }
            }
        }
    }

    /// Every member's running process.
    pub fn processes(&self) -> Vec<ProcId> {
        (0..self.member_count())
            .filter_map(|i| self.member(i)?.process)
            .collect()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MachineState {
    /// 1-based; the machine's IP is 10.251.<subnet>.<10 + index>.
    pub index: u32,
    pub name: String,
    pub id: MachineId,
    pub ip: Ipv4Addr,
    /// Network namespace, host-side veth and cgroup directory name.
    pub resource: String,
    /// The cgroup directories made for it, one per hierarchy.
    pub cgroups: Vec<PathBuf>,
    /// The `unshare` process (parent of PID 1) and the machine's PID 1 (systemd), host PIDs.
    pub unshare: Option<ProcId>,
    pub pid1: Option<ProcId>,
}

impl ClusterState {
    pub fn path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Writes the state atomically (rename), so a reader never sees half a file.
    pub fn save(&self) -> Result<()> {
        let tmp = self.dir.join(format!("{STATE_FILE}.tmp"));
        let json = serde_json::to_vec_pretty(self)?;
        std::fs::write(&tmp, json).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, self.path())
            .with_context(|| format!("cannot write {}", self.path().display()))
    }

    pub fn load(dir: &Path) -> Result<ClusterState> {
        let path = dir.join(STATE_FILE);
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!("no cluster in {} (no {STATE_FILE})", dir.display())
            }
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        serde_json::from_slice(&text).with_context(|| format!("cannot parse {}", path.display()))
    }

    /// True if someone is responsible for tearing this cluster down: a live owner, or nobody
    /// because it was detached on purpose.
    pub fn is_claimed(&self) -> bool {
        self.owner.is_none_or(|owner| owner.is_alive())
    }

    /// `http://10.251.<subnet>.1:<port>`: reachable from the host and from every machine.
    /// With several etcd members, every member's, comma-separated, member 0 first (what
    /// fleetd and fleetctl are given).
    pub fn etcd_endpoint(&self) -> Option<String> {
        let endpoints = self.etcd_endpoints();
        (!endpoints.is_empty()).then(|| endpoints.join(","))
    }

    /// Every etcd member's client URL on the bridge, member 0 first.
    pub fn etcd_endpoints(&self) -> Vec<String> {
        let Some(subnet) = self.subnet else {
            return Vec::new();
        };
        (0..self.etcd.member_count())
            .filter_map(|i| self.etcd.member(i))
            .map(|m| format!("http://{}:{}", bridge_ip(subnet), m.client_port))
            .collect()
    }
}

/// The host's address on a cluster's bridge.
pub fn bridge_ip(subnet: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 251, subnet, 1)
}

/// Machine `index`'s address.
pub fn machine_ip(subnet: u8, index: u32) -> Result<Ipv4Addr> {
    match u8::try_from(10 + index) {
        Ok(host) if host < 255 => Ok(Ipv4Addr::new(10, 251, subnet, host)),
        _ => bail!("at most 244 machines per cluster"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names_fit_interface_names() {
        let id = RunId::random().unwrap();
        assert!(id.machine_resource(999).len() <= 15);
        assert_eq!(RunId::from_resource(&id.bridge()), Some(id.clone()));
        assert_eq!(RunId::from_resource(&id.machine_resource(12)), Some(id));
    }

    #[test]
    fn foreign_names_are_not_resources() {
        for name in [
            "eth0",
            "flt",
            "fltxyzxyz",
            "flt12345",
            "flt123456x",
            "flt123456m",
            "flt123456m1x",
        ] {
            assert_eq!(RunId::from_resource(name), None, "{name}");
        }
    }
}
