//! `load`, `start`, `stop`, `unload`, `restart`: change desired states through the cluster
//! (which re-reads on a concurrent change), then wait for the cluster to get there unless
//! `--no-block`.
//!
//! Unlike fleet, `load` never stops a launched unit (fleet #1428): it only raises a unit's
//! desired state; `stop` is the command that stops. Unlike fleet, a blocking command waits
//! for the state it promises even when the unit already had that desired state (fleet
//! returned at once, silently, although the unit was not running).

use crate::plan::{self, Action, Placement, Prepared, Request, Step, Then, View};
use anyhow::Result;
use fleet_core::{DesiredState, MachineId, UnitName};
use fleet_ops::{Cluster, ReplaceHow, Restarted, StateChange, UnitView};
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};

use super::submit::{self, Verb};
use super::wait::{Block, Goal, wait_for};
use super::{Ctx, fail_if_any, unit_names};

/// The desired state `verb` asks for.
pub fn target_of(verb: Verb) -> DesiredState {
    match verb {
        Verb::Submit => DesiredState::Inactive,
        Verb::Load => DesiredState::Loaded,
        Verb::Start => DesiredState::Launched,
    }
}

/// `load` / `start`: create what is missing, replace what differs (with `--replace`), raise
/// desired states, wait. Parse and prepare (each unit read with its file and placement),
/// decide (`plan::decide`, pure), apply, wait, report.
pub async fn load_or_start<C: Cluster>(
    ctx: &mut Ctx<C>,
    args: &[String],
    replace: bool,
    verb: Verb,
    block: Block,
    how: ReplaceHow,
) -> Result<()> {
    let request = Request {
        target: target_of(verb),
        wait: block != Block::No,
    };
    // A local file that differs was warned about; load and start go on with the registry's.
    let submit::Resolved {
        prepared,
        mut files,
        ..
    } = submit::resolve(ctx, args, replace, verb)
        .await
        .map_err(|e| e.context("Error creating units"))?;
    let cluster = ctx.cluster.clone();
    // What the decision needs was read with the units: where replaced ones run, and the files
    // that tell kept units global.
    let needs = plan::needs(&prepared, request);
    let replacing = prepared.iter().filter_map(|p| match &p.action {
        Action::Replace { existing, .. } => Some(existing),
        Action::Create(_) | Action::Keep(_) => None,
    });
    let view = View {
        placed: plan::placed(replacing, &needs.placements),
        files: needs
            .files
            .keys()
            .filter_map(|hash| files.remove_entry(hash))
            .collect(),
    };
    let before = view.placed.clone();
    let steps = plan::decide(prepared, &view, request);
    let replaced: Vec<UnitName> = steps
        .iter()
        .filter(|s| matches!(s.action, Action::Replace { .. }))
        .map(|s| s.name.clone())
        .collect();
    let mut goals = BTreeMap::new();
    let mut failures = Vec::new();
    for (name, then, res) in apply(&cluster, steps, request.target, &how).await {
        match (res, then) {
            (Err(e), _) => failures.push((name, e)),
            (Ok(()), Then::Nothing) => {}
            (Ok(()), Then::Triggered) => ctx.say(format!(
                "Triggered unit {name} {}",
                match request.target {
                    DesiredState::Launched => "start",
                    DesiredState::Loaded | DesiredState::Inactive => "load",
                }
            )),
            (Ok(()), Then::Global) => ctx.say(format!("Unit {name} {}", request.target)),
            (Ok(()), Then::Wait) => {
                goals.insert(name, Goal::of(request.target));
            }
        }
    }
    fail_if_any(ctx, "Error updating", failures)?;
    // Placements are reported for the replaced units that were waited for.
    let reported: Vec<UnitName> = replaced
        .into_iter()
        .filter(|n| goals.contains_key(n))
        .collect();
    wait_for(ctx, &cluster, goals, block).await?;
    let note = if how.no_restart {
        " without restart (the new version runs from the next restart)"
    } else {
        ""
    };
    report_placement(ctx, &cluster, &before, &reported, note).await
}

/// Writes each step's action, then raises a unit still below `target` (a kept one, or one
/// another client created first); returns each unit's step outcome, in argument order.
async fn apply<C: Cluster>(
    cluster: &C,
    steps: Vec<Step>,
    target: DesiredState,
    how: &ReplaceHow,
) -> Vec<(UnitName, Then, Result<()>)> {
    let thens: Vec<Then> = steps.iter().map(|s| s.then).collect();
    let prepared = steps
        .into_iter()
        .map(|s| Prepared {
            name: s.name,
            action: s.action,
        })
        .collect();
    let written = submit::apply(cluster, prepared, target, how).await;
    futures::stream::iter(written.into_iter().zip(thens))
        .map(|((name, res), then)| async move {
            let res = match res {
                Ok(unit) if unit.desired < target => cluster
                    .set_state(&name, StateChange::Raise(target))
                    .await
                    .map(drop)
                    .map_err(anyhow::Error::from),
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            };
            (name, then, res)
        })
        .buffered(32)
        .collect()
        .await
}

