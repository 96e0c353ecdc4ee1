//! The scheduler's working copy of the cluster: which unit is on which machine, updated by
//! every decision of a plan so that later decisions see earlier ones, plus the `[X-Fleet]`
//! tests of one unit on one machine against it (`agent/state.go:AbleToRun` in fleet).
//!
//! It only records: which rule wins when two units disagree is the planner's business.

use fleet_core::{
    DesiredState, LoadState, MachineId, MachineInfo, RequirementError, Requirements, UnitFile,
    UnitHash, UnitName,
};
use fleet_registry::{LeftCopy, MoveRecord, PerMachine, Snapshot, UnitStateRecord};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::decision::Reason;
use super::history::History;
use super::spec::Spec;
use crate::unreadable::Unreadable;

mod rules;

/// The requirements of a unit whose file the engine does not have: it constrains nothing.
static NO_REQUIREMENTS: Requirements = Requirements {
    machine_id: None,
    machine_of: Vec::new(),
    metadata: BTreeMap::new(),
    conflicts: Vec::new(),
    replaces: Vec::new(),
    global: false,
    unknown: Vec::new(),
};

/// A schedule entry: one unit on one machine.
pub(super) type Slot = (UnitName, MachineId);

#[derive(Debug)]
pub(super) struct Cluster<'s> {
    /// With their dynamic metadata over their configured metadata.
    pub machines: Cow<'s, BTreeMap<MachineId, MachineInfo>>,
    /// What agents publish: only read to hold a unit back while a copy of it still runs, and
    /// to see a drain move arrive.
    states: &'s BTreeMap<UnitName, PerMachine<UnitStateRecord>>,
    /// The snapshot's schedule and units and their files: what a unit the plan does not
    /// place was (global or not) when it leaves a machine.
    snapshot: &'s Snapshot,
    files: &'s BTreeMap<UnitHash, UnitFile>,
    /// Where each unit ran lately: whose published copies may hold it back.
    history: History<'s>,
    /// Units the plan places: wanted, with a known file.
    pub specs: BTreeMap<UnitName, Spec>,
    /// Wanted units whose file is unknown, or that the engine holds, and units whose record
    /// cannot be read: left exactly as they are.
    pub frozen: BTreeSet<UnitName>,
    /// Units the engine holds (their machine vanished in a disruption, is settling, or their
    /// move waits for the rate limit; or their machine's record cannot be read): their
    /// entries stay even on a machine that is gone.
    held: Cow<'s, BTreeSet<UnitName>>,
    /// What the snapshot could not read (see [`crate::unreadable`]).
    unreadable: Unreadable,
    /// Wanted units whose `[X-Fleet]` options fleet refuses: never placed.
    pub invalid: BTreeMap<UnitName, RequirementError>,
    on: BTreeMap<MachineId, BTreeSet<UnitName>>,
    at: BTreeMap<UnitName, BTreeSet<MachineId>>,
    /// The live machines by (load, ID): the least-loaded one is the first. Scanning every
    /// machine for every unit placed was the plan's cost at 5,000 machines (100,000 units
    /// × 5,000 load lookups); kept up to date by `insert` and `remove`.
    by_load: BTreeSet<(usize, MachineId)>,
    /// The latest reason each slot was emptied or filled during the plan.
    pub removed: BTreeMap<Slot, Reason>,
    pub added: BTreeMap<Slot, Reason>,
    /// Why a unit last lost its machine; the reason it gets for its new one.
    last_removal: BTreeMap<UnitName, Reason>,
    /// Wanted units with `Conflicts=` or `Replaces=`.
    relational: BTreeSet<UnitName>,
    /// Those of them on each machine, kept up to date by `insert` and `remove`: a unit
    /// without such options is checked against these alone, not against every unit of the
    /// machine (issue 19: that scan made a pass grow with units² / machines).
    relational_at: BTreeMap<MachineId, BTreeSet<UnitName>>,
    /// Drained machines: how many moves each allows on their way at once (0: its mark
    /// cannot be read, so nothing moves).
    pub drained: BTreeMap<MachineId, u32>,
    /// The engine's moves off drained machines, as the registry records them.
    pub moving: &'s BTreeMap<UnitName, MoveRecord>,
    /// Moves this plan starts (unit -> drained machine) and recorded moves it finds over.
    pub moves_started: BTreeMap<UnitName, MachineId>,
    pub moves_over: BTreeMap<UnitName, MachineId>,
    /// Units whose recorded move is still on its way: their state changes matter.
    pub in_flight: BTreeSet<UnitName>,
    /// Entries of units outside the snapshot, per machine, counted in its load: what a plan
    /// of a few units (see [`super::delta`]) knows of the rest. Empty for a whole plan.
    base_load: HashMap<MachineId, usize>,
}

