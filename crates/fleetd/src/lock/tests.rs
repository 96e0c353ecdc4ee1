//! The runtime directory's and the lock file's modes, links and refusals, on the real file
//! system as any user. Holders of other users and the take-over are in tests/runtime_lock.rs,
//! which runs fleetd itself as root.

use super::*;
use std::os::unix::fs::symlink;
use std::path::PathBuf;

/// A fresh directory under the target directory (never /tmp), removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/fleetd-lock-tests")
            .join(format!("{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn my_uid() -> u32 {
    me().unwrap().uid
}

#[test]
fn a_missing_runtime_directory_is_created_0700_with_its_lock_0600() {
    let scratch = Scratch::new("missing");
    let dir = scratch.0.join("run/fleet");
    let lock = lock_runtime_dir(&dir).unwrap();
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join(LOCK_FILE)), 0o600);
    assert_eq!(mode(&dir.join(GUARD_FILE)), 0o600);
    drop(lock);
}

#[test]
fn a_loose_runtime_directory_and_lock_are_made_private_naming_their_old_modes() {
    let scratch = Scratch::new("loose");
    let dir = scratch.0.join("fleet");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, Permissions::from_mode(0o755)).unwrap();
    let path = dir.join(LOCK_FILE);
    fs::write(&path, "").unwrap();
    fs::set_permissions(&path, Permissions::from_mode(0o644)).unwrap();

    let dir_fixes = private_dir(&dir, my_uid()).unwrap();
    let (_file, file_fixes) = open_private(&path, my_uid()).unwrap();
    assert_eq!(
        dir_fixes,
        [Fix::Mode {
            path: dir.display().to_string(),
            old: 0o755,
            new: 0o700
        }]
    );
    assert_eq!(
        file_fixes,
        [Fix::Mode {
            path: path.display().to_string(),
            old: 0o644,
            new: 0o600
        }]
    );
    assert_eq!((mode(&dir), mode(&path)), (0o700, 0o600));
    // Private already: nothing to fix the second time.
    assert_eq!(private_dir(&dir, my_uid()).unwrap(), []);
    assert_eq!(open_private(&path, my_uid()).unwrap().1, []);
}

#[test]
fn a_runtime_directory_that_is_a_symbolic_link_is_refused() {
    let scratch = Scratch::new("dir-link");
    let target = scratch.0.join("elsewhere");
    fs::create_dir(&target).unwrap();
    fs::set_permissions(&target, Permissions::from_mode(0o755)).unwrap();
    let dir = scratch.0.join("fleet");
    symlink(&target, &dir).unwrap();
    let e = format!("{:#}", lock_runtime_dir(&dir).unwrap_err());
    assert!(e.contains("is a symbolic link"), "{e}");
    assert_eq!(mode(&target), 0o755, "the link's target was changed");
    assert!(!target.join(LOCK_FILE).exists());
}

#[test]
fn a_lock_file_that_is_a_symbolic_link_is_refused_and_its_target_left_alone() {
    let scratch = Scratch::new("file-link");
    let dir = scratch.0.join("fleet");
    fs::create_dir(&dir).unwrap();
    let target = scratch.0.join("precious");
    fs::write(&target, "keep").unwrap();
    fs::set_permissions(&target, Permissions::from_mode(0o644)).unwrap();
    symlink(&target, dir.join(LOCK_FILE)).unwrap();
    let e = format!("{:#}", lock_runtime_dir(&dir).unwrap_err());
    assert!(e.contains("fleetd.lock is a symbolic link"), "{e}");
    assert_eq!(mode(&target), 0o644);
    assert_eq!(fs::read_to_string(&target).unwrap(), "keep");
}

#[test]
fn a_lock_file_with_another_hard_link_is_refused_and_left_alone() {
    let scratch = Scratch::new("hard-link");
    let dir = scratch.0.join("fleet");
    fs::create_dir(&dir).unwrap();
    let other = scratch.0.join("other");
    fs::write(&other, "").unwrap();
    fs::set_permissions(&other, Permissions::from_mode(0o644)).unwrap();
    fs::hard_link(&other, dir.join(LOCK_FILE)).unwrap();
    let e = format!("{:#}", lock_runtime_dir(&dir).unwrap_err());
    assert!(e.contains("has 2 hard links"), "{e}");
    assert_eq!(mode(&other), 0o644);
}

#[test]
fn shared_system_directories_are_never_made_private() {
    for dir in [
        "/",
        "/var",
        "/home",
        "/run",
        "/srv",
        "/var/lib",
        "/usr/local",
    ] {
        assert!(shared(Path::new(dir)), "{dir}");
    }
    for dir in [
        "/run/fleet",
        "/var/lib/fleet",
        "/srv/fleet",
        "/home/core/fleet",
    ] {
        assert!(!shared(Path::new(dir)), "{dir}");
    }
    let e = format!(
        "{:#}",
        private_dir(Path::new("/var"), my_uid()).unwrap_err()
    );
    assert!(e.contains("/var, a directory other software shares"), "{e}");
}

#[test]
fn a_runtime_directory_of_another_user_is_refused() {
    let scratch = Scratch::new("foreign");
    let uid = my_uid();
    // Whoever runs this, the directory is not the user's that the call is made for.
    let e = format!(
        "{:#}",
        private_dir(&scratch.0, uid.wrapping_add(1)).unwrap_err()
    );
    assert!(e.contains(&format!("belongs to uid {uid}")), "{e}");
}
