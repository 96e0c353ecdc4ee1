//! The forms `systemctl show` gives values it does not print as plain numbers: dates, time
//! spans, capability and namespace sets, NUMA policies, mount propagation, signal names.
//! Pure functions over the D-Bus values, each named after the systemd function it follows.

/// `mpol_to_string`: the kernel's MPOL_* values.
pub(super) fn numa_policy(v: i32) -> &'static str {
    match v {
        0 => "default",
        1 => "preferred",
        2 => "bind",
        3 => "interleave",
        4 => "local",
        _ => "n/a",
    }
}

/// `mount_propagation_flags_to_string`: MS_SHARED, MS_SLAVE, MS_PRIVATE.
pub(super) fn mount_propagation(v: u64) -> &'static str {
    match v {
        0 => "",
        0x10_0000 => "shared",
        0x8_0000 => "slave",
        0x4_0000 => "private",
        _ => "",
    }
}

/// The kernel's capability names, by bit (`capability_set_to_string`).
const CAPABILITIES: [&str; 41] = [
    "cap_chown",
    "cap_dac_override",
    "cap_dac_read_search",
    "cap_fowner",
    "cap_fsetid",
    "cap_kill",
    "cap_setgid",
    "cap_setuid",
    "cap_setpcap",
    "cap_linux_immutable",
    "cap_net_bind_service",
    "cap_net_broadcast",
    "cap_net_admin",
    "cap_net_raw",
    "cap_ipc_lock",
    "cap_ipc_owner",
    "cap_sys_module",
    "cap_sys_rawio",
    "cap_sys_chroot",
    "cap_sys_ptrace",
    "cap_sys_pacct",
    "cap_sys_admin",
    "cap_sys_boot",
    "cap_sys_nice",
    "cap_sys_resource",
    "cap_sys_time",
    "cap_sys_tty_config",
    "cap_mknod",
    "cap_lease",
    "cap_audit_write",
    "cap_audit_control",
    "cap_setfcap",
    "cap_mac_override",
    "cap_mac_admin",
    "cap_syslog",
    "cap_wake_alarm",
    "cap_block_suspend",
    "cap_audit_read",
    "cap_perfmon",
    "cap_bpf",
    "cap_checkpoint_restore",
];

/// The names of the capabilities set in `v`, as systemd names them; a bit the table does
/// not know is its number.
pub(super) fn capabilities(v: u64) -> String {
    (0..64u32)
        .filter(|bit| v & (1u64 << bit) != 0)
        .map(|bit| match CAPABILITIES.get(bit as usize) {
            Some(name) => (*name).to_owned(),
            // Bits past the kernel's last capability: systemd prints only those it knows.
            None => String::new(),
        })
        .filter(|n| !n.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `RestrictNamespaces`: `yes` (none allowed), `no` (all), or the allowed ones' names.
pub(super) fn namespaces(v: u64) -> String {
    // CLONE_NEW* flags, in systemd's order.
    const FLAGS: [(&str, u64); 8] = [
        ("cgroup", 0x0200_0000),
        ("ipc", 0x0800_0000),
        ("net", 0x4000_0000),
        ("mnt", 0x0002_0000),
        ("pid", 0x2000_0000),
        ("user", 0x1000_0000),
        ("uts", 0x0400_0000),
        ("time", 0x0000_0080),
    ];
    let all: u64 = FLAGS.iter().map(|(_, f)| f).fold(0, |a, f| a | f);
    if v & all == 0 {
        return "yes".to_owned();
    }
    if v & all == all {
        return "no".to_owned();
    }
    FLAGS
        .iter()
        .filter(|(_, f)| v & f != 0)
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `signal_to_string`: the name without `SIG`, or the number.
pub(super) fn signal_name(signal: i32) -> String {
    const NAMES: [&str; 31] = [
        "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1", "SEGV", "USR2",
        "PIPE", "ALRM", "TERM", "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU", "URG",
        "XCPU", "XFSZ", "VTALRM", "PROF", "WINCH", "IO", "PWR", "SYS",
    ];
    match usize::try_from(signal)
        .ok()
        .and_then(|s| NAMES.get(s.wrapping_sub(1)))
    {
        Some(name) => (*name).to_owned(),
        None => signal.to_string(),
    }
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
}
