//! The fake's model of one machine: the units directory, runtime links, and systemd's record
//! of each unit (the definition it loaded, its states, the definition its process started from).
//! Pure data and rules; [`super::FakeManager`] adds the call log, failures and hints.

use super::{Call, FakeJob, Op};
use crate::manager::{JobKind, JobOutcome, MainExit, UnitFacts};
use fleet_core::{ActiveState, ParseError, SystemdState, UnitFile, UnitHash, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Definition {
    /// Loaded from the units directory file with these bytes.
    Ours(Vec<u8>),
    /// Loaded from a file that is not fleet's (e.g. `/etc/systemd/system`).
    Foreign,
}

#[derive(Debug, Clone)]
pub(super) struct Record {
    /// `None`: load state `not-found`.
    pub(super) definition: Option<Definition>,
    pub(super) active: String,
    pub(super) sub: String,
    /// The definition the current process was started from.
    pub(super) started_from: Option<Definition>,
    pub(super) main_pid: Option<u32>,
    pub(super) invocation_id: Option<String>,
    pub(super) drop_ins: Vec<PathBuf>,
    /// What [`crate::manager::UnitManager::facts`] reports of it.
    pub(super) facts: UnitFacts,
}

impl Record {
    pub(super) fn running(&self) -> bool {
        self.active_state().is_started()
    }

    pub(super) fn active_state(&self) -> ActiveState {
        ActiveState::parse(&self.active)
    }

    /// Sets its states; a new ActiveState is stamped (the fake's clock: one second a change).
    pub(super) fn set(&mut self, active: &str, sub: &str) {
        if self.active != active {
            self.facts.since = Some(self.facts.since.unwrap_or(0) + 1_000_000);
        }
        active.clone_into(&mut self.active);
        sub.clone_into(&mut self.sub);
    }

    pub(super) fn state(&self) -> SystemdState {
        SystemdState {
            load: if self.definition.is_some() {
                "loaded"
            } else {
                "not-found"
            }
            .to_owned(),
            active: self.active.clone(),
            sub: self.sub.clone(),
        }
    }
}

#[derive(Debug)]
pub(super) struct Fault {
    pub(super) op: Op,
    pub(super) unit: Option<UnitName>,
    /// `None`: forever.
    pub(super) remaining: Option<u32>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) files: BTreeMap<String, Vec<u8>>,
    /// Each file's hash (or why it does not parse) as of the bytes it was taken from: parsed
    /// once per content, as systemd's adapter caches hashes by the file's stamp. Parsing every
    /// file on every listing was a fifth of the scale simulation's CPU.
    pub(super) parsed: BTreeMap<String, (Vec<u8>, Result<UnitHash, ParseError>)>,
    pub(super) linked: BTreeSet<UnitName>,
    pub(super) records: BTreeMap<UnitName, Record>,
    pub(super) calls: Vec<Call>,
    pub(super) faults: Vec<Fault>,
    pub(super) jobs: BTreeMap<(UnitName, JobKind), FakeJob>,
    pub(super) next_pid: u32,
    pub(super) next_invocation: u128,
}

impl State {
    /// The hash of the file's canonical text, or why it does not parse; `None` without a file.
    pub(super) fn content_of(&mut self, file_name: &str) -> Option<Result<UnitHash, ParseError>> {
        let bytes = self.files.get(file_name)?;
        if let Some((seen, content)) = self.parsed.get(file_name)
            && seen == bytes
        {
            return Some(content.clone());
        }
        let content = UnitFile::parse(bytes).map(|f| f.hash());
        self.parsed
            .insert(file_name.to_owned(), (bytes.clone(), content.clone()));
        Some(content)
    }

    /// What systemd would load for `name` now.
    pub(super) fn loadable(&self, name: &UnitName) -> Option<Definition> {
        if !self.linked.contains(name) {
            return None;
        }
        self.files
            .get(name.as_str())
            .map(|bytes| Definition::Ours(bytes.clone()))
    }

    pub(super) fn load_on_demand(&mut self, name: &UnitName) {
        let Some(definition) = self.loadable(name) else {
            return;
        };
        match self.records.get_mut(name) {
            None => {
                self.records.insert(
                    name.clone(),
                    Record {
                        definition: Some(definition),
                        active: "inactive".to_owned(),
                        sub: "dead".to_owned(),
                        started_from: None,
                        main_pid: None,
                        invocation_id: None,
                        drop_ins: Vec::new(),
                        facts: UnitFacts::default(),
                    },
                );
            }
            Some(r) if r.definition.is_none() && !r.running() => r.definition = Some(definition),
            Some(_) => {}
        }
    }

