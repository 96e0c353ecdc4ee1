//! The chaos soak's invariant checker: pure, on what the recorders saw (runs of units in
//! every machine's systemd, changes of schedule entries in etcd's history, the faults'
//! windows). No I/O, so its rules are tested on their own below.
//!
//! A *run* is one InvocationID of a unit on a machine, from the first poll that saw it running
//! to the last; it *ended* at the first later poll of that machine that did not. A *window* is
//! a span in which one machine is excused something, of one of two kinds
//! (docs/guarantees.md, promise 2):
//! - [`WindowKind::Partition`]: the machine is cut off the network (from etcd and from every
//!   peer) while its fleetd lives, until it can read its schedule again. It keeps its copies
//!   while the engine starts them elsewhere: the one documented double run.
//! - [`WindowKind::Fenced`]: the machine's fleetd is stopped or hung for longer than the
//!   agent TTL, from the earliest moment its fence may fire to the latest moment it has
//!   stopped everything. Its fence stops its non-global units before the engine moves them,
//!   so it excuses those stops and never a double run.
//!
//! A fleetd killed and restarted within the TTL has no window at all: its fence is pushed
//! forward before it fires and its lease is resumed, so nothing stops and nothing moves.
//!
//! The rules:
//! - a non-global unit has at most one run at a time; two runs overlap only while one of
//!   their machines is inside a partition window;
//! - a run ends only for a reason: a user's operation on that unit (`stop`, `destroy`,
//!   `start --replace`) issued while it ran, each used for one run at most; or a move off a
//!   machine inside a partition window (a change or deletion of its schedule entry on that
//!   machine while the machine was cut off), each change used for one run at most; or the
//!   fence of its machine inside a fenced window; or its machine lost power. Any other stop
//!   is a violation, the engine's own moves and restarts in place included: a schedule change
//!   alone justifies nothing, since the engine writes those too (after a mass lease expiry,
//!   say).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// How far apart a recorder's clock reading and the event it records may be: a poll round
/// of every machine, or a watch event delivered late.
pub const SLACK: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    pub machine: String,
    pub unit: String,
    pub invocation: String,
    pub first: Instant,
    pub last_seen: Instant,
    /// The first poll of its machine that no longer saw it running.
    pub ended: Option<Instant>,
}

/// A schedule entry of `unit` on `machine` changed (or was deleted) at `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub at: Instant,
    pub machine: String,
    pub unit: String,
}

/// What the client loop asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verb {
    Start,
    Stop,
    Destroy,
    Replace,
}

impl Verb {
    /// Whether the operation may stop a running copy of its unit. A plain `start` never does
    /// (a unit already in the registry keeps its content).
    fn may_stop(self) -> bool {
        match self {
            Verb::Start => false,
            Verb::Stop | Verb::Destroy | Verb::Replace => true,
        }
    }
}

/// One fleetctl operation of the client loop on `unit`, started at `at`. A failed one counts
/// too: a request that timed out may have been applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub at: Instant,
    pub unit: String,
    pub verb: Verb,
    pub succeeded: bool,
}

/// What a window excuses (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// Cut off the network with fleetd alive: double runs, and stops that move a unit off it.
    Partition,
    /// fleetd stopped or hung past the TTL: stops of its runs (its fence), never double runs.
    Fenced,
}

/// `machine` inside a documented window of `kind` from `from` to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub kind: WindowKind,
    pub machine: String,
    pub from: Instant,
    pub to: Instant,
}

#[derive(Debug, Default)]
pub struct Record {
    pub runs: Vec<RunRecord>,
    pub changes: Vec<Change>,
    pub ops: Vec<Op>,
    pub windows: Vec<Window>,
    /// Machines that lost power, and when.
    pub power_lost: BTreeMap<String, Instant>,
}

/// Every broken rule, described for the soak's output; empty when all hold.
pub fn violations(record: &Record, start: Instant) -> Vec<String> {
    let mut out = double_runs(record, start);
    out.extend(unjustified_stops(record, start));
    out
}

