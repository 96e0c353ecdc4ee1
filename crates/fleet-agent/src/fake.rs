//! [`FakeManager`]: an in-memory [`UnitManager`] for the agent loop's tests.
//!
//! It models what the planner and the executor rely on, not all of systemd: a units directory
//! (raw names and bytes, so foreign and unparseable files can be planted), runtime links, and
//! per-unit systemd records with the definition systemd loaded. Like systemd, a linked file
//! loads on demand (on a status query or a start) when no definition is loaded, a loaded unit
//! keeps its definition until [`UnitManager::reload`], and a start runs whatever definition is
//! loaded, stale or not ([`FakeManager::running_hash`] tells which). Every call is logged;
//! failures can be injected per operation and per unit; jobs can be made to fail or hang.

use crate::manager::{
    BusError, ChangeReceiver, ChangeSender, InstalledUnit, JobKind, JobOutcome, MainExit,
    ManagerError, UnitDetails, UnitFacts, UnitFileError, UnitManager, UnitSource,
};
use crate::units_dir::{DEFAULT_RUNTIME_UNIT_DIR, DEFAULT_UNITS_DIR};
use fleet_core::{ActiveState, SystemdState, UnitFile, UnitHash, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

mod control;
mod model;

use model::{Definition, Fault, Record, State};

/// The D-Bus error name of injected failures.
pub const INJECTED_ERROR: &str = "org.freedesktop.fleet.Fake.Injected";

/// The operations of [`UnitManager`], to inject failures into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Installed,
    Install,
    Uninstall,
    Reload,
    Start,
    Stop,
    Status,
    Loaded,
    Details,
    Facts,
    Source,
}

/// One logged call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Installed,
    Install(UnitName, UnitHash),
    Uninstall(UnitName),
    Reload,
    Start(UnitName),
    Stop(UnitName),
    Status(Vec<UnitName>),
    Loaded(Vec<UnitName>),
    Details(UnitName),
    Facts(UnitName),
    /// [`UnitManager::since`] (injected failures: [`Op::Facts`]).
    Since(UnitName),
    Source(UnitName),
}

impl Call {
    /// The unit the call is about, if it is about one.
    pub fn unit(&self) -> Option<&UnitName> {
        match self {
            Self::Install(n, _)
            | Self::Uninstall(n)
            | Self::Start(n)
            | Self::Stop(n)
            | Self::Details(n)
            | Self::Facts(n)
            | Self::Since(n)
            | Self::Source(n) => Some(n),
            Self::Installed | Self::Reload | Self::Status(_) | Self::Loaded(_) => None,
        }
    }
}

/// How a start or stop job of one unit ends, overriding the fake's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeJob {
    Ends(JobOutcome),
    /// No `JobRemoved` ever comes: the call waits for the job timeout, then fails.
    NeverEnds,
}

/// The default bound on waiting for a job, as in the real adapter.
pub const DEFAULT_FAKE_JOB_TIMEOUT: Duration = Duration::from_secs(120);

/// An in-memory [`UnitManager`]; clones share state.
#[derive(Debug, Clone)]
pub struct FakeManager {
    state: Arc<Mutex<State>>,
    changes: ChangeSender,
    job_timeout: Duration,
}

impl Default for FakeManager {
    fn default() -> Self {
        FakeManager::new()
    }
}

impl FakeManager {
    pub fn new() -> FakeManager {
        FakeManager {
            state: Arc::default(),
            changes: ChangeSender::new(),
            job_timeout: DEFAULT_FAKE_JOB_TIMEOUT,
        }
    }

