//! What the agent is given ([`AgentConfig`]) and what it reports of itself ([`Progress`]).
//! Plain data: the agent reads the one and publishes the other on a watch channel; and the
//! one rule on it, which units the agent refuses whatever the schedule says ([`is_denied`]).

use fleet_core::{MachineId, UnitName, glob_match};
use std::time::Duration;

/// How the agent behaves.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub machine: MachineId,
    /// Safety net: re-read everything at least this often even without hints (the first
    /// time at a random phase of it, then after 90–100 % of it: see `agent/resync.rs`).
    pub resync_interval: Duration,
    /// Unit name globs the agent refuses to manage (they would take over the host).
    pub deny_units: Vec<String>,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Where restart generations are recorded (`None`: in memory only, for tests).
    pub restarts_dir: Option<std::path::PathBuf>,
    /// Where what the agent did goes as events (issue 41): off unless fleetd gives this
    /// machine's writer (`MachineRole::event_log`).
    pub events: fleet_registry::EventSink,
    /// Take a small unit file from the schedule entry that carries it instead of reading it
    /// (fleetd's `trust_engine_files`, issue 43): one etcd request fewer per unit started,
    /// but an engine host may then run files no operator stored (docs/security.md).
    pub trust_engine_files: bool,
}

impl AgentConfig {
    pub fn new(machine: MachineId) -> AgentConfig {
        AgentConfig {
            machine,
            resync_interval: Duration::from_secs(60),
            deny_units: Vec::new(),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            restarts_dir: None,
            events: fleet_registry::EventSink::off(),
            trust_engine_files: false,
        }
    }
}

/// What the agent has done so far, for its daemon's readiness and status line
/// ([`Agent::progress`](super::Agent::progress)). Changes only when one of its values does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// The first reconcile pass after boot is over: every job the boot decisions called for
    /// has been issued and awaited.
    pub reconciled: bool,
    /// Unit files in the units directory.
    pub units: usize,
    /// Units whose last task failed, waiting for their retry.
    pub failing: usize,
}

/// A unit of `deny_units`, or one named like the fence's own units, which fleetd stops and
/// replaces by name (`systemd::fence::FENCE_PREFIX`), whatever the configuration.
pub(super) fn is_denied(deny_units: &[String], name: &UnitName) -> bool {
    name.as_str()
        .starts_with(crate::systemd::fence::FENCE_PREFIX)
        || deny_units.iter().any(|g| glob_match(g, name.as_str()))
}
