//! The metrics fleetd serves at the API's `GET /metrics`: one registry, prefixed `fleet`, in
//! which each component registers its families under its own prefix (`fleet_engine_...`,
//! `fleet_agent_...`, `fleet_registry_...`, `fleet_api_...`). docs/operating.md lists them.

use prometheus_client::registry::Registry;
use std::sync::Arc;

/// Each component's handles, and the registry that holds them all.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub registry: fleet_registry::metrics::Metrics,
    pub engine: fleet_engine::Metrics,
    pub agent: fleet_agent::Metrics,
    pub api: fleet_api::Metrics,
    pub exposed: Arc<Registry>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut root = Registry::with_prefix("fleet");
        let registry =
            fleet_registry::metrics::Metrics::register(root.sub_registry_with_prefix("registry"));
        let engine = fleet_engine::Metrics::register(root.sub_registry_with_prefix("engine"));
        let agent = fleet_agent::Metrics::register(root.sub_registry_with_prefix("agent"));
        let api = fleet_api::Metrics::register(root.sub_registry_with_prefix("api"));
        Metrics {
            registry,
            engine,
            agent,
            api,
            exposed: Arc::new(root),
        }
    }
}
