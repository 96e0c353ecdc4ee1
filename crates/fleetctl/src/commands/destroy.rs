//! `fleetctl destroy UNIT...`: removes units from the registry through
//! [`Cluster::destroy_many`] (over etcd, many units per transaction), which destroys a unit
//! changed concurrently one by one, re-reading it, as [`Cluster::destroy`] does. A
//! unit record that cannot be read is removed too, with the file references under its name
//! (the one way out of a corrupt record), and a warning saying so.

use anyhow::{Result, bail};
use fleet_ops::{Cluster, Destroyed};

use super::{Ctx, unit_names};

pub async fn run<C: Cluster>(ctx: &mut Ctx<C>, args: &[String]) -> Result<()> {
    let names = unit_names(args)?;
    let results = ctx.cluster.clone().destroy_many(names).await;
    let mut missing = Vec::new();
    let mut failures = Vec::new();
    for (name, res) in results {
        match res {
            Ok(Destroyed::Unit) => ctx.say(format!("Destroyed {name}")),
            Ok(Destroyed::Unreadable(why)) => {
                ctx.warn(format!("WARNING: removing unreadable unit {name}: {why}"));
                ctx.say(format!("Destroyed {name}"));
            }
            Ok(Destroyed::Missing) => missing.push(name.to_string()),
            Err(e) => failures.push((name, anyhow::Error::from(e))),
        }
    }
    super::fail_if_any(ctx, "Error destroying", failures)?;
    if !missing.is_empty() {
        bail!("Units not found in registry: {}", missing.join(", "));
    }
    Ok(())
}
