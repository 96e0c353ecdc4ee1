//! The fence in systemd (`fleet_core::fence`): a transient timer that, unless fleetd pushes
//! it forward, starts a transient oneshot service running `fleetd --fence <units dir>`, which
//! stops this machine's non-global fleet units ([`SystemdManager::fence_units`]).
//!
//! A transient timer's deadline cannot be changed once it runs, so each push arms a new timer
//! (`fleet-fence-<pid>-<n>.timer`, its service of the same name) and then stops the one it
//! replaces: for a moment two are armed, the older with the earlier deadline, never none. The
//! first push of a process also stops every fence a previous fleetd left, once its own is
//! armed. Timers are monotonic (`OnActiveSec=`) with `AccuracySec=1us`: the deadline is not
//! moved by wall-clock steps and not coalesced with other timers.

use super::{SystemdManager, bus_error};
use crate::fence::FenceTimer;
use crate::manager::{ManagerError, UnitManager};
use fleet_core::UnitName;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tracing::{debug, warn};
use zbus::{OwnedVariant, Str, Variant};

/// The names of fence units start with this; fleet never runs a unit of its own named so.
pub const FENCE_PREFIX: &str = "fleet-fence-";

/// SIGKILL, for units still running at the end of the fence's grace.
const SIGKILL: i32 = 9;

/// Arms this machine's fence through `manager`'s connection.
#[derive(Debug)]
pub struct SystemdFence {
    manager: SystemdManager,
    /// The fence service's `ExecStart=`: fleetd's own binary, `--fence`, the units directory.
    command: (String, Vec<String>),
    /// Where the deadline is written before each arming ([`crate::fence::deadline_file`]).
    deadline_file: PathBuf,
    next: AtomicU64,
    /// The timer armed last by this process, and whether older ones were swept.
    armed: Mutex<(Option<String>, bool)>,
}

impl SystemdFence {
    /// A fence that runs `exe --fence <units_dir>` when it fires.
    pub fn new(manager: SystemdManager, exe: &Path, units_dir: &Path) -> SystemdFence {
        let exe = exe.to_string_lossy().into_owned();
        let argv = vec![
            exe.clone(),
            "--fence".to_owned(),
            units_dir.to_string_lossy().into_owned(),
        ];
        SystemdFence {
            manager,
            command: (exe, argv),
            deadline_file: crate::fence::deadline_file(units_dir),
            next: AtomicU64::new(0),
            armed: Mutex::new((None, false)),
        }
    }

    fn timer_properties(&self, after: Duration) -> Vec<(String, OwnedVariant)> {
        let micros = u64::try_from(after.as_micros()).unwrap_or(u64::MAX).max(1);
        let timers = vec![("OnActiveSec".to_owned(), micros)];
        vec![
            prop("Description", str_variant(DESCRIPTION)),
            prop("TimersMonotonic", owned(Variant::from(timers))),
            prop("AccuracyUSec", OwnedVariant::from(1u64)),
            prop("RemainAfterElapse", OwnedVariant::from(false)),
        ]
    }

    fn service_properties(&self) -> Vec<(String, OwnedVariant)> {
        let (path, argv) = self.command.clone();
        let exec = vec![(path, argv, false)];
        vec![
            prop("Description", str_variant(DESCRIPTION)),
            prop("Type", str_variant("oneshot")),
            prop("ExecStart", owned(Variant::from(exec))),
            prop("CollectMode", str_variant("inactive-or-failed")),
        ]
    }

    async fn stop_timer(&self, timer: &str) -> Result<(), ManagerError> {
        let _permit = self.manager.permit().await;
        let stopped = self
            .manager
            .inner
            .manager
            .stop_unit(timer.to_owned(), "replace".to_owned())
            .await
            .map_err(bus_error);
        match stopped {
            Ok(_) => Ok(()),
            Err(e) if e.is_no_such_unit() => Ok(()),
            Err(source) => Err(ManagerError::DisarmFence {
                timer: timer.to_owned(),
                source,
            }),
        }
    }

    /// Every fence timer systemd has loaded that is not `ours`.
    async fn others(&self, ours: &str) -> Result<Vec<String>, ManagerError> {
        let pattern = format!("{FENCE_PREFIX}*.timer");
        let _permit = self.manager.permit().await;
        let listed = self
            .manager
            .inner
            .manager
            .list_units_by_patterns(vec![], vec![pattern])
            .await
            .map_err(|e| ManagerError::ListFences(bus_error(e)))?;
        Ok(listed
            .into_iter()
            .map(|unit| unit.0)
            .filter(|name| name != ours)
            .collect())
    }
}

const DESCRIPTION: &str =
    "fleet fence: stops this machine's non-global fleet units unless fleetd pushes it forward";

fn prop(name: &str, value: OwnedVariant) -> (String, OwnedVariant) {
    (name.to_owned(), value)
}

fn str_variant(text: &str) -> OwnedVariant {
    OwnedVariant::from(Str::from(text.to_owned()))
}

fn owned(value: Variant<'_>) -> OwnedVariant {
    match OwnedVariant::try_from(value) {
        Ok(v) => v,
        // Only a variant holding a file descriptor can fail to be owned.
        Err(e) => unreachable!("a fence property holds no file descriptor: {e}"),
    }
}

