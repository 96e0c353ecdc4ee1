//! The pure desired-state builder: from this machine's schedule and the unit files read for it,
//! the units the planner should converge to, and the scheduled units it must leave as they are
//! this pass.
//!
//! Synchronous and free of I/O, time and logging, like [`mod@crate::plan`]. It does not ask
//! systemd anything: which unowned units are an operator's is the loop's question to the
//! [`crate::manager::UnitManager`] ([`Desired::unowned`] says which to ask about, and
//! [`Desired::hold`] takes the answer).

use fleet_core::{LoadState, UnitFile, UnitHash, UnitName};
use fleet_registry::ScheduleEntry;
use std::collections::{BTreeMap, BTreeSet};

use crate::plan::{CurrentUnit, DesiredUnit, Target, UnitFileState};

/// What this pass should converge to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// The units to plan for: desired file, target and restart generation, from the schedule.
    pub units: BTreeMap<UnitName, DesiredUnit>,
    /// Scheduled units left exactly as they are: their file is not at hand (it cannot be
    /// (re)loaded, and treating the unit as unscheduled would remove it), or systemd has them
    /// from an operator's file.
    pub held: BTreeSet<UnitName>,
}

impl Desired {
    /// The desired units of `schedule`; `files` holds the unit files read so far, by hash.
    pub fn build(
        schedule: &BTreeMap<UnitName, ScheduleEntry>,
        files: &BTreeMap<UnitHash, UnitFile>,
    ) -> Desired {
        Desired::of_entries(schedule.iter(), files)
    }

    /// The desired units of `names` alone (each scheduled one as [`build`](Self::build)
    /// makes it): a pass over the units a hint named costs those units, not every unit
    /// scheduled here.
    pub fn build_of(
        schedule: &BTreeMap<UnitName, ScheduleEntry>,
        files: &BTreeMap<UnitHash, UnitFile>,
        names: &BTreeSet<UnitName>,
    ) -> Desired {
        let entries = names.iter().filter_map(|name| schedule.get_key_value(name));
        Desired::of_entries(entries, files)
    }

