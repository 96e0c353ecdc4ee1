//! The agent loop tests' world: one machine on the in-memory registry and a fake systemd,
//! with the helpers that schedule units and wait, on paused time, for what the agent did.

use fleet_agent::fake::Call;
use fleet_agent::{Agent, AgentConfig, FakeManager};
use fleet_core::{DesiredState, MachineId, MachineInfo, UnitFile, UnitName};
use fleet_registry::kv::{Kv, MemKv};
use fleet_registry::{MachineRole, Presence, Registry, ScheduleEntry, UnitsRole};
use std::time::Duration;
use tokio::sync::watch;

pub(crate) const TTL: Duration = Duration::from_secs(30);

pub(crate) fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

pub(crate) fn file(exec: &str) -> UnitFile {
    UnitFile::parse(format!("[Service]\nExecStart={exec}\n").as_bytes()).unwrap()
}

pub(crate) struct World {
    pub(crate) kv: MemKv,
    pub(crate) registry: Registry<MemKv>,
    pub(crate) fake: FakeManager,
    pub(crate) machine: MachineId,
    pub(crate) presence: Presence,
    pub(crate) shutdown: watch::Sender<bool>,
}

impl World {
    pub(crate) async fn new() -> World {
        let kv = MemKv::new();
        let registry = Registry::new(kv.clone(), "/t/");
        let machine: MachineId = "m1".parse().unwrap();
        let info = MachineInfo {
            id: machine.clone(),
            public_ip: String::new(),
            metadata: Default::default(),
            version: "test".into(),
            disable_engine: true,
            api: String::new(),
            fence_at: None,
        };
        let presence = MachineRole::new(registry.clone(), machine.clone())
            .register(&info, TTL, None)
            .await
            .unwrap();
        let (shutdown, _) = watch::channel(false);
        World {
            kv,
            registry,
            fake: FakeManager::new(),
            machine,
            presence,
            shutdown,
        }
    }

    /// This machine's registry role.
    pub(crate) fn role(&self) -> MachineRole<MemKv> {
        MachineRole::new(self.registry.clone(), self.machine.clone())
    }

    /// Puts `unit` with `file` in the registry and schedules it here.
    pub(crate) async fn schedule(&self, unit: &str, f: &UnitFile, desired: DesiredState) {
        let n = name(unit);
        UnitsRole::new(self.registry.clone())
            .create_unit(&n, f, desired)
            .await
            .unwrap();
        let entry = ScheduleEntry {
            name: n,
            machine: self.machine.clone(),
            hash: f.hash(),
            desired,
            restart: 0,
            no_restart: false,
            placement: 0,
        };
        self.registry.write_schedule(&[entry], &[]).await.unwrap();
    }

    /// Rewrites `unit`'s entry here as the engine would after `fleetctl restart`.
    pub(crate) async fn request_restart(&self, unit: &str, f: &UnitFile, generation: u64) {
        self.entry(unit, f, generation, false).await;
    }

    /// Rewrites `unit`'s entry here as the engine would.
    pub(crate) async fn entry(&self, unit: &str, f: &UnitFile, restart: u64, no_restart: bool) {
        let entry = ScheduleEntry {
            name: name(unit),
            machine: self.machine.clone(),
            hash: f.hash(),
            desired: DesiredState::Launched,
            restart,
            no_restart,
            placement: 0,
        };
        self.registry.write_schedule(&[entry], &[]).await.unwrap();
    }

    /// Rewrites `unit`'s entry here with another desired state.
    pub(crate) async fn entry_desired(&self, unit: &str, f: &UnitFile, desired: DesiredState) {
        let entry = ScheduleEntry {
            name: name(unit),
            machine: self.machine.clone(),
            hash: f.hash(),
            desired,
            restart: 0,
            no_restart: false,
            placement: 0,
        };
        self.registry.write_schedule(&[entry], &[]).await.unwrap();
    }

    pub(crate) async fn unschedule(&self, unit: &str) {
        self.registry
            .write_schedule(&[], &[(self.machine.clone(), name(unit))])
            .await
            .unwrap();
    }

    pub(crate) fn start_agent(&self) -> tokio::task::JoinHandle<()> {
        self.start_agent_with(AgentConfig::new(self.machine.clone()))
    }

    pub(crate) fn start_agent_with(&self, cfg: AgentConfig) -> tokio::task::JoinHandle<()> {
        self.start_agent_on(self.registry.clone(), cfg)
    }

    /// Starts an agent reading the registry through `registry` (the same store, wrapped).
    pub(crate) fn start_agent_on<K: Kv>(
        &self,
        registry: Registry<K>,
        cfg: AgentConfig,
    ) -> tokio::task::JoinHandle<()> {
        let (_tx, presence) = watch::channel(Some(self.presence));
        let role = MachineRole::new(registry, self.machine.clone());
        let agent = Agent::new(role, self.fake.clone(), cfg, presence);
        let shutdown = self.shutdown.subscribe();
        // Keep the presence sender alive for the agent's lifetime.
        tokio::spawn(async move {
            let _tx = _tx;
            agent.run(shutdown).await;
        })
    }

    /// Waits (on paused time) until `check` holds.
    pub(crate) async fn until(&self, what: &str, mut check: impl FnMut() -> bool) {
        for _ in 0..2000 {
            if check() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "timed out waiting for {what}; calls: {:?}",
            self.fake.calls()
        );
    }

    pub(crate) async fn published(&self, unit: &str) -> Option<fleet_registry::UnitStateRecord> {
        self.registry
            .unit_states()
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|s| s.name.as_str() == unit)
    }

    pub(crate) async fn until_published(&self, unit: &str, active: &str) {
        for _ in 0..2000 {
            if let Some(s) = self.published(unit).await
                && s.systemd.active == active
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "{unit} never published {active}; calls: {:?}",
            self.fake.calls()
        );
    }
}

pub(crate) fn mutating(calls: &[Call]) -> Vec<Call> {
    calls
        .iter()
        .filter(|c| {
            !matches!(
                c,
                Call::Installed
                    | Call::Status(_)
                    | Call::Loaded(_)
                    | Call::Details(_)
                    | Call::Facts(_)
                    | Call::Since(_)
                    | Call::Source(_)
            )
        })
        .cloned()
        .collect()
}
