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
use fleet_core::{DesiredState, MachineId, UnitFile, UnitName};
use fleet_engine::EngineConfig;
use fleet_ops::ReplaceHow;
use fleet_ops::etcd::RegistryCluster;
use fleet_registry::kv::{EtcdKv, TlsFiles};
use fleet_registry::{
    DEFAULT_PREFIX, EngineRole, EventConfig, EventLog, EventSink, EventStats, MachineRole,
    Presence, Registry, UnitsRole,
};
use fleet_testing::TestEtcd;
use fleetctl::commands::Ctx;
use fleetctl::commands::submit::{self, Verb};
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
use crate::shape::{Shape, ShapeSpec};

mod auth;
pub use auth::forget_seeds;
mod connect;
mod events;
mod names;
pub use crate::shape::etcd_line;
use connect::Connections;
pub use names::{bench_unit, machine_id, unit_text};
use names::{machine_info, register};

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimSpec {
    pub machines: usize,
    /// Engine candidates, on the first machines (fleetd runs one in every machine by default;
    /// a few are enough to show that followers cost nothing).
    pub engines: usize,
    /// The shape it runs in (issue 43): connections, deadlines, etcd's auth and flags,
    /// events. Its `etcd_args` are the simulation's own etcd's: the shape's, a scenario's
    /// own (the `huge` scenario's quota), `$FLEET_BENCH_ETCD_ARGS` (e.g. `--enable-pprof`).
    pub shape: ShapeSpec,
    /// fleetd's `agent_ttl` default.
    pub agent_ttl: Duration,
    /// The agent's periodic resync (its default).
    pub resync: Duration,
    /// The engine's `engine_reconcile_interval` (fleetd's default).
    pub engine_interval: Duration,
    /// The engines' `engine_move_rate` (`None`: fleetd's default, 2,000 a second).
    pub move_rate: Option<u32>,
}

impl SimSpec {
    /// The lab shape (the `reconnect` scenario's).
    pub fn new(machines: usize) -> SimSpec {
        SimSpec::shaped(machines, ShapeSpec::from_env(Shape::Lab, machines))
    }

    pub fn shaped(machines: usize, shape: ShapeSpec) -> SimSpec {
        SimSpec {
            machines,
            engines: 3.min(machines),
            shape,
            agent_ttl: Duration::from_secs(30),
            resync: Duration::from_secs(60),
            engine_interval: EngineConfig::DEFAULT_RECONCILE_INTERVAL,
            move_rate: None,
        }
    }
}

/// What [`Sim::submit`] did, once its arguments were resolved.
#[derive(Debug)]
pub struct Submitted {
    /// How long resolving the arguments (reading the files and the registry) took.
    pub prepared: Duration,
    /// The units written (or kept, already registered).
    pub written: usize,
    /// The first unit not written, with why: the others were still written.
    pub failed: Option<anyhow::Error>,
}

