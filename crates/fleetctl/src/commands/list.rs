//! `list-unit-files`, `list-units` and `list-machines`: one consistent snapshot each, rendered
//! as fleet's tables. A value the registry cannot read is left out with a warning on stderr
//! that names its key; the table of everything else still prints.

use anyhow::{Context, Result};
use fleet_core::{ActiveState, DesiredState, MachineId, Requirements, UnitHash};
use fleet_registry::{Skipped, Snapshot};
use std::collections::BTreeMap;

use super::{Ctx, machine_legend, parse_fields};
use crate::cli::{ListMachines, ListUnitFiles, ListUnits, Listing};
use crate::table;

fn print(ctx: &mut Ctx, listing: &Listing, fields: &[&str], rows: Vec<Vec<String>>) {
    let mut all = Vec::with_capacity(rows.len() + 1);
    if !listing.no_legend {
        all.push(fields.iter().map(|f| f.to_uppercase()).collect());
    }
    all.extend(rows);
    ctx.print(&table::render(&all));
}

/// Warns about each value left out of a listing.
fn warn_skipped<'a>(ctx: &mut Ctx, skipped: impl IntoIterator<Item = &'a Skipped>) {
    for s in skipped {
        ctx.warn(format!("WARNING: {s}"));
    }
}

fn hash_cell(hash: Option<&UnitHash>, full: bool) -> String {
    match hash {
        Some(h) if full => h.to_string(),
        Some(h) => h.short(),
        None => "-".into(),
    }
}

/// fleet's current state of a unit: `launched` where a machine scheduled to launch it reports
/// it active, `loaded` where a scheduled machine reports it at all, else `inactive`.
fn current_state(snap: &Snapshot, unit: &fleet_core::UnitName) -> DesiredState {
    let Some(entries) = snap.schedule.get(unit) else {
        return DesiredState::Inactive;
    };
    let states = snap.states.get(unit);
    let mut best = DesiredState::Inactive;
    for (machine, entry) in entries {
        let Some(state) = states.and_then(|s| s.get(machine)) else {
            continue;
        };
        let here = if entry.desired == DesiredState::Launched
            && state.systemd.active_state() == ActiveState::Active
        {
            DesiredState::Launched
        } else {
            DesiredState::Loaded
        };
        best = best.max(here);
    }
    best
}

pub async fn list_unit_files(ctx: &mut Ctx, args: &ListUnitFiles) -> Result<()> {
    let mut fields_arg = args.fields.clone();
    if fields_arg.split(',').any(|f| f.trim() == "tmachine") {
        ctx.warn("WARNING: The \"tmachine\" field is deprecated. Use \"target\" instead");
        fields_arg = fields_arg.replace("tmachine", "target");
    }
    let fields = parse_fields(
        &fields_arg,
        &[
            "desc", "dstate", "global", "hash", "reason", "state", "target", "unit",
        ],
    )?;
    let snap = ctx
        .registry
        .snapshot()
        .await
        .context("Error retrieving list of units from repository")?;
    let files = ctx
        .registry
        .files(Some(snap.revision))
        .await
        .context("Error retrieving list of units from repository")?;
    warn_skipped(ctx, snap.skipped.values().chain(&files.skipped));
    let files = files.items;
    let full = args.listing.full;
    let mut rows = Vec::new();
    for (name, unit) in &snap.units {
        let file = files.get(&unit.hash());
        let global = file.is_some_and(|f| Requirements::from_unit(name, f).global);
        let row = fields
            .iter()
            .map(|f| match *f {
                "unit" => name.to_string(),
                "hash" => hash_cell(Some(&unit.hash()), full),
                "dstate" => unit.desired().to_string(),
                "state" if global => "-".into(),
                "state" => current_state(&snap, name).to_string(),
                "target" if global => "global".into(),
                "target" => target_cell(&snap, name, full),
                "global" => global.to_string(),
                "reason" => snap
                    .unscheduled
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| "-".into()),
                "desc" => file
                    .and_then(|f| f.description())
                    .unwrap_or("-")
                    .to_string(),
                other => unreachable!("field {other} was validated"),
            })
            .collect();
        rows.push(row);
    }
    print(ctx, &args.listing, &fields, rows);
    Ok(())
}

fn target_cell(snap: &Snapshot, name: &fleet_core::UnitName, full: bool) -> String {
    match snap.schedule.get(name).and_then(|m| m.keys().next()) {
        Some(machine) => machine_legend(machine, &snap.machines, full),
        None => "-".into(),
    }
}

pub async fn list_units(ctx: &mut Ctx, args: &ListUnits) -> Result<()> {
    let fields = parse_fields(
        &args.fields,
        &[
            "active", "hash", "load", "machine", "pending", "sub", "unit",
        ],
    )?;
    let snap = ctx
        .registry
        .snapshot()
        .await
        .context("Error retrieving list of units from repository")?;
    warn_skipped(ctx, snap.skipped.values());
    let full = args.listing.full;
    let mut rows = Vec::new();
    for (name, per_machine) in &snap.states {
        for (machine, state) in per_machine {
            let row = fields
                .iter()
                .map(|f| match *f {
                    "unit" => name.to_string(),
                    "machine" => machine_legend(machine, &snap.machines, full),
                    "active" => state.systemd.active.clone(),
                    "sub" => state.systemd.sub.clone(),
                    "load" => state.systemd.load.clone(),
                    "hash" => hash_cell(state.hash.as_ref(), full),
                    "pending" if state.restart_pending => "restart".into(),
                    "pending" => "-".into(),
                    other => unreachable!("field {other} was validated"),
                })
                .collect();
            rows.push(row);
        }
    }
    print(ctx, &args.listing, &fields, rows);
    Ok(())
}

pub async fn list_machines(ctx: &mut Ctx, args: &ListMachines) -> Result<()> {
    let fields = parse_fields(&args.fields, &["ip", "machine", "metadata"])?;
    let machines = ctx.registry.machines().await.context(
        "Error retrieving list of active machines (etcd unhealthy, lost quorum, or unreachable)",
    )?;
    warn_skipped(ctx, &machines.skipped);
    let by_id: BTreeMap<MachineId, _> = BTreeMap::new();
    let rows = machines
        .items
        .iter()
        .map(|m| {
            fields
                .iter()
                .map(|f| match *f {
                    "machine" => machine_legend(&m.id, &by_id, args.listing.full),
                    "ip" if m.public_ip.is_empty() => "-".into(),
                    "ip" => m.public_ip.clone(),
                    "metadata" if m.metadata.is_empty() => "-".into(),
                    "metadata" => m
                        .metadata
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(","),
                    other => unreachable!("field {other} was validated"),
                })
                .collect()
        })
        .collect();
    print(ctx, &args.listing, &fields, rows);
    // On stderr, so that the table stays fleet's byte for byte.
    let held = ctx.registry.disruption().await.context(
        "Error retrieving the engine's disruption notice (etcd unhealthy, lost quorum, or unreachable)",
    )?;
    if let Some(notice) = held {
        ctx.warn(format!("Warning: {notice}"));
    }
    Ok(())
}
