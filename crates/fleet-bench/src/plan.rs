//! Scenario `plan`: the engine's scheduler alone, no etcd, on a snapshot of the scale
//! scenario's size (issue 19: 100,000 units on 5,000 machines). It times one pass three ways:
//! - **first**: every unit unplaced (a new leader's first pass after a mass submit);
//! - **steady**: every unit placed, nothing to decide (a pass woken by a change that
//!   decides nothing, or the minute's safety net);
//! - **arrivals**: every unit placed and 1 % more arriving (what a whole pass does while a
//!   big submit is still being written);
//! - **one, alone**: every unit placed and one more arriving, planned alone (`plan_delta`,
//!   what the leader does when a change touches only units no other unit's options name).
//!
//! The leader's pass is this plan plus its fenced writes; the scale scenario times the
//! whole. What this isolates is the CPU a pass costs as the registry grows.

use anyhow::Result;
use fleet_core::{DesiredState, MachineInfo, UnitFile, UnitHash};
use fleet_engine::{Entangled, plan_delta, plan_holding};
use fleet_registry::{Snapshot, Unit, UnitRecord};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use crate::report;
use crate::sim::{bench_unit, machine_id};

/// Each figure is the median of this many passes.
const RUNS: usize = 3;

/// The registry as a leader's view holds it: `units` units of the scale scenario on
/// `machines` machines, none placed.
fn world(machines: usize, units: usize) -> (Snapshot, BTreeMap<UnitHash, UnitFile>) {
    let mut snap = Snapshot::default();
    for i in 0..machines {
        let info = MachineInfo {
            id: machine_id(i),
            public_ip: String::new(),
            metadata: BTreeMap::new(),
            version: String::new(),
            disable_engine: false,
            api: String::new(),
            fence_at: None,
        };
        snap.machines.insert(info.id.clone(), info);
    }
    let mut files = BTreeMap::new();
    for i in 0..units {
        add_unit(&mut snap, &mut files, i);
    }
    (snap, files)
}

fn add_unit(snap: &mut Snapshot, files: &mut BTreeMap<UnitHash, UnitFile>, i: usize) {
    let (name, file) = bench_unit(i, 1);
    let record = UnitRecord {
        name: name.clone(),
        hash: file.hash(),
        desired: DesiredState::Launched,
        restart: 0,
        replace: Default::default(),
    };
    files.insert(file.hash(), file);
    snap.units.insert(
        name,
        Unit {
            record,
            mod_revision: 1,
        },
    );
}

/// Records a plan's schedule decisions in the snapshot, as the leader's view does.
fn apply(snap: &mut Snapshot, decisions: &[fleet_engine::Decision]) {
    for entry in decisions.iter().filter_map(|d| d.kind.schedule_entry()) {
        snap.schedule
            .entry(entry.name.clone())
            .or_default()
            .insert(entry.machine.clone(), entry);
    }
}

/// One pass timed: how long, and how many decisions it made.
fn timed(snap: &Snapshot, files: &BTreeMap<UnitHash, UnitFile>) -> (Duration, usize) {
    let held = BTreeSet::new();
    let t0 = Instant::now();
    let plan = plan_holding(snap, files, &held);
    (t0.elapsed(), plan.decisions.len())
}

fn median(snap: &Snapshot, files: &BTreeMap<UnitHash, UnitFile>) -> (Duration, usize) {
    let mut runs: Vec<(Duration, usize)> = (0..RUNS).map(|_| timed(snap, files)).collect();
    runs.sort();
    runs[RUNS / 2]
}

/// The passes at one size.
#[derive(Debug)]
struct Row {
    machines: usize,
    units: usize,
    first: (Duration, usize),
    steady: (Duration, usize),
    arrivals: (Duration, usize),
    alone: (Duration, usize),
}

/// The plan of one arrived unit alone, median of [`RUNS`].
fn alone(
    snap: &Snapshot,
    files: &BTreeMap<UnitHash, UnitFile>,
    unit: fleet_core::UnitName,
    before: &Entangled,
) -> (Duration, usize) {
    let touched = BTreeSet::from([unit]);
    let mut runs: Vec<(Duration, usize)> = (0..RUNS)
        .map(|_| {
            let t0 = Instant::now();
            let plan = plan_delta(snap, files, &touched, before).expect("a plain unit");
            (t0.elapsed(), plan.decisions.len())
        })
        .collect();
    runs.sort();
    runs[RUNS / 2]
}

fn measure(machines: usize, units: usize) -> Row {
    let (mut snap, mut files) = world(machines, units);
    let first = median(&snap, &files);
    let plan = plan_holding(&snap, &files, &BTreeSet::new());
    apply(&mut snap, &plan.decisions);
    let steady = median(&snap, &files);
    let before = Entangled::of(&snap, &files);
    add_unit(&mut snap, &mut files, units);
    let alone = alone(&snap, &files, bench_unit(units, 1).0, &before);
    for i in units + 1..units + (units / 100).max(1) {
        add_unit(&mut snap, &mut files, i);
    }
    let arrivals = median(&snap, &files);
    Row {
        machines,
        units,
        first,
        steady,
        arrivals,
        alone,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// Milliseconds with two decimals: a plan of one unit takes well under one.
fn ms_fine(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn us_per_unit(d: Duration, units: usize) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6 / units.max(1) as f64)
}

/// Runs the grid; returns the Markdown section.
pub fn run(machines: &[usize], units: &[usize]) -> Result<String> {
    let wall = SystemTime::now();
    let started = Instant::now();
    let mut rows = Vec::new();
    for &m in machines {
        for &u in units {
            println!("plan: {u} units on {m} machines");
            let row = measure(m, u);
            println!(
                "plan: first {} ({} decisions), steady {} ({}), arrivals {} ({}), one alone {} ({})",
                ms(row.first.0),
                row.first.1,
                ms(row.steady.0),
                row.steady.1,
                ms(row.arrivals.0),
                row.arrivals.1,
                ms(row.alone.0),
                row.alone.1
            );
            rows.push(row);
        }
    }
    let mut out = report::provenance(wall, started.elapsed());
    out.push_str(
        "\nOne scheduler pass (`plan_holding`, no etcd), median of 3: every unit unplaced \
         (first), every unit placed (steady), and 1 % more arriving (arrivals); and one more \
         unit arriving, planned alone as the leader plans a change that touches only units no \
         other unit's options name (`plan_delta`, one alone). Per unit: the steady pass time \
         over the registry's units.\n\n\
         | machines | units | first | steady | arrivals | one alone | steady per unit |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for r in &rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.machines,
            r.units,
            ms(r.first.0),
            ms(r.steady.0),
            ms(r.arrivals.0),
            ms_fine(r.alone.0),
            us_per_unit(r.steady.0, r.units)
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_world_places_every_unit_then_decides_nothing() {
        let row = measure(10, 200);
        assert_eq!(row.first.1, 200);
        assert_eq!(row.steady.1, 0);
        assert_eq!(row.arrivals.1, 2);
        assert_eq!(
            row.alone.1, 1,
            "the one arrival placed, nothing else decided"
        );
    }
}
