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
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A scratch directory under the system temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(test: &str) -> Scratch {
            let path = std::env::temp_dir().join(format!(
                "fleet-agent-units-dir-{test}-{}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&path);
            fs::create_dir_all(&path).unwrap();
            Scratch(path)
        }

        fn open(&self) -> UnitsDir {
            UnitsDir::open(self.0.join("units"), self.0.join("runtime")).unwrap()
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn name(s: &str) -> UnitName {
        s.parse().unwrap()
    }

    fn unit(text: &str) -> UnitFile {
        UnitFile::parse(text.as_bytes()).unwrap()
    }

    #[test]
    fn creates_the_directory_with_mode_0700() {
        let scratch = Scratch::new("create");
        let dir = scratch.open();
        let mode = fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700 & !current_umask());
    }

    #[test]
    fn writes_canonical_text_with_mode_0600_and_lists_its_hash() {
        let scratch = Scratch::new("write");
        let dir = scratch.open();
        let file = unit("[Service]\n  ExecStart = /bin/true  \n");
        assert_eq!(
            dir.write(&name("a.service"), &file).unwrap(),
            Written::Replaced { had_install: false }
        );
        let path = dir.file_path(&name("a.service"));
        assert_eq!(fs::read_to_string(&path).unwrap(), file.canonical());
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let listed = dir.list().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].name, name("a.service"));
        assert_eq!(*listed[0].content.as_ref().unwrap(), file.hash());
        assert!(!listed[0].linked);
    }

    #[test]
    fn lists_only_the_named_files_as_the_whole_listing_does() {
        let scratch = Scratch::new("list-of");
        let dir = scratch.open();
        dir.write(&name("a.service"), &unit("[Service]\nExecStart=/bin/a\n"))
            .unwrap();
        dir.write(&name("b.service"), &unit("[Service]\nExecStart=/bin/b\n"))
            .unwrap();
        fs::write(dir.file_path(&name("c.service")), "not a unit").unwrap();
        fs::create_dir(dir.file_path(&name("d.service"))).unwrap();
        let asked = [
            name("c.service"),
            name("a.service"),
            name("gone.service"),
            name("d.service"),
            name("a.service"),
        ];
        let some = dir.list_of(&asked).unwrap();
        let all = dir.list().unwrap();
        let view = |units: &[InstalledUnit]| -> Vec<(String, Option<UnitHash>, bool)> {
            units
                .iter()
                .map(|u| {
                    (
                        u.name.to_string(),
                        u.content.as_ref().ok().copied(),
                        u.linked,
                    )
                })
                .collect()
        };
        let expected: Vec<_> = view(&all)
            .into_iter()
            .filter(|(n, _, _)| n == "a.service" || n == "c.service")
            .collect();
        assert_eq!(view(&some), expected);
        assert!(some[1].content.is_err(), "c.service does not parse");
    }

    #[test]
    fn leaves_an_identical_file_alone() {
        let scratch = Scratch::new("unchanged");
        let dir = scratch.open();
        let file = unit("[Service]\nExecStart=/bin/true\n");
        dir.write(&name("a.service"), &file).unwrap();
        assert_eq!(
            dir.write(&name("a.service"), &file).unwrap(),
            Written::Unchanged
        );
        let other = unit("[Service]\nExecStart=/bin/false\n");
        assert_eq!(
            dir.write(&name("a.service"), &other).unwrap(),
            Written::Replaced { had_install: false }
        );
        assert_eq!(
            *dir.list().unwrap()[0].content.as_ref().unwrap(),
            other.hash()
        );
    }

    #[test]
    fn says_when_the_file_it_replaced_had_an_install_section() {
        let scratch = Scratch::new("install");
        let dir = scratch.open();
        let enabled = unit("[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=a.target\n");
        dir.write(&name("a.service"), &enabled).unwrap();
        let plain = unit("[Service]\nExecStart=/bin/false\n");
        assert_eq!(
            dir.write(&name("a.service"), &plain).unwrap(),
            Written::Replaced { had_install: true }
        );
    }

    #[test]
    fn reports_unparseable_files_without_failing_the_others() {
        let scratch = Scratch::new("unparseable");
        let dir = scratch.open();
        fs::write(dir.path().join("bad.service"), "no sections here\n").unwrap();
        dir.write(
            &name("good.service"),
            &unit("[Service]\nExecStart=/bin/true\n"),
        )
        .unwrap();
        let listed = dir.list().unwrap();
        let names: Vec<_> = listed.iter().map(|u| u.name.to_string()).collect();
        assert_eq!(names, ["bad.service", "good.service"]);
        assert!(matches!(listed[0].content, Err(UnitFileError::Parse(_))));
        assert!(listed[1].content.is_ok());
    }

    #[test]
    fn ignores_and_never_touches_files_that_are_not_unit_names() {
        let scratch = Scratch::new("foreign");
        let dir = scratch.open();
        fs::write(dir.path().join("README"), "mine").unwrap();
        fs::write(dir.path().join("notes.txt"), "mine too").unwrap();
        fs::create_dir(dir.path().join("sub.service")).unwrap();
        assert!(dir.list().unwrap().is_empty());
        assert!(dir.list().unwrap().is_empty());
        drop(dir);
        let _reopened = scratch.open();
        assert_eq!(
            fs::read_to_string(scratch.0.join("units/README")).unwrap(),
            "mine"
        );
        assert!(scratch.0.join("units/notes.txt").exists());
    }

    #[test]
    fn removes_leftover_temporary_files_when_opened() {
        let scratch = Scratch::new("temp");
        let dir = scratch.open();
        let temp = dir.path().join(format!("{TEMP_PREFIX}1-0"));
        fs::write(&temp, "half").unwrap();
        assert!(dir.list().unwrap().is_empty());
        drop(dir);
        scratch.open();
        assert!(!temp.exists());
    }

    #[test]
    fn sees_the_runtime_link_to_its_file() {
        let scratch = Scratch::new("link");
        let dir = scratch.open();
        let a = name("a.service");
        dir.write(&a, &unit("[Service]\nExecStart=/bin/true\n"))
            .unwrap();
        fs::create_dir_all(scratch.0.join("runtime")).unwrap();
        symlink(dir.file_path(&a), scratch.0.join("runtime/a.service")).unwrap();
        symlink("/elsewhere/b.service", scratch.0.join("runtime/b.service")).unwrap();
        assert!(dir.is_linked(&a));
        assert!(!dir.is_linked(&name("b.service")));
        assert!(dir.list().unwrap()[0].linked);
    }

    #[test]
    fn a_definition_from_the_units_directory_or_its_runtime_link_is_ours() {
        let scratch = Scratch::new("source-ours");
        let dir = scratch.open();
        let a = name("a.service");
        dir.write(&a, &unit("[Service]\nExecStart=/bin/true\n"))
            .unwrap();
        fs::create_dir_all(scratch.0.join("runtime")).unwrap();
        let link = scratch.0.join("runtime/a.service");
        symlink(dir.file_path(&a), &link).unwrap();
        assert_eq!(dir.source(&a, Some(link)), UnitSource::UnitsDir);
        assert_eq!(
            dir.source(&a, Some(dir.file_path(&a))),
            UnitSource::UnitsDir
        );
    }

    #[test]
    fn an_existing_file_elsewhere_is_an_operators() {
        let scratch = Scratch::new("source-foreign");
        let dir = scratch.open();
        let a = name("a.service");
        let operator = scratch.0.join("etc-a.service");
        fs::write(&operator, "[Service]\nExecStart=/bin/true\n").unwrap();
        assert_eq!(
            dir.source(&a, Some(operator.clone())),
            UnitSource::Foreign { fragment: operator }
        );
    }

    #[test]
    fn a_definition_whose_file_is_gone_or_absent_protects_nothing() {
        let scratch = Scratch::new("source-none");
        let dir = scratch.open();
        let a = name("a.service");
        assert_eq!(dir.source(&a, None), UnitSource::NoFile);
        let gone = scratch.0.join("gone.service");
        assert_eq!(dir.source(&a, Some(gone)), UnitSource::NoFile);
    }

    #[test]
    fn removing_a_missing_file_is_fine() {
        let scratch = Scratch::new("remove");
        let dir = scratch.open();
        let a = name("a.service");
        dir.remove(&a).unwrap();
        dir.write(&a, &unit("[Service]\nExecStart=/bin/true\n"))
            .unwrap();
        dir.remove(&a).unwrap();
        assert!(dir.list().unwrap().is_empty());
    }

    #[test]
    fn lists_nothing_when_the_directory_vanished() {
        let scratch = Scratch::new("vanished");
        let dir = scratch.open();
        fs::remove_dir(dir.path()).unwrap();
        assert!(dir.list().unwrap().is_empty());
    }

    /// A directory whose files count as settled 50 ms after their last change.
    fn quick_settling(scratch: &Scratch) -> UnitsDir {
        let mut dir = scratch.open();
        dir.settle = Duration::from_millis(50);
        dir
    }

    fn settle() {
        std::thread::sleep(Duration::from_millis(80));
    }

    fn reads(dir: &UnitsDir) -> u64 {
        dir.reads.load(Ordering::Relaxed)
    }

    fn listed_hash(dir: &UnitsDir) -> UnitHash {
        *dir.list().unwrap()[0].content.as_ref().unwrap()
    }

    #[test]
    fn reuses_the_hash_of_a_settled_unchanged_file_without_reading_it() {
        let scratch = Scratch::new("cache-hit");
        let dir = quick_settling(&scratch);
        let file = unit("[Service]\nExecStart=/bin/true\n");
        dir.write(&name("a.service"), &file).unwrap();
        settle();
        assert_eq!(listed_hash(&dir), file.hash());
        assert_eq!(reads(&dir), 1);
        assert_eq!(listed_hash(&dir), file.hash());
        assert_eq!(listed_hash(&dir), file.hash());
        assert_eq!(reads(&dir), 1, "read once");
    }

    #[test]
    fn reads_a_file_again_until_it_has_settled() {
        let scratch = Scratch::new("cache-fresh");
        let dir = scratch.open();
        dir.write(
            &name("a.service"),
            &unit("[Service]\nExecStart=/bin/true\n"),
        )
        .unwrap();
        dir.list().unwrap();
        dir.list().unwrap();
        assert_eq!(
            reads(&dir),
            2,
            "changed less than a second ago: not trusted"
        );
    }

    #[test]
    fn sees_a_file_rewritten_in_place_with_the_same_size() {
        let scratch = Scratch::new("cache-in-place");
        let dir = quick_settling(&scratch);
        let path = dir.file_path(&name("a.service"));
        fs::write(&path, "[Service]\nExecStart=/bin/aaa\n").unwrap();
        settle();
        listed_hash(&dir);
        let inode = fs::metadata(&path).unwrap().ino();
        // An operator's edit: same inode, same size, new content.
        fs::write(&path, "[Service]\nExecStart=/bin/bbb\n").unwrap();
        assert_eq!(fs::metadata(&path).unwrap().ino(), inode);
        assert_eq!(
            listed_hash(&dir),
            unit("[Service]\nExecStart=/bin/bbb\n").hash()
        );
    }

    #[test]
    fn sees_a_file_whose_mtime_was_set_back() {
        let scratch = Scratch::new("cache-mtime");
        let dir = quick_settling(&scratch);
        let path = dir.file_path(&name("a.service"));
        fs::write(&path, "[Service]\nExecStart=/bin/aaa\n").unwrap();
        settle();
        let mtime = fs::metadata(&path).unwrap().modified().unwrap();
        listed_hash(&dir);
        fs::write(&path, "[Service]\nExecStart=/bin/bbb\n").unwrap();
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        assert_eq!(
            listed_hash(&dir),
            unit("[Service]\nExecStart=/bin/bbb\n").hash()
        );
    }

    #[test]
    fn sees_its_own_rewrite_and_forgets_removed_files() {
        let scratch = Scratch::new("cache-rewrite");
        let dir = quick_settling(&scratch);
        let a = name("a.service");
        dir.write(&a, &unit("[Service]\nExecStart=/bin/aaa\n"))
            .unwrap();
        settle();
        listed_hash(&dir);
        let new = unit("[Service]\nExecStart=/bin/bbb\n");
        dir.write(&a, &new).unwrap();
        assert_eq!(listed_hash(&dir), new.hash());
        settle();
        listed_hash(&dir);
        assert_eq!(dir.lock_hashes().len(), 1);
        dir.remove(&a).unwrap();
        assert!(dir.list().unwrap().is_empty());
        assert!(
            dir.lock_hashes().is_empty(),
            "nothing kept for a removed file"
        );
    }

    fn current_umask() -> u32 {
        let probe = std::env::temp_dir().join(format!("fleet-agent-umask-{}", std::process::id()));
        let _ = fs::remove_dir(&probe);
        fs::DirBuilder::new().mode(0o777).create(&probe).unwrap();
        let mode = fs::metadata(&probe).unwrap().permissions().mode();
        fs::remove_dir(&probe).unwrap();
        !mode & 0o777
    }
}
