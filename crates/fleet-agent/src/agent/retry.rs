//! Waiting before trying again: a failed unit's next chance (its own jittered backoff,
//! `backoff_min` to `backoff_max`), and the shorter backoff of the loops that wait for etcd
//! or systemd to answer. Decides only when; the loop decides what to try.

use fleet_core::{Backoff, UnitName};
use fleet_registry::kv::Kv;
use std::time::Duration;
use tokio::time::Instant;
use tracing::info;

use super::Agent;
use crate::manager::UnitManager;

/// The longest pause between two attempts to reach etcd or systemd in the boot and publish
/// loops: once etcd is back, an agent should notice within seconds, not a minute.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// A failed unit's next chance, and the backoff that spaces its chances.
#[derive(Debug, Clone)]
pub(super) struct Retry {
    pub(super) until: Instant,
    pub(super) backoff: Backoff,
}

impl<K: Kv, M: UnitManager> Agent<K, M> {
    pub(super) fn fail(&mut self, unit: UnitName, now: Instant) {
        let fresh = self.retry_backoff();
        let retry = self.backoff.entry(unit.clone()).or_insert(Retry {
            until: now,
            backoff: fresh,
        });
        let delay = retry.backoff.next_delay();
        retry.until = now + delay;
        info!(unit = %unit, retry_in = ?delay, "unit failed; retrying later");
    }

    /// The backoff of a failing unit: `backoff_min` to `backoff_max`, jittered.
    fn retry_backoff(&self) -> Backoff {
        Backoff::new(self.cfg.backoff_min, self.cfg.backoff_max)
    }

    /// The backoff of a loop that waits for etcd or systemd to answer: `backoff_min` to
    /// [`RECONNECT_MAX`], jittered so that agents do not come back in lockstep.
    pub(super) fn reconnect_backoff(&self) -> Backoff {
        Backoff::new(
            self.cfg.backoff_min,
            RECONNECT_MAX.max(self.cfg.backoff_min),
        )
    }
}
