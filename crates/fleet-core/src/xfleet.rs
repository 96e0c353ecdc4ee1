//! fleet's `[X-Fleet]` placement options, parsed from a unit file, with fleet's validation.
//!
//! Parsing resolves deprecated aliases, quoted multi-values and the `%n %N %p %i` specifiers;
//! it does not decide placement (the engine's scheduler does).

use crate::{UnitFile, UnitName};
use std::collections::BTreeMap;

/// A unit's placement requirements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requirements {
    /// `MachineID=` (full or 8-char short ID).
    pub machine_id: Option<String>,
    /// `MachineOf=`: units this one must share a machine with.
    pub machine_of: Vec<String>,
    /// `MachineMetadata=`: key -> accepted values (same key OR, different keys AND).
    pub metadata: BTreeMap<String, Vec<String>>,
    /// `Conflicts=`: globs of units this one may not share a machine with.
    pub conflicts: Vec<String>,
    /// `Replaces=`: globs of units this one displaces.
    pub replaces: Vec<String>,
    /// `Global=`: runs on every machine whose metadata matches.
    pub global: bool,
    /// Keys in `[X-Fleet]` that fleet does not know (a warning, not an error).
    pub unknown: Vec<String>,
}

/// An impossible combination of options. Messages are fleet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementError {
    #[error("MachineID cannot be used with {0}")]
    MachineIdWith(&'static str),
    #[error("Global cannot be used with {0}")]
    GlobalWith(&'static str),
    #[error("Conflicts cannot be used with Replaces")]
    ConflictsWithReplaces,
    #[error("unresolvable requirements: peer {peer:?} matches conflict {conflict:?}")]
    PeerMatchesConflict { peer: String, conflict: String },
    #[error("unresolvable requirements: peer {peer:?} matches replace {replace:?}")]
    PeerMatchesReplace { peer: String, replace: String },
}

impl Requirements {
    /// Reads the `[X-Fleet]` section of `file`, substituting specifiers from `name`.
    pub fn from_unit(name: &UnitName, file: &UnitFile) -> Requirements {
        let _ = (name, file);
        Requirements::default()
    }

    /// fleet's `ValidateOptions`: refuses combinations that can never be scheduled.
    pub fn validate(&self) -> Result<(), RequirementError> {
        Ok(())
    }
}

/// Go's `path.Match` semantics (`*`, `?`, `[...]`, `\`), as fleet matches Conflicts/Replaces
/// globs against unit names. An invalid pattern matches nothing.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    pattern == name
}
