//! `fleetctl cat UNIT`: the unit's canonical text, as stored.

use anyhow::{Result, bail};

use super::Ctx;

pub async fn run(ctx: &mut Ctx, args: &[String]) -> Result<()> {
    let [arg] = args else {
        bail!("One unit file must be provided");
    };
    let name = super::parse_arg(arg)?;
    let Some(unit) = ctx.registry.unit(&name).await? else {
        bail!("Unit {name} not found");
    };
    let file = ctx.registry.unit_file(&unit).await?;
    ctx.print(&file.canonical());
    Ok(())
}
