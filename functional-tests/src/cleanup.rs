//! Tearing clusters down, and finding what earlier runs left behind.
//!
//! Teardown works from the recorded [`ClusterState`] and touches only what it lists: the
//! processes the harness started (checked by start time, see [`ProcId`]), the processes inside
//! cgroups the harness made, and resources named with the run's id. Every step is idempotent, so
//! a teardown interrupted halfway can simply be run again.

use crate::cgroup;
use crate::net;
use crate::proc::ProcId;
use crate::state::{ClusterState, DOWN_FILE, MachineState, RunId, STATE_FILE, functional_dir};
use anyhow::{Context, Result, anyhow};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

const KILL_TIMEOUT: Duration = Duration::from_secs(10);
const CGROUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Finished run directories kept for their logs; older ones are deleted by `cleanup_stale`.
const KEEP_RUNS: usize = 20;
const KEEP_RUNS_YOUNGER_THAN: Duration = Duration::from_secs(3600);

/// Collects the errors of independent teardown steps, so one failure does not leave the rest.
#[derive(Default)]
struct Problems(Vec<anyhow::Error>);

impl Problems {
    fn check(&mut self, result: Result<()>) {
        if let Err(e) = result {
            self.0.push(e);
        }
    }

    fn into_result(self, what: &str) -> Result<()> {
        if self.0.is_empty() {
            return Ok(());
        }
        let list: Vec<String> = self.0.iter().map(|e| format!("{e:#}")).collect();
        Err(anyhow!("{what}: {}", list.join("; ")))
    }
}

/// Kills a machine's processes: its PID 1 (which takes the whole PID namespace with it), then
/// anything left in its cgroups (all started by the harness), then its `unshare`.
pub(crate) fn kill_machine(machine: &MachineState) -> Result<()> {
    if let Some(pid1) = machine.pid1 {
        pid1.kill_and_wait(KILL_TIMEOUT)?;
    }
    kill_cgroup_members(&machine.cgroups)?;
    if let Some(unshare) = machine.unshare {
        // It exits by itself once PID 1 is gone; only a boot that failed early leaves it.
        if crate::wait_for(Duration::from_secs(2), Duration::from_millis(5), || {
            !unshare.is_alive()
        })
        .is_err()
        {
            unshare.kill_and_wait(KILL_TIMEOUT)?;
        }
    }
    Ok(())
}

fn kill_cgroup_members(dirs: &[PathBuf]) -> Result<()> {
    let pids: BTreeSet<u32> = dirs.iter().flat_map(|d| cgroup::pids_below(d)).collect();
    for pid in pids {
        if let Ok(process) = ProcId::of(pid) {
            process.kill_and_wait(KILL_TIMEOUT)?;
        }
    }
    Ok(())
}

/// Removes a machine's cgroups, veth and network namespace (its processes must be gone).
pub(crate) fn remove_machine(machine: &MachineState) -> Result<()> {
    let mut problems = Problems::default();
    for dir in &machine.cgroups {
        problems.check(cgroup::remove(dir, CGROUP_TIMEOUT));
    }
    // The veth first: deleting the namespace frees its end only asynchronously.
    problems.check(net::delete_link(&machine.resource));
    problems.check(net::delete_netns(&machine.resource));
    problems.into_result(&format!("machine {}", machine.name))
}

/// Tears down everything `state` lists. Leaves the run directory (logs) but deletes etcd's data.
pub fn teardown(state: &ClusterState) -> Result<()> {
    let mut problems = Problems::default();
    for machine in &state.machines {
        problems.check(kill_machine(machine).with_context(|| format!("machine {}", machine.name)));
    }
    for etcd in state.etcd.processes() {
        problems.check(etcd.kill_and_wait(KILL_TIMEOUT).context("etcd"));
    }
    for machine in &state.machines {
        problems.check(remove_machine(machine));
    }
    problems.check(net::delete_link(&state.bridge));
    for index in 0..state.etcd.member_count() {
        let data = crate::etcd::member_data_dir(state, index);
        if data.exists() {
            problems.check(
                std::fs::remove_dir_all(&data)
                    .with_context(|| format!("cannot delete {}", data.display())),
            );
        }
    }
    problems.into_result(&format!("tearing down cluster {}", state.run_id))
}

/// Marks a run directory as torn down (its state file becomes [`DOWN_FILE`]).
pub(crate) fn mark_down(dir: &Path, state_file: &Path) -> Result<()> {
    std::fs::rename(state_file, dir.join(DOWN_FILE))
        .with_context(|| format!("cannot rename {}", state_file.display()))
}

/// Name of the state file while this process tears the run down: claiming a stale run is
/// renaming its state file to this, which exactly one of several racing cleaners wins.
fn cleaning_file(me: &ProcId) -> String {
    format!("cluster.cleaning-{}-{}.json", me.pid, me.start_time)
}

