//! fleetd's components (agent, engine, presence keeper) on one in-memory registry, under a
//! tracing layer that checks every span they open names the machine, on itself or on a span
//! around it, in the tasks they spawn too: with many machines in one process (the bench) or
//! one log store for a cluster, a line without its machine is a line nobody can place.

use fleet_agent::{Agent, AgentConfig, FakeManager, PresenceKeeper};
use fleet_core::{DesiredState, MachineId, MachineInfo, UnitFile};
use fleet_engine::EngineConfig;
use fleet_registry::kv::MemKv;
use fleet_registry::{MachineRole, Registry, UnitsRole};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tracing::span::{Attributes, Id};
use tracing::{Instrument, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A span with a `machine` field.
struct Named;

/// The names of the spans opened, and of those with no machine in their scope.
#[derive(Debug, Clone, Default)]
struct Spans {
    opened: Arc<Mutex<BTreeSet<&'static str>>>,
    unplaced: Arc<Mutex<BTreeSet<&'static str>>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        if attrs.fields().field("machine").is_some() {
            span.extensions_mut().insert(Named);
        }
        let name = attrs.metadata().name();
        self.opened.lock().unwrap().insert(name);
        let placed = span
            .scope()
            .any(|s| s.extensions().get::<Named>().is_some());
        if !placed {
            self.unplaced.lock().unwrap().insert(name);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn every_span_of_the_agent_the_engine_and_the_presence_keeper_names_the_machine() {
    let spans = Spans::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let machine: MachineId = "m1".parse().unwrap();
    let registry = Registry::new(MemKv::new(), "/t/");
    let lease_file = std::env::temp_dir().join(format!("fleetd-spans-test-{}", std::process::id()));
    let _ = std::fs::remove_file(&lease_file);
    let keeper = PresenceKeeper {
        registry: MachineRole::new(registry.clone(), machine.clone()),
        info: MachineInfo {
            id: machine.clone(),
            public_ip: String::new(),
            metadata: Default::default(),
            version: "test".into(),
            disable_engine: false,
            api: String::new(),
            fence_at: None,
        },
        ttl: Duration::from_secs(3),
        lease_file: lease_file.clone(),
        fence: None,
        witnesses: None,
        renewals: None,
    };
    let presence = keeper.register().await.unwrap();
    let (presence_tx, presence_rx) = watch::channel(Some(presence));
    let (shutdown, shutdown_rx) = watch::channel(false);
    // Spawned as fleetd spawns them: keeping the (here empty) span of the caller.
    tokio::spawn(
        keeper
            .keep(presence, presence_tx, shutdown_rx.clone())
            .in_current_span(),
    );
    let agent = Agent::new(
        MachineRole::new(registry.clone(), machine.clone()),
        FakeManager::new(),
        AgentConfig::new(machine.clone()),
        presence_rx,
    );
    tokio::spawn(agent.run(shutdown_rx.clone()).in_current_span());
    let engine = EngineConfig::new(machine.clone(), Duration::from_secs(1));
    tokio::spawn(fleet_engine::run(registry.clone(), engine, shutdown_rx).in_current_span());
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/sleep infinity\n").unwrap();
    UnitsRole::new(registry.clone())
        .create_unit(&"a.service".parse().unwrap(), &file, DesiredState::Launched)
        .await
        .unwrap();

    let wanted = [
        "presence",
        "agent",
        "reconcile",
        "task",
        "engine",
        "engine pass",
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !wanted
        .iter()
        .all(|w| spans.opened.lock().unwrap().contains(w))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "spans opened: {:?}",
            spans.opened.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = shutdown.send(true);
    let _ = std::fs::remove_file(&lease_file);
    assert_eq!(*spans.unplaced.lock().unwrap(), BTreeSet::new());
}
