//! Decision tables for each `[X-Fleet]` rule and their combinations. Machines and units are
//! built by [`World`]; plans are compared as one line per decision.

use super::*;
use fleet_core::{DesiredState, MachineInfo, SystemdState};
use fleet_registry::{
    DrainRecord, LeftCopy, MoveRecord, ReplaceState, ScheduleEntry, Unit, UnitRecord,
    UnitStateRecord,
};

mod delta;
mod drain;
mod history;
mod migrating;
pub mod props;
mod replace;
pub mod sim;
mod unreadable;

use DesiredState::{Inactive, Launched, Loaded};

/// A snapshot under construction, with the files its units name.
#[derive(Debug, Clone, Default)]
pub struct World {
    pub snap: Snapshot,
    pub files: BTreeMap<UnitHash, UnitFile>,
}

pub fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

pub fn mid(s: &str) -> MachineId {
    s.parse().unwrap()
}

pub fn unit_file(xfleet: &str, version: u32) -> UnitFile {
    let text = format!("[Service]\nExecStart=/bin/sleep {version}\n\n[X-Fleet]\n{xfleet}\n");
    UnitFile::parse(text.as_bytes()).unwrap()
}

impl World {
    pub fn new() -> World {
        World::default()
    }

    pub fn machine(mut self, id: &str, metadata: &[(&str, &str)]) -> World {
        let info = MachineInfo {
            id: mid(id),
            public_ip: String::new(),
            metadata: metadata
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            version: String::new(),
            disable_engine: false,
            api: String::new(),
            fence_at: None,
        };
        self.snap.machines.insert(info.id.clone(), info);
        self
    }

    /// A unit whose `[X-Fleet]` section holds the lines of `xfleet` (`;` separated).
    pub fn unit(self, unit: &str, desired: DesiredState, xfleet: &str) -> World {
        self.unit_version(unit, desired, xfleet, 0)
    }

    pub fn unit_version(
        mut self,
        unit: &str,
        desired: DesiredState,
        xfleet: &str,
        v: u32,
    ) -> World {
        let file = unit_file(&xfleet.replace(';', "\n"), v);
        let record = UnitRecord {
            name: name(unit),
            hash: file.hash(),
            desired,
            restart: 0,
            replace: Default::default(),
        };
        self.files.insert(file.hash(), file);
        let unit = Unit {
            record,
            mod_revision: 1,
        };
        self.snap.units.insert(unit.name().clone(), unit);
        self
    }

    /// An entry for `unit` on `machine` with the unit's current hash and desired state.
    pub fn entry(self, unit: &str, machine: &str) -> World {
        let u = &self.snap.units[&name(unit)];
        let (hash, desired) = (u.hash(), u.desired());
        self.entry_with(unit, machine, hash, desired)
    }

    pub fn entry_with(
        mut self,
        unit: &str,
        machine: &str,
        hash: UnitHash,
        desired: DesiredState,
    ) -> World {
        let entry = ScheduleEntry {
            name: name(unit),
            machine: mid(machine),
            hash,
            desired,
            restart: 0,
            no_restart: false,
            placement: 0,
        };
        self.snap
            .schedule
            .entry(name(unit))
            .or_default()
            .insert(mid(machine), entry);
        self
    }

    /// Drains `machine`, `parallel` moves at a time.
    pub fn drain(mut self, machine: &str, parallel: u32) -> World {
        let record = DrainRecord {
            machine: mid(machine),
            parallel,
            since: 0,
        };
        self.snap.drained.insert(mid(machine), record);
        self
    }

    pub fn undrain(mut self, machine: &str) -> World {
        self.snap.drained.remove(&mid(machine));
        self
    }

    pub fn without_machine(mut self, id: &str) -> World {
        self.snap.machines.remove(&mid(id));
        self
    }

    /// Sets the replace options of `unit` (as `fleetctl ... --replace` leaves them).
    pub fn replace(mut self, unit: &str, replace: ReplaceState) -> World {
        let u = self.snap.units.get_mut(&name(unit)).expect("unit exists");
        u.record.replace = replace;
        self
    }

    /// Changes the entry of `unit` on `machine`.
    pub fn with_entry(
        mut self,
        unit: &str,
        machine: &str,
        f: impl FnOnce(&mut ScheduleEntry),
    ) -> World {
        let entries = self
            .snap
            .schedule
            .get_mut(&name(unit))
            .expect("unit has entries");
        f(entries.get_mut(&mid(machine)).expect("entry exists"));
        self
    }

    /// `machine`'s agent publishes `unit` with ActiveState `active`.
    pub fn state(mut self, unit: &str, machine: &str, active: &str) -> World {
        let record = UnitStateRecord {
            name: name(unit),
            machine: mid(machine),
            hash: None,
            systemd: SystemdState {
                load: "loaded".into(),
                active: active.into(),
                sub: String::new(),
            },
            drop_ins: Vec::new(),
            restart: 0,
            restart_pending: false,
            restarts: 0,
            since: None,
            exit: None,
        };
        self.snap
            .states
            .entry(name(unit))
            .or_default()
            .insert(mid(machine), record);
        self
    }

