//! What this machine has done to each unit that systemd alone cannot tell: the restart
//! generation carried out, and which file version the running process was started from. One
//! small JSON file per unit in the runtime directory (`/run/fleet/restarts/<unit>`), so a
//! restarted fleetd neither repeats a restart nor forgets one that is due, and still knows
//! which units run an older version than their file (`--no-restart`). Like the units directory
//! it lives in `/run`: after a reboot nothing runs, so nothing is owed.

use fleet_core::{UnitHash, UnitName};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use tracing::warn;

use crate::executor::Outcome;
use crate::plan::{DesiredUnit, Task, TaskKind};

/// One unit's entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The restart generation carried out.
    #[serde(default)]
    pub restart: u64,
    /// The file version the running process started from, when it may differ from the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<UnitHash>,
    /// systemd's InvocationID of that process: a different one means systemd restarted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation: Option<String>,
}

#[derive(Debug, Default)]
pub struct Ledger {
    dir: Option<PathBuf>,
    entries: BTreeMap<UnitName, Entry>,
    /// The units whose entry has a `started` version: the few [`swapped`](Self::swapped)
    /// walks every pass, kept with the entries so that a pass does not walk them all.
    swapped: BTreeSet<UnitName>,
}

impl Ledger {
    /// Reads the ledger in `dir` (memory only when `None`, for tests).
    pub fn load(dir: Option<PathBuf>) -> Ledger {
        let mut entries = BTreeMap::new();
        if let Some(files) = dir.as_ref().and_then(|d| std::fs::read_dir(d).ok()) {
            for file in files.flatten() {
                let name = file.file_name().to_string_lossy().into_owned();
                let Ok(unit) = name.parse::<UnitName>() else {
                    continue;
                };
                let Ok(text) = std::fs::read_to_string(file.path()) else {
                    continue;
                };
                let entry = match text.trim().parse::<u64>() {
                    Ok(restart) => Some(Entry {
                        restart,
                        ..Entry::default()
                    }),
                    Err(_) => serde_json::from_str(&text).ok(),
                };
                if let Some(entry) = entry {
                    entries.insert(unit, entry);
                }
            }
        }
        let swapped = entries
            .iter()
            .filter(|(_, e)| e.started.is_some())
            .map(|(n, _)| n.clone())
            .collect();
        Ledger {
            dir,
            entries,
            swapped,
        }
    }

    pub fn get(&self, unit: &UnitName) -> Option<&Entry> {
        self.entries.get(unit)
    }

    /// Restart generations carried out, by unit.
    #[cfg(test)]
    pub fn restarts(&self) -> BTreeMap<UnitName, u64> {
        self.entries
            .iter()
            .map(|(n, e)| (n.clone(), e.restart))
            .collect()
    }

    /// Restart generations carried out, in name order.
    pub fn restarts_in_order(&self) -> impl Iterator<Item = (&UnitName, u64)> {
        self.entries.iter().map(|(n, e)| (n, e.restart))
    }

    pub fn units(&self) -> impl Iterator<Item = &UnitName> {
        self.entries.keys()
    }

    /// Changes `unit`'s entry (creating it) and saves it if it changed.
    pub fn update(&mut self, unit: &UnitName, change: impl FnOnce(&mut Entry)) {
        let old = self.entries.get(unit).cloned();
        let entry = self.entries.entry(unit.clone()).or_default();
        change(entry);
        if old.as_ref() == Some(entry) {
            return;
        }
        if entry.started.is_some() {
            self.swapped.insert(unit.clone());
        } else {
            self.swapped.remove(unit);
        }
        if let Some(dir) = &self.dir {
            let text = serde_json::to_string(entry).expect("ledger entries serialize");
            let write = std::fs::create_dir_all(dir)
                .and_then(|()| std::fs::write(dir.join(unit.as_str()), text));
            if let Err(e) = write {
                warn!(unit = %unit, error = %e, "recording unit ledger failed");
            }
        }
    }

