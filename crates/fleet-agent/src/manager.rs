//! What the agent needs from systemd and from its units directory, as one small trait with a
//! real adapter ([`crate::systemd::SystemdManager`]) and an in-memory one
//! (`fake::FakeManager`, behind the `fake` feature).
//!
//! This module owns the contract and its types. It must not name zbus (only `systemd.rs` does)
//! and must not decide anything: deciding is [`mod@crate::plan`]'s job, executing the tasks in
//! order is the executor's.
//!
//! # What an executor must guarantee
//!
//! The planner's tasks map onto this trait as follows, and the executor owns the ordering:
//!
//! - `Unload`: [`UnitManager::stop`], **await its [`JobOutcome`]**, and only when the unit is
//!   stopped ([`JobOutcome::is_success`]) call [`UnitManager::uninstall`]. A unit file is never
//!   removed or rewritten while its stop job runs: systemd would run the old `ExecStop=`/
//!   `ExecStopPost=` against a file that is gone, and a replacement's `ExecStartPre=` could run
//!   before the old `ExecStopPost=` finished (fleet's issue #1000). If the stop fails or times
//!   out, keep the file and skip the unit's remaining tasks of the plan; the next pass retries.
//!   A replaced unit that starts again (`Unload` for a new hash, `Load`, `Start`) keeps its
//!   link: after the awaited stop, the `Load` writes the new file over the old one.
//! - `Load`: [`UnitManager::install`] with the desired [`UnitFile`] (whose hash is the desired
//!   hash).
//! - `ReloadUnitFiles`: [`UnitManager::reload`], once, after every `Unload` and `Load` of the
//!   plan has finished and before any `Stop` or `Start`: systemd reloads globally, so batching
//!   500 replaced units costs one reload, and a start queued before the reload would run the
//!   old definition. A reload only for removed units (`UnitFileRemoved`) may come last.
//! - `Stop` / `Start`: [`UnitManager::stop`] / [`UnitManager::start`]; the outcome says whether
//!   the job succeeded (a failed start is `Ok(JobOutcome::Failed)`, not an error).
//!
//! Tasks for different units may run concurrently, whatever their kinds, except across the
//! reload a start needs; the real adapter caps the D-Bus calls in flight itself. Two tasks
//! for the same unit must not run concurrently.
//!
//! # State the agent must keep itself
//!
//! [`UnitManager::status`] is cheap (one `ListUnitsByNames` per 500 units) and therefore does
//! not report `NeedDaemonReload`, which costs one property read per unit. Read it with
//! [`UnitManager::details`] when adopting units at boot (a previous agent may have died between
//! writing a file and reloading systemd); afterwards the executor's own ordering keeps it false.

mod changes;

pub use changes::{Change, ChangeReceiver, ChangeSender};

