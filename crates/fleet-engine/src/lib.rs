//! The cluster engine: one fleetd at a time (the leader) reads the registry, plans where every
//! unit must run with a pure scheduler, and writes the decisions fenced by its leadership.
//!
//! [`scheduler`] (the fleet-scheduler crate) decides, purely; [`run`] holds leadership and
//! executes. Nothing here talks to etcd except through `fleet_registry`, and nothing here
//! depends on the agent.

mod engine;
pub mod metrics;

/// The pure scheduler lives in its own crate, so that fleet-ops and fleetctl can explain a
/// placement by the engine's own rules without depending on the engine; `crate::scheduler`,
/// `crate::disruption` and `crate::unreadable` name it as before.
pub use fleet_scheduler as scheduler;
use fleet_scheduler::{disruption, unreadable};

pub use disruption::{Assessment, Disruption, DisruptionConfig, Hold};
pub use engine::{EngineConfig, REFUSED_RETRY_MAX, run, run_sharing};
pub use metrics::Metrics;

pub use scheduler::{
    Decision, DecisionKind, DrainStatus, Entangled, Explanation, MachineVerdict, Plan, Reason,
    Rejection, Status, Violation, drain_status, explain, plan, plan_delta, plan_holding,
};
