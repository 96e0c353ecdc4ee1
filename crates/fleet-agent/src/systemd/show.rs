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

mod forms;

use forms::{
    capabilities, mount_propagation, namespaces, numa_policy, signal_name, timespan, timestamp,
};

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

/// `value` of property `name` as `systemctl show` prints it (systemd 252's
/// `bus_print_property`, whose heuristics go by the property's name).
pub(super) fn format_property(name: &str, value: &Variant<'_>) -> String {
    match value {
        Variant::U64(v) => format_u64(name, *v),
        Variant::U32(v) => format_u32(name, *v),
        Variant::I32(v) if name == "NUMAPolicy" => numa_policy(*v).to_owned(),
        Variant::Array(a) if name.starts_with("Exec") && !a.inner().is_empty() => a
            .inner()
            .iter()
            .map(exec_command)
            .collect::<Vec<_>>()
            .join(" ; "),
        other => plain(other),
    }
}

const NOT_SET: &str = "[not set]";

fn format_u64(name: &str, v: u64) -> String {
    let is = |names: &[&str]| names.contains(&name);
    const TIMESTAMPS: [&str; 4] = [
        "NextElapseUSecRealtime",
        "LastTriggerUSec",
        "TimeUSec",
        "RTCTimeUSec",
    ];
    if name.ends_with("Timestamp") || is(&TIMESTAMPS) {
        return timestamp(v);
    }
    if name.contains("USec") {
        return timespan(v, 1);
    }
    match name {
        "CoredumpFilter" => return format!("0x{v:x}"),
        "RestrictNamespaces" => return namespaces(v),
        "MountFlags" => return mount_propagation(v).to_owned(),
        "CapabilityBoundingSet" | "AmbientCapabilities" => return capabilities(v),
        _ => {}
    }
    // systemd's "invalid" values of weights and shares, and its unset counters: all
    // UINT64_MAX.
    const UNSET: [&str; 10] = [
        "CPUWeight",
        "StartupCPUWeight",
        "IOWeight",
        "StartupIOWeight",
        "CPUShares",
        "StartupCPUShares",
        "BlockIOWeight",
        "StartupBlockIOWeight",
        "MemoryCurrent",
        "TasksCurrent",
    ];
    let unset = v == u64::MAX && (is(&UNSET) || name.ends_with("NSec"));
    if unset {
        return NOT_SET.to_owned();
    }
    const MEMORY: [&str; 8] = [
        "DefaultMemoryLow",
        "DefaultMemoryMin",
        "MemoryLow",
        "MemoryHigh",
        "MemoryMax",
        "MemorySwapMax",
        "MemoryLimit",
        "MemoryAvailable",
    ];
    let infinite = v == u64::MAX
        && (is(&MEMORY)
            || is(&["TasksMax", "DefaultTasksMax"])
            || name.starts_with("Limit")
            || name.starts_with("DefaultLimit"));
    if infinite {
        return "infinity".to_owned();
    }
    let no_data = [
        "IPIngressBytes",
        "IPIngressPackets",
        "IPEgressBytes",
        "IPEgressPackets",
    ];
    if v == u64::MAX && is(&no_data) {
        return "[no data]".to_owned();
    }
    v.to_string()
}

