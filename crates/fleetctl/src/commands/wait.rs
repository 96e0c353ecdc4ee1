//! Waiting for units to reach what a command asked, the way fleet's blocking commands do, but
//! on a watch instead of polling: the wait reads the registry once into a `LiveView`, applies
//! every change under the prefix to it, and reports each unit as it arrives. (It re-read a
//! whole snapshot on every change before: 0.42 s for one blocking start at 10,000 units.)

use anyhow::{Result, bail};
use fleet_core::{ActiveState, DesiredState, UnitName};
use fleet_registry::kv::EtcdKv;
use fleet_registry::{LiveView, PerMachine, Registry, Snapshot};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::time::Instant;

use super::{Ctx, machine_legend};

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

    fn deadline(self, start: Instant) -> Option<Instant> {
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

fn judge(snap: &Snapshot, name: &UnitName, goal: Goal, full: bool) -> Verdict {
    let Some(unit) = snap.units.get(name) else {
        return match goal {
            Goal::Inactive => Verdict::Reached(format!("Unit {name} inactive")),
            Goal::Launched | Goal::Loaded | Goal::Restarted(_) => {
                Verdict::Failed(format!("Unit {name} was destroyed"))
            }
        };
    };
    let scheduled = snap.schedule.get(name);
    let states = snap.states.get(name);
    if let Goal::Restarted(generation) = goal {
        return judge_restart(snap, name, generation, full);
    }
    if goal == Goal::Inactive {
        let gone =
            scheduled.is_none_or(PerMachine::is_empty) && states.is_none_or(PerMachine::is_empty);
        return if gone {
            Verdict::Reached(format!("Unit {name} inactive"))
        } else {
            Verdict::Pending
        };
    }
    let Some((machine, _)) = scheduled.and_then(|s| s.iter().next()) else {
        return Verdict::Pending;
    };
    let Some(state) = states.and_then(|s| s.get(machine)) else {
        return Verdict::Pending;
    };
    if state.hash != Some(unit.hash()) {
        return Verdict::Pending;
    }
    let legend = machine_legend(machine, &snap.machines, full);
    if state.systemd.load_state().cannot_load() {
        return Verdict::Failed(format!(
            "Unit {name} cannot be loaded by systemd on {legend}: {}/{}/{}",
            state.systemd.load, state.systemd.active, state.systemd.sub
        ));
    }
    let active = state.systemd.active_state();
    match goal {
        Goal::Launched if active == ActiveState::Active => {
            Verdict::Reached(format!("Unit {name} launched on {legend}"))
        }
        Goal::Launched if active == ActiveState::Failed => Verdict::Failed(format!(
            "Unit {name} failed to start on {legend}: {}/{}/{}",
            state.systemd.load, state.systemd.active, state.systemd.sub
        )),
        // Loaded means nothing of it runs; a state this code does not know may still run.
        Goal::Loaded if !active.may_be_running() => {
            Verdict::Reached(format!("Unit {name} loaded on {legend}"))
        }
        Goal::Launched | Goal::Loaded | Goal::Inactive | Goal::Restarted(_) => Verdict::Pending,
    }
}

fn judge_restart(snap: &Snapshot, name: &UnitName, generation: u64, full: bool) -> Verdict {
    let Some(machines) = snap.schedule.get(name).filter(|m| !m.is_empty()) else {
        return Verdict::Pending;
    };
    let states = snap.states.get(name);
    let mut legends = Vec::new();
    for machine in machines.keys() {
        let Some(state) = states.and_then(|s| s.get(machine)) else {
            return Verdict::Pending;
        };
        let legend = machine_legend(machine, &snap.machines, full);
        if state.restart < generation {
            return Verdict::Pending;
        }
        match state.systemd.active_state() {
            ActiveState::Active => legends.push(legend),
            ActiveState::Failed => {
                return Verdict::Failed(format!(
                    "Unit {name} failed to restart on {legend}: {}/{}/{}",
                    state.systemd.load, state.systemd.active, state.systemd.sub
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

/// Waits until every unit in `goals` reaches its goal, printing each as it arrives. Fails if a
/// unit fails or the block attempts run out.
pub async fn wait_for(
    ctx: &mut Ctx,
    registry: &Registry<EtcdKv>,
    mut goals: BTreeMap<UnitName, Goal>,
    block: Block,
) -> Result<()> {
    if block == Block::No || goals.is_empty() {
        return Ok(());
    }
    let deadline = block.deadline(Instant::now());
    let mut view = LiveView::start_without_files(registry.clone()).await?;
    let mut failures = Vec::new();
    let mut told_unscheduled = BTreeSet::new();
    loop {
        let snap = view.snapshot();
        goals.retain(|name, goal| match judge(snap, name, *goal, false) {
            Verdict::Pending => true,
            Verdict::Reached(line) => {
                ctx.say(line);
                false
            }
            Verdict::Failed(line) => {
                failures.push(line);
                false
            }
        });
        for name in goals.keys() {
            if let Some(reason) = snap.unscheduled.get(name)
                && told_unscheduled.insert(name.clone())
            {
                ctx.warn(format!("Unit {name} cannot be scheduled yet: {reason}"));
            }
        }
        if goals.is_empty() {
            break;
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
                    view = LiveView::start_without_files(registry.clone()).await?;
                }
            }
            _ = timeout => {
                let names: Vec<String> = goals.keys().map(|n| n.to_string()).collect();
                failures.push(format!("Timed out waiting for units: {}", names.join(", ")));
                break;
            }
        }
    }
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
