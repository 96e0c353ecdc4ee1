//! `set-metadata MACHINE key=value...` and `unset-metadata MACHINE key...`: a machine's dynamic
//! metadata, over [`fleet_ops::Cluster::change_metadata`] (the API's `PATCH /machines`), all
//! or nothing. Every argument is parsed before anything is read or written, so a bad key or
//! value writes nothing.
//!
//! Dynamic metadata wins over the machine's configured metadata (fleetd's `metadata=`) and
//! the scheduler acts on it at once (docs/api.md, "PATCH /machines"). Only dynamic values can
//! be removed: after `unset-metadata` of a key the machine's configuration also sets, the
//! configured value shows again, and the command fails naming it (the key was not unset).

use anyhow::{Context, Result, bail};
use fleet_core::{MachineId, MachineInfo};
use fleet_ops::Cluster;
use fleet_registry::input::shorten;
use fleet_registry::{MetadataChange, MetadataKey};
use std::collections::{BTreeMap, BTreeSet};

use super::Ctx;
use super::maintenance::resolve_machine;

const MACHINES_FAILED: &str = "Error retrieving list of active machines";

/// Parses `key=value` arguments: keys as fleet's API takes them, each once; values that a
/// unit's `MachineMetadata=key=value` can match (not empty, no whitespace, `=` or control
/// character: `MachineMetadata=` splits on them).
pub fn parse_pairs(args: &[String]) -> Result<Vec<(MetadataKey, String)>> {
    if args.is_empty() {
        bail!("No metadata given (set-metadata MACHINE key=value...)");
    }
    let mut seen = BTreeSet::new();
    let mut pairs = Vec::with_capacity(args.len());
    for arg in args {
        let Some((key, value)) = arg.split_once('=') else {
            bail!("{:?} is not key=value", shorten(arg));
        };
        let key = parse_key(key, &mut seen)?;
        if value.is_empty() {
            bail!(
                "the value of metadata key {:?} is empty (unset-metadata removes a key)",
                key.as_str()
            );
        }
        if value
            .chars()
            .any(|c| c == '=' || c.is_whitespace() || c.is_control())
        {
            bail!(
                "the value {:?} of metadata key {:?} has whitespace, '=' or a control \
                 character: MachineMetadata= could never match it",
                shorten(value),
                key.as_str()
            );
        }
        pairs.push((key, value.to_owned()));
    }
    Ok(pairs)
}

/// Parses the keys of `unset-metadata`, each once.
pub fn parse_keys(args: &[String]) -> Result<Vec<MetadataKey>> {
    if args.is_empty() {
        bail!("No metadata keys given (unset-metadata MACHINE key...)");
    }
    let mut seen = BTreeSet::new();
    args.iter().map(|a| parse_key(a, &mut seen)).collect()
}

fn parse_key(key: &str, seen: &mut BTreeSet<MetadataKey>) -> Result<MetadataKey> {
    let key: MetadataKey = key.parse().map_err(|_| {
        anyhow::anyhow!(
            "metadata key {:?} must be letters, digits, '_', '.' or '-'",
            shorten(key)
        )
    })?;
    if !seen.insert(key.clone()) {
        bail!("metadata key {:?} is given twice", key.as_str());
    }
    Ok(key)
}

/// The machine's metadata as listings show it (configured, dynamic over it); `None`: the
/// machine is not registered.
async fn shown<C: Cluster>(
    ctx: &Ctx<C>,
    machine: &MachineId,
) -> Result<Option<BTreeMap<String, String>>> {
    let listing = ctx.cluster.machines().await.context(MACHINES_FAILED)?;
    Ok(listing
        .machines
        .into_iter()
        .find(|m: &MachineInfo| &m.id == machine)
        .map(|m| m.metadata))
}

/// `fleetctl set-metadata MACHINE key=value...`.
pub async fn set<C: Cluster>(ctx: &mut Ctx<C>, arg: &str, args: &[String]) -> Result<()> {
    let pairs = parse_pairs(args)?;
    let machine = resolve_machine(ctx, arg).await?;
    let changes: Vec<MetadataChange> = pairs
        .iter()
        .map(|(key, value)| MetadataChange::Set {
            machine: machine.clone(),
            key: key.clone(),
            value: value.clone(),
        })
        .collect();
    ctx.cluster
        .change_metadata(&changes)
        .await
        .with_context(|| format!("setting metadata of machine {machine}"))?;
    let listed: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    ctx.say(format!("Machine {machine}: set {}", listed.join(", ")));
    if shown(ctx, &machine).await?.is_none() {
        ctx.warn(format!(
            "Warning: machine {machine} is not registered; its metadata applies once it registers"
        ));
    }
    Ok(())
}