use fleet_core::{ParseError, SystemdState, UnitFile, UnitHash, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// How many unit names go into one `ListUnitsByNames` call.
pub const STATUS_BATCH: usize = 500;

/// The agent's view of systemd and of its units directory.
///
/// Names are [`UnitName`]s, so a path built from one never leaves the units directory.
pub trait UnitManager: Send + Sync {
    /// Every unit file in the units directory, sorted by name: its hash (of the canonical text)
    /// or why it could not be read, and whether it is linked into systemd. Files whose names are
    /// not unit names are skipped (the real adapter warns once per name) and never touched.
    fn installed(&self) -> impl Future<Output = Result<Vec<InstalledUnit>, ManagerError>> + Send;

    /// Of [`UnitManager::installed`], only the files of `names` (those that exist), sorted by
    /// name: what a pass re-reads after a change of a few units. The default lists the whole
    /// directory; the adapters look at just these files.
    fn installed_of(
        &self,
        names: &[UnitName],
    ) -> impl Future<Output = Result<Vec<InstalledUnit>, ManagerError>> + Send {
        async move {
            let wanted: std::collections::BTreeSet<&UnitName> = names.iter().collect();
            let mut all = self.installed().await?;
            all.retain(|u| wanted.contains(&u.name));
            Ok(all)
        }
    }

    /// Writes `<units_dir>/<name>` with the file's canonical text (mode 0644, atomically through
    /// a temporary file and a rename; skipped when the content is already there), links it into
    /// systemd (`LinkUnitFiles([path], runtime, force)`) unless already linked, and enables it
    /// at runtime when it has an `[Install]` section, as fleet did. If linking or enabling fails
    /// the file is removed again, so the next pass sees it missing and retries the whole load.
    /// Does not reload systemd: a changed unit that systemd has loaded needs
    /// [`UnitManager::reload`].
    fn install(
        &self,
        name: &UnitName,
        file: &UnitFile,
    ) -> impl Future<Output = Result<(), ManagerError>> + Send;

    /// Disables the unit (`DisableUnitFiles([name], runtime)`), resets its failed state
    /// (a unit systemd no longer has loaded counts as reset) and removes its file, in that
    /// order: the file's removal is the last step, so any earlier failure leaves the file and the
    /// next pass retries. Does not stop the unit (see the module docs) and does not reload.
    fn uninstall(&self, name: &UnitName) -> impl Future<Output = Result<(), ManagerError>> + Send;

    /// systemd's daemon-reload. Global and ~0.1-0.2 s: call it once per batch of changes.
    fn reload(&self) -> impl Future<Output = Result<(), ManagerError>> + Send;

    /// Queues a start job (`StartUnit(name, "replace")`) and waits, bounded, for its result.
    fn start(
        &self,
        name: &UnitName,
    ) -> impl Future<Output = Result<JobOutcome, ManagerError>> + Send;

    /// Queues a stop job (`StopUnit(name, "replace")`) and waits, bounded, for its result.
    /// Stopping a unit systemd does not have loaded is [`JobOutcome::NotLoaded`], a success.
    fn stop(
        &self,
        name: &UnitName,
    ) -> impl Future<Output = Result<JobOutcome, ManagerError>> + Send;

    /// systemd's load/active/sub states of `names`, with every name in the answer (a unit
    /// systemd does not know is `not-found`/`inactive`/`dead`).
    fn status(
        &self,
        names: &[UnitName],
    ) -> impl Future<Output = Result<BTreeMap<UnitName, SystemdState>, ManagerError>> + Send;

    /// Which of `names` systemd holds in memory now (whatever their load state), without
    /// loading any. A unit it does not hold loads its current file when next asked, so it
    /// cannot run an old definition. The default answers every name (the caller then asks
    /// each, as if all were held).
    fn loaded(
        &self,
        names: &[UnitName],
    ) -> impl Future<Output = Result<BTreeSet<UnitName>, ManagerError>> + Send {
        let all = names.iter().cloned().collect();
        async move { Ok(all) }
    }

    /// Properties that cost one call each: for adopting units at boot and for reporting
    /// drop-ins. Never cached.
    fn details(
        &self,
        name: &UnitName,
    ) -> impl Future<Output = Result<UnitDetails, ManagerError>> + Send;

    /// Of [`UnitManager::details`], only what a daemon-reload may change and
    /// [`UnitManager::status`] does not report: the drop-ins and `NeedDaemonReload`. The agent
    /// reads them of every unit with a file after each reload, so the real adapter reads just
    /// these two properties (rather than a dozen).
    fn reload_facts(
        &self,
        name: &UnitName,
    ) -> impl Future<Output = Result<ReloadFacts, ManagerError>> + Send {
        async move {
            let d = self.details(name).await?;
            Ok(ReloadFacts {
                drop_in_paths: d.drop_in_paths,
                need_daemon_reload: d.need_daemon_reload,
            })
        }
    }

    /// When `name` entered its current ActiveState (systemd's `StateChangeTimestamp`), alone:
    /// what the agent reads of a unit it has just started afresh and finds active, whose
    /// other facts that start set (no restart since, no main process ended). One property read
    /// where [`facts`](UnitManager::facts) makes five, for each of 3,000 units started on one
    /// machine. The default reads the facts.
    fn since(
        &self,
        name: &UnitName,
    ) -> impl Future<Output = Result<Option<u64>, ManagerError>> + Send {
        async move { Ok(self.facts(name).await?.since) }
    }

    /// What happened to `name` in systemd lately, which [`UnitManager::status`] does not say:
    /// how often systemd's own `Restart=` restarted it, when it entered its current
    /// ActiveState, and how its main process last ended. A few property reads: the agent reads
    /// them only of units whose state changed, never of every unit on every pass. The default
    /// reads [`UnitManager::details`] and knows no restarts and no time.
    fn facts(
        &self,
        name: &UnitName,
    ) -> impl Future<Output = Result<UnitFacts, ManagerError>> + Send {
        async move {
            let d = self.details(name).await?;
            Ok(UnitFacts {
                result: d.result,
                main_exit: d.main_exit,
                ..UnitFacts::default()
            })
        }
    }

    /// Where systemd's definition of `name` comes from: fleet's units directory, an operator's
    /// file of the same name elsewhere (which fleet must never stop, replace or relink), or no
    /// file at all (unknown to systemd, or loaded from a file that is gone since). Reads one
    /// property; the real adapter looks at the file off the async threads.
    fn source(
        &self,
        name: &UnitName,
    ) -> impl Future<Output = Result<UnitSource, ManagerError>> + Send;

    /// A new receiver of change hints. Its first hint is [`Change::Resync`]; after that, hints
    /// come from systemd's signals: a unit's ActiveState/SubState changed, a job ended, a
    /// daemon-reload finished. Hints are coalesced, never queued without bound, name any unit
    /// (not only fleet's) and may be spurious or (rarely) missed: the agent still resyncs
    /// periodically. The receiver ends when the manager is gone or its connection is lost.
    fn changes(&self) -> ChangeReceiver;
}

/// One file of the units directory.
#[derive(Debug)]
pub struct InstalledUnit {
    pub name: UnitName,
    /// Hash of the file's canonical text, or why the file could not be read or parsed.
    pub content: Result<UnitHash, UnitFileError>,
    /// Whether systemd's runtime unit directory links this name to this file.
    pub linked: bool,
}

/// Why a file in the units directory has no hash.
#[derive(Debug, thiserror::Error)]
pub enum UnitFileError {
    #[error("reading unit file")]
    Read(#[source] io::Error),
    #[error("parsing unit file")]
    Parse(#[source] ParseError),
}

/// The kind of job [`UnitManager::start`] and [`UnitManager::stop`] queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum JobKind {
    Start,
    Stop,
}

impl fmt::Display for JobKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Start => "start",
            Self::Stop => "stop",
        })
    }
}

