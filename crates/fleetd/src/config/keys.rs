//! The table of fleetd's keys: every key it takes, each once, with its default, its help
//! line and its setter, in the order their values are checked and `--help` lists them. The
//! checks across keys (TLS files that go together, a user that needs a password, the
//! default that follows `agent_ttl`) are not here: `super::resolve` runs them once every
//! key is read.

use fleet_api::authz::Role;
use fleet_registry::DEFAULT_PREFIX;
use fleet_registry::input::shorten;
use std::path::PathBuf;

use super::key::{Key, Unset};
use super::values::{
    self, MIN_INTERVAL, SECOND, Syntax, duration_in, parse_bool, parse_list, split_globs,
};
use super::{DEFAULT_DENY_UNITS, api, etcd_auth, units_dir};

pub const KEYS: &[Key] = &[
    Key::value(
        "etcd_servers",
        Unset::Value("http://127.0.0.1:2379"),
        "etcd endpoints, `a,b` or `[\"a\",\"b\"]`",
        |p, v| {
            p.config.etcd_servers = parse_list(v)?;
            match p.config.etcd_servers.iter().find(|s| !s.contains("://")) {
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
        Unset::Value(DEFAULT_PREFIX),
        "key prefix of the fleet registry in etcd",
        |p, v| {
            fleet_registry::input::check_prefix(v).map_err(|e| e.to_string())?;
            p.config.etcd_key_prefix = v.to_owned();
            Ok(())
        },
    ),
    Key::value(
        "etcd_cafile",
        Unset::Nothing,
        "CA file for etcd's TLS certificate",
        |p, v| {
            p.config.etcd_cafile = non_empty_path(v);
            Ok(())
        },
    ),
    Key::value(
        "etcd_certfile",
        Unset::Nothing,
        "client certificate for etcd TLS",
        |p, v| {
            p.config.etcd_certfile = non_empty_path(v);
            Ok(())
        },
    ),
    Key::value(
        "etcd_keyfile",
        Unset::Nothing,
        "client key for etcd TLS",
        |p, v| {
            p.config.etcd_keyfile = non_empty_path(v);
            Ok(())
        },
    ),
    Key::secret(
        "etcd_username",
        "etcd user to authenticate as (with etcd_password_file or etcd_password)",
        etcd_auth::set_username,
    ),
    Key::secret(
        "etcd_password_file",
        "file whose first line is etcd_username's password (keep it mode 0600)",
        etcd_auth::set_password_file,
    ),
    Key::secret(
        "etcd_password",
        "etcd_username's password (fleet's key; prefer etcd_password_file)",
        etcd_auth::set_password,
    ),
    Key::value(
        "public_ip",
        Unset::Derived("the default route's address"),
        "the IP address published for this machine",
        |p, v| {
            p.config.public_ip = match v {
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
        Unset::Value("/run/fleet/units"),
        "where unit files are written, fleetd's own",
        |p, v| {
            p.config.units_directory = units_dir::check(v)?;
            Ok(())
        },
    ),
    Key::value(
        "metadata",
        Unset::Nothing,
        "this machine's metadata, `k=v,k2=v2`",
        |p, v| {
            p.config.metadata = values::parse_metadata(v)?;
            Ok(())
        },
    ),
    Key::value(
        "verbosity",
        Unset::Value("0"),
        "above 0: debug logs",
        |p, v| {
            p.config.verbosity = v
                .parse()
                .map_err(|_| "expected a small whole number".to_owned())?;
            Ok(())
        },
    ),
    Key::value(
        "log_filter",
        Unset::Derived("RUST_LOG, else from verbosity"),
        "what to log, RUST_LOG-style, e.g. `info,fleet_engine=debug`",
        |p, v| {
            crate::logging::check_filter(v)?;
            p.config.log_filter = Some(v.to_owned()).filter(|v| !v.is_empty());
            Ok(())
        },
    ),
    Key::value(
        "log_format",
        Unset::Value("auto"),
        "auto (the journal under systemd, else text), text, json or journal",
        |p, v| {
            p.config.log_format = v.parse()?;
            Ok(())
        },
    ),
    Key::value(
        "agent_ttl",
        Unset::Value("30s"),
        "TTL of this machine's presence and states, a Go duration",
        |p, v| {
            p.config.agent_ttl = duration_in(v, Syntax::Go, SECOND)?;
            Ok(())
        },
    ),
    Key::value(
        "event_retention",
        Unset::Value("1h"),
        "how long events (fleetctl events) are kept at least, a Go duration",
        |p, v| {
            p.config.event_retention = duration_in(v, Syntax::Go, SECOND)?;
            Ok(())
        },
    ),
    Key::value(
        "deny_units",
        Unset::Value(DEFAULT_DENY_UNITS),
        "unit name globs fleetd refuses to manage, `a,b*`; `none`: every unit may be managed",
        |p, v| {
            // Empty dropped the default protection without a word (issue 38): it must be said.
            if v.trim().is_empty() {
                return Err(
                    "is empty, which would drop the protection of fleetd, dbus, systemd's \
                            own units, ssh and etcd; write deny_units=none to manage every unit"
                        .into(),
                );
            }
            if v.trim() == "none" {
                p.config.deny_units = Vec::new();
                return Ok(());
            }
            let globs = split_globs(v);
            for glob in &globs {
                fleet_core::xfleet::check_glob("deny_units", glob).map_err(|e| e.to_string())?;
            }
            p.config.deny_units = globs;
            Ok(())
        },
    ),
    Key::value(
        "engine_disruption_threshold",
        Unset::Value("0.5"),
        "rescheduling holds while more than this share of the machines vanished",
        |p, v| {
            p.config.engine_disruption_threshold = v
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
        Unset::Value("2000"),
        "units of lost machines moved per second at most, 0: no limit",
        |p, v| {
            p.config.engine_move_rate = v
                .parse::<u32>()
                .map_err(|_| "expected a whole number of units per second (0: no limit)")?;
            Ok(())
        },
    ),
    Key::value(
        "etcd_request_timeout",
        Unset::Value("1"),
        "seconds to wait for each etcd request",
        |p, v| {
            p.config.etcd_request_timeout = duration_in(v, Syntax::Seconds, MIN_INTERVAL)?;
            Ok(())
        },
    ),
    Key::value(
        "engine_reconcile_interval",
        Unset::Value("2"),
        "seconds between the engine's passes when nothing changes",
        |p, v| {
            p.config.engine_reconcile_interval = duration_in(v, Syntax::Seconds, MIN_INTERVAL)?;
            Ok(())
        },
    ),
    Key::value(
        "engine_disruption_grace",
        // Set by `resolve` when not given: it follows agent_ttl.
        Unset::Derived("2 x agent_ttl"),
        "how long units of machines lost in a disruption wait for them",
        |p, v| {
            p.config.engine_disruption_grace = duration_in(v, Syntax::Go, MIN_INTERVAL)?;
            Ok(())
        },
    ),
    Key::switch(
        "disable_engine",
        "never run the engine on this machine",
        |p, v| {
            p.config.disable_engine = parse_bool(v).ok_or("expected true or false")?;
            Ok(())
        },
    ),
    Key::switch(
        "trust_engine_files",
        "take a unit file of at most 2 KiB from the schedule entry the engine wrote instead of reading it from etcd, and as an engine write it there: one etcd request fewer per unit started, but an engine host may then run files no operator stored (docs/security.md)",
        |p, v| {
            p.config.trust_engine_files = parse_bool(v).ok_or("expected true or false")?;
            Ok(())
        },
    ),
    Key::switch(
        "disable_fence",
        "never arm the fence: a stopped or hung fleetd then leaves its units running while the engine starts them elsewhere (docs/guarantees.md, promise 2)",
        |p, v| {
            p.config.disable_fence = parse_bool(v).ok_or("expected true or false")?;
            Ok(())
        },
    ),
    Key::value(
        "token_limit",
        // fleet_api::DEFAULT_TOKEN_LIMIT (a test holds them equal).
        Unset::Value("100"),
        "entries per page of the API",
        api::set_token_limit,
    ),
    Key::value(
        "api_socket",
        Unset::Value(api::DEFAULT_SOCKET),
        "the API's unix socket when systemd passes none, empty: none",
        api::set_socket,
    ),
    Key::value(
        "api_listen",
        Unset::Nothing,
        "more API listeners, `unix:PATH` or `tcp:HOST:PORT`, comma-separated",
        api::set_listen,
    ),
    Key::value(
        "api_cafile",
        Unset::Nothing,
        "CA whose client certificates the API's TLS listeners require (with api_certfile, api_keyfile)",
        |p, v| {
            p.api.ca = non_empty_path(v);
            Ok(())
        },
    ),
    Key::value(
        "api_certfile",
        Unset::Nothing,
        "certificate (PEM) of the API's TLS listeners: every TCP listener then serves TLS",
        |p, v| {
            p.api.cert = non_empty_path(v);
            Ok(())
        },
    ),
    Key::value(
        "api_keyfile",
        Unset::Nothing,
        "private key (PEM) of api_certfile",
        |p, v| {
            p.api.key = non_empty_path(v);
            Ok(())
        },
    ),
    Key::value(
        "api_allow_plain_tcp",
        Unset::Value("false"),
        "let api_listen take plain TCP on other than loopback addresses",
        |p, v| {
            p.config.api.allow_plain_tcp = parse_bool(v).ok_or("expected true or false")?;
            Ok(())
        },
    ),
    Key::value(
        "api_advertise",
        Unset::Derived("from the first TCP listener"),
        "URL other machines reach this API at, `https://HOST:PORT`, empty: none",
        api::set_advertise,
    ),
    Key::subjects(
        "api_admins",
        "client certificate subjects (`CN=name` or `O=group`, comma-separated) with the API's admin role",
        |p, v| api::add_role(p, v, Role::Admin),
    ),
    Key::subjects(
        "api_operators",
        "client certificate subjects with the API's operator role (every read and change of units)",
        |p, v| api::add_role(p, v, Role::Operator),
    ),
    Key::subjects(
        "api_viewers",
        "client certificate subjects with the API's viewer role (every read)",
        |p, v| api::add_role(p, v, Role::Viewer),
    ),
    Key::subjects(
        "api_deny",
        "client certificate subjects (`CN=name` or `O=group`) refused everything, whatever role their other names give",
        api::set_deny,
    ),
    Key::value(
        "api_crlfile",
        Unset::Nothing,
        "PEM certificate revocation lists of api_cafile's authority; a revoked client certificate fails the handshake (read again when it changes)",
        |p, v| {
            p.api.crl = non_empty_path(v);
            Ok(())
        },
    ),
    Key::value(
        "api_socket_group",
        // SocketGroup::Default, which the API resolves at startup.
        Unset::Derived("fleet if it exists"),
        "group (name or number) of the API's unix sockets fleetd makes",
        api::set_socket_group,
    ),
    Key::value(
        "api_socket_mode",
        // api::DEFAULT_SOCKET_MODE (a test holds them equal).
        Unset::Value("0660"),
        "octal mode of the API's unix sockets fleetd makes",
        api::set_socket_mode,
    ),
    Key::value(
        "api_held_view",
        Unset::Value("true"),
        "serve the listing of every unit from a view of the registry held while listings come (false: every page reads etcd)",
        |p, v| {
            p.config.api.held_view = parse_bool(v).ok_or("expected true or false")?;
            Ok(())
        },
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

#[cfg(test)]
mod tests;
