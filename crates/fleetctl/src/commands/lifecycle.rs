//! `load`, `start`, `stop`, `unload`: set desired states (compare-and-swap, re-read on a
//! concurrent change), then wait for the cluster to get there unless `--no-block`.
//!
//! Unlike fleet, `load` never stops a launched unit (fleet #1428): it only raises a unit's
//! desired state; `stop` is the command that stops.

use anyhow::{Result, bail};
use fleet_core::{DesiredState, Requirements, UnitFile, UnitHash, UnitName};
use fleet_registry::kv::EtcdKv;
use fleet_registry::{Registry, RegistryError, Unit, UnitsRole};
use futures::StreamExt;
use std::collections::BTreeMap;

use crate::ops::{self, Action, Needs, Placement, Prepared, Request, Step, Then, View};

use super::submit::{self, ReplaceHow, Verb};
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
/// desired states, wait. Parse and prepare, read the view once, decide (`ops::decide`, pure),
/// apply, wait, report.
pub async fn load_or_start(
    ctx: &mut Ctx,
    args: &[String],
    replace: bool,
    verb: Verb,
    block: Block,
    mut how: ReplaceHow,
) -> Result<()> {
    let request = Request {
        target: target_of(verb),
        wait: block != Block::No,
    };
    let prepared = submit::prepare(ctx, args, replace, verb)
        .await
        .map_err(|e| e.context("Error creating units"))?;
    let registry = ctx.registry.clone();
    let view = read_view(&registry, ops::needs(&prepared, request)).await?;
    let steps = ops::decide(prepared, &view, request);
    // `--reschedule` moves a replaced unit away from where it runs now.
    how.placed.extend(view.placed.clone());
    let replaced: Vec<UnitName> = steps
        .iter()
        .filter(|s| matches!(s.action, Action::Replace { .. }))
        .map(|s| s.name.clone())
        .collect();
    let mut goals = BTreeMap::new();
    let mut failures = Vec::new();
    for (name, then, res) in apply(&registry, steps, request.target, &how).await {
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
    wait_for(ctx, &registry, goals, block).await?;
    let note = if how.no_restart {
        " without restart (the new version runs from the next restart)"
    } else {
        ""
    };
    report_placement(ctx, &registry, &view.placed, &reported, note).await
}

/// Reads what `ops::decide` needs, once: one snapshot for the placements of replaced units,
/// and each file needed once, concurrently.
async fn read_view(registry: &Registry<EtcdKv>, needs: Needs) -> Result<View> {
    let mut view = View::default();
    if !needs.placements.is_empty() {
        let snap = registry.snapshot().await?;
        view.placed = ops::placed(&snap.schedule, &needs.placements);
    }
    view.files = files_of(registry, needs.files.into_values()).await?;
    Ok(view)
}

/// The files of `units`, each hash read once, the reads concurrent.
async fn files_of(
    registry: &Registry<EtcdKv>,
    units: impl IntoIterator<Item = Unit>,
) -> Result<BTreeMap<UnitHash, UnitFile>> {
    let mut by_hash = BTreeMap::new();
    for unit in units {
        by_hash.entry(unit.hash()).or_insert(unit);
    }
    let files: Vec<_> = futures::stream::iter(by_hash.into_values())
        .map(|unit| async move { registry.unit_file(&unit).await })
        .buffered(32)
        .collect()
        .await;
    let mut out = BTreeMap::new();
    for file in files {
        let file = file?;
        out.insert(file.hash(), file);
    }
    Ok(out)
}

/// Whether `unit` is global, by its file among `files`.
fn is_global(files: &BTreeMap<UnitHash, UnitFile>, unit: &Unit) -> bool {
    files
        .get(&unit.hash())
        .is_some_and(|file| Requirements::from_unit(unit.name(), file).global)
}

/// Writes each step's action, then raises a unit still below `target` (a kept one, or one
/// another client created first); returns each unit's step outcome, in argument order.
async fn apply(
    registry: &Registry<EtcdKv>,
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
    let written = submit::apply(registry, prepared, target, how).await;
    futures::stream::iter(written.into_iter().zip(thens))
        .map(|((name, res), then)| async move {
            let res = match res {
                Ok(unit) if unit.desired() < target => raise(registry, unit, target).await,
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            };
            (name, then, res)
        })
        .buffered(32)
        .collect()
        .await
}

/// Raises `unit` to `target`, trying the version in hand first and re-reading only when
/// another client changed it. One that another client raised first is done all the same.
async fn raise(registry: &Registry<EtcdKv>, mut unit: Unit, target: DesiredState) -> Result<()> {
    let units = UnitsRole::new(registry.clone());
    for _ in 0..ATTEMPTS {
        if unit.desired() >= target {
            return Ok(());
        }
        match units.set_desired(&unit, target).await {
            Ok(_) => return Ok(()),
            Err(RegistryError::Conflict(_)) => {}
            Err(e) => return Err(e.into()),
        }
        let name = unit.name().clone();
        let Some(current) = registry.unit(&name).await? else {
            bail!("Unit {name} does not exist");
        };
        unit = current;
    }
    Err(RegistryError::Conflict(unit.name().clone()).into())
}

/// Says, for each replaced unit that was waited for, whether it stayed on its machine or
/// moved (and why it may have: `--reschedule` or new constraints).
async fn report_placement(
    ctx: &mut Ctx,
    registry: &Registry<EtcdKv>,
    before: &BTreeMap<UnitName, fleet_core::MachineId>,
    reported: &[UnitName],
    note: &str,
) -> Result<()> {
    if reported.is_empty() {
        return Ok(());
    }
    let snap = registry.snapshot().await?;
    let now = ops::placed(&snap.schedule, reported);
    let legend = |m: &fleet_core::MachineId| super::machine_legend(m, &snap.machines, false);
    for placement in ops::placements(reported, before, &now) {
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
    // Global units are said at once, not waited for: their files are read once, up front.
    let files = match block {
        Block::No => BTreeMap::new(),
        Block::Forever | Block::Attempts(_) => {
            let changed = results.iter().filter_map(|(_, r)| r.as_ref().ok()?.clone());
            files_of(&registry, changed).await?
        }
    };
    let mut goals = BTreeMap::new();
    let mut failures = Vec::new();
    for (name, res) in results {
        match res {
            Ok(Some(unit)) if block == Block::No || is_global(&files, &unit) => {
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
