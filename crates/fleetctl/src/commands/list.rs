//! `list-unit-files`, `list-units` and `list-machines`: one consistent read each (and the
//! live machines when a column shows their legends), rendered as fleet's tables. A value the
//! registry cannot read is left out with a warning on stderr that names its key; the table of
//! everything else still prints. With `--output json`, one document of the API's full-view
//! entities instead ([`crate::output`]), which carries those warnings itself: stderr stays
//! quiet, `--no-legend` and `--full` change nothing, and `--fields` is refused.

use anyhow::{Context, Result, bail};
use fleet_core::{MachineId, MachineInfo, UnitHash};
use fleet_ops::{Cluster, StateFilter};
use std::collections::{BTreeMap, BTreeSet};

use super::{Ctx, history, machine_legend, machines_by_id, parse_fields};
use crate::cli::{Format, ListMachines, ListUnitFiles, ListUnits, Listing};
use crate::{output, table};

const UNITS_FAILED: &str = "Error retrieving list of units from repository";
// Not fleet's "(etcd unhealthy, lost quorum, or unreachable)": over the API driver etcd may
// have nothing to do with it, and the cause that follows says what went wrong.
const MACHINES_FAILED: &str = "Error retrieving list of active machines";

/// Each table's columns without `--fields`: fleet's defaults (cli.rs's help names them; a test
/// below holds the two together).
const UNIT_FILES_DEFAULT: &str = "unit,hash,dstate,state,target";
const UNITS_DEFAULT: &str = "unit,machine,active,sub";
const MACHINES_DEFAULT: &str = "machine,ip,metadata";

/// The `--fields` of a table, or the refusal of one with `--output json`.
fn fields_arg(listing: &Listing, fields: Option<&str>, default: &str) -> Result<Option<String>> {
    match (listing.output, fields) {
        (Format::Json, Some(_)) => bail!(
            "--fields chooses the columns of a table; --output=json prints every field \
             (docs/operating.md, \"JSON output\")"
        ),
        (Format::Json, None) => Ok(None),
        (Format::Text, f) => Ok(Some(f.unwrap_or(default).to_owned())),
    }
}

/// Prints one JSON document.
fn print_json<C, T: serde::Serialize>(ctx: &mut Ctx<C>, doc: &T) -> Result<()> {
    let text = output::render(doc).context("encoding the listing as JSON")?;
    ctx.print(&text);
    Ok(())
}

fn print<C>(ctx: &mut Ctx<C>, listing: &Listing, fields: &[&str], rows: Vec<Vec<String>>) {
    let mut all = Vec::with_capacity(rows.len() + 1);
    if !listing.no_legend {
        all.push(fields.iter().map(|f| f.to_uppercase()).collect());
    }
    all.extend(rows);
    ctx.print(&table::render(&all));
}

/// Warns about each value left out of a listing, once.
fn warn_skipped<C>(ctx: &mut Ctx<C>, skipped: impl IntoIterator<Item = String>) {
    let mut told = BTreeSet::new();
    for s in skipped {
        if told.insert(s.clone()) {
            ctx.warn(format!("WARNING: {s}"));
        }
    }
}

fn hash_cell(hash: Option<&UnitHash>, full: bool) -> String {
    match hash {
        Some(h) if full => h.to_string(),
        Some(h) => h.short(),
        None => "-".into(),
    }
}

/// The live machines, for legends: read only when a column shows one.
async fn legends<C: Cluster>(
    ctx: &Ctx<C>,
    wanted: bool,
) -> Result<(BTreeMap<MachineId, MachineInfo>, Vec<String>)> {
    if !wanted {
        return Ok(Default::default());
    }
    let listing = ctx.cluster.machines().await.context(UNITS_FAILED)?;
    Ok((machines_by_id(listing.machines), listing.skipped))
}

pub async fn list_unit_files<C: Cluster>(ctx: &mut Ctx<C>, args: &ListUnitFiles) -> Result<()> {
    let Some(mut fields_arg) =
        fields_arg(&args.listing, args.fields.as_deref(), UNIT_FILES_DEFAULT)?
    else {
        let listing = ctx.cluster.units(None).await.context(UNITS_FAILED)?;
        return print_json(ctx, &output::UnitFiles::of(&listing));
    };
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
    let listing = ctx.cluster.units(None).await.context(UNITS_FAILED)?;
    let placed = listing.units.iter().any(|u| !u.status.machines.is_empty());
    let (machines, skipped) = legends(ctx, placed && fields.contains(&"target")).await?;
    warn_skipped(ctx, listing.skipped.into_iter().chain(skipped));
    let full = args.listing.full;
    let mut rows = Vec::new();
    for unit in &listing.units {
        let status = &unit.status;
        let row = fields
            .iter()
            .map(|f| match *f {
                "unit" => status.name.to_string(),
                "hash" => hash_cell(Some(&status.hash), full),
                "dstate" => status.desired.to_string(),
                "state" if unit.global => "-".into(),
                "state" => unit.current.to_string(),
                "target" if unit.global => "global".into(),
                "target" => match status.machines.first() {
                    Some(machine) => machine_legend(machine, &machines, full),
                    None => "-".into(),
                },
                "global" => unit.global.to_string(),
                "reason" => status.unscheduled.clone().unwrap_or_else(|| "-".into()),
                "desc" => unit.file.description().unwrap_or("-").to_string(),
                other => unreachable!("field {other} was validated"),
            })
            .collect();
        rows.push(row);
    }
    print(ctx, &args.listing, &fields, rows);
    Ok(())
}

