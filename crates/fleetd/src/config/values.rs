//! The value syntaxes of fleetd's keys (fleet's): Go durations and seconds within one range,
//! booleans, lists, metadata pairs, globs. Pure text to values; the key and the source of a
//! bad value are added by the caller (`config::build`).

use fleet_registry::input::shorten;
use std::collections::BTreeMap;
use std::time::Duration;

/// The longest duration any key takes: a day. Longer values are typos (and ones over
/// `u64::MAX` seconds would not even be a `Duration`).
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// The shortest timeout or interval: below it a timer fires continuously (and zero panics).
pub const MIN_INTERVAL: Duration = Duration::from_millis(1);

pub const SECOND: Duration = Duration::from_secs(1);

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

pub fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "yes" | "on" => Some(true),
        "0" | "f" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// `a,b` or `["a","b"]`, as fleet's `StringSlice`.
pub fn parse_list(s: &str) -> Result<Vec<String>, String> {
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
        // What the API and set-metadata refuse, refused here too (issue 38).
        if v.chars().any(char::is_control) {
            return Err(format!("the value of {k:?} holds a control character"));
        }
        if out.insert(k.to_owned(), v.to_owned()).is_some() {
            return Err(format!("key {k:?} is given twice"));
        }
    }
    let size: usize = out.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_METADATA_BYTES {
        return Err(format!(
            "{size} bytes of metadata, more than {MAX_METADATA_BYTES}: the machine's presence \
             record must stay small enough for every reader"
        ));
    }
    Ok(out)
}

/// The most configured metadata (keys and values) a machine publishes: its presence record
/// is read back only up to 64 KiB (`fleet_registry::read::MAX_MACHINE_BYTES`).
pub const MAX_METADATA_BYTES: usize = 16 * 1024;

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
    // Go takes a bare 0 without a unit; the minimum then says what is wrong (issue 38).
    if rest == "0" {
        return Ok(0.0);
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

pub fn split_globs(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 38, item 11: what the API refuses of metadata, `--metadata` refuses too, and a
    /// machine's metadata stays small enough for its presence record to be read back.
    #[test]
    fn metadata_with_a_control_character_or_past_its_size_is_refused() {
        assert!(
            parse_metadata("a=b\nc")
                .unwrap_err()
                .contains("control character")
        );
        let big = format!("a={}", "x".repeat(MAX_METADATA_BYTES));
        assert!(
            parse_metadata(&big)
                .unwrap_err()
                .contains("bytes of metadata")
        );
        assert_eq!(parse_metadata("region=eu,disk=ssd").unwrap().len(), 2);
    }
}