    /// The registry records that `unit` left `machine` (as the engine's write of a removal
    /// whose copy may still run does).
    pub fn left(mut self, unit: &str, machine: &str) -> World {
        let left = self.snap.left.entry(name(unit)).or_default();
        left.insert(mid(machine), LeftCopy::Running);
        self
    }

    /// `unit` is wanted `desired` now (`fleetctl start`, `stop`, `unload`).
    pub fn desired(mut self, unit: &str, desired: DesiredState) -> World {
        let u = self.snap.units.get_mut(&name(unit)).expect("unit exists");
        u.record.desired = desired;
        self
    }

    /// The registry records that `unit` left `machine`, whose copy was `copy` then.
    pub fn left_as(mut self, unit: &str, machine: &str, copy: LeftCopy) -> World {
        let left = self.snap.left.entry(name(unit)).or_default();
        left.insert(mid(machine), copy);
        self
    }

    /// `machine`'s agent withdraws its state of `unit` (it unloaded it).
    pub fn without_state(mut self, unit: &str, machine: &str) -> World {
        if let Some(states) = self.snap.states.get_mut(&name(unit)) {
            states.remove(&mid(machine));
        }
        self
    }

    pub fn plan(&self) -> Vec<Decision> {
        plan(&self.snap, &self.files).decisions
    }

    /// The units the plan holds back until a previous copy stops.
    pub fn waiting(&self) -> Vec<String> {
        let waiting = plan(&self.snap, &self.files).waiting;
        waiting.iter().map(ToString::to_string).collect()
    }

    /// The entry of `unit` on `machine`.
    pub fn entry_of(&self, unit: &str, machine: &str) -> &ScheduleEntry {
        &self.snap.schedule[&name(unit)][&mid(machine)]
    }

    /// What the engine's write does to the registry.
    pub fn apply(&mut self, decisions: &[Decision]) {
        for d in decisions {
            match &d.kind {
                DecisionKind::Unschedule {
                    unit,
                    machine,
                    left,
                } => {
                    let entries = self.snap.schedule.entry(unit.clone()).or_default();
                    entries.remove(machine);
                    if entries.is_empty() {
                        self.snap.schedule.remove(unit);
                    }
                    if let Some(copy) = left {
                        let left = self.snap.left.entry(unit.clone()).or_default();
                        left.insert(machine.clone(), *copy);
                    }
                }
                DecisionKind::Record {
                    unit,
                    machine,
                    copy,
                } => {
                    let left = self.snap.left.entry(unit.clone()).or_default();
                    left.insert(machine.clone(), *copy);
                }
                DecisionKind::Forget { unit, machine } => {
                    let left = self.snap.left.entry(unit.clone()).or_default();
                    left.remove(machine);
                    if left.is_empty() {
                        self.snap.left.remove(unit);
                    }
                }
                kind @ (DecisionKind::Update { .. } | DecisionKind::Schedule { .. }) => {
                    let entry = kind.schedule_entry().expect("an entry's decision");
                    self.snap
                        .schedule
                        .entry(entry.name.clone())
                        .or_default()
                        .insert(entry.machine.clone(), entry);
                }
                DecisionKind::Unschedulable { unit } => {
                    self.snap
                        .unscheduled
                        .insert(unit.clone(), d.reason.to_string());
                }
                DecisionKind::ClearUnschedulable { unit } => {
                    self.snap.unscheduled.remove(unit);
                }
                DecisionKind::Moving { unit, from } => {
                    let record = MoveRecord {
                        unit: unit.clone(),
                        from: from.clone(),
                    };
                    self.snap.moving.insert(unit.clone(), record);
                }
                DecisionKind::MoveOver { unit } => {
                    self.snap.moving.remove(unit);
                }
            }
        }
    }

    /// Plans and applies; returns the plan as lines.
    pub fn settle(&mut self) -> Vec<String> {
        let decisions = self.plan();
        self.apply(&decisions);
        lines(&decisions)
    }

    /// Unit -> machines, as strings.
    pub fn placement(&self) -> BTreeMap<String, Vec<String>> {
        self.snap
            .schedule
            .iter()
            .map(|(u, ms)| (u.to_string(), ms.keys().map(|m| m.to_string()).collect()))
            .collect()
    }
}

pub fn lines(decisions: &[Decision]) -> Vec<String> {
    decisions.iter().map(line).collect()
}

