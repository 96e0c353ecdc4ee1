use super::*;

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn state(active: &str, sub: &str) -> SystemdState {
    SystemdState {
        load: "loaded".into(),
        active: active.into(),
        sub: sub.into(),
    }
}

fn facts(n_restarts: u32, result: &str, main_exit: Option<MainExit>) -> UnitFacts {
    UnitFacts {
        n_restarts,
        since: Some(1_000),
        result: Some(result.into()),
        main_exit,
    }
}

fn kinds(events: &[Event]) -> Vec<EventKind> {
    events.iter().map(|e| e.kind).collect()
}

const EXIT_3: Option<MainExit> = Some(MainExit::Exited(3));

#[test]
fn a_unit_the_agent_started_is_told_active_once() {
    let (mut o, a, m) = (
        Observed::default(),
        name("a.service"),
        "m1".parse().unwrap(),
    );
    o.started(&a, false);
    let running = state("active", "running");
    let told = o.saw(&a, &running, &facts(0, "success", None), &m);
    assert_eq!(kinds(&told), [EventKind::Active]);
    assert_eq!(told[0].reason, "active (running)");
    assert_eq!(told[0].unit.as_ref(), Some(&a));
    assert_eq!(told[0].machine.as_ref(), Some(&m));
    assert!(
        o.saw(&a, &running, &facts(0, "success", None), &m)
            .is_empty()
    );
}

#[test]
fn a_unit_running_before_the_agent_saw_it_is_not_told_active_or_restarted() {
    let (mut o, a, m) = (
        Observed::default(),
        name("a.service"),
        "m1".parse().unwrap(),
    );
    let told = o.saw(
        &a,
        &state("active", "running"),
        &facts(5, "success", None),
        &m,
    );
    assert!(told.is_empty(), "{told:?}");
    assert_eq!(o.history(&a).unwrap().restarts, 5, "systemd's count here");
}

#[test]
fn systemd_restarts_are_told_with_the_count_and_the_last_exit() {
    let (mut o, a, m) = (
        Observed::default(),
        name("a.service"),
        "m1".parse().unwrap(),
    );
    o.started(&a, false);
    o.saw(
        &a,
        &state("active", "running"),
        &facts(0, "success", None),
        &m,
    );
    // Between two runs: systemd waits RestartSec, the exit still known.
    let waiting = state("activating", "auto-restart");
    assert!(
        o.saw(&a, &waiting, &facts(0, "exit-code", EXIT_3), &m)
            .is_empty()
    );
    // Running again: systemd forgot the exit, the agent did not.
    let told = o.saw(
        &a,
        &state("active", "running"),
        &facts(1, "exit-code", None),
        &m,
    );
    assert_eq!(kinds(&told), [EventKind::RestartedBySystemd]);
    assert_eq!(
        told[0].reason,
        "systemd restarted it after exit status 3 (1 restarts here)"
    );
    let history = o.history(&a).unwrap();
    assert_eq!(history.restarts, 1);
    assert_eq!(history.exit.as_deref(), Some("exit status 3"));
    assert_eq!(history.since, Some(1_000));
}

#[test]
fn a_failure_is_told_once_and_its_revival_counts_a_restart() {
    let (mut o, a, m) = (
        Observed::default(),
        name("a.service"),
        "m1".parse().unwrap(),
    );
    o.started(&a, false);
    o.saw(
        &a,
        &state("active", "running"),
        &facts(0, "success", None),
        &m,
    );
    let failed = state("failed", "failed");
    let told = o.saw(&a, &failed, &facts(0, "exit-code", EXIT_3), &m);
    assert_eq!(kinds(&told), [EventKind::Failed]);
    assert_eq!(
        told[0].reason,
        "systemd shows it failed (result exit-code, exit status 3)"
    );
    assert!(o.told_failed(&a), "the revival must not tell it again");
    assert!(
        o.saw(&a, &failed, &facts(0, "exit-code", EXIT_3), &m)
            .is_empty()
    );
    // The agent starts it again: a restart after failing, then active again.
    o.started(&a, true);
    assert_eq!(o.history(&a).unwrap().restarts, 1);
    let told = o.saw(
        &a,
        &state("active", "running"),
        &facts(0, "success", None),
        &m,
    );
    assert_eq!(kinds(&told), [EventKind::Active]);
    assert!(!o.told_failed(&a));
    // Its next failure is a new one.
    let told = o.saw(&a, &failed, &facts(0, "exit-code", EXIT_3), &m);
    assert_eq!(kinds(&told), [EventKind::Failed]);
}

