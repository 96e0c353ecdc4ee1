//! The agent's metrics: reconcile passes and their duration, tasks by kind and result, this
//! machine's units by systemd active state, and the unit manager's (systemd over D-Bus)
//! calls: their latency and errors by operation, measured by [`Metered`], a [`UnitManager`]
//! that passes every call on to another one.
//!
//! Labels are enums, so counting allocates nothing. docs/operating.md lists every metric.

use fleet_core::{ActiveState, UnitFile, UnitName};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write};
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

use crate::manager::{
    ChangeReceiver, InstalledUnit, JobOutcome, ManagerError, ReloadFacts, UnitDetails, UnitFacts,
    UnitManager, UnitSource,
};
use crate::plan::{CurrentUnit, TaskKind, UnitFileState};
use fleet_core::SystemdState;

/// How one task ended.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum TaskResult {
    Succeeded,
    Failed,
    /// Not run: an earlier task of its unit failed in the same plan.
    Skipped,
}

impl TaskResult {
    pub const ALL: [TaskResult; 3] = [
        TaskResult::Succeeded,
        TaskResult::Failed,
        TaskResult::Skipped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskResult::Succeeded => "succeeded",
            TaskResult::Failed => "failed",
            TaskResult::Skipped => "skipped",
        }
    }
}

/// A task's kind, as a label.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub struct Kind(pub TaskKind);

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind(TaskKind::Unload),
        Kind(TaskKind::Load),
        Kind(TaskKind::ReloadUnitFiles),
        Kind(TaskKind::Stop),
        Kind(TaskKind::Start),
        Kind(TaskKind::Restart),
    ];

    pub fn as_str(self) -> &'static str {
        match self.0 {
            TaskKind::Unload => "unload",
            TaskKind::Load => "load",
            TaskKind::ReloadUnitFiles => "reload_unit_files",
            TaskKind::Stop => "stop",
            TaskKind::Start => "start",
            TaskKind::Restart => "restart",
        }
    }
}

/// systemd's active state of a unit, as a label; a word this code does not know is `other`.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum State {
    Active,
    Reloading,
    Inactive,
    Failed,
    Activating,
    Deactivating,
    Maintenance,
    Refreshing,
    Other,
}

impl State {
    const ALL: [State; 9] = [
        State::Active,
        State::Reloading,
        State::Inactive,
        State::Failed,
        State::Activating,
        State::Deactivating,
        State::Maintenance,
        State::Refreshing,
        State::Other,
    ];

    fn of(state: &ActiveState) -> State {
        match state {
            ActiveState::Active => State::Active,
            ActiveState::Reloading => State::Reloading,
            ActiveState::Inactive => State::Inactive,
            ActiveState::Failed => State::Failed,
            ActiveState::Activating => State::Activating,
            ActiveState::Deactivating => State::Deactivating,
            ActiveState::Maintenance => State::Maintenance,
            ActiveState::Refreshing => State::Refreshing,
            ActiveState::Unknown(_) => State::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::Active => "active",
            State::Reloading => "reloading",
            State::Inactive => "inactive",
            State::Failed => "failed",
            State::Activating => "activating",
            State::Deactivating => "deactivating",
            State::Maintenance => "maintenance",
            State::Refreshing => "refreshing",
            State::Other => "other",
        }
    }
}

/// One call of [`UnitManager`] (the status of units and whether systemd holds them are both
/// `Status`; the details of a unit and what a reload needs of it are both `Details`).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Call {
    Installed,
    Install,
    Uninstall,
    Reload,
    Start,
    Stop,
    Status,
    Details,
    Source,
    /// What systemd did to a unit whose state changed ([`UnitManager::facts`]).
    Facts,
}

impl Call {
    pub const ALL: [Call; 10] = [
        Call::Installed,
        Call::Install,
        Call::Uninstall,
        Call::Reload,
        Call::Start,
        Call::Stop,
        Call::Status,
        Call::Details,
        Call::Source,
        Call::Facts,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Call::Installed => "installed",
            Call::Install => "install",
            Call::Uninstall => "uninstall",
            Call::Reload => "reload",
            Call::Start => "start",
            Call::Stop => "stop",
            Call::Status => "status",
            Call::Details => "details",
            Call::Source => "source",
            Call::Facts => "facts",
        }
    }
}

macro_rules! label_value {
    ($($t:ty),*) => {$(
        impl EncodeLabelValue for $t {
            fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> fmt::Result {
                encoder.write_str(self.as_str())
            }
        }
    )*};
}
label_value!(TaskResult, Kind, State, Call);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    kind: Kind,
    result: TaskResult,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: State,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    r#type: Call,
}

type Latency = Family<CallLabels, Histogram, fn() -> Histogram>;

