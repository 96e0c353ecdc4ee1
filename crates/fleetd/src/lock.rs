//! fleetd's runtime directory (the parent of `units_directory`, /run/fleet by default) and the
//! lock in it that lets one fleetd run per directory: a second one would manage the same units
//! directory and take over the first one's lease (`fleetd.lease`). The lock is a `flock` on
//! `fleetd.lock`, released when the process exits, however it exits.
//!
//! Issue 36: the lock was a 0644 file in a 0755 directory, so any local user could open it and
//! hold it; fleetd then refused to start after its next restart, its lease expired and its
//! units were started elsewhere while they still ran here. Now:
//! - the directory is its user's alone, 0700 (an existing one is fixed, with a warning naming
//!   its old mode), and the lock file 0600, opened without following a symbolic link. A
//!   symbolic link, a directory of another user (a home, say: fleetd does not take it) or a
//!   shared system directory (`units_directory=/var/units` would make it /var) stops fleetd
//!   with an error saying what to change;
//! - a lock held all the same (by a descriptor opened before the fix) is judged by
//!   [`holder::decide`]: another fleetd of this user is refused, naming its PID; any other
//!   holder is logged at error and the lock taken over: a new 0600 file, locked, renamed over
//!   `fleetd.lock`. The squatter keeps its lock on a file that no path leads to any more.
//!
//! Every acquisition happens under a second lock, `fleetd.lock.guard`, taken without waiting:
//! without it two fleetds starting at once could each rename a file of their own over the
//! squatter's, and both run. Only this user opens the guard (0600 from its creation, in the
//! private directory), so no squatter can hold it.
//!
//! Units still work below a 0700 directory: systemd, as root, links and reads their files in
//! `units/` (functional-tests/tests/runtime_lock.rs runs one across a take-over).

mod holder;

use anyhow::{Context, Result, bail};
use holder::{FileId, Holder, Me, Process, Squatter, Verdict};
use std::fs::{self, File, OpenOptions, Permissions, TryLockError};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use tracing::{error, warn};

const LOCK_FILE: &str = "fleetd.lock";
/// Held while a fleetd takes the lock (see the module's doc).
const GUARD_FILE: &str = "fleetd.lock.guard";
/// The take-over's new lock file, before it is renamed over [`LOCK_FILE`].
const NEW_FILE: &str = "fleetd.lock.new";
const DIR_MODE: u32 = 0o700;
const FILE_MODE: u32 = 0o600;
/// Directories other software shares: made 0700, they would lock everyone else out.
const SHARED: &[&str] = &[
    "/var/lib",
    "/var/cache",
    "/var/log",
    "/var/spool",
    "/var/tmp",
    "/var/opt",
    "/var/local",
    "/usr/lib",
    "/usr/local",
    "/usr/share",
    "/run/user",
    "/run/lock",
    "/dev/shm",
];
/// How much of a squatter's command line goes into the log.
const COMMAND_CHARS: usize = 200;

/// What fleetd changed to make its runtime directory private: each one is logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fix {
    Mode { path: String, old: u32, new: u32 },
    Owner { path: String, old: u32, new: u32 },
}

/// Makes `dir` fleetd's private runtime directory and takes its lock, or says why not. The
/// lock is held as long as the returned file is open.
pub fn lock_runtime_dir(dir: &Path) -> Result<File> {
    let me = me()?;
    private_dir(dir, me.uid)?.iter().for_each(log_fix);
    let guard_path = dir.join(GUARD_FILE);
    let guard = open_logged(&guard_path, me.uid)?;
    // Closing the guard, when this returns, releases it.
    match guard.try_lock() {
        Ok(()) => acquire(dir, &me),
        Err(TryLockError::WouldBlock) => Err(held_guard(&guard, &guard_path, dir, &me)),
        Err(TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", guard_path.display()))
        }
    }
}

/// This process: its PID, user and executable.
fn me() -> Result<Me> {
    let status = fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let uid = holder::effective_uid(&status).context("no Uid line in /proc/self/status")?;
    Ok(Me {
        pid: std::process::id(),
        uid,
        exe: std::env::current_exe().ok(),
    })
}

