//! Runs a plan's tasks on a [`UnitManager`], in the order the planner sorted them, keeping the
//! promises of [`crate::manager`]: a unit's stop job is awaited before its file is removed or
//! rewritten, one daemon-reload serves the whole batch, and a failing unit fails alone (its
//! later tasks in this plan are skipped, the other units go on).
//!
//! Each task logs one line, when it is over, with its result: `task completed` (info) or
//! `task failed` (warn). A start that failed carries what systemd says of the unit (its
//! `Result` and its main process's exit status), read once, after the job ended. A start of
//! a unit that had failed since it last started is `restarted a unit that failed` (warn), with
//! that failure's `Result` and exit status, read before the start replaces them.

use fleet_core::{UnitFile, UnitHash, UnitName};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::manager::{JobOutcome, MainExit, ManagerError, UnitManager};
use crate::metrics::TaskResult;
use crate::plan::{Task, TaskKind};
use crate::revivals;

/// How many units' tasks of one kind run at once (each may hold a D-Bus job; the real
/// adapter also caps calls in flight).
const CONCURRENCY: usize = 32;

/// Why one unit's task failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("{0} job ended {1}{2}")]
    Job(TaskKind, JobOutcome, Failure),
    #[error("{0}")]
    Manager(TaskKind, #[source] ManagerError),
    #[error("no unit file {0} to load")]
    NoFile(UnitHash),
}

/// What systemd says of a unit whose start failed; empty when it could not be read (or for a
/// stop).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Failure {
    /// The service's `Result` (`exit-code`, `signal`, `start-limit-hit`, ...).
    pub result: Option<String>,
    pub main_exit: Option<MainExit>,
}

impl fmt::Display for Failure {
    /// ` (result exit-code, exit status 1)`, or nothing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.result, &self.main_exit) {
            (Some(r), Some(e)) => write!(f, " (result {r}, {e})"),
            (Some(r), None) => write!(f, " (result {r})"),
            (None, Some(e)) => write!(f, " ({e})"),
            (None, None) => Ok(()),
        }
    }
}

/// What a run did: units that failed (for backoff) and whether anything changed.
#[derive(Debug, Default)]
pub struct Outcome {
    pub failed: BTreeMap<UnitName, TaskError>,
    pub executed: usize,
    /// How every task of the plan ended, for the metrics.
    pub results: Vec<(TaskKind, TaskResult)>,
}

