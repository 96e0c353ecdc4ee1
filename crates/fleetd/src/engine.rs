//! Starting the engine candidate next to the agent.

use fleet_core::MachineId;
use fleet_registry::Registry;
use fleet_registry::kv::EtcdKv;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::warn;

use crate::config::Config;

pub fn spawn(
    _tasks: &mut JoinSet<anyhow::Result<()>>,
    _registry: Registry<EtcdKv>,
    machine: &MachineId,
    _config: &Config,
    _shutdown: watch::Receiver<bool>,
) {
    warn!(machine = %machine, "engine not available in this build; only the agent runs");
}
