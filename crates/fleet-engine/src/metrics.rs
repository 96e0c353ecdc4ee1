//! The engine's metrics: leadership, reconcile rounds (passes) and their duration, the tasks
//! (decisions) written, and what scheduling decided for units (placed, waiting, moved).
//!
//! Names start from fleet's (`leader_start_time`, `task_count_total`, `reconcile_count_total`,
//! ...); docs/operating.md lists them. [`outcome`] is pure: which decisions count as a
//! placement, a move or a unit left waiting is decided here, on the plan, not in the loop.

use fleet_core::UnitName;
use fleet_registry::RegistryError;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashSet;
use std::fmt::{self, Write};
use std::time::{Duration, SystemTime};

use crate::scheduler::{Decision, DecisionKind, Plan, Reason};

/// What a decision did for its unit, as `scheduling_decisions_total` counts it.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Outcome {
    /// Scheduled where it was on no machine before.
    Placed,
    /// Cannot be placed now (its reason is published).
    Waiting,
    /// Scheduled on another machine than the one it leaves (gone, drained, rules violated).
    Moved,
}

impl Outcome {
    pub const ALL: [Outcome; 3] = [Outcome::Placed, Outcome::Waiting, Outcome::Moved];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Placed => "placed",
            Outcome::Waiting => "waiting",
            Outcome::Moved => "moved",
        }
    }
}

/// A decision's kind, as fleet's `type` label of the task counters.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum TaskType {
    Moving,
    Unschedule,
    Update,
    Schedule,
    Forget,
    Record,
    Unschedulable,
    ClearUnschedulable,
    MoveOver,
}

impl TaskType {
    pub const ALL: [TaskType; 9] = [
        TaskType::Moving,
        TaskType::Unschedule,
        TaskType::Update,
        TaskType::Schedule,
        TaskType::Forget,
        TaskType::Record,
        TaskType::Unschedulable,
        TaskType::ClearUnschedulable,
        TaskType::MoveOver,
    ];

    fn of(kind: &DecisionKind) -> TaskType {
        match kind {
            DecisionKind::Moving { .. } => TaskType::Moving,
            DecisionKind::Unschedule { .. } => TaskType::Unschedule,
            DecisionKind::Update { .. } => TaskType::Update,
            DecisionKind::Schedule { .. } => TaskType::Schedule,
            DecisionKind::Forget { .. } => TaskType::Forget,
            DecisionKind::Record { .. } => TaskType::Record,
            DecisionKind::Unschedulable { .. } => TaskType::Unschedulable,
            DecisionKind::ClearUnschedulable { .. } => TaskType::ClearUnschedulable,
            DecisionKind::MoveOver { .. } => TaskType::MoveOver,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TaskType::Moving => "moving",
            TaskType::Unschedule => "unschedule",
            TaskType::Update => "update",
            TaskType::Schedule => "schedule",
            TaskType::Forget => "forget",
            TaskType::Record => "record",
            TaskType::Unschedulable => "unschedulable",
            TaskType::ClearUnschedulable => "clear_unschedulable",
            TaskType::MoveOver => "move_over",
        }
    }
}

/// Why a reconcile round failed.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Failure {
    /// A fenced write was refused: another engine leads.
    LostLeadership,
    /// etcd could not be read or written.
    Registry,
}

impl Failure {
    pub const ALL: [Failure; 2] = [Failure::LostLeadership, Failure::Registry];

