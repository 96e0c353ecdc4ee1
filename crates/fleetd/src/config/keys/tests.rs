use super::super::api::{Advertise, DEFAULT_SOCKET_MODE, SocketGroup};
use super::super::key::Kind;
use super::super::{Config, DEFAULT_DENY_UNITS, Raw, build, sample};
use super::*;
use crate::logging::LogFormat;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// A key's default as the code before the table had it (the API's and etcd's user in code of
/// their own, `--help` showing some in their help text): what the row says, and what fleetd
/// builds when no layer gives the key.
struct Before {
    key: &'static str,
    unset: Unset,
    built: fn(&Config) -> bool,
}

const fn before(key: &'static str, unset: Unset, built: fn(&Config) -> bool) -> Before {
    Before { key, unset, built }
}

/// Every key, in the table's order.
const BEFORE: &[Before] = &[
    before("etcd_servers", Unset::Value("http://127.0.0.1:2379"), |c| {
        c.etcd_servers == ["http://127.0.0.1:2379"]
    }),
    before(
        "etcd_key_prefix",
        Unset::Value("/_coreos.com/fleet/"),
        |c| c.etcd_key_prefix == "/_coreos.com/fleet/",
    ),
    before("etcd_cafile", Unset::Nothing, |c| c.etcd_cafile.is_none()),
    before("etcd_certfile", Unset::Nothing, |c| {
        c.etcd_certfile.is_none()
    }),
    before("etcd_keyfile", Unset::Nothing, |c| c.etcd_keyfile.is_none()),
    before("etcd_username", Unset::Nothing, |c| c.etcd_auth.is_none()),
    before("etcd_password_file", Unset::Nothing, |c| {
        c.etcd_auth.is_none()
    }),
    before("etcd_password", Unset::Nothing, |c| c.etcd_auth.is_none()),
    before(
        "public_ip",
        Unset::Derived("the default route's address"),
        |c| c.public_ip.is_none(),
    ),
    before("units_directory", Unset::Value("/run/fleet/units"), |c| {
        c.units_directory == Path::new("/run/fleet/units")
    }),
    before("metadata", Unset::Nothing, |c| c.metadata.is_empty()),
    before("verbosity", Unset::Value("0"), |c| c.verbosity == 0),
    before(
        "log_filter",
        Unset::Derived("RUST_LOG, else from verbosity"),
        |c| c.log_filter.is_none(),
    ),
    before("log_format", Unset::Value("auto"), |c| {
        c.log_format == LogFormat::Auto
    }),
    before("agent_ttl", Unset::Value("30s"), |c| {
        c.agent_ttl == Duration::from_secs(30)
    }),
    before("event_retention", Unset::Value("1h"), |c| {
        c.event_retention == Duration::from_secs(3600)
    }),
    before("deny_units", Unset::Value(DEFAULT_DENY_UNITS), |c| {
        c.deny_units.len() == 10 && c.deny_units[0] == "fleetd.service"
    }),
    before("engine_disruption_threshold", Unset::Value("0.5"), |c| {
        c.engine_disruption_threshold == 0.5
    }),
    before("engine_move_rate", Unset::Value("2000"), |c| {
        c.engine_move_rate == fleet_engine::DisruptionConfig::DEFAULT_MOVE_RATE
    }),
    before("etcd_request_timeout", Unset::Value("1"), |c| {
        c.etcd_request_timeout == Duration::from_secs(1)
    }),
    before("engine_reconcile_interval", Unset::Value("2"), |c| {
        c.engine_reconcile_interval == Duration::from_secs(2)
    }),
    before(
        "engine_disruption_grace",
        Unset::Derived("2 x agent_ttl"),
        |c| c.engine_disruption_grace == 2 * c.agent_ttl,
    ),
    before("disable_engine", Unset::Value("false"), |c| {
        !c.disable_engine
    }),
    before("trust_engine_files", Unset::Value("false"), |c| {
        !c.trust_engine_files
    }),
    before("disable_fence", Unset::Value("false"), |c| !c.disable_fence),
    before("token_limit", Unset::Value("100"), |c| {
        c.api.token_limit == fleet_api::DEFAULT_TOKEN_LIMIT
    }),
    before("api_socket", Unset::Value("/var/run/fleet.sock"), |c| {
        c.api.socket.as_deref() == Some(Path::new("/var/run/fleet.sock"))
    }),
    before("api_listen", Unset::Nothing, |c| c.api.listen.is_empty()),
    before("api_cafile", Unset::Nothing, |c| c.api.tls.is_none()),
    before("api_certfile", Unset::Nothing, |c| c.api.tls.is_none()),
    before("api_keyfile", Unset::Nothing, |c| c.api.tls.is_none()),
    before("api_allow_plain_tcp", Unset::Value("false"), |c| {
        !c.api.allow_plain_tcp
    }),
    before(
        "api_advertise",
        Unset::Derived("from the first TCP listener"),
        |c| c.api.advertise == Advertise::Derived,
    ),
    before("api_admins", Unset::Nothing, |c| c.api.roles.is_empty()),
    before("api_operators", Unset::Nothing, |c| c.api.roles.is_empty()),
    before("api_viewers", Unset::Nothing, |c| c.api.roles.is_empty()),
    before("api_deny", Unset::Nothing, |c| c.api.roles.is_empty()),
    before("api_crlfile", Unset::Nothing, |c| c.api.tls.is_none()),
    before(
        "api_socket_group",
        Unset::Derived("fleet if it exists"),
        |c| c.api.socket_access.group == SocketGroup::Default,
    ),
    before("api_socket_mode", Unset::Value("0660"), |c| {
        c.api.socket_access.mode == DEFAULT_SOCKET_MODE
    }),
    before("api_held_view", Unset::Value("true"), |c| c.api.held_view),
    before("disable_watches", Unset::Nothing, |_| true),
    before("verify_units", Unset::Nothing, |_| true),
    before("authorized_keys_file", Unset::Nothing, |_| true),
    before("systemd_user", Unset::Nothing, |_| true),
    before("enable_grpc", Unset::Nothing, |_| true),
];

