//! A simulated cluster in one process: a real etcd on loopback ([`TestEtcd`]), N machines each
//! running the real [`Agent`] on a [`FakeManager`] (the fake systemd), and a few real engine
//! candidates. Every etcd request goes through a [`CountingKv`], so each machine's and each
//! role's traffic can be read at any moment.
//!
//! What fleetd itself does around the agent (presence on a lease, kept alive at TTL/3) is
//! done here by one keeper task for all machines; what `fleetctl start --no-block` does (read
//! the units in batches, then create them 32 at a time) is done by [`Sim::submit`].

use anyhow::{Context, Result, bail};
use fleet_agent::{Agent, AgentConfig, FakeManager};
use fleet_core::{DesiredState, MachineId, MachineInfo, UnitFile, UnitName};
use fleet_engine::EngineConfig;
use fleet_registry::kv::{EtcdConfig, EtcdKv, TlsFiles};
use fleet_registry::testing::TestEtcd;
use fleet_registry::{DEFAULT_PREFIX, Presence, Registry};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::counting::{Counters, CountingKv, Method, counting};
use crate::metered::{CallCounts, MeteredManager};
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
    pub request_timeout: Duration,
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
            request_timeout: Duration::from_secs(5),
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
    presence: Presence,
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Engine {
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

type Leases = Arc<Mutex<BTreeMap<MachineId, Presence>>>;

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
    leases: Leases,
    keeper: JoinHandle<()>,
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
        let etcd = TestEtcd::start().await;
        let config = EtcdConfig {
            endpoints: vec![etcd.endpoint()],
            request_timeout: spec.request_timeout,
            tls: TlsFiles::default(),
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
        let ids: Vec<MachineId> = (0..spec.machines).map(machine_id).collect();
        let presences = register(&ids, &spec, |i| counted(i, vec![roles.presence.clone()])).await?;
        let joined_in = started.elapsed();
        let leases: Leases = Arc::new(Mutex::new(
            ids.iter().cloned().zip(presences.iter().copied()).collect(),
        ));
        let keeper = tokio::spawn(keep_alive(
            counted(1, vec![roles.presence.clone()]),
            leases.clone(),
            spec.agent_ttl / 3,
        ));
        let monitor = Monitor::start(kvs[0].clone(), DEFAULT_PREFIX).await?;
        let started = Instant::now();
        let mut machines = Vec::with_capacity(ids.len());
        for (i, (id, presence)) in ids.into_iter().zip(presences).enumerate() {
            let counters = Counters::new();
            let registry = counted(i, vec![counters.clone(), roles.agents.clone()]);
            machines.push(spawn_agent(id, presence, registry, counters, &spec));
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
            leases,
            keeper,
            etcd,
        };
        sim.wait_agents_watching(Duration::from_secs(120)).await?;
        sim.agents_ready_in = started.elapsed();
        for i in 0..sim.spec.engines {
            let registry = counted(i, vec![sim.roles.engines.clone()]);
            let cfg = EngineConfig::new(sim.machines[i].id.clone(), sim.spec.engine_interval);
            let (shutdown, rx) = watch::channel(false);
            let task = tokio::spawn(fleet_engine::run(registry, cfg, rx));
            sim.engines.push(Engine { shutdown, task });
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

    /// What `fleetctl start --no-block` does for these units: read them all (in transactions
    /// of 128 reads, as fleetctl resolves many arguments), then create them 32 at a time.
    pub async fn submit(&self, units: &[(UnitName, UnitFile)]) -> Result<()> {
        let names: std::collections::BTreeSet<UnitName> =
            units.iter().map(|(name, _)| name.clone()).collect();
        self.client.units_named(&names).await?;
        let client = &self.client;
        let results: Vec<_> = futures::stream::iter(units)
            .map(|(name, file)| client.create_unit(name, file, DesiredState::Launched))
            .buffered(32)
            .collect()
            .await;
        for r in results {
            r?;
        }
        Ok(())
    }

    /// Stops the agents of `indexes` and revokes their leases: the machines are gone.
    pub async fn kill(&mut self, indexes: &[usize]) -> Result<()> {
        for &i in indexes {
            let m = &mut self.machines[i];
            let _ = m.shutdown.send(true);
            if let Some(task) = m.task.take() {
                let _ = task.await;
            }
            self.leases
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&m.id);
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
            registry.unregister(&self.machines[i].presence).await?;
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
            if let Some(task) = m.task.take() {
                let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
            }
        }
        self.keeper.abort();
        self.monitor.stop();
    }
}

fn spawn_agent(
    id: MachineId,
    presence: Presence,
    registry: Registry<CountingKv<EtcdKv>>,
    counters: Arc<Counters>,
    spec: &SimSpec,
) -> SimMachine {
    let calls = CallCounts::new();
    let manager = MeteredManager::new(FakeManager::new(), calls.clone());
    let mut cfg = AgentConfig::new(id.clone());
    cfg.resync_interval = spec.resync;
    let (presence_tx, presence_rx) = watch::channel(Some(presence));
    let (shutdown, shutdown_rx) = watch::channel(false);
    let agent = Agent::new(registry, manager, cfg, presence_rx);
    let task = tokio::spawn(async move {
        // The sender lives as long as the agent, as fleetd's presence keeper does.
        let _keep = presence_tx;
        agent.run(shutdown_rx).await;
    });
    SimMachine {
        id,
        counters,
        calls,
        presence,
        shutdown,
        task: Some(task),
    }
}

/// Registers every machine on its own lease, 64 at a time.
async fn register(
    ids: &[MachineId],
    spec: &SimSpec,
    registry_for: impl Fn(usize) -> Registry<CountingKv<EtcdKv>>,
) -> Result<Vec<Presence>> {
    let ttl = spec.agent_ttl;
    let results: Vec<_> = futures::stream::iter(ids.iter().enumerate())
        .map(|(i, id)| {
            let registry = registry_for(i);
            let info = MachineInfo {
                id: id.clone(),
                public_ip: format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
                metadata: BTreeMap::from([("sim".to_owned(), "yes".to_owned())]),
                version: env!("CARGO_PKG_VERSION").to_owned(),
                disable_engine: false,
            };
            async move { registry.register_machine(&info, ttl, None).await }
        })
        .buffered(64)
        .collect()
        .await;
    results
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .context("registering simulated machines")
}

/// Refreshes every live lease each `period`, 64 at a time, as each fleetd does for its own.
async fn keep_alive(registry: Registry<CountingKv<EtcdKv>>, leases: Leases, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        let live: Vec<Presence> = leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .copied()
            .collect();
        futures::stream::iter(live)
            .for_each_concurrent(64, |p| {
                let registry = &registry;
                async move {
                    let _ = registry.keep_alive(&p).await;
                }
            })
            .await;
    }
}