    pub(crate) fn of(err: &RegistryError) -> Failure {
        if let RegistryError::LostLeadership = err {
            Failure::LostLeadership
        } else {
            Failure::Registry
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Failure::LostLeadership => "lost_leadership",
            Failure::Registry => "registry",
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
label_value!(Outcome, TaskType, Failure);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    r#type: TaskType,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    r#type: Failure,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: Outcome,
}

/// The units `plan` takes off a machine, for [`outcome`]: gathered once per plan. Looking
/// for each placed unit's removal among all the plan's decisions was quadratic: with the
/// million-unit bench's plans of tens of thousands of placements it took 69 % of the bench's
/// CPU (`perf record`, docs/benchmarks.md section 7), and the leader fell ever further behind.
pub fn leaving(plan: &Plan) -> HashSet<&UnitName> {
    plan.decisions
        .iter()
        .filter_map(|d| match &d.kind {
            DecisionKind::Unschedule { unit, .. } => Some(unit),
            _ => None,
        })
        .collect()
}

/// What a placement decision did for its unit; `None` for the other decisions. A Schedule is a
/// move when the same plan takes the unit off a machine (`leaving`, of [`leaving`]), or when
/// it lands a unit leaving a drained machine.
pub fn outcome(decision: &Decision, leaving: &HashSet<&UnitName>) -> Option<Outcome> {
    match &decision.kind {
        DecisionKind::Schedule { unit, .. } => {
            let leaves = leaving.contains(unit);
            match leaves || matches!(decision.reason, Reason::Drained { .. }) {
                true => Some(Outcome::Moved),
                false => Some(Outcome::Placed),
            }
        }
        DecisionKind::Unschedulable { .. } => Some(Outcome::Waiting),
        DecisionKind::Moving { .. }
        | DecisionKind::Unschedule { .. }
        | DecisionKind::Update { .. }
        | DecisionKind::Forget { .. }
        | DecisionKind::Record { .. }
        | DecisionKind::ClearUnschedulable { .. }
        | DecisionKind::MoveOver { .. } => None,
    }
}

/// The engine's metric families; clones share them. [`Metrics::default`] is detached (tests,
/// the bench): it counts, and nobody serves it.
#[derive(Debug, Clone)]
pub struct Metrics {
    leader: Gauge,
    leader_start_time: Gauge,
    tasks: Family<TaskLabels, Counter>,
    task_failures: Family<TaskLabels, Counter>,
    reconciles: Counter,
    reconcile_failures: Family<FailureLabels, Counter>,
    reconcile_duration: Histogram,
    decisions: Family<OutcomeLabels, Counter>,
    waiting_for_copy: Gauge,
    stray_states: Gauge,
    unreadable: Gauge,
    states_past_bound: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            leader: Gauge::default(),
            leader_start_time: Gauge::default(),
            tasks: Family::default(),
            task_failures: Family::default(),
            reconciles: Counter::default(),
            reconcile_failures: Family::default(),
            // 1 ms to about 65 s: a pass over 10,000 units takes seconds.
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            decisions: Family::default(),
            waiting_for_copy: Gauge::default(),
            stray_states: Gauge::default(),
            unreadable: Gauge::default(),
            states_past_bound: Gauge::default(),
        }
    }
}

