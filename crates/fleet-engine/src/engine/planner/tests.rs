//! When a pass plans every unit and when only the changed ones, and that a delta is always
//! the whole plan of the same snapshot (the property test at the end). Worlds are built by
//! the scheduler's test [`World`]; a pass's decisions are applied to it as the leader's
//! write and record would.

use super::*;
use crate::scheduler::plan;
use fleet_core::DesiredState::Launched;
use fleet_scheduler::tests::props::{GenChange, MACHINES, build, change, gen_change, gen_world};
use fleet_scheduler::tests::{World, lines, name};
use proptest::prelude::*;
use std::time::Duration;

fn cfg() -> DisruptionConfig {
    DisruptionConfig::for_ttl(Duration::from_secs(3))
}

fn units(names: &[&str]) -> BTreeSet<UnitName> {
    names.iter().map(|u| name(u)).collect()
}

/// Takes in a pass whose decisions were applied to `w` (the leader's write and record).
fn apply(p: &mut PassPlanner, w: &mut World, pass: &PassPlan) {
    w.apply(&pass.plan.decisions);
    let wrote_nothing = pass.plan.decisions.is_empty() && pass.notice_write().is_none();
    p.done(pass, &w.snap, wrote_nothing);
}

/// Plans a pass on `w` at `now` and applies it; returns it.
fn pass(
    p: &mut PassPlanner,
    w: &mut World,
    changed: Option<BTreeSet<UnitName>>,
    now: Instant,
) -> PassPlan {
    let pass = p.next(&w.snap, &w.files, changed, now);
    apply(p, w, &pass);
    pass
}

/// Three machines, four plain units spread over two of them, and a planner that has made
/// its first (whole) pass on them.
fn settled(now: Instant) -> (PassPlanner, World) {
    let mut w = World::new()
        .machine("m1", &[])
        .machine("m2", &[])
        .machine("m3", &[])
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "")
        .unit("c.service", Launched, "")
        .unit("d.service", Launched, "")
        .entry("a.service", "m1")
        .entry("b.service", "m1")
        .entry("c.service", "m2")
        .entry("d.service", "m2");
    let mut p = PassPlanner::new(cfg(), now);
    let first = pass(&mut p, &mut w, Some(BTreeSet::new()), now);
    assert_eq!(first.scope, Scope::Whole);
    assert!(first.plan.decisions.is_empty(), "already at a fixed point");
    (p, w)
}

#[test]
fn the_first_pass_plans_every_unit_and_publishes_the_notice() {
    let now = Instant::now();
    let mut w = World::new()
        .machine("m1", &[])
        .unit("a.service", Launched, "");
    let mut p = PassPlanner::new(cfg(), now);
    let first = p.next(&w.snap, &w.files, Some(units(&["a.service"])), now);
    assert_eq!(first.scope, Scope::Whole);
    assert_eq!(first.plan, plan(&w.snap, &w.files));
    assert_eq!(
        first.notice_write(),
        Some(EngineWrite::Disruption { notice: None }),
        "what the registry holds is not known yet"
    );
    apply(&mut p, &mut w, &first);
    let second = p.next(&w.snap, &w.files, Some(BTreeSet::new()), now);
    assert_eq!(second.notice_write(), None, "written already");
}

#[test]
fn a_change_of_plain_units_is_planned_alone_and_is_the_whole_plan() {
    let now = Instant::now();
    let (mut p, w) = settled(now);
    let mut w = w.unit("e.service", Launched, "");
    let delta = p.next(&w.snap, &w.files, Some(units(&["e.service"])), now);
    assert_eq!(delta.scope, Scope::Units(units(&["e.service"])));
    assert_eq!(delta.planned(), Some(&units(&["e.service"])));
    assert_eq!(delta.plan, plan(&w.snap, &w.files));
    assert_eq!(
        lines(&delta.plan.decisions),
        ["schedule e.service on m3 (launched): target state launched and unit not scheduled"]
    );
    apply(&mut p, &mut w, &delta);
    // The next delta counts e's entry in the load kept across passes.
    let mut w = w.unit("f.service", Launched, "");
    let next = p.next(&w.snap, &w.files, Some(units(&["f.service"])), now);
    assert!(next.planned().is_some());
    assert_eq!(next.plan, plan(&w.snap, &w.files));
    apply(&mut p, &mut w, &next);
    assert!(plan(&w.snap, &w.files).decisions.is_empty());
}

