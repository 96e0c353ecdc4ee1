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
use crate::manager::{JobOutcome, ManagerError, UnitManager};
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

impl SystemdManager {
    /// Stops `units` for the fence: a stop job each, all at once; a unit still running after
    /// `grace` is killed (SIGKILL to every process of its cgroup) and waited for a little
    /// longer. Returns the units that had to be killed.
    pub async fn fence_units(
        &self,
        units: &[UnitName],
        grace: Duration,
    ) -> Result<Vec<UnitName>, ManagerError> {
        let stops = units.iter().map(|unit| async move {
            match tokio::time::timeout(grace, self.stop(unit)).await {
                Ok(Ok(JobOutcome::Done | JobOutcome::NotLoaded)) => Ok(None),
                Ok(Ok(outcome)) => {
                    warn!(%unit, ?outcome, "fence: stop job did not end cleanly; killing");
                    self.kill_all(unit).await.map(|()| Some(unit.clone()))
                }
                Ok(Err(e)) => {
                    warn!(%unit, error = %e, "fence: stop failed; killing");
                    self.kill_all(unit).await.map(|()| Some(unit.clone()))
                }
                Err(_) => self.kill_all(unit).await.map(|()| Some(unit.clone())),
            }
        });
        let results = futures::future::join_all(stops).await;
        let mut killed = Vec::new();
        let mut failed = None;
        for (unit, result) in units.iter().zip(results) {
            match result {
                Ok(Some(unit)) => killed.push(unit),
                Ok(None) => {}
                Err(e) => {
                    warn!(%unit, error = %e, "fence: could not kill a unit");
                    failed = Some(e);
                }
            }
        }
        failed.map_or(Ok(killed), Err)
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
