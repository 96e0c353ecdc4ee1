//! Desired states (fleet's `inactive`/`loaded`/`launched`) and the systemd states agents publish.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// What the user asked for a unit. Declaration order is the lifecycle order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DesiredState {
    /// Known to the cluster, not scheduled anywhere.
    Inactive,
    /// Scheduled to a machine, its file loaded into systemd there, not started.
    Loaded,
    /// Scheduled and started.
    Launched,
}

impl DesiredState {
    pub const ALL: [DesiredState; 3] = [Self::Inactive, Self::Loaded, Self::Launched];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Inactive => "inactive",
            Self::Loaded => "loaded",
            Self::Launched => "launched",
        }
    }
}

impl fmt::Display for DesiredState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid state {0:?}: expected inactive, loaded or launched")]
pub struct StateError(pub String);

impl FromStr for DesiredState {
    type Err = StateError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "inactive" => Ok(Self::Inactive),
            "loaded" => Ok(Self::Loaded),
            "launched" => Ok(Self::Launched),
            other => Err(StateError(other.to_owned())),
        }
    }
}

/// systemd's view of one unit, as `ListUnitsByNames` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SystemdState {
    /// LoadState: `loaded`, `not-found`, `error`, `masked`...
    pub load: String,
    /// ActiveState: `active`, `inactive`, `failed`, `activating`, `deactivating`...
    pub active: String,
    /// SubState: `running`, `dead`, `exited`...
    pub sub: String,
}
