//! `load`, `start`, `stop`, `unload`: set desired states (compare-and-swap, re-read on a
//! concurrent change), then wait for the cluster to get there unless `--no-block`.
//!
//! Unlike fleet, `load` never stops a launched unit (fleet #1428): it only raises a unit's
//! desired state; `stop` is the command that stops.

use anyhow::{Result, bail};
use fleet_core::{DesiredState, Requirements, UnitName};
use fleet_registry::kv::EtcdKv;
use fleet_registry::{Registry, RegistryError, Unit, UnitsRole};
use futures::StreamExt;
use std::collections::BTreeMap;

use super::submit::{self, Action, ReplaceHow, Verb};
use super::wait::{Block, Goal, wait_for};
use super::{Ctx, fail_if_any, unit_names};

/// How often a desired-state change re-reads a unit another client keeps changing.
const ATTEMPTS: usize = 5;

/// Sets `name`'s desired state with `decide(current) -> Option<new>` (None: leave it).
async fn set_desired(
    registry: &Registry<EtcdKv>,
    name: &UnitName,
    decide: impl Fn(&Unit) -> Result<Option<DesiredState>>,
) -> Result<Option<Unit>> {
    for _ in 0..ATTEMPTS {
        let Some(unit) = registry.unit(name).await? else {
            bail!("Unit {name} does not exist");
        };
        let Some(desired) = decide(&unit)? else {
            return Ok(None);
        };
        match UnitsRole::new(registry.clone())
            .set_desired(&unit, desired)
            .await
        {
            Ok(u) => return Ok(Some(u)),
            Err(RegistryError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(RegistryError::Conflict(name.clone()).into())
}

/// The desired state `verb` asks for.
pub fn target_of(verb: Verb) -> DesiredState {
    match verb {
        Verb::Submit => DesiredState::Inactive,
        Verb::Load => DesiredState::Loaded,
        Verb::Start => DesiredState::Launched,
    }
}

/// `load` / `start`: create what is missing, replace what differs (with `--replace`), raise
/// desired states, wait.
pub async fn load_or_start(
    ctx: &mut Ctx,
    args: &[String],
    replace: bool,
    verb: Verb,
    block: Block,
    mut how: ReplaceHow,
) -> Result<()> {
    let target = target_of(verb);
    let prepared = submit::prepare(ctx, args, replace, verb)
        .await
        .map_err(|e| e.context("Error creating units"))?;
    let replaced: Vec<UnitName> = prepared
        .iter()
        .filter(|p| matches!(p.action, Action::Replace { .. }))
        .map(|p| p.name.clone())
        .collect();
    if !replaced.is_empty() {
        let snap = ctx.registry.snapshot().await?;
        for name in &replaced {
            if let Some(machine) = snap.schedule.get(name).and_then(|m| m.keys().next()) {
                how.placed.insert(name.clone(), machine.clone());
            }
        }
    }
    let before = how.placed.clone();
    let mut created = BTreeMap::new();
    for p in &prepared {
        created.insert(p.name.clone(), !matches!(p.action, Action::Keep(_)));
    }
    let registry = ctx.registry.clone();
    let results = submit::apply(&registry, prepared, target, &how).await;
    let raised: Vec<(UnitName, Result<(Unit, bool)>)> = futures::stream::iter(results)
        .map(|(name, res)| {
            let registry = registry.clone();
            let changed = created[&name];
            async move {
                let res = match res {
                    Err(e) => Err(e),
                    Ok(unit) if unit.desired() >= target => Ok((unit, changed)),
                    Ok(unit) => match set_desired(&registry, &name, |u| {
                        Ok((u.desired() < target).then_some(target))
                    })
                    .await
                    {
                        Ok(Some(raised)) => Ok((raised, true)),
                        // Another client raised it first: wait for it all the same.
                        Ok(None) => Ok((unit, true)),
                        Err(e) => Err(e),
                    },
                };
                (name, res)
            }
        })
        .buffered(32)
        .collect()
        .await;
    let mut goals = BTreeMap::new();
    let mut failures = Vec::new();
    for (name, res) in raised {
        match res {
            Ok((unit, true)) => {
                if block == Block::No {
                    ctx.say(format!(
                        "Triggered unit {name} {}",
                        match target {
                            DesiredState::Launched => "start",
                            DesiredState::Loaded | DesiredState::Inactive => "load",
                        }
                    ));
                } else if is_global(&registry, &unit).await? {
                    ctx.say(format!("Unit {name} {target}"));
                } else {
                    goals.insert(name, Goal::of(target));
                }
            }
            Ok((_, false)) => {}
            Err(e) => failures.push((name, e)),
        }
    }
    fail_if_any(ctx, "Error updating", failures)?;
    let waited: Vec<UnitName> = goals.keys().cloned().collect();
    wait_for(ctx, &registry, goals, block).await?;
    let note = if how.no_restart {
        " without restart (the new version runs from the next restart)"
    } else {
        ""
    };
    report_placement(ctx, &registry, &before, &waited, &replaced, note).await
}

/// Says, for each replaced unit that was waited for, whether it stayed on its machine or
/// moved (and why it may have: `--reschedule` or new constraints).
async fn report_placement(
    ctx: &mut Ctx,
    registry: &Registry<EtcdKv>,
    before: &BTreeMap<UnitName, fleet_core::MachineId>,
    waited: &[UnitName],
    replaced: &[UnitName],
    note: &str,
) -> Result<()> {
    if replaced.is_empty() {
        return Ok(());
    }
    let snap = registry.snapshot().await?;
    for name in replaced.iter().filter(|n| waited.contains(n)) {
        let now = snap.schedule.get(name).and_then(|m| m.keys().next());
        match (before.get(name), now) {
            (Some(old), Some(new)) if old == new => ctx.say(format!(
                "Unit {name} replaced in place on {}{note}",
                super::machine_legend(new, &snap.machines, false)
            )),
            (Some(old), Some(new)) => ctx.say(format!(
                "Unit {name} moved from {} to {}",
                super::machine_legend(old, &snap.machines, false),
                super::machine_legend(new, &snap.machines, false)
            )),
            _ => {}
        }
    }
    Ok(())
}

async fn is_global(registry: &Registry<EtcdKv>, unit: &Unit) -> Result<bool> {
    let file = registry.unit_file(unit).await?;
    Ok(Requirements::from_unit(unit.name(), &file).global)
}

/// `stop`: launched units become loaded; stopping an inactive unit is an error.
pub async fn stop(ctx: &mut Ctx, args: &[String], block: Block) -> Result<()> {
    change_state(ctx, args, block, DesiredState::Loaded, |u| {
        match u.desired() {
            DesiredState::Inactive => bail!("Unable to stop unit {} in state inactive", u.name()),
            DesiredState::Loaded => Ok(None),
            DesiredState::Launched => Ok(Some(DesiredState::Loaded)),
        }
    })
    .await
}

/// `unload`: every unit becomes inactive (unscheduled everywhere).
pub async fn unload(ctx: &mut Ctx, args: &[String], block: Block) -> Result<()> {
    change_state(ctx, args, block, DesiredState::Inactive, |u| {
        Ok((u.desired() != DesiredState::Inactive).then_some(DesiredState::Inactive))
    })
    .await
}

async fn change_state(
    ctx: &mut Ctx,
    args: &[String],
    block: Block,
    target: DesiredState,
    decide: impl Fn(&Unit) -> Result<Option<DesiredState>> + Copy,
) -> Result<()> {
    let names = unit_names(args)?;
    let registry = ctx.registry.clone();
    let results: Vec<(UnitName, Result<Option<Unit>>)> = futures::stream::iter(names)
        .map(|name| {
            let registry = registry.clone();
            async move {
                let res = set_desired(&registry, &name, decide).await;
                (name, res)
            }
        })
        .buffered(32)
        .collect()
        .await;
    let mut goals = BTreeMap::new();
    let mut failures = Vec::new();
    for (name, res) in results {
        match res {
            Ok(Some(unit)) if block == Block::No || is_global(&registry, &unit).await? => {
                ctx.say(format!("Unit {name} {target}"));
            }
            Ok(Some(_)) => {
                goals.insert(name, Goal::of(target));
            }
            Ok(None) => {}
            Err(e) => failures.push((name, e)),
        }
    }
    fail_if_any(ctx, "Error changing state of", failures)?;
    wait_for(ctx, &registry, goals, block).await
}

/// `restart`: a launched unit is restarted on every machine that runs it (stop, then start,
/// each awaited there); a loaded unit is started; an inactive one is an error.
pub async fn restart(ctx: &mut Ctx, args: &[String], block: Block) -> Result<()> {
    let names = unit_names(args)?;
    let registry = ctx.registry.clone();
    let results: Vec<(UnitName, Result<Option<Goal>>)> = futures::stream::iter(names)
        .map(|name| {
            let registry = registry.clone();
            async move {
                let res = restart_one(&registry, &name).await;
                (name, res)
            }
        })
        .buffered(32)
        .collect()
        .await;
    let mut goals = BTreeMap::new();
    let mut failures = Vec::new();
    for (name, res) in results {
        match res {
            Ok(Some(_)) if block == Block::No => ctx.say(format!("Triggered unit {name} restart")),
            Ok(Some(goal)) => {
                goals.insert(name, goal);
            }
            Ok(None) => {}
            Err(e) => failures.push((name, e)),
        }
    }
    fail_if_any(ctx, "Error restarting", failures)?;
    wait_for(ctx, &registry, goals, block).await
}

async fn restart_one(registry: &Registry<EtcdKv>, name: &UnitName) -> Result<Option<Goal>> {
    let units = UnitsRole::new(registry.clone());
    for _ in 0..ATTEMPTS {
        let Some(unit) = registry.unit(name).await? else {
            bail!("Unit {name} does not exist");
        };
        let res = match unit.desired() {
            DesiredState::Inactive => bail!("Unable to restart unit {name} in state inactive"),
            DesiredState::Loaded => units
                .set_desired(&unit, DesiredState::Launched)
                .await
                .map(|_| Goal::Launched),
            DesiredState::Launched => units
                .request_restart(&unit)
                .await
                .map(|u| Goal::Restarted(u.record.restart)),
        };
        match res {
            Ok(done) => return Ok(Some(done)),
            Err(RegistryError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(RegistryError::Conflict(name.clone()).into())
}
