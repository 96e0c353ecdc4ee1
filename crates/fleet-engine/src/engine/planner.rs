//! What a leader's pass plans, decided on data: [`PassPlanner::next`] takes the view's
//! snapshot and unit files, the units changed since the last pass and the time, and returns
//! a [`PassPlan`]: the plan of every unit, or of the changed units alone (a delta,
//! `scheduler/delta.rs`) when that is the whole plan's, with the disruption rule's
//! assessment and the notice to publish beside it. [`PassPlanner::done`] takes in what the
//! pass wrote and keeps what the next one needs: the entangled units and each machine's load
//! (so that a delta is cheap), and whether a unit waits for a copy, when the assessment
//! changes by itself, and which revision is known to plan to nothing (so that the leader
//! knows when a pass is due).
//!
//! A whole plan is made at the start of a view, after a machine registered or changed what
//! it offers, while a unit waits for a copy to stop, on the safety net, and whenever the
//! changed units cannot be traced; a delta the scheduler refuses falls back to it too. A pass
//! whose write failed is planned again: a whole plan whole, a delta's units with the next
//! pass's changes.
//!
//! No I/O and no clock: `engine/leading.rs` reads the view, calls this, writes the plan
//! fenced and records it. It must not decide where a unit goes (the scheduler does) nor
//! which vanished machines' units stay ([`Disruption`] does); it only chooses what to ask.

use fleet_core::{UnitFile, UnitHash, UnitName};
use fleet_registry::kv::Revision;
use fleet_registry::{EngineWrite, MoveRecord, Snapshot, Touched};
use std::collections::{BTreeMap, BTreeSet};
use tokio::time::Instant;

use crate::disruption::{Assessment, Disruption, DisruptionConfig};
use crate::scheduler::{
    Decision, DecisionKind, Entangled, Load, Plan, plan_delta_on, plan_holding, touched_by_loss,
};

/// Unit files by hash, as the view keeps them.
type Files = BTreeMap<UnitHash, UnitFile>;

/// What one leadership's passes remember between them.
#[derive(Debug)]
pub(crate) struct PassPlanner {
    /// The presence history of this leadership: which vanished machines' units stay.
    disruption: Disruption,
    /// Whether the last plan held a unit back until a copy on another machine stops. Only
    /// then can a change of unit states change the plan, so only then do state changes
    /// (which every agent writes on every unit's state change) start a pass.
    waiting: bool,
    /// When the last assessment changes by itself: a pass is due then.
    recheck: Option<Instant>,
    /// The disruption notice the registry holds, as far as we know (`None`: unknown, e.g.
    /// at the start of leadership, so the first pass writes it either way).
    notice: Option<Option<String>>,
    /// Whether the next pass must plan every unit: at the start, after a machine registered
    /// or changed what it offers, and on the safety net. Otherwise a pass plans only the
    /// units that changed when the scheduler can (see `scheduler/delta.rs`).
    whole_due: bool,
    /// Whether a machine left, or the disruption's re-check came, since the last pass: the
    /// next one asks the disruption rule, and plans the lost machines' units it may move
    /// with the units that changed.
    loss_due: bool,
    /// The units whose options tie them to others, as of the last whole plan (`None`: none
    /// made yet with this view).
    entangled: Option<Entangled>,
    /// Each machine's schedule entries in the view, kept across delta passes (`None`:
    /// counted at the next one). Only the leader writes schedules, and a delta pass
    /// changes only its touched units' entries: between [`next`](Self::next) and
    /// [`done`](Self::done) of a delta it counts the other units' entries only.
    load: Option<Load>,
    /// The view's revision after a whole plan that decided nothing, with nothing waiting,
    /// held or due to change by itself: the plan of that revision is known to be empty, so
    /// the safety net does not plan it again (issue 19: the idle leader's minute pass was a
    /// fifth of an idle fleetd's CPU with 3,000 units). Any pass that is not such a plan
    /// clears it.
    settled: Option<Revision>,
    /// The units of a delta pass whose write failed: the next pass plans them again with
    /// the units changed since. Some of the writes may have landed, others not; either way
    /// the view, caught up, tells, and planning them again gives what a whole plan would.
    replan: BTreeSet<UnitName>,
}

/// Which units a pass planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Every unit.
    Whole,
    /// These units alone (a delta): its decisions are the whole plan's.
    Units(BTreeSet<UnitName>),
}

/// What one pass plans, and what it must write beside the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PassPlan {
    pub plan: Plan,
    pub scope: Scope,
    /// What the disruption rule said (the default when it was not asked: a delta without a
    /// loss).
    pub assessment: Assessment,
    /// Whether the disruption rule was asked.
    assessed: bool,
    /// Whether units of vanished machines were (or may have been) planned.
    pub losing: bool,
    /// How many units changed since the last pass.
    pub changed: usize,
    /// The disruption notice as of this plan.
    notice: Option<String>,
    /// Whether the registry may hold another notice: then this pass writes it.
    write_notice: bool,
    /// The revision planned.
    at: Revision,
    /// The entangled units of a whole plan's snapshot, for the deltas after it. Taken at
    /// plan time: what the pass writes cannot change it, and the view may have moved past
    /// the plan's revision when the pass is done.
    entangled: Option<Entangled>,
}