impl FenceTimer for SystemdFence {
    async fn arm(&self, after: Duration) -> Result<(), ManagerError> {
        // First, so that a fence firing while PID 1 has not yet answered stands down.
        let written = crate::fence::uptime()
            .and_then(|now| crate::fence::write_deadline(&self.deadline_file, now + after));
        if let Err(e) = written {
            warn!(path = %self.deadline_file.display(), error = %e, "writing the fence's deadline failed");
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let base = format!("{FENCE_PREFIX}{}-{n}", std::process::id());
        let timer = format!("{base}.timer");
        let aux = vec![(format!("{base}.service"), self.service_properties())];
        {
            let _permit = self.manager.permit().await;
            self.manager
                .inner
                .manager
                .start_transient_unit(
                    timer.clone(),
                    "fail".to_owned(),
                    self.timer_properties(after),
                    aux,
                )
                .await
                .map_err(|e| ManagerError::ArmFence {
                    timer: timer.clone(),
                    source: bus_error(e),
                })?;
        }
        debug!(%timer, ?after, "fence armed");
        let (previous, swept) = {
            let mut armed = self.armed.lock().unwrap_or_else(|p| p.into_inner());
            let previous = armed.0.replace(timer.clone());
            (previous, std::mem::replace(&mut armed.1, true))
        };
        let mut stale = previous.into_iter().collect::<Vec<_>>();
        if !swept {
            stale.extend(self.others(&timer).await?);
        }
        for old in stale {
            self.stop_timer(&old).await?;
        }
        Ok(())
    }
}

/// How often the fence asks systemd whether its units are down.
const POLL: Duration = Duration::from_millis(50);

/// How long the fence waits for killed units' cgroups to empty before it reports.
const KILL_WAIT: Duration = Duration::from_secs(2);

impl SystemdManager {
    /// Stops `units` for the fence. A stop job is queued for every unit first, however long
    /// PID 1 takes to answer: a unit with a stop job pending is not restarted by its own
    /// `Restart=` when it is killed. Then every unit still running after `grace` is killed
    /// (SIGKILL to every process of its cgroup), and waited for up to [`KILL_WAIT`]. Returns
    /// the units that had to be killed; a unit the fence could not stop or kill is logged and
    /// the others are still fenced.
    pub async fn fence_units(
        &self,
        units: &[UnitName],
        grace: Duration,
    ) -> Result<Vec<UnitName>, ManagerError> {
        let queued = futures::future::join_all(units.iter().map(|u| self.queue_stop(u))).await;
        for (unit, result) in units.iter().zip(queued) {
            if let Err(e) = result {
                warn!(%unit, error = %e, "fence: could not queue a stop job; the unit will be killed");
            }
        }
        let running = self.running_after(units, grace).await?;
        for unit in &running {
            if let Err(e) = self.kill_all(unit).await {
                warn!(%unit, error = %e, "fence: could not kill a unit");
            }
        }
        let left = self.running_after(&running, KILL_WAIT).await?;
        if !left.is_empty() {
            warn!(units = ?left, "fence: units still running after the kill");
        }
        Ok(running)
    }

    /// `StopUnit(unit, "replace")`, without waiting for the job; a unit systemd no longer has
    /// is stopped already.
    async fn queue_stop(&self, unit: &UnitName) -> Result<(), ManagerError> {
        let _permit = self.permit().await;
        let queued = self
            .inner
            .manager
            .stop_unit(unit.to_string(), "replace".to_owned())
            .await
            .map_err(bus_error);
        match queued {
            Ok(_) => Ok(()),
            Err(e) if e.is_no_such_unit() => Ok(()),
            Err(source) => Err(ManagerError::QueueJob {
                kind: crate::manager::JobKind::Stop,
                unit: unit.clone(),
                source,
            }),
        }
    }

    /// Those of `units` that may still be running once they all stopped or `wait` passed.
    async fn running_after(
        &self,
        units: &[UnitName],
        wait: Duration,
    ) -> Result<Vec<UnitName>, ManagerError> {
        let until = tokio::time::Instant::now() + wait;
        loop {
            let running: Vec<UnitName> = self
                .status(units)
                .await?
                .into_iter()
                .filter(|(_, state)| state.active_state().may_be_running())
                .map(|(unit, _)| unit)
                .collect();
            if running.is_empty() || tokio::time::Instant::now() >= until {
                return Ok(running);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Whether a fence timer is armed and waiting, other than one that is firing: then a
    /// fleetd pushed its deadline since the firing one was armed.
    pub async fn fence_waiting(&self) -> Result<bool, ManagerError> {
        let pattern = format!("{FENCE_PREFIX}*.timer");
        let _permit = self.permit().await;
        let listed = self
            .inner
            .manager
            .list_units_by_patterns(vec![], vec![pattern])
            .await
            .map_err(|e| ManagerError::ListFences(bus_error(e)))?;
        Ok(listed.iter().any(|unit| unit.4 == "waiting"))
    }

    /// `KillUnit(unit, "all", SIGKILL)`; a unit systemd no longer has is already dead.
    async fn kill_all(&self, unit: &UnitName) -> Result<(), ManagerError> {
        let _permit = self.permit().await;
        let killed = self
            .inner
            .manager
            .kill_unit(unit.to_string(), "all".to_owned(), SIGKILL)
            .await
            .map_err(bus_error);
        match killed {
            Ok(()) => Ok(()),
            Err(e) if e.is_no_such_unit() => Ok(()),
            Err(source) => Err(ManagerError::Kill {
                unit: unit.clone(),
                source,
            }),
        }
    }
}

/// The path of this process's own binary, for the fence service: `/proc/self/exe` names a
/// binary replaced by an upgrade with " (deleted)" after its path, and the new one is there.
pub fn own_binary() -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let text = exe.to_string_lossy();
    Ok(match text.strip_suffix(" (deleted)") {
        Some(path) => PathBuf::from(path),
        None => exe,
    })
}
