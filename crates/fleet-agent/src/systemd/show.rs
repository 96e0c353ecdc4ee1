//! A unit's D-Bus properties as `systemctl show` prints them (issue 16: `fleetctl status`
//! over the API): `GetAll` of `org.freedesktop.systemd1.Unit` and of the unit type's own
//! interface (`.Service`, `.Socket`, ...), each value formatted as systemd's
//! `bus_print_property` does: booleans `yes`/`no`, `*Timestamp` as a date (UTC, empty when
//! unset), `*USec`/`*NSec` as a time span, `UINT64_MAX` as `infinity`, lists joined by
//! spaces, `Exec*` commands as `{ path=... ; argv[]=... ; ... }`. A value systemctl has no
//! form for gets a plain rendering rather than being left out.

use super::{SystemdManager, bus_error};
use crate::manager::ManagerError;
use fleet_core::{UnitName, UnitType};
use std::collections::BTreeMap;
use zbus::proxy::CacheProperties;
use zbus::wire::Variant;

const UNIT_INTERFACE: &str = "org.freedesktop.systemd1.Unit";

/// The interface of a unit type's own properties; a target has none of its own.
fn type_interface(kind: UnitType) -> Option<&'static str> {
    Some(match kind {
        UnitType::Service => "org.freedesktop.systemd1.Service",
        UnitType::Socket => "org.freedesktop.systemd1.Socket",
        UnitType::Timer => "org.freedesktop.systemd1.Timer",
        UnitType::Path => "org.freedesktop.systemd1.Path",
        UnitType::Device => "org.freedesktop.systemd1.Device",
        UnitType::Mount => "org.freedesktop.systemd1.Mount",
        UnitType::Automount => "org.freedesktop.systemd1.Automount",
        UnitType::Slice => "org.freedesktop.systemd1.Slice",
        UnitType::Swap => "org.freedesktop.systemd1.Swap",
        UnitType::Scope => "org.freedesktop.systemd1.Scope",
        UnitType::Target | UnitType::Busname | UnitType::Snapshot => return None,
    })
}

impl SystemdManager {
    /// Every property of `name` systemd has (loading the unit if it must), formatted as
    /// `systemctl show` prints it.
    pub async fn properties(
        &self,
        name: &UnitName,
    ) -> Result<BTreeMap<String, String>, ManagerError> {
        self.read_properties(name)
            .await
            .map_err(|e| ManagerError::Details {
                unit: name.clone(),
                source: bus_error(e),
            })
    }

    async fn read_properties(&self, name: &UnitName) -> zbus::Result<BTreeMap<String, String>> {
        let _permit = self.permit().await;
        let props = zbus::fdo::PropertiesProxy::builder(&self.inner.conn)
            .destination("org.freedesktop.systemd1")
            .path(super::query::unit_path(name))
            .cache_properties(CacheProperties::No)
            .build()
            .await?;
        let mut out = BTreeMap::new();
        let interfaces = [Some(UNIT_INTERFACE), type_interface(name.unit_type())];
        for interface in interfaces.into_iter().flatten() {
            let interface = zbus::names::InterfaceName::from_static_str_unchecked(interface);
            for (key, value) in props.get_all(interface).await? {
                let text = format_property(&key, &value);
                let key: String = key;
                out.insert(key, text);
            }
        }
        Ok(out)
    }
}

/// `value` of property `name` as `systemctl show` prints it.
pub(super) fn format_property(name: &str, value: &Variant<'_>) -> String {
    match value {
        Variant::U64(v) if name.ends_with("Timestamp") => timestamp(*v),
        Variant::U64(v) if name.ends_with("USec") => timespan(*v, 1),
        Variant::U64(v) if name.ends_with("NSec") => match *v {
            u64::MAX => "infinity".to_owned(),
            v => timespan(v / 1000, 1),
        },
        Variant::U32(v) if name.ends_with("UMask") => format!("{v:04o}"),
        Variant::Array(a) if name.starts_with("Exec") && !a.inner().is_empty() => a
            .inner()
            .iter()
            .map(exec_command)
            .collect::<Vec<_>>()
            .join(" ; "),
        other => plain(other),
    }
}

