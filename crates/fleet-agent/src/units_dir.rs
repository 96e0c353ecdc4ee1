//! The units directory (`/run/fleet/units` by default): one file per unit fleet loaded here,
//! named after the unit, holding the unit's canonical text.
//!
//! Owns listing (with hashes and link status, the hashes cached by file identity), atomic
//! writes and removal. Must not talk to systemd, and must never touch a file whose name is not
//! a unit name: those are someone else's, so they are skipped with one warning each. Calls
//! block; async callers go through `spawn_blocking`.

use crate::manager::{InstalledUnit, ManagerError, UnitFileError, UnitSource};
use fleet_core::{UnitFile, UnitHash, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use tracing::{debug, warn};

/// Where fleet keeps its unit files.
pub const DEFAULT_UNITS_DIR: &str = "/run/fleet/units";

/// Where `LinkUnitFiles(runtime=true)` puts its symlinks.
pub const DEFAULT_RUNTIME_UNIT_DIR: &str = "/run/systemd/system";

/// Temporary files of interrupted writes start with this; never a valid unit name (no suffix).
const TEMP_PREFIX: &str = ".fleet-tmp-";

/// A file's hash is reused only if its status had not changed for this long when it was read.
/// File times advance in clock ticks (milliseconds on some kernels), so a file rewritten in
/// place twice within one tick keeps its times and size; one that had been quiet for a second
/// before we read it cannot change again without a later ctime (which no one can set back).
const SETTLE: Duration = Duration::from_secs(1);

/// What identifies one version of a file without reading it: every write changes the ctime
/// (even one that sets the mtime back), and the agent's own writes also bring a new inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Whether the file's last change came at least `settle` before `now`.
    fn settled(&self, now: SystemTime, settle: Duration) -> bool {
        let Ok(now) = now.duration_since(SystemTime::UNIX_EPOCH) else {
            return false;
        };
        let last = self.mtime.max(self.ctime);
        let Ok(secs) = u64::try_from(last.0) else {
            return false;
        };
        let last = Duration::new(secs, u32::try_from(last.1).unwrap_or(0));
        last + settle <= now
    }
}

/// Whether [`UnitsDir::write`] changed the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The file already had this content; left alone so its mtime does not make systemd think
    /// the unit needs a daemon-reload.
    Unchanged,
    /// Written; `had_install` when the file it replaced had an `[Install]` section (whose
    /// runtime enablement the new file may not want).
    Replaced { had_install: bool },
}

/// Why a directory entry is skipped.
#[derive(Debug, Clone, Copy)]
enum Ignored {
    NotAUnitName,
    NotAFile,
}

/// The units directory and the runtime unit directory its files get linked from.
#[derive(Debug)]
pub struct UnitsDir {
    path: PathBuf,
    runtime_dir: PathBuf,
    /// Names of foreign files already warned about, so each is logged once, not every pass.
    warned: Mutex<BTreeSet<OsString>>,
    temp_seq: AtomicU64,
    /// The hash of each settled file as of its stamp. Re-reading and re-hashing 1,000 files
    /// cost 24 ms of every pass a systemd signal woke (docs/benchmarks.md, item 7).
    hashes: Mutex<BTreeMap<UnitName, (Stamp, UnitHash)>>,
    settle: Duration,
    /// Files read and hashed, for tests.
    reads: AtomicU64,
}

