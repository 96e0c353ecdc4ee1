//! `fleetctl destroy UNIT...`: removes units from the registry. Each removal is a
//! compare-and-swap; a unit changed concurrently is re-read and destroyed again.

use anyhow::{Result, bail};
use fleet_core::UnitName;
use fleet_registry::RegistryError;
use futures::StreamExt;

use super::{Ctx, unit_names};

/// How often a destroy re-reads a unit that another client keeps changing.
const ATTEMPTS: usize = 5;

pub async fn run(ctx: &mut Ctx, args: &[String]) -> Result<()> {
    let names = unit_names(args)?;
    let registry = ctx.registry.clone();
    let results: Vec<(UnitName, Result<bool>)> = futures::stream::iter(names)
        .map(|name| {
            let registry = registry.clone();
            async move {
                let res = destroy_one(&registry, &name).await;
                (name, res)
            }
        })
        .buffered(32)
        .collect()
        .await;
    let mut missing = Vec::new();
    let mut failures = Vec::new();
    for (name, res) in results {
        match res {
            Ok(true) => ctx.say(format!("Destroyed {name}")),
            Ok(false) => missing.push(name.to_string()),
            Err(e) => failures.push((name, e)),
        }
    }
    super::fail_if_any(ctx, "Error destroying", failures)?;
    if !missing.is_empty() {
        bail!("Units not found in registry: {}", missing.join(", "));
    }
    Ok(())
}

async fn destroy_one(
    registry: &fleet_registry::Registry<fleet_registry::kv::EtcdKv>,
    name: &UnitName,
) -> Result<bool> {
    for _ in 0..ATTEMPTS {
        let Some(unit) = registry.unit(name).await? else {
            return Ok(false);
        };
        match registry.destroy_unit(&unit).await {
            Ok(()) => return Ok(true),
            Err(RegistryError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(RegistryError::Conflict(name.clone()).into())
}
