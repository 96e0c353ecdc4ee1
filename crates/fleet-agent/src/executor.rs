//! Runs a plan's tasks on a [`UnitManager`], each unit's in the order the planner sorted them,
//! keeping the promises of [`crate::manager`]: a unit's stop job is awaited before its file is
//! removed or rewritten, one daemon-reload serves the whole batch, and a failing unit fails
//! alone (its later tasks in this plan are skipped, the other units go on). Units do not wait
//! for each other, except for the one reload when a start needs it (see [`execute`]).
//!
//! Each task logs one line, when it is over, with its result: `task completed` (info) or
//! `task failed` (warn). A start that failed carries what systemd says of the unit (its
//! `Result` and its main process's exit status), read once, after the job ended. A start of
//! a unit that had failed since it last started is `restarted a unit that failed` (warn), with
//! that failure's `Result` and exit status, read before the start replaces them.

use fleet_core::{UnitFile, UnitHash, UnitName};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::fmt;
use tokio::sync::Semaphore;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::manager::{JobOutcome, MainExit, ManagerError, UnitManager};
use crate::metrics::TaskResult;
use crate::plan::{Reason, Task, TaskKind, reload_rank};
use crate::revivals;

/// How many units' tasks run at once, each holding a slot (each may hold a D-Bus job; the real
/// adapter also caps calls in flight, and a job waited for is not a call). 128 was tried
/// (issue 19): 3,000 units on one machine started in the same time (52.8 s at 32, 53.2 and
/// 56.3 s at 128, against 39-43 s for `systemctl start` of all of them), and on the
/// 3-machine cluster `start --replace` of 300 units took 2.34-2.43 s at 32 and 2.97-3.98 s
/// at 128: systemd works through a longer job queue more slowly. A stop job is waited for
/// without a slot (see [`needs_slot`]).
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

impl TaskError {
    /// The kind of the task that failed.
    pub fn kind(&self) -> TaskKind {
        match self {
            TaskError::Job(kind, ..) | TaskError::Manager(kind, _) => *kind,
            TaskError::NoFile(_) => TaskKind::Load,
        }
    }
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
    /// Units that had failed since they last started and were started again: what systemd
    /// said of that failure (issue 41's `failed` event of a unit that crashed).
    pub revived: BTreeMap<UnitName, Failure>,
}

/// One unit's tasks of a plan, in order: those before the plan's reload (`Unload`, `Load`)
/// and those after it (`Stop`, `Start`, `Restart`).
#[derive(Debug, Default)]
struct Chain {
    before: Vec<Task>,
    after: Vec<Task>,
    /// A running unit replaced by a new version of its file that starts again: its stop is
    /// awaited, then the new file is written over the old one, which stays linked. Disabling,
    /// resetting and relinking it (three more calls into systemd, each serialised in PID 1)
    /// would only undo what the load redoes.
    swap: bool,
}

/// How one unit's chain ended.
struct ChainEnd {
    unit: UnitName,
    results: Vec<(TaskKind, TaskResult)>,
    error: Option<TaskError>,
    /// The failure of a unit that had died, read before it was started again.
    revived: Option<Failure>,
}

