//! Writing results: each scenario owns one section of `docs/benchmarks.md`, between
//! `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`, and replaces only that, so scenarios run
//! alone keep the others' figures. Also the small formatting helpers they share.

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// `$FLEET_BENCH_DOCS`, else `<workspace>/docs`.
pub fn docs_dir() -> PathBuf {
    std::env::var_os("FLEET_BENCH_DOCS").map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs")),
        PathBuf::from,
    )
}

/// `<workspace>/target/bench`: unit files the scenarios hand to fleetctl.
pub fn work_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/bench"))
}

/// Replaces section `name` of docs/benchmarks.md with `body` (appends it if missing).
pub fn write_section(name: &str, body: &str) -> Result<()> {
    let path = docs_dir().join("benchmarks.md");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let (open, close) = (
        format!("<!-- bench:{name} -->"),
        format!("<!-- /bench:{name} -->"),
    );
    let block = format!("{open}\n{}\n{close}", body.trim_end());
    let new = match (text.find(&open), text.find(&close)) {
        (Some(a), Some(b)) if b > a => format!("{}{block}{}", &text[..a], &text[b + close.len()..]),
        _ => format!("{}\n{block}\n", text.trim_end()),
    };
    std::fs::write(&path, new).with_context(|| format!("writing {}", path.display()))?;
    println!("wrote section {name} of {}", path.display());
    Ok(())
}

/// Where, when and how a result was produced, as the first lines of a section.
pub fn provenance(started: SystemTime, took: Duration) -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!(
        "Command: `cargo run --release -p fleet-bench -- {}` ({})  \n\
         Machine: {}  \n\
         Code: {}  \n\
         Date: {} (scenario took {})\n",
        args.join(" "),
        match args
            .iter()
            .any(|a| a == "--vary" || a.starts_with("--vary="))
        {
            true => "a variation of a `make bench` run",
            false => "part of `make bench`",
        },
        machine(),
        commit(),
        utc(started),
        human(took),
    )
}

/// The workspace's commit, `+ local changes` when the code differs from it.
fn commit() -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let Some(head) = git(&["rev-parse", "--short", "HEAD"]) else {
        return "not a git checkout".to_owned();
    };
    let paths = [
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        "crates",
        "functional-tests",
    ];
    match git(&paths) {
        Some(changes) if changes.is_empty() => format!("commit {head}"),
        _ => format!("commit {head} + local changes"),
    }
}

/// The section saying how long the last `make bench` took.
pub fn total(took: Duration) -> String {
    format!(
        "The last full `make bench` took **{}** (with whatever release build it needed) on {}, \
         finished {}.\n",
        human(took),
        machine(),
        utc(SystemTime::now())
    )
}

/// The host: cores, CPU model, memory, kernel, etcd version.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let etcd = std::process::Command::new("etcd")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.lines()
                .next()
                .map(|l| l.trim_start_matches("etcd Version:").trim().to_owned())
        })
        .unwrap_or_default();
    format!(
        "{cores} cores ({model}), {mem_gib:.0} GiB RAM, Linux {}, etcd {etcd}",
        kernel.trim()
    )
}

/// `2026-11-30 05:43 UTC`.
pub fn utc(at: SystemTime) -> String {
    fleet_core::fence::utc_minutes(at)
}

/// Milliseconds with one decimal below 10 ms.
pub fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1000.0;
    if v < 10.0 {
        format!("{v:.1} ms")
    } else {
        format!("{v:.0} ms")
    }
}

/// Seconds with two decimals.
pub fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// `1 min 05 s` or `12.3 s`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.1} s")
    } else {
        format!(
            "{} min {:02} s",
            (s / 60.0).floor(),
            (s % 60.0).round() as u64
        )
    }
}

/// The `p`-th percentile (0..=100) of `samples`, nearest rank.
pub fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// `met` or `**missed**`.
pub fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "**missed**" }
}

/// A Markdown table.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            rows: vec![header.iter().map(|h| (*h).to_owned()).collect()],
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        for (i, row) in self.rows.iter().enumerate() {
            out.push_str(&format!("| {} |\n", row.join(" | ")));
            if i == 0 {
                out.push_str(&format!("|{}\n", "---|".repeat(row.len())));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn formats_a_known_date() {
        let at = UNIX_EPOCH + Duration::from_secs(1_795_930_980);
        assert_eq!(utc(at), "2026-11-29 05:43 UTC");
    }

    #[test]
    fn takes_nearest_rank_percentiles() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&samples, 95.0), Duration::from_millis(95));
        assert_eq!(percentile(&samples[..1], 95.0), Duration::from_millis(1));
    }

    #[test]
    fn renders_a_markdown_table() {
        let mut t = Table::new(&["a", "b"]);
        t.row(vec!["1".into(), "2".into()]);
        assert_eq!(t.render(), "| a | b |\n|---|---|\n| 1 | 2 |\n");
    }
}