/// A value without a systemd-specific form.
fn plain(value: &Variant<'_>) -> String {
    match value {
        Variant::U8(v) => v.to_string(),
        Variant::Bool(v) => yes_no(*v).to_owned(),
        Variant::I16(v) => v.to_string(),
        Variant::U16(v) => v.to_string(),
        Variant::I32(v) => v.to_string(),
        Variant::U32(v) => v.to_string(),
        Variant::I64(v) => v.to_string(),
        Variant::U64(u64::MAX) => "infinity".to_owned(),
        Variant::U64(v) => v.to_string(),
        Variant::F64(v) => v.to_string(),
        Variant::Str(s) => s.as_str().to_owned(),
        Variant::Signature(s) => s.to_string(),
        Variant::ObjectPath(p) => p.as_str().to_owned(),
        Variant::Variant(v) => plain(v),
        Variant::Array(a) => {
            let items = a.inner();
            // Bytes (an ID, a hash) in hex, as systemd prints IDs.
            if !items.is_empty() && items.iter().all(|i| matches!(i, Variant::U8(_))) {
                return items
                    .iter()
                    .filter_map(|i| match i {
                        Variant::U8(b) => Some(format!("{b:02x}")),
                        _ => None,
                    })
                    .collect();
            }
            items.iter().map(plain).collect::<Vec<_>>().join(" ")
        }
        Variant::Dict(d) => d
            .iter()
            .map(|(k, v)| format!("{}={}", plain(k), plain(v)))
            .collect::<Vec<_>>()
            .join(" "),
        Variant::Structure(s) => s.fields().iter().map(plain).collect::<Vec<_>>().join(" "),
        Variant::Fd(_) => "[fd]".to_owned(),
    }
}

fn yes_no(v: bool) -> &'static str {
    if v { "yes" } else { "no" }
}

/// An `Exec*` entry, `(sasbttttuii)`: path, argv, ignore errors, start and stop times
/// (realtime, monotonic), pid, exit code and status.
fn exec_command(entry: &Variant<'_>) -> String {
    let s = match entry {
        Variant::Structure(s) => s,
        Variant::Variant(inner) => return exec_command(inner),
        other => return plain(other),
    };
    let f = s.fields();
    let [
        Variant::Str(path),
        Variant::Array(argv),
        Variant::Bool(ignore),
        Variant::U64(start),
        _,
        Variant::U64(stop),
        _,
        Variant::U32(pid),
        Variant::I32(code),
        Variant::I32(status),
    ] = f
    else {
        return plain(entry);
    };
    let argv: Vec<String> = argv.inner().iter().map(plain).collect();
    let when = |t: u64| match timestamp(t) {
        t if t.is_empty() => "n/a".to_owned(),
        t => t,
    };
    let code_name = match code {
        0 => "(null)".to_owned(),
        1 => "exited".to_owned(),
        2 => "killed".to_owned(),
        3 => "dumped".to_owned(),
        c => c.to_string(),
    };
    format!(
        "{{ path={} ; argv[]={} ; ignore_errors={} ; start_time=[{}] ; stop_time=[{}] ; \
         pid={pid} ; code={code_name} ; status={status} }}",
        path.as_str(),
        argv.join(" "),
        yes_no(*ignore),
        when(*start),
        when(*stop),
    )
}