/// Says, for each replaced unit that was waited for, whether it stayed on its machine or
/// moved (and why it may have: `--reschedule` or new constraints).
async fn report_placement<C: Cluster>(
    ctx: &mut Ctx<C>,
    cluster: &C,
    before: &BTreeMap<UnitName, MachineId>,
    reported: &[UnitName],
    note: &str,
) -> Result<()> {
    if reported.is_empty() {
        return Ok(());
    }
    let names: BTreeSet<UnitName> = reported.iter().cloned().collect();
    let units = cluster.units(Some(&names)).await?;
    let now = plan::placed(units.units.iter().map(|u| &u.status), reported);
    let machines = cluster.machines().await?;
    let machines = super::machines_by_id(machines.machines);
    let legend = |m: &MachineId| super::machine_legend(m, &machines, false);
    for placement in plan::placements(reported, before, &now) {
        ctx.say(match placement {
            Placement::InPlace { name, machine } => {
                format!(
                    "Unit {name} replaced in place on {}{note}",
                    legend(&machine)
                )
            }
            Placement::Moved { name, from, to } => {
                format!(
                    "Unit {name} moved from {} to {}",
                    legend(&from),
                    legend(&to)
                )
            }
        });
    }
    Ok(())
}

/// `stop`: launched units become loaded; stopping an inactive unit is an error.
pub async fn stop<C: Cluster>(ctx: &mut Ctx<C>, args: &[String], block: Block) -> Result<()> {
    change_state(ctx, args, block, StateChange::Stop, DesiredState::Loaded).await
}

/// `unload`: every unit becomes inactive (unscheduled everywhere).
pub async fn unload<C: Cluster>(ctx: &mut Ctx<C>, args: &[String], block: Block) -> Result<()> {
    change_state(
        ctx,
        args,
        block,
        StateChange::Unload,
        DesiredState::Inactive,
    )
    .await
}

async fn change_state<C: Cluster>(
    ctx: &mut Ctx<C>,
    args: &[String],
    block: Block,
    change: StateChange,
    target: DesiredState,
) -> Result<()> {
    let names = unit_names(args)?;
    let cluster = ctx.cluster.clone();
    let results: Vec<(UnitName, Result<Option<UnitView>>)> = futures::stream::iter(names)
        .map(|name| {
            let cluster = cluster.clone();
            async move {
                let res = cluster.set_state(&name, change).await;
                (name, res.map_err(anyhow::Error::from))
            }
        })
        .buffered(32)
        .collect()
        .await;
    let mut goals = BTreeMap::new();
    let mut unchanged = BTreeSet::new();
    let mut failures = Vec::new();
    for (name, res) in results {
        match res {
            // Global units are said at once, not waited for: there is no one machine.
            Ok(Some(unit)) if block == Block::No || unit.global => {
                ctx.say(format!("Unit {name} {target}"));
            }
            Ok(Some(_)) => {
                goals.insert(name, Goal::of(target));
            }
            Ok(None) if block != Block::No => {
                unchanged.insert(name);
            }
            Ok(None) => {}
            Err(e) => failures.push((name, e)),
        }
    }
    fail_if_any(ctx, "Error changing state of", failures)?;
    // Already there, nothing written: a blocking command still waits for the state it
    // promises (a unit stopped in the registry may still be running somewhere).
    if !unchanged.is_empty() {
        let units = cluster.units(Some(&unchanged)).await?;
        for unit in units.units.into_iter().filter(|u| !u.global) {
            goals.insert(unit.status.name, Goal::of(target));
        }
    }
    wait_for(ctx, &cluster, goals, block).await
}

/// `restart`: a launched unit is restarted on every machine that runs it (stop, then start,
/// each awaited there); a loaded unit is started; an inactive one is an error.
pub async fn restart<C: Cluster>(ctx: &mut Ctx<C>, args: &[String], block: Block) -> Result<()> {
    let names = unit_names(args)?;
    let cluster = ctx.cluster.clone();
    let results: Vec<(UnitName, Result<Restarted>)> = futures::stream::iter(names)
        .map(|name| {
            let cluster = cluster.clone();
            async move {
                let res = cluster.restart(&name).await;
                (name, res.map_err(anyhow::Error::from))
            }
        })
        .buffered(32)
        .collect()
        .await;
    let mut goals = BTreeMap::new();
    let mut failures = Vec::new();
    for (name, res) in results {
        match res {
            Ok(_) if block == Block::No => ctx.say(format!("Triggered unit {name} restart")),
            Ok(Restarted::Generation(generation)) => {
                goals.insert(name, Goal::Restarted(generation));
            }
            Ok(Restarted::Launched) => {
                goals.insert(name, Goal::Launched);
            }
            Err(e) => failures.push((name, e)),
        }
    }
    fail_if_any(ctx, "Error restarting", failures)?;
    wait_for(ctx, &cluster, goals, block).await
}