    /// How long a [`FakeJob::NeverEnds`] job is waited for.
    pub fn with_job_timeout(mut self, timeout: Duration) -> FakeManager {
        self.job_timeout = timeout;
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn run_job(&self, kind: JobKind, name: &UnitName) -> Result<JobOutcome, ManagerError> {
        let (call, op) = match kind {
            JobKind::Start => (Call::Start(name.clone()), Op::Start),
            JobKind::Stop => (Call::Stop(name.clone()), Op::Stop),
        };
        let job = {
            let mut state = self.lock();
            if state.call(call, op, std::slice::from_ref(name)) {
                return Err(ManagerError::QueueJob {
                    kind,
                    unit: name.clone(),
                    source: injected(op),
                });
            }
            state.load_on_demand(name);
            let loaded = state
                .records
                .get(name)
                .is_some_and(|r| r.definition.is_some() || r.running());
            let job = state.jobs.get(&(name.clone(), kind)).copied();
            match (kind, loaded, job) {
                (JobKind::Start, false, _) => {
                    return Err(ManagerError::QueueJob {
                        kind,
                        unit: name.clone(),
                        source: BusError::Method {
                            name: BusError::NO_SUCH_UNIT.to_owned(),
                            message: format!("Unit {name} not found."),
                        },
                    });
                }
                (JobKind::Stop, false, _) => return Ok(JobOutcome::NotLoaded),
                (_, true, Some(FakeJob::NeverEnds)) => None,
                (_, true, Some(FakeJob::Ends(outcome))) => Some(outcome),
                (_, true, None) => Some(JobOutcome::Done),
            }
        };
        let Some(outcome) = job else {
            tokio::time::sleep(self.job_timeout).await;
            return Err(ManagerError::JobTimeout {
                kind,
                unit: name.clone(),
                waited: self.job_timeout,
            });
        };
        {
            let mut state = self.lock();
            match kind {
                JobKind::Start => state.start(name, outcome),
                JobKind::Stop => state.stop(name, outcome),
            }
        }
        self.changes.unit(name);
        Ok(outcome)
    }
}

impl State {
    /// `name`'s file as [`UnitManager::installed`] reports it, if it has one.
    fn installed_unit(&mut self, name: UnitName) -> Option<InstalledUnit> {
        let content = self
            .content_of(name.as_str())?
            .map_err(UnitFileError::Parse);
        let linked = self.linked.contains(&name);
        Some(InstalledUnit {
            name,
            content,
            linked,
        })
    }
}

/// Where the fake's foreign units come from: an operator's file in `/etc`.
fn foreign_fragment(name: &UnitName) -> PathBuf {
    PathBuf::from("/etc/systemd/system").join(name.as_str())
}

fn injected(op: Op) -> BusError {
    BusError::Method {
        name: INJECTED_ERROR.to_owned(),
        message: format!("injected failure of {op:?}"),
    }
}

impl UnitManager for FakeManager {
    async fn installed(&self) -> Result<Vec<InstalledUnit>, ManagerError> {
        let state = &mut *self.lock();
        if state.call(Call::Installed, Op::Installed, &[]) {
            return Err(ManagerError::ListUnitsDir {
                path: PathBuf::from(DEFAULT_UNITS_DIR),
                source: io::Error::other("injected failure"),
            });
        }
        let files: Vec<String> = state.files.keys().cloned().collect();
        state.parsed.retain(|f, _| state.files.contains_key(f));
        let units = files
            .iter()
            .filter_map(|file_name| {
                let name: UnitName = file_name.parse().ok()?;
                state.installed_unit(name)
            })
            .collect();
        Ok(units)
    }

    async fn installed_of(&self, names: &[UnitName]) -> Result<Vec<InstalledUnit>, ManagerError> {
        let state = &mut *self.lock();
        if state.call(Call::Installed, Op::Installed, &[]) {
            return Err(ManagerError::ListUnitsDir {
                path: PathBuf::from(DEFAULT_UNITS_DIR),
                source: io::Error::other("injected failure"),
            });
        }
        let mut names: Vec<&UnitName> = names.iter().collect();
        names.sort();
        names.dedup();
        Ok(names
            .into_iter()
            .filter_map(|name| state.installed_unit(name.clone()))
            .collect())
    }

    async fn install(&self, name: &UnitName, file: &UnitFile) -> Result<(), ManagerError> {
        let mut state = self.lock();
        let call = Call::Install(name.clone(), file.hash());
        if state.call(call, Op::Install, std::slice::from_ref(name)) {
            return Err(ManagerError::Link {
                unit: name.clone(),
                source: injected(Op::Install),
            });
        }
        state
            .files
            .insert(name.to_string(), file.canonical().into_bytes());
        state.linked.insert(name.clone());
        Ok(())
    }

    async fn uninstall(&self, name: &UnitName) -> Result<(), ManagerError> {
        {
            let mut state = self.lock();
            let call = Call::Uninstall(name.clone());
            if state.call(call, Op::Uninstall, std::slice::from_ref(name)) {
                return Err(ManagerError::Disable {
                    unit: name.clone(),
                    source: injected(Op::Uninstall),
                });
            }
            state.linked.remove(name);
            if let Some(record) = state.records.get_mut(name)
                && record.active_state() == ActiveState::Failed
            {
                record.set("inactive", "dead");
            }
            state.files.remove(name.as_str());
            // systemd garbage-collects a unit once it is inactive; with its file gone, the next
            // query finds nothing (`not-found`), as the contract test shows on a real systemd.
            if state.records.get(name).is_some_and(|r| {
                r.active_state() == ActiveState::Inactive
                    && r.definition != Some(Definition::Foreign)
            }) {
                state.records.remove(name);
            }
        }
        self.changes.unit(name);
        Ok(())
    }

    async fn reload(&self) -> Result<(), ManagerError> {
        {
            let mut state = self.lock();
            if state.call(Call::Reload, Op::Reload, &[]) {
                return Err(ManagerError::Reload(injected(Op::Reload)));
            }
            state.reload();
        }
        self.changes.resync();
        Ok(())
    }

