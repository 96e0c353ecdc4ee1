//! The cluster engine: one fleetd at a time (the leader) reads the registry, plans where every
//! unit must run with a pure scheduler, and writes the decisions fenced by its leadership.
//!
//! [`scheduler`] decides (pure); [`run`] holds leadership and executes. Nothing here talks to
//! etcd except through `fleet_registry`, and nothing here depends on the agent.

mod disruption;
mod engine;
pub mod metrics;
pub mod scheduler;
mod unreadable;

pub use disruption::{Assessment, Disruption, DisruptionConfig, Hold};
pub use engine::{EngineConfig, REFUSED_RETRY_MAX, run};
pub use metrics::Metrics;

pub use scheduler::{
    Decision, DecisionKind, DrainStatus, Entangled, Explanation, MachineVerdict, Plan, Reason,
    Rejection, Status, Violation, drain_status, explain, plan, plan_delta, plan_holding,
};
