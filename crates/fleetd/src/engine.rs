//! Starting the engine candidate next to the agent (unless `disable_engine`), on the
//! process's store of the registry, which the API's listings share.

use fleet_core::MachineId;
use fleet_engine::{DisruptionConfig, EngineConfig};
use fleet_registry::SharedStore;
use fleet_registry::kv::Kv;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::config::Config;

pub fn spawn<K: Kv>(
    tasks: &mut JoinSet<anyhow::Result<()>>,
    stores: SharedStore<K>,
    machine: &MachineId,
    config: &Config,
    shutdown: watch::Receiver<bool>,
    metrics: &crate::metrics::Metrics,
) {
    let events = fleet_registry::EngineRole::new(stores.registry().clone())
        .event_log(
            fleet_registry::EventConfig::new(config.event_retention),
            metrics.events.clone(),
        )
        .into_sink();
    let mut cfg = EngineConfig::new(machine.clone(), config.engine_reconcile_interval)
        .with_metrics(metrics.engine.clone())
        .with_events(events);
    cfg.disruption = DisruptionConfig {
        threshold: config.engine_disruption_threshold,
        grace: config.engine_disruption_grace,
        move_rate: config.engine_move_rate,
        ..DisruptionConfig::for_ttl(config.agent_ttl)
    };
    cfg.carry_files = config.trust_engine_files;
    tasks.spawn(
        async move {
            fleet_engine::run_sharing(stores, cfg, shutdown).await;
            Ok(())
        }
        .in_current_span(),
    );
}
