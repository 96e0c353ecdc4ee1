//! The never-two-copies simulation of fleet-scheduler's tests (simulated machines whose
//! agents lag, vanish and come back, a liar, new leaders) with the leader as
//! `engine/leading.rs` runs it: a pass only when a change can change the plan (a unit, a
//! machine registering or leaving, states while a unit waits for a copy) or the disruption's
//! re-check comes, planning only the changed units when its [`PassPlanner`] can. What the
//! leader skips and what it plans alone must never let a second copy run either.

use super::*;
use crate::scheduler::Plan;
use fleet_scheduler::tests::World;
use fleet_scheduler::tests::props::gen_world;
use fleet_scheduler::tests::sim::{Leader, Sim, cfg, gen_history, play};
use proptest::prelude::*;

/// A leader's pass planner, and the registry as its view showed it at its last pass.
struct Passes {
    planner: PassPlanner,
    /// `None`: a new leader.
    seen: Option<Snapshot>,
    /// A pass is due whatever changed: a new leader's first, or the safety net's.
    due: bool,
    /// The pass whose writes are landing.
    landing: Option<PassPlan>,
}

impl Passes {
    fn new(now: Instant) -> Passes {
        Passes {
            planner: PassPlanner::new(cfg(), now),
            seen: None,
            due: true,
            landing: None,
        }
    }

    /// The safety net ticks (the simulated seconds are fewer than its period): the next pass
    /// plans every unit.
    fn safety_net(&mut self) {
        self.due = self.planner.safety_net(None);
    }
}

impl Leader for Passes {
    /// The pass due at `now`, if one is: what the view's watch delivered since the last
    /// pass, told to the planner as the leader's loop tells it.
    fn pass(&mut self, w: &World, now: Instant) -> Option<Plan> {
        let (due, changed) = match &self.seen {
            None => (true, BTreeSet::new()),
            Some(seen) => {
                let (touched, changed) = touched(seen, &w.snap);
                (self.planner.changed(touched), changed)
            }
        };
        let recheck = self.planner.recheck().is_some_and(|at| at <= now);
        if recheck {
            self.planner.recheck_came();
        }
        let due = std::mem::take(&mut self.due) || due || recheck;
        let pass = due.then(|| self.planner.next(&w.snap, &w.files, Some(changed), now))?;
        let plan = pass.plan.clone();
        self.landing = Some(pass);
        Some(plan)
    }

    fn landed(&mut self, w: &World) {
        let pass = self.landing.take().expect("a pass landed");
        let wrote_nothing = pass.plan.decisions.is_empty() && pass.notice_write().is_none();
        self.planner.done(&pass, &w.snap, wrote_nothing);
        self.seen = Some(w.snap.clone());
    }

    fn new_leader(&mut self, now: Instant) {
        *self = Passes::new(now);
    }

    fn disruption_mut(&mut self) -> &mut Disruption {
        self.planner.disruption_mut()
    }
}

/// What the view's watch reports between two snapshots of the registry, and the units it
/// names: only what others write (the leader's own writes are not news).
fn touched(before: &Snapshot, after: &Snapshot) -> (Touched, BTreeSet<UnitName>) {
    let changed: BTreeSet<UnitName> = before
        .units
        .keys()
        .chain(after.units.keys())
        .filter(|u| before.units.get(*u) != after.units.get(*u))
        .cloned()
        .collect();
    let machines = after.machines.iter();
    let machines = machines
        .filter(|(m, info)| before.machines.get(*m) != Some(*info))
        .count();
    let departed = before.machines.keys();
    let departed = departed.filter(|m| !after.machines.contains_key(*m));
    let touched = Touched {
        units: !changed.is_empty(),
        machines: machines > 0,
        departed: departed.count() > 0,
        states: before.states != after.states,
        ..Touched::default()
    };
    (touched, changed)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// As fleet-scheduler's `never_two_copies_whatever_agents_lag_machines_vanish_or_one_lies`,
    /// the leader passing only when its loop would, and planning alone what its pass planner
    /// plans alone. It settles the same once the safety net has ticked.
    #[test]
    fn never_two_copies_when_the_leader_passes_only_on_changes_that_matter(
        g in gen_world(),
        liar in prop::option::of(0..4usize),
        rounds in gen_history(),
    ) {
        let mut sim = Sim::new(&g, liar).with_leader(Passes::new);
        play(&mut sim, &rounds)?;
        sim.leader_mut().safety_net();
        sim.engine();
        sim.check_settled()?;
    }
}