/// How a job ended: the `result` of systemd's `JobRemoved` signal (systemd 262's set), plus
/// [`JobOutcome::NotLoaded`] for a stop with nothing to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobOutcome {
    /// `done`: the job succeeded (also when the unit already was in the wanted state).
    Done,
    /// Stop only: systemd has no such unit loaded, so there was nothing to stop.
    NotLoaded,
    /// `canceled`: another job replaced this one before it finished.
    Canceled,
    /// `timeout`: systemd's own job timeout hit.
    Timeout,
    /// `failed`: the unit failed (for a start: it did not come up).
    Failed,
    /// `dependency`: a required dependency failed.
    Dependency,
    /// `skipped`: not applicable to the unit's state.
    Skipped,
    /// `invalid`: the job type does not apply to the unit's state.
    Invalid,
    /// `assert`: an `Assert*=` condition failed.
    Assert,
    /// `unsupported`: the unit type is not supported here.
    Unsupported,
    /// `collected`: the job was garbage-collected before it ran.
    Collected,
    /// `once`: the unit can be activated only once and already was.
    Once,
    /// `frozen`: the unit is frozen.
    Frozen,
    /// `concurrency`: a slice's concurrency limit refused the job (newer systemd).
    Concurrency,
}

impl JobOutcome {
    /// systemd's word for the result, as in `JobRemoved`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::NotLoaded => "not-loaded",
            Self::Canceled => "canceled",
            Self::Timeout => "timeout",
            Self::Failed => "failed",
            Self::Dependency => "dependency",
            Self::Skipped => "skipped",
            Self::Invalid => "invalid",
            Self::Assert => "assert",
            Self::Unsupported => "unsupported",
            Self::Collected => "collected",
            Self::Once => "once",
            Self::Frozen => "frozen",
            Self::Concurrency => "concurrency",
        }
    }

    /// Parses `JobRemoved`'s result; `None` for a word systemd 262 does not use.
    pub fn from_job_result(result: &str) -> Option<JobOutcome> {
        Some(match result {
            "done" => Self::Done,
            "canceled" => Self::Canceled,
            "timeout" => Self::Timeout,
            "failed" => Self::Failed,
            "dependency" => Self::Dependency,
            "skipped" => Self::Skipped,
            "invalid" => Self::Invalid,
            "assert" => Self::Assert,
            "unsupported" => Self::Unsupported,
            "collected" => Self::Collected,
            "once" => Self::Once,
            "frozen" => Self::Frozen,
            "concurrency" => Self::Concurrency,
            _ => return None,
        })
    }

    /// Whether the unit reached the job's state: `Done`, or `NotLoaded` for a stop.
    pub fn is_success(self) -> bool {
        match self {
            Self::Done | Self::NotLoaded => true,
            Self::Canceled
            | Self::Timeout
            | Self::Failed
            | Self::Dependency
            | Self::Skipped
            | Self::Invalid
            | Self::Assert
            | Self::Unsupported
            | Self::Collected
            | Self::Once
            | Self::Frozen
            | Self::Concurrency => false,
        }
    }
}

