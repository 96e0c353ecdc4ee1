//! Per-machine cgroup directories on the host's cgroup v1 hybrid layout.
//!
//! The host has no cgroup namespaces, so a machine's systemd sees the real hierarchy and puts
//! its units at `<its own cgroup>/system.slice/<unit>`. Starting each machine in a directory of
//! its own in every hierarchy (before `unshare`) keeps same-named units on two machines apart.
//! cpuset is left out: a new cpuset cgroup has no CPUs until someone configures it.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::time::Duration;

const ROOT: &str = "/sys/fs/cgroup";
const HIERARCHIES: [&str; 9] = [
    "systemd", "unified", "pids", "cpu", "cpuacct", "devices", "freezer", "blkio", "memory",
];

/// The mounted hierarchies the harness uses.
fn hierarchies() -> impl Iterator<Item = PathBuf> {
    HIERARCHIES
        .iter()
        .map(|h| Path::new(ROOT).join(h))
        .filter(|p| p.join("cgroup.procs").exists())
}

/// `/sys/fs/cgroup/<hierarchy>/<name>` for each hierarchy the harness uses.
pub fn paths(name: &str) -> Vec<PathBuf> {
    hierarchies().map(|h| h.join(name)).collect()
}

/// Creates the cgroup directories `dirs` (from [`paths`]).
pub fn create(dirs: &[PathBuf]) -> Result<()> {
    for dir in dirs {
        match std::fs::create_dir(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(e).with_context(|| format!("cannot create cgroup {}", dir.display()));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The top-level directories in any hierarchy whose name satisfies `matches`.
pub fn find(matches: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    hierarchies()
        .flat_map(|h| std::fs::read_dir(h).into_iter().flatten().flatten())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| matches(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect()
}

/// The PIDs in `dir` and every cgroup below it.
pub fn pids_below(dir: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            pids.extend(pids_below(&entry.path()));
        }
    }
    pids
}

/// Removes `dir` and the cgroups the machine's systemd made below it, deepest first. Waits up to
/// `timeout` for the last processes to leave (a killed process leaves its cgroup only once it
/// has fully exited). Gone already is fine.
pub fn remove(dir: &Path, timeout: Duration) -> Result<()> {
    let mut last_error = None;
    let removed = crate::wait_for(timeout, Duration::from_millis(10), || {
        match remove_tree(dir) {
            Ok(()) => true,
            Err(e) => {
                last_error = Some(e);
                false
            }
        }
    });
    match (removed, last_error) {
        (Ok(()), _) => Ok(()),
        (Err(e), None) => Err(e),
        (Err(_), Some(e)) => {
            Err(e).with_context(|| format!("cannot remove cgroup {}", dir.display()))
        }
    }
}

fn remove_tree(dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            remove_tree(&entry.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
