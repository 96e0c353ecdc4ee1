//! Runs a plan's tasks on a [`UnitManager`], in the order the planner sorted them, keeping the
//! promises of [`crate::manager`]: a unit's stop job is awaited before its file is removed or
//! rewritten, one daemon-reload serves the whole batch, and a failing unit fails alone (its
//! later tasks in this plan are skipped, the other units go on).

use fleet_core::{UnitFile, UnitHash, UnitName};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use tracing::{Instrument, info, info_span, warn};

use crate::manager::{JobOutcome, ManagerError, UnitManager};
use crate::plan::{Task, TaskKind};

/// How many units' tasks of one kind run at once (each may hold a D-Bus job; the real
/// adapter also caps calls in flight).
const CONCURRENCY: usize = 32;

/// Why one unit's task failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("{0} job ended {1}")]
    Job(TaskKind, JobOutcome),
    #[error("{0}")]
    Manager(TaskKind, #[source] ManagerError),
    #[error("no unit file {0} to load")]
    NoFile(UnitHash),
}

/// What a run did: units that failed (for backoff) and whether anything changed.
#[derive(Debug, Default)]
pub struct Outcome {
    pub failed: BTreeMap<UnitName, TaskError>,
    pub executed: usize,
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
        let runnable: Vec<Task> = tasks
            .into_iter()
            .filter(|t| kind == TaskKind::ReloadUnitFiles || !failed.contains(&t.unit))
            .collect();
        if kind == TaskKind::ReloadUnitFiles {
            if let Some(task) = runnable.into_iter().next() {
                outcome.executed += 1;
                if let Err(e) = run_task(manager, &task, desired_hash, files).await {
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
            if let Err(e) = res {
                outcome.failed.insert(unit, e);
            }
        }
    }
    outcome
}

async fn run_task<M: UnitManager>(
    manager: &M,
    task: &Task,
    desired_hash: &BTreeMap<UnitName, UnitHash>,
    files: &BTreeMap<UnitHash, UnitFile>,
) -> Result<(), TaskError> {
    let span = info_span!("task", unit = %task.unit, kind = %task.kind);
    async {
        info!(reason = %task.reason, "executing task");
        let res = run_task_inner(manager, task, desired_hash, files).await;
        match &res {
            Ok(()) => info!(reason = %task.reason, "task completed"),
            Err(e) => warn!(reason = %task.reason, error = %e, "task failed"),
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
                return Err(TaskError::Job(kind, out));
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
        TaskKind::Stop => job(kind, manager.stop(unit).await.map_err(mgr)?),
        TaskKind::Start => job(kind, manager.start(unit).await.map_err(mgr)?),
        TaskKind::Restart => {
            job(kind, manager.stop(unit).await.map_err(mgr)?)?;
            job(kind, manager.start(unit).await.map_err(mgr)?)
        }
    }
}

fn job(kind: TaskKind, out: JobOutcome) -> Result<(), TaskError> {
    if out.is_success() {
        Ok(())
    } else {
        Err(TaskError::Job(kind, out))
    }
}