#[test]
fn each_keys_default_is_the_one_fleetd_had_before_every_key_was_a_row() {
    let table: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
    let before: Vec<&str> = BEFORE.iter().map(|b| b.key).collect();
    assert_eq!(table, before, "the keys, in --help's order");
    let mut warnings = vec![];
    let config = build(&BTreeMap::new(), &mut warnings).unwrap();
    assert_eq!(warnings, [], "no key given, none ignored");
    for (key, was) in KEYS.iter().zip(BEFORE) {
        assert_eq!(key.unset, was.unset, "{}", key.name);
        assert!((was.built)(&config), "{}: {config:?}", key.name);
    }
    assert_eq!(config.api.token_limit, 100);
    assert_eq!(DEFAULT_SOCKET_MODE, 0o660);
}

/// Every default that is a value builds as if it had been given (it is checked the same way).
#[test]
fn giving_each_default_builds_the_same_configuration() {
    let defaults = build(&BTreeMap::new(), &mut vec![]).unwrap();
    for key in KEYS {
        let Unset::Value(value) = key.unset else {
            continue;
        };
        let raw = BTreeMap::from([(
            key.name.to_owned(),
            Raw {
                value: value.to_owned(),
                source: "test".to_owned(),
            },
        )]);
        let given = build(&raw, &mut vec![]).unwrap();
        assert_eq!(given, defaults, "{}={value}", key.name);
    }
}

/// `fleetd --help` as a terminal wide enough for every line shows it.
fn help() -> String {
    use clap::CommandFactory;
    crate::cli::Cli::command()
        .term_width(10_000)
        .render_help()
        .to_string()
}

#[test]
fn help_shows_every_key_but_the_ignored_with_its_default() {
    let help = help();
    for key in KEYS {
        let flag = format!("--{} ", key.flag());
        if matches!(key.kind, Kind::Ignored) {
            assert!(!help.contains(&flag), "{} in\n{help}", key.name);
            continue;
        }
        let line = help
            .lines()
            .find(|l| l.contains(&flag))
            .unwrap_or_else(|| panic!("{} not in\n{help}", key.name));
        if let Unset::Value(d) | Unset::Derived(d) = key.unset {
            assert!(line.contains(&format!("[default: {d}]")), "{line}");
        }
        assert!(line.contains(&format!("[env: {}", key.env())), "{line}");
    }
}

#[test]
fn the_sample_shows_every_key_with_its_default() {
    let text = sample();
    for key in KEYS {
        match key.unset {
            Unset::Value(d) => assert!(
                text.contains(&format!("\n#{}={d}\n", key.name)),
                "{} in\n{text}",
                key.name
            ),
            Unset::Derived(d) => assert!(
                text.contains(&format!("[default: {d}]\n#{}=\n", key.name)),
                "{} in\n{text}",
                key.name
            ),
            Unset::Nothing => assert!(
                text.contains(&format!("\n#{}=\n", key.name)),
                "{} in\n{text}",
                key.name
            ),
        }
    }
}

/// The rows of the `| key | default | meaning |` tables of the README and docs/: each names a
/// key, and says its default as the table does (a value in backticks, `none`, or words).
#[test]
fn the_docs_key_tables_say_the_tables_defaults() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut pages = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut rows = 0;
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        let mut in_table = false;
        for line in text.lines() {
            if line == "| key | default | meaning |" {
                in_table = true;
                continue;
            }
            if !line.starts_with('|') {
                in_table = false;
            }
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            if !in_table || line.starts_with("|---") || cells.len() < 4 {
                continue;
            }
            let name = cells[1].trim_matches('`');
            let key = KEYS
                .iter()
                .find(|k| k.name == name)
                .unwrap_or_else(|| panic!("{}: {name} is no key", page.display()));
            let said = cells[2];
            let right = match key.unset {
                Unset::Value(d) => said == format!("`{d}`"),
                Unset::Nothing => said == "none",
                // Words, not one value: `2 × agent_ttl`, "`fleet` if it exists".
                Unset::Derived(_) => {
                    let value = said.len() > 1
                        && said.starts_with('`')
                        && said.ends_with('`')
                        && said.matches('`').count() == 2;
                    said != "none" && !value
                }
            };
            assert!(right, "{}: {name}'s default {said:?}", page.display());
            rows += 1;
        }
    }
    assert!(rows >= 19, "{rows} rows");
}