impl PassPlanner {
    /// A planner for a new leadership, which knows nothing yet: its first pass plans every
    /// unit and writes the notice.
    pub fn new(cfg: DisruptionConfig, now: Instant) -> PassPlanner {
        PassPlanner {
            disruption: Disruption::new(cfg, now),
            waiting: false,
            recheck: None,
            notice: None,
            whole_due: true,
            loss_due: false,
            entangled: None,
            load: None,
            settled: None,
            replan: BTreeSet::new(),
        }
    }

    /// Takes in a change of the view; returns whether it can change the plan (a pass is
    /// due). Schedules and unschedulable reasons are written by the leader alone and already
    /// recorded in the view when written: their echo is not news. Unit states matter only
    /// while a unit waits for a copy to stop.
    pub fn changed(&mut self, t: Touched) -> bool {
        self.whole_due |= t.machines;
        self.loss_due |= t.departed;
        t.units || t.files || t.machines || t.departed || (t.states && self.waiting)
    }

    /// The safety net ticked, the view being at `revision` (`None`: no view); returns
    /// whether a pass is due: unless the view is still at the revision of the last whole
    /// plan that found nothing to do (see `settled`). Planning it again would find nothing
    /// again, the planner being a function of the view and of the disruption's assessment,
    /// which was quiet. A pass the safety net starts plans every unit.
    pub fn safety_net(&mut self, revision: Option<Revision>) -> bool {
        let settled = revision.is_some() && revision == self.settled;
        self.whole_due |= !settled;
        !settled
    }

    /// When the disruption's assessment changes by itself: a pass is due then.
    pub fn recheck(&self) -> Option<Instant> {
        self.recheck
    }

    /// The re-check came: the next pass asks the disruption rule again.
    pub fn recheck_came(&mut self) {
        self.loss_due = true;
    }

    /// The view was read afresh: what was kept of the last one counts for nothing.
    pub fn new_view(&mut self) {
        self.entangled = None;
        self.load = None;
        self.replan.clear();
    }

    /// The write of `pass` failed, and some of it may have landed: the machines' loads and
    /// the notice are counted again, and the next pass plans `pass`'s units again (all of
    /// them after a whole plan). Issue 43: a failed pass was followed by a whole plan, and
    /// in the million every whole plan wrote the whole backlog and failed in turn.
    pub fn write_failed(&mut self, pass: &PassPlan) {
        self.load = None;
        self.notice = None;
        match &pass.scope {
            Scope::Units(units) => self.replan.extend(units.iter().cloned()),
            Scope::Whole => self.whole_due = true,
        }
    }

    /// Plans the pass on `snapshot` (and its unit `files`) at `now`, `changed` being the
    /// units changed since the last pass (`None`: not known).
    pub fn next(
        &mut self,
        snapshot: &Snapshot,
        files: &Files,
        changed: Option<BTreeSet<UnitName>>,
        now: Instant,
    ) -> PassPlan {
        self.settled = None;
        // Units changed since the last pass, not counting a failed pass's units.
        let count = changed.as_ref().map_or(0, BTreeSet::len);
        let replan = std::mem::take(&mut self.replan);
        let changed = changed.map(|mut units| {
            units.extend(replan);
            units
        });
        let partial = !self.whole_due && !self.waiting && self.entangled.is_some();
        let changed = changed.filter(|_| partial);
        // Machines left, or units of vanished machines wait: the disruption rule says which
        // of those units stay (a settle, a hold, the move rate). A whole plan always asks.
        let losing = self.loss_due || !self.disruption.quiet();
        let mut assessment =
            (changed.is_none() || losing).then(|| self.disruption.assess(now, snapshot));
        let delta =
            changed.and_then(|units| self.delta(snapshot, files, units, assessment.as_ref()));
        if delta.is_none() && assessment.is_none() {
            assessment = Some(self.disruption.assess(now, snapshot));
        }
        let assessed = assessment.is_some();
        let assessment = assessment.unwrap_or_default();
        let (plan, scope) = match delta {
            Some((plan, touched)) => (plan, Scope::Units(touched)),
            None => (
                plan_holding(snapshot, files, &assessment.held),
                Scope::Whole,
            ),
        };
        let notice = assessment.hold.as_ref().map(ToString::to_string);
        let entangled = (scope == Scope::Whole).then(|| Entangled::of(snapshot, files));
        PassPlan {
            plan,
            scope,
            at: snapshot.revision,
            entangled,
            assessed,
            losing,
            changed: count,
            write_notice: self.notice.as_ref() != Some(&notice),
            notice,
            assessment,
        }
    }

