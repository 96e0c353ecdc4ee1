//! A simulated cluster in one process: a real etcd on loopback ([`TestEtcd`]), N machines each
//! running the real [`Agent`] on a [`FakeManager`] (the fake systemd), and a few real engine
//! candidates. Every etcd request goes through a [`CountingKv`], so each machine's and each
//! role's traffic can be read at any moment.
//!
//! What fleetd itself does around the agent (presence on a lease, kept alive at TTL/3) is
//! done by fleetd's own [`PresenceKeeper`], one per machine; what `fleetctl start --no-block`
//! does is done by fleetctl's own submit path, in [`Sim::submit`].

use anyhow::{Context, Result, bail};
use fleet_agent::{Agent, AgentConfig, FakeManager, PresenceKeeper};
use fleet_core::{DesiredState, MachineId, MachineInfo, UnitFile, UnitName};
use fleet_engine::EngineConfig;
use fleet_ops::ReplaceHow;
use fleet_ops::etcd::RegistryCluster;
use fleet_registry::kv::{EtcdConfig, EtcdKv, TlsFiles};
use fleet_registry::{DEFAULT_PREFIX, MachineRole, Presence, Registry};
use fleet_testing::TestEtcd;
use fleetctl::commands::Ctx;
use fleetctl::commands::submit::{self, Verb};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::counting::{Counters, CountingKv, Method, counting};
use crate::metered::CallCounts;
use crate::monitor::Monitor;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimSpec {
    pub machines: usize,
    /// Engine candidates, on the first machines (fleetd runs one in every machine by default;
    /// a few are enough to show that followers cost nothing).
    pub engines: usize,
    /// etcd connections shared by the simulated machines (fleetd has one each).
    pub connections: usize,
    /// fleetd's `agent_ttl` default.
    pub agent_ttl: Duration,
    /// The agent's periodic resync (its default).
    pub resync: Duration,
    /// The engine's `engine_reconcile_interval` (fleetd's default).
    pub engine_interval: Duration,
    /// Per-request etcd deadline. fleetd's default is 1 s; one process simulating a
    /// thousand machines on two cores is more loaded than any one fleetd, hence more here.
    /// 15 s, not 5: at 5,000 machines etcd 3.4 itself stalls for 10–27 s at a time during a
    /// 100,000-unit submit (every read and every `Txn` copies its uncommitted write buffer;
    /// docs/benchmarks.md "Scale II"), and a 5 s deadline failed the submit in four runs of
    /// six. A longer stall still fails it, on etcd's own timeout.
    pub request_timeout: Duration,
    /// More flags for the simulation's own etcd: [`ETCD_TUNING`], the `huge` scenario's
    /// quota, then `$FLEET_BENCH_ETCD_ARGS` (e.g. `--enable-pprof` to profile etcd during a
    /// run). Fleet's own code runs with etcd's defaults; these are an operator's choice.
    pub etcd_args: Vec<String>,
    /// The engines' `engine_move_rate` (`None`: fleetd's default, 2,000 a second).
    pub move_rate: Option<u32>,
}

/// How the simulation's etcd commits its backend: at most 1,000 writes or 25 ms between two
/// commits (etcd 3.4's defaults are 10,000 and 100 ms). etcd 3.4 copies every uncommitted
/// write into each read transaction and each `Txn` with compares (docs/benchmarks.md, "The
/// scheduler's own curve, etcd's stall, …"), so under 5,000 machines' keep-alives a larger
/// buffer stalls etcd: `scale` at 100,000 units launched in 295 s with the defaults and in
/// 72 s with these, with etcd's CPU at 343 s and 65 s. docs/deploy.md recommends them
/// for large clusters. `FLEET_BENCH_ETCD_DEFAULTS=1` runs etcd without them.
pub const ETCD_TUNING: [&str; 2] = [
    "--backend-batch-limit=1000",
    "--backend-batch-interval=25ms",
];

/// The etcd flags a simulation starts with: [`ETCD_TUNING`] unless
/// `$FLEET_BENCH_ETCD_DEFAULTS` is set, then `$FLEET_BENCH_ETCD_ARGS`.
pub fn etcd_args_from_env() -> Vec<String> {
    let tuning = std::env::var_os("FLEET_BENCH_ETCD_DEFAULTS").is_none();
    let extra = std::env::var("FLEET_BENCH_ETCD_ARGS").unwrap_or_default();
    ETCD_TUNING
        .iter()
        .filter(|_| tuning)
        .map(|a| (*a).to_owned())
        .chain(extra.split_whitespace().map(str::to_owned))
        .collect()
}

