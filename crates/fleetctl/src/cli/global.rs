//! fleetctl's global flags ([`Global`]): the endpoint, the driver, TLS, the tunnel and the
//! timeouts, each with its `FLEETCTL_<FLAG>` default, and the parsers that check their values.
//! Declares flags only: what a flag does is up to the driver and the commands.

use clap::{Args, ValueHint};

use crate::driver::Driver;

/// Flags every command takes, each also read from `FLEETCTL_<FLAG>`, listed by `fleetctl
/// --help` under their own heading ([`command`]).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Global options")]
pub struct Global {
    /// Location of the fleet API with --driver=api (unix:///PATH, http://HOST:PORT or
    /// https://HOST:PORT), or of etcd with --driver=etcd (comma-separated URLs).
    /// [default: unix:///var/run/fleet.sock; with --driver=etcd, http://127.0.0.1:2379]
    #[arg(long, global = true, env = "FLEETCTL_ENDPOINT", value_hint = ValueHint::Url)]
    pub endpoint: Option<String>,
    /// Key prefix of the fleet registry in etcd.
    #[arg(long, global = true, env = "FLEETCTL_ETCD_KEY_PREFIX", default_value = fleet_registry::DEFAULT_PREFIX, value_hint = ValueHint::Other)]
    pub etcd_key_prefix: String,
    /// Seconds to wait for each request to etcd or to fleet's API.
    #[arg(long, global = true, env = "FLEETCTL_REQUEST_TIMEOUT", default_value_t = 3.0, value_parser = parse_seconds, value_hint = ValueHint::Other)]
    pub request_timeout: f64,
    /// Seconds the events of this command's actions are kept, with --driver=etcd (over the
    /// API, fleetd's `event_retention` decides).
    #[arg(long, global = true, env = "FLEETCTL_EVENT_RETENTION", default_value_t = 3600.0, value_parser = parse_seconds, value_hint = ValueHint::Other)]
    pub event_retention: f64,
    /// CA file of the TLS certificate of fleet's API (https://) or of etcd.
    #[arg(
        long,
        global = true,
        env = "FLEETCTL_CA_FILE",
        value_hint = ValueHint::FilePath,
        visible_alias = "etcd-cafile"
    )]
    pub ca_file: Option<std::path::PathBuf>,
    /// Client certificate for TLS to fleet's API or etcd.
    #[arg(
        long,
        global = true,
        env = "FLEETCTL_CERT_FILE",
        value_hint = ValueHint::FilePath,
        visible_alias = "etcd-certfile"
    )]
    pub cert_file: Option<std::path::PathBuf>,
    /// Client key for TLS to fleet's API or etcd.
    #[arg(
        long,
        global = true,
        env = "FLEETCTL_KEY_FILE",
        value_hint = ValueHint::FilePath,
        visible_alias = "etcd-keyfile"
    )]
    pub key_file: Option<std::path::PathBuf>,
    /// CA file of fleet's API (https://) when it differs from etcd's: the API driver and
    /// status/journal use it instead of --ca-file (with --driver=etcd, --ca-file is etcd's).
    #[arg(long, global = true, env = "FLEETCTL_API_CA_FILE", value_hint = ValueHint::FilePath)]
    pub api_ca_file: Option<std::path::PathBuf>,
    /// Client certificate for fleet's API, instead of --cert-file.
    #[arg(long, global = true, env = "FLEETCTL_API_CERT_FILE", value_hint = ValueHint::FilePath)]
    pub api_cert_file: Option<std::path::PathBuf>,
    /// Client key for fleet's API, instead of --key-file.
    #[arg(long, global = true, env = "FLEETCTL_API_KEY_FILE", value_hint = ValueHint::FilePath)]
    pub api_key_file: Option<std::path::PathBuf>,
    /// etcd user to authenticate as, with --driver=etcd; its password comes from
    /// --password-file or the variable FLEETCTL_PASSWORD (never from the command line).
    #[arg(long, global = true, env = "FLEETCTL_USERNAME", value_hint = ValueHint::Other)]
    pub username: Option<String>,
    /// File whose first line is --username's password.
    #[arg(long, global = true, env = "FLEETCTL_PASSWORD_FILE", value_hint = ValueHint::FilePath)]
    pub password_file: Option<std::path::PathBuf>,
    /// How fleetctl reaches the cluster: `api` (fleetd's HTTP API) or `etcd` (the registry
    /// directly). [default: api; etcd when the endpoint's port is 2379 or 4001]
    #[arg(long, global = true, env = "FLEETCTL_DRIVER", value_parser = driver_parser())]
    pub driver: Option<Driver>,
    /// SSH bastion `host[:port]` used to reach machines for status and journal.
    #[arg(long, global = true, env = "FLEETCTL_TUNNEL", default_value = "", hide_default_value = true, value_parser = parse_tunnel, value_hint = ValueHint::Hostname)]
    pub tunnel: String,
    /// SSH user for status and journal on remote machines.
    #[arg(
        long,
        global = true,
        env = "FLEETCTL_SSH_USERNAME",
        default_value = "core",
        value_parser = parse_ssh_username,
        value_hint = ValueHint::Username
    )]
    pub ssh_username: String,
    /// Seconds to wait for an SSH connection.
    #[arg(long, global = true, env = "FLEETCTL_SSH_TIMEOUT", default_value_t = 10.0, value_parser = parse_seconds, value_hint = ValueHint::Other)]
    pub ssh_timeout: f64,
    /// Verify remote host keys.
    #[arg(long, global = true, env = "FLEETCTL_STRICT_HOST_KEY_CHECKING", default_value_t = true, action = clap::ArgAction::Set)]
    pub strict_host_key_checking: bool,
    /// Known hosts file for SSH.
    #[arg(
        long,
        global = true,
        env = "FLEETCTL_KNOWN_HOSTS_FILE",
        default_value = "~/.fleetctl/known_hosts",
        value_hint = ValueHint::FilePath
    )]
    pub known_hosts_file: String,
    /// Reach machines over ssh for status and journal (fleet's way), even where their fleetd
    /// serves them over its API.
    #[arg(long, global = true, env = "FLEETCTL_SSH")]
    pub ssh: bool,
    /// Follow a machine's published `http://` API address for status and journal (only
    /// `https://` ones are followed otherwise: a plain one sends the request, and your trust
    /// in the answer, over the network in clear).
    #[arg(long, global = true, env = "FLEETCTL_ALLOW_HTTP_REMOTE")]
    pub allow_http_remote: bool,
    /// Print debug logs.
    #[arg(long, global = true, env = "FLEETCTL_DEBUG")]
    pub debug: bool,
    /// Print fleetctl's version and exit (`fleetctl version` also asks the cluster).
    #[arg(short = 'v', long)]
    pub version: bool,
}

