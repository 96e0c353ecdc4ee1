//! [`SystemdManager`]: the real [`UnitManager`], over the system bus with zbus and
//! zbus_systemd. The only module of the project that names zbus.
//!
//! Follows what was measured against systemd 252 (the contract tests in
//! `functional-tests/tests/manager_contract.rs` run the fake's bodies on a real one):
//! `Subscribe` once, with the `JobRemoved` stream open before any job is queued; unit states
//! through `ListUnitsByNames` in batches rather than per-unit `GetUnit`; `ResetFailedUnit` of
//! a unit systemd no longer has loaded is success; unit proxies never cache properties; at most
//! [`SystemdConfig::max_in_flight`] calls in flight (dbus-daemon allows 128 pending replies per
//! connection). It never decides anything and never logs errors it returns.

mod batches;
pub mod fence;
mod jobs;
mod query;
mod show;
mod signals;

use crate::manager::{
    BusError, ChangeReceiver, ChangeSender, InstalledUnit, JobKind, JobOutcome, ManagerError,
    ReloadFacts, STATUS_BATCH, UnitDetails, UnitFacts, UnitManager, UnitSource,
};
use crate::units_dir::{DEFAULT_RUNTIME_UNIT_DIR, DEFAULT_UNITS_DIR, UnitsDir, Written};
use fleet_core::{SystemdState, UnitFile, UnitName};
use jobs::{JobWaiters, Registered};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::task::JoinHandle;
use tracing::{Instrument, debug};
use zbus::proxy::CacheProperties;
use zbus_systemd::systemd1::ManagerProxy;

/// How the adapter connects and where the files go.
#[derive(Debug, Clone)]
pub struct SystemdConfig {
    /// fleet's unit files; created (0755) if absent.
    pub units_dir: PathBuf,
    /// Where `LinkUnitFiles(runtime=true)` puts its symlinks; only read, to skip relinking.
    pub runtime_unit_dir: PathBuf,
    /// D-Bus calls in flight at most.
    pub max_in_flight: usize,
    /// How long [`UnitManager::start`]/[`UnitManager::stop`] wait for a job's result. Above
    /// systemd's default 90 s start timeout, so that usually ends a job first.
    pub job_timeout: Duration,
    /// How long any single D-Bus call may take.
    pub call_timeout: Duration,
}

impl Default for SystemdConfig {
    fn default() -> Self {
        SystemdConfig {
            units_dir: PathBuf::from(DEFAULT_UNITS_DIR),
            runtime_unit_dir: PathBuf::from(DEFAULT_RUNTIME_UNIT_DIR),
            max_in_flight: 64,
            job_timeout: Duration::from_secs(120),
            call_timeout: Duration::from_secs(60),
        }
    }
}

/// The real [`UnitManager`]; clones share one connection.
///
/// When the connection is lost, calls fail and every [`ChangeReceiver`] ends: make a new one.
#[derive(Debug, Clone)]
pub struct SystemdManager {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    conn: zbus::Connection,
    manager: ManagerProxy<'static>,
    dir: Arc<UnitsDir>,
    calls: Semaphore,
    jobs: Arc<JobWaiters>,
    changes: ChangeSender,
    job_timeout: Duration,
    pump: JoinHandle<()>,
    /// Units waiting to be disabled together (see [`batches`]).
    disables: batches::Batches<UnitName, Result<(), ManagerError>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

impl SystemdManager {
    /// Opens the units directory, connects to the system bus and subscribes to systemd's
    /// signals.
    pub async fn connect(config: SystemdConfig) -> Result<SystemdManager, ManagerError> {
        let (units_dir, runtime_dir) = (config.units_dir, config.runtime_unit_dir);
        let dir = blocking(move || UnitsDir::open(units_dir, runtime_dir)).await?;
        let conn = zbus::connection::Builder::system()
            .method_timeout(config.call_timeout)
            .build()
            .await
            .map_err(|e| ManagerError::Connect(bus_error(e)))?;
        let manager = ManagerProxy::builder(&conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| ManagerError::Connect(bus_error(e)))?;
        // Streams first: a job queued after Subscribe must find its JobRemoved stream open.
        let signals = signals::Signals::open(&conn, &manager)
            .await
            .map_err(|e| ManagerError::Subscribe(bus_error(e)))?;
        manager
            .subscribe()
            .await
            .map_err(|e| ManagerError::Subscribe(bus_error(e)))?;
        let jobs = Arc::new(JobWaiters::default());
        let changes = ChangeSender::new();
        let pump =
            tokio::spawn(signals::pump(signals, jobs.clone(), changes.clone()).in_current_span());
        let inner = Inner {
            conn,
            manager,
            dir: Arc::new(dir),
            calls: Semaphore::new(config.max_in_flight.max(1)),
            jobs,
            changes,
            job_timeout: config.job_timeout,
            pump,
            disables: batches::Batches::default(),
        };
        Ok(SystemdManager {
            inner: Arc::new(inner),
        })
    }

