//! fleetd's configuration, with fleet's keys: from a config file (`--config` or
//! `/etc/fleet/fleet.conf`, `key=value` lines), then `FLEET_<KEY>` environment variables,
//! then command-line flags, each overriding the one before. A bad value is a startup error
//! naming the key and where it came from.

use anyhow::{Context, Result, anyhow, bail};
use fleet_registry::DEFAULT_PREFIX;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_CONFIG_FILE: &str = "/etc/fleet/fleet.conf";

/// Every key fleetd understands. Keys fleet had but ignored are accepted with a warning.
pub const KEYS: &[&str] = &[
    "etcd_servers",
    "etcd_key_prefix",
    "etcd_cafile",
    "etcd_certfile",
    "etcd_keyfile",
    "etcd_request_timeout",
    "public_ip",
    "metadata",
    "agent_ttl",
    "units_directory",
    "engine_reconcile_interval",
    "engine_disruption_threshold",
    "engine_disruption_grace",
    "engine_move_rate",
    "disable_engine",
    "disable_watches",
    "verbosity",
    "deny_units",
];

const IGNORED_KEYS: &[&str] = &[
    "verify_units",
    "authorized_keys_file",
    "etcd_username",
    "etcd_password",
    "systemd_user",
    "token_limit",
    "enable_grpc",
];

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub etcd_servers: Vec<String>,
    pub etcd_key_prefix: String,
    pub etcd_cafile: Option<PathBuf>,
    pub etcd_certfile: Option<PathBuf>,
    pub etcd_keyfile: Option<PathBuf>,
    pub etcd_request_timeout: Duration,
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
    pub disable_watches: bool,
    pub verbosity: u8,
    /// Unit name globs fleetd refuses to manage (it would take over the host).
    pub deny_units: Vec<String>,
}

/// Units no fleet user should be able to take over a host with.
pub const DEFAULT_DENY_UNITS: &str = "fleetd.service,fleet.service,dbus.service,dbus.socket,systemd-*,ssh.service,sshd.service,ssh.socket,etcd.service,etcd*.service";

/// A raw value and where it came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raw {
    pub value: String,
    pub source: String,
}

/// Reads `key=value` lines (fleet's INI without sections; `#`/`;` comments).
pub fn parse_file(path: &Path, text: &str) -> Result<BTreeMap<String, Raw>> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            bail!(
                "{}:{}: expected key=value, found {line:?}",
                path.display(),
                i + 1
            );
        };
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v);
        out.insert(
            k.trim().to_owned(),
            Raw {
                value: v.to_owned(),
                source: format!("{}:{}", path.display(), i + 1),
            },
        );
    }
    Ok(out)
}

/// Loads the file layer: `--config` must exist; the default file is optional.
pub fn load_file(explicit: Option<&Path>) -> Result<BTreeMap<String, Raw>> {
    let (path, required) = match explicit {
        Some(p) => (p.to_path_buf(), true),
        None => (PathBuf::from(DEFAULT_CONFIG_FILE), false),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_file(&path, &text),
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(e).with_context(|| format!("reading config file {}", path.display())),
    }
}

/// The environment layer: `FLEET_<KEY>` for every known key (empty values ignored).
pub fn from_env(vars: impl Iterator<Item = (String, String)>) -> BTreeMap<String, Raw> {
    let mut out = BTreeMap::new();
    for (k, v) in vars {
        let Some(key) = k.strip_prefix("FLEET_") else {
            continue;
        };
        let key = key.to_ascii_lowercase();
        if v.is_empty() || !(KEYS.contains(&key.as_str()) || IGNORED_KEYS.contains(&key.as_str())) {
            continue;
        }
        out.insert(
            key,
            Raw {
                value: v,
                source: format!("environment FLEET_{}", k["FLEET_".len()..].to_owned()),
            },
        );
    }
    out
}

