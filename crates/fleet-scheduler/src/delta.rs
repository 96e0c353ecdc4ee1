//! Planning only the units a change touched (issue 19). A whole plan looks at every unit,
//! about 0.9 s at 100,000 units; a leader woken by one `fleetctl start` needs a plan of that
//! one unit.
//!
//! The leader's view is at a fixed point after each pass: planning it again decides nothing.
//! When a change touches only "plain" units (no `Conflicts=`, `Replaces=` or `MachineOf=`)
//! that no other unit's options name, and nothing else changed (no machine, drain, move,
//! unreadable value, unit waiting for a copy to stop), the whole plan's decisions are those
//! of the touched units alone: every rule between two units needs one of those options, and
//! what the rest of the cluster adds is the load of each machine. So [`plan_delta`] plans a
//! snapshot of the touched units, each machine's load counting the entries of the others,
//! and its decisions are the whole plan's, one for one (tests: `delta.rs`, every case
//! compared with the whole plan). Anything else gets the whole plan (`None`).

use fleet_core::{DesiredState, MachineId, Requirements, UnitFile, UnitHash, UnitName};
use fleet_registry::Snapshot;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::cluster::Cluster;
use super::{Plan, plan_cluster};

/// Beyond this many (touched × entangled) name checks, the whole plan is cheaper to trust.
const MAX_CHECKS: usize = 1_000_000;

/// The wanted units whose options tie them to other units (`Conflicts=`, `Replaces=`,
/// `MachineOf=`), with those options: what decides whether a change to another unit can be
/// planned alone. Read from the snapshot of a whole plan; a change can only add one through
/// a touched unit, and then the whole plan runs again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entangled {
    units: BTreeMap<UnitName, Requirements>,
}

impl Entangled {
    /// The entangled units of `snapshot`, as the whole plan sees them: wanted, with a known
    /// file and options fleet accepts (the plan gives any other unit no requirements).
    pub fn of(snapshot: &Snapshot, files: &BTreeMap<UnitHash, UnitFile>) -> Entangled {
        let units = snapshot
            .units
            .iter()
            .filter_map(|(name, unit)| {
                let reqs = requirements(name, unit.desired(), unit.hash(), files)?;
                (!plain(&reqs)).then(|| (name.clone(), reqs))
            })
            .collect();
        Entangled { units }
    }

    /// How many units are entangled.
    pub fn len(&self) -> usize {
        self.units.len()
    }

    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// Whether `unit` is entangled, or one of the entangled units names it.
    fn ties(&self, unit: &UnitName) -> bool {
        self.units.contains_key(unit)
            || self.units.values().any(|reqs| {
                reqs.conflicts_with(unit)
                    || reqs.replaces_name(unit)
                    || reqs.machine_of.iter().any(|p| p == unit.as_str())
            })
    }
}

/// The requirements the whole plan gives a unit: `None` when it gives it none (not wanted,
/// file unknown, options refused).
fn requirements(
    name: &UnitName,
    desired: DesiredState,
    hash: UnitHash,
    files: &BTreeMap<UnitHash, UnitFile>,
) -> Option<Requirements> {
    if desired == DesiredState::Inactive {
        return None;
    }
    let reqs = Requirements::from_unit(name, files.get(&hash)?);
    reqs.validate().ok()?;
    Some(reqs)
}

/// Whether a unit's options can tie it to no other unit.
fn plain(reqs: &Requirements) -> bool {
    reqs.conflicts.is_empty() && reqs.replaces.is_empty() && reqs.machine_of.is_empty()
}

/// The plan of `snapshot` as far as the `touched` units are concerned, which is the whole
/// plan's when `snapshot` was at a fixed point before they changed (the previous plan's
/// decisions applied) and they can be planned alone; `None` when they cannot (see the
/// module). `entangled` is [`Entangled::of`] the snapshot before the change.
///
/// A machine's loss is such a change: [`touched_by_loss`] says which units it touches, and
/// [`plan_delta_holding`] plans it with the units the disruption rule holds.
pub fn plan_delta(
    snapshot: &Snapshot,
    files: &BTreeMap<UnitHash, UnitFile>,
    touched: &BTreeSet<UnitName>,
    entangled: &Entangled,
) -> Option<Plan> {
    plan_delta_holding(snapshot, files, touched, entangled, &BTreeSet::new())
}

/// [`plan_delta`], which is then the whole plan's that holds the same `held` units
/// ([`plan_holding`](super::plan_holding)); `None` too while a held unit is entangled or
/// named by an entangled unit.
pub fn plan_delta_holding(
    snapshot: &Snapshot,
    files: &BTreeMap<UnitHash, UnitFile>,
    touched: &BTreeSet<UnitName>,
    entangled: &Entangled,
    held: &BTreeSet<UnitName>,
) -> Option<Plan> {
    let others = Load::of(snapshot).without(snapshot, touched);
    plan_delta_on(snapshot, files, touched, entangled, held, others)
}