fn line(d: &Decision) -> String {
    let r = &d.reason;
    match &d.kind {
        DecisionKind::Unschedule {
            unit,
            machine,
            left: None,
        } => format!("unschedule {unit} from {machine}: {r}"),
        DecisionKind::Unschedule {
            unit,
            machine,
            left: Some(LeftCopy::Running),
        } => format!("unschedule {unit} from {machine}, recording it left: {r}"),
        DecisionKind::Unschedule {
            unit,
            machine,
            left: Some(copy @ (LeftCopy::Stopped | LeftCopy::Unpublished)),
        } => format!("unschedule {unit} from {machine}, recording it left {copy}: {r}"),
        DecisionKind::Forget { unit, machine } => format!("forget {unit} left {machine}: {r}"),
        DecisionKind::Record {
            unit,
            machine,
            copy,
        } => format!("record {unit} left {machine} {copy}: {r}"),
        DecisionKind::Update {
            unit,
            machine,
            desired,
            ..
        } => {
            format!("update {unit} on {machine} ({desired}): {r}")
        }
        DecisionKind::Schedule {
            unit,
            machine,
            desired,
            ..
        } => {
            format!("schedule {unit} on {machine} ({desired}): {r}")
        }
        DecisionKind::Unschedulable { unit } => format!("unschedulable {unit}: {r}"),
        DecisionKind::ClearUnschedulable { unit } => format!("clear {unit}: {r}"),
        DecisionKind::Moving { unit, from } => format!("moving {unit} from {from}: {r}"),
        DecisionKind::MoveOver { unit } => format!("move over {unit}: {r}"),
    }
}

pub(crate) fn two_machines() -> World {
    World::new().machine("m1", &[]).machine("m2", &[])
}

pub(crate) fn placed(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    pairs
        .iter()
        .map(|(u, ms)| (u.to_string(), ms.iter().map(|m| m.to_string()).collect()))
        .collect()
}

// ---- basics ---------------------------------------------------------------------------------

#[test]
fn schedules_a_launched_unit_on_the_least_loaded_machine() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .entry("a.service", "m1");
    let w = w.unit("b.service", Loaded, "");
    assert_eq!(
        lines(&w.plan()),
        ["schedule b.service on m2 (loaded): target state loaded and unit not scheduled"]
    );
}

#[test]
fn breaks_load_ties_by_machine_id() {
    let w = World::new().machine("m2", &[]).machine("m1", &[]);
    let w = w.unit("a.service", Launched, "");
    assert_eq!(
        lines(&w.plan()),
        ["schedule a.service on m1 (launched): target state launched and unit not scheduled"]
    );
}

#[test]
fn spreads_units_because_earlier_decisions_of_the_plan_count_as_load() {
    let mut w = two_machines();
    for u in ["a.service", "b.service", "c.service", "d.service"] {
        w = w.unit(u, Launched, "");
    }
    w.settle();
    assert_eq!(
        w.placement(),
        placed(&[
            ("a.service", &["m1"]),
            ("b.service", &["m2"]),
            ("c.service", &["m1"]),
            ("d.service", &["m2"]),
        ])
    );
}

#[test]
fn leaves_an_inactive_unit_unscheduled_without_a_reason() {
    let w = two_machines().unit("a.service", Inactive, "");
    assert!(w.plan().is_empty());
}

#[test]
fn a_stable_snapshot_yields_no_decisions() {
    let mut w = two_machines()
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "Conflicts=a.service")
        .unit("g.service", Launched, "Global=true");
    w.settle();
    assert!(w.plan().is_empty(), "{:?}", lines(&w.plan()));
}

#[test]
fn unschedules_a_unit_whose_target_state_becomes_inactive() {
    let w = two_machines().unit("a.service", Inactive, "");
    let w = w.entry_with("a.service", "m1", unit_file("", 0).hash(), Launched);
    assert_eq!(
        lines(&w.plan()),
        ["unschedule a.service from m1, recording it left unpublished: target state inactive"]
    );
}

#[test]
fn unschedules_the_entries_of_a_destroyed_unit() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .entry("a.service", "m2");
    let mut w = w;
    w.snap.units.clear();
    assert_eq!(
        lines(&w.plan()),
        ["unschedule a.service from m2, recording it left unpublished: unit destroyed"]
    );
}

#[test]
fn reschedules_the_units_of_a_machine_that_went_away() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .entry("a.service", "m1");
    let w = w.without_machine("m1");
    assert_eq!(
        lines(&w.plan()),
        [
            "unschedule a.service from m1: target machine m1 went away",
            "schedule a.service on m2 (launched): target machine m1 went away",
        ]
    );
}

#[test]
fn leaves_a_held_unit_on_a_machine_that_went_away() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "")
        .entry("a.service", "m1")
        .entry("b.service", "m1")
        .without_machine("m1");
    let held = [name("a.service")].into();
    let plan = plan_holding(&w.snap, &w.files, &held);
    assert_eq!(
        lines(&plan.decisions),
        [
            "unschedule b.service from m1: target machine m1 went away",
            "schedule b.service on m2 (launched): target machine m1 went away",
        ]
    );
}