/// The cleaner recorded in a `cluster.cleaning-<pid>-<start>.json` name.
fn cleaner_of(file_name: &str) -> Option<ProcId> {
    let middle = file_name
        .strip_prefix("cluster.cleaning-")?
        .strip_suffix(".json")?;
    let (pid, start_time) = middle.split_once('-')?;
    Some(ProcId {
        pid: pid.parse().ok()?,
        start_time: start_time.parse().ok()?,
    })
}

/// If the run in `dir` is abandoned (owner or previous cleaner dead), claims it for this
/// process and returns its state file's new path.
fn claim_abandoned(dir: &Path, me: &ProcId) -> Option<PathBuf> {
    let mine = dir.join(cleaning_file(me));
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let abandoned = if name == STATE_FILE {
            ClusterState::load(dir).is_ok_and(|s| !s.is_claimed())
        } else {
            cleaner_of(&name).is_some_and(|cleaner| !cleaner.is_alive())
        };
        if abandoned && std::fs::rename(entry.path(), &mine).is_ok() {
            return Some(mine);
        }
    }
    None
}

/// The state file of a run that is not finished (running, abandoned, or being cleaned up).
fn unfinished_state_file(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        (name == STATE_FILE || cleaner_of(&name).is_some()).then(|| e.path())
    })
}

fn load_unfinished(dir: &Path) -> Option<ClusterState> {
    let json = std::fs::read(unfinished_state_file(dir)?).ok()?;
    serde_json::from_slice(&json).ok()
}

/// Removes what earlier runs left behind when their owner died without tearing down (a killed
/// test process, a crash): clusters recorded under `<workspace>/target/functional/`, then any
/// `flt<run id>*` bridge, veth, network namespace or cgroup that no live run claims. Detached
/// clusters (`fleet-cluster up`) are left alone. Returns what it cleaned.
pub fn cleanup_stale() -> Result<Vec<String>> {
    let me = ProcId::current()?;
    let mut cleaned = Vec::new();
    let mut problems = Problems::default();
    let mut recorded = BTreeSet::new();
    for dir in run_dirs() {
        let Some(file) = claim_abandoned(&dir, &me) else {
            continue;
        };
        let result = std::fs::read(&file)
            .context("cannot read claimed state")
            .and_then(|json| serde_json::from_slice::<ClusterState>(&json).context("bad state"))
            .and_then(|state| {
                recorded.insert(state.run_id.clone());
                teardown(&state)?;
                mark_down(&dir, &file)
            });
        match result {
            Ok(()) => cleaned.push(format!("cluster in {}", dir.display())),
            Err(e) => problems.check(Err(e.context(format!("stale cluster in {}", dir.display())))),
        }
    }
    match orphans(&recorded) {
        Ok(rids) => {
            for rid in rids {
                problems.check(remove_orphan(&rid));
                cleaned.push(format!("orphaned resources flt{rid}*"));
            }
        }
        Err(e) => problems.check(Err(e)),
    }
    prune_old_runs();
    problems.into_result("cleaning up stale clusters")?;
    Ok(cleaned)
}

