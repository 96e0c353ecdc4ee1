//! `drain`, `undrain` and `explain`: what an operator asks of a machine under maintenance and
//! of a unit that is not where they expect. The cluster answers with the engine's own rules
//! ([`fleet_ops::Cluster::drain_status`], [`fleet_ops::Cluster::explain`]); this module only
//! waits and prints.

use anyhow::{Context, Result, bail};
use fleet_core::MachineId;
use fleet_ops::{Changes, Cluster, DrainStatus, ExplainStatus, Explanation};
use std::collections::BTreeSet;
use std::time::Duration;

use super::{Ctx, parse_arg};
use crate::table;

/// How long a drain waits for a hint before it reads the drain's status anyway: moves end
/// with state changes of units the watch may not name yet (a unit that left since).
const RECHECK: Duration = Duration::from_secs(1);

/// What `drain` was asked.
#[derive(Debug, Clone, Copy)]
pub struct DrainOptions {
    pub parallel: u32,
    /// Exit 0 even when units cannot leave the machine.
    pub force: bool,
    /// How long to wait for its units to leave (`--no-block`, `--block-attempts`).
    pub block: super::wait::Block,
}

/// The machine `arg` names: a live machine's full ID or a prefix of exactly one; anything
/// else that is a machine ID names a machine that is not registered (it may be drained).
pub async fn resolve_machine<C: Cluster>(ctx: &mut Ctx<C>, arg: &str) -> Result<MachineId> {
    let listing = ctx
        .cluster
        .machines()
        .await
        .context("Error retrieving list of active machines")?;
    let matches: Vec<&MachineId> = listing
        .machines
        .iter()
        .map(|m| &m.id)
        .filter(|id| id.as_str().starts_with(arg))
        .collect();
    if let Some(exact) = matches.iter().find(|id| id.as_str() == arg) {
        return Ok((*exact).clone());
    }
    match matches.as_slice() {
        [one] => Ok((*one).clone()),
        [] => arg
            .parse()
            .map_err(|e| anyhow::anyhow!("invalid machine ID {arg:?}: {e}")),
        many => bail!(
            "machine ID {arg:?} is ambiguous: {} machines match",
            many.len()
        ),
    }
}

/// `fleetctl drain MACHINE`: marks it, then waits until every unit that can leave has left
/// and is active elsewhere. Units that cannot leave are named with the reason; they make
/// the command fail unless `--force`.
pub async fn drain<C: Cluster>(ctx: &mut Ctx<C>, arg: &str, opts: DrainOptions) -> Result<()> {
    let machine = resolve_machine(ctx, arg).await?;
    let mut status = ctx
        .cluster
        .drain(&machine, opts.parallel)
        .await
        .with_context(|| format!("draining machine {machine}"))?;
    let parallel = status.parallel.unwrap_or(opts.parallel.max(1));
    ctx.say(format!(
        "Machine {machine} drained: it takes no new units; moving {} unit(s) off it, {parallel} at a time",
        status.moving.len() + status.queued.len()
    ));
    if opts.block != super::wait::Block::No {
        status = wait_drained(ctx, &machine, status, opts.block).await?;
    }
    report_stuck(ctx, &machine, &status, opts.force)
}