fn secs(at: Instant, start: Instant) -> f64 {
    at.saturating_duration_since(start).as_secs_f64()
}

/// Whether `machine` is inside a window of `kind` from `from` to `to`.
fn inside_window(
    record: &Record,
    kind: WindowKind,
    machine: &str,
    from: Instant,
    to: Instant,
) -> bool {
    record
        .windows
        .iter()
        .any(|w| w.kind == kind && w.machine == machine && w.from <= from && to <= w.to)
}

/// How many runs ended inside a fenced window of their machine: the fence's stops, for the
/// soak's report (a fenced window in which nothing stopped proves little).
pub fn fenced_stops(record: &Record) -> usize {
    record
        .runs
        .iter()
        .filter(|r| {
            r.ended
                .is_some_and(|e| inside_window(record, WindowKind::Fenced, &r.machine, e, e))
        })
        .count()
}

fn double_runs(record: &Record, start: Instant) -> Vec<String> {
    let mut out = Vec::new();
    let mut by_unit: BTreeMap<&str, Vec<&RunRecord>> = BTreeMap::new();
    for run in &record.runs {
        by_unit.entry(&run.unit).or_default().push(run);
    }
    for (unit, runs) in by_unit {
        for (i, a) in runs.iter().enumerate() {
            for b in &runs[i + 1..] {
                if a.machine == b.machine {
                    continue;
                }
                let (from, to) = (a.first.max(b.first), a.last_seen.min(b.last_seen));
                if from > to {
                    continue;
                }
                // Only a partition: a fenced machine's copies are stopped before they move.
                if inside_window(record, WindowKind::Partition, &a.machine, from, to)
                    || inside_window(record, WindowKind::Partition, &b.machine, from, to)
                {
                    continue;
                }
                out.push(format!(
                    "{unit} ran on {} (invocation {}) and {} (invocation {}) at once from \
                     {:.1} s to {:.1} s, outside any partition window",
                    a.machine,
                    a.invocation,
                    b.machine,
                    b.invocation,
                    secs(from, start),
                    secs(to, start)
                ));
            }
        }
    }
    out
}

