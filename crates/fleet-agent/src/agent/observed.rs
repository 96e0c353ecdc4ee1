//! What the agent saw systemd do to its units by itself (issue 41): a unit it started reached
//! `active`, systemd's `Restart=` restarted a unit (its `NRestarts` grew), a unit is `failed`
//! (with systemd's `Result` and its main process's exit). From these, each unit's history as
//! its state record carries it: restarts after failing here, since when it is in its current
//! ActiveState, and how its main process last ended.
//!
//! Pure bookkeeping on the facts the agent reads ([`UnitFacts`]); reading them is the agent's
//! (`observe.rs`), only for units whose state changed. A failure this module told as an event
//! is not told again when the agent revives the unit ([`Observed::told_failed`]).

use fleet_core::{ActiveState, MachineId, SystemdState, UnitName};
use fleet_registry::{Event, EventKind};
use std::collections::BTreeMap;

use crate::current::UnitHistory;
use crate::executor::Failure;
use crate::manager::{MainExit, UnitFacts};

/// What was last seen of one unit.
#[derive(Debug, Default)]
struct Seen {
    /// The state its facts were last read in; `None`: read them at the next chance.
    state: Option<SystemdState>,
    /// systemd's `NRestarts` when last read.
    n_restarts: u32,
    /// Of `n_restarts`, those before the agent last started the unit: not counted.
    base: u32,
    /// Restarts counted before systemd counted afresh, and the agent's revivals.
    carried: u64,
    since: Option<u64>,
    exit: Option<String>,
    /// Its present failure was told as an event.
    failure_told: bool,
    /// The agent started it and it has not been seen active yet.
    awaiting_active: bool,
    /// The agent's last start of it was afresh (not a revival), and its facts were not read
    /// since.
    fresh: bool,
}

impl Seen {
    fn restarts(&self) -> u64 {
        self.carried + u64::from(self.n_restarts.saturating_sub(self.base))
    }
}

/// The agent's units as last seen.
#[derive(Debug, Default)]
pub(super) struct Observed {
    seen: BTreeMap<UnitName, Seen>,
}