/// 0.5 ms to about 16 s: a start job waits for the unit to come up.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The agent's metric families; clones share them. [`Metrics::default`] is detached (tests,
/// the bench): it counts, and nobody serves it.
#[derive(Debug, Clone)]
pub struct Metrics {
    passes: Counter,
    pass_duration: Histogram,
    tasks: Family<TaskLabels, Counter>,
    units: Family<StateLabels, Gauge>,
    dbus_errors: Family<CallLabels, Counter>,
    dbus_duration: Latency,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            passes: Counter::default(),
            // 1 ms to about 65 s: a pass awaits every job it issues.
            pass_duration: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            tasks: Family::default(),
            units: Family::default(),
            dbus_errors: Family::default(),
            dbus_duration: Latency::new_with_constructor(latency),
        }
    }
}

impl Metrics {
    /// New families, registered in `registry` (fleetd gives the `fleet_agent` one).
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics::default();
        registry.register(
            "pass_count",
            "Reconcile passes of the agent",
            m.passes.clone(),
        );
        registry.register_with_unit(
            "pass_duration",
            "Time each reconcile pass took, its jobs awaited and states published",
            Unit::Seconds,
            m.pass_duration.clone(),
        );
        registry.register(
            "task_count",
            "Tasks the agent ran on systemd, by kind and result",
            m.tasks.clone(),
        );
        registry.register(
            "units",
            "Units in this machine's units directory, by systemd active state",
            m.units.clone(),
        );
        registry.register(
            "dbus_errors",
            "Calls to systemd (D-Bus) that failed, by type",
            m.dbus_errors.clone(),
        );
        registry.register_with_unit(
            "dbus_request_duration",
            "Latency of calls to systemd (D-Bus, and the units directory), by type",
            Unit::Seconds,
            m.dbus_duration.clone(),
        );
        m.zeroed();
        m
    }

    /// Every series of the counters and of the units gauge at 0, so that a scrape shows them
    /// before their first change: an alert on `rate(fleet_agent_dbus_errors_total[5m])` sees
    /// nothing of a series that does not exist yet.
    fn zeroed(&self) {
        for kind in Kind::ALL {
            for result in TaskResult::ALL {
                self.tasks.get_or_create_owned(&TaskLabels { kind, result });
            }
        }
        for r#type in Call::ALL {
            self.dbus_errors.get_or_create_owned(&CallLabels { r#type });
        }
        for state in State::ALL {
            self.units.get_or_create_owned(&StateLabels { state });
        }
    }

    /// `manager`, with every call timed and its errors counted here.
    pub fn meter<M: UnitManager>(&self, manager: M) -> Metered<M> {
        Metered::new(manager, self.clone())
    }

    pub(crate) fn passed(&self, took: Duration) {
        self.passes.inc();
        self.pass_duration.observe(took.as_secs_f64());
    }

    pub(crate) fn task(&self, kind: TaskKind, result: TaskResult) {
        self.tasks
            .get_or_create(&TaskLabels {
                kind: Kind(kind),
                result,
            })
            .inc();
    }

    /// Sets the units gauge to what `counts` holds. Every state is set, so a state no unit
    /// is in any more reads 0.
    pub(crate) fn units(&self, counts: &UnitCounts) {
        for (state, count) in State::ALL.into_iter().zip(counts.counts) {
            self.units.get_or_create(&StateLabels { state }).set(count);
        }
    }

    /// Passes so far (for tests).
    pub fn pass_count(&self) -> u64 {
        self.passes.get()
    }

    /// Tasks of `kind` that ended with `result` so far (for tests).
    pub fn task_count(&self, kind: TaskKind, result: TaskResult) -> u64 {
        self.tasks
            .get_or_create(&TaskLabels {
                kind: Kind(kind),
                result,
            })
            .get()
    }

    /// Units in `state` after the last pass (for tests).
    pub fn units_in(&self, state: State) -> i64 {
        self.units.get_or_create(&StateLabels { state }).get()
    }

    /// Failed calls of `call` so far (for tests).
    pub fn dbus_errors(&self, call: Call) -> u64 {
        self.dbus_errors
            .get_or_create(&CallLabels { r#type: call })
            .get()
    }
}

/// This machine's units with a file here, by active state (one systemd has no record of
/// counts as inactive), kept per unit: a pass over the few units a hint named updates the
/// counts without walking every unit the machine runs.
#[derive(Debug, Default)]
pub(crate) struct UnitCounts {
    of: BTreeMap<UnitName, State>,
    counts: [i64; State::ALL.len()],
}

impl UnitCounts {
    /// Counts every unit of `units` again.
    pub(crate) fn count_all(&mut self, units: &BTreeMap<UnitName, CurrentUnit>) {
        self.of.clear();
        self.counts = [0; State::ALL.len()];
        self.count_of(units, units.keys());
    }

    /// Counts the units of `names` again, as `units` has them now.
    pub(crate) fn count_of<'a>(
        &mut self,
        units: &BTreeMap<UnitName, CurrentUnit>,
        names: impl IntoIterator<Item = &'a UnitName>,
    ) {
        for name in names {
            if let Some(old) = self.of.remove(name) {
                self.counts[old as usize] -= 1;
            }
            let Some(unit) = units.get(name) else {
                continue;
            };
            if unit.file == UnitFileState::Absent {
                continue;
            }
            let state = unit
                .systemd
                .as_ref()
                .map_or(State::Inactive, |s| State::of(&s.active_state()));
            self.counts[state as usize] += 1;
            self.of.insert(name.clone(), state);
        }
    }
}

/// What hears of each call a [`Metered`] passes on: which, when it was sent (it has ended
/// when this is called), and whether it failed. The agent's [`Metrics`] is one; the bench
/// counts calls with another.
pub trait CallObserver: Send + Sync {
    fn called(&self, call: Call, sent: Instant, failed: bool);
}

impl<O: CallObserver + ?Sized> CallObserver for std::sync::Arc<O> {
    fn called(&self, call: Call, sent: Instant, failed: bool) {
        (**self).called(call, sent, failed);
    }
}

impl CallObserver for Metrics {
    fn called(&self, call: Call, sent: Instant, failed: bool) {
        let labels = CallLabels { r#type: call };
        self.dbus_duration
            .get_or_create(&labels)
            .observe(sent.elapsed().as_secs_f64());
        if failed {
            self.dbus_errors.get_or_create(&labels).inc();
        }
    }
}

/// A [`UnitManager`] that passes every call on to `inner` and tells `observer` of it (by
/// default the agent's [`Metrics`], which time every call and count its errors); clones
/// share the observer when its clones do (and the manager, when its clones do).
#[derive(Debug, Clone)]
pub struct Metered<M, O = Metrics> {
    inner: M,
    observer: O,
}

impl<M: UnitManager, O: CallObserver> Metered<M, O> {
    pub fn new(inner: M, observer: O) -> Metered<M, O> {
        Metered { inner, observer }
    }

    async fn call<T>(
        &self,
        call: Call,
        fut: impl Future<Output = Result<T, ManagerError>>,
    ) -> Result<T, ManagerError> {
        let sent = Instant::now();
        let res = fut.await;
        self.observer.called(call, sent, res.is_err());
        res
    }
}

impl<M: UnitManager, O: CallObserver> UnitManager for Metered<M, O> {
    async fn installed(&self) -> Result<Vec<InstalledUnit>, ManagerError> {
        self.call(Call::Installed, self.inner.installed()).await
    }

    async fn installed_of(&self, names: &[UnitName]) -> Result<Vec<InstalledUnit>, ManagerError> {
        self.call(Call::Installed, self.inner.installed_of(names))
            .await
    }

    async fn install(&self, name: &UnitName, file: &UnitFile) -> Result<(), ManagerError> {
        self.call(Call::Install, self.inner.install(name, file))
            .await
    }

    async fn uninstall(&self, name: &UnitName) -> Result<(), ManagerError> {
        self.call(Call::Uninstall, self.inner.uninstall(name)).await
    }

    async fn reload(&self) -> Result<(), ManagerError> {
        self.call(Call::Reload, self.inner.reload()).await
    }

    async fn start(&self, name: &UnitName) -> Result<JobOutcome, ManagerError> {
        self.call(Call::Start, self.inner.start(name)).await
    }

    async fn stop(&self, name: &UnitName) -> Result<JobOutcome, ManagerError> {
        self.call(Call::Stop, self.inner.stop(name)).await
    }

    async fn status(
        &self,
        names: &[UnitName],
    ) -> Result<BTreeMap<UnitName, SystemdState>, ManagerError> {
        self.call(Call::Status, self.inner.status(names)).await
    }

    async fn details(&self, name: &UnitName) -> Result<UnitDetails, ManagerError> {
        self.call(Call::Details, self.inner.details(name)).await
    }

    async fn loaded(&self, names: &[UnitName]) -> Result<BTreeSet<UnitName>, ManagerError> {
        self.call(Call::Status, self.inner.loaded(names)).await
    }

    async fn reload_facts(&self, name: &UnitName) -> Result<ReloadFacts, ManagerError> {
        self.call(Call::Details, self.inner.reload_facts(name))
            .await
    }

    async fn facts(&self, name: &UnitName) -> Result<UnitFacts, ManagerError> {
        self.call(Call::Facts, self.inner.facts(name)).await
    }

    async fn since(&self, name: &UnitName) -> Result<Option<u64>, ManagerError> {
        self.call(Call::Facts, self.inner.since(name)).await
    }

    async fn source(&self, name: &UnitName) -> Result<UnitSource, ManagerError> {
        self.call(Call::Source, self.inner.source(name)).await
    }

    fn changes(&self) -> ChangeReceiver {
        self.inner.changes()
    }
}

#[cfg(test)]
mod tests;
