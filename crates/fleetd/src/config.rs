//! fleetd's configuration, with fleet's keys, in layers: the config file (`--config` or
//! `/etc/fleet/fleet.conf`, `key=value` lines, [`file`]), then `FLEET_<KEY>` environment
//! variables, then flags (`--agent-ttl 3s`), then `--set key=value`, each overriding the one
//! before. A bad value is a startup error naming the key and where it came from.
//!
//! A key is declared once, as a row of [`KEYS`]: its name gives its flag, its variable and its
//! file line; its default is the lowest layer (checked like any value, and shown by
//! `--help`); its setter parses, checks and stores its value in [`Config`]. Keys fleet has
//! that fleetd accepts but does not use are rows too ([`Kind::Ignored`]): each one given is
//! returned by [`build`] so that fleetd warns about it, naming the key.

mod api;
#[cfg(test)]
mod deploy_doc;
mod etcd_auth;
mod file;
mod layers;
mod sample;
mod secrets;
mod units_dir;
mod values;

pub use api::{
    Advertise, ApiConfig, ApiTlsFiles, DEFAULT_SOCKET_GROUP, ListenAddr, SocketAccess, SocketGroup,
};
pub use layers::{Given, load};
pub use sample::sample;

use anyhow::{Result, anyhow, bail};
use clap::Arg;
use fleet_registry::DEFAULT_PREFIX;
use fleet_registry::input::shorten;
use fleet_registry::kv::{EtcdAuth, TlsFiles};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::logging::LogFormat;
use values::{MIN_INTERVAL, SECOND, Syntax, duration_in, parse_bool, parse_list, split_globs};

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

/// One configuration key: `agent_ttl` is the flag `--agent-ttl`, the variable
/// `FLEET_AGENT_TTL` and the file line `agent_ttl=...`.
#[derive(Debug)]
pub struct Key {
    pub name: &'static str,
    /// The value when no layer gives one, checked as if given (source "default").
    default: Option<&'static str>,
    help: &'static str,
    kind: Kind,
}

/// Parses, checks and stores a key's value; the error says why it is refused.
type Setter = fn(&mut Config, &str) -> Result<(), String>;

#[derive(Debug)]
enum Kind {
    /// Takes a value: `--agent-ttl 3s`.
    Value(Setter),
    /// A boolean whose flag alone means true: `--disable-engine`.
    Switch(Setter),
    /// The API's: read together by `config/api.rs` (`api_listen` depends on
    /// `api_allow_plain_tcp`).
    Api,
    /// etcd's user and password: read together by `config/etcd_auth.rs`.
    EtcdAuth,
    /// fleet has it; fleetd accepts it, does nothing with it and warns.
    Ignored,
}

impl Key {
    const fn value(
        name: &'static str,
        default: Option<&'static str>,
        help: &'static str,
        set: Setter,
    ) -> Self {
        Self {
            name,
            default,
            help,
            kind: Kind::Value(set),
        }
    }

    const fn switch(name: &'static str, help: &'static str, set: Setter) -> Self {
        Self {
            name,
            default: Some("false"),
            help,
            kind: Kind::Switch(set),
        }
    }

    const fn api(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            default: None,
            help,
            kind: Kind::Api,
        }
    }

    const fn etcd_auth(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            default: None,
            help,
            kind: Kind::EtcdAuth,
        }
    }

    const fn ignored(name: &'static str) -> Self {
        Self {
            name,
            default: None,
            help: "accepted as fleet does, and ignored",
            kind: Kind::Ignored,
        }
    }

    fn flag(&self) -> String {
        self.name.replace('_', "-")
    }

    fn env(&self) -> String {
        format!("FLEET_{}", self.name.to_ascii_uppercase())
    }

    fn arg(&self) -> Arg {
        let arg = Arg::new(self.name)
            .long(self.flag())
            .env(self.env())
            .value_name("VALUE")
            .help(match self.default {
                Some(d) => format!("{} [default: {d}]", self.help),
                None => self.help.to_owned(),
            });
        match self.kind {
            Kind::Value(_) | Kind::Api => arg,
            // `--help` would show a password given in the environment.
            Kind::EtcdAuth => arg.hide_env_values(true),
            Kind::Switch(_) => arg.num_args(0..=1).default_missing_value("true"),
            Kind::Ignored => arg.hide(true),
        }
    }
}