#[test]
fn unschedules_a_held_unit_once_it_is_destroyed() {
    let mut w = two_machines()
        .unit("a.service", Launched, "")
        .entry("a.service", "m1")
        .without_machine("m1");
    w.snap.units.clear();
    let held = [name("a.service")].into();
    let plan = plan_holding(&w.snap, &w.files, &held);
    assert_eq!(
        lines(&plan.decisions),
        ["unschedule a.service from m1: unit destroyed"]
    );
}

#[test]
fn a_held_unit_still_counts_against_conflicts_on_a_live_machine() {
    let w = two_machines()
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "Conflicts=a.service")
        .unit("c.service", Launched, "")
        .unit("d.service", Launched, "")
        .entry("a.service", "m2")
        .entry("c.service", "m1")
        .entry("d.service", "m1")
        .machine("m3", &[])
        .entry("b.service", "m3")
        .without_machine("m3");
    let held = [name("a.service")].into();
    let plan = plan_holding(&w.snap, &w.files, &held);
    assert_eq!(
        lines(&plan.decisions),
        [
            "unschedule b.service from m3: target machine m3 went away",
            "schedule b.service on m1 (launched): target machine m3 went away",
        ]
    );
}

#[test]
fn updates_the_entry_in_place_when_the_unit_file_changes() {
    let old = unit_file("", 0).hash();
    let w = two_machines().unit_version("a.service", Launched, "", 1);
    let w = w.entry_with("a.service", "m2", old, Launched);
    let new = unit_file("", 1).hash();
    assert_eq!(
        lines(&w.plan()),
        [format!(
            "update a.service on m2 (launched): unit file changed from {} to {}",
            old.short(),
            new.short()
        )]
    );
}

#[test]
fn updates_the_entry_in_place_when_the_desired_state_changes() {
    let w = two_machines().unit("a.service", Loaded, "");
    let w = w.entry_with("a.service", "m2", unit_file("", 0).hash(), Launched);
    assert_eq!(
        lines(&w.plan()),
        ["update a.service on m2 (loaded): target state changed from launched to loaded"]
    );
}

#[test]
fn keeps_healthy_units_where_they_are_when_an_empty_machine_joins() {
    let mut w = two_machines();
    for u in ["a.service", "b.service", "c.service"] {
        w = w.unit(u, Launched, "");
    }
    w.settle();
    let w = w.machine("m3", &[]);
    assert!(w.plan().is_empty());
}

#[test]
fn keeps_one_entry_of_a_non_global_unit_scheduled_twice() {
    let w = two_machines().unit("a.service", Launched, "");
    let w = w.entry("a.service", "m1").entry("a.service", "m2");
    assert_eq!(
        lines(&w.plan()),
        [
            "unschedule a.service from m2, recording it left unpublished: unit is already \
             scheduled on m1"
        ]
    );
}

#[test]
fn reports_zero_machines_when_the_cluster_is_empty() {
    let w = World::new().unit("a.service", Launched, "");
    assert_eq!(
        lines(&w.plan()),
        ["unschedulable a.service: zero machines available"]
    );
}

#[test]
fn leaves_a_unit_whose_file_is_missing_where_it_is() {
    let mut w = two_machines()
        .unit("a.service", Launched, "")
        .entry("a.service", "m1");
    w = w.unit("b.service", Launched, "");
    w.files.clear();
    assert!(w.plan().is_empty());
}

// ---- MachineID --------------------------------------------------------------------------------

#[test]
fn places_a_unit_on_the_machine_its_machine_id_names() {
    let w = two_machines().unit("a.service", Launched, "MachineID=m2");
    assert_eq!(
        lines(&w.plan()),
        ["schedule a.service on m2 (launched): target state launched and unit not scheduled"]
    );
}

#[test]
fn accepts_the_eight_character_short_machine_id() {
    let w = World::new()
        .machine("0123456789abcdef", &[])
        .machine("fedcba9876543210", &[])
        .unit("a.service", Launched, "X-ConditionMachineID=fedcba98");
    w.clone().settle();
    let mut w = w;
    w.settle();
    assert_eq!(
        w.placement(),
        placed(&[("a.service", &["fedcba9876543210"])])
    );
}

#[test]
fn says_why_no_machine_matches_machine_id() {
    let w = two_machines().unit("a.service", Launched, "MachineID=m9");
    assert_eq!(
        lines(&w.plan()),
        ["unschedulable a.service: no machine able to run unit: 2 machines are not MachineID=m9"]
    );
}

#[test]
fn moves_a_unit_whose_new_file_names_another_machine() {
    let w = two_machines().unit_version("a.service", Launched, "MachineID=m2", 1);
    let w = w.entry_with("a.service", "m1", unit_file("", 0).hash(), Launched);
    assert_eq!(
        lines(&w.plan()),
        [
            "unschedule a.service from m1, recording it left unpublished: target machine m1 \
             unable to run unit: \
             machine ID does not match required \"m2\"",
            "schedule a.service on m2 (launched): target machine m1 unable to run unit: \
             machine ID does not match required \"m2\"",
        ]
    );
}

