//! fleetctl's commands. Each reads what it needs, decides, and only then writes, so a bad
//! argument anywhere in the list leaves the registry untouched.

pub mod cat;
pub mod destroy;
pub mod lifecycle;
pub mod list;
pub mod remote;
pub mod rolling;
pub mod submit;
pub mod wait;

use anyhow::{Result, bail};
use fleet_core::{MachineId, MachineInfo, UnitName};
use fleet_registry::Registry;
use fleet_registry::kv::EtcdKv;
use std::collections::BTreeMap;
use std::io::Write;

/// What every command gets: the registry and somewhere to print.
pub struct Ctx {
    pub registry: Registry<EtcdKv>,
    pub out: Box<dyn Write>,
    pub err: Box<dyn Write>,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx").finish_non_exhaustive()
    }
}

impl Ctx {
    pub fn say(&mut self, line: impl AsRef<str>) {
        let _ = writeln!(self.out, "{}", line.as_ref());
    }

    pub fn warn(&mut self, line: impl AsRef<str>) {
        let _ = writeln!(self.err, "{}", line.as_ref());
    }
}

/// Parses every argument as a unit name (fleet's mangling), failing on the first bad one.
pub fn unit_names(args: &[String]) -> Result<Vec<UnitName>> {
    if args.is_empty() {
        bail!("No units given");
    }
    args.iter()
        .map(|a| UnitName::from_arg(a).map_err(|e| anyhow::anyhow!("{e} ({a:?})")))
        .collect()
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

/// Splits and checks a `--fields` value against the valid field names.
pub fn parse_fields<'a>(fields: &'a str, valid: &[&str]) -> Result<Vec<&'a str>> {
    if fields.trim().is_empty() {
        bail!("Must define output format");
    }
    let list: Vec<&str> = fields.split(',').map(str::trim).collect();
    for f in &list {
        if !valid.contains(f) {
            bail!("Invalid key in output format: {f:?}");
        }
    }
    Ok(list)
}

/// Turns per-unit failures into the command's result: one failure is the error itself; with
/// several, each is printed and the error counts them.
pub fn fail_if_any(
    ctx: &mut Ctx,
    what: &str,
    failures: Vec<(UnitName, anyhow::Error)>,
) -> Result<()> {
    match failures.len() {
        0 => Ok(()),
        1 => {
            let (name, e) = failures.into_iter().next().expect("one failure");
            Err(e.context(format!("{what} {name}")))
        }
        n => {
            for (name, e) in &failures {
                ctx.warn(format!("{what} {name}: {e:#}"));
            }
            bail!("{what} {n} units failed")
        }
    }
}