async fn wait_drained<C: Cluster>(
    ctx: &mut Ctx<C>,
    machine: &MachineId,
    mut status: DrainStatus,
    block: super::wait::Block,
) -> Result<DrainStatus> {
    let deadline = block.deadline(tokio::time::Instant::now());
    let mut reported: BTreeSet<fleet_core::UnitName> = BTreeSet::new();
    let mut watched: BTreeSet<fleet_core::UnitName> = BTreeSet::new();
    let mut changes = None;
    loop {
        let on_way: BTreeSet<_> = status
            .moving
            .iter()
            .chain(&status.queued)
            .cloned()
            .collect();
        for unit in watched.difference(&on_way) {
            if reported.insert(unit.clone()) {
                ctx.say(format!("Unit {unit} moved off {machine}"));
            }
        }
        if status.done {
            return Ok(status);
        }
        if let (Some(deadline), super::wait::Block::Attempts(n)) = (deadline, block)
            && tokio::time::Instant::now() >= deadline
        {
            bail!(
                "machine {machine} still has {} unit(s) on their way off it after {n} attempt(s); \
                 it stays drained, and they keep moving",
                on_way.len()
            );
        }
        if on_way != watched || changes.is_none() {
            watched.extend(on_way.iter().cloned());
            changes = Some(ctx.cluster.watch(watched.clone()).await?);
        }
        let hints = changes.as_mut().expect("just set");
        // A hint or the re-check: either way the status is read again.
        let _ = tokio::time::timeout(RECHECK, hints.changed()).await;
        status = ctx
            .cluster
            .drain_status(machine)
            .await
            .with_context(|| format!("reading the drain of {machine}"))?;
        if status.parallel.is_none() {
            bail!("machine {machine} was undrained while its units were moving");
        }
    }
}

fn report_stuck<C>(
    ctx: &mut Ctx<C>,
    machine: &MachineId,
    status: &DrainStatus,
    force: bool,
) -> Result<()> {
    for (unit, reason) in &status.stuck {
        ctx.warn(format!("Unit {unit} cannot leave {machine}: {reason}"));
    }
    if !status.globals.is_empty() {
        let names: Vec<&str> = status.globals.iter().map(|u| u.as_str()).collect();
        ctx.say(format!(
            "Global units stay on {machine}: {}",
            names.join(", ")
        ));
    }
    match (status.stuck.len(), force) {
        (0, _) | (_, true) => Ok(()),
        (n, false) => bail!("{n} unit(s) cannot leave machine {machine} (--force accepts that)"),
    }
}

/// `fleetctl undrain MACHINE`: schedulable again. Nothing moves back by itself.
pub async fn undrain<C: Cluster>(ctx: &mut Ctx<C>, arg: &str) -> Result<()> {
    let machine = resolve_machine(ctx, arg).await?;
    let was = ctx
        .cluster
        .undrain(&machine)
        .await
        .with_context(|| format!("undraining machine {machine}"))?;
    if was {
        ctx.say(format!(
            "Machine {machine} undrained: it takes new units again (none move back by themselves)"
        ));
    } else {
        ctx.say(format!("Machine {machine} was not drained"));
    }
    Ok(())
}

/// `fleetctl explain UNIT`: the scheduler's view of one unit, as text or one JSON document.
pub async fn explain<C: Cluster>(ctx: &mut Ctx<C>, arg: &str, json: bool) -> Result<()> {
    let name = parse_arg(arg)?;
    let e = ctx
        .cluster
        .explain(&name)
        .await
        .with_context(|| format!("explaining unit {name}"))?;
    let missing = e.status == ExplainStatus::NotFound;
    if json {
        // The document says `not_found` to a script; the exit status and stderr say it too.
        let text = serde_json::to_string_pretty(&e).context("encoding the explanation")?;
        ctx.say(text);
    } else if !missing {
        // A missing unit is said once, on stderr, not as a status, a summary and an error.
        ctx.print(&explanation_text(&e));
    }
    if missing {
        bail!("Unit {name} does not exist");
    }
    Ok(())
}

fn explanation_text(e: &Explanation) -> String {
    let status = serde_json::to_value(e.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let mut out = format!("Unit {}: {status}\n{}\n", e.unit, e.summary);
    if !e.rules.is_empty() {
        out.push_str(&format!("Rules: {}\n", e.rules.join(" ")));
    }
    if e.machines.is_empty() {
        return out;
    }
    let mut rows = vec![vec!["MACHINE".into(), "SCHEDULED".into(), "VERDICT".into()]];
    for v in &e.machines {
        let verdict = v
            .rejected
            .as_ref()
            .map_or_else(|| "ok".to_owned(), |r| r.message.clone());
        let here = if v.scheduled { "yes" } else { "-" };
        rows.push(vec![v.machine.to_string(), here.into(), verdict]);
    }
    out.push_str(&table::render(&rows));
    out
}
