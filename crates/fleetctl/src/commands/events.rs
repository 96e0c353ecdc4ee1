//! `fleetctl events [--follow] [--unit U] [--machine M] [--since 10m] [--output json]`
//! (issue 41): what happened to units and machines, oldest first, over either driver; with
//! `--follow`, then each new event as it is written (etcd's watch, or the API's held stream:
//! nothing polls) until Ctrl-C.
//!
//! The table's columns: TIME (UTC, RFC 3339 with microseconds), UNIT, MACHINE (`from->to`
//! for a move), EVENT (the kind), WHO (who asked, for a user action), REASON. With
//! `--output json`, the API's event entities: one document `{"events":[...]}`, or following,
//! one entity a line (docs/operating.md, "What happened to my unit").

use anyhow::{Context, Result};
use fleet_api_wire::events::{EventPage, event_to_wire};
use fleet_core::fence::rfc3339_micros;
use fleet_ops::Cluster;
use fleet_registry::{Event, EventFilter, EventKind};
use futures::StreamExt;
use std::time::Duration;

use super::Ctx;
use crate::cli::{EventsArgs, Format};
use crate::table;

const FAILED: &str = "Error retrieving events";

/// The filter the flags ask for; `now` in microseconds since the epoch.
pub fn filter(args: &EventsArgs, now: u64) -> Result<EventFilter> {
    let unit = args
        .unit
        .as_deref()
        .map(|u| u.parse().with_context(|| format!("--unit {u:?}")))
        .transpose()?;
    let machine = args
        .machine
        .as_deref()
        .map(|m| m.parse().with_context(|| format!("--machine {m:?}")))
        .transpose()?;
    let since = args
        .since
        .map(|d: Duration| now.saturating_sub(u64::try_from(d.as_micros()).unwrap_or(u64::MAX)));
    Ok(EventFilter {
        unit,
        machine,
        since,
    })
}

/// The row of one event.
pub fn row(e: &Event) -> Vec<String> {
    let dash = |s: Option<String>| s.filter(|s| !s.is_empty()).unwrap_or_else(|| "-".into());
    let machine = match (&e.from, &e.machine) {
        (Some(from), Some(to)) => Some(format!("{from}->{to}")),
        (Some(from), None) => Some(format!("{from}->")),
        (None, Some(m)) => Some(m.to_string()),
        (None, None) => match &e.source {
            Some(fleet_registry::EventSource::Machine(m)) => Some(m.to_string()),
            _ => None,
        },
    };
    vec![
        rfc3339_micros(e.time),
        dash(e.unit.as_ref().map(ToString::to_string)),
        dash(machine),
        e.kind.to_string(),
        dash(e.who.clone()),
        dash(Some(e.reason.clone())),
    ]
}

const HEADER: [&str; 6] = ["TIME", "UNIT", "MACHINE", "EVENT", "WHO", "REASON"];

fn table(events: &[Event], legend: bool) -> String {
    let mut rows: Vec<Vec<String>> = Vec::with_capacity(events.len() + 1);
    if legend {
        rows.push(HEADER.iter().map(|h| (*h).to_owned()).collect());
    }
    rows.extend(events.iter().map(row));
    table::render(&rows)
}

pub async fn run<C: Cluster>(ctx: &mut Ctx<C>, args: &EventsArgs) -> Result<()> {
    let now = Event::now(EventKind::Unknown, "").time;
    let filter = filter(args, now)?;
    if args.follow {
        return follow(ctx, args, filter).await;
    }
    let listing = ctx.cluster.events(&filter).await.context(FAILED)?;
    for s in &listing.skipped {
        ctx.warn(format!("WARNING: {s}"));
    }
    match args.output {
        Format::Json => {
            let page = EventPage {
                events: listing.events.iter().map(event_to_wire).collect(),
                skipped: listing.skipped,
            };
            let text = crate::output::render(&page).context("encoding the events as JSON")?;
            ctx.print(&text);
        }
        Format::Text => ctx.print(&table(&listing.events, !args.no_legend)),
    }
    Ok(())
}

/// How many of a unit's events `fleetctl status` prints before systemd's status.
pub const STATUS_EVENTS: usize = 10;

/// `fleetctl status`'s lines before systemd's status (issue 41): the last [`STATUS_EVENTS`]
/// events of `unit` as `fleetctl events` prints them, then an empty line; nothing when it has
/// none. Events that cannot be read are said so in one line on stderr: the status still
/// prints, and its exit code stays systemd's.
pub async fn print_last<C: Cluster>(ctx: &mut Ctx<C>, unit: &fleet_core::UnitName) {
    let filter = EventFilter {
        unit: Some(unit.clone()),
        ..EventFilter::default()
    };
    let listing = match ctx.cluster.events(&filter).await {
        Ok(listing) => listing,
        Err(e) => {
            ctx.warn(format!(
                "WARNING: the events of {unit} could not be read: {e}"
            ));
            return;
        }
    };
    let events = &listing.events[listing.events.len().saturating_sub(STATUS_EVENTS)..];
    if events.is_empty() {
        return;
    }
    ctx.print(&table(events, true));
    ctx.say("");
}

/// Prints each event as it comes, until the stream ends or Ctrl-C (exit 0).
async fn follow<C: Cluster>(
    ctx: &mut Ctx<C>,
    args: &EventsArgs,
    filter: EventFilter,
) -> Result<()> {
    let mut stream = ctx.cluster.follow_events(filter).await.context(FAILED)?;
    let mut legend = !args.no_legend && args.output == Format::Text;
    let print = async {
        while let Some(event) = stream.next().await {
            let event = event.context(FAILED)?;
            let text = match args.output {
                Format::Json => {
                    let line = serde_json::to_string(&event_to_wire(&event))
                        .context("encoding an event as JSON")?;
                    format!("{line}\n")
                }
                Format::Text => table(std::slice::from_ref(&event), std::mem::take(&mut legend)),
            };
            ctx.print(&text);
            let flushed = ctx.out.flush();
            if ctx.write_failed.is_some() || flushed.is_err() {
                break;
            }
        }
        Ok::<_, anyhow::Error>(())
    };
    tokio::select! {
        printed = print => printed,
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_shows_both_machines_and_an_empty_cell_is_a_dash() {
        let e = Event::now(EventKind::Moved, "machine m1 was lost")
            .unit(&"a.service".parse().unwrap())
            .on(&"m2".parse().unwrap())
            .from(&"m1".parse().unwrap());
        let r = row(&e);
        assert_eq!(
            r[1..],
            ["a.service", "m1->m2", "moved", "-", "machine m1 was lost"]
        );
        let held = Event::now(EventKind::RescheduleHeld, "");
        assert_eq!(row(&held)[1..], ["-", "-", "reschedule-held", "-", "-"]);
    }
}