// ---- MachineMetadata --------------------------------------------------------------------------

#[test]
fn places_only_on_machines_whose_metadata_matches() {
    let w = World::new()
        .machine("m1", &[("role", "db")])
        .machine("m2", &[("role", "web")])
        .unit("a.service", Launched, "MachineMetadata=role=web");
    let mut w = w;
    w.settle();
    assert_eq!(w.placement(), placed(&[("a.service", &["m2"])]));
}

#[test]
fn accepts_either_value_of_a_repeated_metadata_key_but_needs_every_key() {
    let mut w = World::new()
        .machine("m1", &[("role", "db"), ("disk", "ssd")])
        .machine("m2", &[("role", "web")])
        .machine("m3", &[("role", "web"), ("disk", "ssd")])
        .unit(
            "either.service",
            Launched,
            "MachineMetadata=\"role=db\" \"role=web\"",
        )
        .unit(
            "both.service",
            Launched,
            "MachineMetadata=role=web;MachineMetadata=disk=ssd",
        );
    w.settle();
    assert_eq!(
        w.placement(),
        placed(&[("both.service", &["m3"]), ("either.service", &["m1"])])
    );
}

#[test]
fn moves_a_unit_when_its_machine_metadata_changes() {
    let mut w = World::new()
        .machine("m1", &[("role", "web")])
        .machine("m2", &[("role", "web")])
        .unit("a.service", Launched, "MachineMetadata=role=web")
        .entry("a.service", "m1");
    w = w.machine("m1", &[("role", "db")]);
    assert_eq!(
        w.settle(),
        [
            "unschedule a.service from m1, recording it left unpublished: target machine m1 \
             unable to run unit: \
             machine metadata lacks role=web",
            "schedule a.service on m2 (launched): target machine m1 unable to run unit: \
             machine metadata lacks role=web",
        ]
    );
}

// ---- MachineOf --------------------------------------------------------------------------------

#[test]
fn places_a_dependent_on_its_peers_machine_even_when_named_first() {
    let mut w = two_machines()
        .unit("x.service", Launched, "")
        .unit("z.service", Launched, "")
        .unit("a.service", Launched, "MachineOf=z.service");
    w.settle();
    assert_eq!(
        w.placement(),
        placed(&[
            ("a.service", &["m2"]),
            ("x.service", &["m1"]),
            ("z.service", &["m2"])
        ])
    );
    assert!(w.plan().is_empty());
}

#[test]
fn a_dependent_of_an_unscheduled_peer_is_unschedulable() {
    let w = two_machines()
        .unit("a.service", Launched, "MachineOf=b.service")
        .unit("b.service", Inactive, "");
    assert_eq!(
        lines(&w.plan()),
        ["unschedulable a.service: required peer unit b.service is not scheduled"]
    );
}

#[test]
fn units_that_are_machine_of_each_other_are_unschedulable() {
    let w = two_machines()
        .unit("a.service", Launched, "MachineOf=b.service")
        .unit("b.service", Launched, "MachineOf=a.service");
    assert_eq!(
        lines(&w.plan()),
        [
            "unschedulable a.service: required peer unit b.service is not scheduled",
            "unschedulable b.service: required peer unit a.service is not scheduled",
        ]
    );
}

#[test]
fn dependents_move_with_their_peer_when_its_machine_goes() {
    let w = World::new()
        .machine("m1", &[])
        .machine("m2", &[])
        .machine("m3", &[])
        .unit("peer.service", Launched, "")
        .unit("dep.service", Launched, "MachineOf=peer.service")
        .unit("other.service", Launched, "")
        .entry("peer.service", "m1")
        .entry("dep.service", "m1")
        .entry("other.service", "m2");
    let mut w = w.without_machine("m1");
    w.settle();
    assert_eq!(
        w.placement(),
        placed(&[
            ("dep.service", &["m3"]),
            ("other.service", &["m2"]),
            ("peer.service", &["m3"]),
        ])
    );
}

#[test]
fn dependents_follow_a_peer_displaced_by_a_replacing_unit() {
    let mut w = two_machines()
        .unit("old.service", Launched, "")
        .unit("dep.service", Launched, "MachineOf=old.service")
        .unit("busy.service", Launched, "")
        .unit("busy2.service", Launched, "")
        .unit("busy3.service", Launched, "")
        .entry("old.service", "m1")
        .entry("dep.service", "m1")
        .entry("busy.service", "m2")
        .entry("busy2.service", "m2")
        .entry("busy3.service", "m2");
    w = w.unit("new.service", Launched, "Replaces=old.service");
    w.settle();
    assert_eq!(w.placement()["new.service"], ["m1"]);
    assert_eq!(w.placement()["old.service"], ["m2"]);
    assert_eq!(w.placement()["dep.service"], ["m2"]);
    assert!(w.plan().is_empty());
}

