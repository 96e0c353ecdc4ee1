//! `fleetctl version`: fleetctl's version, then the versions the cluster's live fleetds
//! publish, grouped. fleet's `version` works offline, and so does this one: when the cluster
//! cannot be read, fleetctl's version is printed all the same, stderr says why the rest is
//! missing, and the command succeeds. `--version` prints fleetctl's version alone.

use anyhow::{Context, Result};
use fleet_core::MachineInfo;

use super::Ctx;
use crate::cli::Format;
use crate::output;

/// Prints the report from what reading the cluster's machines gave (`Err`: why it could not).
pub fn print<C>(
    ctx: &mut Ctx<C>,
    fleetctl: &str,
    machines: Result<Vec<MachineInfo>, String>,
    format: Format,
) -> Result<()> {
    if let Err(e) = &machines {
        ctx.warn(format!(
            "Warning: the cluster cannot be reached; fleetds' versions unknown: {e}"
        ));
    }
    let report = output::Version::of(fleetctl, machines.as_deref().map_err(Clone::clone));
    match format {
        Format::Text => ctx.print(&report.text()),
        Format::Json => {
            let text = output::render(&report).context("encoding the versions as JSON")?;
            ctx.print(&text);
        }
    }
    Ok(())
}
