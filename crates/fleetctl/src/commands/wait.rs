//! Waiting for units to reach what a command asked, the way fleet's blocking commands do, on
//! the cluster's [`Cluster::watch`] of the waited-for units: a view of them, current again each
//! time it may have changed (the etcd side follows a watch instead of re-reading a whole
//! snapshot: 0.42 s for one blocking start at 10,000 units before; the API side polls). Each
//! unit is reported as it arrives, and an unscheduled unit's reason each time it changes.
//!
//! Ctrl-C ends the wait, not what was asked: the units keep the desired state the command
//! wrote, and fleetctl says so, says how to undo it, and exits 130 ([`Interrupted`]). On a
//! terminal a wait on several units shows a progress line on stderr ([`progress`]); piped, the
//! output is the same bytes as without it.

use anyhow::{Result, bail};
use fleet_core::{ActiveState, DesiredState, LoadState, UnitName};
use fleet_ops::{Changes, Cluster, StateView, WaitView};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use super::{Ctx, machine_legend};

pub(crate) mod progress;

use progress::{Progress, Stage};

/// One attempt of fleet's `--block-attempts` lasts this long.
pub const ATTEMPT: Duration = Duration::from_secs(2);

/// `--no-block` / `--block-attempts` as one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    No,
    Forever,
    Attempts(u32),
}

impl Block {
    pub fn from_flags(no_block: bool, attempts: u32) -> Block {
        match (no_block, attempts) {
            (true, _) => Block::No,
            (false, 0) => Block::Forever,
            (false, n) => Block::Attempts(n),
        }
    }

    pub fn deadline(self, start: Instant) -> Option<Instant> {
        match self {
            Block::No => Some(start),
            Block::Forever => None,
            Block::Attempts(n) => Some(start + ATTEMPT * n),
        }
    }
}

/// What a unit is waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Goal {
    /// Active on its machine, with the registry's hash.
    Launched,
    /// Present and not running on its machine, with the registry's hash.
    Loaded,
    /// Gone from every machine.
    Inactive,
    /// Restarted at least to this generation, and active, on every machine scheduled to run it.
    Restarted(u64),
}

impl Goal {
    pub fn of(state: DesiredState) -> Goal {
        match state {
            DesiredState::Inactive => Goal::Inactive,
            DesiredState::Loaded => Goal::Loaded,
            DesiredState::Launched => Goal::Launched,
        }
    }
}

enum Verdict {
    Pending,
    Reached(String),
    Failed(String),
}

/// `load/active/sub`, as the failure messages show a state.
fn words(state: &StateView) -> String {
    format!("{}/{}/{}", state.load, state.active, state.sub)
}

fn judge(snap: &WaitView, name: &UnitName, goal: Goal, full: bool) -> Verdict {
    let Some(unit) = snap.units.get(name) else {
        return match goal {
            Goal::Inactive => Verdict::Reached(format!("Unit {name} inactive")),
            Goal::Launched | Goal::Loaded | Goal::Restarted(_) => {
                Verdict::Failed(format!("Unit {name} was destroyed"))
            }
        };
    };
    let states = snap.states.get(name);
    if let Goal::Restarted(generation) = goal {
        return judge_restart(snap, name, generation, full);
    }
    if goal == Goal::Inactive {
        let gone = unit.machines.is_empty() && states.is_none_or(BTreeMap::is_empty);
        return if gone {
            Verdict::Reached(format!("Unit {name} inactive"))
        } else {
            Verdict::Pending
        };
    }
    let Some(machine) = unit.machines.first() else {
        return Verdict::Pending;
    };
    let Some(state) = states.and_then(|s| s.get(machine)) else {
        return Verdict::Pending;
    };
    if state.hash != Some(unit.hash) {
        return Verdict::Pending;
    }
    let legend = machine_legend(machine, &snap.machines, full);
    if LoadState::parse(&state.load).cannot_load() {
        return Verdict::Failed(format!(
            "Unit {name} cannot be loaded by systemd on {legend}: {}",
            words(state)
        ));
    }
    let active = ActiveState::parse(&state.active);
    match goal {
        Goal::Launched if active.satisfies_launched() => {
            Verdict::Reached(format!("Unit {name} launched on {legend}"))
        }
        Goal::Launched if active == ActiveState::Failed => Verdict::Failed(format!(
            "Unit {name} failed to start on {legend}: {}",
            words(state)
        )),
        // Loaded means nothing of it runs; a state this code does not know may still run.
        Goal::Loaded if !active.may_be_running() => {
            Verdict::Reached(format!("Unit {name} loaded on {legend}"))
        }
        Goal::Launched | Goal::Loaded | Goal::Inactive | Goal::Restarted(_) => Verdict::Pending,
    }
}