#[test]
fn a_dependent_can_follow_a_global_peer() {
    let mut w = World::new()
        .machine("m1", &[("role", "db")])
        .machine("m2", &[("role", "web")])
        .unit(
            "agent.service",
            Launched,
            "Global=true;MachineMetadata=role=web",
        )
        .unit("a.service", Launched, "MachineOf=agent.service");
    w.settle();
    assert_eq!(
        w.placement(),
        placed(&[("a.service", &["m2"]), ("agent.service", &["m2"])])
    );
}

// ---- Conflicts --------------------------------------------------------------------------------

#[test]
fn conflicting_units_go_to_different_machines_even_when_declared_one_way() {
    let mut w = two_machines()
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "")
        .unit("c.service", Launched, "Conflicts=a.service");
    w.settle();
    assert_eq!(
        w.placement(),
        placed(&[
            ("a.service", &["m1"]),
            ("b.service", &["m2"]),
            ("c.service", &["m2"])
        ])
    );
}

#[test]
fn conflict_globs_match_unit_names() {
    let w = World::new()
        .machine("m1", &[])
        .unit("web@1.service", Launched, "Conflicts=web@*.service")
        .unit("web@2.service", Launched, "Conflicts=web@*.service");
    assert_eq!(
        lines(&w.plan()),
        [
            "schedule web@1.service on m1 (launched): target state launched and unit not scheduled",
            "unschedulable web@2.service: no machine able to run unit: \
             1 machine runs a conflicting web@1.service",
        ]
    );
}

#[test]
fn of_two_conflicting_units_on_one_machine_the_first_in_name_order_stays() {
    let w = World::new()
        .machine("m1", &[])
        .machine("m2", &[])
        .unit("a.service", Launched, "")
        .unit_version("b.service", Launched, "Conflicts=a.service", 1)
        .entry("a.service", "m1")
        .entry_with("b.service", "m1", unit_file("", 0).hash(), Launched);
    assert_eq!(
        lines(&w.plan()),
        [
            "unschedule b.service from m1, recording it left unpublished: target machine m1 \
             unable to run unit: \
             conflicts with unit a.service scheduled here",
            "schedule b.service on m2 (launched): target machine m1 unable to run unit: \
             conflicts with unit a.service scheduled here",
        ]
    );
}

#[test]
fn counts_the_machines_that_refuse_a_unit_for_the_same_reason() {
    let mut w = World::new();
    for i in 1..=7 {
        w = w.machine(&format!("m{i}"), &[]);
    }
    let w = w.unit(
        "a.service",
        Launched,
        "MachineMetadata=role=x;MachineMetadata=role=y",
    );
    assert_eq!(
        w.plan()[0].reason.to_string(),
        "no machine able to run unit: 7 machines lack role=x or role=y"
    );
}

/// The reason the plan publishes for `unit`, which it cannot place.
fn unschedulable_reason_of(w: &World, unit: &str) -> String {
    let d = w
        .plan()
        .into_iter()
        .find(|d| matches!(&d.kind, DecisionKind::Unschedulable { unit: u } if u.as_str() == unit));
    d.expect("the unit is unschedulable").reason.to_string()
}

/// A 32-character machine ID made of `c`.
fn long_id(c: char) -> String {
    c.to_string().repeat(32)
}

#[test]
fn names_the_machines_of_small_groups_by_short_id_when_the_reasons_differ() {
    let mut w = World::new();
    for c in ['a', 'b', 'c', 'd', 'e'] {
        w = w.machine(&long_id(c), &[]);
    }
    let w = w
        .machine(&long_id('b'), &[("tier", "api")])
        .unit("web@1.service", Launched, "")
        .entry("web@1.service", &long_id('b'))
        .unit(
            "web@2.service",
            Launched,
            "MachineMetadata=tier=api;Conflicts=web@*",
        );
    assert_eq!(
        unschedulable_reason_of(&w, "web@2.service"),
        "no machine able to run unit: 4 machines lack tier=api; \
         1 machine (bbbbbbbb) runs a conflicting web@1.service"
    );
}

#[test]
fn summarises_the_groups_past_the_fourth() {
    let mut w = World::new();
    for (i, c) in ['a', 'b', 'c', 'd', 'e', 'f'].into_iter().enumerate() {
        let unit = format!("web@{i}.service");
        w = w
            .machine(&long_id(c), &[])
            .unit(&unit, Launched, "")
            .entry(&unit, &long_id(c));
    }
    let w = w.unit("web@9.service", Launched, "Conflicts=web@*");
    assert_eq!(
        unschedulable_reason_of(&w, "web@9.service"),
        "no machine able to run unit: 1 machine (aaaaaaaa) runs a conflicting web@0.service; \
         1 machine (bbbbbbbb) runs a conflicting web@1.service; \
         1 machine (cccccccc) runs a conflicting web@2.service; \
         1 machine (dddddddd) runs a conflicting web@3.service; \
         2 more machines for other reasons"
    );
}