/// Executes `tasks` (already sorted by kind); `files` holds the desired file of every unit to
/// load, by hash; `desired_hash` maps units to load to their hash.
///
/// Each unit's tasks run in order, as one chain, and the chains of different units run
/// concurrently, [`CONCURRENCY`] tasks at once, except that stops are all queued at once
/// (as `systemctl stop` of them all would): no unit waits for another's stop. The only
/// barrier is the plan's one daemon-reload, and only when a start needs it: every chain
/// runs its tasks before the reload, then the reload runs once, then the tasks after it. A
/// reload that only forgets removed units (`UnitFileRemoved`) holds nothing back: it runs
/// once every chain is over.
pub async fn execute<M: UnitManager>(
    manager: &M,
    tasks: Vec<Task>,
    desired_hash: &BTreeMap<UnitName, UnitHash>,
    files: &BTreeMap<UnitHash, UnitFile>,
) -> Outcome {
    let mut reload = None;
    let mut chains: BTreeMap<UnitName, Chain> = BTreeMap::new();
    for t in tasks {
        match t.kind {
            TaskKind::ReloadUnitFiles => {
                reload.get_or_insert(t);
            }
            TaskKind::Unload | TaskKind::Load => {
                chains.entry(t.unit.clone()).or_default().before.push(t)
            }
            TaskKind::Stop | TaskKind::Start | TaskKind::Restart => {
                chains.entry(t.unit.clone()).or_default().after.push(t)
            }
        }
    }
    for chain in chains.values_mut() {
        chain.swap = is_swap(chain);
    }
    let written: Vec<UnitName> = chains
        .iter()
        .filter(|(_, c)| !c.before.is_empty())
        .map(|(unit, _)| unit.clone())
        .collect();
    let ctx = Ctx {
        manager,
        desired_hash,
        files,
        slots: Semaphore::new(CONCURRENCY),
    };
    let mut outcome = Outcome::default();
    let barrier = reload
        .as_ref()
        .is_some_and(|r| r.reason != Reason::UnitFileRemoved);
    if !barrier {
        let whole = chains.into_iter().map(|(unit, mut c)| {
            c.before.append(&mut c.after);
            (unit, c)
        });
        run_chains(&ctx, whole.collect(), &mut outcome).await;
        if let Some(task) = reload {
            run_reload(&ctx, task, &written, &mut outcome).await;
        }
        return outcome;
    }
    let mut after = BTreeMap::new();
    let before = chains
        .into_iter()
        .map(|(unit, mut c)| {
            after.insert(unit.clone(), std::mem::take(&mut c.after));
            (unit, c)
        })
        .collect();
    run_chains(&ctx, before, &mut outcome).await;
    if let Some(task) = reload {
        run_reload(&ctx, task, &written, &mut outcome).await;
    }
    let after = after
        .into_iter()
        .filter(|(_, tasks)| !tasks.is_empty())
        .filter_map(|(unit, tasks)| {
            if outcome.failed.contains_key(&unit) {
                let skipped = tasks.iter().map(|t| (t.kind, TaskResult::Skipped));
                outcome.results.extend(skipped);
                return None;
            }
            let chain = Chain {
                before: tasks,
                ..Chain::default()
            };
            Some((unit, chain))
        })
        .collect();
    run_chains(&ctx, after, &mut outcome).await;
    outcome
}

/// What every task of a run needs.
struct Ctx<'a, M> {
    manager: &'a M,
    desired_hash: &'a BTreeMap<UnitName, UnitHash>,
    files: &'a BTreeMap<UnitHash, UnitFile>,
    /// [`CONCURRENCY`] slots, one held by each task that makes calls or waits for a start.
    slots: Semaphore,
}

impl<M> Ctx<'_, M> {
    async fn slot(&self) -> tokio::sync::SemaphorePermit<'_> {
        match self.slots.acquire().await {
            Ok(permit) => permit,
            Err(_) => unreachable!("the slots are never closed"),
        }
    }
}

/// Whether a task holds a slot for all of its run. A stop (and an unload's stop, which takes
/// a slot only for the calls after it) is one call and then a wait: systemd runs queued stops
/// side by side, where a long queue of starts makes it slower (see [`CONCURRENCY`]). In a
/// 300-unit destroy on 3 machines, each machine's last stop was queued 0.86-1.31 s after the
/// command with a slot per stop, 0.30-0.63 s without. An unload must not hold a slot here: it
/// takes one itself for its uninstall.
fn needs_slot(kind: TaskKind) -> bool {
    !matches!(kind, TaskKind::Stop | TaskKind::Unload)
}

/// Whether `chain` replaces a unit's file and starts it again (see [`Chain::swap`]).
fn is_swap(chain: &Chain) -> bool {
    let unloads_for_new_hash = chain
        .before
        .iter()
        .any(|t| t.kind == TaskKind::Unload && matches!(t.reason, Reason::HashDiffers { .. }));
    let loads = chain.before.iter().any(|t| t.kind == TaskKind::Load);
    let starts = chain.after.iter().any(|t| t.kind == TaskKind::Start);
    unloads_for_new_hash && loads && starts
}

/// Runs each chain's `before` tasks in order, the chains concurrently; each task waits for
/// a slot when it [`needs_slot`].
async fn run_chains<M: UnitManager>(
    ctx: &Ctx<'_, M>,
    chains: Vec<(UnitName, Chain)>,
    outcome: &mut Outcome,
) {
    let ends: Vec<ChainEnd> = chains
        .into_iter()
        .map(|(unit, chain)| run_chain(ctx, unit, chain))
        .collect::<futures::stream::FuturesUnordered<_>>()
        .collect()
        .await;
    for end in ends {
        outcome.executed += end
            .results
            .iter()
            .filter(|(_, r)| *r != TaskResult::Skipped)
            .count();
        outcome.results.extend(end.results);
        if let Some(died) = end.revived {
            outcome.revived.insert(end.unit.clone(), died);
        }
        if let Some(e) = end.error {
            outcome.failed.insert(end.unit, e);
        }
    }
}

