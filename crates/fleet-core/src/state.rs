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
///
/// The fields keep systemd's own words, exactly as published in the registry's state records
/// (`docs/registry.md`), so a word this code does not know survives the round trip. Decisions
/// never compare them: they go through [`SystemdState::active_state`] and
/// [`SystemdState::load_state`], the one definition of what each word means.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SystemdState {
    /// LoadState: `loaded`, `not-found`, `error`, `masked`...
    pub load: String,
    /// ActiveState: `active`, `inactive`, `failed`, `activating`, `deactivating`...
    pub active: String,
    /// SubState: `running`, `dead`, `exited`... Unit-type specific and only ever shown, never
    /// decided on, so it stays a word.
    pub sub: String,
}

impl SystemdState {
    /// What systemd reports for a name it has no unit of: `not-found`/`inactive`/`dead`.
    pub fn not_found() -> SystemdState {
        SystemdState {
            load: LoadState::NotFound.to_string(),
            active: ActiveState::Inactive.to_string(),
            sub: "dead".to_owned(),
        }
    }

    pub fn active_state(&self) -> ActiveState {
        ActiveState::parse(&self.active)
    }

    pub fn load_state(&self) -> LoadState {
        LoadState::parse(&self.load)
    }
}

/// systemd's ActiveState (systemd 262's set), with any other word kept as it came.
///
/// "Running" means three things, each its own predicate, and they differ:
///
/// | state                               | [`is_started`] | [`satisfies_launched`] | [`may_be_running`] |
/// |-------------------------------------|----------------|------------------------|--------------------|
/// | `active`                            | yes            | yes                    | yes                |
/// | `activating` `reloading` `refreshing` | yes          | no                     | yes                |
/// | `deactivating` `maintenance`, unknown | no           | no                     | yes                |
/// | `inactive` `failed`                 | no             | no                     | no                 |
///
/// [`is_started`]: ActiveState::is_started
/// [`satisfies_launched`]: ActiveState::satisfies_launched
/// [`may_be_running`]: ActiveState::may_be_running
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ActiveState {
    Active,
    Reloading,
    Inactive,
    Failed,
    Activating,
    Deactivating,
    Maintenance,
    Refreshing,
    /// A word this code does not know (a newer systemd's); preserved for display.
    Unknown(String),
}

impl ActiveState {
    /// Never fails: an unknown word becomes [`ActiveState::Unknown`].
    pub fn parse(word: &str) -> ActiveState {
        match word {
            "active" => Self::Active,
            "reloading" => Self::Reloading,
            "inactive" => Self::Inactive,
            "failed" => Self::Failed,
            "activating" => Self::Activating,
            "deactivating" => Self::Deactivating,
            "maintenance" => Self::Maintenance,
            "refreshing" => Self::Refreshing,
            other => Self::Unknown(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Active => "active",
            Self::Reloading => "reloading",
            Self::Inactive => "inactive",
            Self::Failed => "failed",
            Self::Activating => "activating",
            Self::Deactivating => "deactivating",
            Self::Maintenance => "maintenance",
            Self::Refreshing => "refreshing",
            Self::Unknown(word) => word,
        }
    }

    /// Whether the unit is started, as the agent's plan sees it: up, or on its way up, so a
    /// start job would add nothing (and a unit desired loaded is stopped). `deactivating` is
    /// not (on its way down), nor is a word this code does not know.
    pub fn is_started(&self) -> bool {
        match self {
            Self::Active | Self::Activating | Self::Reloading | Self::Refreshing => true,
            Self::Inactive
            | Self::Failed
            | Self::Deactivating
            | Self::Maintenance
            | Self::Unknown(_) => false,
        }
    }

    /// Whether the unit has reached what `launched` asks for: `active`, and nothing else.
    /// What a wait for `launched` waits for (fleetctl's, the API's), what the engine counts as
    /// a launched copy, and which units may run an older version of their file. Stricter than
    /// [`is_started`](Self::is_started): a unit still `activating` has not got there.
    pub fn satisfies_launched(&self) -> bool {
        match self {
            Self::Active => true,
            Self::Reloading
            | Self::Inactive
            | Self::Failed
            | Self::Activating
            | Self::Deactivating
            | Self::Maintenance
            | Self::Refreshing
            | Self::Unknown(_) => false,
        }
    }

    /// Whether processes of the unit may be alive: anything but `inactive` and `failed`, so
    /// that a word this code does not know errs on the side of waiting. What counts as a copy
    /// left behind on a machine (the engine's history, the fence), and what a wait for
    /// `loaded` waits to see go.
    pub fn may_be_running(&self) -> bool {
        match self {
            Self::Inactive | Self::Failed => false,
            Self::Active
            | Self::Reloading
            | Self::Activating
            | Self::Deactivating
            | Self::Maintenance
            | Self::Refreshing
            | Self::Unknown(_) => true,
        }
    }
}

impl fmt::Display for ActiveState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// systemd's LoadState, with any other word kept as it came.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LoadState {
    Loaded,
    /// No file defines the unit (also what systemd says of a name it does not know).
    NotFound,
    BadSetting,
    Error,
    Merged,
    Masked,
    Stub,
    /// A word this code does not know; preserved for display.
    Unknown(String),
}

