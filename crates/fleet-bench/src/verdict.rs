//! The verdicts on issue 43's goals (and issue 41's figures of events): each goal, what was
//! measured, and `met` or `missed` with the amount. Pure: the scenarios pass their figures
//! in; a goal stated for a size the run did not reach is missed, and says so.

use std::time::Duration;

use crate::report::{Table, secs};

/// One goal's verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub goal: String,
    pub measured: String,
    pub met: bool,
}

impl Verdict {
    /// `verdict: met: GOAL: MEASURED`, as a run prints it.
    pub fn line(&self) -> String {
        let word = if self.met { "met" } else { "missed" };
        format!("verdict: {word}: {}: {}", self.goal, self.measured)
    }
}

/// The verdicts as a Markdown table.
pub fn table(verdicts: &[Verdict]) -> String {
    let mut t = Table::new(&["goal", "measured", ""]);
    for v in verdicts {
        let word = crate::report::verdict(v.met);
        t.row(vec![v.goal.clone(), v.measured.clone(), word.into()]);
    }
    t.render()
}

/// `12.30 s (47.70 s under)` or `(2.10 s over)`, against `target`.
pub fn against(took: Duration, target: Duration) -> String {
    let (d, word) = if took <= target {
        (target - took, "under")
    } else {
        (took - target, "over")
    };
    format!("{} ({} {word})", secs(took), secs(d))
}

/// Where a run's size falls short of a goal's, the words that say so.
pub fn size_note(units: usize, machines: usize, goal_units: usize, goal_machines: usize) -> String {
    if units >= goal_units && machines >= goal_machines {
        String::new()
    } else {
        format!("; ran at {units} units on {machines} machines, not the goal's size")
    }
}

/// 100,000 units on 5,000 machines launched in < 60 s, with no request past its deadline and
/// no lease lost.
pub fn launch(
    units: usize,
    machines: usize,
    launched_in: Duration,
    past_deadline: u64,
    leases_lost: u64,
) -> Verdict {
    let target = Duration::from_secs(60);
    let size = size_note(units, machines, 100_000, 5000);
    Verdict {
        goal: "100,000 units on 5,000 machines launched < 60 s, no request past its deadline, \
               no lease lost"
            .into(),
        measured: format!(
            "{}, {past_deadline} past their deadline, {leases_lost} leases lost{size}",
            against(launched_in, target)
        ),
        met: size.is_empty() && launched_in < target && past_deadline == 0 && leases_lost == 0,
    }
}

/// Lost machines' units running elsewhere within `target` (TTL + 5 s after a crash).
pub fn machine_loss(
    recovered_in: Duration,
    target: Duration,
    how: &str,
    units: usize,
    machines: usize,
) -> Verdict {
    let size = size_note(units, machines, 100_000, 5000);
    Verdict {
        goal: format!(
            "machines lost ({how}) at 100,000 units: their units running elsewhere within {}",
            secs(target)
        ),
        measured: format!("{}{size}", against(recovered_in, target)),
        met: size.is_empty() && recovered_in <= target,
    }
}

/// The engine leader's machine lost: a new leader resumes within TTL + 5 s, re-placing
/// nothing that ran elsewhere.
pub fn leader_loss(recovered_in: Duration, replaced: usize, ttl: Duration) -> Verdict {
    let target = ttl + Duration::from_secs(5);
    Verdict {
        goal: format!(
            "the engine leader's machine lost: its units running elsewhere within TTL + 5 s \
             ({}), nothing else re-placed",
            secs(target)
        ),
        measured: format!(
            "{}, {replaced} other units re-placed",
            against(recovered_in, target)
        ),
        met: recovered_in <= target && replaced == 0,
    }
}