pub async fn list_units<C: Cluster>(ctx: &mut Ctx<C>, args: &ListUnits) -> Result<()> {
    let Some(fields_arg) = fields_arg(&args.listing, args.fields.as_deref(), UNITS_DEFAULT)? else {
        let listing = ctx
            .cluster
            .states(&StateFilter::default())
            .await
            .context(UNITS_FAILED)?;
        return print_json(ctx, &output::Units::of(&listing));
    };
    let fields = parse_fields(
        &fields_arg,
        &[
            "active", "exit", "hash", "load", "machine", "pending", "restarts", "since", "sub",
            "unit",
        ],
    )?;
    let listing = ctx
        .cluster
        .states(&StateFilter::default())
        .await
        .context(UNITS_FAILED)?;
    let shown = !listing.states.is_empty() && fields.contains(&"machine");
    let (machines, skipped) = legends(ctx, shown).await?;
    warn_skipped(ctx, listing.skipped.into_iter().chain(skipped));
    let full = args.listing.full;
    let now = history::now_micros();
    let rows = listing
        .states
        .iter()
        .map(|state| {
            fields
                .iter()
                .map(|f| match *f {
                    "unit" => state.name.to_string(),
                    "machine" => machine_legend(&state.machine, &machines, full),
                    "active" => state.active.clone(),
                    "sub" => state.sub.clone(),
                    "load" => state.load.clone(),
                    "hash" => hash_cell(state.hash.as_ref(), full),
                    "pending" if state.restart_pending => "restart".into(),
                    "pending" => "-".into(),
                    "restarts" | "since" | "exit" => history::cell(f, state, now),
                    other => unreachable!("field {other} was validated"),
                })
                .collect()
        })
        .collect();
    print(ctx, &args.listing, &fields, rows);
    Ok(())
}

pub async fn list_machines<C: Cluster>(ctx: &mut Ctx<C>, args: &ListMachines) -> Result<()> {
    let Some(fields_arg) = fields_arg(&args.listing, args.fields.as_deref(), MACHINES_DEFAULT)?
    else {
        let listing = ctx.cluster.machines().await.context(MACHINES_FAILED)?;
        return print_json(ctx, &output::Machines::of(&listing));
    };
    let fields = parse_fields(
        &fields_arg,
        &["drained", "ip", "leader", "machine", "metadata"],
    )?;
    let listing = ctx.cluster.machines().await.context(MACHINES_FAILED)?;
    warn_skipped(ctx, listing.skipped);
    let by_id: BTreeMap<MachineId, _> = BTreeMap::new();
    let drained: BTreeMap<&MachineId, u32> = listing
        .drained
        .iter()
        .map(|d| (&d.machine, d.parallel))
        .collect();
    let rows = listing
        .machines
        .iter()
        .map(|m| {
            fields
                .iter()
                .map(|f| match *f {
                    "machine" => machine_legend(&m.id, &by_id, args.listing.full),
                    "drained" => drained
                        .get(&m.id)
                        .map_or_else(|| "-".to_owned(), |p| format!("parallel={p}")),
                    "leader" if listing.leader.as_ref() == Some(&m.id) => "yes".into(),
                    "leader" => "-".into(),
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
    if let Some(notice) = listing.notice {
        ctx.warn(format!("Warning: {notice}"));
    }
    if let Some(notice) = listing.leader_notice {
        ctx.warn(format!("Warning: {notice}"));
    }
    for m in &listing.machines {
        if let Some(at) = m.fence_at {
            let legend = machine_legend(&m.id, &by_id, args.listing.full);
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(at);
            ctx.warn(format!(
                "Machine {legend}'s fleetd is stopped: unless it returns, its non-global units \
                 are stopped at {} (its fence)",
                fleet_core::fence::utc_seconds(at)
            ));
        }
    }
    for d in &listing.drained {
        let legend = machine_legend(&d.machine, &by_id, args.listing.full);
        ctx.warn(format!(
            "Machine {legend} is drained ({} move(s) at a time): it takes no new units",
            d.parallel
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn each_tables_help_names_the_columns_it_prints_by_default() {
        let cli = crate::cli::Cli::command();
        for (command, default) in [
            ("list-unit-files", UNIT_FILES_DEFAULT),
            ("list-units", UNITS_DEFAULT),
            ("list-machines", MACHINES_DEFAULT),
        ] {
            let sub = cli.find_subcommand(command).expect(command);
            let fields = sub
                .get_arguments()
                .find(|a| a.get_id() == "fields")
                .expect("--fields");
            let help = fields.get_help().expect("help").to_string();
            assert!(
                help.contains(&format!("[default: {default}]")),
                "{command}: {help}"
            );
        }
    }
}
