//! The metrics fleetd serves at the API's `GET /metrics`: one registry in which each component
//! registers its families under its own prefix (`fleet_engine_...`, `fleet_agent_...`,
//! `fleet_registry_...`, `fleet_api_...`), plus `fleet_build_info` and the standard
//! `process_*` metrics ([`process`]), which carry no `fleet_` prefix so that dashboards made
//! for any exporter read them. docs/operating.md lists them.

mod process;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// Each component's handles, and the registry that holds them all.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub registry: fleet_registry::metrics::Metrics,
    pub engine: fleet_engine::Metrics,
    pub agent: fleet_agent::Metrics,
    pub api: fleet_api::Metrics,
    /// What became of the events this fleetd's writers were handed (`fleet_events_total`).
    pub events: fleet_registry::EventStats,
    pub exposed: Arc<Registry>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

impl Metrics {
    /// Every family, `fleet_build_info` saying `version`.
    pub fn new(version: &'static str) -> Metrics {
        let mut root = Registry::default();
        root.register_collector(Box::new(process::Process::current()));
        let fleet = root.sub_registry_with_prefix("fleet");
        // Prometheus's convention for what a binary is: a gauge at 1 whose labels say it, so
        // that `count by (version) (fleet_build_info)` shows a rollout's progress.
        let build: Family<BuildLabels, Gauge> = Family::default();
        build.get_or_create(&BuildLabels { version }).set(1);
        fleet.register(
            "build_info",
            "1, labelled with the version of this fleetd",
            build,
        );
        let registry =
            fleet_registry::metrics::Metrics::register(fleet.sub_registry_with_prefix("registry"));
        let engine = fleet_engine::Metrics::register(fleet.sub_registry_with_prefix("engine"));
        let agent = fleet_agent::Metrics::register(fleet.sub_registry_with_prefix("agent"));
        let api = fleet_api::Metrics::register(fleet.sub_registry_with_prefix("api"));
        let events = fleet_registry::EventStats::register(fleet);
        Metrics {
            registry,
            engine,
            agent,
            api,
            events,
            exposed: Arc::new(root),
        }
    }
}

#[cfg(test)]
mod tests;
