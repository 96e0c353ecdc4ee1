//! One machine: a real systemd as PID 1 of its own PID, mount, UTS, IPC and network namespaces,
//! booted by `scripts/machine.sh` (which says how and why), and the ways a test pokes at it.
//!
//! Everything a test does inside a machine goes through `nsenter` into PID 1's namespaces, or
//! through `/proc/<pid1>/root` for files: the same things a person types when debugging one.

use crate::cmd::{self, OutputExt, Signal};
use crate::fleetd;
use crate::net;
use crate::proc::ProcId;
use crate::state::{ClusterState, MachineState, machine_ip, machine_script};
use anyhow::{Context, Result, bail};
use fleet_core::MachineId;
use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// How long a machine may take to boot (~0.4 s when the host is idle).
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(20);

/// A running (or powered-off) machine of a cluster.
#[derive(Debug)]
pub struct Machine {
    state: MachineState,
    /// The `unshare` process when this process started it, to reap it once it exits.
    child: Mutex<Option<Child>>,
}

/// The host directory with a machine's files: identity, units, console log.
pub fn stage_dir(cluster: &ClusterState, name: &str) -> PathBuf {
    cluster.dir.join("machines").join(name)
}

/// Names and identifies machine `index` of `cluster`, and writes the files its boot copies in.
/// Creates nothing outside the run directory.
pub(crate) fn prepare(cluster: &ClusterState, index: u32) -> Result<MachineState> {
    let subnet = cluster
        .subnet
        .context("machines need the cluster's subnet")?;
    let name = format!("m{index}");
    let resource = cluster.run_id.machine_resource(index);
    let ip = machine_ip(subnet, index)?;
    let id: MachineId = cmd::run("systemd-id128", ["new"])?
        .trim()
        .parse()
        .context("systemd-id128 printed no machine ID")?;
    let stage = stage_dir(cluster, &name);
    std::fs::create_dir_all(stage.join("system"))?;
    std::fs::create_dir_all(stage.join("fleet"))?;
    std::fs::write(stage.join("machine-id"), format!("{id}\n"))?;
    std::fs::write(stage.join("hostname"), format!("{name}\n"))?;
    std::fs::write(
        stage.join("system").join(fleetd::MACHINE_TARGET),
        fleetd::machine_target(cluster.fleetd.is_some()),
    )?;
    if let Some(spec) = &cluster.fleetd {
        let endpoint = cluster
            .etcd_endpoint()
            .context("fleetd needs etcd's endpoint")?;
        std::fs::write(stage.join("system").join(fleetd::UNIT), fleetd::unit_file())?;
        let mut env = spec.env_file(&endpoint, &name, ip);
        if let Some(auth) = &spec.etcd_auth {
            let full = !auth.machine_only.contains(&index);
            let fleet = stage.join("fleet");
            env.push_str(&crate::auth::add_host(cluster, &id, &fleet, full)?);
        }
        std::fs::write(stage.join("fleet").join("fleetd.env"), env)?;
        if spec.api_tls_port.is_some() {
            crate::certs::ApiCerts::ensure(&cluster.dir)?
                .machine(&stage.join("fleet").join("tls"), ip)?;
        }
    }
    Ok(MachineState {
        index,
        name,
        id,
        ip,
        cgroups: crate::cgroup::paths(&resource),
        resource,
        unshare: None,
        pid1: None,
    })
}

/// Creates the machine's network namespace and cgroups (already recorded in `machine`).
pub(crate) fn create_resources(cluster: &ClusterState, machine: &MachineState) -> Result<()> {
    net::create_machine_net(&machine.resource, &cluster.bridge, machine.ip)?;
    crate::cgroup::create(&machine.cgroups)?;
    Ok(())
}

/// Starts the machine's boot script; returns the `unshare` process. `setsid`: the machine must
/// outlive a detached `fleet-cluster up` and not get the terminal's signals.
pub(crate) fn spawn(cluster: &ClusterState, machine: &MachineState) -> Result<(Child, ProcId)> {
    let stage = stage_dir(cluster, &machine.name);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(stage.join("console.log"))
        .context("cannot open the machine's console log")?;
    let cgroups: Vec<String> = machine
        .cgroups
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let mut command = Command::new("setsid");
    command
        .arg(machine_script())
        .arg("boot")
        .env("FT_STAGE", &stage)
        .env("FT_NETNS", &machine.resource)
        .env("FT_CGROUPS", cgroups.join(" "))
        .env("FT_TARGET", fleetd::MACHINE_TARGET)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if cluster.writable_root {
        command.env("FT_WRITABLE_ROOT", "1");
    }
    // Bare machines see it too: tests run programs of their own build inside.
    if cluster.bin_dir.is_dir() {
        command.env("FT_BIN_DIR", &cluster.bin_dir);
    }
    let child = command.spawn().context("cannot start scripts/machine.sh")?;
    let process = ProcId::of(child.id())?;
    Ok((child, process))
}