/// Every key fleetd accepts, in the order their values are checked.
pub const KEYS: &[Key] = &[
    Key::value(
        "etcd_servers",
        Some("http://127.0.0.1:2379"),
        "etcd endpoints, `a,b` or `[\"a\",\"b\"]`",
        |c, v| {
            c.etcd_servers = parse_list(v)?;
            match c.etcd_servers.iter().find(|s| !s.contains("://")) {
                Some(s) => Err(format!(
                    "{:?} is not an http:// or https:// URL",
                    shorten(s)
                )),
                None => Ok(()),
            }
        },
    ),
    Key::value(
        "etcd_key_prefix",
        Some(DEFAULT_PREFIX),
        "key prefix of the fleet registry in etcd",
        |c, v| {
            fleet_registry::input::check_prefix(v).map_err(|e| e.to_string())?;
            c.etcd_key_prefix = v.to_owned();
            Ok(())
        },
    ),
    Key::value(
        "etcd_cafile",
        None,
        "CA file for etcd's TLS certificate",
        |c, v| {
            c.etcd_cafile = non_empty_path(v);
            Ok(())
        },
    ),
    Key::value(
        "etcd_certfile",
        None,
        "client certificate for etcd TLS",
        |c, v| {
            c.etcd_certfile = non_empty_path(v);
            Ok(())
        },
    ),
    Key::value("etcd_keyfile", None, "client key for etcd TLS", |c, v| {
        c.etcd_keyfile = non_empty_path(v);
        Ok(())
    }),
    Key::etcd_auth(
        "etcd_username",
        "etcd user to authenticate as (with etcd_password_file or etcd_password)",
    ),
    Key::etcd_auth(
        "etcd_password_file",
        "file whose first line is etcd_username's password (keep it mode 0600)",
    ),
    Key::etcd_auth(
        "etcd_password",
        "etcd_username's password (fleet's key; prefer etcd_password_file)",
    ),
    Key::value(
        "public_ip",
        None,
        "the IP address published for this machine (unset: the default route's)",
        |c, v| {
            c.public_ip = match v {
                "" => None,
                v => match v.parse::<std::net::IpAddr>() {
                    Ok(ip) => Some(ip.to_string()),
                    Err(_) => return Err("expected an IPv4 or IPv6 address".into()),
                },
            };
            Ok(())
        },
    ),
    Key::value(
        "units_directory",
        Some("/run/fleet/units"),
        "where unit files are written, fleetd's own",
        |c, v| {
            c.units_directory = units_dir::check(v)?;
            Ok(())
        },
    ),
    Key::value(
        "metadata",
        None,
        "this machine's metadata, `k=v,k2=v2`",
        |c, v| {
            c.metadata = values::parse_metadata(v)?;
            Ok(())
        },
    ),
    Key::value("verbosity", Some("0"), "above 0: debug logs", |c, v| {
        c.verbosity = v
            .parse()
            .map_err(|_| "expected a small whole number".to_owned())?;
        Ok(())
    }),
    Key::value(
        "log_filter",
        None,
        "what to log, RUST_LOG-style, e.g. `info,fleet_engine=debug` [default: RUST_LOG, else from verbosity]",
        |c, v| {
            crate::logging::check_filter(v)?;
            c.log_filter = Some(v.to_owned()).filter(|v| !v.is_empty());
            Ok(())
        },
    ),
    Key::value(
        "log_format",
        Some("auto"),
        "auto (the journal under systemd, else text), text, json or journal",
        |c, v| {
            c.log_format = v.parse()?;
            Ok(())
        },
    ),
    Key::value(
        "agent_ttl",
        Some("30s"),
        "TTL of this machine's presence and states, a Go duration",
        |c, v| {
            c.agent_ttl = duration_in(v, Syntax::Go, SECOND)?;
            Ok(())
        },
    ),
    Key::value(
        "deny_units",
        Some(DEFAULT_DENY_UNITS),
        "unit name globs fleetd refuses to manage, `a,b*`; `none`: every unit may be managed",
        |c, v| {
            // Empty dropped the default protection without a word (issue 38): it must be said.
            if v.trim().is_empty() {
                return Err(
                    "is empty, which would drop the protection of fleetd, dbus, systemd's \
                            own units, ssh and etcd; write deny_units=none to manage every unit"
                        .into(),
                );
            }
            if v.trim() == "none" {
                c.deny_units = Vec::new();
                return Ok(());
            }
            let globs = split_globs(v);
            for glob in &globs {
                fleet_core::xfleet::check_glob("deny_units", glob).map_err(|e| e.to_string())?;
            }
            c.deny_units = globs;
            Ok(())
        },
    ),
    Key::value(
        "engine_disruption_threshold",
        Some("0.5"),
        "rescheduling holds while more than this share of the machines vanished",
        |c, v| {
            c.engine_disruption_threshold = v
                .parse::<f64>()
                .ok()
                .filter(|v| (0.0..=1.0).contains(v))
                .ok_or("expected a share between 0 and 1 (1: never hold)")?;
            Ok(())
        },
    ),
    Key::value(
        "engine_move_rate",
        // fleet_engine::DisruptionConfig::DEFAULT_MOVE_RATE (a test holds them equal).
        Some("2000"),
        "units of lost machines moved per second at most, 0: no limit",
        |c, v| {
            c.engine_move_rate = v
                .parse::<u32>()
                .map_err(|_| "expected a whole number of units per second (0: no limit)")?;
            Ok(())
        },
    ),
    Key::value(
        "etcd_request_timeout",
        Some("1"),
        "seconds to wait for each etcd request",
        |c, v| {
            c.etcd_request_timeout = duration_in(v, Syntax::Seconds, MIN_INTERVAL)?;
            Ok(())
        },
    ),
    Key::value(
        "engine_reconcile_interval",
        Some("2"),
        "seconds between the engine's passes when nothing changes",
        |c, v| {
            c.engine_reconcile_interval = duration_in(v, Syntax::Seconds, MIN_INTERVAL)?;
            Ok(())
        },
    ),
    Key::value(
        "engine_disruption_grace",
        None,
        "how long units of machines lost in a disruption wait for them [default: 2 x agent_ttl]",
        |c, v| {
            c.engine_disruption_grace = duration_in(v, Syntax::Go, MIN_INTERVAL)?;
            Ok(())
        },
    ),
    Key::switch(
        "disable_engine",
        "never run the engine on this machine",
        |c, v| {
            c.disable_engine = parse_bool(v).ok_or("expected true or false")?;
            Ok(())
        },
    ),
    Key::switch(
        "disable_fence",
        "never arm the fence: a stopped or hung fleetd then leaves its units running while the engine starts them elsewhere (docs/guarantees.md, promise 2)",
        |c, v| {
            c.disable_fence = parse_bool(v).ok_or("expected true or false")?;
            Ok(())
        },
    ),
    Key::api("token_limit", "entries per page of the API [default: 100]"),
    Key::api(
        "api_socket",
        "the API's unix socket when systemd passes none, empty: none [default: /var/run/fleet.sock]",
    ),
    Key::api(
        "api_listen",
        "more API listeners, `unix:PATH` or `tcp:HOST:PORT`, comma-separated",
    ),
    Key::api(
        "api_cafile",
        "CA whose client certificates the API's TLS listeners require (with api_certfile, api_keyfile)",
    ),
    Key::api(
        "api_certfile",
        "certificate (PEM) of the API's TLS listeners: every TCP listener then serves TLS",
    ),
    Key::api("api_keyfile", "private key (PEM) of api_certfile"),
    Key::api(
        "api_allow_plain_tcp",
        "let api_listen take plain TCP on other than loopback addresses [default: false]",
    ),
    Key::api(
        "api_advertise",
        "URL other machines reach this API at, `https://HOST:PORT`, empty: none [default: from the first TCP listener]",
    ),
    Key::api(
        "api_admins",
        "client certificate subjects (`CN=name` or `O=group`, comma-separated) with the API's admin role",
    ),
    Key::api(
        "api_operators",
        "client certificate subjects with the API's operator role (every read and change of units)",
    ),
    Key::api(
        "api_viewers",
        "client certificate subjects with the API's viewer role (every read)",
    ),
    Key::api(
        "api_deny",
        "client certificate subjects (`CN=name` or `O=group`) refused everything, whatever role their other names give",
    ),
    Key::api(
        "api_crlfile",
        "PEM certificate revocation lists of api_cafile's authority; a revoked client certificate fails the handshake (read again when it changes)",
    ),
    Key::api(
        "api_socket_group",
        "group (name or number) of the API's unix sockets fleetd makes [default: fleet if it exists]",
    ),
    Key::api(
        "api_socket_mode",
        "octal mode of the API's unix sockets fleetd makes [default: 0660]",
    ),
    Key::api(
        "api_held_view",
        "serve the listing of every unit from a view of the registry held while listings come (false: every page reads etcd) [default: true]",
    ),
    // fleetd always watches; a periodic resync is there anyway (docs/agent.md).
    Key::ignored("disable_watches"),
    Key::ignored("verify_units"),
    Key::ignored("authorized_keys_file"),
    Key::ignored("systemd_user"),
    Key::ignored("enable_grpc"),
];