    async fn permit(&self) -> SemaphorePermit<'_> {
        match self.inner.calls.acquire().await {
            Ok(permit) => permit,
            Err(_) => unreachable!("the call semaphore is never closed"),
        }
    }

    fn file_arg(&self, name: &UnitName) -> String {
        self.inner
            .dir
            .file_path(name)
            .to_string_lossy()
            .into_owned()
    }

    async fn run_job(&self, kind: JobKind, name: &UnitName) -> Result<JobOutcome, ManagerError> {
        let expectation = self.inner.jobs.expect();
        let queued = {
            let _permit = self.permit().await;
            let (unit, mode) = (name.to_string(), "replace".to_owned());
            match kind {
                JobKind::Start => self.inner.manager.start_unit(unit, mode).await,
                JobKind::Stop => self.inner.manager.stop_unit(unit, mode).await,
            }
        };
        let job = match queued.map_err(bus_error) {
            Ok(job) => job,
            Err(e) if kind == JobKind::Stop && e.is_no_such_unit() => {
                return Ok(JobOutcome::NotLoaded);
            }
            Err(source) => {
                let unit = name.clone();
                return Err(ManagerError::QueueJob { kind, unit, source });
            }
        };
        debug!(unit = %name, %kind, job = %job.as_str(), "job queued");
        let lost = || ManagerError::JobSignalsLost {
            kind,
            unit: name.clone(),
        };
        let result = match expectation.register(job.as_str()) {
            Registered::Ended(result) => result,
            Registered::Closed => return Err(lost()),
            // The permit is released: waiting for a job is not a call in flight.
            Registered::Wait(rx) => match tokio::time::timeout(self.inner.job_timeout, rx).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => return Err(lost()),
                Err(_) => {
                    self.inner.jobs.forget(job.as_str());
                    return Err(ManagerError::JobTimeout {
                        kind,
                        unit: name.clone(),
                        waited: self.inner.job_timeout,
                    });
                }
            },
        };
        JobOutcome::from_job_result(&result).ok_or_else(|| ManagerError::UnknownJobResult {
            kind,
            unit: name.clone(),
            result,
        })
    }

    /// Links (and, for a file with `[Install]`, enables) the written file.
    async fn link(&self, name: &UnitName, file: &UnitFile) -> Result<(), ManagerError> {
        let dir = self.inner.dir.clone();
        let link_name = name.clone();
        let linked = blocking(move || Ok(dir.is_linked(&link_name))).await?;
        let _permit = self.permit().await;
        if !linked {
            self.inner
                .manager
                .link_unit_files(vec![self.file_arg(name)], true, true)
                .await
                .map_err(|e| ManagerError::Link {
                    unit: name.clone(),
                    source: bus_error(e),
                })?;
        }
        if file.has_section("Install") {
            self.inner
                .manager
                .enable_unit_files(vec![self.file_arg(name)], true, true)
                .await
                .map_err(|e| ManagerError::Enable {
                    unit: name.clone(),
                    source: bus_error(e),
                })?;
        }
        Ok(())
    }
}