fn judge_restart(snap: &WaitView, name: &UnitName, generation: u64, full: bool) -> Verdict {
    let Some(unit) = snap.units.get(name).filter(|u| !u.machines.is_empty()) else {
        return Verdict::Pending;
    };
    let states = snap.states.get(name);
    let mut legends = Vec::new();
    for machine in &unit.machines {
        let Some(state) = states.and_then(|s| s.get(machine)) else {
            return Verdict::Pending;
        };
        let legend = machine_legend(machine, &snap.machines, full);
        if state.restart < generation {
            return Verdict::Pending;
        }
        match ActiveState::parse(&state.active) {
            ActiveState::Active => legends.push(legend),
            ActiveState::Failed => {
                return Verdict::Failed(format!(
                    "Unit {name} failed to restart on {legend}: {}",
                    words(state)
                ));
            }
            ActiveState::Reloading
            | ActiveState::Inactive
            | ActiveState::Activating
            | ActiveState::Deactivating
            | ActiveState::Maintenance
            | ActiveState::Refreshing
            | ActiveState::Unknown(_) => return Verdict::Pending,
        }
    }
    Verdict::Reached(format!("Unit {name} restarted on {}", legends.join(", ")))
}

/// Where a pending unit stands, for the progress line.
fn stage(snap: &WaitView, name: &UnitName, goal: Goal) -> Stage {
    let Some(unit) = snap.units.get(name) else {
        return Stage::Underway;
    };
    if goal == Goal::Inactive {
        return Stage::Underway;
    }
    if unit.unscheduled.is_some() {
        return Stage::CannotSchedule;
    }
    let Some(machine) = unit.machines.first() else {
        return Stage::NotScheduled;
    };
    match snap.states.get(name).and_then(|s| s.get(machine)) {
        Some(state) if state.hash == Some(unit.hash) => Stage::Underway,
        Some(_) | None => Stage::WaitingForMachine,
    }
}

/// The wait was interrupted (Ctrl-C); what was written stays, and the user was told so.
/// fleetctl exits 130, as a shell reports a command ended by SIGINT.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

/// How many units an interruption's lines name before `and N more`.
const NAMED_ON_INTERRUPT: usize = 5;

/// What an interrupted wait tells: the units still pending stay in the cluster with the
/// desired state this command gave them, the cluster goes on working towards it, and how to
/// undo it. One paragraph per desired state.
fn interrupted_text(goals: &BTreeMap<UnitName, Goal>) -> Vec<String> {
    let mut by_state: BTreeMap<DesiredState, Vec<&UnitName>> = BTreeMap::new();
    for (name, goal) in goals {
        let state = match goal {
            Goal::Launched | Goal::Restarted(_) => DesiredState::Launched,
            Goal::Loaded => DesiredState::Loaded,
            Goal::Inactive => DesiredState::Inactive,
        };
        by_state.entry(state).or_default().push(name);
    }
    let mut lines = vec!["Interrupted: stopped waiting; what was asked stays asked.".to_owned()];
    for (state, names) in by_state.iter().rev() {
        let many = names.len() > NAMED_ON_INTERRUPT;
        let mut listed: Vec<String> = names
            .iter()
            .take(NAMED_ON_INTERRUPT)
            .map(|n| n.to_string())
            .collect();
        let args = if many {
            "UNIT...".to_owned()
        } else {
            listed.join(" ")
        };
        if many {
            listed.push(format!("and {} more", names.len() - NAMED_ON_INTERRUPT));
        }
        let (unit, stays) = if names.len() == 1 {
            ("Unit", "stays")
        } else {
            ("Units", "stay")
        };
        lines.push(format!(
            "{unit} {} {stays} in the cluster with desired state {state}: the cluster goes on \
             working towards it.",
            listed.join(", ")
        ));
        lines.push(match state {
            DesiredState::Launched => format!(
                "To undo: `fleetctl stop {args}` (keeps it loaded) or `fleetctl destroy {args}` \
                 (removes it)."
            ),
            // Loaded by `load` (undone by unload) or by `stop` (undone by start).
            DesiredState::Loaded => format!(
                "To change it: `fleetctl start {args}`, `fleetctl unload {args}`, or \
                 `fleetctl destroy {args}` (removes it)."
            ),
            DesiredState::Inactive => format!(
                "To change it: `fleetctl start {args}`, or `fleetctl destroy {args}` (removes \
                 it)."
            ),
        });
    }
    lines
}

/// What a wait has said, and where it says more.
struct Said<'a, C> {
    ctx: &'a mut Ctx<C>,
    progress: &'a Progress,
    failures: &'a mut Vec<String>,
    /// The reason last told for each unit: a changed reason is told again.
    told_unscheduled: &'a mut BTreeMap<UnitName, String>,
}