    async fn start(&self, name: &UnitName) -> Result<JobOutcome, ManagerError> {
        self.run_job(JobKind::Start, name).await
    }

    async fn stop(&self, name: &UnitName) -> Result<JobOutcome, ManagerError> {
        self.run_job(JobKind::Stop, name).await
    }

    async fn status(
        &self,
        names: &[UnitName],
    ) -> Result<BTreeMap<UnitName, SystemdState>, ManagerError> {
        let mut state = self.lock();
        if state.call(Call::Status(names.to_vec()), Op::Status, names) {
            return Err(ManagerError::Status {
                count: names.len(),
                source: injected(Op::Status),
            });
        }
        let mut out = BTreeMap::new();
        for name in names {
            state.load_on_demand(name);
            out.insert(name.clone(), state.state(name));
        }
        Ok(out)
    }

    async fn loaded(&self, names: &[UnitName]) -> Result<BTreeSet<UnitName>, ManagerError> {
        let mut state = self.lock();
        if state.call(Call::Loaded(names.to_vec()), Op::Loaded, names) {
            return Err(ManagerError::Status {
                count: names.len(),
                source: injected(Op::Loaded),
            });
        }
        Ok(names
            .iter()
            .filter(|n| state.records.contains_key(*n))
            .cloned()
            .collect())
    }

    async fn details(&self, name: &UnitName) -> Result<UnitDetails, ManagerError> {
        let mut state = self.lock();
        let call = Call::Details(name.clone());
        if state.call(call, Op::Details, std::slice::from_ref(name)) {
            return Err(ManagerError::Details {
                unit: name.clone(),
                source: injected(Op::Details),
            });
        }
        state.load_on_demand(name);
        let need_daemon_reload = state.need_daemon_reload(name);
        let record = state.records.get(name);
        let fragment_path = match record.and_then(|r| r.definition.as_ref()) {
            Some(Definition::Ours(_)) => {
                Some(PathBuf::from(DEFAULT_RUNTIME_UNIT_DIR).join(name.as_str()))
            }
            Some(Definition::Foreign) => Some(foreign_fragment(name)),
            None => None,
        };
        let state_now = state.state(name);
        let failed = state_now.active == "failed";
        Ok(UnitDetails {
            state: state_now,
            fragment_path,
            drop_in_paths: record.map(|r| r.drop_ins.clone()).unwrap_or_default(),
            need_daemon_reload,
            main_pid: record.and_then(|r| r.main_pid),
            invocation_id: record.and_then(|r| r.invocation_id.clone()),
            // A failed fake unit failed as `ExecStart=/bin/false` would, unless it crashed.
            result: Some(if failed { "exit-code" } else { "success" }.to_owned()),
            main_exit: record
                .and_then(|r| r.facts.main_exit)
                .or(failed.then_some(MainExit::Exited(1))),
        })
    }

    async fn since(&self, name: &UnitName) -> Result<Option<u64>, ManagerError> {
        let mut state = self.lock();
        let call = Call::Since(name.clone());
        if state.call(call, Op::Facts, std::slice::from_ref(name)) {
            return Err(ManagerError::Details {
                unit: name.clone(),
                source: injected(Op::Facts),
            });
        }
        state.load_on_demand(name);
        Ok(state.records.get(name).and_then(|r| r.facts.since))
    }

    async fn facts(&self, name: &UnitName) -> Result<UnitFacts, ManagerError> {
        let mut state = self.lock();
        let call = Call::Facts(name.clone());
        if state.call(call, Op::Facts, std::slice::from_ref(name)) {
            return Err(ManagerError::Details {
                unit: name.clone(),
                source: injected(Op::Facts),
            });
        }
        state.load_on_demand(name);
        Ok(state
            .records
            .get(name)
            .map(|r| r.facts.clone())
            .unwrap_or_default())
    }

    async fn source(&self, name: &UnitName) -> Result<UnitSource, ManagerError> {
        let mut state = self.lock();
        let call = Call::Source(name.clone());
        if state.call(call, Op::Source, std::slice::from_ref(name)) {
            return Err(ManagerError::Source {
                unit: name.clone(),
                source: injected(Op::Source),
            });
        }
        state.load_on_demand(name);
        Ok(
            match state.records.get(name).and_then(|r| r.definition.as_ref()) {
                Some(Definition::Ours(_)) => UnitSource::UnitsDir,
                Some(Definition::Foreign) => UnitSource::Foreign {
                    fragment: foreign_fragment(name),
                },
                None => UnitSource::NoFile,
            },
        )
    }

    fn changes(&self) -> ChangeReceiver {
        self.changes.subscribe()
    }
}

#[cfg(test)]
mod tests;
