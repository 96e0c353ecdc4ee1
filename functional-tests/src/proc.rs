//! Processes the harness started, identified so that it never signals anything else.
//!
//! A bare PID is not an identity: once the process is gone the kernel hands the number to the
//! next process, and a teardown that runs late (`fleet-cluster down` a day later,
//! `cleanup_stale` after a crash) would kill a stranger. A [`ProcId`] pairs the PID with the
//! process's start time (clock ticks since boot, field 22 of `/proc/<pid>/stat`), which the
//! kernel never repeats for the same PID within one boot.

use crate::cmd::{self, Signal};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcId {
    pub pid: u32,
    pub start_time: u64,
}

/// What `/proc/<pid>/stat` says about a process.
struct Stat {
    state: char,
    start_time: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may itself contain spaces and ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); start time is field 22.
    Some(Stat {
        state: fields.first()?.chars().next()?,
        start_time: fields.get(22 - 3)?.parse().ok()?,
    })
}

impl ProcId {
    /// The process that has `pid` now.
    pub fn of(pid: u32) -> Result<ProcId> {
        let stat = stat(pid).with_context(|| format!("process {pid} does not exist"))?;
        Ok(ProcId {
            pid,
            start_time: stat.start_time,
        })
    }

    /// The harness's own process: the owner recorded in a cluster's state.
    pub fn current() -> Result<ProcId> {
        ProcId::of(std::process::id())
    }

    /// True while this very process exists and has not exited. A zombie (exited, not yet
    /// reaped by its parent) counts as gone: it holds no resources but its PID.
    pub fn is_alive(&self) -> bool {
        stat(self.pid).is_some_and(|s| s.start_time == self.start_time && s.state != 'Z')
    }

    /// Sends `signal` if the process is still this one; a process already gone is fine.
    pub fn signal(&self, signal: Signal) -> Result<()> {
        if !self.is_alive() {
            return Ok(());
        }
        // bash's builtin kill: no dependency on procps for /bin/kill, and bash is needed anyway.
        let pid = self.pid.to_string();
        let out = cmd::output(
            "bash",
            [
                "-c",
                "kill -s \"$1\" -- \"$2\"",
                "kill",
                signal.name(),
                &pid,
            ],
        )?;
        // It may have exited between the check and the kill: that is what we wanted anyway.
        if out.status.success() || !self.is_alive() {
            return Ok(());
        }
        cmd::OutputExt::checked(out)
            .map(drop)
            .with_context(|| format!("cannot send {signal} to {self}"))
    }

    /// SIGKILLs the process and waits until it is gone (or a zombie) for up to `timeout`.
    pub fn kill_and_wait(&self, timeout: Duration) -> Result<()> {
        self.signal(Signal::Kill)?;
        crate::wait_for(timeout, Duration::from_millis(5), || !self.is_alive())
            .with_context(|| format!("{self} still alive after SIGKILL"))
    }

    /// The PIDs of this process's children (e.g. the PID 1 that `unshare --fork` forked).
    pub fn children(&self) -> Vec<u32> {
        let path = format!("/proc/{0}/task/{0}/children", self.pid);
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }
}

impl fmt::Display for ProcId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} (started at tick {})", self.pid, self.start_time)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_process_is_alive() {
        assert!(ProcId::current().unwrap().is_alive());
    }

    #[test]
    fn a_reused_pid_is_not_the_same_process() {
        let mut me = ProcId::current().unwrap();
        me.start_time += 1;
        assert!(!me.is_alive());
    }

    #[test]
    fn signalling_a_gone_process_does_nothing() {
        let gone = ProcId {
            pid: u32::MAX / 2,
            start_time: 1,
        };
        gone.signal(Signal::Kill).unwrap();
    }
}
