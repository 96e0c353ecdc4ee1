//! What this process costs, from /proc: its CPU time and its resident memory.

/// This process's CPU time (user + system), in seconds.
pub fn process_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    cpu_of_stat(&stat)
}

/// utime + stime of a `/proc/<pid>/stat` line, in seconds (USER_HZ is 100 on Linux).
pub fn cpu_of_stat(stat: &str) -> f64 {
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    // After the command: state is field 3, utime 14 and stime 15 (1-based).
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (tick(11) + tick(12)) / 100.0
}

/// This process's resident memory, MiB.
pub fn process_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    rss_of_status(&status)
}

/// VmRSS of a `/proc/<pid>/status`, MiB.
pub fn rss_of_status(status: &str) -> f64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|l| l.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}