impl UnitsDir {
    /// Opens `path`, creating it (mode 0700: a unit file may hold secrets in `Environment=`,
    /// and only systemd, root, needs to read it) if absent, and removes temporary files an
    /// interrupted write left behind.
    pub fn open(path: PathBuf, runtime_dir: PathBuf) -> Result<UnitsDir, ManagerError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&path)
            .map_err(|source| ManagerError::CreateUnitsDir {
                path: path.clone(),
                source,
            })?;
        let dir = UnitsDir {
            path,
            runtime_dir,
            warned: Mutex::default(),
            temp_seq: AtomicU64::new(0),
            hashes: Mutex::default(),
            settle: SETTLE,
            reads: AtomicU64::new(0),
        };
        dir.remove_stale_temp_files()?;
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file of `name`; a [`UnitName`] has no `/` and is never `.` or `..`, so this stays
    /// inside the directory.
    pub fn file_path(&self, name: &UnitName) -> PathBuf {
        self.path.join(name.as_str())
    }

    /// Every unit file, sorted by name.
    pub fn list(&self) -> Result<Vec<InstalledUnit>, ManagerError> {
        let list_err = |source| ManagerError::ListUnitsDir {
            path: self.path.clone(),
            source,
        };
        // Before any file is looked at: a file changed during the listing is not settled.
        let now = SystemTime::now();
        let entries = match fs::read_dir(&self.path) {
            Ok(entries) => entries,
            // Someone removed it: nothing is installed.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.lock_hashes().clear();
                return Ok(Vec::new());
            }
            Err(e) => return Err(list_err(e)),
        };
        let mut units = Vec::new();
        for entry in entries {
            let entry = entry.map_err(list_err)?;
            let file_name = entry.file_name();
            let Some(name) = self.unit_name(&file_name) else {
                continue;
            };
            let file_type = entry.file_type().map_err(list_err)?;
            if !file_type.is_file() {
                self.warn_once(&file_name, Ignored::NotAFile);
                continue;
            }
            // An lstat relative to the directory, not of the whole path (the resync lists
            // every unit once a minute: issue 19's idle profile).
            let stamp = entry.metadata().ok().map(|m| Stamp::of(&m));
            let content = self.hash(&name, &entry.path(), stamp, now);
            let linked = self.is_linked(&name);
            units.push(InstalledUnit {
                name,
                content,
                linked,
            });
        }
        units.sort_by(|a, b| a.name.cmp(&b.name));
        let listed: BTreeSet<&UnitName> = units.iter().map(|u| &u.name).collect();
        self.lock_hashes().retain(|name, _| listed.contains(name));
        Ok(units)
    }

    /// The files of `names` that exist, sorted by name, as [`UnitsDir::list`] reports them:
    /// one `lstat` each (and a read when a file changed), not a listing of the directory.
    pub fn list_of(&self, names: &[UnitName]) -> Result<Vec<InstalledUnit>, ManagerError> {
        let now = SystemTime::now();
        let mut sorted: Vec<&UnitName> = names.iter().collect();
        sorted.sort();
        sorted.dedup();
        let mut units = Vec::new();
        for name in sorted {
            let path = self.file_path(name);
            let stamp = match fs::symlink_metadata(&path) {
                Ok(meta) if meta.file_type().is_file() => Stamp::of(&meta),
                Ok(_) => {
                    self.warn_once(&OsString::from(name.as_str()), Ignored::NotAFile);
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.lock_hashes().remove(name);
                    continue;
                }
                Err(source) => {
                    return Err(ManagerError::ListUnitsDir {
                        path: self.path.clone(),
                        source,
                    });
                }
            };
            let content = self.hash(name, &path, Some(stamp), now);
            let linked = self.is_linked(name);
            units.push(InstalledUnit {
                name: name.clone(),
                content,
                linked,
            });
        }
        Ok(units)
    }

    /// The hash of `name`'s file at `path`, whose `stamp` the caller just took (`None`: it
    /// could not): the cached one while the stamp is unchanged, else read (and cached once
    /// settled).
    fn hash(
        &self,
        name: &UnitName,
        path: &Path,
        stamp: Option<Stamp>,
        now: SystemTime,
    ) -> Result<UnitHash, UnitFileError> {
        if let Some(stamp) = stamp
            && let Some((cached, hash)) = self.lock_hashes().get(name)
            && *cached == stamp
        {
            return Ok(*hash);
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        // Read after the stamp: a change in between makes the stamp stale, never the hash.
        let content = read_hash(path);
        let mut hashes = self.lock_hashes();
        match (&content, stamp) {
            (Ok(hash), Some(stamp)) if stamp.settled(now, self.settle) => {
                hashes.insert(name.clone(), (stamp, *hash));
            }
            _ => {
                hashes.remove(name);
            }
        }
        content
    }

    fn lock_hashes(&self) -> std::sync::MutexGuard<'_, BTreeMap<UnitName, (Stamp, UnitHash)>> {
        self.hashes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the unit's canonical text, mode 0644, atomically (temporary file + rename).
    pub fn write(&self, name: &UnitName, file: &UnitFile) -> Result<Written, ManagerError> {
        let path = self.file_path(name);
        let text = file.canonical();
        let had_install = match fs::read(&path) {
            Ok(existing) if existing == text.as_bytes() => return Ok(Written::Unchanged),
            Ok(existing) => UnitFile::parse(&existing).is_ok_and(|f| f.has_section("Install")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(source) => return Err(ManagerError::WriteUnitFile { path, source }),
        };
        let seq = self.temp_seq.fetch_add(1, Ordering::Relaxed);
        let temp = self
            .path
            .join(format!("{TEMP_PREFIX}{}-{seq}", std::process::id()));
        let result = write_new(&temp, text.as_bytes()).and_then(|()| fs::rename(&temp, &path));
        if let Err(source) = result {
            // Best effort: a leftover is removed at the next open anyway.
            let _ = fs::remove_file(&temp);
            return Err(ManagerError::WriteUnitFile { path, source });
        }
        Ok(Written::Replaced { had_install })
    }

    /// Removes the unit's file; a missing file is fine.
    pub fn remove(&self, name: &UnitName) -> Result<(), ManagerError> {
        let path = self.file_path(name);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(ManagerError::RemoveUnitFile { path, source }),
        }
    }

    /// Whether the runtime unit directory has `name` as a symlink to this directory's file.
    pub fn is_linked(&self, name: &UnitName) -> bool {
        let link = self.runtime_dir.join(name.as_str());
        fs::read_link(link).is_ok_and(|target| target == self.file_path(name))
    }

    /// Where the definition systemd loaded for `name` from `fragment` (its `FragmentPath`)
    /// comes from: this directory (directly, or through the runtime link to our file), an
    /// operator's file elsewhere, or nothing that still exists.
    pub fn source(&self, name: &UnitName, fragment: Option<PathBuf>) -> UnitSource {
        let Some(fragment) = fragment else {
            return UnitSource::NoFile;
        };
        let ours = fragment.starts_with(&self.path)
            || fs::read_link(&fragment).is_ok_and(|target| target == self.file_path(name));
        if ours {
            UnitSource::UnitsDir
        } else if fragment.exists() {
            UnitSource::Foreign { fragment }
        } else {
            // A definition whose file is gone protects nothing (e.g. ours, before a reload).
            UnitSource::NoFile
        }
    }

    fn unit_name(&self, file_name: &OsString) -> Option<UnitName> {
        let text = file_name.to_str();
        if text.is_some_and(|t| t.starts_with(TEMP_PREFIX)) {
            return None;
        }
        match text.map(str::parse::<UnitName>) {
            Some(Ok(name)) => Some(name),
            Some(Err(_)) | None => {
                self.warn_once(file_name, Ignored::NotAUnitName);
                None
            }
        }
    }

    fn warn_once(&self, file_name: &OsString, why: Ignored) {
        let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        if !warned.insert(file_name.clone()) {
            return;
        }
        let dir = self.path.display();
        match why {
            Ignored::NotAUnitName => {
                warn!(%dir, file = ?file_name, "ignoring file whose name is not a unit name");
            }
            Ignored::NotAFile => {
                warn!(%dir, file = ?file_name, "ignoring non-file in units directory")
            }
        }
    }

    fn remove_stale_temp_files(&self) -> Result<(), ManagerError> {
        let list_err = |source| ManagerError::ListUnitsDir {
            path: self.path.clone(),
            source,
        };
        for entry in fs::read_dir(&self.path).map_err(list_err)? {
            let entry = entry.map_err(list_err)?;
            let is_temp = entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(TEMP_PREFIX));
            if is_temp {
                debug!(file = %entry.path().display(), "removing leftover temporary unit file");
                let path = entry.path();
                fs::remove_file(&path)
                    .map_err(|source| ManagerError::RemoveUnitFile { path, source })?;
            }
        }
        Ok(())
    }
}

fn read_hash(path: &Path) -> Result<fleet_core::UnitHash, UnitFileError> {
    let bytes = fs::read(path).map_err(UnitFileError::Read)?;
    let file = UnitFile::parse(&bytes).map_err(UnitFileError::Parse)?;
    Ok(file.hash())
}

fn write_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    // Only systemd (root) reads it: a unit file may hold secrets in `Environment=` (issue 37).
    file.set_permissions(fs::Permissions::from_mode(0o600))?;
    // No fsync: /run is a tmpfs, and the rename is what makes the write atomic to readers.
    Ok(())
}

#[cfg(test)]
mod tests;