// ---- Replaces ---------------------------------------------------------------------------------

#[test]
fn a_replacing_unit_may_take_the_replaced_units_machine_which_is_displaced() {
    let w = two_machines()
        .unit("old.service", Launched, "")
        .unit("x.service", Launched, "")
        .unit("y.service", Launched, "")
        .entry("old.service", "m1")
        .entry("x.service", "m2")
        .entry("y.service", "m2")
        .unit("new.service", Launched, "Replaces=old.service");
    assert_eq!(
        lines(&w.plan()),
        [
            "unschedule old.service from m1, recording it left unpublished: replaced by unit \
             new.service on machine m1",
            "schedule new.service on m1 (launched): target state launched and unit not scheduled",
            "schedule old.service on m2 (launched): replaced by unit new.service on machine m1",
        ]
    );
}

#[test]
fn a_replaced_unit_with_nowhere_else_to_go_is_unschedulable() {
    let w = World::new()
        .machine("m1", &[])
        .unit("old.service", Launched, "")
        .entry("old.service", "m1")
        .unit("new.service", Launched, "Replaces=old.*");
    assert_eq!(
        lines(&w.plan()),
        [
            "unschedule old.service from m1, recording it left unpublished: replaced by unit \
             new.service on machine m1",
            "schedule new.service on m1 (launched): target state launched and unit not scheduled",
            "unschedulable old.service: no machine able to run unit: \
             1 machine runs new.service, which replaces it",
        ]
    );
}

/// The case `healthy_units_stay_when_a_unit_without_replaces_arrives` found: the settled
/// world is settled (re-planning yields nothing), but `new` is held only because the
/// least-loaded machine is not the one its copy runs on. A unit without `Replaces=` that
/// evens the load makes that machine the least-loaded one, so the hold ends there and `new`
/// displaces the unit it replaces, as `Replaces=` says.
#[test]
fn a_new_unit_that_evens_the_load_lets_a_held_unit_land_where_its_copy_runs() {
    let mut w = two_machines()
        .unit("new.service", Loaded, "Replaces=old.service")
        .unit("old.service", Loaded, "")
        .entry("old.service", "m1")
        .left("new.service", "m1")
        .state("new.service", "m1", "active");
    assert_eq!(
        w.settle(),
        ["unschedulable new.service: waiting for the previous copy on m1 to stop"]
    );
    assert!(w.plan().is_empty());
    assert_eq!(w.waiting(), ["new.service"]);
    let w = w.unit("x.service", Loaded, "");
    assert_eq!(
        lines(&w.plan()),
        [
            "unschedule old.service from m1, recording it left unpublished: replaced by unit \
             new.service on machine m1",
            "schedule new.service on m1 (loaded): target state loaded and unit not scheduled",
            "schedule old.service on m2 (loaded): replaced by unit new.service on machine m1",
            "schedule x.service on m2 (loaded): target state loaded and unit not scheduled",
            "forget new.service left m1: scheduled on m1 again",
            "clear new.service: unit is scheduled now",
        ]
    );
}

#[test]
fn ignores_units_that_replace_each_other() {
    let w = World::new()
        .machine("m1", &[])
        .unit("a.service", Launched, "Replaces=b.service")
        .unit("b.service", Launched, "Replaces=a.service")
        .entry("a.service", "m1")
        .entry("b.service", "m1");
    assert!(w.plan().is_empty());
}

// ---- Global -----------------------------------------------------------------------------------

#[test]
fn a_global_unit_runs_on_every_matching_machine_including_new_ones() {
    let mut w = World::new()
        .machine("m1", &[("role", "web")])
        .machine("m2", &[("role", "db")])
        .machine("m3", &[("role", "web")])
        .unit(
            "g.service",
            Launched,
            "Global=true;MachineMetadata=role=web",
        );
    w.settle();
    assert_eq!(w.placement(), placed(&[("g.service", &["m1", "m3"])]));
    let w = w.machine("m4", &[("role", "web")]);
    assert_eq!(
        lines(&w.plan()),
        ["schedule g.service on m4 (launched): global unit and the machine qualifies"]
    );
}

#[test]
fn of_two_conflicting_globals_the_first_in_name_order_wins_even_when_it_comes_later() {
    let mut w = two_machines()
        .unit("b.service", Launched, "Global=true")
        .entry("b.service", "m1")
        .entry("b.service", "m2")
        .unit("a.service", Launched, "Global=true;Conflicts=b.service");
    w.settle();
    assert_eq!(w.placement(), placed(&[("a.service", &["m1", "m2"])]));
    assert_eq!(
        w.snap.unscheduled[&name("b.service")],
        "no machine able to run unit: 2 machines run a conflicting a.service"
    );
}

