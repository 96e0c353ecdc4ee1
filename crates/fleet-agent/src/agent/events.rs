//! What the agent did to its units, as events (issue 41): a unit started (or restarted),
//! stopped, removed from this machine, or its task failed with what systemd said (the job's
//! end, the service's `Result` and its main process's exit status); and a unit that had
//! crashed since it last started, when the agent starts it again: `failed` with what systemd
//! said of that crash (unless the agent told that failure already, when it saw the unit
//! failed: [`super::observed`]), then `started`. Built from a pass's plan
//! and outcome, after the tasks ran; the agent hands them to its machine's writer, which never
//! waits. Pure: no I/O here.

use fleet_core::{MachineId, UnitName};
use fleet_registry::{Event, EventKind};

use crate::executor::Outcome;
use crate::plan::{Task, TaskKind};

/// The events of the `planned` tasks as `outcome` says they ended, in the plan's order. A
/// task after the one of its unit that failed was skipped: it says nothing. A revived unit
/// whose failure `told` says was told already is not said to have failed again.
pub(super) fn of(
    planned: &[Task],
    outcome: &Outcome,
    machine: &MachineId,
    told: impl Fn(&UnitName) -> bool,
) -> Vec<Event> {
    let mut events = Vec::new();
    for t in planned {
        let failed = outcome.failed.get(&t.unit);
        if let Some(died) = outcome.revived.get(&t.unit)
            && matches!(t.kind, TaskKind::Start | TaskKind::Restart)
            && !told(&t.unit)
        {
            let said = died.to_string();
            let reason = format!("it had failed{}", if said.is_empty() { "" } else { &said });
            events.push(
                Event::now(EventKind::Failed, reason)
                    .unit(&t.unit)
                    .on(machine),
            );
        }
        let event = match failed {
            Some(e) if e.kind() == t.kind => Event::now(EventKind::Failed, e.to_string()),
            Some(e) if t.kind > e.kind() => continue,
            _ => match t.kind {
                TaskKind::Start => Event::now(EventKind::Started, t.reason.to_string()),
                TaskKind::Restart => {
                    Event::now(EventKind::Started, format!("restarted: {}", t.reason))
                }
                TaskKind::Stop => Event::now(EventKind::Stopped, t.reason.to_string()),
                TaskKind::Unload => Event::now(EventKind::Removed, t.reason.to_string()),
                TaskKind::Load | TaskKind::ReloadUnitFiles => continue,
            },
        };
        events.push(event.unit(&t.unit).on(machine));
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::{Failure, TaskError};
    use crate::manager::JobOutcome;
    use crate::plan::Reason;

    fn task(unit: &str, kind: TaskKind, reason: Reason) -> Task {
        Task {
            kind,
            unit: unit.parse::<UnitName>().unwrap(),
            reason,
        }
    }

    #[test]
    fn a_failed_start_says_what_systemd_said_and_the_other_units_say_what_they_did() {
        let machine: MachineId = "m1".parse().unwrap();
        let launched = Reason::LaunchAfterLoad;
        let planned = vec![
            task("gone.service", TaskKind::Unload, Reason::NotScheduledHere),
            task("a.service", TaskKind::Load, Reason::FileMissing),
            task("a.service", TaskKind::Start, launched.clone()),
            task("b.service", TaskKind::Start, launched.clone()),
        ];
        let mut outcome = Outcome::default();
        outcome.failed.insert(
            "b.service".parse().unwrap(),
            TaskError::Job(TaskKind::Start, JobOutcome::Failed, Failure::default()),
        );
        let events = of(&planned, &outcome, &machine, |_| false);
        let said: Vec<(EventKind, String)> = events
            .iter()
            .map(|e| (e.kind, e.unit.as_ref().unwrap().to_string()))
            .collect();
        assert_eq!(
            said,
            [
                (EventKind::Removed, "gone.service".to_owned()),
                (EventKind::Started, "a.service".to_owned()),
                (EventKind::Failed, "b.service".to_owned()),
            ]
        );
        assert!(events.iter().all(|e| e.machine.as_ref() == Some(&machine)));
        assert!(
            events[2].reason.starts_with("start job ended"),
            "{}",
            events[2].reason
        );
    }

    #[test]
    fn a_unit_that_crashed_is_failed_with_its_exit_status_then_started_again() {
        use crate::manager::MainExit;
        let planned = vec![task("c.service", TaskKind::Start, Reason::LaunchAfterLoad)];
        let mut outcome = Outcome::default();
        let crash = Failure {
            result: Some("exit-code".into()),
            main_exit: MainExit::from_code(1, 3),
        };
        outcome.revived.insert("c.service".parse().unwrap(), crash);
        let machine = "m1".parse().unwrap();
        let events = of(&planned, &outcome, &machine, |_| false);
        let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [EventKind::Failed, EventKind::Started]);
        assert!(
            events[0].reason.contains("exit-code"),
            "{}",
            events[0].reason
        );
        let told = of(&planned, &outcome, &machine, |_| true);
        let kinds: Vec<EventKind> = told.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [EventKind::Started],
            "its failure was told when seen"
        );
    }

    #[test]
    fn the_tasks_after_a_failed_one_say_nothing() {
        let planned = vec![
            task("a.service", TaskKind::Stop, Reason::NotScheduledHere),
            task("a.service", TaskKind::Start, Reason::LaunchAfterLoad),
        ];
        let mut outcome = Outcome::default();
        outcome.failed.insert(
            "a.service".parse().unwrap(),
            TaskError::Job(TaskKind::Stop, JobOutcome::Failed, Failure::default()),
        );
        let events = of(&planned, &outcome, &"m1".parse().unwrap(), |_| false);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind, EventKind::Failed);
    }
}