#[test]
fn restarts_survive_systemd_counting_afresh_and_a_fresh_start_counts_from_zero() {
    let (mut o, a, m) = (
        Observed::default(),
        name("a.service"),
        "m1".parse().unwrap(),
    );
    let running = state("active", "running");
    o.started(&a, false);
    o.saw(&a, &running, &facts(0, "success", None), &m);
    o.saw(
        &a,
        &state("activating", "auto-restart"),
        &facts(4, "exit-code", EXIT_3),
        &m,
    );
    // systemd gave up (start-limit-hit); the agent revives it and systemd counts afresh.
    o.saw(
        &a,
        &state("failed", "failed"),
        &facts(4, "start-limit-hit", EXIT_3),
        &m,
    );
    o.started(&a, true);
    let told = o.saw(&a, &running, &facts(0, "success", None), &m);
    assert_eq!(kinds(&told), [EventKind::Active]);
    assert_eq!(
        o.history(&a).unwrap().restarts,
        5,
        "4 by systemd, 1 by the agent"
    );
    let told = o.saw(
        &a,
        &state("activating", "auto-restart"),
        &facts(1, "exit-code", EXIT_3),
        &m,
    );
    assert_eq!(kinds(&told), [EventKind::RestartedBySystemd]);
    assert_eq!(o.history(&a).unwrap().restarts, 6);
    // Stopped and started anew (not after a failure): counted from there, the exit kept.
    o.started(&a, false);
    o.saw(&a, &running, &facts(1, "success", None), &m);
    let history = o.history(&a).unwrap();
    assert_eq!(history.restarts, 0, "systemd's 1 was before the start");
    assert_eq!(history.exit.as_deref(), Some("exit status 3"));
}

#[test]
fn stale_units_are_those_never_read_in_another_state_or_started_since() {
    let (mut o, m) = (Observed::default(), "m1".parse().unwrap());
    let (a, b, c) = (name("a.service"), name("b.service"), name("c.service"));
    let running = state("active", "running");
    let failed = state("failed", "failed");
    o.saw(&a, &running, &facts(0, "success", None), &m);
    o.saw(&b, &running, &facts(0, "success", None), &m);
    o.saw(&c, &running, &facts(0, "success", None), &m);
    o.started(&c, false);
    let d = name("d.service");
    let now = [
        (&a, &running),
        (&b, &failed),
        (&c, &running),
        (&d, &running),
    ];
    assert_eq!(o.stale(now), [b, c, d.clone()]);
    o.retain(|n| *n != a);
    assert!(o.history(&a).is_none());
    assert!(o.history(&d).is_none(), "never read");
}

#[test]
fn an_exit_says_systemds_result_only_when_the_exit_does_not_imply_it() {
    let cases = [
        (Some("exit-code"), MainExit::Exited(3), "exit status 3"),
        (Some("success"), MainExit::Exited(0), "exit status 0"),
        (Some("signal"), MainExit::Killed(9), "killed by signal 9"),
        (
            Some("timeout"),
            MainExit::Killed(15),
            "killed by signal 15, result timeout",
        ),
        (
            Some("core-dump"),
            MainExit::Dumped(11),
            "killed by signal 11, core dumped",
        ),
        (None, MainExit::Exited(1), "exit status 1"),
    ];
    for (result, exit, text) in cases {
        assert_eq!(exit_text(result, exit), text, "{result:?} {exit:?}");
    }
}

/// One agent starting 3,000 real units read five properties of each once it was active
/// (issue 43's one-agent figure): a fresh start that is active needs only its `since`.
#[test]
fn only_the_since_of_a_unit_started_afresh_and_active_is_left_to_read() {
    let (mut o, a, m) = (
        Observed::default(),
        name("a.service"),
        "m1".parse().unwrap(),
    );
    let running = state("active", "running");
    o.started(&a, false);
    let known = o.started_active(&a, &running).unwrap();
    assert_eq!(
        (known.n_restarts, known.result.clone(), known.main_exit),
        (0, None, None)
    );
    assert!(o.started_active(&a, &state("failed", "failed")).is_none());
    assert!(
        o.started_active(&a, &state("activating", "start"))
            .is_none()
    );
    let told = o.saw(
        &a,
        &running,
        &UnitFacts {
            since: Some(7),
            ..known
        },
        &m,
    );
    assert_eq!(kinds(&told), [EventKind::Active]);
    let history = o.history(&a).unwrap();
    assert_eq!((history.restarts, history.since), (0, Some(7)));
    // Read since: the next read is whole.
    assert!(o.started_active(&a, &running).is_none());
    // A revival is read whole.
    o.started(&a, true);
    assert!(o.started_active(&a, &running).is_none());
}

/// A unit systemd restarted before is read whole after the agent's fresh start: its count
/// of restarts, which a start may or may not have begun afresh, is systemd's to say. Two
/// restarts after the start are then told and counted, not hidden behind the old count.
#[test]
fn a_unit_with_restarts_counted_is_read_whole_after_a_fresh_start() {
    let (mut o, a, m) = (
        Observed::default(),
        name("a.service"),
        "m1".parse().unwrap(),
    );
    let running = state("active", "running");
    o.started(&a, false);
    o.saw(&a, &running, &facts(0, "success", None), &m);
    o.saw(&a, &running, &facts(2, "success", None), &m);
    o.saw(
        &a,
        &state("failed", "failed"),
        &facts(2, "exit-code", EXIT_3),
        &m,
    );
    o.started(&a, false);
    assert!(o.started_active(&a, &running).is_none());
    // The whole read says systemd began afresh; two restarts later are two.
    o.saw(&a, &running, &facts(0, "success", None), &m);
    let told = o.saw(&a, &running, &facts(2, "success", None), &m);
    assert_eq!(kinds(&told), [EventKind::RestartedBySystemd]);
    assert_eq!(o.history(&a).unwrap().restarts, 2);
}
