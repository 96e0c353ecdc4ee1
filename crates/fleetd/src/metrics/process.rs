//! The standard `process_*` metrics of Prometheus's client libraries (memory, CPU time, file
//! descriptors, start time), read from `/proc/self` at each scrape, as Go's client reads them
//! for fleet: dashboards and alerts written for any exporter work on fleetd unchanged.
//!
//! The parsing is pure (each function takes a file's text); [`Process`] only reads the files.
//! A file that cannot be read or parsed leaves its metrics out of that scrape: the rest of
//! `/metrics` is still served. No unsafe code (the workspace forbids it), so no `sysconf`:
//! CPU times are in the kernel's USER_HZ, 100 on every architecture Linux exposes to
//! userspace (Prometheus's procfs assumes the same), and memory comes from `status` in kB,
//! not from `stat` in pages of a size we could not ask for.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;
use std::path::PathBuf;

/// Clock ticks per second of `/proc/<pid>/stat`'s times (the kernel's USER_HZ).
const USER_HZ: f64 = 100.0;

/// What `/proc/self/stat` says of the process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Seconds after boot when the process started.
    pub started_after_boot: f64,
    pub virtual_bytes: f64,
}

/// `/proc/<pid>/stat`: the fields after the command, which is in parentheses and may hold
/// spaces and parentheses itself, so the split is at the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    // rest starts at field 3 (state); utime is field 14, stime 15, starttime 22, vsize 23.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field =
        |n: usize| -> Option<f64> { fields.get(n - 3)?.parse::<u64>().ok().map(|v| v as f64) };
    Some(Stat {
        cpu_seconds: (field(14)? + field(15)?) / USER_HZ,
        started_after_boot: field(22)? / USER_HZ,
        virtual_bytes: field(23)?,
    })
}

/// `VmRSS` of `/proc/<pid>/status`, in bytes.
pub fn parse_resident_bytes(status: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut words = line["VmRSS:".len()..].split_whitespace();
    let kb: u64 = words.next()?.parse().ok()?;
    (words.next()? == "kB").then_some(kb as f64 * 1024.0)
}

/// `btime` of `/proc/stat`: when the machine booted, in seconds since the epoch.
pub fn parse_boot_time(stat: &str) -> Option<f64> {
    let line = stat.lines().find(|l| l.starts_with("btime "))?;
    line["btime ".len()..]
        .trim()
        .parse::<u64>()
        .ok()
        .map(|v| v as f64)
}

/// The soft limit of open files in `/proc/<pid>/limits` (`None` for `unlimited`).
pub fn parse_max_fds(limits: &str) -> Option<f64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line["Max open files".len()..].split_whitespace().next()?;
    soft.parse::<u64>().ok().map(|v| v as f64)
}

/// The `process_*` metrics of the process whose `/proc` directory is `proc_dir`
/// (`/proc/self`), and `/proc/stat` for the boot time.
#[derive(Debug)]
pub struct Process {
    proc_dir: PathBuf,
    proc_stat: PathBuf,
}

impl Process {
    /// This process.
    pub fn current() -> Process {
        Process {
            proc_dir: PathBuf::from("/proc/self"),
            proc_stat: PathBuf::from("/proc/stat"),
        }
    }

    fn read(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.proc_dir.join(name)).ok()
    }

    fn open_fds(&self) -> Option<f64> {
        let entries = std::fs::read_dir(self.proc_dir.join("fd")).ok()?;
        Some(entries.count() as f64)
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: Option<f64>,
) -> std::fmt::Result {
    let Some(value) = value else { return Ok(()) };
    let gauge = ConstGauge::new(value);
    gauge.encode(encoder.encode_descriptor(name, help, unit, gauge.metric_type())?)
}

impl Collector for Process {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let stat = self.read("stat").as_deref().and_then(parse_stat);
        if let Some(stat) = stat {
            let cpu = ConstCounter::new(stat.cpu_seconds);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds",
                Some(&Unit::Seconds),
                cpu.metric_type(),
            )?)?;
        }
        let resident = self
            .read("status")
            .as_deref()
            .and_then(parse_resident_bytes);
        gauge(
            &mut encoder,
            "process_resident_memory",
            "Resident memory size in bytes",
            Some(&Unit::Bytes),
            resident,
        )?;
        gauge(
            &mut encoder,
            "process_virtual_memory",
            "Virtual memory size in bytes",
            Some(&Unit::Bytes),
            stat.map(|s| s.virtual_bytes),
        )?;
        let boot = std::fs::read_to_string(&self.proc_stat)
            .ok()
            .as_deref()
            .and_then(parse_boot_time);
        gauge(
            &mut encoder,
            "process_start_time",
            "Start time of the process since unix epoch in seconds",
            Some(&Unit::Seconds),
            boot.zip(stat).map(|(boot, s)| boot + s.started_after_boot),
        )?;
        gauge(
            &mut encoder,
            "process_open_fds",
            "Number of open file descriptors",
            None,
            self.open_fds(),
        )?;
        gauge(
            &mut encoder,
            "process_max_fds",
            "Maximum number of open file descriptors",
            None,
            self.read("limits").as_deref().and_then(parse_max_fds),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_is_read_after_the_last_parenthesis_of_a_command_that_holds_some() {
        // A command of `a) (b` and fields as the kernel writes them (utime 250, stime 50,
        // starttime 1297478, vsize 3133440).
        let text = "901 (a) (b) R 892 892 25582 0 -1 4194304 99 0 0 0 250 50 0 0 20 0 1 0 \
                    1297478 3133440 381 18446744073709551615 0 0 0\n";
        assert_eq!(
            parse_stat(text),
            Some(Stat {
                cpu_seconds: 3.0,
                started_after_boot: 12974.78,
                virtual_bytes: 3_133_440.0,
            })
        );
        assert_eq!(parse_stat("901 (cat R 1 2"), None);
    }

    #[test]
    fn status_limits_and_boot_time_give_their_values_or_nothing() {
        let status = "Name:\tfleetd\nVmSize:\t  10000 kB\nVmRSS:\t    2048 kB\nThreads:\t4\n";
        assert_eq!(parse_resident_bytes(status), Some(2048.0 * 1024.0));
        assert_eq!(parse_resident_bytes("Name:\tkthreadd\n"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_max_fds(limits), Some(1024.0));
        assert_eq!(
            parse_max_fds(
                "Max open files            unlimited            unlimited            files\n"
            ),
            None
        );
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1764900000\nprocesses 9\n"),
            Some(1_764_900_000.0)
        );
    }

    #[test]
    fn this_process_is_described_with_every_standard_name() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Process::current()));
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
            "process_max_fds ",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(name)),
                "no {name}in {text}"
            );
        }
        let start = text
            .lines()
            .find_map(|l| l.strip_prefix("process_start_time_seconds "))
            .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start: f64 = start.parse().unwrap();
        assert!(
            start <= now + 1.0 && start > now - 86_400.0 * 365.0,
            "{start} vs {now}"
        );
    }
}
