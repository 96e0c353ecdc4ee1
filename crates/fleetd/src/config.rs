//! fleetd's configuration, with fleet's keys: from a config file (`--config` or
//! `/etc/fleet/fleet.conf`, `key=value` lines), then `FLEET_<KEY>` environment variables,
//! then command-line flags, each overriding the one before. A bad value is a startup error
//! naming the key and where it came from.

mod api;
mod units_dir;

pub use api::{ApiConfig, KEYS as API_KEYS, ListenAddr};

use anyhow::{Context, Result, anyhow, bail};
use fleet_registry::DEFAULT_PREFIX;
use fleet_registry::input::shorten;
use fleet_registry::kv::TlsFiles;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_CONFIG_FILE: &str = "/etc/fleet/fleet.conf";

/// The largest config file read: `--config /dev/zero` must not exhaust memory.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// The longest duration any key takes: a day. Longer values are typos (and ones over
/// `u64::MAX` seconds would not even be a `Duration`).
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// The shortest timeout or interval: below it a timer fires continuously (and zero panics).
pub const MIN_INTERVAL: Duration = Duration::from_millis(1);

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
    /// The HTTP API's keys (`config/api.rs`).
    pub api: ApiConfig,
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
                "{}:{}: expected key=value, found {:?}",
                path.display(),
                i + 1,
                shorten(line)
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
    match read_capped(&path) {
        Ok(text) => parse_file(&path, &text),
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(e).with_context(|| format!("reading config file {}", path.display())),
    }
}

/// Reads a config file of at most [`MAX_CONFIG_BYTES`]; a device or socket is refused before
/// it is opened (a terminal would block, `/dev/zero` never ends). A FIFO is read as `cat`
/// reads it, waiting for its writer.
fn read_capped(path: &Path) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind};
    use std::os::unix::fs::FileTypeExt;
    let kind = std::fs::metadata(path)?.file_type();
    if kind.is_dir() || kind.is_block_device() || kind.is_char_device() || kind.is_socket() {
        return Err(Error::new(ErrorKind::InvalidInput, "not a regular file"));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("larger than {MAX_CONFIG_BYTES} bytes"),
        ));
    }
    String::from_utf8(bytes).map_err(|_| Error::new(ErrorKind::InvalidData, "not valid UTF-8"))
}