#[test]
fn a_global_unit_yields_to_a_conflicting_unit_already_on_a_machine() {
    let mut w = two_machines()
        .unit("z.service", Launched, "")
        .entry("z.service", "m1")
        .unit("a.service", Launched, "Global=true;Conflicts=z.service");
    assert_eq!(
        w.settle(),
        ["schedule a.service on m2 (launched): global unit and the machine qualifies"]
    );
    let w = w.unit("y.service", Launched, "");
    assert_eq!(
        lines(&w.plan()),
        ["schedule y.service on m1 (launched): target state launched and unit not scheduled"],
        "a unit conflicting with no global may go anywhere"
    );
}

#[test]
fn a_unit_avoids_machines_where_a_conflicting_global_runs() {
    let mut w = World::new()
        .machine("m1", &[("role", "web")])
        .machine("m2", &[])
        .unit(
            "g.service",
            Launched,
            "Global=true;MachineMetadata=role=web",
        )
        .unit("x.service", Launched, "")
        .unit("y.service", Launched, "")
        .unit("z.service", Launched, "Conflicts=g.service");
    w.settle();
    assert_eq!(w.placement()["z.service"], ["m2"]);
}

#[test]
fn a_global_unit_matching_no_machine_gets_a_reason_and_loses_it_when_one_joins() {
    let mut w = World::new().machine("m1", &[]).unit(
        "g.service",
        Launched,
        "Global=true;MachineMetadata=role=gpu",
    );
    assert_eq!(
        w.settle(),
        ["unschedulable g.service: no machine able to run unit: 1 machine lacks role=gpu"]
    );
    let mut w = w.machine("m2", &[("role", "gpu")]);
    assert_eq!(
        w.settle(),
        [
            "schedule g.service on m2 (launched): global unit and the machine qualifies",
            "clear g.service: unit is scheduled now",
        ]
    );
}

#[test]
fn an_inactive_global_unit_leaves_every_machine() {
    let w = two_machines()
        .unit("g.service", Inactive, "Global=true")
        .entry_with(
            "g.service",
            "m1",
            unit_file("Global=true", 0).hash(),
            Launched,
        )
        .entry_with(
            "g.service",
            "m2",
            unit_file("Global=true", 0).hash(),
            Launched,
        );
    assert_eq!(
        lines(&w.plan()),
        [
            "unschedule g.service from m1: target state inactive",
            "unschedule g.service from m2: target state inactive",
        ]
    );
}

// ---- unscheduled reasons ----------------------------------------------------------------------

#[test]
fn publishes_a_reason_once_and_clears_it_when_the_unit_is_placed() {
    let mut w = World::new().unit("a.service", Launched, "");
    assert_eq!(
        w.settle(),
        ["unschedulable a.service: zero machines available"]
    );
    assert!(w.plan().is_empty(), "the same reason is not written again");
    let mut w = w.machine("m1", &[]);
    assert_eq!(
        w.settle(),
        [
            "schedule a.service on m1 (launched): target state launched and unit not scheduled",
            "clear a.service: unit is scheduled now",
        ]
    );
}

#[test]
fn clears_the_reason_of_a_unit_made_inactive() {
    let mut w = World::new().unit("a.service", Launched, "");
    w.settle();
    let w = w.unit("a.service", Inactive, "");
    assert_eq!(
        lines(&w.plan()),
        ["clear a.service: unit is inactive or destroyed"]
    );
}

#[test]
fn a_unit_does_not_displace_a_unit_its_own_peers_need() {
    let w = World::new()
        .machine("m1", &[])
        .unit("a.service", Launched, "")
        .unit("b.service", Launched, "MachineOf=a.service")
        .unit(
            "c.service",
            Launched,
            "MachineOf=b.service;Replaces=a.service",
        )
        .entry("a.service", "m1")
        .entry("b.service", "m1");
    assert_eq!(
        lines(&w.plan()),
        ["unschedulable c.service: no machine able to run unit: \
          1 machine would lose its peer b.service along with a unit it replaces"]
    );
}

// ---- validation -------------------------------------------------------------------------------

#[test]
fn never_places_a_unit_whose_options_fleet_refuses() {
    let w = two_machines()
        .unit("a.service", Launched, "MachineID=m1;Conflicts=b.service")
        .entry_with("a.service", "m1", unit_file("", 0).hash(), Launched);
    assert_eq!(
        lines(&w.plan()),
        [
            "unschedule a.service from m1, recording it left unpublished: invalid [X-Fleet] \
             options: \
             MachineID cannot be used with Conflicts",
            "unschedulable a.service: invalid [X-Fleet] options: \
             MachineID cannot be used with Conflicts",
        ]
    );
}