#[test]
fn a_unit_tied_to_others_is_planned_with_the_whole() {
    let now = Instant::now();
    let (mut p, w) = settled(now);
    let w = w.unit("e.service", Launched, "Conflicts=a.service");
    let pass = p.next(&w.snap, &w.files, Some(units(&["e.service"])), now);
    assert_eq!(pass.scope, Scope::Whole, "the scheduler refused a delta");
    assert_eq!(pass.plan, plan(&w.snap, &w.files));
}

#[test]
fn changes_that_cannot_be_traced_to_their_units_are_planned_whole() {
    let now = Instant::now();
    let (mut p, w) = settled(now);
    let w = w.unit("e.service", Launched, "");
    let pass = p.next(&w.snap, &w.files, None, now);
    assert_eq!(pass.scope, Scope::Whole);
    assert_eq!(pass.changed, 0);
}

#[test]
fn a_machine_that_registers_or_changes_makes_the_next_pass_whole() {
    let now = Instant::now();
    let (mut p, w) = settled(now);
    let machines = Touched {
        machines: true,
        ..Touched::default()
    };
    assert!(p.changed(machines), "a pass is due");
    let mut w = w.machine("m4", &[]).unit("e.service", Launched, "");
    let whole = pass(&mut p, &mut w, Some(units(&["e.service"])), now);
    assert_eq!(whole.scope, Scope::Whole);
    let w = w.unit("f.service", Launched, "");
    let next = p.next(&w.snap, &w.files, Some(units(&["f.service"])), now);
    assert!(next.planned().is_some(), "a whole plan was made since");
}

#[test]
fn a_view_read_again_is_planned_whole() {
    let now = Instant::now();
    let (mut p, w) = settled(now);
    p.new_view();
    let w = w.unit("e.service", Launched, "");
    let pass = p.next(&w.snap, &w.files, Some(units(&["e.service"])), now);
    assert_eq!(pass.scope, Scope::Whole);
}

#[test]
fn the_echo_of_the_leaders_own_writes_is_not_news() {
    let now = Instant::now();
    let (mut p, _) = settled(now);
    let echo = Touched {
        schedules: true,
        unscheduled: true,
        ..Touched::default()
    };
    assert!(!p.changed(echo));
    for t in [
        Touched {
            units: true,
            ..Touched::default()
        },
        Touched {
            files: true,
            ..Touched::default()
        },
        Touched {
            departed: true,
            ..Touched::default()
        },
    ] {
        assert!(p.changed(t), "{t:?}");
    }
}

#[test]
fn state_changes_matter_only_while_a_unit_waits_for_a_copy_and_then_plans_are_whole() {
    let now = Instant::now();
    let states = Touched {
        states: true,
        ..Touched::default()
    };
    let (mut p, w) = settled(now);
    assert!(!p.changed(states), "nothing waits");
    // e left m1, whose agent still publishes it running: e waits for that copy to stop.
    let mut w = w
        .unit("e.service", Launched, "")
        .left("e.service", "m1")
        .state("e.service", "m1", "active");
    let held = pass(&mut p, &mut w, Some(units(&["e.service"])), now);
    assert_eq!(held.plan.waiting, units(&["e.service"]));
    assert!(p.changed(states), "the copy's state may end the wait");
    let w = w.without_state("e.service", "m1");
    let whole = p.next(&w.snap, &w.files, Some(BTreeSet::new()), now);
    assert_eq!(whole.scope, Scope::Whole, "a unit waited");
    assert_eq!(whole.plan, plan(&w.snap, &w.files));
}

