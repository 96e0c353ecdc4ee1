use super::file::{load_file, parse_file};
use super::values::{Syntax, duration_in, parse_metadata, split_globs};
use super::*;
use clap::{Args, Command, FromArgMatches};
use fleet_engine::DisruptionConfig;
use std::path::Path;

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
        if let key::Unset::Value(default) | key::Unset::Derived(default) = key.unset {
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