/// [`plan_delta`] with the load of the units other than the touched ones given: what a
/// leader keeps between passes ([`Load`]) instead of counting every entry each time.
pub fn plan_delta_on(
    snapshot: &Snapshot,
    files: &BTreeMap<UnitHash, UnitFile>,
    touched: &BTreeSet<UnitName>,
    entangled: &Entangled,
    held: &BTreeSet<UnitName>,
    others: Load,
) -> Option<Plan> {
    let checks = touched.len().saturating_add(held.len());
    let quiet = snapshot.skipped.is_empty()
        && snapshot.drained.is_empty()
        && snapshot.moving.is_empty()
        && checks.saturating_mul(entangled.len().max(1)) <= MAX_CHECKS;
    if !quiet {
        return None;
    }
    // A held unit stays exactly where it is, and the whole plan gives it no requirements:
    // while it is held, a unit it names (or that names it) may be placed where its options
    // would not let it be, and placed back when it is released. Such a unit may be in no
    // touched set (a unit that became held is left out of them), so only the whole plan
    // knows.
    if held.iter().any(|name| entangled.ties(name)) {
        return None;
    }
    for name in touched {
        if entangled.ties(name) {
            return None;
        }
        let reqs = snapshot
            .units
            .get(name)
            .and_then(|u| requirements(name, u.desired(), u.hash(), files));
        if reqs.is_some_and(|r| !plain(&r)) {
            return None;
        }
    }
    let part = part_of(snapshot, touched);
    Some(plan_cluster(
        &part,
        Cluster::with_base(&part, files, held, others.0),
    ))
}

/// The units to plan with [`plan_delta`] after machines were lost, besides the `changed`
/// ones: the units with an entry on a machine the snapshot does not have (one that is
/// gone), those with a record that they left such a machine (its fence has stopped the copy
/// once they are no longer held), and the units no machine could take, whose recorded reason
/// counts the machines. Left out are the `held` units the whole plan (`plan_holding`) leaves
/// exactly as they are, those still wanted: their entries then count as load like any other
/// unit's. A held unit destroyed or made inactive is unscheduled by the whole plan too, so it
/// stays in (and keeps its records, as there).
pub fn touched_by_loss(
    snapshot: &Snapshot,
    changed: &BTreeSet<UnitName>,
    held: &BTreeSet<UnitName>,
) -> BTreeSet<UnitName> {
    let gone = |m: &MachineId| !snapshot.machines.contains_key(m);
    let on_gone = snapshot.schedule.iter();
    let on_gone = on_gone
        .filter(|(_, on)| on.keys().any(gone))
        .map(|(u, _)| u);
    let left_gone = snapshot.left.iter();
    let left_gone = left_gone
        .filter(|(_, on)| on.keys().any(gone))
        .map(|(u, _)| u);
    let wanted = |u: &UnitName| {
        snapshot
            .units
            .get(u)
            .is_some_and(|unit| unit.desired() != DesiredState::Inactive)
    };
    on_gone
        .chain(left_gone)
        .chain(snapshot.unscheduled.keys())
        .chain(changed)
        .filter(|u| !(held.contains(*u) && wanted(u)))
        .cloned()
        .collect()
}

/// The snapshot of the `touched` units alone, with every machine.
fn part_of(snapshot: &Snapshot, touched: &BTreeSet<UnitName>) -> Snapshot {
    fn only<V: Clone>(
        map: &BTreeMap<UnitName, V>,
        touched: &BTreeSet<UnitName>,
    ) -> BTreeMap<UnitName, V> {
        touched
            .iter()
            .filter_map(|n| map.get_key_value(n))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect()
    }
    Snapshot {
        revision: snapshot.revision,
        units: only(&snapshot.units, touched),
        machines: snapshot.machines.clone(),
        metadata: snapshot.metadata.clone(),
        schedule: only(&snapshot.schedule, touched),
        states: only(&snapshot.states, touched),
        unscheduled: only(&snapshot.unscheduled, touched),
        drained: BTreeMap::new(),
        moving: BTreeMap::new(),
        left: only(&snapshot.left, touched),
        migrating: snapshot.migrating.clone(),
        skipped: BTreeMap::new(),
        state_bound: Default::default(),
    }
}

/// How many schedule entries each machine has. A leader keeps it between delta passes:
/// it takes the touched units' entries out before planning ([`without`](Self::without)) and
/// puts their new ones back once written ([`add`](Self::add)). Counting every entry on
/// every pass was 29 % of the api scenario's CPU while 100,000 units were created over the
/// API, one small pass after another.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Load(HashMap<MachineId, usize>);

impl Load {
    /// Every entry of `snapshot`.
    pub fn of(snapshot: &Snapshot) -> Load {
        let mut load = Load(HashMap::with_capacity(snapshot.machines.len()));
        for entries in snapshot.schedule.values() {
            for machine in entries.keys() {
                load.change(machine, true);
            }
        }
        load
    }

    /// This load less the entries `units` have in `snapshot`.
    pub fn without(&self, snapshot: &Snapshot, units: &BTreeSet<UnitName>) -> Load {
        let mut load = self.clone();
        load.each_entry(snapshot, units, false);
        load
    }

    /// Counts the entries `units` have in `snapshot`.
    pub fn add(&mut self, snapshot: &Snapshot, units: &BTreeSet<UnitName>) {
        self.each_entry(snapshot, units, true);
    }

    fn each_entry(&mut self, snapshot: &Snapshot, units: &BTreeSet<UnitName>, up: bool) {
        for unit in units {
            for machine in snapshot
                .schedule
                .get(unit)
                .into_iter()
                .flat_map(|e| e.keys())
            {
                self.change(machine, up);
            }
        }
    }

    fn change(&mut self, machine: &MachineId, up: bool) {
        match self.0.get_mut(machine) {
            Some(n) if up => *n += 1,
            Some(n) => {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.0.remove(machine);
                }
            }
            None if up => {
                self.0.insert(machine.clone(), 1);
            }
            None => {}
        }
    }
}
