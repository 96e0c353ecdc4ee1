//! Who plans in a simulation, and when: [`EveryRound`] plans every unit every round;
//! fleet-engine's tests bring a leader that passes as its own does.

use super::*;

/// The leader of a simulation: when it passes, and what it plans.
pub trait Leader {
    /// The plan of the pass due at `now` on the registry `w`, if one is.
    fn pass(&mut self, w: &World, now: Instant) -> Option<Plan>;
    /// The writes of the plan it returned last landed: `w` holds them.
    fn landed(&mut self, w: &World);
    /// A new leader took over at `now`: it knows only the registry.
    fn new_leader(&mut self, now: Instant);
    /// Its presence history, for the final check that nothing is held.
    fn disruption_mut(&mut self) -> &mut Disruption;
}

/// A leader that plans every unit every round, after asking the disruption rule.
#[derive(Debug)]
pub struct EveryRound {
    disruption: Disruption,
}

impl EveryRound {
    /// A leader taking over at `now`, knowing only the registry.
    pub fn new(now: Instant) -> EveryRound {
        EveryRound {
            disruption: Disruption::new(cfg(), now),
        }
    }
}

impl Leader for EveryRound {
    fn pass(&mut self, w: &World, now: Instant) -> Option<Plan> {
        let assessment = self.disruption.assess(now, &w.snap);
        Some(plan_holding(&w.snap, &w.files, &assessment.held))
    }

    fn landed(&mut self, _: &World) {}

    fn new_leader(&mut self, now: Instant) {
        *self = EveryRound::new(now);
    }

    fn disruption_mut(&mut self) -> &mut Disruption {
        &mut self.disruption
    }
}