    /// The plan of the `changed` units (with the lost machines' units the `assessment`
    /// lets move), and the units it planned; `None` when only a whole plan will do.
    fn delta(
        &mut self,
        snapshot: &Snapshot,
        files: &Files,
        changed: BTreeSet<UnitName>,
        assessment: Option<&Assessment>,
    ) -> Option<(Plan, BTreeSet<UnitName>)> {
        let entangled = self.entangled.as_ref()?;
        let touched = match assessment {
            None => changed,
            // A loss is planned as a change of the lost machines' units that may move.
            Some(a) => touched_by_loss(snapshot, &changed, &a.held),
        };
        let load = self.load.get_or_insert_with(|| Load::of(snapshot));
        let others = load.without(snapshot, &touched);
        let none = BTreeSet::new();
        let held = assessment.map_or(&none, |a| &a.held);
        let plan = plan_delta_on(snapshot, files, &touched, entangled, held, others.clone())?;
        self.load = Some(others);
        Some((plan, touched))
    }

    /// The disruption rule's history, for a simulation's final check.
    #[cfg(test)]
    fn disruption_mut(&mut self) -> &mut Disruption {
        &mut self.disruption
    }

    /// Takes in a pass whose writes landed: `snapshot` is the view with them applied (and
    /// maybe later changes, which touch no schedule: only the leader writes those), and
    /// `wrote_nothing` says whether the pass wrote anything at all.
    pub fn done(&mut self, pass: &PassPlan, snapshot: &Snapshot, wrote_nothing: bool) {
        self.notice = Some(pass.notice.clone());
        self.waiting = !pass.plan.waiting.is_empty();
        if pass.assessed {
            self.recheck = pass.assessment.recheck;
        }
        let settled = pass.scope == Scope::Whole
            && wrote_nothing
            && !self.waiting
            && self.recheck.is_none()
            && self.disruption.quiet();
        self.settled = settled.then_some(pass.at);
        self.loss_due = false;
        match &pass.scope {
            // The touched units' entries as written.
            Scope::Units(touched) => {
                if let Some(load) = &mut self.load {
                    load.add(snapshot, touched);
                }
            }
            Scope::Whole => {
                self.entangled = pass.entangled.clone();
                self.whole_due = false;
                self.load = None;
            }
        }
    }
}

impl PassPlan {
    /// The units planned alone; `None` when every unit was.
    pub fn planned(&self) -> Option<&BTreeSet<UnitName>> {
        match &self.scope {
            Scope::Whole => None,
            Scope::Units(units) => Some(units),
        }
    }

    /// What was planned, for the log.
    pub fn what(&self) -> &'static str {
        match (&self.scope, self.losing) {
            (Scope::Whole, _) => "all units",
            (Scope::Units(_), false) => "changed units",
            (Scope::Units(_), true) => "changed units and lost machines' units",
        }
    }

    /// The writes of the plan's decisions, in their order.
    pub fn decision_writes(&self) -> impl Iterator<Item = EngineWrite> + '_ {
        self.plan.decisions.iter().map(write_of)
    }

    /// The notice to publish, when the registry may hold another one.
    pub fn notice_write(&self) -> Option<EngineWrite> {
        self.write_notice.then(|| EngineWrite::Disruption {
            notice: self.notice.clone(),
        })
    }
}

fn write_of(decision: &Decision) -> EngineWrite {
    match &decision.kind {
        DecisionKind::Unschedule {
            unit,
            machine,
            left: None,
        } => EngineWrite::Unschedule {
            machine: machine.clone(),
            unit: unit.clone(),
        },
        DecisionKind::Unschedule {
            unit,
            machine,
            left: Some(copy),
        } => EngineWrite::Leave {
            machine: machine.clone(),
            unit: unit.clone(),
            copy: *copy,
        },
        DecisionKind::Forget { unit, machine } => EngineWrite::Forget {
            unit: unit.clone(),
            machine: machine.clone(),
        },
        DecisionKind::Record {
            unit,
            machine,
            copy,
        } => EngineWrite::Record {
            unit: unit.clone(),
            machine: machine.clone(),
            copy: *copy,
        },
        kind @ (DecisionKind::Update { .. } | DecisionKind::Schedule { .. }) => {
            EngineWrite::Schedule(kind.schedule_entry().expect("an entry's decision"))
        }
        DecisionKind::Unschedulable { unit } => EngineWrite::Unschedulable {
            unit: unit.clone(),
            reason: decision.reason.to_string(),
        },
        DecisionKind::ClearUnschedulable { unit } => {
            EngineWrite::ClearUnschedulable { unit: unit.clone() }
        }
        DecisionKind::Moving { unit, from } => EngineWrite::Moving(MoveRecord {
            unit: unit.clone(),
            from: from.clone(),
        }),
        DecisionKind::MoveOver { unit } => EngineWrite::Moved { unit: unit.clone() },
    }
}

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
