//! The restart generations this machine has carried out, one small file per unit in the
//! runtime directory (`/run/fleet/restarts/<unit>`), so a restarted fleetd neither repeats a
//! restart nor forgets one that is due. Like the units directory it lives in `/run`: after a
//! reboot nothing runs, so nothing is owed.

use fleet_core::UnitName;
use std::collections::BTreeMap;
use std::path::PathBuf;
use tracing::warn;

#[derive(Debug, Default)]
pub struct RestartLedger {
    dir: Option<PathBuf>,
    done: BTreeMap<UnitName, u64>,
}

impl RestartLedger {
    /// Reads the ledger in `dir` (memory only when `None`, for tests).
    pub fn load(dir: Option<PathBuf>) -> RestartLedger {
        let mut done = BTreeMap::new();
        if let Some(entries) = dir.as_ref().and_then(|d| std::fs::read_dir(d).ok()) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Ok(unit) = name.parse::<UnitName>() else {
                    continue;
                };
                let value = std::fs::read_to_string(entry.path()).ok();
                if let Some(n) = value.and_then(|v| v.trim().parse().ok()) {
                    done.insert(unit, n);
                }
            }
        }
        RestartLedger { dir, done }
    }

    pub fn get(&self, unit: &UnitName) -> Option<u64> {
        self.done.get(unit).copied()
    }

    pub fn all(&self) -> &BTreeMap<UnitName, u64> {
        &self.done
    }

    pub fn set(&mut self, unit: &UnitName, generation: u64) {
        if self.done.get(unit) == Some(&generation) {
            return;
        }
        self.done.insert(unit.clone(), generation);
        if let Some(dir) = &self.dir {
            let write = std::fs::create_dir_all(dir)
                .and_then(|()| std::fs::write(dir.join(unit.as_str()), generation.to_string()));
            if let Err(e) = write {
                warn!(unit = %unit, error = %e, "recording restart generation failed");
            }
        }
    }

    pub fn remove(&mut self, unit: &UnitName) {
        if self.done.remove(unit).is_some()
            && let Some(dir) = &self.dir
        {
            let _ = std::fs::remove_file(dir.join(unit.as_str()));
        }
    }
}