impl SystemdManager {
    /// `DisableUnitFiles([name], runtime)`: its runtime link and enablement go. Units disabled
    /// while such a call is in flight go together in the next one (see [`batches`]).
    async fn disable(&self, name: &UnitName) -> Result<(), ManagerError> {
        let batched = self
            .inner
            .disables
            .run(name.clone(), |names| self.disable_all(names))
            .await;
        match batched {
            Some(result) => result,
            None => self.disable_one(name).await,
        }
    }

    /// One call for all of `names`; if it fails, one call for each, so that each unit gets
    /// its own answer (a name systemd does not know fails the whole list).
    async fn disable_all(&self, names: Vec<UnitName>) -> Vec<Result<(), ManagerError>> {
        if names.len() > 1 {
            let args = names.iter().map(ToString::to_string).collect();
            let permit = self.permit().await;
            let together = self.inner.manager.disable_unit_files(args, true).await;
            drop(permit);
            match together {
                Ok(_) => {
                    debug!(units = names.len(), "disabled in one call");
                    return names.iter().map(|_| Ok(())).collect();
                }
                Err(e) => debug!(units = names.len(), error = %e, "disabling one by one"),
            }
        }
        futures::future::join_all(names.iter().map(|name| self.disable_one(name))).await
    }

    async fn disable_one(&self, name: &UnitName) -> Result<(), ManagerError> {
        let _permit = self.permit().await;
        let disabled = self
            .inner
            .manager
            .disable_unit_files(vec![name.to_string()], true)
            .await
            .map_err(bus_error);
        match disabled {
            Ok(_) => Ok(()),
            // Nothing linked under that name: nothing to disable.
            Err(e) if e.is_no_such_unit() => Ok(()),
            Err(source) => {
                let unit = name.clone();
                Err(ManagerError::Disable { unit, source })
            }
        }
    }
}

impl UnitManager for SystemdManager {
    async fn installed(&self) -> Result<Vec<InstalledUnit>, ManagerError> {
        let dir = self.inner.dir.clone();
        blocking(move || dir.list()).await
    }

    async fn installed_of(&self, names: &[UnitName]) -> Result<Vec<InstalledUnit>, ManagerError> {
        let (dir, names) = (self.inner.dir.clone(), names.to_vec());
        blocking(move || dir.list_of(&names)).await
    }

    async fn install(&self, name: &UnitName, file: &UnitFile) -> Result<(), ManagerError> {
        let (dir, write_name, write_file) = (self.inner.dir.clone(), name.clone(), file.clone());
        let written = blocking(move || dir.write(&write_name, &write_file)).await?;
        // A replaced file keeps its link (a replace stops the unit and writes over it), but
        // the old file's runtime enablement goes: the new one is enabled again if it asks.
        if written == (Written::Replaced { had_install: true }) {
            self.disable(name).await?;
        }
        if let Err(error) = self.link(name, file).await {
            // Without its link the file would look loaded to the next pass; remove it so the
            // whole load is retried. If that fails too, the pass after sees `NotLinked`.
            let (dir, name) = (self.inner.dir.clone(), name.clone());
            let _ = blocking(move || dir.remove(&name)).await;
            return Err(error);
        }
        Ok(())
    }

    async fn uninstall(&self, name: &UnitName) -> Result<(), ManagerError> {
        self.disable(name).await?;
        {
            let _permit = self.permit().await;
            let reset = self
                .inner
                .manager
                .reset_failed_unit(name.to_string())
                .await
                .map_err(bus_error);
            match reset {
                Ok(()) => {}
                // Already garbage-collected after a clean stop: nothing to reset (FACTS).
                Err(e) if e.is_no_such_unit() => {}
                Err(source) => {
                    let unit = name.clone();
                    return Err(ManagerError::ResetFailed { unit, source });
                }
            }
        }
        let (dir, name) = (self.inner.dir.clone(), name.clone());
        blocking(move || dir.remove(&name)).await
    }

