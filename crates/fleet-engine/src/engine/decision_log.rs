//! One log line per executed decision (after the write succeeded): a static message, the data
//! in fields (docs/engine.md, "Logs"). Only logs; never decides.
//!
//! The field `machine` is the engine's own machine: its span (`engine{machine=…}`) carries it,
//! and journald takes a span's fields for an event's. The machine a decision is about has a
//! field of its own (`to`, `on`, `from`), else "scheduling unit machine=M" (the target) and
//! "unit cannot be scheduled machine=L" (the leader, from its span) read as the same thing
//! (issue 38).

use fleet_registry::LeftCopy;
use tracing::{debug, info, warn};

use crate::scheduler::{Decision, DecisionKind, Reason};

/// Logs `decision` at the level it deserves.
pub(super) fn log(decision: &Decision) {
    let reason = &decision.reason;
    match &decision.kind {
        DecisionKind::Unschedule {
            unit,
            machine,
            left,
        } => {
            let record_left = left.map_or("no", LeftCopy::as_str);
            info!(unit = %unit, from = %machine, reason = %reason, record_left, "unscheduling unit");
        }
        DecisionKind::Forget { unit, machine } => {
            debug!(unit = %unit, from = %machine, reason = %reason, "forgetting that unit left machine");
        }
        DecisionKind::Record {
            unit,
            machine,
            copy,
        } => {
            debug!(unit = %unit, from = %machine, copy = %copy, reason = %reason, "recording the copy a unit left");
        }
        DecisionKind::Update {
            unit,
            machine,
            hash,
            desired,
            ..
        } => {
            info!(unit = %unit, on = %machine, hash = %hash, desired = %desired, reason = %reason, "updating unit in place");
        }
        DecisionKind::Schedule {
            unit,
            machine,
            hash,
            desired,
            ..
        } => {
            info!(unit = %unit, to = %machine, hash = %hash, desired = %desired, reason = %reason, "scheduling unit");
        }
        DecisionKind::Unschedulable { unit } if expected_wait(reason) => {
            info!(unit = %unit, reason = %reason, "unit cannot be scheduled yet");
        }
        DecisionKind::Unschedulable { unit } => {
            warn!(unit = %unit, reason = %reason, "unit cannot be scheduled");
        }
        DecisionKind::ClearUnschedulable { unit } => {
            info!(unit = %unit, reason = %reason, "unit no longer unschedulable");
        }
        DecisionKind::Moving { unit, from } => {
            info!(unit = %unit, from = %from, reason = %reason, "moving unit off drained machine");
        }
        DecisionKind::MoveOver { unit } => {
            info!(unit = %unit, reason = %reason, "drain move over");
        }
    }
}

/// A unit held back while its previous copy stops is the normal middle of every move (a
/// drain, a reschedule, a lost constraint): not worth a warning. A copy that does not stop is:
/// `copies.rs` warns when units have waited long ("units still wait for a previous copy that
/// does not stop").
fn expected_wait(reason: &Reason) -> bool {
    matches!(reason, Reason::WaitingForPreviousCopy { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::{DesiredState, MachineId, UnitHash, UnitName};
    use std::sync::{Arc, Mutex};
    use tracing::field::{Field, Visit};
    use tracing::{Event, Level, Subscriber};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

    /// An event as logged: level, message, and its fields by name.
    #[derive(Debug, Default, Clone)]
    struct Line {
        level: Option<Level>,
        message: String,
        fields: Vec<(String, String)>,
    }

    impl Visit for Line {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            let value = format!("{value:?}");
            match field.name() {
                "message" => self.message = value,
                name => self.fields.push((name.to_owned(), value)),
            }
        }

        fn record_str(&mut self, field: &Field, value: &str) {
            self.record_debug(field, &value);
        }
    }

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<Line>>>);

    impl<S: Subscriber> Layer<S> for Lines {
        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            let mut line = Line {
                level: Some(*event.metadata().level()),
                ..Line::default()
            };
            event.record(&mut line);
            self.0.lock().unwrap().push(line);
        }
    }

    /// What [`log`] writes for `decision`.
    fn logged(decision: &Decision) -> Line {
        let lines = Lines::default();
        let subscriber = tracing_subscriber::registry().with(lines.clone());
        tracing::subscriber::with_default(subscriber, || log(decision));
        let mut all = lines.0.lock().unwrap().clone();
        assert_eq!(all.len(), 1, "{all:?}");
        all.remove(0)
    }

    fn unit() -> UnitName {
        "web.service".parse().unwrap()
    }

    fn machine(id: &str) -> MachineId {
        id.parse().unwrap()
    }

    fn names(line: &Line) -> Vec<&str> {
        line.fields.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// One test for every line, so that one thread-scoped subscriber sees them all.
    #[test]
    fn the_machine_a_decision_is_about_never_takes_the_spans_machine_field_and_waits_are_info() {
        let target = machine("m2");
        let schedule = Decision {
            kind: DecisionKind::Schedule {
                unit: unit(),
                machine: target.clone(),
                hash: UnitHash::of_bytes(b"x"),
                desired: DesiredState::Launched,
                restart: 0,
                no_restart: false,
                placement: 0,
            },
            reason: Reason::NotScheduled {
                desired: DesiredState::Launched,
            },
        };
        let line = logged(&schedule);
        assert_eq!(line.message, "scheduling unit");
        assert!(
            line.fields.contains(&("to".into(), "m2".into())),
            "{line:?}"
        );
        let unschedule = Decision {
            kind: DecisionKind::Unschedule {
                unit: unit(),
                machine: target.clone(),
                left: None,
            },
            reason: Reason::TargetInactive,
        };
        let line = logged(&unschedule);
        assert!(
            line.fields.contains(&("from".into(), "m2".into())),
            "{line:?}"
        );
        for line in [logged(&schedule), line] {
            assert!(!names(&line).contains(&"machine"), "{line:?}");
        }

        // The normal middle of a move: info, and said to be temporary.
        let waiting = Decision {
            kind: DecisionKind::Unschedulable { unit: unit() },
            reason: Reason::WaitingForPreviousCopy {
                machine: target.clone(),
            },
        };
        let line = logged(&waiting);
        assert_eq!(line.level, Some(Level::INFO), "{line:?}");
        assert_eq!(line.message, "unit cannot be scheduled yet");
        // What needs an operator stays a warning.
        let stuck = Decision {
            kind: DecisionKind::Unschedulable { unit: unit() },
            reason: Reason::NoMachines,
        };
        let line = logged(&stuck);
        assert_eq!(line.level, Some(Level::WARN), "{line:?}");
        assert_eq!(line.message, "unit cannot be scheduled");
    }
}