/// The paragraph saying how the simulation's etcd ran, after a section's provenance.
pub fn etcd_line(args: &[String]) -> String {
    if args.is_empty() {
        "\nThe simulation's etcd ran with its defaults.\n".to_owned()
    } else {
        format!("\nThe simulation's etcd ran with `{}`.\n", args.join(" "))
    }
}

impl SimSpec {
    pub fn new(machines: usize) -> SimSpec {
        SimSpec {
            machines,
            engines: 3.min(machines),
            connections: 16,
            agent_ttl: Duration::from_secs(30),
            resync: Duration::from_secs(60),
            engine_interval: EngineConfig::DEFAULT_RECONCILE_INTERVAL,
            request_timeout: Duration::from_secs(15),
            etcd_args: etcd_args_from_env(),
            move_rate: None,
        }
    }
}

/// Whose requests a counter holds.
#[derive(Debug, Default)]
pub struct Roles {
    /// What `fleetctl` does.
    pub client: Arc<Counters>,
    /// Every engine candidate.
    pub engines: Arc<Counters>,
    /// Every agent.
    pub agents: Arc<Counters>,
    /// Machine presence: registration and lease keep-alives (fleetd's, outside the agent).
    pub presence: Arc<Counters>,
}

/// One simulated machine.
#[derive(Debug)]
pub struct SimMachine {
    pub id: MachineId,
    /// This machine's agent's etcd requests and watch events.
    pub counters: Arc<Counters>,
    /// This machine's agent's calls to its (fake) systemd.
    pub calls: Arc<CallCounts>,
    /// The machine's presence now, as its keeper publishes it to the agent.
    presence: watch::Receiver<Option<Presence>>,
    shutdown: watch::Sender<bool>,
    /// The agent and the presence keeper.
    tasks: Vec<JoinHandle<()>>,
}