/// Creates `dir` 0700, or makes an existing one so; refuses a symbolic link, another user's
/// directory and a shared system directory.
fn private_dir(dir: &Path, uid: u32) -> Result<Vec<Fix>> {
    if shared(dir) {
        bail!(
            "fleetd's runtime directory would be {}, a directory other software shares: fleetd \
             makes its runtime directory (the parent of units_directory) private; set \
             units_directory inside a directory of fleetd's own, such as /run/fleet/units",
            dir.display()
        );
    }
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    match fs::DirBuilder::new().mode(DIR_MODE).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(e).with_context(|| format!("creating runtime directory {}", dir.display()));
        }
    }
    let handle = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| not_followed(e, dir))?;
    let meta = handle
        .metadata()
        .with_context(|| format!("reading {}", dir.display()))?;
    if meta.uid() != uid {
        bail!(
            "fleetd's runtime directory {} belongs to uid {}, not to fleetd's uid {uid}: \
             fleetd keeps its lock only in a directory of its own (chown it, or set \
             units_directory elsewhere)",
            dir.display(),
            meta.uid()
        );
    }
    let mut fixes = Vec::new();
    set_mode(&handle, dir, meta.mode(), DIR_MODE, &mut fixes)?;
    Ok(fixes)
}

/// Whether `dir` is the root, a top-level directory or one of [`SHARED`].
fn shared(dir: &Path) -> bool {
    dir.parent().is_none_or(|p| p.parent().is_none()) || SHARED.iter().any(|s| dir == Path::new(s))
}

/// [`open_private`], logging what it fixed.
fn open_logged(path: &Path, uid: u32) -> Result<File> {
    let (file, fixes) = open_private(path, uid)?;
    fixes.iter().for_each(log_fix);
    Ok(file)
}

/// Opens (creating it 0600) a file of the private directory, never through a symbolic link,
/// and makes it this user's and 0600.
fn open_private(path: &Path, uid: u32) -> Result<(File, Vec<Fix>)> {
    let mut fixes = Vec::new();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| not_followed(e, path))?;
    let meta = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file; remove it", path.display());
    }
    // A second name may be a file elsewhere, which fleetd must not chown or chmod.
    if meta.nlink() != 1 {
        bail!(
            "{} has {} hard links; fleetd changes no file that other paths lead to (remove it)",
            path.display(),
            meta.nlink()
        );
    }
    if meta.uid() != uid {
        std::os::unix::fs::fchown(&file, Some(uid), None).with_context(|| {
            format!(
                "{} belongs to uid {}, and fleetd (uid {uid}) cannot take it; remove it",
                path.display(),
                meta.uid()
            )
        })?;
        fixes.push(Fix::Owner {
            path: path.display().to_string(),
            old: meta.uid(),
            new: uid,
        });
    }
    set_mode(&file, path, meta.mode(), FILE_MODE, &mut fixes)?;
    Ok((file, fixes))
}

fn set_mode(file: &File, path: &Path, mode: u32, want: u32, fixes: &mut Vec<Fix>) -> Result<()> {
    let old = mode & 0o7777;
    if old != want {
        file.set_permissions(Permissions::from_mode(want))
            .with_context(|| format!("making {} mode {want:04o}", path.display()))?;
        fixes.push(Fix::Mode {
            path: path.display().to_string(),
            old,
            new: want,
        });
    }
    Ok(())
}

/// An open error, saying so when `path` is a symbolic link (`O_NOFOLLOW` refused it).
fn not_followed(e: std::io::Error, path: &Path) -> anyhow::Error {
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return anyhow::anyhow!(
            "{} is a symbolic link; fleetd does not follow links in its runtime directory \
             (remove it)",
            path.display()
        );
    }
    anyhow::Error::new(e).context(format!("opening {}", path.display()))
}

fn log_fix(fix: &Fix) {
    match fix {
        Fix::Mode { path, old, new } => warn!(
            path,
            old_mode = format_args!("{old:04o}"),
            mode = format_args!("{new:04o}"),
            "made part of fleetd's runtime directory private"
        ),
        Fix::Owner { path, old, new } => warn!(
            path,
            old_uid = old,
            uid = new,
            "took a file of fleetd's runtime directory from another user"
        ),
    }
}