fn run_dirs() -> Vec<PathBuf> {
    std::fs::read_dir(functional_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Run ids with resources on the host that nobody claims.
fn orphans(already_cleaned: &BTreeSet<RunId>) -> Result<BTreeSet<RunId>> {
    let mut seen = BTreeSet::new();
    let links = net::links()?;
    for name in links
        .iter()
        .map(|l| l.name.clone())
        .chain(net::netns_names()?)
    {
        seen.extend(RunId::from_resource(&name));
    }
    for dir in cgroup::find(|name| RunId::from_resource(name).is_some()) {
        seen.extend(
            dir.file_name()
                .and_then(|n| RunId::from_resource(&n.to_string_lossy())),
        );
    }
    let ours: BTreeSet<RunId> = run_dirs()
        .into_iter()
        .filter_map(|d| load_unfinished(&d).map(|s| s.run_id))
        .collect();
    Ok(seen
        .into_iter()
        .filter(|rid| !already_cleaned.contains(rid) && !ours.contains(rid))
        .filter(|rid| {
            if !links.iter().any(|l| l.name == rid.bridge()) {
                // Bridges are made first and removed last: without one, nothing is running.
                return true;
            }
            match net::alias(&rid.bridge())
                .and_then(|a| a.strip_prefix(net::ALIAS_TAG).map(PathBuf::from))
            {
                // Not tagged (yet): not provably ours, leave it.
                None => false,
                Some(state_file) => {
                    let dir = state_file.parent().unwrap_or(Path::new("/"));
                    !ClusterState::load(dir).is_ok_and(|s| s.is_claimed())
                }
            }
        })
        .collect())
}

/// Removes every resource named after `rid`, killing first the processes in its cgroups (all
/// of them descendants of machines the harness booted) and its etcd.
fn remove_orphan(rid: &RunId) -> Result<()> {
    let prefix = rid.bridge();
    let cgroups = cgroup::find(|name| name.starts_with(&prefix));
    kill_cgroup_members(&cgroups)?;
    for etcd in etcd_processes(rid) {
        etcd.kill_and_wait(KILL_TIMEOUT)?;
    }
    let mut problems = Problems::default();
    for dir in &cgroups {
        problems.check(cgroup::remove(dir, CGROUP_TIMEOUT));
    }
    for link in net::links()?
        .iter()
        .filter(|l| RunId::from_resource(&l.name).as_ref() == Some(rid))
    {
        problems.check(net::delete_link(&link.name));
    }
    for ns in net::netns_names()?
        .iter()
        .filter(|n| RunId::from_resource(n).as_ref() == Some(rid))
    {
        problems.check(net::delete_netns(ns));
    }
    problems.into_result(&format!("orphaned resources of run {rid}"))
}

/// etcd servers of run `rid`: `/usr/bin/etcd` with `--name flt<rid>` or `flt<rid>e<i>`, names
/// only the harness gives (see `etcd::member_name`).
fn etcd_processes(rid: &RunId) -> Vec<ProcId> {
    let name = rid.bridge();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.first() == Some(&&b"/usr/bin/etcd"[..])
                && args
                    .windows(2)
                    .any(|w| w[0] == b"--name" && is_member_name(w[1], &name))
        })
        .filter_map(|pid| ProcId::of(pid).ok())
        .collect()
}

/// `flt<rid>` or `flt<rid>e<digits>`.
fn is_member_name(arg: &[u8], bridge: &str) -> bool {
    let Some(rest) = arg.strip_prefix(bridge.as_bytes()) else {
        return false;
    };
    rest.is_empty()
        || rest
            .strip_prefix(b"e")
            .is_some_and(|n| !n.is_empty() && n.iter().all(u8::is_ascii_digit))
}

/// Deletes finished run directories beyond the newest [`KEEP_RUNS`], if older than an hour.
fn prune_old_runs() {
    let mut finished: Vec<(SystemTime, PathBuf)> = run_dirs()
        .into_iter()
        .filter(|d| unfinished_state_file(d).is_none())
        .filter_map(|d| Some((d.metadata().ok()?.modified().ok()?, d)))
        .collect();
    finished.sort_by_key(|f| std::cmp::Reverse(f.0));
    for (modified, dir) in finished.into_iter().skip(KEEP_RUNS) {
        if modified
            .elapsed()
            .is_ok_and(|age| age > KEEP_RUNS_YOUNGER_THAN)
        {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// What of the cluster recorded in `state` still exists on the host: live processes, links,
/// network namespaces (and their mounts), cgroup directories. Empty after a clean teardown.
pub fn leftovers(state: &ClusterState) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let prefix = state.run_id.bridge();
    let processes = state
        .machines
        .iter()
        .flat_map(|m| {
            [("unshare", m.unshare), ("pid 1", m.pid1)].map(|(what, p)| (&m.name, what, p))
        })
        .chain(
            state
                .etcd
                .processes()
                .into_iter()
                .map(|p| (&state.bridge, "etcd", Some(p))),
        );
    for (owner, what, process) in processes {
        if let Some(process) = process.filter(|p| p.is_alive()) {
            found.push(format!("{owner} {what}: {process}"));
        }
    }
    for link in net::links()?.iter().filter(|l| l.name.starts_with(&prefix)) {
        found.push(format!("link {}", link.name));
    }
    for ns in net::netns_names()?
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
    {
        found.push(format!("network namespace {ns}"));
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in mounts.lines().filter(|l| l.contains(&prefix)) {
        found.push(format!("mount {line}"));
    }
    for dir in cgroup::find(|name| name.starts_with(&prefix)) {
        found.push(format!("cgroup {}", dir.display()));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_member_names_of_a_run_are_recognised_and_others_are_not() {
        let bridge = "flt0a1b2c";
        for ours in ["flt0a1b2c", "flt0a1b2ce1", "flt0a1b2ce12"] {
            assert!(is_member_name(ours.as_bytes(), bridge), "{ours}");
        }
        for other in [
            "flt0a1b2",
            "flt0a1b2cx",
            "flt0a1b2ce",
            "flt0a1b2ce1x",
            "test",
        ] {
            assert!(!is_member_name(other.as_bytes(), bridge), "{other}");
        }
    }
}