#[derive(Debug)]
struct Engine {
    /// This engine's own etcd requests (also counted in [`Roles::engines`]).
    counters: Arc<Counters>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// The simulation's files, removed with it: the machines' saved lease IDs (fleetd's
/// `fleetd.lease`) and the unit files given to fleetctl's submit path.
#[derive(Debug)]
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        static SIMS: AtomicUsize = AtomicUsize::new(0);
        let n = SIMS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("fleet-bench-{}-{n}", std::process::id()));
        Scratch(dir)
    }

    fn lease_file(&self, id: &MachineId) -> PathBuf {
        self.0.join("leases").join(format!("{id}.lease"))
    }

    fn units(&self) -> PathBuf {
        self.0.join("units")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running simulation. Dropping it stops etcd; call [`Sim::stop`] to end the loops first.
#[derive(Debug)]
pub struct Sim {
    pub spec: SimSpec,
    pub roles: Roles,
    pub machines: Vec<SimMachine>,
    pub client: Registry<CountingKv<EtcdKv>>,
    pub monitor: Monitor,
    /// How long registering every machine took.
    pub joined_in: Duration,
    /// How long until every agent had booted and was watching its schedule.
    pub agents_ready_in: Duration,
    kvs: Vec<EtcdKv>,
    engines: Vec<Engine>,
    scratch: Scratch,
    etcd: TestEtcd,
}

/// A machine ID like systemd's (32 hex digits), distinct in its first 8 (fleet's short form).
pub fn machine_id(i: usize) -> MachineId {
    let mut x = (i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    format!("{:08x}{:024x}", (x >> 32) as u32, i)
        .parse()
        .expect("hex digits make a machine ID")
}

/// Unit `i` of a benchmark, in generation `generation` (a new generation is new content).
pub fn bench_unit(i: usize, generation: u32) -> (UnitName, UnitFile) {
    let name: UnitName = format!("bench-{i:05}.service")
        .parse()
        .expect("a valid unit name");
    let file = UnitFile::parse(unit_text(i, generation).as_bytes()).expect("a valid unit file");
    (name, file)
}

/// The text of benchmark unit `i`: a service that only sleeps.
pub fn unit_text(i: usize, generation: u32) -> String {
    format!(
        "[Unit]\nDescription=fleet bench unit {i} generation {generation}\n\n\
         [Service]\nExecStart=/bin/sleep infinity\n"
    )
}

impl Sim {
    /// Starts etcd, registers every machine, starts every agent and the engines, and waits
    /// until every agent watches its schedule and an engine leads.
    pub async fn start(spec: SimSpec) -> Result<Sim> {
        let etcd = TestEtcd::start_with_args(&spec.etcd_args).await;
        let config = EtcdConfig {
            endpoints: vec![etcd.endpoint()],
            request_timeout: spec.request_timeout,
            tls: TlsFiles::default(),
            auth: None,
        };
        let mut kvs = Vec::new();
        for _ in 0..spec.connections.max(1) {
            kvs.push(
                EtcdKv::connect(&config)
                    .await
                    .context("connecting to etcd")?,
            );
        }
        let roles = Roles::default();
        let pool = kvs.clone();
        let counted = move |i: usize, sinks: Vec<Arc<Counters>>| {
            Registry::new(
                counting(pool[i % pool.len()].clone(), DEFAULT_PREFIX, sinks),
                DEFAULT_PREFIX,
            )
        };
        let client = counted(0, vec![roles.client.clone()]);
        let started = Instant::now();
        let scratch = Scratch::new();
        let keepers = (0..spec.machines).map(|i| PresenceKeeper {
            registry: MachineRole::new(counted(i, vec![roles.presence.clone()]), machine_id(i)),
            info: machine_info(i),
            ttl: spec.agent_ttl,
            lease_file: scratch.lease_file(&machine_id(i)),
            fence: None,
            witnesses: None,
            renewals: None,
        });
        let registered = register(keepers).await?;
        let joined_in = started.elapsed();
        let monitor = Monitor::start(kvs[0].clone(), DEFAULT_PREFIX).await?;
        let started = Instant::now();
        let mut machines = Vec::with_capacity(registered.len());
        for (i, (keeper, presence)) in registered.into_iter().enumerate() {
            let counters = Counters::new();
            let registry = counted(i, vec![counters.clone(), roles.agents.clone()]);
            machines.push(spawn_machine(keeper, presence, registry, counters, &spec));
        }
        let mut sim = Sim {
            spec,
            roles,
            machines,
            client,
            monitor,
            joined_in,
            agents_ready_in: Duration::ZERO,
            kvs,
            engines: Vec::new(),
            scratch,
            etcd,
        };
        sim.wait_agents_watching(Duration::from_secs(120)).await?;
        sim.agents_ready_in = started.elapsed();
        for i in 0..sim.spec.engines {
            let counters = Arc::new(Counters::default());
            let registry = counted(i, vec![sim.roles.engines.clone(), counters.clone()]);
            let mut cfg = EngineConfig::new(sim.machines[i].id.clone(), sim.spec.engine_interval);
            if let Some(rate) = sim.spec.move_rate {
                cfg.disruption.move_rate = rate;
            }
            let (shutdown, rx) = watch::channel(false);
            let task = tokio::spawn(fleet_engine::run(registry, cfg, rx).in_current_span());
            sim.engines.push(Engine {
                counters,
                shutdown,
                task,
            });
        }
        sim.wait_leader(Duration::from_secs(30)).await?;
        Ok(sim)
    }

    /// Kills etcd (SIGKILL), keeping its data: every request and watch fails until
    /// [`Sim::restart_etcd`].
    pub fn stop_etcd(&mut self) {
        self.etcd.stop();
    }

    /// Starts etcd again on the same ports and data; returns once it answers.
    pub async fn restart_etcd(&mut self) {
        self.etcd.restart().await;
    }

    /// How many watchers etcd holds (its own gauge).
    pub async fn etcd_watchers(&self) -> u64 {
        self.etcd.watcher_count().await
    }

    /// The client URL of the simulation's etcd.
    pub fn etcd_endpoint(&self) -> String {
        self.etcd.endpoint()
    }

    async fn wait_agents_watching(&self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let watching = self
                .machines
                .iter()
                .filter(|m| m.counters.tally().method(Method::Watch) > 0)
                .count();
            if watching == self.machines.len() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "only {watching} of {} agents watch their schedule",
                    self.machines.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The requests of the engine that leads now and of the others (followers), if one
    /// leads.
    pub async fn engine_counters(&self) -> Result<Option<(Arc<Counters>, Vec<Arc<Counters>>)>> {
        let Some(leader) = self.client.leader().await? else {
            return Ok(None);
        };
        let mut lead = None;
        let mut follow = Vec::new();
        for (i, e) in self.engines.iter().enumerate() {
            if self.machines[i].id == leader {
                lead = Some(e.counters.clone());
            } else {
                follow.push(e.counters.clone());
            }
        }
        Ok(lead.map(|l| (l, follow)))
    }

    async fn wait_leader(&self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        while self.client.leader().await?.is_none() {
            if Instant::now() > deadline {
                bail!("no engine became leader within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Writes the units' files where a user keeps them before `fleetctl start`; returns
    /// the arguments that name them.
    pub fn write_units(&self, units: &[(UnitName, UnitFile)]) -> Result<Vec<String>> {
        let dir = self.scratch.units();
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut args = Vec::with_capacity(units.len());
        for (name, file) in units {
            let path = dir.join(name.as_str());
            std::fs::write(&path, file.canonical())
                .with_context(|| format!("writing {}", path.display()))?;
            args.push(path.to_string_lossy().into_owned());
        }
        Ok(args)
    }

    /// `fleetctl start --no-block ARGS` for units not yet registered, through fleetctl's own
    /// submit path over fleet-ops's `RegistryCluster`: read the local files, read the units
    /// they name together (one `Cluster::units`), then create them 32 at a time (new units get the desired state at once, so start has
    /// nothing more to write).
    pub async fn submit(&self, args: &[String]) -> Result<()> {
        let cluster = RegistryCluster::new(self.client.clone());
        let mut ctx = Ctx {
            cluster: cluster.clone(),
            out: Box::new(std::io::sink()),
            err: Box::new(std::io::sink()),
            write_failed: None,
        };
        let prepared = submit::prepare(&mut ctx, args, false, Verb::Start).await?;
        let how = ReplaceHow::default();
        let results = submit::apply(&cluster, prepared, DesiredState::Launched, &how).await;
        for (name, res) in results {
            res.with_context(|| format!("creating {name}"))?;
        }
        Ok(())
    }

    /// Stops the agents and presence keepers of `indexes` and revokes their leases: the
    /// machines are gone.
    pub async fn kill(&mut self, indexes: &[usize]) -> Result<()> {
        for &i in indexes {
            let m = &mut self.machines[i];
            let _ = m.shutdown.send(true);
            for task in m.tasks.drain(..) {
                let _ = task.await;
            }
        }
        let registry = Registry::new(
            counting(
                self.kvs[0].clone(),
                DEFAULT_PREFIX,
                vec![self.roles.presence.clone()],
            ),
            DEFAULT_PREFIX,
        );
        for &i in indexes {
            let presence = *self.machines[i].presence.borrow();
            if let Some(presence) = presence {
                MachineRole::new(registry.clone(), self.machines[i].id.clone())
                    .unregister(&presence)
                    .await?;
            }
        }
        Ok(())
    }

    /// Ends every loop (engines resign), then etcd.
    pub async fn stop(mut self) {
        for e in &self.engines {
            let _ = e.shutdown.send(true);
        }
        for e in self.engines.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), e.task).await;
        }
        for m in &self.machines {
            let _ = m.shutdown.send(true);
        }
        for m in &mut self.machines {
            for task in m.tasks.drain(..) {
                let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
            }
        }
        self.monitor.stop();
    }
}

/// Starts a registered machine as fleetd does: its presence keeper, and its agent, which
/// gets every new presence from the keeper.
fn spawn_machine(
    keeper: PresenceKeeper<CountingKv<EtcdKv>>,
    presence: Presence,
    registry: Registry<CountingKv<EtcdKv>>,
    counters: Arc<Counters>,
    spec: &SimSpec,
) -> SimMachine {
    let id = keeper.info.id.clone();
    let calls = CallCounts::new();
    let manager = fleet_agent::Metered::new(FakeManager::new(), calls.clone());
    let mut cfg = AgentConfig::new(id.clone());
    cfg.resync_interval = spec.resync;
    let (presence_tx, presence_rx) = watch::channel(Some(presence));
    let (shutdown, shutdown_rx) = watch::channel(false);
    let keep = keeper.keep(presence, presence_tx, shutdown_rx.clone());
    let keeper = tokio::spawn(
        async move {
            // Only a machine ID registered twice ends it, and every simulated ID is distinct.
            let _ = keep.await;
        }
        .in_current_span(),
    );
    let agent = Agent::new(
        MachineRole::new(registry, id.clone()),
        manager,
        cfg,
        presence_rx.clone(),
    );
    let agent = tokio::spawn(agent.run(shutdown_rx).in_current_span());
    SimMachine {
        id,
        counters,
        calls,
        presence: presence_rx,
        shutdown,
        tasks: vec![agent, keeper],
    }
}

/// Simulated machine `i`'s record.
fn machine_info(i: usize) -> MachineInfo {
    MachineInfo {
        id: machine_id(i),
        public_ip: format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
        metadata: BTreeMap::from([("sim".to_owned(), "yes".to_owned())]),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        disable_engine: false,
        api: String::new(),
        fence_at: None,
    }
}

/// Registers every machine with its keeper, 64 at a time.
async fn register<K: fleet_registry::kv::Kv>(
    keepers: impl Iterator<Item = PresenceKeeper<K>>,
) -> Result<Vec<(PresenceKeeper<K>, Presence)>> {
    let results: Vec<_> = futures::stream::iter(keepers)
        .map(|keeper| async move {
            let presence = keeper.register().await?;
            Ok::<_, fleet_registry::RegistryError>((keeper, presence))
        })
        .buffered(64)
        .collect()
        .await;
    results
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .context("registering simulated machines")
}
