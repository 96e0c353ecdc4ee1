//! Rolling replaces (`start --replace --rolling[=N]`): a global unit is updated N machines at
//! a time, and a list of units N units at a time; each step waits until the new version is
//! active before the next, and the roll stops at the first failure, leaving the rest on the
//! previous version and saying so (fleet #960).

use anyhow::{Result, bail};
use fleet_core::{ActiveState, MachineId, Requirements, UnitHash, UnitName};
use fleet_registry::kv::EtcdKv;
use fleet_registry::{Registry, RegistryError, Unit, UnitsRole};
use std::collections::BTreeMap;
use tokio::time::Instant;

use super::submit::{self, Action, Prepared, ReplaceHow, Verb};
use super::wait::{Block, Goal, wait_for};
use super::{Ctx, machine_legend};

/// Re-reads of a unit another client keeps changing.
const ATTEMPTS: usize = 5;

pub async fn run(
    ctx: &mut Ctx,
    args: &[String],
    verb: Verb,
    block: Block,
    how: ReplaceHow,
    step: usize,
) -> Result<()> {
    let step = step.max(1);
    let prepared = submit::prepare(ctx, args, true, verb)
        .await
        .map_err(|e| e.context("Error creating units"))?;
    let registry = ctx.registry.clone();
    let target = super::lifecycle::target_of(verb);
    let (globals, others): (Vec<Prepared>, Vec<Prepared>) =
        prepared.into_iter().partition(|p| match &p.action {
            Action::Replace { file, .. } => Requirements::from_unit(&p.name, file).global,
            Action::Create(_) | Action::Keep(_) => false,
        });
    let plain = ReplaceHow {
        rolling: false,
        ..how.clone()
    };
    let mut remaining: Vec<String> = others.iter().map(|p| p.name.to_string()).collect();
    let mut others = others.into_iter().peekable();
    while others.peek().is_some() {
        let batch: Vec<Prepared> = others.by_ref().take(step).collect();
        let names: Vec<UnitName> = batch.iter().map(|p| p.name.clone()).collect();
        let mut goals = BTreeMap::new();
        for (name, res) in submit::apply(&registry, batch, target, &plain).await {
            let unit = res?;
            goals.insert(name, Goal::of(unit.desired()));
        }
        if let Err(e) = wait_for(ctx, &registry, goals, block).await {
            remaining.retain(|n| !names.iter().any(|m| m.as_str() == n));
            bail!(
                "{e:#}\nRolling replace stopped; not replaced yet: {}",
                if remaining.is_empty() {
                    "none".into()
                } else {
                    remaining.join(", ")
                }
            );
        }
        remaining.retain(|n| !names.iter().any(|m| m.as_str() == n));
    }
    for p in globals {
        let Action::Replace { existing, file } = p.action else {
            unreachable!("partitioned on Replace")
        };
        let state = how.state_for(&existing);
        let desired = existing.desired().max(target);
        let unit = UnitsRole::new(registry.clone())
            .replace_unit_with(&existing, &file, desired, state)
            .await?;
        roll_global(ctx, &registry, unit, step, block).await?;
    }
    Ok(())
}

/// Updates the machines of a global unit `step` at a time.
async fn roll_global(
    ctx: &mut Ctx,
    registry: &Registry<EtcdKv>,
    mut unit: Unit,
    step: usize,
    block: Block,
) -> Result<()> {
    let name = unit.name().clone();
    let snap = registry.snapshot().await?;
    let machines: Vec<MachineId> = snap
        .schedule
        .get(&name)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    for (i, chunk) in machines.chunks(step).enumerate() {
        unit = advance(registry, &name, chunk).await?;
        if let Err(e) = wait_machines(ctx, registry, &name, unit.hash(), chunk, block).await {
            let left = machines.len() - (i * step + chunk.len());
            bail!(
                "{e:#}\nRolling replace of {name} stopped: {left} machine(s) still run the previous version"
            );
        }
    }
    finish(registry, &name).await?;
    ctx.say(format!(
        "Unit {name} replaced on all {} machine(s)",
        machines.len()
    ));
    Ok(())
}

async fn advance(
    registry: &Registry<EtcdKv>,
    name: &UnitName,
    chunk: &[MachineId],
) -> Result<Unit> {
    let units = UnitsRole::new(registry.clone());
    for _ in 0..ATTEMPTS {
        let Some(unit) = units.unit(name).await? else {
            bail!("Unit {name} was destroyed during the rolling replace");
        };
        match units.advance_rollout(&unit, chunk.iter().cloned()).await {
            Ok(u) => return Ok(u),
            Err(RegistryError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(RegistryError::Conflict(name.clone()).into())
}

async fn finish(registry: &Registry<EtcdKv>, name: &UnitName) -> Result<()> {
    let units = UnitsRole::new(registry.clone());
    for _ in 0..ATTEMPTS {
        let Some(unit) = units.unit(name).await? else {
            return Ok(());
        };
        match units.finish_rollout(&unit).await {
            Ok(_) => return Ok(()),
            Err(RegistryError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(RegistryError::Conflict(name.clone()).into())
}

/// Waits until every machine of `chunk` runs `hash` of `name` active; fails on `failed`.
async fn wait_machines(
    ctx: &mut Ctx,
    registry: &Registry<EtcdKv>,
    name: &UnitName,
    hash: UnitHash,
    chunk: &[MachineId],
    block: Block,
) -> Result<()> {
    let deadline = match block {
        Block::No | Block::Forever => None,
        Block::Attempts(n) => Some(Instant::now() + super::wait::ATTEMPT * n),
    };
    let mut snap = registry.snapshot().await?;
    // Only the states of `name` decide when the wait is over.
    let mut hints = registry.watch_unit_states(name, snap.revision + 1);
    let mut pending: Vec<MachineId> = chunk.to_vec();
    loop {
        let mut still = Vec::new();
        for m in pending {
            let legend = machine_legend(&m, &snap.machines, false);
            match snap.states.get(name).and_then(|s| s.get(&m)) {
                Some(s)
                    if s.hash == Some(hash) && s.systemd.active_state() == ActiveState::Active =>
                {
                    ctx.say(format!("Unit {name} replaced on {legend}"));
                }
                Some(s)
                    if s.hash == Some(hash) && s.systemd.active_state() == ActiveState::Failed =>
                {
                    bail!(
                        "Unit {name} failed on {legend} with the new version: {}/{}/{}",
                        s.systemd.load,
                        s.systemd.active,
                        s.systemd.sub
                    );
                }
                _ => still.push(m),
            }
        }
        pending = still;
        if pending.is_empty() {
            return Ok(());
        }
        let timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = hints.changed() => {}
            _ = timeout => bail!("Timed out waiting for {name} on {} machine(s)", pending.len()),
        }
        snap = registry.snapshot().await?;
    }
}
