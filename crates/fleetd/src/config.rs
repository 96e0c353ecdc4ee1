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
mod sample;
mod secrets;
mod units_dir;
mod values;

pub use api::{
    Advertise, ApiConfig, ApiTlsFiles, DEFAULT_SOCKET_GROUP, ListenAddr, SocketAccess, SocketGroup,
};
pub use sample::sample;

use anyhow::{Result, anyhow, bail};
use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Command};
use fleet_registry::DEFAULT_PREFIX;
use fleet_registry::input::shorten;
use fleet_registry::kv::{EtcdAuth, TlsFiles};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::logging::LogFormat;
use file::load_file;
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
    if config.etcd_auth.is_some() {
        warnings.extend(
            config
                .etcd_servers
                .iter()
                .filter(|e| e.starts_with("http://"))
                .map(|e| Warning::PasswordInClear {
                    endpoint: e.clone(),
                }),
        );
    }
    Ok(config)
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
mod tests {
    use super::file::{load_file, parse_file};
    use super::values::parse_metadata;
    use super::*;
    use clap::{Args, FromArgMatches};
    use fleet_engine::DisruptionConfig;

    fn raw(pairs: &[(&str, &str)]) -> BTreeMap<String, Raw> {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    Raw {
                        value: v.to_string(),
                        source: "test".into(),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn disruption_settings_default_to_half_two_ttls_and_the_engines_move_rate() {
        let c = build(&raw(&[("agent_ttl", "3s")]), &mut vec![]).unwrap();
        assert_eq!(c.engine_disruption_threshold, 0.5);
        assert_eq!(c.engine_disruption_grace, Duration::from_secs(6));
        assert_eq!(c.engine_move_rate, DisruptionConfig::DEFAULT_MOVE_RATE);
        assert_eq!(c.engine_move_rate, 2000);
        let c = build(
            &raw(&[
                ("engine_disruption_threshold", "0.34"),
                ("engine_disruption_grace", "1m"),
                ("engine_move_rate", "0"),
            ]),
            &mut vec![],
        )
        .unwrap();
        assert_eq!(c.engine_disruption_threshold, 0.34);
        assert_eq!(c.engine_disruption_grace, Duration::from_secs(60));
        assert_eq!(c.engine_move_rate, 0);
        let e = build(&raw(&[("engine_disruption_threshold", "2")]), &mut vec![]).unwrap_err();
        assert!(e.to_string().contains("between 0 and 1"), "{e}");
        let e = build(&raw(&[("engine_move_rate", "-1")]), &mut vec![]).unwrap_err();
        assert!(e.to_string().contains("units per second"), "{e}");
    }

    #[test]
    fn log_filter_and_format_are_checked_at_startup() {
        let c = build(
            &raw(&[
                ("log_filter", "warn,fleet_agent=debug"),
                ("log_format", "json"),
            ]),
            &mut vec![],
        )
        .unwrap();
        assert_eq!(c.log_filter.as_deref(), Some("warn,fleet_agent=debug"));
        assert_eq!(c.log_format, LogFormat::Json);
        let e = build(&raw(&[("log_filter", "fleet_agent=loud")]), &mut vec![]).unwrap_err();
        assert!(e.to_string().contains("invalid log_filter"), "{e}");
        let e = build(&raw(&[("log_format", "xml")]), &mut vec![]).unwrap_err();
        assert!(e.to_string().contains("json"), "{e}");
    }

    #[test]
    fn defaults_are_fleets() {
        let c = build(&raw(&[]), &mut vec![]).unwrap();
        assert_eq!(c.etcd_servers, vec!["http://127.0.0.1:2379"]);
        assert_eq!(c.etcd_key_prefix, "/_coreos.com/fleet/");
        assert_eq!(c.agent_ttl, Duration::from_secs(30));
        assert_eq!(c.units_directory, PathBuf::from("/run/fleet/units"));
        assert_eq!(c.engine_reconcile_interval, Duration::from_secs(2));
        assert_eq!(c.etcd_request_timeout, Duration::from_secs(1));
        assert!(!c.disable_engine);
        assert_eq!(c.verbosity, 0);
        assert_eq!((c.log_filter, c.log_format), (None, LogFormat::Auto));
        assert_eq!(c.deny_units, split_globs(DEFAULT_DENY_UNITS));
        assert_eq!((c.public_ip, c.etcd_cafile), (None, None));
    }

    fn parse_duration(s: &str) -> Result<Duration, String> {
        duration_in(s, Syntax::Go, Duration::ZERO)
    }

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("abc").is_err());
    }