impl fmt::Display for JobOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Per-unit properties [`UnitManager::details`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitDetails {
    pub state: SystemdState,
    /// The file systemd loaded the unit from; for a linked unit, the symlink in
    /// `/run/systemd/system`. `None` when systemd found no file.
    pub fragment_path: Option<PathBuf>,
    /// Drop-ins in effect (only current after a daemon-reload).
    pub drop_in_paths: Vec<PathBuf>,
    /// The file or drop-ins changed since systemd loaded them.
    pub need_daemon_reload: bool,
    /// The main process of a service; `None` for other unit types or when none runs.
    pub main_pid: Option<u32>,
    /// The current invocation's ID in lowercase hex; `None` when never started.
    pub invocation_id: Option<String>,
    /// A service's `Result`: `success`, or why it last failed (`exit-code`, `signal`,
    /// `timeout`, `start-limit-hit`, ...). `None` for other unit types.
    pub result: Option<String>,
    /// How a service's last main process ended; `None` before one did, or not a service.
    pub main_exit: Option<MainExit>,
}

/// What [`UnitManager::reload_facts`] reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadFacts {
    /// Drop-ins in effect (only current after a daemon-reload).
    pub drop_in_paths: Vec<PathBuf>,
    /// The file or drop-ins changed since systemd loaded them.
    pub need_daemon_reload: bool,
}

/// What [`UnitManager::facts`] reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitFacts {
    /// systemd's `NRestarts`: how many times `Restart=` restarted the service since it was
    /// last started by a job (systemd starts counting again then). 0 for other unit types.
    pub n_restarts: u32,
    /// systemd's `StateChangeTimestamp`: when the unit entered its current ActiveState, in
    /// microseconds since the epoch; `None` when it never changed.
    pub since: Option<u64>,
    /// A service's `Result` (`success`, `exit-code`, `signal`, ...); `None` for other types.
    pub result: Option<String>,
    /// How the service's last main process ended; `None` while one runs (systemd forgets the
    /// previous one's end when it starts the next) or before any ended.
    pub main_exit: Option<MainExit>,
}

/// How a service's main process ended: systemd's `ExecMainCode` (a `CLD_*` code) and
/// `ExecMainStatus` (the exit status, or the signal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MainExit {
    Exited(i32),
    Killed(i32),
    Dumped(i32),
}

impl MainExit {
    /// From `ExecMainCode` and `ExecMainStatus`; `None` while nothing exited (code 0).
    pub fn from_code(code: i32, status: i32) -> Option<MainExit> {
        match code {
            1 => Some(Self::Exited(status)),
            2 => Some(Self::Killed(status)),
            3 => Some(Self::Dumped(status)),
            _ => None,
        }
    }
}

impl fmt::Display for MainExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exited(status) => write!(f, "exit status {status}"),
            Self::Killed(signal) => write!(f, "killed by signal {signal}"),
            Self::Dumped(signal) => write!(f, "killed by signal {signal}, core dumped"),
        }
    }
}

/// Where systemd loaded a unit from, as [`UnitManager::source`] tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitSource {
    /// No file defines the unit: systemd does not know it, or the file it loaded is gone
    /// (e.g. ours, removed before a reload). Nothing of an operator's to protect.
    NoFile,
    /// fleet's units directory, directly or through the runtime link to its file.
    UnitsDir,
    /// A file outside the units directory that still exists: an operator's own unit.
    Foreign { fragment: PathBuf },
}

