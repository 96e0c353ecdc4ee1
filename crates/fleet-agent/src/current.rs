//! Reading what this machine has: the units directory and systemd's view of each unit in it,
//! turned into the planner's `CurrentUnit`s and the states the agent publishes.

use fleet_core::{MachineId, SystemdState, UnitHash, UnitName};
use fleet_registry::UnitStateRecord;
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};

use crate::manager::{InstalledUnit, ManagerError, UnitManager};
use crate::plan::{CurrentUnit, UnitFileState};

/// Everything known about the units in the units directory (plus desired units systemd knows).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Current {
    pub units: BTreeMap<UnitName, CurrentUnit>,
    /// Hash of each readable file in the units directory.
    pub hashes: BTreeMap<UnitName, UnitHash>,
    /// Drop-ins systemd applies on top of our files, refreshed at boot and after reloads.
    pub drop_ins: BTreeMap<UnitName, Vec<String>>,
    /// Running units whose process started from an older file than the one in place.
    pub restart_pending: BTreeSet<UnitName>,
    /// What the agent saw happen to its units (`agent::observed`), for their state records.
    pub history: BTreeMap<UnitName, UnitHistory>,
}

/// A unit's history on this machine, as its state record carries it (issue 41).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitHistory {
    /// Restarts after failing since the agent started it here: systemd's and the agent's.
    pub restarts: u64,
    /// systemd's `StateChangeTimestamp`, in microseconds since the epoch.
    pub since: Option<u64>,
    /// How its main process last ended (`exit status 3`).
    pub exit: Option<String>,
}

impl Current {
    /// Reads the units directory and the systemd state of its units and of `also` (desired
    /// units that may have no file yet), in one batched status call.
    pub async fn read<M: UnitManager>(
        manager: &M,
        also: &BTreeSet<UnitName>,
        previous_drop_ins: &BTreeMap<UnitName, Vec<String>>,
    ) -> Result<Current, ManagerError> {
        let installed = manager.installed().await?;
        let mut names: BTreeSet<UnitName> = installed.iter().map(|u| u.name.clone()).collect();
        names.extend(also.iter().cloned());
        let names: Vec<UnitName> = names.into_iter().collect();
        let status = manager.status(&names).await?;
        let mut current = Current::default();
        for inst in &installed {
            let file = match &inst.content {
                Ok(hash) => {
                    current.hashes.insert(inst.name.clone(), *hash);
                    UnitFileState::Present {
                        hash: *hash,
                        linked: inst.linked,
                    }
                }
                Err(_) => UnitFileState::Unparseable,
            };
            current.units.insert(
                inst.name.clone(),
                CurrentUnit {
                    file,
                    systemd: status.get(&inst.name).cloned(),
                    need_daemon_reload: false,
                    restarted: None,
                },
            );
            if let Some(d) = previous_drop_ins.get(&inst.name) {
                current.drop_ins.insert(inst.name.clone(), d.clone());
            }
        }
        for name in also {
            current
                .units
                .entry(name.clone())
                .or_insert_with(|| CurrentUnit {
                    file: UnitFileState::Absent,
                    systemd: status.get(name).cloned(),
                    need_daemon_reload: false,
                    restarted: None,
                });
        }
        Ok(current)
    }