/// Issue 41: the launch with events on within 5 % of off.
pub fn events_cost(on: Duration, off: Duration, within: f64) -> Verdict {
    let cost = on.as_secs_f64() / off.as_secs_f64().max(1e-9) - 1.0;
    Verdict {
        goal: format!(
            "events on cost the launch within {:.0} % of events off",
            within * 100.0
        ),
        measured: format!(
            "{:+.1} % (on {}, off {})",
            cost * 100.0,
            secs(on),
            secs(off)
        ),
        met: cost <= within,
    }
}

/// Issue 41: the events' keys and values in etcd within `per_unit` bytes a unit launched.
pub fn events_space(keys: u64, bytes: u64, units: usize, per_unit: u64) -> Verdict {
    let bound = per_unit * units as u64;
    Verdict {
        goal: format!("events' etcd space ≤ {per_unit} B per unit launched"),
        measured: format!(
            "{keys} keys of events, {:.1} MiB ({:.0} B per unit; bound {:.1} MiB)",
            bytes as f64 / 1048576.0,
            bytes as f64 / units.max(1) as f64,
            bound as f64 / 1048576.0
        ),
        met: bytes <= bound,
    }
}

/// Issue 41: `events --follow` printed every one of 1,000 events a second, within `lag`.
pub fn follow(emitted: u64, seen: u64, lag: Option<Duration>, limit: Duration) -> Verdict {
    let lag_text = lag.map_or_else(|| "not all within 10 s".to_owned(), secs);
    Verdict {
        goal: "`fleetctl events --follow` keeps up with 1,000 events a second".into(),
        measured: format!(
            "{seen} of {emitted} printed, the last {lag_text} after the last emitted"
        ),
        met: seen >= emitted && lag.is_some_and(|l| l <= limit),
    }
}

/// The million: launched in < 5 min, and within 5× of etcd's raw time for its keys.
pub fn million(units: usize, machines: usize, launched_in: Option<Duration>) -> Verdict {
    let target = Duration::from_secs(300);
    let size = size_note(units, machines, 1_000_000, 5000);
    Verdict {
        goal: "a million distinct units on 5,000 machines launched < 5 min".into(),
        measured: match launched_in {
            Some(d) => format!("{}{size}", against(d, target)),
            None => format!("not all launched{size}"),
        },
        met: size.is_empty() && launched_in.is_some_and(|d| d < target),
    }
}

/// One machine starting `units` real systemd units within 1.1× of systemd alone (issue 43).
pub fn one_agent(units: usize, fleet: Duration, systemd: Duration) -> Verdict {
    const WITHIN: f64 = 1.1;
    let ratio = fleet.as_secs_f64() / systemd.as_secs_f64().max(1e-3);
    let size = match units >= 3000 {
        true => String::new(),
        false => format!("; ran at {units} units, not the goal's 3,000"),
    };
    Verdict {
        goal: format!(
            "one machine starting 3,000 real systemd units within {WITHIN}× of systemd alone"
        ),
        // Three decimals: 1.105× is over 1.1×, and "1.10×" printed missed looked met.
        measured: format!(
            "{ratio:.3}× ({} against {}){size}",
            secs(fleet),
            secs(systemd)
        ),
        met: size.is_empty() && ratio <= WITHIN,
    }
}

/// A run within `within`× of etcd's raw time for the keys it wrote.
/// `took`: how long it took, or `Err` with how long the bench waited without its getting
/// there (the ratio is then a lower bound, and missed).
pub fn raw_ratio(
    what: &str,
    took: Result<Duration, Duration>,
    raw: Duration,
    within: f64,
) -> Verdict {
    let ratio = |d: Duration| d.as_secs_f64() / raw.as_secs_f64().max(1e-9);
    let goal = format!("{what} within {within}× of etcd's raw time for the keys it wrote");
    match took {
        Ok(took) => Verdict {
            goal,
            measured: format!("{:.1}× ({} against {})", ratio(took), secs(took), secs(raw)),
            met: ratio(took) <= within,
        },
        Err(waited) => Verdict {
            goal,
            measured: format!(
                "more than {:.1}× (not reached in the {} waited, against {})",
                ratio(waited),
                secs(waited),
                secs(raw)
            ),
            met: false,
        },
    }
}

