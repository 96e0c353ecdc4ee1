//! fleetd's configuration, with fleet's keys, in layers: the config file (`--config` or
//! `/etc/fleet/fleet.conf`, `key=value` lines, [`file`]), then `FLEET_<KEY>` environment
//! variables, then flags (`--agent-ttl 3s`), then `--set key=value`, each overriding the one
//! before. A bad value is a startup error naming the key and where it came from.
//!
//! A key is declared once, as a row of [`KEYS`] (`config/keys.rs`): its name gives its flag,
//! its variable and its file line; its default is the lowest layer (checked like any value,
//! and shown by `--help` and the sample); its setter parses, checks and stores its value.
//! What concerns several keys (TLS files that go together, a user that needs a password, a
//! default that follows another key) is checked once every key is read, by `resolve`, one
//! pass over the typed values. Keys fleet has that fleetd accepts but does not use are rows
//! too (`Kind::Ignored`): each one given is returned by [`build`] so that fleetd warns about
//! it, naming the key.

mod api;
#[cfg(test)]
mod deploy_doc;
mod etcd_auth;
mod file;
mod key;
mod keys;
mod layers;
mod sample;
mod secrets;
mod units_dir;
mod values;

pub use api::{
    Advertise, ApiConfig, ApiTlsFiles, DEFAULT_SOCKET_GROUP, ListenAddr, SocketAccess, SocketGroup,
};
pub use key::Key;
pub use keys::KEYS;
pub use layers::{Given, load};
pub use sample::sample;

use anyhow::{Result, anyhow, bail};
use fleet_registry::input::shorten;
use fleet_registry::kv::{EtcdAuth, TlsFiles};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::logging::LogFormat;
use key::{Kind, Parsed, Unset, invalid};

/// The configuration, typed. `Default` is only the blank its rows write into: fleet's
/// defaults are the rows' own (`build` of no values).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    pub etcd_servers: Vec<String>,
    pub etcd_key_prefix: String,
    pub etcd_cafile: Option<PathBuf>,
    pub etcd_certfile: Option<PathBuf>,
    pub etcd_keyfile: Option<PathBuf>,
    pub etcd_request_timeout: Duration,
    /// `etcd_username` and its password (`config/etcd_auth.rs`); `Debug` hides the password.
    pub etcd_auth: Option<EtcdAuth>,
    pub public_ip: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub agent_ttl: Duration,
    /// How long events are kept at least (issue 41; docs/registry.md, "Events").
    pub event_retention: Duration,
    pub units_directory: PathBuf,
    pub engine_reconcile_interval: Duration,
    /// Rescheduling holds while more than this share of the machines vanished within one
    /// `agent_ttl` (docs/engine.md, *Vanished machines*).
    pub engine_disruption_threshold: f64,
    /// How long the units of machines that vanished in such a disruption stay for them.
    pub engine_disruption_grace: Duration,
    /// Units of lost machines moved per second at most (0: no limit).
    pub engine_move_rate: u32,
    pub disable_engine: bool,
    /// No fence in systemd (`fleet_core::fence`): a fleetd that stops or hangs leaves its
    /// units running, as fleet did.
    pub disable_fence: bool,
    /// Take small unit files from the schedule entries that carry them, and write them there
    /// as an engine (issue 43; docs/security.md says what it costs).
    pub trust_engine_files: bool,
    pub verbosity: u8,
    /// `RUST_LOG`-style directives; over `RUST_LOG` and `verbosity` (`logging.rs`).
    pub log_filter: Option<String>,
    pub log_format: LogFormat,
    /// Unit name globs fleetd refuses to manage (it would take over the host).
    pub deny_units: Vec<String>,
    /// The HTTP API's keys (`config/api.rs`).
    pub api: ApiConfig,
}

/// Units no fleet user should be able to take over a host with.
pub const DEFAULT_DENY_UNITS: &str = "fleetd.service,fleet.service,dbus.service,dbus.socket,systemd-*,ssh.service,sshd.service,ssh.socket,etcd.service,etcd*.service";

impl Config {
    pub fn tls(&self) -> TlsFiles {
        TlsFiles {
            ca_file: self.etcd_cafile.clone(),
            cert_file: self.etcd_certfile.clone(),
            key_file: self.etcd_keyfile.clone(),
        }
    }
}

/// A raw value and where it came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raw {
    pub value: String,
    pub source: String,
}

/// A key fleet has that was given, although fleetd does nothing with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ignored {
    pub key: &'static str,
    pub source: String,
}

/// What fleetd warns about once logging is up: the configuration works, but is not as meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    Ignored(Ignored),
    /// The etcd password goes to `endpoint` over plain `http://` (issue 37): whoever sees
    /// the network may read it.
    PasswordInClear {
        endpoint: String,
    },
}

fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// Builds the configuration from the layered raw values; `warnings` receives the keys given
/// that fleetd does nothing with. Each key's value (given, else its default) goes through
/// its row's setter, in the table's order; then [`resolve`] checks across keys.
pub fn build(raw: &BTreeMap<String, Raw>, warnings: &mut Vec<Warning>) -> Result<Config> {
    if let Some((k, r)) = raw.iter().find(|(k, _)| key(k).is_none()) {
        bail!("unknown config key {:?} ({})", shorten(k), r.source);
    }
    let mut parsed = Parsed::default();
    for key in KEYS {
        let default;
        let r = match (raw.get(key.name), key.unset) {
            (Some(r), _) => r,
            (None, Unset::Value(value)) => {
                let (value, source) = (value.to_owned(), "default".to_owned());
                default = Raw { value, source };
                &default
            }
            (None, Unset::Derived(_) | Unset::Nothing) => continue,
        };
        match key.kind {
            Kind::Value(set) | Kind::Switch(set) | Kind::Secret(set) => {
                set(&mut parsed, &r.value).map_err(|why| key.refusal(r, &why))?;
            }
            Kind::Ignored => warnings.push(Warning::Ignored(Ignored {
                key: key.name,
                source: r.source.clone(),
            })),
        }
    }
    resolve(parsed, raw)
}

/// The checks across keys, one pass over the typed values once every key is read, and the
/// one default that follows another key; `raw` (the values given) names where a refused
/// value came from.
fn resolve(parsed: Parsed, raw: &BTreeMap<String, Raw>) -> Result<Config> {
    let Parsed {
        mut config,
        api,
        etcd_auth,
    } = parsed;
    api::resolve(&mut config.api, api, raw)?;
    config.etcd_auth = etcd_auth::resolve(etcd_auth, raw)?;
    // Two TTLs (docs/engine.md, *Vanished machines*).
    if !raw.contains_key("engine_disruption_grace") {
        config.engine_disruption_grace = 2 * config.agent_ttl;
    }
    // The endpoints and the TLS files make sense only together (https:// for the files).
    if let Err(e) = fleet_registry::input::check_endpoints(&config.etcd_servers, &config.tls()) {
        return Err(match raw.get("etcd_servers") {
            Some(r) => invalid("etcd_servers", r, &e.to_string()),
            None => anyhow!(e),
        });
    }
    Ok(config)
}

#[cfg(test)]
mod tests;
