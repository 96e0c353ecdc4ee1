//! The leader's decisions as events (issue 41), built after its fenced write landed and
//! handed to the engine role's writer, which never waits: a pass is not slowed by them.
//!
//! What is worth an event: a unit scheduled on a machine (and why that one), taken off one
//! (the reason `explain` gives), moved (a schedule that follows an unschedule whose cause
//! moves units: the machine was lost, drained, a replace with `--reschedule`, a conflict),
//! found unschedulable, and rescheduling held or resumed. In-place updates and the
//! bookkeeping of moves and previous copies are not: the user's action or the agent's facts
//! say those. [`EngineEvents::of`] is pure; the leader only emits what it returns.

use fleet_core::{MachineId, UnitName};
use fleet_registry::{Event, EventKind, EventSink, Snapshot};
use std::collections::BTreeMap;

use crate::disruption::Hold;
use crate::scheduler::{Decision, DecisionKind, Reason};

/// Unschedules remembered at most, waiting for the schedule that makes them a move; past it
/// they are forgotten (the unschedule's own event stays).
const MOVES_KEPT: usize = 10_000;

/// Decisions of failed passes kept at most until a pass tells which of them were written.
const UNCONFIRMED_KEPT: usize = 200_000;

/// The unschedules that may become moves, and where the events go.
#[derive(Debug)]
pub(super) struct EngineEvents {
    sink: EventSink,
    /// Unit -> the machine it left and why (the cause of the move to come).
    leaving: BTreeMap<UnitName, (MachineId, String)>,
    /// The decisions of passes whose write failed, some of whose transactions may have
    /// landed all the same: the next pass plans on a view caught up with the present and
    /// emits the events of those it finds written ([`confirm`](Self::confirm)); the others
    /// it plans again, and emits as its own. Issue 43: only a pass written whole emitted
    /// its events, so a failed pass took its landed decisions' events with it (at 10,000
    /// simulated machines the engine wrote 4,620 of 100,000 `scheduled` events).
    unconfirmed: Vec<Decision>,
}

/// Why an unschedule moves its unit elsewhere, in a move's words; `None`: it does not
/// (the unit is stopped, destroyed, or was a duplicate).
fn move_cause(reason: &Reason) -> Option<String> {
    Some(match reason {
        Reason::MachineGone { machine } => format!("machine {machine} lost"),
        Reason::Drained { machine } => format!("machine {machine} drained"),
        Reason::RescheduleRequested { generation } => {
            format!("replaced with --reschedule (placement {generation})")
        }
        Reason::ConstraintsViolated { machine, violation } => {
            format!("conflict on {machine}: {violation}")
        }
        Reason::ReplacedBy { unit, machine } => format!("replaced by {unit} on {machine}"),
        _ => return None,
    })
}

impl EngineEvents {
    pub(super) fn new(sink: EventSink) -> EngineEvents {
        EngineEvents {
            sink,
            leaving: BTreeMap::new(),
            unconfirmed: Vec::new(),
        }
    }

    /// Emits the events of the decisions of a pass that was written.
    pub(super) fn decided(&mut self, decisions: &[Decision]) {
        for event in self.of(decisions) {
            self.sink.emit(event);
        }
    }

    /// The write of a pass of `decisions` failed: some may have landed. Kept for
    /// [`confirm`](Self::confirm), up to [`UNCONFIRMED_KEPT`].
    pub(super) fn failed(&mut self, decisions: &[Decision]) {
        let room = UNCONFIRMED_KEPT.saturating_sub(self.unconfirmed.len());
        self.unconfirmed.extend(
            decisions
                .iter()
                .filter(|d| has_event(d))
                .take(room)
                .cloned(),
        );
    }

    /// Emits the events of the failed passes' decisions that `snapshot` (a view caught up
    /// with the present since they failed) shows written, and forgets the rest.
    pub(super) fn confirm(&mut self, snapshot: &Snapshot) {
        if self.unconfirmed.is_empty() {
            return;
        }
        let kept = std::mem::take(&mut self.unconfirmed);
        let landed: Vec<Decision> = kept.into_iter().filter(|d| written(d, snapshot)).collect();
        self.decided(&landed);
    }

    /// Emits a hold's start, change or end.
    pub(super) fn held(&self, hold: Option<&Hold>) {
        let event = match hold {
            Some(hold) => Event::now(EventKind::RescheduleHeld, hold.to_string()),
            None => Event::now(EventKind::RescheduleResumed, "rescheduling hold ended"),
        };
        self.sink.emit(event);
    }