/// The machine's PID 1: the child `unshare --fork` makes.
pub(crate) fn find_pid1(unshare: &ProcId, console: &Path) -> Result<ProcId> {
    let pid = crate::wait_for_value(BOOT_TIMEOUT, Duration::from_millis(2), || {
        unshare
            .children()
            .first()
            .copied()
            .or_else(|| (!unshare.is_alive()).then_some(0))
    })?;
    if pid == 0 {
        bail!(
            "the machine's boot script exited; see {}",
            console.display()
        );
    }
    ProcId::of(pid)
}

impl Machine {
    pub(crate) fn new(state: MachineState, child: Option<Child>) -> Machine {
        Machine {
            state,
            child: Mutex::new(child),
        }
    }

    pub(crate) fn set_pid1(&mut self, pid1: ProcId) {
        self.state.pid1 = Some(pid1);
    }

    pub(crate) fn state(&self) -> &MachineState {
        &self.state
    }

    /// `m1`, `m2`, ...: also its hostname.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// Its `/etc/machine-id`.
    pub fn id(&self) -> &MachineId {
        &self.state.id
    }

    pub fn ip(&self) -> Ipv4Addr {
        self.state.ip
    }

    /// Host PID of the machine's systemd.
    pub fn pid1(&self) -> u32 {
        self.state.pid1.map_or(0, |p| p.pid)
    }

    /// fleetd's default API socket (`/var/run/fleet.sock` inside), as a path on the host.
    pub fn api_socket(&self) -> PathBuf {
        crate::driver::machine_api_socket(self.pid1())
    }

    /// The API driver's endpoint for this machine's fleetd, from the host.
    pub fn api_endpoint(&self) -> String {
        format!("unix://{}", self.api_socket().display())
    }

    /// Whether its systemd still runs (false after [`Machine::poweroff`]).
    pub fn is_up(&self) -> bool {
        self.state.pid1.is_some_and(|p| p.is_alive())
    }

