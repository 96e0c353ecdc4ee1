//! fleetctl's commands. Each reads what it needs, decides, and only then writes, so a bad
//! argument anywhere in the list leaves the registry untouched.
//!
//! A command talks to the cluster only through [`fleet_ops::Cluster`]: the same code, and the
//! same bytes printed, over the etcd driver and over fleet's API. Messages are fleetctl's;
//! what an operation does to the registry is fleet-ops's.

pub mod auth;
pub mod cat;
pub mod destroy;
pub mod events;
pub mod history;
pub mod import_fleet;
pub mod lifecycle;
pub mod list;
pub mod maintenance;
pub mod metadata;
pub mod remote;
pub mod rolling;
pub mod ssh;
pub mod submit;
pub mod ui;
pub mod version;
pub mod wait;
pub mod watching;

use anyhow::{Result, bail};
use fleet_core::{MachineId, MachineInfo, UnitName};
use fleet_registry::input::shorten;
use std::collections::BTreeMap;
use std::io::Write;

/// What every command gets: the cluster (a [`fleet_ops::Cluster`]: over etcd, over the API,
/// or, for the bench, over a counting wrapper of etcd) and somewhere to print.
pub struct Ctx<C> {
    pub cluster: C,
    pub out: Box<dyn Write>,
    pub err: Box<dyn Write>,
    /// The first failed write to `out`: the command goes on (its writes to etcd are done or
    /// not as decided), and the failure decides the exit code.
    pub write_failed: Option<std::io::Error>,
}

impl<C> std::fmt::Debug for Ctx<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx").finish_non_exhaustive()
    }
}

impl<C> Ctx<C> {
    pub fn say(&mut self, line: impl AsRef<str>) {
        let res = writeln!(self.out, "{}", line.as_ref());
        self.note(res);
    }

    /// Prints `text` as it is (a table, a unit file).
    pub fn print(&mut self, text: &str) {
        let res = self.out.write_all(text.as_bytes());
        self.note(res);
    }

    fn note(&mut self, res: std::io::Result<()>) {
        if let Err(e) = res {
            self.write_failed.get_or_insert(e);
        }
    }

    /// Flushes standard output; the first write that failed, if one did.
    pub fn finish(&mut self) -> std::io::Result<()> {
        let res = self.out.flush();
        self.note(res);
        match self.write_failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub fn warn(&mut self, line: impl AsRef<str>) {
        let _ = writeln!(self.err, "{}", line.as_ref());
    }
}

/// Parses every argument as a unit name (fleet's mangling), failing on the first bad one.
/// A unit named twice (`tw tw`, `t@1 t@1.service`) is acted on once, where it first appears.
pub fn unit_names(args: &[String]) -> Result<Vec<UnitName>> {
    if args.is_empty() {
        bail!("No units given");
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut names = Vec::with_capacity(args.len());
    for a in args {
        let name = parse_arg(a)?;
        if seen.insert(name.clone()) {
            names.push(name);
        }
    }
    Ok(names)
}

/// One argument as a unit name; the error quotes at most 200 characters of it.
pub fn parse_arg(arg: &str) -> Result<UnitName> {
    UnitName::from_arg(arg).map_err(|e| anyhow::anyhow!("{e} ({:?})", shorten(arg)))
}

/// fleet's machine legend: `69aee328...` (or the full ID), then `/IP` when known.
pub fn machine_legend(
    id: &MachineId,
    machines: &BTreeMap<MachineId, MachineInfo>,
    full: bool,
) -> String {
    let mut s = if full {
        id.to_string()
    } else {
        format!("{}...", id.short())
    };
    if let Some(m) = machines.get(id)
        && !m.public_ip.is_empty()
    {
        s.push('/');
        s.push_str(&m.public_ip);
    }
    s
}

/// Machines by ID, for [`machine_legend`].
pub fn machines_by_id(machines: Vec<MachineInfo>) -> BTreeMap<MachineId, MachineInfo> {
    machines.into_iter().map(|m| (m.id.clone(), m)).collect()
}

/// Splits and checks a `--fields` value against the valid field names.
pub fn parse_fields<'a>(fields: &'a str, valid: &[&str]) -> Result<Vec<&'a str>> {
    // fleet's messages, then what would have been accepted.
    let choices = valid.join(", ");
    if fields.trim().is_empty() {
        bail!("Must define output format (valid fields: {choices})");
    }
    let list: Vec<&str> = fields.split(',').map(str::trim).collect();
    for f in &list {
        if !valid.contains(f) {
            bail!("Invalid key in output format: {f:?} (valid fields: {choices})");
        }
    }
    Ok(list)
}

/// Turns per-unit failures into the command's result: one failure is the error itself; with
/// several, each is printed and the error counts them. Units a many-unit create did not write
/// because an earlier write failed ([`fleet_ops::OpsError::NotWritten`]) are said in one line,
/// not one each: 100,000 lines would hide the error that stopped them.
pub fn fail_if_any<C>(
    ctx: &mut Ctx<C>,
    what: &str,
    failures: Vec<(UnitName, anyhow::Error)>,
) -> Result<()> {
    let (unwritten, failures): (Vec<_>, Vec<_>) = failures.into_iter().partition(|(_, e)| {
        matches!(
            e.downcast_ref::<fleet_ops::OpsError>(),
            Some(fleet_ops::OpsError::NotWritten { .. })
        )
    });
    if !unwritten.is_empty() {
        let first = &unwritten[0].0;
        let last = &unwritten[unwritten.len() - 1].0;
        // Issue 38: one unit is one unit, not "1 units (a ... a)".
        let which = match unwritten.len() {
            1 => format!("1 unit was not written ({first})"),
            n => format!("{n} units were not written ({first} ... {last})"),
        };
        ctx.warn(format!(
            "{which}: writing stopped at the first failure; once it is fixed, the same command \
             again writes the rest"
        ));
    }
    match (failures.len(), unwritten.len()) {
        (0, 0) => Ok(()),
        (1, 0) => {
            let (name, e) = failures.into_iter().next().expect("one failure");
            Err(e.context(format!("{what} {name}")))
        }
        (n, u) => {
            for (name, e) in &failures {
                ctx.warn(format!("{what} {name}: {e:#}"));
            }
            bail!("{what} {} units", n + u)
        }
    }
}