fn non_empty_path(v: &str) -> Option<PathBuf> {
    (!v.is_empty()).then(|| PathBuf::from(v))
}

fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// Builds the configuration from the layered raw values; `warnings` receives the keys given
/// that fleetd does nothing with.
pub fn build(raw: &BTreeMap<String, Raw>, warnings: &mut Vec<Warning>) -> Result<Config> {
    if let Some((k, r)) = raw.iter().find(|(k, _)| key(k).is_none()) {
        bail!("unknown config key {:?} ({})", shorten(k), r.source);
    }
    let mut config = Config::default();
    for key in KEYS {
        let default;
        let r = match (raw.get(key.name), key.default) {
            (Some(r), _) => r,
            (None, Some(value)) => {
                let (value, source) = (value.to_owned(), "default".to_owned());
                default = Raw { value, source };
                &default
            }
            (None, None) => continue,
        };
        match key.kind {
            Kind::Value(set) | Kind::Switch(set) => {
                set(&mut config, &r.value).map_err(|why| invalid(key.name, r, why))?;
            }
            Kind::Api | Kind::EtcdAuth => {}
            Kind::Ignored => warnings.push(Warning::Ignored(Ignored {
                key: key.name,
                source: r.source.clone(),
            })),
        }
    }
    config.api = api::build(raw)?;
    config.etcd_auth = etcd_auth::build(raw)?;
    // The one default that follows another key: two TTLs (docs/engine.md, *Vanished machines*).
    if !raw.contains_key("engine_disruption_grace") {
        config.engine_disruption_grace = 2 * config.agent_ttl;
    }
    // The endpoints and the TLS files make sense only together (https:// for the files).
    if let Err(e) = fleet_registry::input::check_endpoints(&config.etcd_servers, &config.tls()) {
        return Err(match raw.get("etcd_servers") {
            Some(r) => invalid("etcd_servers", r, e.to_string()),
            None => anyhow!(e),
        });
    }
    Ok(config)
}

fn invalid(key: &str, r: &Raw, why: String) -> anyhow::Error {
    anyhow!(
        "invalid {key} {:?} ({}): {why}",
        shorten(&r.value),
        r.source
    )
}

#[cfg(test)]
mod tests;
