//! `list-unit-files --watch`, `list-units --watch`, `list-machines --watch` (issue 41): the
//! listing, then the listing again each time it changes, until Ctrl-C.
//!
//! A change comes from [`Cluster::changes`] (etcd's watch over the etcd driver, fleetd's
//! `GET /fleet/v1/changes` over the API driver: nothing polls) and names the parts of the
//! registry that changed; only a change of the parts a listing shows makes it read again,
//! and only a listing that reads differently is printed, after an empty line (its warnings on
//! stderr likewise, only when they change). The whole listing, not the changed rows: it
//! reads the same as without `--watch` (`--fields`, `--no-legend`, `--full`, `--output json`
//! as there), and a script splits the listings at the empty lines. A lost stream is
//! reconnected with backoff, and stderr says so; the listing is read again then.

use anyhow::{Context, Result};
use fleet_core::Backoff;
use fleet_ops::{ChangeStream, Cluster};
use fleet_registry::Part;
use futures::{FutureExt, StreamExt};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::io::Write;
use std::rc::Rc;
use std::time::Duration;

use super::{Ctx, list};
use crate::cli::{ListMachines, ListUnitFiles, ListUnits};

/// The first wait before reconnecting a lost stream, and the longest.
const RECONNECT_MIN: Duration = Duration::from_millis(250);
const RECONNECT_MAX: Duration = Duration::from_secs(10);

/// The listing watched.
#[derive(Debug, Clone, Copy)]
pub enum Table<'a> {
    UnitFiles(&'a ListUnitFiles),
    Units(&'a ListUnits),
    Machines(&'a ListMachines),
}

impl Table<'_> {
    /// The parts of the registry the listing is read from (machines for their legends too).
    fn parts(self) -> &'static [Part] {
        match self {
            Table::UnitFiles(_) => &[Part::Units, Part::States, Part::Machines],
            Table::Units(_) => &[Part::States, Part::Machines],
            Table::Machines(_) => &[Part::Machines],
        }
    }

    /// Whether `--watch` was asked.
    fn watched(self) -> bool {
        match self {
            Table::UnitFiles(args) => args.listing.watch,
            Table::Units(args) => args.listing.watch,
            Table::Machines(args) => args.listing.watch,
        }
    }

    /// Whether a change of `parts` may change the listing.
    fn concerns(self, parts: &BTreeSet<Part>) -> bool {
        self.parts().iter().any(|p| parts.contains(p))
    }
}

/// The listing `table`, once or with `--watch` ([`run`]).
pub async fn listing<C: Cluster>(ctx: &mut Ctx<C>, table: Table<'_>) -> Result<()> {
    if table.watched() {
        return run(ctx, table).await;
    }
    once(ctx, table).await
}

/// Prints the listing once, as without `--watch`.
async fn once<C: Cluster>(ctx: &mut Ctx<C>, table: Table<'_>) -> Result<()> {
    match table {
        Table::UnitFiles(args) => list::list_unit_files(ctx, args).await,
        Table::Units(args) => list::list_units(ctx, args).await,
        Table::Machines(args) => list::list_machines(ctx, args).await,
    }
}

/// What one reading of the listing printed, on stdout and on stderr.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shown {
    pub out: Vec<u8>,
    pub err: Vec<u8>,
}

/// What to print of reading `now` after `last` (none before the first): stdout only when it
/// differs, after an empty line that parts it from the listing before; stderr only when it
/// differs.
pub fn to_print(last: Option<&Shown>, now: &Shown) -> Shown {
    let Some(last) = last else {
        return now.clone();
    };
    let mut out = Vec::new();
    if now.out != last.out {
        out.push(b'\n');
        out.extend_from_slice(&now.out);
    }
    let err = if now.err == last.err {
        Vec::new()
    } else {
        now.err.clone()
    };
    Shown { out, err }
}

/// A writer whose bytes the caller keeps.
#[derive(Clone, Default)]
struct Kept(Rc<RefCell<Vec<u8>>>);

