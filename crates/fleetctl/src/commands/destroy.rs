//! `fleetctl destroy UNIT...`: removes units from the registry. Each removal is a
//! compare-and-swap; a unit changed concurrently is re-read and destroyed again. A unit
//! record that cannot be read is removed too, with the file references under its name (the
//! one way out of a corrupt record), and a warning saying so.

use anyhow::{Result, bail};
use fleet_core::UnitName;
use fleet_registry::RegistryError;
use futures::StreamExt;

use super::{Ctx, unit_names};

/// How often a destroy re-reads a unit that another client keeps changing.
const ATTEMPTS: usize = 5;

/// What a destroy of one name found.
enum Destroyed {
    Unit,
    /// A record that could not be read (the error says why).
    Unreadable(RegistryError),
    Missing,
}

pub async fn run(ctx: &mut Ctx, args: &[String]) -> Result<()> {
    let names = unit_names(args)?;
    let registry = ctx.registry.clone();
    let results: Vec<(UnitName, Result<Destroyed>)> = futures::stream::iter(names)
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
            Ok(Destroyed::Unit) => ctx.say(format!("Destroyed {name}")),
            Ok(Destroyed::Unreadable(e)) => {
                ctx.warn(format!("WARNING: removing unreadable unit {name}: {e}"));
                ctx.say(format!("Destroyed {name}"));
            }
            Ok(Destroyed::Missing) => missing.push(name.to_string()),
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
) -> Result<Destroyed> {
    let units = fleet_registry::UnitsRole::new(registry.clone());
    for _ in 0..ATTEMPTS {
        let unit = match units.unit(name).await {
            Ok(Some(unit)) => unit,
            Ok(None) => return Ok(Destroyed::Missing),
            Err(e @ RegistryError::Corrupt { .. }) => {
                match units.destroy_unreadable_unit(name).await {
                    Ok(true) => return Ok(Destroyed::Unreadable(e)),
                    Ok(false) => return Ok(Destroyed::Missing),
                    Err(RegistryError::Conflict(_)) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        match units.destroy_unit(&unit).await {
            Ok(()) => return Ok(Destroyed::Unit),
            Err(RegistryError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(RegistryError::Conflict(name.clone()).into())
}