    /// The events of `decisions`, in their order; remembers unschedules that may become moves.
    pub(super) fn of(&mut self, decisions: &[Decision]) -> Vec<Event> {
        let mut events = Vec::new();
        for d in decisions {
            let reason = d.reason.to_string();
            match &d.kind {
                DecisionKind::Schedule { unit, machine, .. } => {
                    let event = match self.leaving.remove(unit) {
                        Some((from, cause)) if &from != machine => {
                            Event::now(EventKind::Moved, format!("{cause}; {reason}")).from(&from)
                        }
                        _ => Event::now(EventKind::Scheduled, reason),
                    };
                    events.push(event.unit(unit).on(machine));
                }
                DecisionKind::Unschedule { unit, machine, .. } => {
                    match move_cause(&d.reason) {
                        Some(cause) => {
                            if self.leaving.len() >= MOVES_KEPT {
                                self.leaving.clear();
                            }
                            self.leaving.insert(unit.clone(), (machine.clone(), cause));
                        }
                        None => {
                            self.leaving.remove(unit);
                        }
                    }
                    events.push(
                        Event::now(EventKind::Unscheduled, reason)
                            .unit(unit)
                            .on(machine),
                    );
                }
                DecisionKind::Unschedulable { unit } => {
                    events.push(Event::now(EventKind::Unschedulable, reason).unit(unit));
                }
                DecisionKind::ClearUnschedulable { .. }
                | DecisionKind::Update { .. }
                | DecisionKind::Forget { .. }
                | DecisionKind::Record { .. }
                | DecisionKind::Moving { .. }
                | DecisionKind::MoveOver { .. } => {}
            }
        }
        events
    }
}

/// Whether [`EngineEvents::of`] makes an event of `d` that [`written`] can confirm.
fn has_event(d: &Decision) -> bool {
    matches!(
        d.kind,
        DecisionKind::Schedule { .. } | DecisionKind::Unschedule { .. }
    )
}

/// Whether `snapshot` holds what `d` wrote: only the leader writes schedules, so a
/// schedule's entry as it wrote it, or an unscheduled entry gone, is its write. An
/// unschedulable reason is not confirmed: the reason it replaces may read the same.
fn written(d: &Decision, snapshot: &Snapshot) -> bool {
    let entry = |unit: &UnitName, machine: &MachineId| {
        snapshot.schedule.get(unit).and_then(|on| on.get(machine))
    };
    match &d.kind {
        DecisionKind::Schedule { unit, machine, .. } => {
            entry(unit, machine).is_some_and(|e| Some(e) == d.kind.schedule_entry().as_ref())
        }
        DecisionKind::Unschedule { unit, machine, .. } => entry(unit, machine).is_none(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::{DesiredState, UnitHash};

    fn unit() -> UnitName {
        "web.service".parse().unwrap()
    }

    fn m(id: &str) -> MachineId {
        id.parse().unwrap()
    }

    fn schedule(machine: &str) -> Decision {
        Decision {
            kind: DecisionKind::Schedule {
                unit: unit(),
                machine: m(machine),
                hash: UnitHash::of_bytes(b"x"),
                desired: DesiredState::Launched,
                restart: 0,
                no_restart: false,
                placement: 0,
            },
            reason: Reason::NotScheduled {
                desired: DesiredState::Launched,
            },
        }
    }

    fn unschedule(machine: &str, reason: Reason) -> Decision {
        Decision {
            kind: DecisionKind::Unschedule {
                unit: unit(),
                machine: m(machine),
                left: None,
            },
            reason,
        }
    }

    #[test]
    fn a_schedule_after_a_lost_machine_is_a_move_naming_both_machines() {
        let mut events = EngineEvents::new(EventSink::off());
        let lost = Reason::MachineGone { machine: m("m1") };
        let first = events.of(&[unschedule("m1", lost)]);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].kind, EventKind::Unscheduled);
        // The schedule may come in a later pass.
        let later = events.of(&[schedule("m2")]);
        assert_eq!(later.len(), 1);
        let moved = &later[0];
        assert_eq!(moved.kind, EventKind::Moved);
        assert_eq!(moved.from, Some(m("m1")));
        assert_eq!(moved.machine, Some(m("m2")));
        assert!(
            moved.reason.starts_with("machine m1 lost"),
            "{}",
            moved.reason
        );
        // Once moved, the next schedule is a schedule.
        assert_eq!(events.of(&[schedule("m3")])[0].kind, EventKind::Scheduled);
    }

    #[test]
    fn a_stopped_unit_scheduled_again_is_no_move() {
        let mut events = EngineEvents::new(EventSink::off());
        let out = events.of(&[unschedule("m1", Reason::TargetInactive), schedule("m2")]);
        let kinds: Vec<_> = out.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [EventKind::Unscheduled, EventKind::Scheduled]);
        assert_eq!(out[0].reason, "target state inactive");
    }

    #[test]
    fn an_unschedulable_unit_says_why_and_bookkeeping_says_nothing() {
        let mut events = EngineEvents::new(EventSink::off());
        let stuck = Decision {
            kind: DecisionKind::Unschedulable { unit: unit() },
            reason: Reason::NoMachines,
        };
        let clear = Decision {
            kind: DecisionKind::ClearUnschedulable { unit: unit() },
            reason: Reason::NowPlaced,
        };
        let out = events.of(&[stuck, clear]);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].kind, EventKind::Unschedulable);
        assert_eq!(out[0].reason, "zero machines available");
    }
}
