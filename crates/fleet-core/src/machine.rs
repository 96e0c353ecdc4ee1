//! Machines: their IDs (from `/etc/machine-id`) and what each publishes about itself.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// A machine's ID: 1 to 64 ASCII letters, digits, `-` or `_` (systemd's machine IDs are 32
/// lowercase hex digits). Safe to use as an etcd key segment. Clones share the text: the
/// engine's view names a machine in every schedule entry and state of its units.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MachineId(Arc<str>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MachineIdError {
    #[error("machine ID cannot be empty")]
    Empty,
    #[error("machine ID exceeds maximum length (64)")]
    TooLong,
    #[error("invalid character {0:?} in machine ID")]
    InvalidChar(char),
}

impl MachineId {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// fleet's short form: the first 8 characters.
    pub fn short(&self) -> &str {
        &self.0[..self.0.len().min(8)]
    }

    /// fleet's `MachineID=` match: the full ID or its 8-character short form.
    pub fn matches(&self, wanted: &str) -> bool {
        wanted == &*self.0 || (wanted.len() == 8 && wanted == self.short())
    }
}

impl FromStr for MachineId {
    type Err = MachineIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(MachineIdError::Empty);
        }
        if s.len() > 64 {
            return Err(MachineIdError::TooLong);
        }
        if let Some(c) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(MachineIdError::InvalidChar(c));
        }
        Ok(Self(Arc::from(s)))
    }
}

impl TryFrom<String> for MachineId {
    type Error = MachineIdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<MachineId> for String {
    fn from(m: MachineId) -> String {
        m.0.to_string()
    }
}

impl fmt::Display for MachineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a live machine publishes about itself (its presence record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineInfo {
    pub id: MachineId,
    /// Empty when unknown.
    #[serde(default)]
    pub public_ip: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub version: String,
    /// Whether this machine takes part in leader election.
    #[serde(default)]
    pub disable_engine: bool,
    /// Where this machine's fleetd serves its API over the network (`https://HOST:PORT`, or
    /// `http://` for a plain loopback listener); empty when it serves none. fleetctl reaches a
    /// unit's own machine here for `status` and `journal` (issue 16).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api: String,
    /// Set by a fleetd that stopped and has not come back: when (seconds since the epoch)
    /// its fence stops this machine's non-global units ([`crate::fence`]). A fleetd that
    /// registers again writes its record without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence_at: Option<u64>,
}