impl Observed {
    /// Of `units` (with systemd's state of each now), those whose facts to read: never read,
    /// or read in another state than they are in now.
    pub(super) fn stale<'a>(
        &self,
        units: impl IntoIterator<Item = (&'a UnitName, &'a SystemdState)>,
    ) -> Vec<UnitName> {
        units
            .into_iter()
            .filter(|(name, state)| {
                self.seen
                    .get(*name)
                    .is_none_or(|s| s.state.as_ref() != Some(*state))
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Takes in the `facts` read of `unit`, in `state`; returns the events they tell, in order.
    pub(super) fn saw(
        &mut self,
        unit: &UnitName,
        state: &SystemdState,
        facts: &UnitFacts,
        machine: &MachineId,
    ) -> Vec<Event> {
        let known = self.seen.contains_key(unit);
        let seen = self.seen.entry(unit.clone()).or_default();
        seen.state = Some(state.clone());
        seen.fresh = false;
        seen.since = facts.since;
        if let Some(exit) = facts.main_exit {
            seen.exit = Some(exit_text(facts.result.as_deref(), exit));
        }
        let mut told = Vec::new();
        let afresh = facts.n_restarts < seen.n_restarts;
        if afresh {
            // systemd counts afresh after a start job: keep what it had counted.
            seen.carried += u64::from(seen.n_restarts.saturating_sub(seen.base));
            seen.base = 0;
        }
        let grew = facts.n_restarts > if afresh { 0 } else { seen.n_restarts };
        seen.n_restarts = facts.n_restarts;
        if known && grew {
            let after = seen.exit.as_ref().map(|e| format!(" after {e}"));
            let reason = format!(
                "systemd restarted it{} ({} restarts here)",
                after.unwrap_or_default(),
                seen.restarts()
            );
            told.push(Event::now(EventKind::RestartedBySystemd, reason));
        }
        match state.active_state() {
            ActiveState::Failed => {
                seen.awaiting_active = false;
                if !seen.failure_told {
                    seen.failure_told = true;
                    let failure = Failure {
                        result: facts.result.clone().filter(|r| r != "success"),
                        main_exit: facts.main_exit,
                    };
                    let reason = format!("systemd shows it failed{failure}");
                    told.push(Event::now(EventKind::Failed, reason));
                }
            }
            ActiveState::Active if seen.awaiting_active => {
                seen.awaiting_active = false;
                seen.failure_told = false;
                let reason = format!("{} ({})", state.active, state.sub);
                told.push(Event::now(EventKind::Active, reason));
            }
            ActiveState::Activating | ActiveState::Reloading => seen.failure_told = false,
            ActiveState::Inactive | ActiveState::Deactivating | ActiveState::Maintenance => {
                seen.failure_told = false;
                seen.awaiting_active = false;
            }
            ActiveState::Active | ActiveState::Refreshing | ActiveState::Unknown(_) => {
                seen.failure_told = false;
            }
        }
        told.into_iter().map(|e| e.unit(unit).on(machine)).collect()
    }

    /// The agent started `unit` (`revival`: again, after it failed): it counts a restart after
    /// failing, or (a fresh start) the unit's restarts count from now. Its facts are read at
    /// the next chance, whatever its state then.
    pub(super) fn started(&mut self, unit: &UnitName, revival: bool) {
        let seen = self.seen.entry(unit.clone()).or_default();
        if revival {
            seen.carried += 1;
        } else {
            seen.carried = 0;
            seen.base = seen.n_restarts;
        }
        seen.awaiting_active = true;
        seen.fresh = !revival;
        seen.state = None;
    }

    /// The facts of `unit`, now in `state`, that its fresh start by the agent set, when only
    /// its `since` is left to read: the agent started it afresh, has not read its facts since,
    /// it is active, and systemd never counted a restart of it here. A start job counts
    /// systemd's restarts afresh (from 0) and no main process of it has ended yet. A unit with
    /// restarts counted is read whole: a start of it while systemd was about to restart it
    /// again keeps systemd's count. A restart by systemd before this read shows at the unit's
    /// next state change, when its facts are read whole. `None`: read them whole.
    pub(super) fn started_active(
        &self,
        unit: &UnitName,
        state: &SystemdState,
    ) -> Option<UnitFacts> {
        let seen = self.seen.get(unit)?;
        let active = state.active_state() == ActiveState::Active;
        let never_restarted = seen.n_restarts == 0;
        (seen.fresh && seen.awaiting_active && active && never_restarted).then_some(UnitFacts {
            n_restarts: 0,
            since: None,
            result: None,
            main_exit: None,
        })
    }

    /// Whether the present failure of `unit` was told as an event already.
    pub(super) fn told_failed(&self, unit: &UnitName) -> bool {
        self.seen.get(unit).is_some_and(|s| s.failure_told)
    }

    /// What `unit`'s state record says of its history; `None` when never seen.
    pub(super) fn history(&self, unit: &UnitName) -> Option<UnitHistory> {
        let seen = self.seen.get(unit)?;
        Some(UnitHistory {
            restarts: seen.restarts(),
            since: seen.since,
            exit: seen.exit.clone(),
        })
    }

    /// Forgets `unit` (gone from this machine).
    pub(super) fn forget(&mut self, unit: &UnitName) {
        self.seen.remove(unit);
    }

    /// Forgets the units `keep` does not keep (gone from this machine).
    pub(super) fn retain(&mut self, keep: impl Fn(&UnitName) -> bool) {
        self.seen.retain(|n, _| keep(n));
    }
}

/// How a main process ended, with systemd's `Result` when it says more than the exit does:
/// `exit status 3`, `killed by signal 9`, `killed by signal 15, result timeout`.
pub(crate) fn exit_text(result: Option<&str>, exit: MainExit) -> String {
    let implied = match exit {
        MainExit::Exited(0) => "success",
        MainExit::Exited(_) => "exit-code",
        MainExit::Killed(_) => "signal",
        MainExit::Dumped(_) => "core-dump",
    };
    match result {
        Some(r) if r != implied && r != "success" => format!("{exit}, result {r}"),
        Some(_) | None => exit.to_string(),
    }
}

#[cfg(test)]
mod tests;