/// The environment layer: `FLEET_<KEY>` for every known key (empty values ignored).
pub fn from_env(vars: impl Iterator<Item = (String, String)>) -> BTreeMap<String, Raw> {
    let mut out = BTreeMap::new();
    for (k, v) in vars {
        let Some(key) = k.strip_prefix("FLEET_") else {
            continue;
        };
        let key = key.to_ascii_lowercase();
        let known = [KEYS, api::KEYS, IGNORED_KEYS]
            .iter()
            .any(|l| l.contains(&key.as_str()));
        if v.is_empty() || !known {
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
        } else if !KEYS.contains(&k.as_str()) && !api::KEYS.contains(&k.as_str()) {
            bail!("unknown config key {:?} ({})", shorten(k), r.source);
        }
    }
    let get = |k: &str| raw.get(k);
    let err = |k: &str, r: &Raw, why: String| {
        anyhow!("invalid {k} {:?} ({}): {why}", shorten(&r.value), r.source)
    };
    let string_or = |k: &str, default: &str| get(k).map_or(default.to_owned(), |r| r.value.clone());
    let path = |k: &str| {
        get(k)
            .filter(|r| !r.value.is_empty())
            .map(|r| PathBuf::from(&r.value))
    };
    // Every duration key goes through `duration_in`: one range check, one message.
    let duration =
        |k: &str, syntax: Syntax, default: Duration, min: Duration| -> Result<Duration> {
            match get(k) {
                None => Ok(default),
                Some(r) => duration_in(&r.value, syntax, min).map_err(|why| err(k, r, why)),
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
        if !s.contains("://") {
            let r = &raw["etcd_servers"];
            return Err(err(
                "etcd_servers",
                r,
                format!("{:?} is not an http:// or https:// URL", shorten(s)),
            ));
        }
    }
    let tls = TlsFiles {
        ca_file: path("etcd_cafile"),
        cert_file: path("etcd_certfile"),
        key_file: path("etcd_keyfile"),
    };
    if let Err(e) = fleet_registry::input::check_endpoints(&etcd_servers, &tls) {
        return Err(match get("etcd_servers") {
            Some(r) => err("etcd_servers", r, e.to_string()),
            None => anyhow!(e),
        });
    }
    let etcd_key_prefix = string_or("etcd_key_prefix", DEFAULT_PREFIX);
    if let (Some(r), Err(e)) = (
        get("etcd_key_prefix"),
        fleet_registry::input::check_prefix(&etcd_key_prefix),
    ) {
        return Err(err("etcd_key_prefix", r, e.to_string()));
    }
    let public_ip = match get("public_ip").filter(|r| !r.value.is_empty()) {
        None => None,
        Some(r) => match r.value.parse::<std::net::IpAddr>() {
            Ok(ip) => Some(ip.to_string()),
            Err(_) => {
                return Err(err(
                    "public_ip",
                    r,
                    "expected an IPv4 or IPv6 address".into(),
                ));
            }
        },
    };
    let units_directory = match get("units_directory") {
        None => PathBuf::from("/run/fleet/units"),
        Some(r) => units_dir::check(&r.value).map_err(|why| err("units_directory", r, why))?,
    };
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
    let second = Duration::from_secs(1);
    let agent_ttl = duration("agent_ttl", Syntax::Go, 30 * second, second)?;
    let deny_units = match get("deny_units") {
        None => split_globs(DEFAULT_DENY_UNITS),
        Some(r) => {
            let globs = split_globs(&r.value);
            for glob in &globs {
                fleet_core::xfleet::check_glob("deny_units", glob)
                    .map_err(|e| err("deny_units", r, e.to_string()))?;
            }
            globs
        }
    };
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
    Ok(Config {
        etcd_servers,
        etcd_key_prefix,
        etcd_cafile: tls.ca_file,
        etcd_certfile: tls.cert_file,
        etcd_keyfile: tls.key_file,
        etcd_request_timeout: duration(
            "etcd_request_timeout",
            Syntax::Seconds,
            second,
            MIN_INTERVAL,
        )?,
        public_ip,
        metadata,
        agent_ttl,
        units_directory,
        engine_reconcile_interval: duration(
            "engine_reconcile_interval",
            Syntax::Seconds,
            2 * second,
            MIN_INTERVAL,
        )?,
        engine_disruption_threshold,
        engine_disruption_grace: duration(
            "engine_disruption_grace",
            Syntax::Go,
            agent_ttl * 2,
            MIN_INTERVAL,
        )?,
        engine_move_rate,
        disable_engine: boolean("disable_engine")?,
        disable_watches: boolean("disable_watches")?,
        verbosity,
        deny_units,
        api: api::build(raw)?,
    })
}

fn split_globs(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// How a duration key is spelled: fleet's `agent_ttl` is a Go duration (`30s`), its
/// timeouts and intervals are seconds (`1.5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    Go,
    Seconds,
}

/// The one duration parser: `s` in `syntax`, within `min..=MAX_DURATION`.
pub fn duration_in(s: &str, syntax: Syntax, min: Duration) -> Result<Duration, String> {
    let seconds = match syntax {
        Syntax::Go => go_seconds(s)?,
        Syntax::Seconds => s
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| format!("{:?} is not a number of seconds", shorten(s)))?,
    };
    let max = MAX_DURATION.as_secs_f64();
    if seconds > max {
        return Err(format!(
            "must be at most {}s (a day)",
            MAX_DURATION.as_secs()
        ));
    }
    let min_text = match syntax {
        Syntax::Go => format!("{min:?}"),
        Syntax::Seconds => format!("{}", min.as_secs_f64()),
    };
    if seconds <= 0.0 && syntax == Syntax::Seconds {
        return Err(format!(
            "expected a positive number of seconds (at least {min_text})"
        ));
    }
    // Checked against the range first: `from_secs_f64` panics on what no Duration holds.
    let d = Duration::from_secs_f64(seconds.max(0.0));
    if d < min {
        return Err(format!("must be at least {min_text}"));
    }
    Ok(d)
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
        if out.insert(k.to_owned(), v.to_owned()).is_some() {
            return Err(format!("key {k:?} is given twice"));
        }
    }
    Ok(out)
}

/// Go's duration syntax (`30s`, `1m30s`, `500ms`, `2h`) as seconds, unbounded, so a huge
/// value is a range error of [`duration_in`], not a panic.
fn go_seconds(s: &str) -> Result<f64, String> {
    let bad = || {
        format!(
            "{:?} is not a duration such as 30s, 1m30s or 500ms",
            shorten(s)
        )
    };
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0.0;
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
        total += value * scale;
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
                &[("deny_units", "a.service,b c.service")],
                "can never match a unit name",
            ),
            (&[("metadata", "a=b,a=c")], "key \"a\" is given twice"),
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