#[test]
fn the_safety_net_skips_only_a_revision_known_to_plan_to_nothing() {
    let now = Instant::now();
    let (mut p, mut w) = settled(now);
    let revision = w.snap.revision;
    assert!(
        p.safety_net(Some(revision)),
        "the first pass wrote the notice: not known to be settled"
    );
    let whole = pass(&mut p, &mut w, Some(BTreeSet::new()), now);
    assert_eq!(whole.scope, Scope::Whole, "the safety net plans every unit");
    assert!(!p.safety_net(Some(revision)), "settled");
    assert!(p.safety_net(Some(revision + 1)), "the view changed");
    assert!(p.safety_net(None), "no view");
}

#[test]
fn a_failed_write_forgets_what_the_registry_holds() {
    let now = Instant::now();
    let (mut p, w) = settled(now);
    let failed = p.next(&w.snap, &w.files, Some(BTreeSet::new()), now);
    p.write_failed(&failed);
    let next = p.next(&w.snap, &w.files, Some(BTreeSet::new()), now);
    assert_eq!(
        next.notice_write(),
        Some(EngineWrite::Disruption { notice: None })
    );
}

/// Issue 43: after a failed write the leader planned every unit, and in the million each
/// whole plan wrote the whole backlog and failed in turn. A failed delta's units are
/// planned again, alone, with what changed since; a failed whole plan is made again whole.
#[test]
fn a_failed_deltas_units_are_planned_again_with_the_next_changes() {
    let now = Instant::now();
    let (mut p, w) = settled(now);
    let mut w = w
        .unit("e.service", Launched, "")
        .unit("f.service", Launched, "");
    let failed = p.next(
        &w.snap,
        &w.files,
        Some(units(&["e.service", "f.service"])),
        now,
    );
    assert_eq!(failed.plan.decisions.len(), 2);
    // e's entry landed before the deadline passed, f's did not.
    w.apply(&failed.plan.decisions[..1]);
    p.write_failed(&failed);
    let w = w.unit("g.service", Launched, "");
    let next = p.next(&w.snap, &w.files, Some(units(&["g.service"])), now);
    let all = units(&["e.service", "f.service", "g.service"]);
    assert_eq!(next.scope, Scope::Units(all));
    assert_eq!(next.plan, plan(&w.snap, &w.files));
    assert_eq!(next.plan.decisions.len(), 2, "f and g: e is scheduled");

    // A whole plan made because the changes could not be traced: nothing else makes the
    // next one whole.
    let (mut p, w) = settled(now);
    let whole = p.next(&w.snap, &w.files, None, now);
    assert_eq!(whole.scope, Scope::Whole);
    p.write_failed(&whole);
    let again = p.next(&w.snap, &w.files, Some(BTreeSet::new()), now);
    assert_eq!(again.scope, Scope::Whole);
}

#[test]
fn a_lost_machines_units_stay_for_the_settle_then_move_with_the_changed_units() {
    let start = Instant::now();
    let (mut p, w) = settled(start);
    let departed = Touched {
        departed: true,
        ..Touched::default()
    };
    assert!(p.changed(departed));
    let mut w = w.without_machine("m1");
    let settle = pass(&mut p, &mut w, Some(BTreeSet::new()), start);
    assert!(settle.losing);
    assert_eq!(settle.assessment.held, units(&["a.service", "b.service"]));
    assert!(
        settle.plan.decisions.is_empty(),
        "{:?}",
        lines(&settle.plan.decisions)
    );
    let recheck = p.recheck().expect("the settle ends by itself");
    assert_eq!(recheck, start + cfg().settle);

    p.recheck_came();
    let mut w = w.unit("e.service", Launched, "");
    let moved = p.next(&w.snap, &w.files, Some(units(&["e.service"])), recheck);
    assert_eq!(
        moved.planned(),
        Some(&units(&["a.service", "b.service", "e.service"]))
    );
    assert_eq!(
        moved.plan,
        plan_holding(&w.snap, &w.files, &moved.assessment.held)
    );
    apply(&mut p, &mut w, &moved);
    assert_eq!(p.recheck(), None);
    assert!(plan(&w.snap, &w.files).decisions.is_empty());
}