/// An error systemd or the bus gave. Adapter-neutral so the trait does not name zbus.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// systemd answered with a D-Bus error, e.g. `org.freedesktop.systemd1.NoSuchUnit`.
    #[error("{name}: {message}")]
    Method { name: String, message: String },
    /// No usable answer: the connection failed or closed, a call timed out, a reply did not
    /// decode.
    #[error("D-Bus transport failed")]
    Transport(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl BusError {
    /// The D-Bus error name systemd gives for an unknown or unloaded unit.
    pub const NO_SUCH_UNIT: &'static str = "org.freedesktop.systemd1.NoSuchUnit";

    /// Whether systemd said it has no such unit loaded.
    pub fn is_no_such_unit(&self) -> bool {
        match self {
            Self::Method { name, .. } => name == Self::NO_SUCH_UNIT,
            Self::Transport(_) => false,
        }
    }
}

/// Everything [`UnitManager`] can fail with; one variant per operation.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("connecting to systemd")]
    Connect(#[source] BusError),
    #[error("subscribing to systemd's signals")]
    Subscribe(#[source] BusError),
    #[error("creating units directory {}", path.display())]
    CreateUnitsDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("listing units directory {}", path.display())]
    ListUnitsDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing unit file {}", path.display())]
    WriteUnitFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("removing unit file {}", path.display())]
    RemoveUnitFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("linking {unit} into systemd")]
    Link {
        unit: UnitName,
        #[source]
        source: BusError,
    },
    #[error("enabling {unit}")]
    Enable {
        unit: UnitName,
        #[source]
        source: BusError,
    },
    #[error("disabling {unit}")]
    Disable {
        unit: UnitName,
        #[source]
        source: BusError,
    },
    #[error("resetting the failed state of {unit}")]
    ResetFailed {
        unit: UnitName,
        #[source]
        source: BusError,
    },
    #[error("reloading systemd")]
    Reload(#[source] BusError),
    #[error("arming the fence {timer}")]
    ArmFence {
        timer: String,
        #[source]
        source: BusError,
    },
    #[error("disarming the fence {timer}")]
    DisarmFence {
        timer: String,
        #[source]
        source: BusError,
    },
    #[error("listing the fences armed before")]
    ListFences(#[source] BusError),
    #[error("killing {unit}")]
    Kill {
        unit: UnitName,
        #[source]
        source: BusError,
    },
    #[error("queueing a {kind} job for {unit}")]
    QueueJob {
        kind: JobKind,
        unit: UnitName,
        #[source]
        source: BusError,
    },
    #[error("{kind} job for {unit} gave no result within {waited:?}")]
    JobTimeout {
        kind: JobKind,
        unit: UnitName,
        waited: Duration,
    },
    #[error("lost systemd's job signals while waiting for the {kind} job of {unit}")]
    JobSignalsLost { kind: JobKind, unit: UnitName },
    #[error("{kind} job for {unit} ended with result {result:?}, unknown to this agent")]
    UnknownJobResult {
        kind: JobKind,
        unit: UnitName,
        result: String,
    },
    #[error("reading the states of {count} units")]
    Status {
        count: usize,
        #[source]
        source: BusError,
    },
    #[error("reading the properties of {unit}")]
    Details {
        unit: UnitName,
        #[source]
        source: BusError,
    },
    #[error("reading where systemd loaded {unit} from")]
    Source {
        unit: UnitName,
        #[source]
        source: BusError,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_results_round_trip_through_their_systemd_words() {
        let all = [
            JobOutcome::Done,
            JobOutcome::Canceled,
            JobOutcome::Timeout,
            JobOutcome::Failed,
            JobOutcome::Dependency,
            JobOutcome::Skipped,
            JobOutcome::Invalid,
            JobOutcome::Assert,
            JobOutcome::Unsupported,
            JobOutcome::Collected,
            JobOutcome::Once,
            JobOutcome::Frozen,
            JobOutcome::Concurrency,
        ];
        for outcome in all {
            assert_eq!(JobOutcome::from_job_result(outcome.as_str()), Some(outcome));
        }
        assert_eq!(JobOutcome::from_job_result("not-loaded"), None);
        assert_eq!(JobOutcome::from_job_result("exploded"), None);
    }

    #[test]
    fn main_exits_read_systemds_codes() {
        assert_eq!(MainExit::from_code(0, 0), None);
        let exited = MainExit::from_code(1, 3).unwrap();
        assert_eq!(exited.to_string(), "exit status 3");
        let killed = MainExit::from_code(2, 9).unwrap();
        assert_eq!(killed.to_string(), "killed by signal 9");
        assert_eq!(
            MainExit::from_code(3, 11).unwrap().to_string(),
            "killed by signal 11, core dumped"
        );
    }

    #[test]
    fn only_done_and_not_loaded_count_as_success() {
        assert!(JobOutcome::Done.is_success());
        assert!(JobOutcome::NotLoaded.is_success());
        assert!(!JobOutcome::Failed.is_success());
        assert!(!JobOutcome::Canceled.is_success());
        assert!(!JobOutcome::Dependency.is_success());
    }

    #[test]
    fn recognizes_systemds_no_such_unit_error() {
        let err = BusError::Method {
            name: BusError::NO_SUCH_UNIT.to_owned(),
            message: "Unit a.service not loaded.".to_owned(),
        };
        assert!(err.is_no_such_unit());
        let other = BusError::Method {
            name: "org.freedesktop.DBus.Error.AccessDenied".to_owned(),
            message: "nope".to_owned(),
        };
        assert!(!other.is_no_such_unit());
    }
}
