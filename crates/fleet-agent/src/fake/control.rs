//! How a test arranges [`FakeManager`]'s machine (files, units, crashes, injected faults,
//! jobs, hints) and inspects what the agent did to it (calls, files, states).

use super::*;

impl FakeManager {
    // --- Arranging a machine ---

    /// Puts a raw file into the units directory, under any name (foreign and unparseable
    /// files included), as if written before the agent started.
    pub fn put_file(&self, file_name: &str, bytes: impl Into<Vec<u8>>) {
        self.lock().files.insert(file_name.to_owned(), bytes.into());
    }

    /// Links (or unlinks) `name` in systemd's runtime directory.
    pub fn set_linked(&self, name: &UnitName, linked: bool) {
        let mut state = self.lock();
        if linked {
            state.linked.insert(name.clone());
        } else {
            state.linked.remove(name);
        }
    }

    /// A file of ours, written, linked, loaded and (if `running`) started, as a previous agent
    /// would have left it.
    pub fn put_unit(&self, name: &UnitName, file: &UnitFile, running: bool) {
        let mut state = self.lock();
        state
            .files
            .insert(name.to_string(), file.canonical().into_bytes());
        state.linked.insert(name.clone());
        state.load_on_demand(name);
        if running {
            state.start(name, JobOutcome::Done);
        }
    }

    /// systemd holds `name` from a file that is not fleet's, in this ActiveState/SubState.
    pub fn put_foreign_unit(&self, name: &UnitName, active: &str, sub: &str) {
        let mut state = self.lock();
        let record = Record {
            definition: Some(Definition::Foreign),
            active: active.to_owned(),
            sub: sub.to_owned(),
            started_from: Some(Definition::Foreign),
            main_pid: None,
            invocation_id: None,
            drop_ins: Vec::new(),
            facts: UnitFacts::default(),
        };
        state.records.insert(name.clone(), record);
    }

    /// Something outside the agent changed the unit's state (a crash, `systemctl stop`); emits
    /// a change hint as systemd's signals would.
    pub fn set_active(&self, name: &UnitName, active: &str, sub: &str) {
        {
            let mut state = self.lock();
            state.load_on_demand(name);
            if let Some(record) = state.records.get_mut(name) {
                record.set(active, sub);
                if !record.running() {
                    record.main_pid = None;
                    record.started_from = None;
                }
            }
        }
        self.changes.unit(name);
    }

    /// The unit's main process ended with `exit` and, with `restart` (systemd's `Restart=`),
    /// systemd started it again (`NRestarts` grows, the unit runs, the end is forgotten);
    /// without, the unit is failed. Emits a change hint.
    pub fn crash(&self, name: &UnitName, exit: MainExit, restart: bool) {
        {
            let mut state = self.lock();
            state.load_on_demand(name);
            if let Some(record) = state.records.get_mut(name) {
                let result = match exit {
                    MainExit::Exited(_) => "exit-code",
                    MainExit::Killed(_) => "signal",
                    MainExit::Dumped(_) => "core-dump",
                };
                record.facts.result = Some(result.to_owned());
                if restart {
                    record.facts.n_restarts += 1;
                    record.facts.main_exit = None;
                    record.set("activating", "auto-restart");
                    record.set("active", "running");
                } else {
                    record.facts.main_exit = Some(exit);
                    record.set("failed", "failed");
                    record.main_pid = None;
                    record.started_from = None;
                }
            }
        }
        self.changes.unit(name);
    }

    pub fn set_drop_ins(&self, name: &UnitName, drop_ins: Vec<PathBuf>) {
        let mut state = self.lock();
        state.load_on_demand(name);
        if let Some(record) = state.records.get_mut(name) {
            record.drop_ins = drop_ins;
        }
    }

    // --- Injecting failures ---

    /// Every call of `op` (for `unit`, or for any unit when `None`) fails.
    pub fn fail(&self, op: Op, unit: Option<&UnitName>) {
        self.push_fault(op, unit, None);
    }

    /// The next `times` calls of `op` (for `unit`, or any) fail.
    pub fn fail_times(&self, op: Op, unit: Option<&UnitName>, times: u32) {
        self.push_fault(op, unit, Some(times));
    }

    fn push_fault(&self, op: Op, unit: Option<&UnitName>, remaining: Option<u32>) {
        self.lock().faults.push(Fault {
            op,
            unit: unit.cloned(),
            remaining,
        });
    }

    /// Removes every injected failure.
    pub fn heal(&self) {
        self.lock().faults.clear();
    }

    /// How `kind` jobs of `name` end from now on.
    pub fn set_job(&self, kind: JobKind, name: &UnitName, job: FakeJob) {
        self.lock().jobs.insert((name.clone(), kind), job);
    }

    pub fn clear_job(&self, kind: JobKind, name: &UnitName) {
        self.lock().jobs.remove(&(name.clone(), kind));
    }

    /// Hints that `name` changed, as a systemd signal would.
    pub fn notify_unit(&self, name: &UnitName) {
        self.changes.unit(name);
    }

    pub fn notify_resync(&self) {
        self.changes.resync();
    }

    // --- Looking ---

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The calls so far, clearing the log.
    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.lock().calls)
    }

    /// The raw bytes of a file in the units directory.
    pub fn file(&self, file_name: &str) -> Option<Vec<u8>> {
        self.lock().files.get(file_name).cloned()
    }

    /// Every file name in the units directory.
    pub fn file_names(&self) -> Vec<String> {
        self.lock().files.keys().cloned().collect()
    }

    pub fn is_linked(&self, name: &UnitName) -> bool {
        self.lock().linked.contains(name)
    }

    /// systemd's states, without loading anything on demand.
    pub fn state(&self, name: &UnitName) -> SystemdState {
        self.lock().state(name)
    }

    /// The hash of the file the unit's current process was started from: `None` when nothing
    /// runs or it came from a file that is not fleet's.
    pub fn running_hash(&self, name: &UnitName) -> Option<UnitHash> {
        let state = self.lock();
        let record = state.records.get(name).filter(|r| r.running())?;
        match &record.started_from {
            Some(Definition::Ours(bytes)) => UnitFile::parse(bytes).ok().map(|f| f.hash()),
            Some(Definition::Foreign) | None => None,
        }
    }

    /// The main PID of the unit's current process, which a restart changes.
    pub fn main_pid(&self, name: &UnitName) -> Option<u32> {
        self.lock().records.get(name).and_then(|r| r.main_pid)
    }
}