/// One unit's tasks, in order; after a failure the rest are skipped.
async fn run_chain<M: UnitManager>(ctx: &Ctx<'_, M>, unit: UnitName, chain: Chain) -> ChainEnd {
    let mut end = ChainEnd {
        unit,
        results: Vec::with_capacity(chain.before.len()),
        error: None,
        revived: None,
    };
    for task in &chain.before {
        if end.error.is_some() {
            end.results.push((task.kind, TaskResult::Skipped));
            continue;
        }
        let slot = match needs_slot(task.kind) {
            true => Some(ctx.slot().await),
            false => None,
        };
        let (res, died) = run_task(ctx, task, chain.swap).await;
        drop(slot);
        if res.is_ok() && died.is_some() {
            end.revived = died;
        }
        end.results.push((task.kind, result_of(&res)));
        end.error = res.err();
    }
    end
}

/// Whether systemd still holds an old definition of a unit whose file this plan wrote or
/// removed. A stopped unit is garbage-collected, so a start loads its new file on demand and
/// the reload (global, 0.2-0.7 s with a few hundred units) would only repeat that. One call
/// says which of the units systemd holds at all (a unit it does not hold cannot be stale);
/// reading a unit's properties loads it, so only those held are read, one property read each.
/// A read that fails counts as stale (reload, fail safe).
async fn any_stale<M: UnitManager>(ctx: &Ctx<'_, M>, units: &[UnitName]) -> bool {
    let manager = ctx.manager;
    let held: Vec<UnitName> = match manager.loaded(units).await {
        Ok(held) => held.into_iter().collect(),
        Err(_) => units.to_vec(),
    };
    let stale: Vec<bool> = futures::stream::iter(held)
        .map(|unit| async move {
            match manager.reload_facts(&unit).await {
                Ok(facts) => facts.need_daemon_reload,
                Err(_) => true,
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    stale.into_iter().any(|s| s)
}

/// The plan's reload, unless it was planned only for files this plan wrote or removed and
/// systemd holds none of those units stale (then it is skipped).
async fn run_reload<M: UnitManager>(
    ctx: &Ctx<'_, M>,
    task: Task,
    written: &[UnitName],
    outcome: &mut Outcome,
) {
    if reload_rank(&task.reason) <= 1 && !any_stale(ctx, written).await {
        debug!(
            units = written.len(),
            "daemon-reload not needed: no unit holds an old file"
        );
        outcome.results.push((task.kind, TaskResult::Skipped));
        return;
    }
    outcome.executed += 1;
    let (res, _) = run_task(ctx, &task, false).await;
    outcome.results.push((task.kind, result_of(&res)));
    if let Err(e) = res {
        // A failed reload leaves every loaded unit in doubt: retry them all later.
        warn!(error = %e, "daemon-reload failed");
        outcome.failed.insert(task.unit.clone(), e);
    }
}

fn result_of(res: &Result<(), TaskError>) -> TaskResult {
    match res {
        Ok(()) => TaskResult::Succeeded,
        Err(_) => TaskResult::Failed,
    }
}

/// Runs `task`; with its result, what systemd said of the unit's failure when the task
/// started a unit that had died since it last started.
async fn run_task<M: UnitManager>(
    ctx: &Ctx<'_, M>,
    task: &Task,
    swap: bool,
) -> (Result<(), TaskError>, Option<Failure>) {
    let manager = ctx.manager;
    let span = info_span!("task", unit = %task.unit, kind = %task.kind);
    async {
        debug!(reason = %task.reason, "executing task");
        // A unit that died since it started: why, before starting it again replaces that.
        let died = match revivals::is_revival(task) {
            true => Some(failure(manager, &task.unit).await),
            false => None,
        };
        let res = run_task_inner(ctx, task, swap).await;
        match (&res, &died) {
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
        (res, died)
    }
    .instrument(span)
    .await
}

async fn run_task_inner<M: UnitManager>(
    ctx: &Ctx<'_, M>,
    task: &Task,
    swap: bool,
) -> Result<(), TaskError> {
    let (manager, desired_hash, files) = (ctx.manager, ctx.desired_hash, ctx.files);
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
            match swap {
                // The load that follows writes the new file over this one.
                true => Ok(()),
                false => {
                    let _slot = ctx.slot().await;
                    manager.uninstall(unit).await.map_err(mgr)
                }
            }
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
mod tests;
