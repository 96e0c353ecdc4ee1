//! Where values come from: the flag and environment layers (read by clap from [`KEYS`]),
//! the `--set` layer, and [`load`], which reads the layers lowest first and hands the merged
//! raw values to [`build`]. Parses no key's value: [`build`] and the setters do.

use anyhow::{Result, bail};
use clap::parser::ValueSource;
use clap::{ArgMatches, Command};
use fleet_registry::input::shorten;
use std::collections::BTreeMap;
use std::path::Path;

use super::file::{self, load_file};
use super::{Config, KEYS, Key, Raw, Warning, build, secrets};

/// The flag and environment layers, read by clap (a flag wins over its `FLEET_<KEY>`; an
/// empty variable counts as unset).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Given(pub BTreeMap<String, Raw>);

impl clap::FromArgMatches for Given {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut out = BTreeMap::new();
        for key in KEYS {
            let Some(value) = matches.get_one::<String>(key.name) else {
                continue;
            };
            let source = match matches.value_source(key.name) {
                Some(ValueSource::EnvVariable) if value.is_empty() => continue,
                Some(ValueSource::EnvVariable) => format!("environment {}", key.env()),
                _ => format!("flag --{}", key.flag()),
            };
            let value = value.clone();
            out.insert(key.name.to_owned(), Raw { value, source });
        }
        Ok(Self(out))
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for Given {
    fn augment_args(cmd: Command) -> Command {
        cmd.args(KEYS.iter().map(Key::arg))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

/// The `--set key=value` layer, over every other.
pub fn from_set(pairs: &[String]) -> Result<BTreeMap<String, Raw>> {
    let mut out = BTreeMap::new();
    for pair in pairs {
        let Some((k, v)) = pair.split_once('=') else {
            bail!("--set expects key=value, got {:?}", shorten(pair));
        };
        let source = "flag --set".to_owned();
        out.insert(
            k.to_owned(),
            Raw {
                value: v.to_owned(),
                source,
            },
        );
    }
    Ok(out)
}

/// Reads the layers, lowest first: the file (`--config`, else the default file if it exists),
/// the environment and flags (`given`), `--set`; then builds the configuration.
pub fn load(
    file: Option<&Path>,
    given: &Given,
    set: &[String],
    warnings: &mut Vec<Warning>,
) -> Result<Config> {
    let mut raw = load_file(file)?;
    let path = file.unwrap_or(Path::new(file::DEFAULT_CONFIG_FILE));
    let set = from_set(set)?;
    if let Some(why) = secrets::exposed(&raw, path, &given.0)
        .or_else(|| secrets::exposed(&BTreeMap::new(), path, &set))
    {
        bail!("{why}");
    }
    raw.extend(given.0.clone());
    raw.extend(set);
    let config = build(&raw, warnings)?;
    if let Some(why) = secrets::exposed_keys(&config) {
        bail!("{why}");
    }
    if let Some(r) = given.0.get("etcd_password")
        && r.source.starts_with("environment")
        && let Some(why) = secrets::exposed_env_file(Path::new(secrets::ENV_FILE))
    {
        bail!("{why}");
    }
    warnings.extend(secrets::passwords_in_clear(&config));
    Ok(config)
}
