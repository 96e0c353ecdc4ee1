//! Rolling replaces (`start --replace --rolling[=N]`): a global unit is updated N machines at
//! a time, and a list of units N units at a time; each step waits until the new version is
//! active before the next, and the roll stops at the first failure, leaving the rest on the
//! previous version and saying so (fleet #960).

use anyhow::{Result, bail};
use fleet_core::{ActiveState, MachineId, Requirements, UnitHash, UnitName};
use fleet_ops::{Changes, Cluster, Expect, PutRequest, ReplaceHow};
use std::collections::{BTreeMap, BTreeSet};
use tokio::time::Instant;

use super::submit::{self, Action, Prepared, Verb};
use super::wait::{Block, Goal, wait_for};
use super::{Ctx, machine_legend};

pub async fn run<C: Cluster>(
    ctx: &mut Ctx<C>,
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
    let cluster = ctx.cluster.clone();
    let target = super::lifecycle::target_of(verb);
    let (globals, others): (Vec<Prepared>, Vec<Prepared>) =
        prepared.into_iter().partition(|p| match &p.action {
            Action::Replace { file, .. } => Requirements::global(&p.name, file),
            Action::Create(_) | Action::Keep(_) => false,
        });
    let plain = ReplaceHow {
        rolling: false,
        ..how
    };
    let mut remaining: Vec<String> = others.iter().map(|p| p.name.to_string()).collect();
    let mut others = others.into_iter().peekable();
    while others.peek().is_some() {
        let batch: Vec<Prepared> = others.by_ref().take(step).collect();
        let names: Vec<UnitName> = batch.iter().map(|p| p.name.clone()).collect();
        let mut goals = BTreeMap::new();
        for (name, res) in submit::apply(&cluster, batch, target, &plain).await {
            let unit = res?;
            goals.insert(name, Goal::of(unit.desired));
        }
        if let Err(e) = wait_for(ctx, &cluster, goals, block).await {
            if e.downcast_ref::<super::wait::Interrupted>().is_some() {
                return Err(e);
            }
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
    let rolling = ReplaceHow {
        rolling: true,
        ..how
    };
    for p in globals {
        let Action::Replace { existing, file } = p.action else {
            unreachable!("partitioned on Replace")
        };
        let req = PutRequest {
            name: p.name.clone(),
            file: Some(file),
            desired: Some(existing.desired.max(target)),
            how: rolling,
        };
        cluster.put_if(req, Expect::Content(existing.hash)).await?;
        roll_global(ctx, &cluster, &p.name, step, block).await?;
    }
    Ok(())
}

/// Updates the machines of a global unit `step` at a time.
async fn roll_global<C: Cluster>(
    ctx: &mut Ctx<C>,
    cluster: &C,
    name: &UnitName,
    step: usize,
    block: Block,
) -> Result<()> {
    let Some(unit) = cluster.unit(name).await? else {
        bail!("Unit {name} was destroyed during the rolling replace");
    };
    let machines = unit.status.machines;
    for (i, chunk) in machines.chunks(step).enumerate() {
        let unit = cluster.advance_rollout(name, chunk).await?;
        if let Err(e) = wait_machines(ctx, cluster, name, unit.status.hash, chunk, block).await {
            let left = machines.len() - (i * step + chunk.len());
            bail!(
                "{e:#}\nRolling replace of {name} stopped: {left} machine(s) still run the previous version"
            );
        }
    }
    cluster.finish_rollout(name).await?;
    ctx.say(format!(
        "Unit {name} replaced on all {} machine(s)",
        machines.len()
    ));
    Ok(())
}

/// Waits until every machine of `chunk` runs `hash` of `name` active; fails on `failed`.
async fn wait_machines<C: Cluster>(
    ctx: &mut Ctx<C>,
    cluster: &C,
    name: &UnitName,
    hash: UnitHash,
    chunk: &[MachineId],
    block: Block,
) -> Result<()> {
    let deadline = match block {
        Block::No | Block::Forever => None,
        Block::Attempts(n) => Some(Instant::now() + super::wait::ATTEMPT * n),
    };
    let names = BTreeSet::from([name.clone()]);
    let mut changes = cluster.watch(names.clone()).await?;
    let mut pending: Vec<MachineId> = chunk.to_vec();
    loop {
        let snap = changes.view();
        let mut still = Vec::new();
        for m in pending {
            let legend = machine_legend(&m, &snap.machines, false);
            let state = snap.states.get(name).and_then(|s| s.get(&m));
            let active = state
                .filter(|s| s.hash == Some(hash))
                .map(|s| (s, ActiveState::parse(&s.active)));
            match active {
                Some((_, ActiveState::Active)) => {
                    ctx.say(format!("Unit {name} replaced on {legend}"));
                }
                Some((s, ActiveState::Failed)) => {
                    bail!(
                        "Unit {name} failed on {legend} with the new version: {}/{}/{}",
                        s.load,
                        s.active,
                        s.sub
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
            changed = changes.changed() => {
                // A watch that ended (etcd went away for a moment): read everything again.
                if changed.is_err() {
                    changes = cluster.watch(names.clone()).await?;
                }
            }
            _ = timeout => bail!("Timed out waiting for {name} on {} machine(s)", pending.len()),
        }
    }
}