    /// Before a plan: a desired unit the ledger does not know yet starts from the desired
    /// generation (it is never restarted on a guess); units neither desired nor in the units
    /// directory (`present`) are forgotten. Returns the units it started an entry for.
    pub fn track(
        &mut self,
        want: &BTreeMap<UnitName, DesiredUnit>,
        present: &BTreeMap<UnitName, UnitHash>,
    ) -> BTreeSet<UnitName> {
        let mut added = BTreeSet::new();
        for (name, d) in want {
            if self.get(name).is_none() {
                self.update(name, |e| e.restart = d.restart);
                added.insert(name.clone());
            }
        }
        let gone: Vec<UnitName> = self
            .units()
            .filter(|n| !want.contains_key(*n) && !present.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            self.remove(&name);
        }
        added
    }

    /// [`track`](Self::track) for the units of `names` alone, where `want` holds what is
    /// desired of them: the ledger's entries of other units stay as they are.
    pub fn track_of(
        &mut self,
        want: &BTreeMap<UnitName, DesiredUnit>,
        present: &BTreeMap<UnitName, UnitHash>,
        names: &BTreeSet<UnitName>,
    ) -> BTreeSet<UnitName> {
        let mut added = BTreeSet::new();
        for name in names {
            match want.get(name) {
                Some(d) if self.get(name).is_none() => {
                    self.update(name, |e| e.restart = d.restart);
                    added.insert(name.clone());
                }
                Some(_) => {}
                None if !present.contains_key(name) => self.remove(name),
                None => {}
            }
        }
        added
    }

    /// The units whose running process may be behind their file (a `--no-restart` swap),
    /// with the version it started from and its invocation. Walks those units only: perf of
    /// the API's start of 100,000 more units on 100 machines (2,000 a machine) had this walk
    /// over every entry, each pass, at 38 % of the bench's samples.
    pub fn swapped(&self) -> impl Iterator<Item = (&UnitName, UnitHash, Option<&str>)> {
        self.swapped.iter().filter_map(|n| {
            let e = self.entries.get(n)?;
            Some((n, e.started?, e.invocation.as_deref()))
        })
    }

    /// After a plan: a unit (re)started by a successful task has had the desired restart
    /// generation and runs the desired file.
    pub fn record_started(
        &mut self,
        want: &BTreeMap<UnitName, DesiredUnit>,
        tasks: &[Task],
        outcome: &Outcome,
    ) {
        for t in tasks {
            let started = matches!(t.kind, TaskKind::Start | TaskKind::Restart);
            if started
                && !outcome.failed.contains_key(&t.unit)
                && let Some(d) = want.get(&t.unit)
            {
                self.update(&t.unit, |e| {
                    e.restart = d.restart;
                    e.started = None;
                    e.invocation = None;
                });
            }
        }
    }

    /// Before a file is swapped under a running unit (`--no-restart`): the process keeps the
    /// version `running` and its `invocation`, unless it was already behind an older one.
    pub fn record_swap(&mut self, unit: &UnitName, running: UnitHash, invocation: Option<String>) {
        self.update(unit, |e| {
            if e.started.is_none() {
                e.started = Some(running);
                e.invocation = invocation;
            }
        });
    }

    /// The unit runs its file (systemd restarted it, or it stopped): nothing is pending.
    pub fn clear_swap(&mut self, unit: &UnitName) {
        self.update(unit, |e| {
            e.started = None;
            e.invocation = None;
        });
    }

