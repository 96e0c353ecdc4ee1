//! A whole cluster: etcd on the host, N machines on a bridge, fleetctl run from the host.
//!
//! A [`Cluster`] owns everything it started and tears it all down when dropped, also while a
//! test panics. [`Cluster::detach`] hands that duty to `fleet-cluster down` instead.

use crate::cleanup;
use crate::driver::{self, Driver};
use crate::etcd;
use crate::fleetd::FleetdSpec;
use crate::machine::{self, BOOT_TIMEOUT, Machine};
use crate::net;
use crate::proc::ProcId;
use crate::state::{ClusterState, EtcdState, RunId, default_bin_dir, functional_dir};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// What to boot.
#[derive(Debug, Clone, Default)]
pub struct ClusterSpec {
    /// Machines to boot at start (more with [`Cluster::add_machine`]).
    pub machines: usize,
    /// Run fleetd in every machine; `None` boots bare machines (systemd, journald, dbus).
    pub fleetd: Option<FleetdSpec>,
    /// Where fleetctl is, when `fleetd` is `None`: default `$FLEET_BIN_DIR` or
    /// `<workspace>/target/debug`. (With fleetd, its `bin_dir` is used.)
    pub bin_dir: Option<PathBuf>,
    /// The run directory (state, logs, etcd data); default
    /// `<workspace>/target/functional/<run id>`.
    pub dir: Option<PathBuf>,
    /// etcd members (0 means 1). fleetd and fleetctl get every member's endpoint, member 0
    /// first.
    pub etcd_members: usize,
    /// Give every machine a root it can write to: an overlay over the host's root with a
    /// tmpfs on top, in the machine's mount namespace (scripts/machine.sh, `writable_root`),
    /// e.g. to install a package with dpkg. Default: the host's root, read-only.
    pub writable_root: bool,
    /// etcd serves its v2 API beside v3 (`--enable-v2`), as fleet v1's fleetd needs: a test
    /// that runs fleet's own fleetd, e.g. to migrate a fleet cluster to ours.
    pub etcd_v2: bool,
}

impl ClusterSpec {
    /// `machines` machines without fleetd.
    pub fn bare(machines: usize) -> ClusterSpec {
        ClusterSpec {
            machines,
            ..ClusterSpec::default()
        }
    }

    /// `machines` machines, each running fleetd as `fleetd` says.
    pub fn with_fleetd(machines: usize, fleetd: FleetdSpec) -> ClusterSpec {
        ClusterSpec {
            machines,
            fleetd: Some(fleetd),
            ..ClusterSpec::default()
        }
    }

    /// The same with etcd's v2 API on ([`ClusterSpec::etcd_v2`]).
    pub fn with_etcd_v2(self) -> ClusterSpec {
        ClusterSpec {
            etcd_v2: true,
            ..self
        }
    }

    /// The same with `members` etcd members.
    pub fn with_etcd_members(self, members: usize) -> ClusterSpec {
        ClusterSpec {
            etcd_members: members,
            ..self
        }
    }
}

#[derive(Debug)]
pub struct Cluster {
    state: ClusterState,
    machines: Vec<Machine>,
    /// Each etcd member this process started (to reap it), by member index.
    etcd: Vec<Option<Child>>,
    /// Whether dropping this value tears the cluster down.
    owned: bool,
    /// How [`Cluster::fleetctl`] reaches the cluster: `$FLEET_TEST_DRIVER` unless a test pins it.
    driver: Driver,
}