impl<'s> Cluster<'s> {
    /// Builds the working copy from a snapshot. Entries that cannot stay whatever the rules
    /// say (destroyed or inactive unit, machine gone, placed under an older placement
    /// generation, second entry of a non-global unit) are dropped here with their reason,
    /// and so are the entries of units whose options fleet's validation refuses (they can
    /// only come from a client that skipped it; placing them could loop forever, e.g. a peer
    /// that is also replaced). Units whose file is missing from `files` (replaced since the
    /// snapshot was read) are left exactly where they are, and so are `held` units, on a
    /// machine that is gone too, units whose record cannot be read, and units on a machine
    /// whose record cannot be read (see [`crate::unreadable`]).
    pub fn new(
        snapshot: &'s Snapshot,
        files: &'s BTreeMap<UnitHash, UnitFile>,
        held: &'s BTreeSet<UnitName>,
    ) -> Cluster<'s> {
        Cluster::with_base(snapshot, files, held, HashMap::new())
    }

    /// [`new`](Self::new), each machine's load counting `base_load` more units than the
    /// snapshot places there.
    #[allow(
        clippy::too_many_lines,
        reason = "builds every index of the plan's view in one pass over the snapshot"
    )]
    pub fn with_base(
        snapshot: &'s Snapshot,
        files: &'s BTreeMap<UnitHash, UnitFile>,
        held: &'s BTreeSet<UnitName>,
        base_load: HashMap<MachineId, usize>,
    ) -> Cluster<'s> {
        let unreadable = Unreadable::of(snapshot);
        let held = unreadable.held(snapshot, held);
        let drained = snapshot
            .drained
            .values()
            .map(|d| (d.machine.clone(), d.parallel.max(1)))
            .chain(unreadable.drained.iter().map(|m| (m.clone(), 0)))
            .collect();
        let mut cluster = Cluster {
            machines: snapshot.machines_with_metadata(),
            states: &snapshot.states,
            snapshot,
            files,
            history: History::of(snapshot),
            specs: BTreeMap::new(),
            frozen: unreadable.units.clone(),
            held,
            unreadable,
            invalid: BTreeMap::new(),
            on: snapshot
                .machines
                .keys()
                .map(|m| (m.clone(), BTreeSet::new()))
                .collect(),
            at: BTreeMap::new(),
            by_load: BTreeSet::new(),
            removed: BTreeMap::new(),
            added: BTreeMap::new(),
            last_removal: BTreeMap::new(),
            relational: BTreeSet::new(),
            relational_at: BTreeMap::new(),
            drained,
            moving: &snapshot.moving,
            moves_started: BTreeMap::new(),
            moves_over: BTreeMap::new(),
            in_flight: BTreeSet::new(),
            base_load,
        };
        let wanted = snapshot
            .units
            .iter()
            .filter(|(_, u)| u.desired() != DesiredState::Inactive);
        for (name, unit) in wanted {
            if cluster.held.contains(name) {
                cluster.frozen.insert(name.clone());
                continue;
            }
            let Some(file) = files.get(&unit.hash()) else {
                cluster.frozen.insert(name.clone());
                continue;
            };
            let reqs = Requirements::from_unit(name, file);
            if let Err(error) = reqs.validate() {
                cluster.invalid.insert(name.clone(), error);
                continue;
            }
            if !reqs.conflicts.is_empty() || !reqs.replaces.is_empty() {
                cluster.relational.insert(name.clone());
            }
            let spec = Spec {
                hash: unit.hash(),
                desired: unit.desired(),
                restart: unit.record.restart,
                replace: unit.record.replace.clone(),
                reqs,
            };
            cluster.specs.insert(name.clone(), spec);
        }
        for (name, entries) in &snapshot.schedule {
            for (machine, entry) in entries {
                match cluster.entry_verdict(snapshot, name, machine, entry.placement) {
                    Some(reason) => {
                        cluster.last_removal.insert(name.clone(), reason.clone());
                        cluster
                            .removed
                            .insert((name.clone(), machine.clone()), reason);
                    }
                    None => cluster.insert(name, machine),
                }
            }
        }
        cluster.by_load = cluster
            .machines
            .keys()
            .map(|m| (cluster.load(m), m.clone()))
            .collect();
        cluster
    }

    /// Why an existing entry (placed under generation `placement`) must go before any rule
    /// is looked at; `None` keeps it.
    fn entry_verdict(
        &self,
        snap: &Snapshot,
        name: &UnitName,
        machine: &MachineId,
        placement: u64,
    ) -> Option<Reason> {
        let Some(unit) = snap.units.get(name) else {
            // A record that cannot be read is no sign that the unit is gone.
            return (!self.unreadable.units.contains(name)).then_some(Reason::UnitDestroyed);
        };
        if unit.desired() == DesiredState::Inactive {
            return Some(Reason::TargetInactive);
        }
        if let Some(error) = self.invalid.get(name) {
            return Some(Reason::InvalidRequirements {
                error: error.clone(),
            });
        }
        let absent = !self.machines.contains_key(machine) && !self.is_migrating(machine);
        if absent && !self.held.contains(name) {
            return Some(Reason::MachineGone {
                machine: machine.clone(),
            });
        }
        let non_global = self.specs.get(name).filter(|s| !s.reqs.global);
        // A global unit is on every machine anyway: a new generation updates it in place.
        if let Some(spec) = non_global.filter(|s| placement < s.placement()) {
            return Some(Reason::RescheduleRequested {
                generation: spec.placement(),
            });
        }
        match self.at.get(name).and_then(|ms| ms.first()) {
            Some(kept) if non_global.is_some() => Some(Reason::Duplicate { kept: kept.clone() }),
            Some(_) | None => None,
        }
    }

    pub fn unreadable(&self) -> &Unreadable {
        &self.unreadable
    }

    pub fn reqs(&self, unit: &UnitName) -> &Requirements {
        self.specs.get(unit).map_or(&NO_REQUIREMENTS, |s| &s.reqs)
    }

    /// The machine to keep away from when placing `unit` (`--reschedule`), if any.
    pub fn avoided(&self, unit: &UnitName) -> Option<&MachineId> {
        self.specs.get(unit)?.replace.avoid.as_ref()
    }

    /// The live machine a replace in fleet's form asked `unit` to come back to, if any.
    pub fn preferred(&self, unit: &UnitName) -> Option<&MachineId> {
        let prefer = self.specs.get(unit)?.replace.prefer.as_ref()?;
        self.machines.contains_key(prefer).then_some(prefer)
    }

    /// A machine other than `machine`, in `unit`'s history and there, that publishes a copy
    /// of `unit` that may still be running (see [`super::history`]). A machine that is gone
    /// never holds a unit back (its states went with its lease), nor does one the unit was
    /// not on lately (a stray state). A machine migrating from fleet v1 publishes nothing
    /// yet, but the copy fleet started there runs until its agent has joined and stopped it:
    /// a record that the unit left it holds the unit back until then.
    pub fn previous_copy(&self, unit: &UnitName, machine: &MachineId) -> Option<&'s MachineId> {
        let published = self
            .history
            .running(unit)
            .find(|m| *m != machine && self.is_there(m) && self.history.knows(unit, m));
        published.or_else(|| {
            self.history
                .left_machines(unit)
                .find(|m| *m != machine && self.is_migrating(m))
        })
    }

    /// What the machine published of `unit`'s copy, when deleting its entry there leaves a
    /// copy that may still run and that the history does not record yet: the engine then
    /// records that the unit left the machine, in the same transaction. Any machine that is
    /// there may run one, whatever it published: a state lags its agent's starts (it
    /// publishes at the end of a pass), so no state, or a stopped one, may hide a copy just
    /// started. A unit known to be global is never held back, so its copies need no record;
    /// a machine that is gone has its fence, and the disruption rule waits for it.
    pub fn leaves_copy(&self, unit: &UnitName, machine: &MachineId) -> Option<LeftCopy> {
        let recorded = self.history.recorded(unit, machine).is_some();
        (self.is_there(machine) && !recorded && !self.known_global(unit, machine))
            .then(|| self.history.published(unit, machine))
    }

    /// Whether `unit` is global by the file the plan places it with, or, for a unit it does
    /// not place (inactive, destroyed), by its record's file or its entry's on `machine`.
    fn known_global(&self, unit: &UnitName, machine: &MachineId) -> bool {
        if let Some(spec) = self.specs.get(unit) {
            return spec.reqs.global;
        }
        let record = self.snapshot.units.get(unit).map(|u| u.hash());
        let entry = self
            .snapshot
            .schedule
            .get(unit)
            .and_then(|ms| ms.get(machine));
        let file = record
            .into_iter()
            .chain(entry.map(|e| e.hash))
            .find_map(|hash| self.files.get(&hash));
        file.is_some_and(|f| Requirements::global(unit, f))
    }

    /// Whether the engine holds `unit` where it is (see [`crate::disruption`]).
    pub fn is_held(&self, unit: &UnitName) -> bool {
        self.held.contains(unit)
    }

    /// Whether `machine` is there: live, or its record cannot be read (its key is, on its
    /// lease), or it is migrating ([`Self::is_migrating`]).
    pub fn is_there(&self, machine: &MachineId) -> bool {
        self.machines.contains_key(machine)
            || self.unreadable.machines.contains(machine)
            || self.is_migrating(machine)
    }

    /// Whether `machine`'s units were imported from fleet v1 and it has not joined yet (or its
    /// mark cannot be read): copies fleet started may run there with no fence of ours, so
    /// it counts as there. Its entries stay while it is absent, and a unit that leaves it is
    /// held back from other machines until the machine joins and its agent is seen to have
    /// stopped the copy, as for a live machine. Never a place to put a unit: it is absent.
    pub fn is_migrating(&self, machine: &MachineId) -> bool {
        self.snapshot.migrating.contains_key(machine) || self.unreadable.migrating.contains(machine)
    }

    /// Whether `unit` has `Conflicts=` or `Replaces=`: only such units make a pair invalid.
    pub fn is_relational(&self, unit: &UnitName) -> bool {
        self.relational.contains(unit)
    }

    /// The units on `machine` that have `Conflicts=` or `Replaces=`, in name order.
    pub fn relational_on(&self, machine: &MachineId) -> impl Iterator<Item = &UnitName> {
        self.relational_at.get(machine).into_iter().flatten()
    }

    /// The units on `machine` that can make a pair with `unit` invalid: all of them when
    /// `unit` has `Conflicts=` or `Replaces=`, else only those that have (usually none).
    pub fn neighbours_of<'a>(
        &'a self,
        unit: &UnitName,
        machine: &'a MachineId,
    ) -> Box<dyn Iterator<Item = &'a UnitName> + 'a> {
        if self.is_relational(unit) {
            Box::new(self.units_on(machine))
        } else {
            Box::new(self.relational_on(machine))
        }
    }

    pub fn is_global(&self, unit: &UnitName) -> bool {
        self.specs.get(unit).is_some_and(|s| s.reqs.global)
    }

    /// The machines `unit` is on, in ID order.
    pub fn machines_of(&self, unit: &UnitName) -> impl Iterator<Item = &MachineId> {
        self.at.get(unit).into_iter().flatten()
    }

    pub fn is_placed(&self, unit: &str) -> bool {
        unit.parse::<UnitName>()
            .ok()
            .and_then(|u| self.at.get(&u).map(|ms| !ms.is_empty()))
            .unwrap_or(false)
    }

    /// Whether the plan has `unit` on `machine`.
    pub fn has(&self, unit: &UnitName, machine: &MachineId) -> bool {
        self.at.get(unit).is_some_and(|ms| ms.contains(machine))
    }

    /// The units on `machine`, in name order.
    pub fn units_on(&self, machine: &MachineId) -> impl Iterator<Item = &UnitName> {
        self.on.get(machine).into_iter().flatten()
    }

    /// fleet's load: how many units a machine runs, global ones included.
    pub fn load(&self, machine: &MachineId) -> usize {
        let base = self.base_load.get(machine).copied().unwrap_or(0);
        base + self.on.get(machine).map_or(0, BTreeSet::len)
    }

    /// The live machine with the fewest units (ties by ID), `avoided` only when it is the
    /// only one: what ordering every machine by `(Some(m) == avoided, load, m)` puts first.
    pub fn least_loaded(&self, avoided: Option<&MachineId>) -> Option<&MachineId> {
        let mut order = self.by_load.iter().map(|(_, m)| m);
        let first = order.next()?;
        if Some(first) != avoided {
            return Some(first);
        }
        order.next().or(Some(first))
    }

    /// Every slot the plan ends with, in (unit, machine) order.
    pub fn slots(&self) -> impl Iterator<Item = Slot> + '_ {
        self.at
            .iter()
            .flat_map(|(u, ms)| ms.iter().map(move |m| (u.clone(), m.clone())))
    }

    pub fn place(&mut self, unit: &UnitName, machine: &MachineId, reason: Reason) {
        self.insert(unit, machine);
        self.added.insert((unit.clone(), machine.clone()), reason);
    }

    /// The reason `unit` gets when it is placed: why it lost its machine, if it did (in this
    /// plan, or in an earlier one that moved it off a drained machine).
    pub fn placement_reason(&self, unit: &UnitName, desired: DesiredState) -> Reason {
        if let Some(reason) = self.last_removal.get(unit) {
            return reason.clone();
        }
        match self.moving.get(unit) {
            Some(m) if self.in_flight.contains(unit) => Reason::Drained {
                machine: m.from.clone(),
            },
            Some(_) | None => Reason::NotScheduled { desired },
        }
    }

    pub fn remove(&mut self, unit: &UnitName, machine: &MachineId, reason: Reason) {
        let load = self.load(machine);
        if let Some(units) = self.on.get_mut(machine)
            && units.remove(unit)
        {
            self.reindex(machine, load);
        }
        if let Some(units) = self.relational_at.get_mut(machine) {
            units.remove(unit);
        }
        if let Some(machines) = self.at.get_mut(unit) {
            machines.remove(machine);
            if machines.is_empty() {
                self.at.remove(unit);
            }
        }
        self.last_removal.insert(unit.clone(), reason.clone());
        self.removed.insert((unit.clone(), machine.clone()), reason);
    }

    fn insert(&mut self, unit: &UnitName, machine: &MachineId) {
        let load = self.load(machine);
        let added = self
            .on
            .entry(machine.clone())
            .or_default()
            .insert(unit.clone());
        if added {
            self.reindex(machine, load);
        }
        if self.relational.contains(unit) {
            self.relational_at
                .entry(machine.clone())
                .or_default()
                .insert(unit.clone());
        }
        self.at
            .entry(unit.clone())
            .or_default()
            .insert(machine.clone());
    }

    /// Moves a live `machine` whose load was `was` to its place in `by_load`. Before the
    /// index is built (while `new` inserts the snapshot's entries) it holds nothing to move.
    fn reindex(&mut self, machine: &MachineId, was: usize) {
        if self.by_load.remove(&(was, machine.clone())) {
            self.by_load.insert((self.load(machine), machine.clone()));
        }
    }

    /// Whether `unit` runs as its desired state asks on a machine other than `from`: active
    /// when launched, loaded when loaded (as its agent publishes it).
    pub fn arrived_elsewhere(&self, unit: &UnitName, from: &MachineId) -> bool {
        let Some(spec) = self.specs.get(unit) else {
            return false;
        };
        let states = self.states.get(unit);
        self.machines_of(unit)
            .filter(|m| *m != from)
            .filter_map(|m| states.and_then(|s| s.get(m)))
            .any(|state| match spec.desired {
                DesiredState::Launched => state.systemd.active_state().satisfies_launched(),
                DesiredState::Loaded | DesiredState::Inactive => {
                    state.systemd.load_state() == LoadState::Loaded
                }
            })
    }
}