/// Under the guard: takes `fleetd.lock`, or judges its holder and refuses or takes it over.
fn acquire(dir: &Path, me: &Me) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let file = open_logged(&path, me.uid)?;
    match file.try_lock() {
        Ok(()) => return Ok(file),
        Err(TryLockError::WouldBlock) => {}
        Err(TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
    }
    match holder::decide(&holders(&file)?, me) {
        Verdict::Refuse { pid } => bail!(
            "another fleetd (pid {pid}) is already running with runtime directory {} (it \
             holds {})",
            dir.display(),
            path.display()
        ),
        Verdict::TakeOver { from } => {
            let lock = path.display();
            for s in &from {
                log_squatter(&lock, s);
            }
            if from.is_empty() {
                warn!(%lock, "fleetd's lock was held and let go since; replacing it");
            }
            take_over(dir, &path, me.uid)
        }
    }
}

fn log_squatter(lock: &dyn std::fmt::Display, s: &Squatter) {
    error!(
        %lock,
        pid = s.pid,
        uid = s.uid,
        command = s.command.as_deref(),
        reason = %s.why,
        "fleetd's lock is held by no fleetd of this user; taking it over"
    );
}

/// Replaces the lock file with a new one that this process holds.
fn take_over(dir: &Path, path: &Path, uid: u32) -> Result<File> {
    let new = dir.join(NEW_FILE);
    match fs::remove_file(&new) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", new.display())),
    }
    let file = open_logged(&new, uid)?;
    file.try_lock()
        .with_context(|| format!("locking the new {}", new.display()))?;
    fs::rename(&new, path)
        .with_context(|| format!("renaming {} over {}", new.display(), path.display()))?;
    Ok(file)
}

/// The guard is held: by another fleetd starting right now, or (it cannot be opened by
/// another user) by something that needs a look.
fn held_guard(guard: &File, path: &Path, dir: &Path, me: &Me) -> anyhow::Error {
    let judged = holders(guard).map(|h| holder::decide(&h, me));
    match judged {
        Ok(Verdict::Refuse { pid }) => anyhow::anyhow!(
            "another fleetd (pid {pid}) is already starting with runtime directory {}",
            dir.display()
        ),
        Ok(Verdict::TakeOver { from }) => anyhow::anyhow!(
            "{} is held by {}, no fleetd of this user; stop it or remove the file",
            path.display(),
            from.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Err(e) => e.context(format!("{} is held", path.display())),
    }
}

/// Whether a live process (a fleetd running, or hung, with runtime directory `dir`) holds the
/// lock. Read from /proc alone: the lock is neither taken nor waited for. The fence asks it
/// (`fence.rs`): a fleetd that is not running cannot have pushed its deadline.
pub fn is_held(dir: &Path) -> bool {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(LOCK_FILE));
    let Ok(file) = opened else { return false };
    holders(&file).is_ok_and(|all| all.iter().any(|h| matches!(h, Holder::Running(_))))
}

/// The holders of `file`'s `flock`, from /proc.
fn holders(file: &File) -> Result<Vec<Holder>> {
    let meta = file.metadata().context("reading the lock file")?;
    let id = FileId::from_stat(meta.dev(), meta.ino());
    let locks = fs::read_to_string("/proc/locks").context("reading /proc/locks")?;
    Ok(holder::flock_holders(&locks, id)
        .into_iter()
        .map(|pid| match u32::try_from(pid) {
            Ok(pid) if pid > 0 => process(pid, &meta),
            _ => Holder::Hidden,
        })
        .collect())
}

/// What /proc says about `pid`, which took the lock on the file `lock` is the metadata of.
fn process(pid: u32, lock: &fs::Metadata) -> Holder {
    let proc = Path::new("/proc").join(pid.to_string());
    let Ok(status) = fs::read_to_string(proc.join("status")) else {
        return Holder::Exited { pid };
    };
    let Some(uid) = holder::effective_uid(&status) else {
        return Holder::Exited { pid };
    };
    let name = holder::status_field(&status, "Name").unwrap_or_default();
    let command = fs::read(proc.join("cmdline"))
        .ok()
        .map(|c| holder::command_line(&c, COMMAND_CHARS))
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| format!("[{name}]"));
    Holder::Running(Process {
        pid,
        uid,
        exe: fs::read_link(proc.join("exe")).ok(),
        name: name.to_owned(),
        command,
        has_file_open: has_open(&proc, lock),
    })
}

/// Whether a descriptor of the process at `proc` is the file `lock` is the metadata of.
fn has_open(proc: &Path, lock: &fs::Metadata) -> bool {
    let Ok(fds) = fs::read_dir(proc.join("fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        fs::metadata(fd.path()).is_ok_and(|m| m.dev() == lock.dev() && m.ino() == lock.ino())
    })
}

#[cfg(test)]
mod tests;