    pub(super) fn state(&self, name: &UnitName) -> SystemdState {
        match self.records.get(name) {
            Some(r) => r.state(),
            None => SystemdState::not_found(),
        }
    }

    pub(super) fn need_daemon_reload(&self, name: &UnitName) -> bool {
        self.records.get(name).is_some_and(|r| {
            matches!(r.definition, Some(Definition::Ours(_))) && r.definition != self.loadable(name)
        })
    }

    /// Logs the call, then returns whether an injected failure hits it.
    pub(super) fn call(&mut self, call: Call, op: Op, units: &[UnitName]) -> bool {
        self.calls.push(call);
        let hit = self.faults.iter_mut().find(|f| {
            f.op == op
                && f.remaining != Some(0)
                && f.unit.as_ref().is_none_or(|u| units.contains(u))
        });
        match hit {
            Some(fault) => {
                if let Some(n) = &mut fault.remaining {
                    *n -= 1;
                }
                true
            }
            None => false,
        }
    }

    pub(super) fn start(&mut self, name: &UnitName, outcome: JobOutcome) {
        let Some(record) = self.records.get_mut(name) else {
            return;
        };
        match outcome {
            JobOutcome::Done if record.running() => {}
            JobOutcome::Done => {
                self.next_pid += 1;
                self.next_invocation += 1;
                // A start job counts systemd's restarts afresh; the new process has not ended.
                record.facts.n_restarts = 0;
                record.facts.main_exit = None;
                record.facts.result = Some("success".to_owned());
                record.set("active", "running");
                record.started_from = record.definition.clone();
                record.main_pid = Some(1000 + self.next_pid);
                record.invocation_id = Some(format!("{:032x}", self.next_invocation));
            }
            JobOutcome::Failed | JobOutcome::Timeout => {
                // As `ExecStart=/bin/false` fails.
                record.facts.result = Some("exit-code".to_owned());
                record.facts.main_exit = Some(MainExit::Exited(1));
                record.set("failed", "failed");
                record.main_pid = None;
                record.started_from = None;
            }
            JobOutcome::NotLoaded
            | JobOutcome::Canceled
            | JobOutcome::Dependency
            | JobOutcome::Skipped
            | JobOutcome::Invalid
            | JobOutcome::Assert
            | JobOutcome::Unsupported
            | JobOutcome::Collected
            | JobOutcome::Once
            | JobOutcome::Frozen
            | JobOutcome::Concurrency => {}
        }
    }

    pub(super) fn stop(&mut self, name: &UnitName, outcome: JobOutcome) {
        let Some(record) = self.records.get_mut(name) else {
            return;
        };
        match outcome {
            JobOutcome::Done => {
                if record.running() || record.active_state() == ActiveState::Deactivating {
                    record.set("inactive", "dead");
                }
                record.main_pid = None;
                record.started_from = None;
            }
            JobOutcome::Failed | JobOutcome::Timeout => {
                record.set("failed", "failed");
                record.main_pid = None;
                record.started_from = None;
            }
            JobOutcome::NotLoaded
            | JobOutcome::Canceled
            | JobOutcome::Dependency
            | JobOutcome::Skipped
            | JobOutcome::Invalid
            | JobOutcome::Assert
            | JobOutcome::Unsupported
            | JobOutcome::Collected
            | JobOutcome::Once
            | JobOutcome::Frozen
            | JobOutcome::Concurrency => {}
        }
    }

    pub(super) fn reload(&mut self) {
        let names: Vec<UnitName> = self.records.keys().cloned().collect();
        for name in names {
            let loadable = self.loadable(&name);
            let Some(record) = self.records.get_mut(&name) else {
                continue;
            };
            let definition = match loadable {
                Some(d) => Some(d),
                None if record.definition == Some(Definition::Foreign) => Some(Definition::Foreign),
                None => None,
            };
            if definition.is_none() && !record.running() {
                self.records.remove(&name);
            } else {
                record.definition = definition;
            }
        }
    }
}