impl Write for Kept {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Reads the listing as the command without `--watch` prints it.
async fn read<C: Cluster>(cluster: &C, table: Table<'_>) -> Result<Shown> {
    let (out, err) = (Kept::default(), Kept::default());
    let mut inner = Ctx {
        cluster: cluster.clone(),
        out: Box::new(out.clone()),
        err: Box::new(err.clone()),
        write_failed: None,
    };
    once(&mut inner, table).await?;
    drop(inner);
    Ok(Shown {
        out: out.0.take(),
        err: err.0.take(),
    })
}

/// Prints the listing when it changed since `last`, which it then is.
async fn show<C: Cluster>(ctx: &mut Ctx<C>, table: Table<'_>, last: &mut Option<Shown>) {
    let now = match read(&ctx.cluster, table).await {
        Ok(now) => now,
        // The next change reads again; a cluster gone for good loses the stream too.
        Err(e) => {
            ctx.warn(format!("Error reading the listing: {e:#}"));
            return;
        }
    };
    let printed = to_print(last.as_ref(), &now);
    if !printed.out.is_empty() {
        ctx.print(&String::from_utf8_lossy(&printed.out));
        let flushed = ctx.out.flush();
        if let Err(e) = flushed {
            ctx.write_failed.get_or_insert(e);
        }
    }
    if !printed.err.is_empty() {
        let _ = ctx.err.write_all(&printed.err);
    }
    *last = Some(now);
}

/// Opens a stream again after `error`, waiting longer after each failure; says so on stderr.
async fn reconnect<C: Cluster>(
    ctx: &mut Ctx<C>,
    backoff: &mut Backoff,
    mut error: String,
) -> ChangeStream {
    loop {
        let delay = backoff.next_delay();
        ctx.warn(format!(
            "The change stream was lost ({error}); reconnecting in {:.1} s",
            delay.as_secs_f64()
        ));
        tokio::time::sleep(delay).await;
        match ctx.cluster.changes().await {
            Ok(stream) => {
                ctx.warn("Reconnected to the change stream");
                return stream;
            }
            Err(e) => error = e.to_string(),
        }
    }
}

/// Prints the listing, then each time it changes, until Ctrl-C (exit 0) or stdout fails.
pub async fn run<C: Cluster>(ctx: &mut Ctx<C>, table: Table<'_>) -> Result<()> {
    let mut stream = ctx
        .cluster
        .changes()
        .await
        .context("Error opening the cluster's change stream")?;
    let mut backoff = Backoff::new(RECONNECT_MIN, RECONNECT_MAX);
    let mut last = None;
    let watch = async {
        while ctx.write_failed.is_none() {
            match stream.next().await {
                Some(Ok(change)) if table.concerns(&change.parts) => {
                    // Changes already there are read by the same reading.
                    while let Some(Some(Ok(_))) = stream.next().now_or_never() {}
                    show(ctx, table, &mut last).await;
                    backoff.reset();
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => stream = reconnect(ctx, &mut backoff, e.to_string()).await,
                None => stream = reconnect(ctx, &mut backoff, "it ended".to_owned()).await,
            }
        }
    };
    tokio::select! {
        () = watch => Ok(()),
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(out: &str, err: &str) -> Shown {
        Shown {
            out: out.into(),
            err: err.into(),
        }
    }

    #[test]
    fn the_first_listing_is_printed_as_it_is() {
        let first = shown("UNIT\na.service\n", "WARNING: x\n");
        assert_eq!(to_print(None, &first), first);
    }

    #[test]
    fn a_listing_that_changed_is_printed_after_an_empty_line() {
        let last = shown("UNIT\na.service\n", "");
        let now = shown("UNIT\na.service\nb.service\n", "");
        assert_eq!(
            to_print(Some(&last), &now),
            shown("\nUNIT\na.service\nb.service\n", "")
        );
    }

    #[test]
    fn a_listing_that_reads_the_same_prints_nothing_and_warnings_only_when_they_change() {
        let last = shown("UNIT\na.service\n", "WARNING: x\n");
        assert_eq!(to_print(Some(&last), &last), Shown::default());
        let now = shown("UNIT\na.service\n", "WARNING: y\n");
        assert_eq!(to_print(Some(&last), &now), shown("", "WARNING: y\n"));
    }

    #[test]
    fn each_listing_reads_again_only_on_a_change_of_what_it_shows() {
        let args = crate::cli::ListMachines {
            listing: crate::cli::Listing {
                no_legend: false,
                full: false,
                output: crate::cli::Format::Text,
                watch: true,
            },
            fields: None,
        };
        let machines = Table::Machines(&args);
        assert!(machines.concerns(&BTreeSet::from([Part::Machines, Part::Events])));
        assert!(!machines.concerns(&BTreeSet::from([Part::States, Part::Units])));
        assert!(!machines.concerns(&BTreeSet::from([Part::Events])));
    }
}