fn unjustified_stops(record: &Record, start: Instant) -> Vec<String> {
    let mut out = Vec::new();
    let mut ended: Vec<(&RunRecord, Instant)> = record
        .runs
        .iter()
        .filter_map(|r| r.ended.map(|e| (r, e)))
        .collect();
    ended.sort_by_key(|(_, e)| *e);
    let mut used_changes: BTreeSet<usize> = BTreeSet::new();
    let mut used_ops: BTreeSet<usize> = BTreeSet::new();
    for (run, end) in ended {
        if record
            .power_lost
            .get(&run.machine)
            .is_some_and(|at| *at <= end)
        {
            continue;
        }
        // The fence and a move off a machine inside a partition first: a stale copy's stop
        // must not use up an operation that a later stop of the live copy needs.
        if inside_window(record, WindowKind::Fenced, &run.machine, end, end) {
            continue;
        }
        let moved = inside_window(record, WindowKind::Partition, &run.machine, end, end)
            .then(|| {
                record.changes.iter().enumerate().find(|(i, c)| {
                    !used_changes.contains(i)
                        && c.machine == run.machine
                        && c.unit == run.unit
                        && c.at + SLACK >= run.first
                        && c.at <= end + SLACK
                })
            })
            .flatten();
        if let Some((i, _)) = moved {
            used_changes.insert(i);
            continue;
        }
        let asked = record.ops.iter().enumerate().find(|(i, op)| {
            !used_ops.contains(i)
                && op.verb.may_stop()
                && op.unit == run.unit
                && op.at + SLACK >= run.first
                && op.at <= end + SLACK
        });
        match asked {
            Some((i, _)) => {
                used_ops.insert(i);
            }
            None => out.push(format!(
                "{} on {} (invocation {}) stopped at {:.1} s without a user operation, a \
                 move off a machine in a partition window or its machine's fence",
                run.unit,
                run.machine,
                run.invocation,
                secs(end, start)
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, s: u64) -> Instant {
        start + Duration::from_secs(s)
    }

    fn run(start: Instant, m: &str, from: u64, to: u64, ended: bool) -> RunRecord {
        RunRecord {
            machine: m.to_owned(),
            unit: "u.service".to_owned(),
            invocation: format!("{m}-{from}"),
            first: at(start, from),
            last_seen: at(start, to),
            ended: ended.then(|| at(start, to + 1)),
        }
    }

    fn change(start: Instant, m: &str, s: u64) -> Change {
        Change {
            at: at(start, s),
            machine: m.to_owned(),
            unit: "u.service".to_owned(),
        }
    }

    fn window(start: Instant, kind: WindowKind, m: &str, from: u64, to: u64) -> Window {
        Window {
            kind,
            machine: m.to_owned(),
            from: at(start, from),
            to: at(start, to),
        }
    }

    fn op(start: Instant, verb: Verb, s: u64) -> Op {
        Op {
            at: at(start, s),
            unit: "u.service".to_owned(),
            verb,
            succeeded: true,
        }
    }

    #[test]
    fn two_overlapping_runs_are_a_violation_unless_inside_a_partition_window() {
        let start = Instant::now();
        let mut record = Record {
            runs: vec![
                run(start, "m1", 0, 100, false),
                run(start, "m2", 50, 60, false),
            ],
            ..Record::default()
        };
        let v = violations(&record, start);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].contains("(invocation m1-0)") && v[0].contains("(invocation m2-50)"),
            "both runs are named by their invocation: {v:?}"
        );
        record
            .windows
            .push(window(start, WindowKind::Partition, "m1", 40, 70));
        assert!(violations(&record, start).is_empty());
    }

    #[test]
    fn a_double_run_inside_a_fenced_window_is_a_violation() {
        // The fence stops a stopped or hung fleetd's copies before the engine moves them:
        // two copies at once mean it fired late or not at all.
        let start = Instant::now();
        let record = Record {
            runs: vec![
                run(start, "m1", 0, 20, true),
                run(start, "m2", 18, 60, false),
            ],
            windows: vec![
                window(start, WindowKind::Fenced, "m1", 5, 40),
                window(start, WindowKind::Fenced, "m2", 5, 40),
            ],
            ..Record::default()
        };
        let v = violations(&record, start);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("at once"), "{v:?}");
    }

    #[test]
    fn a_double_run_only_partly_inside_a_partition_window_is_a_violation() {
        let start = Instant::now();
        let record = Record {
            runs: vec![
                run(start, "m1", 0, 30, true),
                run(start, "m2", 10, 60, false),
            ],
            changes: vec![change(start, "m1", 12)],
            windows: vec![window(start, WindowKind::Partition, "m1", 0, 25)],
            ..Record::default()
        };
        let v = violations(&record, start);
        assert_eq!(
            v.len(),
            2,
            "the overlap and the stop after the window: {v:?}"
        );
    }

    #[test]
    fn a_run_stopped_inside_its_machines_fenced_window_needs_no_reason() {
        let start = Instant::now();
        let mut record = Record {
            runs: vec![run(start, "m1", 0, 10, true)],
            windows: vec![window(start, WindowKind::Fenced, "m1", 5, 20)],
            ..Record::default()
        };
        assert!(violations(&record, start).is_empty());
        // Before the fence could fire, or on another machine, the stop is unexplained.
        record.windows = vec![window(start, WindowKind::Fenced, "m1", 12, 20)];
        assert_eq!(violations(&record, start).len(), 1);
        record.windows = vec![window(start, WindowKind::Fenced, "m2", 5, 20)];
        assert_eq!(violations(&record, start).len(), 1);
    }

    #[test]
    fn a_fenced_stop_leaves_the_operation_for_the_live_copy() {
        let start = Instant::now();
        let record = Record {
            runs: vec![run(start, "m1", 0, 8, true), run(start, "m2", 10, 20, true)],
            ops: vec![op(start, Verb::Stop, 9)],
            windows: vec![window(start, WindowKind::Fenced, "m1", 5, 30)],
            ..Record::default()
        };
        let v = violations(&record, start);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(fenced_stops(&record), 1);
    }

    #[test]
    fn a_stop_needs_a_user_operation_and_each_operation_justifies_one_stop() {
        let start = Instant::now();
        let mut record = Record {
            runs: vec![
                run(start, "m1", 0, 10, true),
                run(start, "m1", 20, 30, true),
            ],
            ops: vec![op(start, Verb::Stop, 10)],
            ..Record::default()
        };
        let v = violations(&record, start);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("invocation m1-20"), "{v:?}");
        record.ops.push(op(start, Verb::Replace, 30));
        assert!(violations(&record, start).is_empty());
    }

    #[test]
    fn a_plain_start_stops_nothing() {
        let start = Instant::now();
        let record = Record {
            runs: vec![run(start, "m1", 0, 10, true)],
            ops: vec![op(start, Verb::Start, 10)],
            ..Record::default()
        };
        assert_eq!(violations(&record, start).len(), 1);
    }

    #[test]
    fn an_engine_move_off_a_healthy_machine_is_a_violation_even_with_its_schedule_change() {
        // What a mass lease expiry after an etcd freeze did (issue 12 item 2): the engine
        // deleted the entry and the unit stopped, on a machine no fault touched.
        let start = Instant::now();
        let mut record = Record {
            runs: vec![run(start, "m1", 0, 10, true)],
            changes: vec![change(start, "m1", 10)],
            ..Record::default()
        };
        assert_eq!(violations(&record, start).len(), 1);
        // The same move off a machine cut off the network is the documented window.
        record
            .windows
            .push(window(start, WindowKind::Partition, "m1", 5, 20));
        assert!(violations(&record, start).is_empty());
    }

    #[test]
    fn a_stale_copy_stopped_in_its_window_leaves_the_operation_for_the_live_copy() {
        let start = Instant::now();
        let record = Record {
            runs: vec![run(start, "m1", 0, 10, true), run(start, "m2", 5, 12, true)],
            changes: vec![change(start, "m1", 6)],
            ops: vec![op(start, Verb::Destroy, 9)],
            windows: vec![window(start, WindowKind::Partition, "m1", 0, 20)],
            ..Record::default()
        };
        let v = violations(&record, start);
        assert!(v.is_empty(), "{v:?}");
    }

    #[test]
    fn an_operation_on_another_unit_or_long_before_the_run_justifies_nothing() {
        let start = Instant::now();
        let mut other = op(start, Verb::Stop, 105);
        other.unit = "v.service".to_owned();
        let record = Record {
            runs: vec![run(start, "m1", 100, 110, true)],
            ops: vec![op(start, Verb::Stop, 10), other],
            ..Record::default()
        };
        assert_eq!(violations(&record, start).len(), 1);
    }

    #[test]
    fn a_change_on_another_machine_or_long_before_the_run_justifies_nothing() {
        let start = Instant::now();
        let record = Record {
            runs: vec![run(start, "m1", 100, 110, true)],
            changes: vec![change(start, "m2", 110), change(start, "m1", 10)],
            windows: vec![window(start, WindowKind::Partition, "m1", 0, 200)],
            ..Record::default()
        };
        assert_eq!(violations(&record, start).len(), 1);
    }

    #[test]
    fn runs_ended_by_a_power_loss_need_no_reason() {
        let start = Instant::now();
        let mut record = Record {
            runs: vec![run(start, "m1", 0, 10, true)],
            ..Record::default()
        };
        record.power_lost.insert("m1".to_owned(), at(start, 10));
        assert!(violations(&record, start).is_empty());
    }
}