/// Executes `tasks` (already sorted by kind); `files` holds the desired file of every unit to
/// load, by hash; `desired_hash` maps units to load to their hash.
pub async fn execute<M: UnitManager>(
    manager: &M,
    tasks: Vec<Task>,
    desired_hash: &BTreeMap<UnitName, UnitHash>,
    files: &BTreeMap<UnitHash, UnitFile>,
) -> Outcome {
    let mut outcome = Outcome::default();
    let mut by_kind: BTreeMap<TaskKind, Vec<Task>> = BTreeMap::new();
    for t in tasks {
        by_kind.entry(t.kind).or_default().push(t);
    }
    for (kind, tasks) in by_kind {
        let failed: BTreeSet<UnitName> = outcome.failed.keys().cloned().collect();
        let planned = tasks.len();
        let runnable: Vec<Task> = tasks
            .into_iter()
            .filter(|t| kind == TaskKind::ReloadUnitFiles || !failed.contains(&t.unit))
            .collect();
        let skipped = planned - runnable.len();
        outcome
            .results
            .extend(std::iter::repeat_n((kind, TaskResult::Skipped), skipped));
        if kind == TaskKind::ReloadUnitFiles {
            if let Some(task) = runnable.into_iter().next() {
                outcome.executed += 1;
                let res = run_task(manager, &task, desired_hash, files).await;
                outcome.results.push((kind, result_of(&res)));
                if let Err(e) = res {
                    // A failed reload leaves every loaded unit in doubt: retry them all later.
                    warn!(error = %e, "daemon-reload failed");
                    outcome.failed.insert(task.unit.clone(), e);
                }
            }
            continue;
        }
        let results: Vec<(UnitName, Result<(), TaskError>)> = futures::stream::iter(runnable)
            .map(|task| async move {
                let res = run_task(manager, &task, desired_hash, files).await;
                (task.unit, res)
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        for (unit, res) in results {
            outcome.executed += 1;
            outcome.results.push((kind, result_of(&res)));
            if let Err(e) = res {
                outcome.failed.insert(unit, e);
            }
        }
    }
    outcome
}

fn result_of(res: &Result<(), TaskError>) -> TaskResult {
    match res {
        Ok(()) => TaskResult::Succeeded,
        Err(_) => TaskResult::Failed,
    }
}

async fn run_task<M: UnitManager>(
    manager: &M,
    task: &Task,
    desired_hash: &BTreeMap<UnitName, UnitHash>,
    files: &BTreeMap<UnitHash, UnitFile>,
) -> Result<(), TaskError> {
    let span = info_span!("task", unit = %task.unit, kind = %task.kind);
    async {
        debug!(reason = %task.reason, "executing task");
        // A unit that died since it started: why, before starting it again replaces that.
        let died = match revivals::is_revival(task) {
            true => Some(failure(manager, &task.unit).await),
            false => None,
        };
        let res = run_task_inner(manager, task, desired_hash, files).await;
        match (&res, died) {
            (Ok(()), Some(died)) => warn!(
                reason = %task.reason,
                result = died.result.as_deref(),
                exit = died.main_exit.map(|x| x.to_string()),
                "restarted a unit that failed"
            ),
            (Ok(()), None) => info!(reason = %task.reason, "task completed"),
            (Err(e @ TaskError::Job(_, _, failure)), _) => warn!(
                reason = %task.reason,
                error = %e,
                result = failure.result.as_deref(),
                exit = failure.main_exit.map(|x| x.to_string()),
                "task failed"
            ),
            (Err(e), _) => warn!(reason = %task.reason, error = %e, "task failed"),
        }
        res
    }
    .instrument(span)
    .await
}

async fn run_task_inner<M: UnitManager>(
    manager: &M,
    task: &Task,
    desired_hash: &BTreeMap<UnitName, UnitHash>,
    files: &BTreeMap<UnitHash, UnitFile>,
) -> Result<(), TaskError> {
    let kind = task.kind;
    let unit = &task.unit;
    let mgr = |e| TaskError::Manager(kind, e);
    match kind {
        TaskKind::Unload => {
            // The stop job (ExecStop, ExecStopPost) must be over before the file goes.
            let out = manager.stop(unit).await.map_err(mgr)?;
            if !out.is_success() && out != JobOutcome::Failed {
                return Err(TaskError::Job(kind, out, Failure::default()));
            }
            manager.uninstall(unit).await.map_err(mgr)
        }
        TaskKind::Load => {
            let hash = desired_hash
                .get(unit)
                .expect("the planner loads only desired units");
            let file = files.get(hash).ok_or(TaskError::NoFile(*hash))?;
            manager.install(unit, file).await.map_err(mgr)
        }
        TaskKind::ReloadUnitFiles => manager.reload().await.map_err(mgr),
        TaskKind::Stop => stopped(kind, manager.stop(unit).await.map_err(mgr)?),
        TaskKind::Start => started(manager, kind, unit).await,
        TaskKind::Restart => {
            stopped(kind, manager.stop(unit).await.map_err(mgr)?)?;
            started(manager, kind, unit).await
        }
    }
}

fn stopped(kind: TaskKind, out: JobOutcome) -> Result<(), TaskError> {
    match out.is_success() {
        true => Ok(()),
        false => Err(TaskError::Job(kind, out, Failure::default())),
    }
}

/// Starts `unit`; a failed start job says why, as far as systemd can tell.
async fn started<M: UnitManager>(
    manager: &M,
    kind: TaskKind,
    unit: &UnitName,
) -> Result<(), TaskError> {
    let out = manager
        .start(unit)
        .await
        .map_err(|e| TaskError::Manager(kind, e))?;
    if out.is_success() {
        return Ok(());
    }
    Err(TaskError::Job(kind, out, failure(manager, unit).await))
}

/// What systemd says of `unit`'s failure; only these details are missing if the read fails.
async fn failure<M: UnitManager>(manager: &M, unit: &UnitName) -> Failure {
    match manager.details(unit).await {
        Ok(d) => Failure {
            result: d.result.filter(|r| r != "success"),
            main_exit: d.main_exit,
        },
        Err(_) => Failure::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeJob, FakeManager};
    use crate::manager::JobKind;
    use crate::plan::Reason;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    fn name(s: &str) -> UnitName {
        s.parse().unwrap()
    }

    /// The message, level and fields of each event at info or above.
    #[derive(Debug, Clone, Default)]
    struct Lines(Arc<Mutex<Vec<String>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Lines {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            struct Text(String);
            impl tracing::field::Visit for Text {
                fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn fmt::Debug) {
                    self.0.push_str(&format!(" {}={v:?}", f.name()));
                }
            }
            if *event.metadata().level() > tracing::Level::INFO {
                return;
            }
            let mut text = Text(event.metadata().level().to_string());
            event.record(&mut text);
            self.0.lock().unwrap().push(text.0);
        }
    }

    /// Loads and starts `unit` (its start ending `start`), returning the run and its log.
    async fn load_and_start(unit: &str, start: JobOutcome) -> (Outcome, Vec<String>) {
        let fake = FakeManager::new();
        let unit = name(unit);
        fake.set_job(JobKind::Start, &unit, FakeJob::Ends(start));
        let file = UnitFile::parse(b"[Service]\nExecStart=/bin/false\n").unwrap();
        let hashes = BTreeMap::from([(unit.clone(), file.hash())]);
        let files = BTreeMap::from([(file.hash(), file)]);
        let task = |kind, reason| Task {
            kind,
            unit: unit.clone(),
            reason,
        };
        let tasks = vec![
            task(TaskKind::Load, Reason::FileMissing),
            task(TaskKind::ReloadUnitFiles, Reason::UnitFileChanged),
            task(TaskKind::Start, Reason::LaunchAfterLoad),
        ];
        let lines = Lines::default();
        let subscriber = tracing_subscriber::registry().with(lines.clone());
        let _default = tracing::subscriber::set_default(subscriber);
        let outcome = execute(&fake, tasks, &hashes, &files).await;
        let log = lines.0.lock().unwrap().clone();
        (outcome, log)
    }

    #[tokio::test]
    async fn each_task_logs_one_line_with_its_result() {
        let (outcome, log) = load_and_start("web.service", JobOutcome::Done).await;
        assert!(outcome.failed.is_empty(), "{outcome:?}");
        assert_eq!(log.len(), 3, "{log:#?}");
        assert!(
            log.iter()
                .all(|l| l.starts_with("INFO message=task completed")),
            "{log:#?}"
        );
    }

    #[tokio::test]
    async fn restarting_a_unit_that_died_warns_once_with_why_it_died() {
        let fake = FakeManager::new();
        let unit = name("crashy.service");
        let file = UnitFile::parse(b"[Service]\nExecStart=/bin/crashy\n").unwrap();
        fake.put_unit(&unit, &file, true);
        fake.set_active(&unit, "failed", "failed");
        let task = Task {
            kind: TaskKind::Start,
            unit: unit.clone(),
            reason: Reason::DesiredLaunched {
                active: "failed".to_owned(),
            },
        };
        let lines = Lines::default();
        let subscriber = tracing_subscriber::registry().with(lines.clone());
        let _default = tracing::subscriber::set_default(subscriber);
        let none = BTreeMap::new();
        let outcome = execute(&fake, vec![task], &none, &BTreeMap::new()).await;
        assert!(outcome.failed.is_empty(), "{outcome:?}");
        let log = lines.0.lock().unwrap().clone();
        assert_eq!(log.len(), 1, "{log:#?}");
        assert!(
            log[0].starts_with("WARN message=restarted a unit that failed"),
            "{log:?}"
        );
        assert!(log[0].contains("result=\"exit-code\""), "{log:?}");
        assert!(log[0].contains("exit=\"exit status 1\""), "{log:?}");
    }

    #[tokio::test]
    async fn a_failed_start_carries_systemds_result_and_exit_status() {
        let (outcome, log) = load_and_start("bad.service", JobOutcome::Failed).await;
        let error = outcome.failed[&name("bad.service")].to_string();
        assert_eq!(
            error,
            "start job ended failed (result exit-code, exit status 1)"
        );
        let failed: Vec<&String> = log.iter().filter(|l| l.contains("task failed")).collect();
        assert_eq!(failed.len(), 1, "{log:#?}");
        assert!(failed[0].starts_with("WARN"), "{failed:?}");
        assert!(failed[0].contains("result=\"exit-code\""), "{failed:?}");
        assert!(failed[0].contains("exit=\"exit status 1\""), "{failed:?}");
        assert_eq!(log.len(), 3, "one line per task: {log:#?}");
    }
}