    async fn reload(&self) -> Result<(), ManagerError> {
        let _permit = self.permit().await;
        self.inner
            .manager
            .reload()
            .await
            .map_err(|e| ManagerError::Reload(bus_error(e)))
    }

    async fn start(&self, name: &UnitName) -> Result<JobOutcome, ManagerError> {
        self.run_job(JobKind::Start, name).await
    }

    async fn stop(&self, name: &UnitName) -> Result<JobOutcome, ManagerError> {
        self.run_job(JobKind::Stop, name).await
    }

    async fn status(
        &self,
        names: &[UnitName],
    ) -> Result<BTreeMap<UnitName, SystemdState>, ManagerError> {
        let mut out = BTreeMap::new();
        for batch in names.chunks(STATUS_BATCH) {
            self.status_batch(batch, &mut out).await?;
        }
        Ok(out)
    }

    async fn loaded(&self, names: &[UnitName]) -> Result<BTreeSet<UnitName>, ManagerError> {
        self.list_loaded(names).await
    }

    async fn details(&self, name: &UnitName) -> Result<UnitDetails, ManagerError> {
        self.read_details(name)
            .await
            .map_err(|e| ManagerError::Details {
                unit: name.clone(),
                source: bus_error(e),
            })
    }

    async fn reload_facts(&self, name: &UnitName) -> Result<ReloadFacts, ManagerError> {
        self.read_reload_facts(name)
            .await
            .map_err(|e| ManagerError::Details {
                unit: name.clone(),
                source: bus_error(e),
            })
    }

    async fn facts(&self, name: &UnitName) -> Result<UnitFacts, ManagerError> {
        self.read_facts(name)
            .await
            .map_err(|e| ManagerError::Details {
                unit: name.clone(),
                source: bus_error(e),
            })
    }

    async fn since(&self, name: &UnitName) -> Result<Option<u64>, ManagerError> {
        self.read_since(name)
            .await
            .map_err(|e| ManagerError::Details {
                unit: name.clone(),
                source: bus_error(e),
            })
    }

    async fn source(&self, name: &UnitName) -> Result<UnitSource, ManagerError> {
        let fragment = self
            .read_fragment(name)
            .await
            .map_err(|e| ManagerError::Source {
                unit: name.clone(),
                source: bus_error(e),
            })?;
        let (dir, name) = (self.inner.dir.clone(), name.clone());
        blocking(move || Ok(dir.source(&name, fragment))).await
    }

    fn changes(&self) -> ChangeReceiver {
        self.inner.changes.subscribe()
    }
}

/// Runs blocking file work off the runtime's worker threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ManagerError> + Send + 'static,
) -> Result<T, ManagerError> {
    let span = tracing::Span::current();
    match tokio::task::spawn_blocking(move || span.in_scope(f)).await {
        Ok(result) => result,
        Err(join) => std::panic::resume_unwind(join.into_panic()),
    }
}

fn bus_error(error: zbus::Error) -> BusError {
    match error {
        zbus::Error::MethodError(name, message, _) => BusError::Method {
            name: name.to_string(),
            message: message.unwrap_or_default(),
        },
        zbus::Error::FDO(fdo) => {
            use zbus::DBusError;
            BusError::Method {
                name: fdo.name().to_string(),
                message: fdo.description().unwrap_or_default().to_owned(),
            }
        }
        other => BusError::Transport(Box::new(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_systemds_error_name_and_message() {
        let transport = bus_error(zbus::Error::InvalidReply);
        assert!(matches!(transport, BusError::Transport(_)));
    }
}
