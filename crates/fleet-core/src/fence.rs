//! The fence: the timing contract between a machine's agent and the engine that makes "never
//! two copies" hold when a machine's fleetd stops, hangs or dies (docs/guarantees.md, promise
//! 2). Only numbers and the wall-clock text live here; the agent arms the fence in systemd and
//! the engine waits for it, and neither depends on the other.
//!
//! The agent keeps a deadline in systemd (a transient timer), pushed forward at every renewal
//! of its machine's lease to `renewal sent + TTL`: etcd received that renewal no earlier than
//! it was sent, so the lease cannot expire before the deadline. If fleetd stops pushing, the
//! timer fires and systemd stops the machine's non-global units: each gets [`STOP_GRACE`] to
//! stop on its own, then is killed. The engine moves a vanished machine's units only after
//! [`MARGIN`] has passed since it saw the machine vanish, which is after its lease expired and
//! so after the deadline: by then every fenced copy is gone.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a fenced unit may take to stop after `StopUnit` before its processes are killed.
pub const STOP_GRACE: Duration = Duration::from_secs(1);

/// What the fence needs after its deadline, and so what the engine waits after a machine
/// vanished before it moves that machine's units: [`STOP_GRACE`], plus one second for the
/// timer's firing, the fence's start and the kill (the first two measured at 4-8 ms;
/// docs/guarantees.md).
pub const MARGIN: Duration = Duration::from_secs(2);

/// The share of the TTL added to [`MARGIN`] for clocks that run at different rates on the
/// machine and on etcd's leader (NTP slews at most 500 ppm; 1 % is far above that).
pub const CLOCK_RATE_SHARE: u32 = 100;

/// How long after a machine vanished its units may move: [`MARGIN`] plus the clock-rate
/// allowance of `ttl`.
pub fn engine_wait(ttl: Duration) -> Duration {
    MARGIN + ttl / CLOCK_RATE_SHARE
}

/// `2026-11-30 05:43 UTC`.
pub fn utc_minutes(at: SystemTime) -> String {
    let (date, secs) = civil(at);
    format!("{date} {:02}:{:02} UTC", secs / 3600, secs % 3600 / 60)
}

/// `2026-11-30 05:43:07 UTC`.
pub fn utc_seconds(at: SystemTime) -> String {
    let (date, secs) = civil(at);
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    format!("{date} {h:02}:{m:02}:{s:02} UTC")
}

/// `2026-11-30T05:43:07.123456Z` (RFC 3339) of `micros` since the epoch: the time of an
/// event (issue 41), in its JSON form.
pub fn rfc3339_micros(micros: u64) -> String {
    let at = UNIX_EPOCH + std::time::Duration::from_micros(micros);
    let (date, secs) = civil(at);
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    format!("{date}T{h:02}:{m:02}:{s:02}.{:06}Z", micros % 1_000_000)
}

/// The microseconds since the epoch of a time [`rfc3339_micros`] wrote; `None` for any other
/// text (this reads back our own form, not every RFC 3339 time).
pub fn parse_rfc3339_micros(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    let shape = b.len() == 27
        && [4, 7].iter().all(|&i| b[i] == b'-')
        && b[10] == b'T'
        && [13, 16].iter().all(|&i| b[i] == b':')
        && b[19] == b'.'
        && b[26] == b'Z';
    if !shape {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        let part = &s[from..to];
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (y, m, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, mi, sec, frac) = (num(11, 13)?, num(14, 16)?, num(17, 19)?, num(20, 26)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 59 {
        return None;
    }
    // Howard Hinnant's days-from-civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec;
    u64::try_from(secs * 1_000_000 + frac).ok()
}

/// The date (`YYYY-MM-DD`) and the seconds into that day, in UTC.
fn civil(at: SystemTime) -> (String, i64) {
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (format!("{year:04}-{month:02}-{day:02}"), rem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_time_reads_as_rfc3339_with_its_microseconds() {
        assert_eq!(rfc3339_micros(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339_micros(1_764_481_387_000_042),
            "2025-11-30T05:43:07.000042Z"
        );
        for micros in [
            0,
            1_764_481_387_000_042,
            951_782_400_999_999,
            4_102_444_800_000_000,
        ] {
            assert_eq!(parse_rfc3339_micros(&rfc3339_micros(micros)), Some(micros));
        }
        for bad in [
            "",
            "2025-11-30T05:43:07Z",
            "2025-13-30T05:43:07.000000Z",
            "2025-11-30 05:43:07.000000Z",
        ] {
            assert_eq!(parse_rfc3339_micros(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_engine_waits_the_margin_and_a_hundredth_of_the_ttl() {
        assert_eq!(
            engine_wait(Duration::from_secs(5)),
            Duration::from_millis(2050)
        );
        assert_eq!(
            engine_wait(Duration::from_secs(30)),
            Duration::from_millis(2300)
        );
    }

    #[test]
    fn the_margin_covers_the_stop_grace() {
        assert!(MARGIN > STOP_GRACE);
    }

    #[test]
    fn writes_utc_times_to_the_minute_and_to_the_second() {
        let at = UNIX_EPOCH + Duration::from_secs(1_795_930_987);
        assert_eq!(utc_minutes(at), "2026-11-29 05:43 UTC");
        assert_eq!(utc_seconds(at), "2026-11-29 05:43:07 UTC");
        assert_eq!(utc_seconds(UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
    }
}