impl Metrics {
    /// New families, registered in `registry` (fleetd gives the `fleet_engine` one).
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics::default();
        registry.register(
            "leader",
            "1 while this fleetd's engine leads the cluster, else 0",
            m.leader.clone(),
        );
        registry.register(
            "leader_start_time",
            "When this fleetd last became the engine leader, in seconds since the epoch",
            m.leader_start_time.clone(),
        );
        registry.register(
            "task_count",
            "Decisions (schedule tasks) written, by type",
            m.tasks.clone(),
        );
        registry.register(
            "task_failure_count",
            "Decisions whose fenced write failed, by type",
            m.task_failures.clone(),
        );
        registry.register(
            "reconcile_count",
            "Reconcile rounds (engine passes) that completed",
            m.reconciles.clone(),
        );
        registry.register(
            "reconcile_failure_count",
            "Reconcile rounds that failed, by type",
            m.reconcile_failures.clone(),
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Time each reconcile round took",
            Unit::Seconds,
            m.reconcile_duration.clone(),
        );
        registry.register(
            "scheduling_decisions",
            "What scheduling decided for units, by outcome: placed, waiting or moved",
            m.decisions.clone(),
        );
        registry.register(
            "units_waiting_for_previous_copy",
            "Units the last plan held back until a copy on a machine of their placement history \
             stops",
            m.waiting_for_copy.clone(),
        );
        registry.register(
            "stray_unit_states",
            "Unit states published as possibly running by a machine the unit was not scheduled \
             on lately: ignored for placement",
            m.stray_states.clone(),
        );
        registry.register(
            "unreadable_registry_values",
            "Registry values the engine's view left out, as of its last pass: corrupt, at a key \
             of another record, or larger than a record of their kind may be (a host writing \
             past its bounds under its own prefix)",
            m.unreadable.clone(),
        );
        registry.register(
            "unit_states_past_bound",
            "Unit states the engine's view left out unread, as of its last pass, because their \
             machine publishes more than a machine may (10,000): a host writing past its bound \
             under its own prefix (each such machine is also one unreadable registry value)",
            m.states_past_bound.clone(),
        );
        m.zeroed();
        m
    }

    /// Every series of the counters at 0, so that a scrape shows them before their first
    /// increment: an alert on `rate(..._failure_count_total[5m])` sees nothing of a series
    /// that does not exist yet, and the first failure would go unnoticed.
    fn zeroed(&self) {
        for r#type in TaskType::ALL {
            self.tasks.get_or_create_owned(&TaskLabels { r#type });
            self.task_failures
                .get_or_create_owned(&TaskLabels { r#type });
        }
        for r#type in Failure::ALL {
            self.reconcile_failures
                .get_or_create_owned(&FailureLabels { r#type });
        }
        for outcome in Outcome::ALL {
            self.decisions
                .get_or_create_owned(&OutcomeLabels { outcome });
        }
    }

    /// How many registry values the view left out, and how many states past their machine's
    /// bound.
    pub(crate) fn unreadable(&self, count: usize, states_past_bound: usize) {
        self.unreadable
            .set(i64::try_from(count).unwrap_or(i64::MAX));
        self.states_past_bound
            .set(i64::try_from(states_past_bound).unwrap_or(i64::MAX));
    }

    pub(crate) fn leading(&self, leading: bool) {
        self.leader.set(i64::from(leading));
        if leading {
            let since = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            self.leader_start_time
                .set(i64::try_from(since.as_secs()).unwrap_or(i64::MAX));
        }
    }

    /// A pass whose writes landed.
    pub(crate) fn reconciled(&self, plan: &Plan, took: Duration) {
        self.reconciles.inc();
        self.reconcile_duration.observe(took.as_secs_f64());
        let leaving = leaving(plan);
        for d in &plan.decisions {
            self.tasks
                .get_or_create(&TaskLabels {
                    r#type: TaskType::of(&d.kind),
                })
                .inc();
            if let Some(outcome) = outcome(d, &leaving) {
                self.decisions
                    .get_or_create(&OutcomeLabels { outcome })
                    .inc();
            }
        }
    }

    /// A pass that failed; `plan` when it failed writing that plan.
    pub(crate) fn failed(&self, why: Failure, plan: Option<&Plan>) {
        self.reconcile_failures
            .get_or_create(&FailureLabels { r#type: why })
            .inc();
        for d in plan.map(|p| &p.decisions[..]).unwrap_or_default() {
            self.task_failures
                .get_or_create(&TaskLabels {
                    r#type: TaskType::of(&d.kind),
                })
                .inc();
        }
    }

    /// How many units wait for a previous copy, and how many stray states are known.
    pub(crate) fn copies(&self, waiting: usize, strays: usize) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.waiting_for_copy.set(count(waiting));
        self.stray_states.set(count(strays));
    }

    /// Units waiting for a previous copy, as of the last pass (for tests).
    pub fn waiting_for_previous_copy(&self) -> i64 {
        self.waiting_for_copy.get()
    }

    /// Stray unit states known, as of the last pass (for tests).
    pub fn stray_unit_states(&self) -> i64 {
        self.stray_states.get()
    }

    /// 1 while leading (for tests).
    pub fn is_leader(&self) -> bool {
        self.leader.get() == 1
    }

    /// Completed reconcile rounds so far (for tests).
    pub fn reconcile_count(&self) -> u64 {
        self.reconciles.get()
    }

    /// Decisions of `outcome` so far (for tests).
    pub fn decisions(&self, outcome: Outcome) -> u64 {
        self.decisions
            .get_or_create(&OutcomeLabels { outcome })
            .get()
    }
}

#[cfg(test)]
mod tests;