impl Cluster {
    /// Boots etcd and `spec.machines` machines and waits until every machine is `running`.
    /// On error, whatever was already started is torn down.
    pub fn start(spec: ClusterSpec) -> Result<Cluster> {
        let driver = Driver::from_env()?;
        let run_id = RunId::random()?;
        let dir = spec
            .dir
            .clone()
            .unwrap_or_else(|| functional_dir().join(run_id.as_str()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let dir = dir.canonicalize()?;
        if let Ok(existing) = ClusterState::load(&dir) {
            if existing.is_claimed() {
                bail!(
                    "{} already holds a running cluster: tear it down first",
                    dir.display()
                );
            }
            // Its owner died: clear the leftovers before the record of them is overwritten.
            cleanup::teardown(&existing)?;
        }
        if let Some(fleetd) = &spec.fleetd {
            let binary = fleetd.bin_dir.join("fleetd");
            if !binary.is_file() {
                bail!(
                    "no fleetd at {}: build it first (cargo build -p fleetd)",
                    binary.display()
                );
            }
        }
        let bin_dir = match &spec.fleetd {
            Some(f) => f.bin_dir.clone(),
            None => spec.bin_dir.clone().unwrap_or_else(default_bin_dir),
        };
        let state = ClusterState {
            bridge: run_id.bridge(),
            run_id,
            dir,
            owner: Some(ProcId::current()?),
            subnet: None,
            bin_dir,
            fleetd: spec.fleetd.clone(),
            writable_root: spec.writable_root,
            etcd_v2: spec.etcd_v2,
            etcd: etcd_ports(spec.etcd_members.max(1)),
            machines: Vec::new(),
        };
        // Recorded before anything exists, so a crash from here on leaves a trail to clean.
        state.save()?;
        let mut cluster = Cluster {
            state,
            machines: Vec::new(),
            etcd: Vec::new(),
            owned: true,
            driver,
        };
        cluster.create_network()?;
        // The ports were free a moment ago; if another process took one since, a member exits
        // at once and we try fresh ones, on fresh data: members that did start may have formed
        // a cluster whose membership (the old ports) is in their data, and would dial those
        // ports for ever (CI, 2026-12-03: 45 s per attempt of "connection refused").
        let mut attempts = 0;
        while let Err(e) = cluster.start_etcd() {
            attempts += 1;
            if attempts == 3 {
                return Err(e);
            }
            // The test's output is where someone will look (no subscriber in tests).
            eprintln!("fleet-functional-tests: etcd did not start ({e:#}); new ports, new data");
            for index in 0..cluster.state.etcd.member_count() {
                let data = etcd::member_data_dir(&cluster.state, index);
                if data.exists() {
                    std::fs::remove_dir_all(&data)
                        .with_context(|| format!("cannot delete {}", data.display()))?;
                }
            }
            cluster.state.etcd = etcd_ports(cluster.state.etcd.member_count());
            cluster.state.save()?;
        }
        if cluster.etcd_auth() {
            crate::auth::setup(&cluster.state)?;
        }
        cluster.boot_machines(spec.machines)?;
        Ok(cluster)
    }

    fn create_network(&mut self) -> Result<()> {
        let first = u8::from_str_radix(&self.state.run_id.as_str()[..2], 16).unwrap_or(0);
        let state_file = self.state.path().display().to_string();
        self.state.subnet = Some(net::create_bridge(&self.state.bridge, &state_file, first)?);
        self.state.save()
    }

    /// Boots `count` more machines in parallel and waits until all are `running`.
    fn boot_machines(&mut self, count: usize) -> Result<()> {
        let first_new = self.machines.len();
        for _ in 0..count {
            let index = self
                .state
                .machines
                .iter()
                .map(|m| m.index)
                .max()
                .unwrap_or(0)
                + 1;
            let mut record = machine::prepare(&self.state, index)?;
            self.state.machines.push(record.clone());
            self.state.save()?;
            machine::create_resources(&self.state, &record)?;
            let (child, unshare) = machine::spawn(&self.state, &record)?;
            record.unshare = Some(unshare);
            *self
                .state
                .machines
                .last_mut()
                .context("machine not recorded")? = record.clone();
            // Tracked at once, so that teardown reaps the child whatever fails next.
            self.machines.push(Machine::new(record, Some(child)));
            self.state.save()?;
        }
        for slot in first_new..self.machines.len() {
            let record = self.machines[slot].state().clone();
            let console = machine::stage_dir(&self.state, &record.name).join("console.log");
            let unshare = record.unshare.context("machine has no unshare process")?;
            let pid1 = machine::find_pid1(&unshare, &console)?;
            self.machines[slot].set_pid1(pid1);
            if let Some(r) = self
                .state
                .machines
                .iter_mut()
                .find(|m| m.index == record.index)
            {
                r.pid1 = Some(pid1);
            }
            self.state.save()?;
        }
        for machine in &self.machines[first_new..] {
            machine.wait_running(BOOT_TIMEOUT)?;
        }
        Ok(())
    }

    /// Boots one more machine (named `m<N+1>`) and waits until it is `running`.
    pub fn add_machine(&mut self) -> Result<&Machine> {
        self.boot_machines(1)?;
        self.machines.last().context("no machine booted")
    }

    /// Reattaches to a cluster recorded in `dir` (e.g. by `fleet-cluster up`). Dropping the
    /// returned value leaves the cluster running.
    pub fn attach(dir: &Path) -> Result<Cluster> {
        let state = ClusterState::load(dir)?;
        let machines = state
            .machines
            .iter()
            .map(|m| Machine::new(m.clone(), None))
            .collect();
        Ok(Cluster {
            state,
            machines,
            etcd: Vec::new(),
            owned: false,
            driver: Driver::from_env()?,
        })
    }

    /// Tears down the cluster recorded in `dir`, whoever started it.
    pub fn down(dir: &Path) -> Result<()> {
        let state = ClusterState::load(dir)?;
        cleanup::teardown(&state)?;
        cleanup::mark_down(dir, &state.path())
    }

    /// Leaves the cluster running when this value is dropped, for `fleet-cluster down` to tear
    /// down later. Returns the run directory.
    pub fn detach(mut self) -> Result<PathBuf> {
        self.state.owner = None;
        self.state.save()?;
        self.owned = false;
        Ok(self.state.dir.clone())
    }

    /// Tears everything down now (what dropping does), reporting problems.
    pub fn shutdown(mut self) -> Result<()> {
        self.owned = false;
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        // Kill and reap our own children first: a zombie can keep its cgroup busy.
        for machine in &self.machines {
            let _ = cleanup::kill_machine(machine.state());
            let _ = machine.reap(Duration::from_secs(5));
        }
        self.stop_etcd_process()?;
        cleanup::teardown(&self.state)?;
        cleanup::mark_down(&self.state.dir, &self.state.path())
    }

    pub fn run_id(&self) -> &RunId {
        &self.state.run_id
    }

    /// The run directory: `cluster.json`, `etcd.log`, `machines/<name>/console.log`.
    pub fn dir(&self) -> &Path {
        &self.state.dir
    }

    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    pub fn machines(&self) -> &[Machine] {
        &self.machines
    }

    /// The machine called `name` (`m1`, ...).
    pub fn machine(&self, name: &str) -> Result<&Machine> {
        self.machines
            .iter()
            .find(|m| m.name() == name)
            .with_context(|| format!("no machine {name}"))
    }

    /// The machine whose ID is `id`, full or fleet's 8-character short form (as fleetctl
    /// prints it).
    pub fn machine_by_id(&self, id: &str) -> Result<&Machine> {
        self.machines
            .iter()
            .find(|m| m.id().matches(id))
            .with_context(|| format!("no machine with ID {id}"))
    }

    /// etcd's client URL on the bridge, e.g. `http://10.251.7.1:40123`: the same from the host
    /// and from inside every machine. With several members, every member's, comma-separated,
    /// member 0 first.
    pub fn etcd_endpoint(&self) -> String {
        self.state.etcd_endpoint().unwrap_or_default()
    }

    /// Cuts `machine` off etcd alone: every member listens on the bridge's address, which
    /// gets a blackhole route inside the machine; the other machines stay in reach (unlike
    /// [`Machine::cut_network`]).
    pub fn cut_from_etcd(&self, machine: &Machine) -> Result<()> {
        machine.cut_from(self.etcd_ip()?)
    }

    pub fn heal_from_etcd(&self, machine: &Machine) -> Result<()> {
        machine.heal_from(self.etcd_ip()?)
    }

    /// A second address of this host on the cluster's bridge (10.251.<subnet>.2), for a test
    /// that needs two network peers: a socket bound to it reaches the machines from another
    /// address than the bridge's own. It goes with the bridge.
    pub fn second_host_address(&self) -> Result<std::net::Ipv4Addr> {
        let subnet = self.state.subnet.context("the cluster has no network")?;
        let ip = std::net::Ipv4Addr::new(10, 251, subnet, 2);
        let with_prefix = format!("{ip}/32");
        let shown = crate::cmd::run("ip", ["-o", "address", "show", "dev", &self.state.bridge])?;
        if !shown.contains(&format!("inet {with_prefix}")) {
            crate::cmd::run(
                "ip",
                ["address", "add", &with_prefix, "dev", &self.state.bridge],
            )?;
        }
        Ok(ip)
    }

    fn etcd_ip(&self) -> Result<std::net::Ipv4Addr> {
        let subnet = self.state.subnet.context("the cluster has no network")?;
        Ok(crate::state::bridge_ip(subnet))
    }

    /// Every etcd member's client URL, member 0 first.
    pub fn etcd_endpoints(&self) -> Vec<String> {
        self.state.etcd_endpoints()
    }

    /// Whether every running etcd member answers its health check right now.
    pub fn etcd_healthy(&self) -> bool {
        let members: Vec<_> = (0..self.state.etcd.member_count())
            .filter_map(|i| self.state.etcd.member(i))
            .collect();
        members.iter().any(|m| m.process.is_some())
            && members
                .iter()
                .filter(|m| m.process.is_some())
                .all(|m| etcd::member_addr(&self.state, m).is_some_and(etcd::is_healthy))
    }

    /// The fleetctl binary on the host.
    pub fn fleetctl_path(&self) -> PathBuf {
        self.state.bin_dir.join("fleetctl")
    }

    /// Whether etcd's auth is on ([`FleetdSpec::etcd_auth`]).
    pub fn etcd_auth(&self) -> bool {
        self.state
            .fleetd
            .as_ref()
            .is_some_and(|f| f.etcd_auth.is_some())
    }

    /// `user`'s credentials when etcd's auth is on (`crate::auth`'s users), else none.
    pub fn etcd_credentials(&self, user: &str) -> Result<Option<fleet_registry::kv::EtcdAuth>> {
        if !self.etcd_auth() {
            return Ok(None);
        }
        crate::auth::credentials(&self.state.dir, user).map(Some)
    }

    /// fleetctl on the host as etcd user `user` over the etcd driver (etcd's auth on).
    pub fn fleetctl_as<I, S>(&self, user: &str, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut command = Command::new(self.fleetctl_path());
        command
            .envs(Driver::Etcd.env(&self.etcd_endpoint(), Path::new("")))
            .envs(crate::auth::fleetctl_env(&self.state.dir, user))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {}", self.fleetctl_path().display()))
    }

    /// The driver [`Cluster::fleetctl`] uses.
    pub fn driver(&self) -> Driver {
        self.driver
    }

    /// Pins the driver of [`Cluster::fleetctl`], for a test about one driver (etcd's own
    /// failures, say) whatever `$FLEET_TEST_DRIVER` says.
    pub fn set_driver(&mut self, driver: Driver) {
        self.driver = driver;
    }

    /// Runs fleetctl on the host over the cluster's driver ([`Cluster::driver`]).
    pub fn fleetctl<I, S>(&self, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.fleetctl_over(self.driver, args)
    }

    /// Runs fleetctl on the host over `driver`, output captured.
    pub fn fleetctl_over<I, S>(&self, driver: Driver, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.fleetctl_command(driver)?
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {}", self.fleetctl_path().display()))
    }

    /// fleetctl on the host, pointed at the cluster over `driver` (etcd's endpoint, or the API
    /// socket of [`Cluster::api_machine`]'s fleetd), for a test to add arguments and run.
    /// The endpoint and driver are `FLEETCTL_ENDPOINT`/`FLEETCTL_DRIVER`, so an `--endpoint`
    /// among the arguments wins.
    pub fn fleetctl_command(&self, driver: Driver) -> Result<Command> {
        let socket = match driver {
            Driver::Etcd => PathBuf::new(),
            Driver::Api => self.api_machine()?.api_socket(),
        };
        let mut command = Command::new(self.fleetctl_path());
        command.envs(driver.env(&self.etcd_endpoint(), &socket));
        // Over etcd with auth on, as the operator; over the API, as the machine's fleetd.
        if self.etcd_auth() && driver == Driver::Etcd {
            command.envs(crate::auth::fleetctl_env(
                &self.state.dir,
                crate::auth::OPERATOR,
            ));
        }
        Ok(command)
    }

    /// The authority and fleetctl's client certificate of the machines' TLS API listeners,
    /// when they serve one ([`FleetdSpec::api_tls_port`]).
    pub fn api_certs(&self) -> Option<crate::ApiCerts> {
        self.api_tls_port()?;
        crate::ApiCerts::ensure(&self.state.dir).ok()
    }

    fn api_tls_port(&self) -> Option<u16> {
        self.state.fleetd.as_ref()?.api_tls_port
    }

    /// `https://<ip>:<port>`: where `machine`'s fleetd serves its TLS API listener.
    pub fn api_url(&self, machine: &Machine) -> Result<String> {
        let port = self
            .api_tls_port()
            .context("the cluster's fleetd serve no TLS API (FleetdSpec::api_tls_port)")?;
        Ok(format!("https://{}:{port}", machine.ip()))
    }

    /// fleetctl on the host over the TLS API of [`Cluster::api_machine`]'s fleetd, with the
    /// cluster's authority and client certificate (`FLEETCTL_CA_FILE`, `_CERT_FILE`,
    /// `_KEY_FILE`), as a user off the cluster runs it.
    pub fn fleetctl_tls_command(&self) -> Result<Command> {
        let certs = self
            .api_certs()
            .context("the cluster's fleetd serve no TLS API (FleetdSpec::api_tls_port)")?;
        let mut command = Command::new(self.fleetctl_path());
        command
            .env("FLEETCTL_DRIVER", "api")
            .env("FLEETCTL_ENDPOINT", self.api_url(self.api_machine()?)?)
            .envs(certs.fleetctl_env());
        Ok(command)
    }

    /// The machine whose fleetd the API driver talks to: the first one that is up and whose
    /// API answers (so a test that stops, freezes or cuts off one fleetd goes on through
    /// another, as a user would log in elsewhere), else the first one that is up, for
    /// fleetctl to report what is wrong.
    pub fn api_machine(&self) -> Result<&Machine> {
        let up = || self.machines.iter().filter(|m| m.is_up());
        up().find(|m| driver::serves(&m.api_socket()))
            .or_else(|| up().next())
            .context("no machine is up to serve the API")
    }

    /// Stops every etcd member (SIGTERM, then SIGKILL after 10 s). Their data stays for
    /// [`Cluster::start_etcd`].
    pub fn stop_etcd(&mut self) -> Result<()> {
        self.stop_etcd_process()?;
        self.state.save()
    }

    fn stop_etcd_process(&mut self) -> Result<()> {
        for index in 0..self.state.etcd.member_count() {
            self.stop_member(index, crate::Signal::Term)?;
        }
        Ok(())
    }

    /// Sends `signal` to member `index` (SIGKILL after 10 s if it was SIGTERM), reaps it.
    fn stop_member(&mut self, index: usize, signal: crate::Signal) -> Result<()> {
        let member = self
            .state
            .etcd
            .member(index)
            .with_context(|| format!("no etcd member {index}"))?;
        if let Some(process) = member.process {
            process.signal(signal)?;
            let stopped =
                crate::wait_for(Duration::from_secs(10), Duration::from_millis(10), || {
                    !process.is_alive()
                });
            if stopped.is_err() {
                process.kill_and_wait(Duration::from_secs(10))?;
            }
        }
        if let Some(mut child) = self.etcd.get_mut(index).and_then(Option::take) {
            child.wait().context("cannot reap etcd")?;
        }
        self.state.etcd.set_process(index, None);
        Ok(())
    }

    /// Starts every etcd member (again) on the same ports with the same data, and waits until
    /// each is healthy.
    pub fn start_etcd(&mut self) -> Result<()> {
        let count = self.state.etcd.member_count();
        if self.state.etcd.processes().iter().any(ProcId::is_alive) {
            bail!("etcd is already running");
        }
        // Every member first: a member of several is healthy only once they elect a leader.
        let started = (0..count)
            .try_for_each(|index| self.spawn_member(index))
            .and_then(|()| (0..count).try_for_each(|index| self.wait_member(index)));
        if started.is_err() {
            // All or none: a retry on new ports starts every member afresh.
            self.stop_etcd_process()?;
            self.state.save()?;
        }
        started
    }

    fn spawn_member(&mut self, index: usize) -> Result<()> {
        let (child, process) = etcd::spawn(&self.state, index)?;
        if self.etcd.len() <= index {
            self.etcd.resize_with(index + 1, || None);
        }
        self.etcd[index] = Some(child);
        self.state.etcd.set_process(index, Some(process));
        self.state.save()
    }

    fn wait_member(&mut self, index: usize) -> Result<()> {
        let Some(child) = self.etcd.get_mut(index).and_then(Option::as_mut) else {
            bail!("etcd member {index} was not started here");
        };
        let healthy = etcd::wait_healthy(&self.state, index, child);
        if healthy.is_err() {
            // wait_healthy killed it.
            self.etcd[index] = None;
            self.state.etcd.set_process(index, None);
            self.state.save()?;
        }
        healthy
    }

    /// How many etcd members the cluster has.
    pub fn etcd_members(&self) -> usize {
        self.state.etcd.member_count()
    }

    /// SIGKILLs etcd member `index` (its data stays).
    pub fn kill_etcd_member(&mut self, index: usize) -> Result<()> {
        self.stop_member(index, crate::Signal::Kill)?;
        self.state.save()
    }

    /// Starts etcd member `index` again and waits until it is healthy (the others must be up:
    /// a member alone has no leader).
    pub fn start_etcd_member(&mut self, index: usize) -> Result<()> {
        let member = self
            .state
            .etcd
            .member(index)
            .with_context(|| format!("no etcd member {index}"))?;
        if member.process.is_some_and(|p| p.is_alive()) {
            bail!("etcd member {index} is already running");
        }
        self.spawn_member(index)?;
        self.wait_member(index)
    }

    /// The raft leader's member index, waiting (up to 15 s) while an election is under way.
    pub fn etcd_leader(&self) -> Result<usize> {
        crate::wait_for_value(Duration::from_secs(15), Duration::from_millis(20), || {
            self.find_etcd_leader()
        })
        .context("no etcd leader")
    }

    fn find_etcd_leader(&self) -> Option<usize> {
        let statuses = self.member_statuses();
        statuses.iter().find_map(|(index, status)| {
            (status.leader != 0 && status.leader == status.id).then_some(*index)
        })
    }

    /// The status of every running member that answers.
    fn member_statuses(&self) -> Vec<(usize, etcd::MemberStatus)> {
        (0..self.state.etcd.member_count())
            .filter_map(|i| {
                let member = self.state.etcd.member(i)?;
                member.process?;
                let status = etcd::status(etcd::member_addr(&self.state, &member)?).ok()?;
                Some((i, status))
            })
            .collect()
    }

    /// Makes member `index` the raft leader (`etcdctl move-leader`) and waits until every
    /// running member agrees.
    pub fn make_etcd_leader(&self, index: usize) -> Result<()> {
        let leader = self.etcd_leader()?;
        let statuses = self.member_statuses();
        let target = statuses
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, s)| s.id)
            .with_context(|| format!("etcd member {index} does not answer"))?;
        if leader != index {
            let member = self.state.etcd.member(leader).context("no leader member")?;
            let addr = etcd::member_addr(&self.state, &member).context("no subnet")?;
            etcd::transfer_leadership(addr, target)?;
        }
        crate::wait_for(Duration::from_secs(15), Duration::from_millis(20), || {
            let statuses = self.member_statuses();
            statuses.len() == self.state.etcd.processes().len()
                && statuses.iter().all(|(_, s)| s.leader == target)
        })
        .with_context(|| format!("etcd member {index} did not become the leader"))
    }
}

/// An etcd of `members` members, none running, each on its own pair of distinct free ports.
fn etcd_ports(members: usize) -> EtcdState {
    let ports = fleet_testing::free_ports(2 * members);
    let member = |i: usize| crate::state::EtcdMember {
        client_port: ports[2 * i],
        peer_port: ports[2 * i + 1],
        process: None,
    };
    EtcdState {
        client_port: ports[0],
        peer_port: ports[1],
        process: None,
        peers: (1..members).map(member).collect(),
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // Drop cannot return the error, and a test's output is where someone will look.
        if let Err(e) = self.teardown() {
            eprintln!(
                "fleet-functional-tests: teardown of {} incomplete ({e:#}); \
                 the next cleanup_stale() retries it",
                self.state.dir.display()
            );
        }
    }
}