/// A realtime timestamp in microseconds as systemd prints it (`Tue 2026-12-01 18:54:30
/// UTC`); empty when unset (0 or `UINT64_MAX`).
pub(super) fn timestamp(usec: u64) -> String {
    if usec == 0 || usec == u64::MAX {
        return String::new();
    }
    let secs = usec / 1_000_000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    // 1970-01-01 was a Thursday.
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    let weekday = WEEKDAYS[(days.rem_euclid(7)) as usize];
    format!(
        "{weekday} {y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// systemd's `format_timespan(usec, accuracy)`: `1min 30s`, `100ms`, `1.500000s`,
/// `infinity`.
pub(super) fn timespan(usec: u64, accuracy: u64) -> String {
    const TABLE: [(&str, u64); 9] = [
        ("y", 31_557_600_000_000),
        ("month", 2_629_800_000_000),
        ("w", 604_800_000_000),
        ("d", 86_400_000_000),
        ("h", 3_600_000_000),
        ("min", 60_000_000),
        ("s", 1_000_000),
        ("ms", 1000),
        ("us", 1),
    ];
    if usec == u64::MAX {
        return "infinity".to_owned();
    }
    if usec == 0 {
        return "0".to_owned();
    }
    let accuracy = accuracy.max(1);
    let mut parts: Vec<String> = Vec::new();
    let mut t = usec;
    for (suffix, unit) in TABLE {
        if t == 0 || t < accuracy {
            break;
        }
        if t < unit {
            continue;
        }
        let (a, mut b) = (t / unit, t % unit);
        // Below a minute a remainder is shown as a fraction of this unit.
        if t < 60_000_000 && b > 0 {
            let mut digits = 0usize;
            let mut cc = unit;
            while cc > 1 {
                digits += 1;
                cc /= 10;
            }
            let mut cc = accuracy;
            while cc > 1 {
                b /= 10;
                digits = digits.saturating_sub(1);
                cc /= 10;
            }
            if digits > 0 {
                parts.push(format!("{a}.{b:0digits$}{suffix}"));
                break;
            }
        }
        parts.push(format!("{a}{suffix}"));
        t = b;
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_time_spans_as_systemctl_show() {
        assert_eq!(timespan(90_000_000, 1), "1min 30s");
        assert_eq!(timespan(100_000, 1), "100ms");
        assert_eq!(timespan(1_500_000, 1), "1.500000s");
        assert_eq!(timespan(0, 1), "0");
        assert_eq!(timespan(u64::MAX, 1), "infinity");
        assert_eq!(timespan(3_600_000_000 + 5_000_000, 1), "1h 5s");
    }

    #[test]
    fn formats_timestamps_in_utc_and_leaves_unset_ones_empty() {
        // 2026-12-01 18:54:30 UTC.
        assert_eq!(
            timestamp(1_796_151_270_000_000),
            "Tue 2026-12-01 18:54:30 UTC"
        );
        assert_eq!(timestamp(0), "");
        assert_eq!(
            timestamp(86_400_000_000 * 59),
            "Sun 1970-03-01 00:00:00 UTC"
        );
    }

    #[test]
    fn formats_values_by_type_and_name() {
        let p = |name, v: Variant<'_>| format_property(name, &v);
        assert_eq!(p("ActiveState", Variant::from("active")), "active");
        assert_eq!(p("CanStart", Variant::from(true)), "yes");
        assert_eq!(p("MainPID", Variant::from(42u32)), "42");
        assert_eq!(p("MemoryMax", Variant::from(u64::MAX)), "infinity");
        assert_eq!(
            p("TimeoutStartUSec", Variant::from(90_000_000u64)),
            "1min 30s"
        );
        assert_eq!(p("ActiveEnterTimestamp", Variant::from(0u64)), "");
        assert_eq!(p("UMask", Variant::from(0o022u32)), "0022");
        assert_eq!(
            p("Wants", Variant::from(vec!["a.service", "b.socket"])),
            "a.service b.socket"
        );
        assert_eq!(p("InvocationID", Variant::from(vec![0x0au8, 0xff])), "0aff");
    }

    #[test]
    fn formats_exec_commands_as_systemctl_show() {
        let cmd = (
            "/bin/sh",
            vec!["/bin/sh", "-c", "echo hi"],
            false,
            0u64,
            0u64,
            0u64,
            0u64,
            7u32,
            1i32,
            0i32,
        );
        let exec = Variant::from(vec![cmd]);
        assert_eq!(
            format_property("ExecStart", &exec),
            "{ path=/bin/sh ; argv[]=/bin/sh -c echo hi ; ignore_errors=no ; \
             start_time=[n/a] ; stop_time=[n/a] ; pid=7 ; code=exited ; status=0 }"
        );
    }
}
