//! fleetctl's etcd credentials (issue 17): `--username` (`FLEETCTL_USERNAME`), its password
//! from `--password-file` (`FLEETCTL_PASSWORD_FILE`) or the variable `FLEETCTL_PASSWORD`.
//! There is no password flag: a command line is visible to every user of the host (`ps`).
//! They apply to the etcd driver; fleet's API authenticates clients by certificate.

use anyhow::{Result, anyhow, bail};
use fleet_registry::input::shorten;
use fleet_registry::kv::EtcdAuth;
use std::path::Path;

/// The largest password file read: a password, not a document.
const MAX_PASSWORD_BYTES: u64 = 4096;

/// The credentials the flags give, or `None` for none. `env_password` is `FLEETCTL_PASSWORD`.
pub fn etcd_auth(
    username: Option<&str>,
    password_file: Option<&Path>,
    env_password: Option<String>,
) -> Result<Option<EtcdAuth>> {
    let env_password = env_password.filter(|p| !p.is_empty());
    let username = username.filter(|u| !u.is_empty());
    let password = match (password_file, env_password) {
        (Some(_), Some(_)) => {
            bail!("--password-file and FLEETCTL_PASSWORD are both given: give one")
        }
        (Some(file), None) => Some(read_password(file)?),
        (None, Some(p)) => Some(p),
        (None, None) => None,
    };
    match (username, password) {
        (None, None) => Ok(None),
        (Some(username), Some(password)) => Ok(Some(EtcdAuth {
            username: username.to_owned(),
            password,
        })),
        (Some(u), None) => bail!(
            "--username {:?} needs a password: --password-file FILE or FLEETCTL_PASSWORD",
            shorten(u)
        ),
        (None, Some(_)) => {
            bail!("a password (--password-file or FLEETCTL_PASSWORD) needs --username")
        }
    }
}

/// The password in `path`: its first line, without the line end (`echo pw > file` works).
pub fn read_password(path: &Path) -> Result<String> {
    use std::io::Read;
    let shown = path.display();
    let mut bytes = Vec::new();
    let file =
        std::fs::File::open(path).map_err(|e| anyhow!("reading the password file {shown}: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| anyhow!("reading the password file {shown}: {e}"))?;
    if let Some(mode) = exposed_mode(&meta) {
        bail!(
            "the password file {shown} may be read by its group or others (mode {mode:04o}): \
             chmod 0600 {shown}"
        );
    }
    file.take(MAX_PASSWORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| anyhow!("reading the password file {shown}: {e}"))?;
    if bytes.len() as u64 > MAX_PASSWORD_BYTES {
        bail!("the password file {shown} is larger than {MAX_PASSWORD_BYTES} bytes");
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow!("the password file {shown} is not UTF-8 text"))?;
    match text.lines().next() {
        Some(line) if !line.is_empty() => Ok(line.to_owned()),
        _ => bail!("the password file {shown} holds no password (its first line is empty)"),
    }
}

/// The mode of a file (not a pipe or a device: `<(pass show etcd)` works) that its group or
/// others may read, if they may.
fn exposed_mode(meta: &std::fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o7777;
    (meta.is_file() && mode & 0o044 != 0).then_some(mode)
}

/// The endpoints among `endpoints` that would carry `auth`'s password in the clear (plain
/// `http://`), to be warned of.
pub fn in_clear<'e>(auth: Option<&EtcdAuth>, endpoints: &'e [String]) -> Vec<&'e str> {
    if auth.is_none() {
        return Vec::new();
    }
    endpoints
        .iter()
        .filter(|e| e.starts_with("http://"))
        .map(String::as_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_username_and_no_password_connects_without_credentials() {
        assert_eq!(etcd_auth(None, None, None).unwrap(), None);
        assert_eq!(
            etcd_auth(Some(""), None, Some(String::new())).unwrap(),
            None
        );
    }

    #[test]
    fn the_password_comes_from_the_environment_or_the_first_line_of_a_file() {
        let auth = etcd_auth(Some("ops"), None, Some("pw".into()))
            .unwrap()
            .unwrap();
        assert_eq!(
            (auth.username.as_str(), auth.password.as_str()),
            ("ops", "pw")
        );
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("fleetctl-pw-{}", std::process::id()));
        std::fs::write(&path, "s3cret\nignored\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let auth = etcd_auth(Some("ops"), Some(&path), None);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(auth.unwrap().unwrap().password, "s3cret");
    }

    #[test]
    fn a_username_without_a_password_or_two_passwords_are_refused_without_showing_one() {
        let e = etcd_auth(Some("ops"), None, None).unwrap_err().to_string();
        assert!(e.contains("--username \"ops\" needs a password"), "{e}");
        let e = etcd_auth(None, None, Some("hunter2".into()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("needs --username") && !e.contains("hunter2"),
            "{e}"
        );
        let e = etcd_auth(Some("u"), Some(Path::new("/x")), Some("hunter2".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("both given") && !e.contains("hunter2"), "{e}");
        let e = etcd_auth(Some("u"), Some(Path::new("/nonexistent/pw")), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("reading the password file /nonexistent/pw"),
            "{e}"
        );
    }

    /// Issue 37, item 2: a password file others may read is refused, saying how to fix it.
    #[test]
    fn a_password_file_others_may_read_is_refused_saying_how_to_fix_it() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("fleetctl-pw-open-{}", std::process::id()));
        std::fs::write(&path, "s3cret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_password(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(
            e.contains("may be read by its group or others (mode 0644): chmod 0600"),
            "{e}"
        );
        assert!(!e.contains("s3cret"), "{e}");
    }

    /// Issue 37, item 2: credentials bound for plain http are named, one endpoint each.
    #[test]
    fn a_password_bound_for_plain_http_names_each_such_endpoint() {
        let endpoints = ["http://e1:2379".to_owned(), "https://e2:2379".to_owned()];
        assert!(in_clear(None, &endpoints).is_empty());
        let auth = EtcdAuth {
            username: "u".into(),
            password: "p".into(),
        };
        assert_eq!(in_clear(Some(&auth), &endpoints), ["http://e1:2379"]);
    }
}