/// `v` for a run whose submit stopped after `written` of `units` units on `error`: missed,
/// whatever the figures of the units written say, and the stop is told in its measure.
pub fn stopped(v: Verdict, written: usize, units: usize, error: &str) -> Verdict {
    Verdict {
        measured: format!(
            "{}; the submit stopped with {written} of {units} units written: {error}",
            v.measured
        ),
        met: false,
        ..v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn a_launch_at_the_goals_size_under_a_minute_without_timeouts_is_met() {
        let v = launch(100_000, 5000, S(42), 0, 0);
        assert!(v.met, "{v:?}");
        assert!(v.measured.starts_with("42.00 s (18.00 s under)"), "{v:?}");
    }

    #[test]
    fn one_agent_within_a_tenth_of_systemd_at_3000_units_is_met() {
        let ms = Duration::from_millis;
        assert!(one_agent(3000, ms(5400), ms(5000)).met);
        let v = one_agent(3000, ms(5800), ms(5000));
        assert!(!v.met && v.measured.starts_with("1.160×"), "{v:?}");
        let v = one_agent(3000, ms(5525), ms(5000));
        assert!(
            !v.met && v.measured.starts_with("1.105×"),
            "just over: {v:?}"
        );
        assert!(!one_agent(300, ms(500), ms(500)).met, "too small a run");
    }

    #[test]
    fn a_launch_with_one_request_past_its_deadline_is_missed() {
        assert!(!launch(100_000, 5000, S(42), 1, 0).met);
        assert!(!launch(100_000, 5000, S(42), 0, 1).met);
    }

    #[test]
    fn a_run_smaller_than_the_goal_is_missed_and_says_so() {
        let v = launch(4000, 200, S(3), 0, 0);
        assert!(!v.met);
        assert!(v.measured.contains("not the goal's size"), "{v:?}");
    }

    #[test]
    fn a_leader_loss_that_re_places_a_unit_is_missed() {
        assert!(leader_loss(S(20), 0, S(30)).met);
        assert!(!leader_loss(S(20), 1, S(30)).met);
        assert!(!leader_loss(S(36), 0, S(30)).met);
    }

    #[test]
    fn the_events_cost_is_the_launch_with_events_against_without() {
        let v = events_cost(Duration::from_millis(10_400), S(10), 0.05);
        assert!(v.met);
        assert!(v.measured.starts_with("+4.0 %"), "{v:?}");
        assert!(!events_cost(S(11), S(10), 0.05).met);
    }

    #[test]
    fn a_verdict_line_says_met_or_missed_first() {
        let v = raw_ratio("the million", Ok(S(100)), S(40), 5.0);
        assert!(v.met);
        assert!(
            v.line().starts_with("verdict: met: the million within 5× "),
            "{}",
            v.line()
        );
        assert!(!raw_ratio("x", Ok(S(300)), S(40), 5.0).met);
    }

    #[test]
    fn a_goal_met_by_the_units_written_before_the_submit_stopped_is_missed() {
        let v = stopped(
            raw_ratio("the million", Ok(S(100)), S(40), 5.0),
            150_000,
            1_000_000,
            "reading units: etcd request timed out after 3s",
        );
        assert!(!v.met, "{v:?}");
        assert!(
            v.measured.starts_with("2.5× (")
                && v.measured.ends_with(
                    "; the submit stopped with 150000 of 1000000 units written: reading \
                     units: etcd request timed out after 3s"
                ),
            "{v:?}"
        );
    }

    #[test]
    fn a_ratio_never_reached_is_a_lower_bound_and_missed() {
        let v = raw_ratio("the million", Err(S(100)), S(40), 5.0);
        assert!(!v.met);
        assert!(
            v.measured.starts_with("more than 2.5× (not reached"),
            "{v:?}"
        );
    }
}
