//! Which `units_directory` fleetd may own. The agent removes files there that it did not
//! schedule (boot cleanup), so the directory must be fleetd's alone: never a directory
//! systemd loads units from, never one of their ancestors, never the root or a top-level
//! system directory. Checked at startup, before anything is created.

use std::path::{Component, Path, PathBuf};

/// Where systemd (system and user managers, generators, presets) reads unit files from, as
/// roots: any directory at or below one of these is systemd's, and any ancestor of one holds
/// systemd's.
const SYSTEMD_ROOTS: &[&str] = &[
    "/etc/systemd",
    "/run/systemd",
    "/lib/systemd",
    "/usr/lib/systemd",
    "/usr/local/lib/systemd",
    "/usr/share/systemd",
    "/usr/local/share/systemd",
    "/etc/xdg/systemd",
    "/usr/lib64/systemd",
    "/lib64/systemd",
];

/// Top-level directories of the host (FHS): owning one would mean owning the host's files.
const SYSTEM_TOP_LEVEL: &[&str] = &[
    "bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "media", "mnt", "opt",
    "proc", "root", "run", "sbin", "srv", "sys", "tmp", "usr", "var",
];

/// Pseudo file systems: nothing of fleetd's can live there.
const PSEUDO: &[&str] = &["/dev", "/proc", "/sys"];

/// Why `raw` cannot be fleetd's units directory, if it cannot.
pub fn check(raw: &str) -> Result<PathBuf, String> {
    if raw.trim().is_empty() {
        return Err("must not be empty (leave the key out for /run/fleet/units)".into());
    }
    let path = Path::new(raw);
    if !path.is_absolute() {
        return Err("must be an absolute path".into());
    }
    if path
        .components()
        .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
    {
        return Err("must not contain \".\" or \"..\"".into());
    }
    if raw.chars().any(char::is_control) {
        return Err("must not contain a control character".into());
    }
    refuse_host_directory(path)?;
    // A symbolic link (or one on the way) may lead into systemd's directories.
    if let Ok(real) = std::fs::canonicalize(path)
        && real != path
    {
        refuse_host_directory(&real)
            .map_err(|why| format!("leads to {} which {why}", real.display()))?;
    }
    Ok(path.to_path_buf())
}

fn refuse_host_directory(path: &Path) -> Result<(), String> {
    let normal: Vec<&std::ffi::OsStr> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    if normal.is_empty() {
        return Err("is the root directory".into());
    }
    if normal.iter().any(|c| *c == "systemd") {
        return Err("is one of systemd's directories; fleetd needs a directory of its own".into());
    }
    for root in SYSTEMD_ROOTS.iter().map(Path::new) {
        if path.starts_with(root) {
            return Err(format!(
                "is inside systemd's {}; fleetd needs a directory of its own",
                root.display()
            ));
        }
        if root.starts_with(path) {
            return Err(format!(
                "holds systemd's {}; fleetd needs a directory of its own",
                root.display()
            ));
        }
    }
    if let [top] = normal[..]
        && SYSTEM_TOP_LEVEL.iter().any(|t| top == *t)
    {
        return Err("is a system directory; fleetd needs a directory of its own".into());
    }
    if let Some(pseudo) = PSEUDO.iter().find(|p| path.starts_with(p)) {
        return Err(format!("is inside {pseudo}, a pseudo file system"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn refuses_directories_that_are_not_fleetds_own_and_says_why() {
        let table: &[(&str, &str)] = &[
            ("", "must not be empty"),
            ("  ", "must not be empty"),
            ("units", "must be an absolute path"),
            ("./units", "must be an absolute path"),
            ("/", "is the root directory"),
            ("//", "is the root directory"),
            ("/run/fleet/../systemd/system", "must not contain"),
            ("/etc/systemd/system", "one of systemd's directories"),
            ("/etc/systemd/system/", "one of systemd's directories"),
            ("/run/systemd/system", "one of systemd's directories"),
            ("/run/systemd/transient", "one of systemd's directories"),
            ("/lib/systemd/system", "one of systemd's directories"),
            ("/usr/lib/systemd/system", "one of systemd's directories"),
            (
                "/usr/local/lib/systemd/system",
                "one of systemd's directories",
            ),
            ("/etc/systemd/user", "one of systemd's directories"),
            (
                "/etc/systemd/system/multi-user.target.wants",
                "one of systemd's",
            ),
            (
                "/home/core/.config/systemd/user",
                "one of systemd's directories",
            ),
            ("/etc", "holds systemd's /etc/systemd"),
            ("/usr", "holds systemd's /usr/lib/systemd"),
            ("/usr/lib", "holds systemd's /usr/lib/systemd"),
            ("/usr/local", "holds systemd's /usr/local/lib/systemd"),
            ("/run", "holds systemd's /run/systemd"),
            ("/etc/xdg", "holds systemd's /etc/xdg/systemd"),
            ("/home", "is a system directory"),
            ("/var", "is a system directory"),
            ("/tmp", "is a system directory"),
            ("/proc/fleet", "a pseudo file system"),
            ("/run/fleet\n", "control character"),
        ];
        for (dir, want) in table {
            let got = check(dir).unwrap_err();
            assert!(got.contains(want), "{dir:?}: {got}");
        }
    }

    #[test]
    fn accepts_directories_of_fleetds_own() {
        for dir in [
            "/run/fleet/units",
            "/var/lib/fleet/units",
            "/run/fleet-bad/units",
            "/srv/fleet",
        ] {
            assert_eq!(
                check(dir).map_err(|e| e.to_string()),
                Ok(dir.into()),
                "{dir}"
            );
        }
    }

    #[test]
    fn follows_a_symbolic_link_into_systemds_directories() {
        let dir = std::env::temp_dir().join(format!("fleetd-units-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("units");
        std::os::unix::fs::symlink("/etc/systemd/system", &link).unwrap();
        let got = check(link.to_str().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        let got = got.unwrap_err();
        assert!(got.contains("leads to /etc/systemd/system"), "{got}");
    }
}