/// What happens to the registry between two passes.
#[derive(Debug, Clone)]
struct Round {
    changes: Vec<GenChange>,
    /// A machine whose presence goes.
    departs: Option<usize>,
    /// A machine that registers.
    joins: Option<usize>,
    /// Whether the changed units cannot be traced.
    untraced: bool,
    /// Whether the safety net ticks.
    safety_net: bool,
    /// Whether the pass's write fails, and which of its decisions landed all the same (the
    /// `i`th when the `i`th flag, cycled, is set): transactions go several at once and one
    /// past its deadline may land or not.
    fails: Option<Vec<bool>>,
}

fn gen_round() -> impl Strategy<Value = Round> {
    (
        prop::collection::vec(gen_change(), 0..3),
        prop::option::weighted(0.2, 0..MACHINES.len()),
        prop::option::weighted(0.1, 0..MACHINES.len()),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        prop::option::weighted(0.2, prop::collection::vec(any::<bool>(), 1..4)),
    )
        .prop_map(
            |(changes, departs, joins, untraced, safety_net, fails)| Round {
                changes,
                departs,
                joins,
                untraced,
                safety_net,
                fails,
            },
        )
}

/// Applies `round` to `w` as the view would deliver it to the planner; returns the units
/// the view reports changed.
fn happen(p: &mut PassPlanner, w: &mut World, round: &Round) -> Option<BTreeSet<UnitName>> {
    let changed: BTreeSet<UnitName> = round.changes.iter().map(|c| change(w, c)).collect();
    let units = Touched {
        units: !changed.is_empty(),
        ..Touched::default()
    };
    p.changed(units);
    if let Some(m) = round.departs.map(|i| MACHINES[i]) {
        *w = std::mem::take(w).without_machine(m);
        p.changed(Touched {
            departed: true,
            ..Touched::default()
        });
    }
    if let Some(m) = round.joins.map(|i| MACHINES[i]) {
        *w = std::mem::take(w).machine(m, &[]);
        p.changed(Touched {
            machines: true,
            ..Touched::default()
        });
    }
    w.snap.revision += 1;
    if round.safety_net {
        p.safety_net(Some(w.snap.revision));
    }
    (!round.untraced).then_some(changed)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// What lets the leader plan only what changed: whatever happened since the last pass,
    /// a pass planned alone is the whole plan of the same snapshot (holding the same units
    /// of vanished machines), decision for decision, so applied it leaves the schedule a
    /// whole plan would. Passes whose write failed, with some of their decisions landed,
    /// included.
    #[test]
    fn a_delta_pass_is_the_whole_plan_of_the_same_snapshot(
        g in gen_world(),
        rounds in prop::collection::vec(gen_round(), 1..6),
    ) {
        let mut now = Instant::now();
        let mut w = build(&g);
        let mut p = PassPlanner::new(cfg(), now);
        pass(&mut p, &mut w, Some(BTreeSet::new()), now);
        for round in &rounds {
            now += Duration::from_secs(1);
            let changed = happen(&mut p, &mut w, round);
            if p.recheck().is_some_and(|at| at <= now) {
                p.recheck_came();
            }
            let next = p.next(&w.snap, &w.files, changed, now);
            let whole = plan_holding(&w.snap, &w.files, &next.assessment.held);
            if next.planned().is_some() {
                prop_assert_eq!(lines(&next.plan.decisions), lines(&whole.decisions));
                prop_assert_eq!(&next.plan, &whole);
            }
            match &round.fails {
                Some(landed) => {
                    let landed: Vec<Decision> = next
                        .plan
                        .decisions
                        .iter()
                        .zip(landed.iter().cycle())
                        .filter(|(_, landed)| **landed)
                        .map(|(d, _)| d.clone())
                        .collect();
                    w.apply(&landed);
                    p.write_failed(&next);
                }
                None => apply(&mut p, &mut w, &next),
            }
        }
    }
}