impl<C> Said<'_, C> {
    /// Takes the units that reached their goal or failed out of `goals`, printing the first
    /// (with the progress line out of the way) and keeping the second for the end; tells
    /// each pending unit's unscheduled reason when it is new.
    fn report(&mut self, snap: &WaitView, goals: &mut BTreeMap<UnitName, Goal>) {
        goals.retain(|name, goal| match judge(snap, name, *goal, false) {
            Verdict::Pending => true,
            Verdict::Reached(line) => {
                self.progress.suspend(|| self.ctx.say(line));
                false
            }
            Verdict::Failed(line) => {
                self.failures.push(line);
                false
            }
        });
        for name in goals.keys() {
            let Some(reason) = snap.units.get(name).and_then(|u| u.unscheduled.as_ref()) else {
                continue;
            };
            if self.told_unscheduled.get(name) != Some(reason) {
                self.told_unscheduled.insert(name.clone(), reason.clone());
                let line = format!("Unit {name} cannot be scheduled yet: {reason}");
                self.progress.suspend(|| self.ctx.warn(line));
            }
        }
    }
}

/// The progress line is redrawn this often, for its clock, while nothing changes.
const TICK: Duration = Duration::from_secs(1);

/// Waits until every unit in `goals` reaches its goal, printing each as it arrives. Fails if a
/// unit fails or the block attempts run out; on Ctrl-C says what stays and fails with
/// [`Interrupted`]. On a terminal, a wait on several units draws a progress line on stderr.
pub async fn wait_for<C: Cluster>(
    ctx: &mut Ctx<C>,
    cluster: &C,
    goals: BTreeMap<UnitName, Goal>,
    block: Block,
) -> Result<()> {
    if block == Block::No || goals.is_empty() {
        return Ok(());
    }
    // SIGINT is caught from here on (not while writing: Ctrl-C then ends fleetctl as
    // before). Without a handler (it could not be installed) Ctrl-C ends fleetctl too.
    let mut sigint = signal(SignalKind::interrupt()).ok();
    let interrupt = async move {
        match sigint.as_mut() {
            Some(s) => drop(s.recv().await),
            None => std::future::pending().await,
        }
    };
    let progress = Progress::on_terminal(goals.len());
    wait_until(ctx, cluster, goals, block, interrupt, progress).await
}

/// [`wait_for`], interrupted when `interrupt` completes, drawing `progress`.
async fn wait_until<C: Cluster>(
    ctx: &mut Ctx<C>,
    cluster: &C,
    mut goals: BTreeMap<UnitName, Goal>,
    block: Block,
    interrupt: impl Future<Output = ()>,
    progress: Progress,
) -> Result<()> {
    if block == Block::No || goals.is_empty() {
        return Ok(());
    }
    let start = Instant::now();
    let deadline = block.deadline(start);
    let total = goals.len();
    let names: BTreeSet<UnitName> = goals.keys().cloned().collect();
    let mut view = cluster.watch(names.clone()).await?;
    let mut failures = Vec::new();
    let mut told_unscheduled = BTreeMap::new();
    let mut tick = tokio::time::interval_at(start + TICK, TICK);
    tokio::pin!(interrupt);
    loop {
        let snap = view.view();
        let mut said = Said {
            ctx: &mut *ctx,
            progress: &progress,
            failures: &mut failures,
            told_unscheduled: &mut told_unscheduled,
        };
        said.report(snap, &mut goals);
        if goals.is_empty() {
            break;
        }
        if progress.is_shown() {
            let pending: Vec<(UnitName, Stage)> = goals
                .iter()
                .map(|(name, goal)| (name.clone(), stage(snap, name, *goal)))
                .collect();
            let done = total - goals.len();
            progress.show(done, progress::line(done, total, start.elapsed(), &pending));
        }
        let timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = view.changed() => {
                // A watch that ended (etcd went away for a moment): read everything again.
                if changed.is_err() {
                    view = cluster.watch(names.clone()).await?;
                }
            }
            _ = timeout => {
                let names: Vec<String> = goals.keys().map(|n| n.to_string()).collect();
                failures.push(format!("Timed out waiting for units: {}", names.join(", ")));
                break;
            }
            () = &mut interrupt => {
                progress.clear();
                for f in &failures {
                    ctx.warn(f);
                }
                for line in interrupted_text(&goals) {
                    ctx.warn(line);
                }
                return Err(Interrupted.into());
            }
            _ = tick.tick(), if progress.is_shown() => {}
        }
    }
    progress.clear();
    match failures.len() {
        0 => Ok(()),
        1 => bail!("{}", failures[0]),
        _ => {
            for f in &failures {
                ctx.warn(f);
            }
            bail!("{} units did not reach their state", failures.len())
        }
    }
}

#[cfg(test)]
mod tests;