impl Submitted {
    /// The time resolving the arguments, if every unit was written.
    pub fn all(self) -> Result<Duration> {
        match self.failed {
            Some(e) => Err(e),
            None => Ok(self.prepared),
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

/// How long every machine may take to register (5,000 took 1–3 s in the lab shape).
const REGISTER_WITHIN: Duration = Duration::from_secs(300);

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
    /// fleetctl's events (off unless the shape writes events).
    pub client_events: EventSink,
    /// What became of every role's events.
    pub events: EventStats,
    pub monitor: Monitor,
    /// etcd's users, when the shape turns auth on.
    pub credentials: Option<auth::Credentials>,
    /// How long registering every machine took.
    pub joined_in: Duration,
    /// How long until every agent had booted and was watching its schedule.
    pub agents_ready_in: Duration,
    conns: Connections,
    /// Engine `i` runs on machine `i`.
    engines: Vec<Engine>,
    scratch: Scratch,
    etcd: TestEtcd,
}

impl Sim {
    /// Starts etcd (with its users, in a shape with auth), registers every machine, starts
    /// every agent and the engines, and waits until every agent watches its schedule and an
    /// engine leads.
    pub async fn start(spec: SimSpec) -> Result<Sim> {
        let shape = spec.shape.clone();
        let (etcd, credentials) = auth::start_etcd(&spec).await?;
        let conns = Connections::open(&etcd, &shape, credentials.as_ref()).await?;
        let roles = Roles::default();
        let events = EventStats::default();
        let pool = conns.machines.clone();
        let counted = move |i: usize, sinks: Vec<Arc<Counters>>| {
            Registry::new(
                counting(pool[i % pool.len()].clone(), DEFAULT_PREFIX, sinks),
                DEFAULT_PREFIX,
            )
        };
        let client = Registry::new(
            counting(
                conns.client.clone(),
                DEFAULT_PREFIX,
                vec![roles.client.clone()],
            ),
            DEFAULT_PREFIX,
        );
        let client_events = match shape.events {
            true => UnitsRole::new(client.clone())
                .event_log(EventConfig::default(), events.clone())
                .into_sink(),
            false => EventSink::off(),
        };
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
        let registered = register(keepers, REGISTER_WITHIN).await?;
        let joined_in = started.elapsed();
        let monitor = Monitor::start(conns.monitor.clone(), DEFAULT_PREFIX).await?;
        let started = Instant::now();
        let mut machines = Vec::with_capacity(registered.len());
        for (i, (keeper, presence)) in registered.into_iter().enumerate() {
            let counters = Counters::new();
            let registry = counted(i, vec![counters.clone(), roles.agents.clone()]);
            let sink = event_sink(shape.events, &events, |cfg, stats| {
                MachineRole::new(registry.clone(), machine_id(i)).event_log(cfg, stats)
            });
            machines.push(spawn_machine(
                keeper, presence, registry, counters, sink, &spec,
            ));
        }
        let mut sim = Sim {
            spec,
            roles,
            machines,
            client,
            client_events,
            events,
            monitor,
            credentials,
            joined_in,
            agents_ready_in: Duration::ZERO,
            conns,
            engines: Vec::new(),
            scratch,
            etcd,
        };
        sim.wait_agents_watching(Duration::from_secs(120)).await?;
        sim.agents_ready_in = started.elapsed();
        for i in 0..sim.spec.engines {
            let counters = Arc::new(Counters::default());
            let registry = counted(i, vec![sim.roles.engines.clone(), counters.clone()]);
            sim.engines.push(spawn_engine(&sim, i, registry, counters));
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

    /// The TLS files of the simulation's etcd clients (none without TLS).
    pub fn etcd_tls(&self) -> TlsFiles {
        self.etcd.config().tls
    }

    /// Where the simulation's etcd serves `/metrics` over plain HTTP (with TLS, a port of
    /// its own).
    pub fn etcd_metrics(&self) -> String {
        self.etcd.metrics_endpoint()
    }

    /// fleetctl's flags that reach the simulation's etcd: `--endpoint`, and with TLS its
    /// CA and client certificate.
    pub fn etcd_flags(&self) -> Vec<String> {
        let mut flags = vec!["--endpoint".to_owned(), self.etcd.endpoint()];
        flags.extend(self.etcd.fleetctl_tls_flags());
        flags
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
    /// they name together (one `Cluster::units`), then create them 32 at a time (new units
    /// get the desired state at once, so start has nothing more to write). Fails if resolving
    /// the arguments fails (nothing is written then); otherwise says what was written.
    pub async fn submit(&self, args: &[String]) -> Result<Submitted> {
        let cluster =
            RegistryCluster::new(self.client.clone()).with_events(self.client_events.clone());
        let mut ctx = Ctx {
            cluster: cluster.clone(),
            out: Box::new(std::io::sink()),
            err: Box::new(std::io::sink()),
            write_failed: None,
        };
        let t0 = Instant::now();
        let prepared = submit::prepare(&mut ctx, args, false, Verb::Start).await?;
        let prepared_in = t0.elapsed();
        let how = ReplaceHow::default();
        let results = submit::apply(&cluster, prepared, DesiredState::Launched, &how).await;
        let mut done = Submitted {
            prepared: prepared_in,
            written: 0,
            failed: None,
        };
        for (name, res) in results {
            match res.with_context(|| format!("creating {name}")) {
                Ok(_) => done.written += 1,
                Err(e) => {
                    done.failed.get_or_insert(e);
                }
            }
        }
        Ok(done)
    }

    /// The global arguments of a `fleetctl` run against this simulation's etcd, as the
    /// operator (or the viewer) when auth is on, with fleetctl's deadline of the shape.
    pub fn fleetctl_args(&self, viewer: bool) -> Result<Vec<String>> {
        self.fleetctl_args_with(viewer, self.spec.shape.client_deadline)
    }

    /// [`fleetctl_args`](Self::fleetctl_args) with another `--request-timeout`.
    pub fn fleetctl_args_with(&self, viewer: bool, timeout: Duration) -> Result<Vec<String>> {
        let deadline = timeout.as_secs_f64();
        let mut args = vec!["--driver".to_owned(), "etcd".to_owned()];
        args.extend(self.etcd_flags());
        args.extend(["--request-timeout".to_owned(), deadline.to_string()]);
        if let Some(c) = &self.credentials {
            let user = if viewer { &c.viewer } else { &c.operator };
            let file = self.scratch.0.join(format!("{}.pw", user.username));
            std::fs::create_dir_all(&self.scratch.0)?;
            auth::write_secret(&file, &user.password)?;
            args.extend([
                "--username".to_owned(),
                user.username.clone(),
                "--password-file".to_owned(),
                file.to_string_lossy().into_owned(),
            ]);
        }
        Ok(args)
    }

    /// Loses the machines `indexes` as the shape says: in production they crash (their
    /// agent, presence keeper and engine candidate end at once, nothing is revoked: etcd
    /// ends their leases after the TTL); in the lab their agents stop and their leases are
    /// revoked.
    pub async fn lose(&mut self, indexes: &[usize]) -> Result<()> {
        match self.spec.shape.shape {
            Shape::Production => {
                self.crash(indexes);
                Ok(())
            }
            Shape::Lab => self.kill(indexes).await,
        }
    }

    /// Ends the machines `indexes` abruptly, their engine candidate too: no resignation, no
    /// revoke, no last write.
    pub fn crash(&mut self, indexes: &[usize]) {
        for &i in indexes {
            self.machines[i].tasks.drain(..).for_each(|t| t.abort());
            if let Some(e) = self.engines.get(i) {
                e.task.abort();
            }
        }
    }

    /// The index of the machine whose engine leads now.
    pub async fn leader_index(&self) -> Result<Option<usize>> {
        let leader = self.client.leader().await?;
        Ok(leader.and_then(|l| self.machines.iter().position(|m| m.id == l)))
    }

    /// Stops the agents and presence keepers of `indexes` and revokes their leases.
    async fn kill(&mut self, indexes: &[usize]) -> Result<()> {
        for &i in indexes {
            let m = &mut self.machines[i];
            let _ = m.shutdown.send(true);
            for task in m.tasks.drain(..) {
                let _ = task.await;
            }
        }
        let registry = Registry::new(
            counting(
                self.conns.monitor.clone(),
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

/// A role's event writer as fleetd starts it (default retention and cap), or nothing.
fn event_sink(
    on: bool,
    stats: &EventStats,
    start: impl FnOnce(EventConfig, EventStats) -> EventLog,
) -> EventSink {
    match on {
        true => start(EventConfig::default(), stats.clone()).into_sink(),
        false => EventSink::off(),
    }
}

/// Starts engine candidate `i` on machine `i`'s connection, as fleetd's `engine` module
/// does (with the engine role's event writer when the shape writes events).
fn spawn_engine(
    sim: &Sim,
    i: usize,
    registry: Registry<CountingKv<EtcdKv>>,
    counters: Arc<Counters>,
) -> Engine {
    let sink = event_sink(sim.spec.shape.events, &sim.events, |cfg, stats| {
        EngineRole::new(registry.clone()).event_log(cfg, stats)
    });
    let mut cfg =
        EngineConfig::new(sim.machines[i].id.clone(), sim.spec.engine_interval).with_events(sink);
    if let Some(rate) = sim.spec.move_rate {
        cfg.disruption.move_rate = rate;
    }
    cfg.carry_files = sim.spec.shape.trust_engine_files;
    let (shutdown, rx) = watch::channel(false);
    let task = tokio::spawn(fleet_engine::run(registry, cfg, rx).in_current_span());
    Engine {
        counters,
        shutdown,
        task,
    }
}

/// Starts a registered machine as fleetd does: its presence keeper, and its agent, which
/// gets every new presence from the keeper.
fn spawn_machine(
    keeper: PresenceKeeper<CountingKv<EtcdKv>>,
    presence: Presence,
    registry: Registry<CountingKv<EtcdKv>>,
    counters: Arc<Counters>,
    events: EventSink,
    spec: &SimSpec,
) -> SimMachine {
    let id = keeper.info.id.clone();
    let calls = CallCounts::new();
    let manager = fleet_agent::Metered::new(FakeManager::new(), calls.clone());
    let mut cfg = AgentConfig::new(id.clone());
    cfg.resync_interval = spec.resync;
    cfg.events = events;
    cfg.trust_engine_files = spec.shape.trust_engine_files;
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