    /// Re-reads only the units of `names`: each one's file in the units directory and
    /// systemd's state of it, in one batched status call, leaving every other unit as the
    /// last read found it. A pass that follows a change of a few units costs those units, not
    /// every unit the machine runs: with 1,000 units an agent, each pass listed 1,000 files
    /// and asked systemd about 1,000 units (docs/benchmarks.md, "the agent's pass"). A name
    /// with no file here stays known (as `Absent`) only while `desired` says it is scheduled
    /// here, as in [`Current::read`]. Nothing changes if either read fails.
    pub async fn refresh<M: UnitManager>(
        &mut self,
        manager: &M,
        names: &BTreeSet<UnitName>,
        desired: impl Fn(&UnitName) -> bool,
    ) -> Result<(), ManagerError> {
        if names.is_empty() {
            return Ok(());
        }
        let list: Vec<UnitName> = names.iter().cloned().collect();
        let installed = manager.installed_of(&list).await?;
        let files: BTreeMap<&UnitName, &InstalledUnit> =
            installed.iter().map(|u| (&u.name, u)).collect();
        let asked: Vec<UnitName> = list
            .into_iter()
            .filter(|n| files.contains_key(n) || desired(n))
            .collect();
        let status = if asked.is_empty() {
            BTreeMap::new()
        } else {
            manager.status(&asked).await?
        };
        for name in names {
            let file = match files.get(name) {
                Some(inst) => match &inst.content {
                    Ok(hash) => {
                        self.hashes.insert(name.clone(), *hash);
                        UnitFileState::Present {
                            hash: *hash,
                            linked: inst.linked,
                        }
                    }
                    Err(_) => {
                        self.hashes.remove(name);
                        UnitFileState::Unparseable
                    }
                },
                None => {
                    self.hashes.remove(name);
                    self.drop_ins.remove(name);
                    if !desired(name) {
                        self.units.remove(name);
                        continue;
                    }
                    UnitFileState::Absent
                }
            };
            let restarted = self.units.get(name).and_then(|u| u.restarted);
            self.units.insert(
                name.clone(),
                CurrentUnit {
                    file,
                    systemd: status.get(name).cloned(),
                    need_daemon_reload: false,
                    restarted,
                },
            );
        }
        Ok(())
    }

    /// Adds systemd's state of the units of `names` that have no file here (desired units
    /// systemd may have from elsewhere), in one batched status call. Boot needs it: the units
    /// directory is read before the schedule, and the first plan must see an operator's unit of
    /// a scheduled name as systemd has it, not as unknown.
    pub async fn read_unfiled<M: UnitManager>(
        &mut self,
        manager: &M,
        names: &BTreeSet<UnitName>,
    ) -> Result<(), ManagerError> {
        let names: Vec<UnitName> = names
            .iter()
            .filter(|n| !self.units.contains_key(*n))
            .cloned()
            .collect();
        if names.is_empty() {
            return Ok(());
        }
        let status = manager.status(&names).await?;
        for name in names {
            let systemd = status.get(&name).cloned();
            self.units.insert(
                name,
                CurrentUnit {
                    file: UnitFileState::Absent,
                    systemd,
                    need_daemon_reload: false,
                    restarted: None,
                },
            );
        }
        Ok(())
    }

    /// Reads per-unit details (drop-ins, NeedDaemonReload) of every unit with a file: at boot,
    /// to adopt correctly, and after a daemon-reload, to report drop-ins.
    pub async fn read_details<M: UnitManager>(&mut self, manager: &M) {
        let names: Vec<UnitName> = self.hashes.keys().cloned().collect();
        let details: Vec<(UnitName, Result<_, ManagerError>)> = futures::stream::iter(names)
            .map(|name| async move {
                let d = manager.reload_facts(&name).await;
                (name, d)
            })
            .buffer_unordered(32)
            .collect()
            .await;
        for (name, d) in details {
            let Ok(d) = d else { continue };
            let drop_ins: Vec<String> = d
                .drop_in_paths
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            if drop_ins.is_empty() {
                self.drop_ins.remove(&name);
            } else {
                self.drop_ins.insert(name.clone(), drop_ins);
            }
            if let Some(u) = self.units.get_mut(&name) {
                u.need_daemon_reload = d.need_daemon_reload;
            }
        }
    }

    /// Fills in the restart generation each unit has had here; returns the units whose
    /// generation changed (their published state changes with it). `done` is every unit's
    /// generation in name order (the ledger's): both are walked once, side by side, where a
    /// lookup per unit cost ten name comparisons on every pass.
    pub fn set_restarted<'a>(
        &mut self,
        done: impl IntoIterator<Item = (&'a UnitName, u64)>,
    ) -> Vec<UnitName> {
        let mut done = done.into_iter().peekable();
        let mut changed = Vec::new();
        for (name, unit) in &mut self.units {
            while done.next_if(|(n, _)| *n < name).is_some() {}
            let now = done.next_if(|(n, _)| *n == name).map(|(_, r)| r);
            if unit.restarted != now {
                unit.restarted = now;
                changed.push(name.clone());
            }
        }
        changed
    }