/// `fleetctl unset-metadata MACHINE key...`: removes the dynamic values, and fails naming the
/// keys the machine still shows (its configured metadata): those were not unset, and a
/// command that did not do what it was asked exits non-zero (issue 38).
pub async fn unset<C: Cluster>(ctx: &mut Ctx<C>, arg: &str, args: &[String]) -> Result<()> {
    let keys = parse_keys(args)?;
    let machine = resolve_machine(ctx, arg).await?;
    let changes: Vec<MetadataChange> = keys
        .iter()
        .map(|key| MetadataChange::Remove {
            machine: machine.clone(),
            key: key.clone(),
        })
        .collect();
    ctx.cluster
        .change_metadata(&changes)
        .await
        .with_context(|| format!("unsetting metadata of machine {machine}"))?;
    // A machine not registered shows nothing: every key is gone from what it will show.
    let after = shown(ctx, &machine).await?.unwrap_or_default();
    let (kept, gone): (Vec<&MetadataKey>, Vec<&MetadataKey>) =
        keys.iter().partition(|k| after.contains_key(k.as_str()));
    if !gone.is_empty() {
        let listed: Vec<&str> = gone.iter().map(|k| k.as_str()).collect();
        ctx.say(format!("Machine {machine}: unset {}", listed.join(", ")));
    }
    if !kept.is_empty() {
        let kept: Vec<String> = kept
            .iter()
            .map(|k| format!("{k}={}", after[k.as_str()]))
            .collect();
        bail!(
            "machine {machine} still has {}: its fleetd's configured metadata (its metadata= \
             setting); unset-metadata removes only what set-metadata set",
            kept.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    fn err(r: Result<impl std::fmt::Debug>) -> String {
        format!("{:#}", r.unwrap_err())
    }

    #[test]
    fn pairs_keep_their_order_and_values_may_hold_commas_and_colons() {
        let pairs = parse_pairs(&args(&["region=us-east", "az=a,b", "url=host:80"])).unwrap();
        let shown: Vec<(String, String)> =
            pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        assert_eq!(
            shown,
            [
                ("region".into(), "us-east".into()),
                ("az".into(), "a,b".into()),
                ("url".into(), "host:80".into())
            ]
        );
    }

    #[test]
    fn refuses_what_machine_metadata_could_never_match() {
        assert_eq!(
            err(parse_pairs(&args(&["region"]))),
            "\"region\" is not key=value"
        );
        assert!(err(parse_pairs(&args(&["re gion=x"]))).contains("must be letters"));
        assert!(err(parse_pairs(&args(&["=x"]))).contains("must be letters"));
        assert_eq!(
            err(parse_pairs(&args(&["region="]))),
            "the value of metadata key \"region\" is empty (unset-metadata removes a key)"
        );
        for bad in ["region=a b", "region=a=b", "region=a\tb", "region=a\u{7}"] {
            let e = err(parse_pairs(&args(&[bad])));
            assert!(e.contains("of metadata key \"region\" has"), "{bad:?}: {e}");
            assert!(e.contains("could never match it"), "{bad:?}: {e}");
        }
        assert_eq!(
            err(parse_pairs(&args(&["a=1", "a=2"]))),
            "metadata key \"a\" is given twice"
        );
        assert!(err(parse_pairs(&[])).starts_with("No metadata given"));
    }

    #[test]
    fn keys_to_unset_are_parsed_each_once() {
        assert_eq!(parse_keys(&args(&["a", "b.c"])).unwrap().len(), 2);
        assert_eq!(
            err(parse_keys(&args(&["a", "a"]))),
            "metadata key \"a\" is given twice"
        );
        assert!(err(parse_keys(&args(&["a=1"]))).contains("must be letters"));
        assert!(err(parse_keys(&[])).starts_with("No metadata keys given"));
    }

    #[test]
    fn a_long_bad_argument_is_quoted_shortened() {
        let long = "x".repeat(5000);
        let e = err(parse_pairs(&[long]));
        assert!(e.len() < 400, "{e}");
        assert!(e.contains('…'));
    }
}