/// Builds the configuration from layered raw values; `warnings` receives ignored keys.
pub fn build(raw: &BTreeMap<String, Raw>, warnings: &mut Vec<String>) -> Result<Config> {
    for (k, r) in raw {
        if IGNORED_KEYS.contains(&k.as_str()) {
            warnings.push(format!(
                "config key {k:?} ({}) is not supported and is ignored",
                r.source
            ));
        } else if !KEYS.contains(&k.as_str()) {
            bail!("unknown config key {k:?} ({})", r.source);
        }
    }
    let get = |k: &str| raw.get(k);
    let err =
        |k: &str, r: &Raw, why: String| anyhow!("invalid {k} {:?} ({}): {why}", r.value, r.source);
    let string_or = |k: &str, default: &str| get(k).map_or(default.to_owned(), |r| r.value.clone());
    let path = |k: &str| {
        get(k)
            .filter(|r| !r.value.is_empty())
            .map(|r| PathBuf::from(&r.value))
    };
    let duration = |k: &str, default: Duration| -> Result<Duration> {
        match get(k) {
            None => Ok(default),
            Some(r) => parse_duration(&r.value).map_err(|why| err(k, r, why)),
        }
    };
    let seconds = |k: &str, default: f64| -> Result<Duration> {
        match get(k) {
            None => Ok(Duration::from_secs_f64(default)),
            Some(r) => r
                .value
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| err(k, r, "expected a positive number of seconds".into())),
        }
    };
    let boolean = |k: &str| -> Result<bool> {
        match get(k) {
            None => Ok(false),
            Some(r) => {
                parse_bool(&r.value).ok_or_else(|| err(k, r, "expected true or false".into()))
            }
        }
    };
    let etcd_servers = match get("etcd_servers") {
        None => vec!["http://127.0.0.1:2379".to_owned()],
        Some(r) => parse_list(&r.value).map_err(|why| err("etcd_servers", r, why))?,
    };
    for s in &etcd_servers {
        if !(s.starts_with("http://") || s.starts_with("https://")) {
            let r = &raw["etcd_servers"];
            return Err(err(
                "etcd_servers",
                r,
                format!("{s:?} is not an http:// or https:// URL"),
            ));
        }
    }
    let metadata = match get("metadata") {
        None => BTreeMap::new(),
        Some(r) => parse_metadata(&r.value).map_err(|why| err("metadata", r, why))?,
    };
    let verbosity = match get("verbosity") {
        None => 0,
        Some(r) => r
            .value
            .parse()
            .map_err(|_| err("verbosity", r, "expected a small whole number".into()))?,
    };
    let agent_ttl = duration("agent_ttl", Duration::from_secs(30))?;
    if agent_ttl < Duration::from_secs(1) {
        let r = &raw["agent_ttl"];
        return Err(err("agent_ttl", r, "must be at least 1s".into()));
    }
    let engine_disruption_threshold = match get("engine_disruption_threshold") {
        None => 0.5,
        Some(r) => r
            .value
            .parse::<f64>()
            .ok()
            .filter(|v| (0.0..=1.0).contains(v))
            .ok_or_else(|| {
                let why = "expected a share between 0 and 1 (1: never hold)".into();
                err("engine_disruption_threshold", r, why)
            })?,
    };
    let engine_move_rate = match get("engine_move_rate") {
        None => 1000,
        Some(r) => r.value.parse::<u32>().map_err(|_| {
            let why = "expected a whole number of units per second (0: no limit)".into();
            err("engine_move_rate", r, why)
        })?,
    };
    let deny = string_or("deny_units", DEFAULT_DENY_UNITS);
    Ok(Config {
        etcd_servers,
        etcd_key_prefix: string_or("etcd_key_prefix", DEFAULT_PREFIX),
        etcd_cafile: path("etcd_cafile"),
        etcd_certfile: path("etcd_certfile"),
        etcd_keyfile: path("etcd_keyfile"),
        etcd_request_timeout: seconds("etcd_request_timeout", 1.0)?,
        public_ip: get("public_ip")
            .filter(|r| !r.value.is_empty())
            .map(|r| r.value.clone()),
        metadata,
        agent_ttl,
        units_directory: path("units_directory")
            .unwrap_or_else(|| PathBuf::from("/run/fleet/units")),
        engine_reconcile_interval: seconds("engine_reconcile_interval", 2.0)?,
        engine_disruption_threshold,
        engine_disruption_grace: duration("engine_disruption_grace", agent_ttl * 2)?,
        engine_move_rate,
        disable_engine: boolean("disable_engine")?,
        disable_watches: boolean("disable_watches")?,
        verbosity,
        deny_units: deny
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
    })
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "yes" | "on" => Some(true),
        "0" | "f" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// `a,b` or `["a","b"]`, as fleet's `StringSlice`.
fn parse_list(s: &str) -> Result<Vec<String>, String> {
    let items: Vec<String> = s
        .split(',')
        .map(|p| {
            p.trim_matches(|c| c == ' ' || c == '[' || c == '"' || c == ']')
                .to_owned()
        })
        .filter(|p| !p.is_empty())
        .collect();
    if items.is_empty() {
        return Err("expected at least one URL".into());
    }
    Ok(items)
}

/// `k=v,k2=v2`; unlike fleet, a malformed pair is an error rather than silently dropped.
pub fn parse_metadata(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!("{pair:?} is not key=value"));
        };
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty()
            || !k
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        {
            return Err(format!(
                "{k:?} is not a valid metadata key ([A-Za-z0-9_.-]+)"
            ));
        }
        out.insert(k.to_owned(), v.to_owned());
    }
    Ok(out)
}

/// Go's duration syntax, as fleet's `agent_ttl`: `30s`, `1m30s`, `500ms`, `2h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration such as 30s, 1m30s or 500ms");
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let value: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += Duration::from_secs_f64(value * scale);
        rest = &rest[unit_end..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn disruption_settings_default_to_half_two_ttls_and_a_thousand_moves_a_second() {
        let c = build(&raw(&[("agent_ttl", "3s")]), &mut vec![]).unwrap();
        assert_eq!(c.engine_disruption_threshold, 0.5);
        assert_eq!(c.engine_disruption_grace, Duration::from_secs(6));
        assert_eq!(c.engine_move_rate, 1000);
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
    fn defaults_are_fleets() {
        let c = build(&raw(&[]), &mut vec![]).unwrap();
        assert_eq!(c.etcd_servers, vec!["http://127.0.0.1:2379"]);
        assert_eq!(c.etcd_key_prefix, "/_coreos.com/fleet/");
        assert_eq!(c.agent_ttl, Duration::from_secs(30));
        assert_eq!(c.units_directory, PathBuf::from("/run/fleet/units"));
        assert_eq!(c.engine_reconcile_interval, Duration::from_secs(2));
        assert!(!c.disable_engine);
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

    #[test]
    fn environment_uses_fleet_prefix() {
        let m = from_env(
            vec![
                ("FLEET_AGENT_TTL".to_string(), "5s".to_string()),
                ("FLEET_UNRELATED_THING".to_string(), "x".to_string()),
                ("PATH".to_string(), "/bin".to_string()),
            ]
            .into_iter(),
        );
        assert_eq!(m.len(), 1);
        assert_eq!(m["agent_ttl"].value, "5s");
    }
}