    #[test]
    fn accepts_both_list_forms_for_etcd_servers() {
        let c = build(
            &raw(&[("etcd_servers", r#"["http://a:1","http://b:2"]"#)]),
            &mut vec![],
        )
        .unwrap();
        assert_eq!(c.etcd_servers, vec!["http://a:1", "http://b:2"]);
        let c = build(
            &raw(&[("etcd_servers", "http://a:1,http://b:2")]),
            &mut vec![],
        )
        .unwrap();
        assert_eq!(c.etcd_servers, vec!["http://a:1", "http://b:2"]);
    }

    #[test]
    fn bad_values_name_the_key_and_source() {
        let e = build(&raw(&[("agent_ttl", "forever")]), &mut vec![]).unwrap_err();
        assert!(
            e.to_string()
                .contains("invalid agent_ttl \"forever\" (test)"),
            "{e}"
        );
        let e = build(&raw(&[("metadata", "region")]), &mut vec![]).unwrap_err();
        assert!(e.to_string().contains("metadata"), "{e}");
        let e = build(&raw(&[("disable_engine", "maybe")]), &mut vec![]).unwrap_err();
        assert!(e.to_string().contains("disable_engine"), "{e}");
        let e = build(&raw(&[("etcd_servers", "127.0.0.1:2379")]), &mut vec![]).unwrap_err();
        assert!(e.to_string().contains("not an http"), "{e}");
    }

    #[test]
    fn unknown_keys_are_errors_and_retired_ones_warnings() {
        assert!(build(&raw(&[("etcd_servrs", "x")]), &mut vec![]).is_err());
        let mut warnings = vec![];
        build(&raw(&[("verify_units", "true")]), &mut warnings).unwrap();
        assert_eq!(warnings.len(), 1);
    }

    #[test]
    fn parses_metadata_pairs() {
        let m = parse_metadata("region=us-west, az = a").unwrap();
        assert_eq!(m["region"], "us-west");
        assert_eq!(m["az"], "a");
    }

    #[test]
    fn reads_config_files_with_comments() {
        let m = parse_file(
            Path::new("f.conf"),
            "# comment\nagent_ttl=\"3s\"\n\npublic_ip = 10.0.0.2\n",
        )
        .unwrap();
        assert_eq!(m["agent_ttl"].value, "3s");
        assert_eq!(m["public_ip"].value, "10.0.0.2");
        assert!(parse_file(Path::new("f.conf"), "garbage\n").is_err());
    }

    /// clap's name for the command (a constant, so that no `Command::new` names a program:
    /// functional-tests/tests/packages.rs lists every program the code runs by name).
    const BIN: &str = "fleetd";

    fn flags(args: &[&str]) -> Given {
        let cmd = Given::augment_args(Command::new(BIN).no_binary_name(true));
        let matches = cmd.try_get_matches_from(args).unwrap();
        Given::from_arg_matches(&matches).unwrap()
    }

    #[test]
    fn every_key_is_a_flag_and_a_fleet_variable() {
        let cmd = Given::augment_args(Command::new(BIN));
        cmd.clone().debug_assert();
        for key in KEYS {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_id() == key.name)
                .unwrap();
            assert_eq!(arg.get_long(), Some(key.name.replace('_', "-").as_str()));
            let env = arg.get_env().unwrap().to_str().unwrap();
            assert_eq!(env, format!("FLEET_{}", key.name.to_uppercase()));
            let help = arg.get_help().unwrap().to_string();
            if let Some(default) = key.default {
                assert!(help.ends_with(&format!("[default: {default}]")), "{help}");
            }
        }
        let given = flags(&["--agent-ttl", "5s", "--disable-engine", "--verbosity=2"]);
        let pairs: Vec<_> = given
            .0
            .iter()
            .map(|(k, r)| (k.as_str(), r.value.as_str(), r.source.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("agent_ttl", "5s", "flag --agent-ttl"),
                ("disable_engine", "true", "flag --disable-engine"),
                ("verbosity", "2", "flag --verbosity"),
            ]
        );
    }

    #[test]
    fn set_overrides_flags_which_override_the_file() {
        let dir = std::env::temp_dir().join(format!("fleetd-layers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("fleet.conf");
        std::fs::write(&path, "agent_ttl=1s\nverbosity=1\nmetadata=a=b\n").unwrap();
        let load = |args: &[&str], set: &[&str]| {
            let set: Vec<String> = set.iter().map(|s| s.to_string()).collect();
            load(Some(&path), &flags(args), &set, &mut vec![])
        };
        let c = load(&["--agent-ttl=2s", "--verbosity=2"], &["agent_ttl=3s"]).unwrap();
        assert_eq!(c.agent_ttl, Duration::from_secs(3));
        assert_eq!(c.verbosity, 2);
        assert_eq!(c.metadata["a"], "b");
        let c = load(&[], &[]).unwrap();
        assert_eq!((c.agent_ttl, c.verbosity), (Duration::from_secs(1), 1));
        let e = load(&["--agent-ttl=soon"], &[]).unwrap_err().to_string();
        assert!(
            e.contains("invalid agent_ttl \"soon\" (flag --agent-ttl)"),
            "{e}"
        );
        let e = load(&[], &["agent_ttl=later"]).unwrap_err().to_string();
        assert!(
            e.contains("invalid agent_ttl \"later\" (flag --set)"),
            "{e}"
        );
        let e = load(&[], &["agent_tll=3s"]).unwrap_err().to_string();
        assert!(
            e.contains("unknown config key \"agent_tll\" (flag --set)"),
            "{e}"
        );
        std::fs::write(&path, "agent_ttl=never\n").unwrap();
        let e = load(&[], &[]).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        let at = format!("({}:1)", path.display());
        assert!(
            e.contains("invalid agent_ttl \"never\"") && e.contains(&at),
            "{e}"
        );
    }

    #[test]
    fn warns_about_each_key_it_accepts_but_does_not_use_by_name() {
        let mut ignored = vec![];
        let given = flags(&["--disable-watches=true", "--agent-ttl=3s"]);
        let mut layers = given.0;
        layers.extend(raw(&[("enable_grpc", "true")]));
        build(&layers, &mut ignored).unwrap();
        let keys: Vec<_> = ignored
            .iter()
            .filter_map(|w| match w {
                Warning::Ignored(i) => Some((i.key, i.source.as_str())),
                Warning::PasswordInClear { .. } => None,
            })
            .collect();
        assert_eq!(
            keys,
            [
                ("disable_watches", "flag --disable-watches"),
                ("enable_grpc", "test")
            ]
        );
    }

    fn refusal(pairs: &[(&str, &str)]) -> String {
        match build(&raw(pairs), &mut vec![]) {
            Ok(c) => panic!("{pairs:?} was accepted: {c:?}"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn refuses_out_of_range_durations_instead_of_panicking() {
        let table: &[(&str, &str, &str)] = &[
            (
                "agent_ttl",
                "99999999999999999999s",
                "must be at most 86400s (a day)",
            ),
            ("agent_ttl", "25h", "must be at most 86400s"),
            ("agent_ttl", "500ms", "must be at least 1s"),
            ("agent_ttl", "0s", "must be at least 1s"),
            ("agent_ttl", "0", "must be at least 1s"),
            ("etcd_request_timeout", "1e19", "must be at most 86400s"),
            (
                "etcd_request_timeout",
                "99999999999999999999",
                "must be at most",
            ),
            (
                "etcd_request_timeout",
                "0",
                "expected a positive number of seconds",
            ),
            (
                "etcd_request_timeout",
                "-1",
                "expected a positive number of seconds",
            ),
            ("etcd_request_timeout", "1e-12", "must be at least 0.001"),
            ("etcd_request_timeout", "inf", "is not a number of seconds"),
            ("etcd_request_timeout", "NaN", "is not a number of seconds"),
            (
                "engine_reconcile_interval",
                "1e-300",
                "must be at least 0.001",
            ),
            ("engine_reconcile_interval", "1e300", "must be at most"),
        ];
        for (k, v, want) in table {
            let e = refusal(&[(k, v)]);
            assert!(
                e.contains(&format!("invalid {k}")) && e.contains(want),
                "{k}={v}: {e}"
            );
        }
        let c = build(
            &raw(&[("agent_ttl", "24h"), ("etcd_request_timeout", "0.5")]),
            &mut vec![],
        )
        .unwrap();
        assert_eq!(c.agent_ttl, Duration::from_secs(86400));
        assert_eq!(c.etcd_request_timeout, Duration::from_millis(500));
    }

    #[test]
    fn refuses_loose_values_fleet_accepted() {
        let table: &[(&[(&str, &str)], &str)] = &[
            (
                &[("public_ip", "not.an.ip")],
                "invalid public_ip \"not.an.ip\"",
            ),
            (
                &[("public_ip", "10.0.0.300")],
                "expected an IPv4 or IPv6 address",
            ),
            (&[("etcd_key_prefix", "")], "invalid etcd_key_prefix \"\""),
            (&[("etcd_key_prefix", "/")], "is etcd's root"),
            (&[("etcd_key_prefix", "/a\nb")], "control character"),
            (
                &[("deny_units", "[")],
                "deny_units \"[\" is not a valid glob",
            ),
            (
                &[("deny_units", "")],
                "write deny_units=none to manage every unit",
            ),
            (
                &[("deny_units", "a.service,b c.service")],
                "can never match a unit name",
            ),
            (&[("metadata", "a=b,a=c")], "key \"a\" is given twice"),
            (
                &[("metadata", "a=b\u{1b}[2J")],
                "the value of \"a\" holds a control character",
            ),
            (&[("units_directory", "")], "invalid units_directory \"\""),
            (&[("units_directory", "/")], "is the root directory"),
            (
                &[("units_directory", "/etc/systemd/system")],
                "one of systemd's directories",
            ),
            (
                &[("etcd_servers", "ftp://h:1")],
                "scheme \"ftp\" is not supported",
            ),
            (
                &[("etcd_servers", "notaurl")],
                "not an http:// or https:// URL",
            ),
            (
                &[("etcd_servers", "http://h:99999")],
                "port \"99999\" is not a port",
            ),
            (
                &[("etcd_servers", "unix:///run/etcd.sock")],
                "unix sockets are not supported yet",
            ),
            (
                &[
                    ("etcd_servers", "http://h:1"),
                    ("etcd_cafile", "/etc/hostname"),
                ],
                "the etcd endpoints are http://",
            ),
            (
                &[
                    ("etcd_servers", "https://h:1"),
                    ("etcd_cafile", "/dev/zero"),
                ],
                "cannot read /dev/zero: not a regular file",
            ),
            (
                &[
                    ("etcd_servers", "https://h:1"),
                    ("etcd_cafile", "/nonexistent/ca.pem"),
                ],
                "cannot read /nonexistent/ca.pem",
            ),
        ];
        for (pairs, want) in table {
            let e = refusal(pairs);
            assert!(e.contains(want), "{pairs:?}: {e}");
        }
        let c = build(
            &raw(&[("public_ip", "fe80::1"), ("metadata", "a=b,c=d")]),
            &mut vec![],
        )
        .unwrap();
        assert_eq!(c.public_ip.as_deref(), Some("fe80::1"));
    }

    #[test]
    fn echoes_at_most_200_characters_of_a_value_or_line() {
        let long = "x".repeat(50_000);
        let e = refusal(&[("public_ip", &long)]);
        assert!(e.len() < 400, "{} bytes", e.len());
        let e = parse_file(Path::new("f.conf"), &long)
            .unwrap_err()
            .to_string();
        assert!(e.len() < 400 && e.contains('…'), "{} bytes", e.len());
    }

    #[test]
    fn reads_at_most_a_mebibyte_of_config_and_no_device() {
        let e = load_file(Some(Path::new("/dev/zero"))).unwrap_err();
        assert!(format!("{e:#}").contains("not a regular file"), "{e:#}");
        let dir = std::env::temp_dir().join(format!("fleetd-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.conf");
        let line = format!("# {}\n", "x".repeat(1000));
        std::fs::write(&big, line.repeat(1100)).unwrap();
        let e = load_file(Some(&big)).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            format!("{e:#}").contains("larger than 1048576 bytes"),
            "{e:#}"
        );
    }
}