    pub fn remove(&mut self, unit: &UnitName) {
        self.swapped.remove(unit);
        if self.entries.remove(unit).is_some()
            && let Some(dir) = &self.dir
        {
            let _ = std::fs::remove_file(dir.join(unit.as_str()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::TaskError;
    use crate::plan::{Reason, Target};
    use fleet_core::UnitFile;

    fn name(s: &str) -> UnitName {
        s.parse().unwrap()
    }

    fn hash(exec: &str) -> UnitHash {
        UnitFile::parse(format!("[Service]\nExecStart={exec}\n").as_bytes())
            .unwrap()
            .hash()
    }

    fn desired(restart: u64) -> DesiredUnit {
        DesiredUnit {
            hash: hash("/bin/a"),
            target: Target::Launched,
            restart,
            no_restart: false,
        }
    }

    fn task(kind: TaskKind, unit: &str) -> Task {
        Task {
            kind,
            unit: name(unit),
            reason: Reason::RestartRequested { done: 0, wanted: 1 },
        }
    }

    /// A directory of its own under the system temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(test: &str) -> Scratch {
            let path = std::env::temp_dir()
                .join(format!("fleet-agent-ledger-{test}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            Scratch(path)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_new_desired_unit_starts_from_the_desired_generation() {
        let mut ledger = Ledger::default();
        let want = BTreeMap::from([(name("a.service"), desired(4))]);
        let added = ledger.track(&want, &BTreeMap::new());
        assert_eq!(added, BTreeSet::from([name("a.service")]));
        assert_eq!(ledger.restarts(), BTreeMap::from([(name("a.service"), 4)]));
        // A known unit keeps the generation it carried out, so a due restart stays due.
        let want = BTreeMap::from([(name("a.service"), desired(5))]);
        assert!(ledger.track(&want, &BTreeMap::new()).is_empty());
        assert_eq!(ledger.restarts()[&name("a.service")], 4);
    }

    #[test]
    fn forgets_units_neither_desired_nor_in_the_units_directory() {
        let mut ledger = Ledger::default();
        let want = BTreeMap::from([
            (name("a.service"), desired(1)),
            (name("b.service"), desired(1)),
        ]);
        ledger.track(&want, &BTreeMap::new());
        let present = BTreeMap::from([(name("b.service"), hash("/bin/a"))]);
        ledger.track(&BTreeMap::new(), &present);
        assert_eq!(
            ledger.units().collect::<Vec<_>>(),
            [&name("b.service")],
            "a unit whose file is still here is not forgotten"
        );
    }

    #[test]
    fn tracking_some_units_leaves_the_others_entries_alone() {
        let mut ledger = Ledger::default();
        let want = BTreeMap::from([
            (name("a.service"), desired(1)),
            (name("b.service"), desired(1)),
            (name("c.service"), desired(1)),
        ]);
        ledger.track(&want, &BTreeMap::new());
        // Nothing is desired any more, but only a and d were named; d was never known.
        let names = BTreeSet::from([name("a.service"), name("d.service")]);
        ledger.track_of(&BTreeMap::new(), &BTreeMap::new(), &names);
        assert_eq!(
            ledger.units().collect::<Vec<_>>(),
            [&name("b.service"), &name("c.service")]
        );
        let want = BTreeMap::from([(name("d.service"), desired(3))]);
        let added = ledger.track_of(&want, &BTreeMap::new(), &names);
        assert_eq!(added, BTreeSet::from([name("d.service")]));
        assert_eq!(ledger.restarts()[&name("d.service")], 3);
    }

    #[test]
    fn a_successful_start_or_restart_records_the_desired_generation() {
        let mut ledger = Ledger::default();
        let a = name("a.service");
        ledger.record_swap(&a, hash("/bin/old"), Some("1".into()));
        let want = BTreeMap::from([(a.clone(), desired(2))]);
        let tasks = [task(TaskKind::Restart, "a.service")];
        ledger.record_started(&want, &tasks, &Outcome::default());
        assert_eq!(
            ledger.get(&a),
            Some(&Entry {
                restart: 2,
                started: None,
                invocation: None,
            })
        );
    }

    #[test]
    fn a_failed_start_records_nothing() {
        let mut ledger = Ledger::default();
        let a = name("a.service");
        let want = BTreeMap::from([(a.clone(), desired(2))]);
        let mut outcome = Outcome::default();
        let failed = TaskError::NoFile(hash("/bin/a"));
        outcome.failed.insert(a.clone(), failed);
        let tasks = [
            task(TaskKind::Start, "a.service"),
            task(TaskKind::Load, "b.service"),
        ];
        ledger.record_started(&want, &tasks, &outcome);
        assert_eq!(ledger.get(&a), None);
        assert_eq!(ledger.get(&name("b.service")), None);
    }

    #[test]
    fn a_swap_keeps_the_oldest_running_version() {
        let mut ledger = Ledger::default();
        let a = name("a.service");
        ledger.record_swap(&a, hash("/bin/v1"), Some("1".into()));
        ledger.record_swap(&a, hash("/bin/v2"), Some("2".into()));
        let entry = ledger.get(&a).unwrap();
        assert_eq!(entry.started, Some(hash("/bin/v1")));
        assert_eq!(entry.invocation.as_deref(), Some("1"));
        ledger.clear_swap(&a);
        assert_eq!(ledger.get(&a).unwrap().started, None);
    }

    /// The swapped units as [`Ledger::swapped`] lists them, by name.
    fn swapped_names(ledger: &Ledger) -> Vec<&str> {
        ledger.swapped().map(|(n, _, _)| n.as_str()).collect()
    }

    #[test]
    fn lists_as_swapped_exactly_the_units_behind_their_file() {
        let scratch = Scratch::new("swapped");
        let (a, b, c) = (name("a.service"), name("b.service"), name("c.service"));
        let mut ledger = Ledger::load(Some(scratch.0.clone()));
        for unit in [&a, &b, &c] {
            ledger.update(unit, |e| e.restart = 1);
        }
        assert!(swapped_names(&ledger).is_empty());
        ledger.record_swap(&c, hash("/bin/v1"), Some("3".into()));
        ledger.record_swap(&a, hash("/bin/v1"), None);
        assert_eq!(swapped_names(&ledger), ["a.service", "c.service"]);
        // Read back by a restarted fleetd.
        assert_eq!(
            swapped_names(&Ledger::load(Some(scratch.0.clone()))),
            ["a.service", "c.service"]
        );
        ledger.clear_swap(&a);
        ledger.remove(&c);
        ledger.update(&b, |e| e.restart = 2);
        assert!(swapped_names(&ledger).is_empty());
        // A restart recorded after a swap clears it.
        let want = BTreeMap::from([(b.clone(), desired(3))]);
        ledger.record_swap(&b, hash("/bin/v1"), None);
        ledger.record_started(
            &want,
            &[task(TaskKind::Restart, "b.service")],
            &Outcome::default(),
        );
        assert!(swapped_names(&ledger).is_empty());
    }

    #[test]
    fn survives_a_restart_of_fleetd_through_its_directory() {
        let scratch = Scratch::new("reload");
        let a = name("a.service");
        {
            let mut ledger = Ledger::load(Some(scratch.0.clone()));
            ledger.update(&a, |e| e.restart = 7);
            ledger.record_swap(&a, hash("/bin/v1"), Some("ab".into()));
        }
        let ledger = Ledger::load(Some(scratch.0.clone()));
        assert_eq!(
            ledger.get(&a),
            Some(&Entry {
                restart: 7,
                started: Some(hash("/bin/v1")),
                invocation: Some("ab".into()),
            })
        );
    }

    #[test]
    fn reads_the_older_plain_number_format_and_skips_what_it_cannot_read() {
        let scratch = Scratch::new("formats");
        std::fs::create_dir_all(&scratch.0).unwrap();
        std::fs::write(scratch.0.join("a.service"), "3\n").unwrap();
        std::fs::write(scratch.0.join("b.service"), "{not json").unwrap();
        std::fs::write(scratch.0.join("README"), "1").unwrap();
        let ledger = Ledger::load(Some(scratch.0.clone()));
        assert_eq!(ledger.restarts(), BTreeMap::from([(name("a.service"), 3)]));
    }

    #[test]
    fn removing_a_unit_removes_its_file() {
        let scratch = Scratch::new("remove");
        let a = name("a.service");
        let mut ledger = Ledger::load(Some(scratch.0.clone()));
        ledger.update(&a, |e| e.restart = 1);
        assert!(scratch.0.join("a.service").exists());
        ledger.remove(&a);
        assert!(!scratch.0.join("a.service").exists());
        assert_eq!(Ledger::load(Some(scratch.0.clone())).get(&a), None);
    }

    #[test]
    fn an_unchanged_entry_is_not_rewritten() {
        let scratch = Scratch::new("unchanged");
        let a = name("a.service");
        let mut ledger = Ledger::load(Some(scratch.0.clone()));
        ledger.update(&a, |e| e.restart = 1);
        std::fs::remove_file(scratch.0.join("a.service")).unwrap();
        ledger.update(&a, |e| e.restart = 1);
        assert!(!scratch.0.join("a.service").exists());
    }
}