impl LoadState {
    /// Never fails: an unknown word becomes [`LoadState::Unknown`].
    pub fn parse(word: &str) -> LoadState {
        match word {
            "loaded" => Self::Loaded,
            "not-found" => Self::NotFound,
            "bad-setting" => Self::BadSetting,
            "error" => Self::Error,
            "merged" => Self::Merged,
            "masked" => Self::Masked,
            "stub" => Self::Stub,
            other => Self::Unknown(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Loaded => "loaded",
            Self::NotFound => "not-found",
            Self::BadSetting => "bad-setting",
            Self::Error => "error",
            Self::Merged => "merged",
            Self::Masked => "masked",
            Self::Stub => "stub",
            Self::Unknown(word) => word,
        }
    }

    /// Whether systemd refuses to load the unit as it is: its file is broken or masked.
    pub fn cannot_load(&self) -> bool {
        match self {
            Self::Error | Self::BadSetting | Self::Masked => true,
            Self::Loaded | Self::NotFound | Self::Merged | Self::Stub | Self::Unknown(_) => false,
        }
    }
}

impl fmt::Display for LoadState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_meanings_of_running_differ_as_their_table_says() {
        let table = [
            ("active", true, true, true),
            ("activating", true, false, true),
            ("reloading", true, false, true),
            ("refreshing", true, false, true),
            ("deactivating", false, false, true),
            ("maintenance", false, false, true),
            ("hibernating", false, false, true),
            ("inactive", false, false, false),
            ("failed", false, false, false),
        ];
        for (word, started, launched, may_run) in table {
            let state = ActiveState::parse(word);
            assert_eq!(state.is_started(), started, "{word} is_started");
            assert_eq!(
                state.satisfies_launched(),
                launched,
                "{word} satisfies_launched"
            );
            assert_eq!(state.may_be_running(), may_run, "{word} may_be_running");
        }
    }

    #[test]
    fn active_states_round_trip_through_systemds_words_and_keep_unknown_ones() {
        for word in [
            "active",
            "reloading",
            "inactive",
            "failed",
            "activating",
            "deactivating",
            "maintenance",
            "refreshing",
            "hibernating",
        ] {
            assert_eq!(ActiveState::parse(word).to_string(), word);
        }
        assert_eq!(
            ActiveState::parse("hibernating"),
            ActiveState::Unknown("hibernating".into())
        );
    }

    #[test]
    fn load_states_round_trip_through_systemds_words_and_keep_unknown_ones() {
        for word in [
            "loaded",
            "not-found",
            "bad-setting",
            "error",
            "merged",
            "masked",
            "stub",
            "weird",
        ] {
            assert_eq!(LoadState::parse(word).to_string(), word);
        }
    }

    #[test]
    fn a_unit_on_its_way_up_counts_as_started_one_on_its_way_down_does_not() {
        let started: Vec<&str> = [
            "active",
            "reloading",
            "inactive",
            "failed",
            "activating",
            "deactivating",
            "maintenance",
            "refreshing",
            "hibernating",
        ]
        .into_iter()
        .filter(|w| ActiveState::parse(w).is_started())
        .collect();
        assert_eq!(started, ["active", "reloading", "activating", "refreshing"]);
    }

    #[test]
    fn only_inactive_and_failed_units_surely_run_nothing() {
        assert!(!ActiveState::Inactive.may_be_running());
        assert!(!ActiveState::Failed.may_be_running());
        assert!(ActiveState::Deactivating.may_be_running());
        assert!(ActiveState::parse("hibernating").may_be_running());
    }

    #[test]
    fn broken_and_masked_units_cannot_load() {
        assert!(LoadState::Error.cannot_load());
        assert!(LoadState::BadSetting.cannot_load());
        assert!(LoadState::Masked.cannot_load());
        assert!(!LoadState::Loaded.cannot_load());
        assert!(!LoadState::NotFound.cannot_load());
    }

    #[test]
    fn a_state_record_keeps_its_wire_format() {
        let json = r#"{"load":"loaded","active":"hibernating","sub":"zzz"}"#;
        let state: SystemdState = serde_json::from_str(json).unwrap();
        assert_eq!(
            state.active_state(),
            ActiveState::Unknown("hibernating".into())
        );
        assert_eq!(serde_json::to_string(&state).unwrap(), json);
        assert_eq!(
            SystemdState::not_found(),
            SystemdState {
                load: "not-found".into(),
                active: "inactive".into(),
                sub: "dead".into(),
            }
        );
    }
}