    /// The `nsenter` command line that runs a command inside this machine.
    pub fn nsenter_prefix(&self) -> Vec<String> {
        [
            "nsenter",
            "-t",
            &self.pid1().to_string(),
            "-m",
            "-p",
            "-u",
            "-i",
            "-n",
            "--",
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// Runs `program args...` inside the machine (all its namespaces), with a clean
    /// environment; fails only if it cannot be started.
    pub fn exec<I, S>(&self, program: &str, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        if !self.is_up() {
            bail!("machine {} is not running", self.name());
        }
        let prefix = self.nsenter_prefix();
        Command::new(&prefix[0])
            .args(&prefix[1..])
            .arg(program)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LANG", "C.UTF-8")
            .current_dir("/")
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {program} in machine {}", self.name()))
    }

    /// Runs a shell script inside the machine; its stdout if it exits 0.
    pub fn sh(&self, script: &str) -> Result<String> {
        self.exec("sh", ["-c", script])?
            .checked()
            .with_context(|| format!("in machine {}: sh -c {script:?}", self.name()))
    }

    /// `systemctl --no-pager args...` inside the machine.
    pub fn systemctl<I, S>(&self, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut all: Vec<std::ffi::OsString> = vec!["--no-pager".into()];
        all.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self.exec("systemctl", all)
    }

    /// `systemctl args...`, failing unless it exits 0.
    pub fn systemctl_ok(&self, args: &[&str]) -> Result<String> {
        self.systemctl(args)?
            .checked()
            .with_context(|| format!("in machine {}: systemctl {}", self.name(), args.join(" ")))
    }

    /// The unit's main PID (in the machine's PID namespace), if it runs.
    pub fn main_pid(&self, unit: &str) -> Result<Option<u32>> {
        let pid = self.systemctl_ok(&["show", "--property=MainPID", "--value", unit])?;
        let pid: u32 = pid.trim().parse().context("MainPID is not a number")?;
        Ok((pid != 0).then_some(pid))
    }

    /// `journalctl --no-pager args...` inside the machine; its output.
    pub fn journal(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["--no-pager", "--quiet"];
        all.extend(args);
        self.exec("journalctl", &all)?
            .checked()
            .with_context(|| format!("in machine {}: journalctl {}", self.name(), args.join(" ")))
    }

    /// Waits until `systemctl is-system-running` says `running`. `degraded` fails at once, with
    /// the failed units: nothing in a test machine is allowed to fail at boot.
    pub fn wait_running(&self, timeout: Duration) -> Result<()> {
        let mut last = String::new();
        let state = crate::wait_for_value(timeout, Duration::from_millis(20), || {
            if !self.is_up() {
                return Some("powered off".to_owned());
            }
            let out = self.systemctl(["is-system-running"]).ok()?;
            last = out.stdout_text().trim().to_owned();
            matches!(last.as_str(), "running" | "degraded").then(|| last.clone())
        })
        .with_context(|| format!("machine {} not running (last state {last:?})", self.name()))?;
        match state.as_str() {
            "running" => Ok(()),
            "degraded" => {
                let failed = self.systemctl(["--failed", "--no-legend", "--plain"])?;
                bail!(
                    "machine {} is degraded: {}",
                    self.name(),
                    failed.stdout_text().trim()
                )
            }
            _ => bail!("machine {} is {state}", self.name()),
        }
    }

    /// Sends `signal` to fleetd's main process only (the units it started are untouched).
    pub fn kill_fleetd(&self, signal: Signal) -> Result<()> {
        let signal = format!("--signal={}", signal.name());
        self.systemctl_ok(&["kill", "--kill-whom=main", &signal, fleetd::UNIT])
            .map(drop)
    }

    pub fn stop_fleetd(&self) -> Result<()> {
        self.systemctl_ok(&["stop", fleetd::UNIT]).map(drop)
    }

    pub fn start_fleetd(&self) -> Result<()> {
        self.systemctl_ok(&["start", fleetd::UNIT]).map(drop)
    }

    pub fn restart_fleetd(&self) -> Result<()> {
        self.systemctl_ok(&["restart", fleetd::UNIT]).map(drop)
    }

    /// Cuts the machine off the network: its link to the bridge goes down, so packets to and
    /// from it are dropped (connections time out, as in a real partition).
    pub fn cut_network(&self) -> Result<()> {
        net::set_link(&self.state.resource, false)
    }

    pub fn heal_network(&self) -> Result<()> {
        net::set_link(&self.state.resource, true)
    }

    /// Cuts the machine off `ip` alone (a blackhole route inside it): packets to it are
    /// dropped, every other machine is still in reach. See [`crate::Cluster::cut_from_etcd`].
    pub fn cut_from(&self, ip: std::net::Ipv4Addr) -> Result<()> {
        net::blackhole(&self.state.resource, ip, true)
    }

    pub fn heal_from(&self, ip: std::net::Ipv4Addr) -> Result<()> {
        net::blackhole(&self.state.resource, ip, false)
    }

    /// Where `path` (absolute, inside the machine) is seen from the host.
    fn host_path(&self, path: &str) -> Result<PathBuf> {
        let relative = path
            .strip_prefix('/')
            .with_context(|| format!("{path:?} is not an absolute path"))?;
        if !self.is_up() {
            bail!("machine {} is not running", self.name());
        }
        Ok(PathBuf::from(format!("/proc/{}/root", self.pid1())).join(relative))
    }

    /// Writes a file inside the machine (creating its directory), e.g. a unit in
    /// /run/systemd/system. Only the machine's tmpfs mounts (/run, /tmp, ...) are writable,
    /// and the whole root of a cluster with `writable_root` ([`crate::ClusterSpec`]).
    pub fn write_file(&self, path: &str, contents: impl AsRef<[u8]>) -> Result<()> {
        let host = self.host_path(path)?;
        if let Some(dir) = host.parent() {
            std::fs::create_dir_all(dir).with_context(|| {
                format!(
                    "in machine {}: cannot create {path}'s directory",
                    self.name()
                )
            })?;
        }
        std::fs::write(&host, contents)
            .with_context(|| format!("in machine {}: cannot write {path}", self.name()))
    }

    /// Reads a file inside the machine.
    pub fn read_file(&self, path: &str) -> Result<String> {
        std::fs::read_to_string(self.host_path(path)?)
            .with_context(|| format!("in machine {}: cannot read {path}", self.name()))
    }

    /// Pulls the plug: SIGKILL to its PID 1, which takes the whole PID namespace with it.
    /// Its network namespace and cgroups stay until the cluster is torn down.
    pub fn poweroff(&self) -> Result<()> {
        if let Some(pid1) = self.state.pid1 {
            pid1.kill_and_wait(Duration::from_secs(10))?;
        }
        self.reap(Duration::from_secs(10))
    }

    /// Waits for our `unshare` child to exit (it does once PID 1 is gone) and reaps it.
    pub(crate) fn reap(&self, timeout: Duration) -> Result<()> {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let Some(process) = child.as_mut() else {
            return Ok(());
        };
        crate::wait_for(timeout, Duration::from_millis(5), || {
            matches!(process.try_wait(), Ok(Some(_)) | Err(_))
        })
        .with_context(|| format!("machine {}'s unshare did not exit", self.name()))?;
        *child = None;
        Ok(())
    }
}