    /// The state to publish for every unit with a file in the units directory.
    /// [`set_restarted`](Self::set_restarted) for the units of `names` alone, each
    /// generation looked up in `done`.
    pub fn set_restarted_of(
        &mut self,
        names: &BTreeSet<UnitName>,
        done: impl Fn(&UnitName) -> Option<u64>,
    ) -> Vec<UnitName> {
        let mut changed = Vec::new();
        for name in names {
            let Some(unit) = self.units.get_mut(name) else {
                continue;
            };
            let now = done(name);
            if unit.restarted != now {
                unit.restarted = now;
                changed.push(name.clone());
            }
        }
        changed
    }

    pub fn records(&self, machine: &MachineId) -> BTreeMap<UnitName, UnitStateRecord> {
        self.units
            .keys()
            .filter_map(|name| Some((name.clone(), self.record(name, machine)?)))
            .collect()
    }

    /// The state to publish for `name`: `None` when it has no file in the units directory
    /// (nothing to publish, or a state to withdraw).
    pub fn record(&self, name: &UnitName, machine: &MachineId) -> Option<UnitStateRecord> {
        let u = self.units.get(name)?;
        if matches!(u.file, UnitFileState::Absent) {
            return None;
        }
        let systemd = u.systemd.clone().unwrap_or_else(SystemdState::not_found);
        let history = self.history.get(name).cloned().unwrap_or_default();
        Some(UnitStateRecord {
            name: name.clone(),
            machine: machine.clone(),
            hash: self.hashes.get(name).copied(),
            systemd,
            drop_ins: self.drop_ins.get(name).cloned().unwrap_or_default(),
            restart: u.restarted.unwrap_or(0),
            restart_pending: self.restart_pending.contains(name),
            restarts: history.restarts,
            since: history.since,
            exit: history.exit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::UnitFileState;

    fn name(s: &str) -> UnitName {
        s.parse().unwrap()
    }

    fn unit(restarted: Option<u64>) -> CurrentUnit {
        CurrentUnit {
            file: UnitFileState::Absent,
            systemd: None,
            need_daemon_reload: false,
            restarted,
        }
    }

    #[test]
    fn restart_generations_are_matched_by_name_whatever_the_ledger_holds_around_them() {
        let mut current = Current::default();
        for (n, r) in [("a", None), ("c", Some(1)), ("e", Some(4)), ("g", Some(7))] {
            current.units.insert(name(&format!("{n}.service")), unit(r));
        }
        // The ledger has units this machine no longer runs, before, between and after.
        let done: Vec<(UnitName, u64)> =
            [("0", 9), ("b", 1), ("c", 2), ("d", 3), ("e", 4), ("z", 5)]
                .into_iter()
                .map(|(n, r)| (name(&format!("{n}.service")), r))
                .collect();
        let changed = current.set_restarted(done.iter().map(|(n, r)| (n, *r)));
        assert_eq!(changed, vec![name("c.service"), name("g.service")]);
        let got: Vec<Option<u64>> = current.units.values().map(|u| u.restarted).collect();
        assert_eq!(got, vec![None, Some(2), Some(4), None]);
        // The same generations again change nothing.
        assert!(
            current
                .set_restarted(done.iter().map(|(n, r)| (n, *r)))
                .is_empty()
        );
    }

    #[test]
    fn restart_generations_of_some_units_leave_the_others_as_they_were() {
        let mut current = Current::default();
        for (n, r) in [("a", None), ("c", Some(1)), ("e", Some(4))] {
            current.units.insert(name(&format!("{n}.service")), unit(r));
        }
        let done = BTreeMap::from([(name("a.service"), 2), (name("c.service"), 9)]);
        let names = BTreeSet::from([name("a.service"), name("e.service"), name("x.service")]);
        let changed = current.set_restarted_of(&names, |n| done.get(n).copied());
        assert_eq!(changed, vec![name("a.service"), name("e.service")]);
        let got: Vec<Option<u64>> = current.units.values().map(|u| u.restarted).collect();
        assert_eq!(got, vec![Some(2), Some(1), None], "c.service was not named");
    }
}