/// `api` or `etcd`, as possible values: help and completion offer them (not files).
fn driver_parser() -> impl clap::builder::TypedValueParser<Value = Driver> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["api", "etcd"]).try_map(|s| s.parse::<Driver>())
}

/// The longest timeout fleetctl takes: a day. Longer values are typos, and ones past
/// `u64::MAX` seconds are no `Duration` at all (`--request-timeout 1e19` panicked).
pub const MAX_SECONDS: f64 = 86_400.0;

/// The shortest: a millisecond (a shorter one rounds down to no time at all).
pub const MIN_SECONDS: f64 = 0.001;

/// The one parser of durations in seconds (`--request-timeout`, `--ssh-timeout`).
fn parse_seconds(s: &str) -> Result<f64, String> {
    let shown = fleet_registry::input::shorten(s);
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{shown:?} is not a number of seconds"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("{shown:?} must be a positive number of seconds"));
    }
    if !(MIN_SECONDS..=MAX_SECONDS).contains(&v) {
        return Err(format!(
            "{shown:?} is out of range: from {MIN_SECONDS} to {MAX_SECONDS} seconds"
        ));
    }
    Ok(v)
}

/// An SSH user name: never an option (`-oProxyCommand=...` would run a local command), no
/// `@`, space or control character.
fn parse_ssh_username(s: &str) -> Result<String, String> {
    let shown = fleet_registry::input::shorten(s);
    if s.is_empty() {
        return Err("the SSH user name cannot be empty".into());
    }
    if s.starts_with('-') {
        return Err(format!(
            "{shown:?} starts with \"-\"; an SSH user name cannot be an option"
        ));
    }
    if s.chars()
        .any(|c| c == '@' || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "{shown:?} is not an SSH user name (no \"@\", space or control character)"
        ));
    }
    Ok(s.to_owned())
}

/// An SSH bastion `host[:port]`, or empty for none; never an option.
fn parse_tunnel(s: &str) -> Result<String, String> {
    let shown = fleet_registry::input::shorten(s);
    if s.starts_with('-') {
        return Err(format!(
            "{shown:?} starts with \"-\"; a tunnel host cannot be an option"
        ));
    }
    if s.chars()
        .any(|c| c == '@' || c.is_whitespace() || c.is_control())
    {
        return Err(format!("{shown:?} is not a host[:port]"));
    }
    Ok(s.to_owned())
}

/// What the global flags decide beyond their own values.
impl Global {
    /// The TLS files for fleet's API (issue 38): the `--api-*` ones when any is given, else
    /// the shared ones. etcd and the fleetds may have different authorities.
    pub fn api_tls(&self) -> fleet_registry::kv::TlsFiles {
        let api = [&self.api_ca_file, &self.api_cert_file, &self.api_key_file];
        if api.iter().any(|f| f.is_some()) {
            fleet_registry::kv::TlsFiles {
                ca_file: self.api_ca_file.clone(),
                cert_file: self.api_cert_file.clone(),
                key_file: self.api_key_file.clone(),
            }
        } else {
            fleet_registry::kv::TlsFiles {
                ca_file: self.ca_file.clone(),
                cert_file: self.cert_file.clone(),
                key_file: self.key_file.clone(),
            }
        }
    }
}
