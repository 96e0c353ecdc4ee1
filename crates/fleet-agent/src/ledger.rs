//! What this machine has done to each unit that systemd alone cannot tell: the restart
//! generation carried out, and which file version the running process was started from. One
//! small JSON file per unit in the runtime directory (`/run/fleet/restarts/<unit>`), so a
//! restarted fleetd neither repeats a restart nor forgets one that is due, and still knows
//! which units run an older version than their file (`--no-restart`). Like the units directory
//! it lives in `/run`: after a reboot nothing runs, so nothing is owed.

use fleet_core::{UnitHash, UnitName};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use tracing::warn;

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
        Ledger { dir, entries }
    }

    pub fn get(&self, unit: &UnitName) -> Option<&Entry> {
        self.entries.get(unit)
    }

    /// Restart generations carried out, by unit.
    pub fn restarts(&self) -> BTreeMap<UnitName, u64> {
        self.entries
            .iter()
            .map(|(n, e)| (n.clone(), e.restart))
            .collect()
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
        if let Some(dir) = &self.dir {
            let text = serde_json::to_string(entry).expect("ledger entries serialize");
            let write = std::fs::create_dir_all(dir)
                .and_then(|()| std::fs::write(dir.join(unit.as_str()), text));
            if let Err(e) = write {
                warn!(unit = %unit, error = %e, "recording unit ledger failed");
            }
        }
    }

    pub fn remove(&mut self, unit: &UnitName) {
        if self.entries.remove(unit).is_some()
            && let Some(dir) = &self.dir
        {
            let _ = std::fs::remove_file(dir.join(unit.as_str()));
        }
    }
}
