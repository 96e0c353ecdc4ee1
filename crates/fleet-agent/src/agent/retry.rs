//! The backoff of the loops that wait for etcd or systemd to answer (boot's reads, the retry
//! of a publish that left states out). Decides only when; the loop decides what to try. A
//! failed unit's own backoff is one of the agent's holds (`holds`).

use fleet_core::Backoff;
use fleet_registry::kv::Kv;
use std::time::Duration;

use super::{Agent, AgentConfig};
use crate::manager::UnitManager;

/// The longest pause between two attempts to reach etcd or systemd in the boot and publish
/// loops: once etcd is back, an agent should notice within seconds, not a minute.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

impl<K: Kv, M: UnitManager> Agent<K, M> {
    /// The backoff of a loop that waits for etcd or systemd to answer: see
    /// [`reconnect_backoff`].
    pub(super) fn reconnect_backoff(&self) -> Backoff {
        reconnect_backoff(&self.cfg)
    }
}

/// The backoff of a loop that waits for etcd or systemd to answer (boot, publish, a failed
/// schedule read): `backoff_min` to [`RECONNECT_MAX`], jittered so that agents do not come
/// back in lockstep.
pub(super) fn reconnect_backoff(cfg: &AgentConfig) -> Backoff {
    Backoff::new(cfg.backoff_min, RECONNECT_MAX.max(cfg.backoff_min))
}
