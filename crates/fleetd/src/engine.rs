//! Starting the engine candidate next to the agent (unless `disable_engine`).

use fleet_core::MachineId;
use fleet_engine::{DisruptionConfig, EngineConfig};
use fleet_registry::Registry;
use fleet_registry::kv::EtcdKv;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::config::Config;

pub fn spawn(
    tasks: &mut JoinSet<anyhow::Result<()>>,
    registry: Registry<EtcdKv>,
    machine: &MachineId,
    config: &Config,
    shutdown: watch::Receiver<bool>,
) {
    let mut cfg = EngineConfig::new(machine.clone(), config.engine_reconcile_interval);
    cfg.disruption = DisruptionConfig {
        threshold: config.engine_disruption_threshold,
        grace: config.engine_disruption_grace,
        move_rate: config.engine_move_rate,
        ..DisruptionConfig::for_ttl(config.agent_ttl)
    };
    tasks.spawn(
        async move {
            fleet_engine::run(registry, cfg, shutdown).await;
            Ok(())
        }
        .in_current_span(),
    );
}
