//! fleetd's command line: `--config`, `--version`, and one flag per configuration key
//! (`--agent-ttl 3s` sets `agent_ttl`), which override the file and the environment.

use clap::Parser;
use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::config::{API_KEYS, KEYS, Raw};
use fleet_registry::input::shorten;

#[derive(Debug, Parser)]
#[command(
    name = "fleetd",
    about = "fleet daemon: agent and engine on every host",
    disable_version_flag = true
)]
pub struct Cli {
    /// Path to the configuration file (default /etc/fleet/fleet.conf, if present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the version and exit.
    #[arg(long, short = 'v', alias = "version")]
    pub print_version: bool,
    /// A configuration key as `key=value` (repeatable), e.g. `--set agent_ttl=3s`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    #[arg(long)]
    pub etcd_servers: Option<String>,
    #[arg(long)]
    pub etcd_key_prefix: Option<String>,
    #[arg(long)]
    pub public_ip: Option<String>,
    #[arg(long)]
    pub metadata: Option<String>,
    #[arg(long)]
    pub agent_ttl: Option<String>,
    #[arg(long)]
    pub units_directory: Option<String>,
    #[arg(long)]
    pub engine_reconcile_interval: Option<String>,
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub disable_engine: Option<String>,
    #[arg(long)]
    pub verbosity: Option<String>,
    /// `fleetd version` is accepted as in fleet.
    #[arg(hide = true)]
    pub positional: Vec<String>,
}

impl Cli {
    /// The flag layer of the configuration.
    pub fn flags(&self) -> anyhow::Result<BTreeMap<String, Raw>> {
        let mut out = BTreeMap::new();
        let named = [
            ("etcd_servers", &self.etcd_servers),
            ("etcd_key_prefix", &self.etcd_key_prefix),
            ("public_ip", &self.public_ip),
            ("metadata", &self.metadata),
            ("agent_ttl", &self.agent_ttl),
            ("units_directory", &self.units_directory),
            ("engine_reconcile_interval", &self.engine_reconcile_interval),
            ("disable_engine", &self.disable_engine),
            ("verbosity", &self.verbosity),
        ];
        for (k, v) in named {
            if let Some(v) = v {
                out.insert(
                    k.to_owned(),
                    Raw {
                        value: v.clone(),
                        source: format!("flag --{}", k.replace('_', "-")),
                    },
                );
            }
        }
        for kv in &self.set {
            let Some((k, v)) = kv.split_once('=') else {
                anyhow::bail!("--set expects key=value, got {:?}", shorten(kv));
            };
            if !KEYS.contains(&k) && !API_KEYS.contains(&k) {
                anyhow::bail!("unknown config key {:?} (flag --set)", shorten(k));
            }
            out.insert(
                k.to_owned(),
                Raw {
                    value: v.to_owned(),
                    source: "flag --set".into(),
                },
            );
        }
        Ok(out)
    }
}