    fn of_entries<'a>(
        entries: impl Iterator<Item = (&'a UnitName, &'a ScheduleEntry)>,
        files: &BTreeMap<UnitHash, UnitFile>,
    ) -> Desired {
        let mut desired = Desired::default();
        for (name, e) in entries {
            let Some(target) = Target::from_desired(e.desired) else {
                continue;
            };
            if !files.contains_key(&e.hash) {
                desired.held.insert(name.clone());
                continue;
            }
            let unit = DesiredUnit {
                hash: e.hash,
                target,
                restart: e.restart,
                no_restart: e.no_restart,
            };
            desired.units.insert(name.clone(), unit);
        }
        desired
    }

    /// Desired units with no file in the units directory that systemd may nevertheless have
    /// loaded: the definition may be an operator's, so ask where it comes from before acting.
    /// Only a unit systemd said it does not know (`not-found`) is surely free; a unit missing
    /// from `current`, or without a systemd state (the last read of systemd failed), is asked
    /// about too: fail closed.
    pub fn unowned(&self, current: &BTreeMap<UnitName, CurrentUnit>) -> Vec<UnitName> {
        self.units
            .keys()
            .filter(|name| match current.get(*name) {
                None => true,
                Some(unit) => {
                    matches!(unit.file, UnitFileState::Absent)
                        && unit
                            .systemd
                            .as_ref()
                            .is_none_or(|s| s.load_state() != LoadState::NotFound)
                }
            })
            .cloned()
            .collect()
    }

    /// Leaves `name` as it is this pass.
    pub fn hold(&mut self, name: UnitName) {
        self.units.remove(&name);
        self.held.insert(name);
    }

    /// The desired hash of each unit to plan for, as the executor takes it.
    pub fn hashes(&self) -> BTreeMap<UnitName, UnitHash> {
        self.units
            .iter()
            .map(|(name, unit)| (name.clone(), unit.hash))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::{DesiredState, MachineId, SystemdState};

    fn name(s: &str) -> UnitName {
        s.parse().unwrap()
    }

    fn file(exec: &str) -> UnitFile {
        UnitFile::parse(format!("[Service]\nExecStart={exec}\n").as_bytes()).unwrap()
    }

    fn entry(unit: &str, file: &UnitFile, desired: DesiredState) -> (UnitName, ScheduleEntry) {
        let e = ScheduleEntry {
            name: name(unit),
            machine: "m1".parse::<MachineId>().unwrap(),
            hash: file.hash(),
            desired,
            restart: 0,
            no_restart: false,
            placement: 0,
        };
        (name(unit), e)
    }

    fn files(list: &[&UnitFile]) -> BTreeMap<UnitHash, UnitFile> {
        list.iter().map(|f| (f.hash(), (*f).clone())).collect()
    }

    fn current(file: UnitFileState, load: &str) -> CurrentUnit {
        CurrentUnit {
            file,
            systemd: Some(SystemdState {
                load: load.to_owned(),
                active: "inactive".to_owned(),
                sub: "dead".to_owned(),
            }),
            need_daemon_reload: false,
            restarted: None,
        }
    }

    #[test]
    fn carries_the_target_and_restart_generation_of_each_scheduled_unit() {
        let f = file("/bin/a");
        let (a, mut e) = entry("a.service", &f, DesiredState::Launched);
        e.restart = 3;
        e.no_restart = true;
        let desired = Desired::build(&BTreeMap::from([(a.clone(), e)]), &files(&[&f]));
        assert_eq!(
            desired.units[&a],
            DesiredUnit {
                hash: f.hash(),
                target: Target::Launched,
                restart: 3,
                no_restart: true,
            }
        );
        assert!(desired.held.is_empty());
        assert_eq!(desired.hashes(), BTreeMap::from([(a, f.hash())]));
    }

    #[test]
    fn loaded_units_are_desired_loaded() {
        let f = file("/bin/a");
        let schedule = BTreeMap::from([entry("a.service", &f, DesiredState::Loaded)]);
        let desired = Desired::build(&schedule, &files(&[&f]));
        assert_eq!(desired.units[&name("a.service")].target, Target::Loaded);
    }

    #[test]
    fn holds_a_scheduled_unit_whose_file_is_not_at_hand() {
        let (have, missing) = (file("/bin/a"), file("/bin/b"));
        let schedule = BTreeMap::from([
            entry("a.service", &have, DesiredState::Launched),
            entry("b.service", &missing, DesiredState::Launched),
        ]);
        let desired = Desired::build(&schedule, &files(&[&have]));
        assert_eq!(
            desired.units.keys().collect::<Vec<_>>(),
            [&name("a.service")]
        );
        assert_eq!(desired.held, BTreeSet::from([name("b.service")]));
    }

    #[test]
    fn an_inactive_entry_is_not_desired_here() {
        let f = file("/bin/a");
        let schedule = BTreeMap::from([entry("a.service", &f, DesiredState::Inactive)]);
        let desired = Desired::build(&schedule, &files(&[&f]));
        assert_eq!(desired, Desired::default());
    }

    #[test]
    fn asks_about_units_systemd_has_loaded_or_may_have_loaded_without_a_file_of_ours() {
        let f = file("/bin/a");
        let schedule = BTreeMap::from([
            entry("ours.service", &f, DesiredState::Launched),
            entry("operator.service", &f, DesiredState::Launched),
            entry("unknown.service", &f, DesiredState::Launched),
            entry("new.service", &f, DesiredState::Launched),
        ]);
        let desired = Desired::build(&schedule, &files(&[&f]));
        let present = UnitFileState::Present {
            hash: f.hash(),
            linked: true,
        };
        let current = BTreeMap::from([
            (name("ours.service"), current(present, "loaded")),
            (
                name("operator.service"),
                current(UnitFileState::Absent, "loaded"),
            ),
            (
                name("unknown.service"),
                current(UnitFileState::Absent, "not-found"),
            ),
        ]);
        // new.service is missing from what systemd said (its read failed): asked too.
        assert_eq!(
            desired.unowned(&current),
            [name("new.service"), name("operator.service")]
        );
    }

    #[test]
    fn built_for_some_names_it_is_the_whole_build_restricted_to_them() {
        let (have, missing) = (file("/bin/a"), file("/bin/b"));
        let schedule = BTreeMap::from([
            entry("a.service", &have, DesiredState::Launched),
            entry("b.service", &missing, DesiredState::Launched),
            entry("c.service", &have, DesiredState::Loaded),
            entry("d.service", &have, DesiredState::Inactive),
        ]);
        let files = files(&[&have]);
        let whole = Desired::build(&schedule, &files);
        let names = BTreeSet::from([
            name("b.service"),
            name("c.service"),
            name("d.service"),
            name("unscheduled.service"),
        ]);
        let some = Desired::build_of(&schedule, &files, &names);
        let mut expected = whole.clone();
        expected.units.retain(|n, _| names.contains(n));
        expected.held.retain(|n| names.contains(n));
        assert_eq!(some, expected);
        assert_eq!(some.units.keys().collect::<Vec<_>>(), [&name("c.service")]);
        assert_eq!(some.held, BTreeSet::from([name("b.service")]));
    }

    #[test]
    fn a_held_unit_leaves_the_plan() {
        let f = file("/bin/a");
        let schedule = BTreeMap::from([entry("a.service", &f, DesiredState::Launched)]);
        let mut desired = Desired::build(&schedule, &files(&[&f]));
        desired.hold(name("a.service"));
        assert!(desired.units.is_empty());
        assert!(desired.hashes().is_empty());
        assert_eq!(desired.held, BTreeSet::from([name("a.service")]));
    }
}