fn format_u32(name: &str, v: u32) -> String {
    if name.contains("UMask") || name.contains("Mode") {
        return format!("{v:04o}");
    }
    if (name == "UID" || name == "GID") && v == u32::MAX {
        return NOT_SET.to_owned();
    }
    v.to_string()
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

/// An `Exec*` entry: `(sasbttttuii)` (path, argv, ignore errors, start and stop times as
/// realtime and monotonic, pid, exit code and status), or an `Exec*Ex` one, `(sasasttttuii)`,
/// with flags where the boolean was.
fn exec_command(entry: &Variant<'_>) -> String {
    let s = match entry {
        Variant::Structure(s) => s,
        Variant::Variant(inner) => return exec_command(inner),
        other => return plain(other),
    };
    let [
        Variant::Str(path),
        Variant::Array(argv),
        third,
        Variant::U64(start),
        _,
        Variant::U64(stop),
        _,
        Variant::U32(pid),
        Variant::I32(code),
        Variant::I32(status),
    ] = s.fields()
    else {
        return plain(entry);
    };
    let third = match third {
        Variant::Bool(ignore) => format!("ignore_errors={}", yes_no(*ignore)),
        flags @ Variant::Array(_) => format!("flags={}", plain(flags)),
        _ => return plain(entry),
    };
    let argv: Vec<String> = argv.inner().iter().map(plain).collect();
    let when = |t: u64| match timestamp(t) {
        t if t.is_empty() => "n/a".to_owned(),
        t => t,
    };
    // siginfo's CLD_* codes; an exit status is a number, anything else a signal.
    let code_name = match code {
        0 => "(null)".to_owned(),
        1 => "exited".to_owned(),
        2 => "killed".to_owned(),
        3 => "dumped".to_owned(),
        4 => "trapped".to_owned(),
        5 => "stopped".to_owned(),
        6 => "continued".to_owned(),
        c => c.to_string(),
    };
    let status = if *code == 1 {
        status.to_string()
    } else {
        format!("{status}/{}", signal_name(*status))
    };
    format!(
        "{{ path={} ; argv[]={} ; {third} ; start_time=[{}] ; stop_time=[{}] ; \
         pid={pid} ; code={code_name} ; status={status} }}",
        path.as_str(),
        argv.join(" "),
        when(*start),
        when(*stop),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_values_by_type_and_name() {
        let p = |name, v: Variant<'_>| format_property(name, &v);
        assert_eq!(p("ActiveState", Variant::from("active")), "active");
        assert_eq!(p("CanStart", Variant::from(true)), "yes");
        assert_eq!(p("MainPID", Variant::from(42u32)), "42");
        assert_eq!(p("MemoryMax", Variant::from(u64::MAX)), "infinity");
        assert_eq!(
            p("IOReadBytes", Variant::from(u64::MAX)),
            "18446744073709551615"
        );
        assert_eq!(p("CPUWeight", Variant::from(u64::MAX)), "[not set]");
        assert_eq!(p("CPUUsageNSec", Variant::from(u64::MAX)), "[not set]");
        assert_eq!(p("TimerSlackNSec", Variant::from(50_000u64)), "50000");
        assert_eq!(p("IPEgressBytes", Variant::from(u64::MAX)), "[no data]");
        assert_eq!(p("CoredumpFilter", Variant::from(51u64)), "0x33");
        assert_eq!(p("RestrictNamespaces", Variant::from(0x7e02_0080u64)), "no");
        assert_eq!(p("RestrictNamespaces", Variant::from(0u64)), "yes");
        assert_eq!(
            p("RestrictNamespaces", Variant::from(0x4000_0000u64)),
            "net"
        );
        assert_eq!(
            p("CapabilityBoundingSet", Variant::from(0b101u64)),
            "cap_chown cap_dac_read_search"
        );
        assert_eq!(p("UID", Variant::from(u32::MAX)), "[not set]");
        assert_eq!(p("RuntimeDirectoryMode", Variant::from(0o755u32)), "0755");
        assert_eq!(p("NUMAPolicy", Variant::from(-1i32)), "n/a");
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
        let running = (
            "/bin/sleep",
            vec!["/bin/sleep", "9"],
            Vec::<String>::new(),
            0u64,
            0u64,
            0u64,
            0u64,
            8u32,
            0i32,
            0i32,
        );
        assert_eq!(
            format_property("ExecStartEx", &Variant::from(vec![running])),
            "{ path=/bin/sleep ; argv[]=/bin/sleep 9 ; flags= ; \
             start_time=[n/a] ; stop_time=[n/a] ; pid=8 ; code=(null) ; status=0/0 }"
        );
        assert_eq!(signal_name(15), "TERM");
        assert_eq!(signal_name(64), "64");
    }
}
