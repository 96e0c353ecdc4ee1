//! `fleetctl cat UNIT`: the unit's canonical text, as stored.

use anyhow::{Result, bail};
use fleet_ops::Cluster;

use super::Ctx;

pub async fn run<C: Cluster>(ctx: &mut Ctx<C>, args: &[String]) -> Result<()> {
    let [arg] = args else {
        bail!("One unit file must be provided");
    };
    let name = super::parse_arg(arg)?;
    let Some(unit) = ctx.cluster.unit(&name).await? else {
        bail!("Unit {name} not found");
    };
    ctx.print(&unit.file.canonical());
    Ok(())
}
