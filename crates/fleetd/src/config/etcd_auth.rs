//! etcd's username and password (issue 17): `etcd_username` with `etcd_password_file`
//! (preferred: a file of mode 0600 read once at startup) or `etcd_password` (fleet's key; in a
//! config file that others can read, [`exposed`] says so). Read together, as the API's keys
//! are, because each makes sense only with the other.
//!
//! Each key is a row of [`KEYS`](super::KEYS); its setter only keeps the value, and
//! [`resolve`] combines them once every key is read.
//!
//! A username needs exactly one password key, and a password needs a username; each refusal
//! names the keys. The password itself is never shown: not in an error, not in `Debug`.

use anyhow::{Result, anyhow};
use fleet_registry::kv::EtcdAuth;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::Raw;
use super::key::Parsed;
use fleet_registry::input::shorten;

/// The largest password file read: a password, not a document.
const MAX_PASSWORD_BYTES: u64 = 4096;

/// What the rows of `etcd_username`, `etcd_password_file` and `etcd_password` read (an
/// empty value is none); [`resolve`] combines them. No `Debug`: it holds the password.
#[derive(Default)]
pub struct Parts {
    username: Option<String>,
    password: Option<String>,
    password_file: Option<PathBuf>,
}

fn non_empty(v: &str) -> Option<String> {
    (!v.is_empty()).then(|| v.to_owned())
}

pub fn set_username(p: &mut Parsed, v: &str) -> Result<(), String> {
    p.etcd_auth.username = non_empty(v);
    Ok(())
}

pub fn set_password(p: &mut Parsed, v: &str) -> Result<(), String> {
    p.etcd_auth.password = non_empty(v);
    Ok(())
}

/// Only the path: the file is read by [`resolve`], once it knows no password is given too.
pub fn set_password_file(p: &mut Parsed, v: &str) -> Result<(), String> {
    p.etcd_auth.password_file = non_empty(v).map(PathBuf::from);
    Ok(())
}

/// `etcd_username` and its password, or `None` (anonymous, or the TLS certificate's user);
/// `raw` names where each came from.
pub fn resolve(parts: Parts, raw: &BTreeMap<String, Raw>) -> Result<Option<EtcdAuth>> {
    let source = |k: &str| raw.get(k).map_or("", |r| r.source.as_str());
    let password = match (parts.password, parts.password_file) {
        (Some(_), Some(_)) => {
            return Err(anyhow!(
                "etcd_password ({}) and etcd_password_file ({}) are both given: give one \
                 (etcd_password_file preferred)",
                source("etcd_password"),
                source("etcd_password_file")
            ));
        }
        (Some(p), None) => Some(p),
        (None, Some(f)) => Some(read_password(&f).map_err(|why| {
            anyhow!(
                "invalid etcd_password_file {:?} ({}): {why}",
                shorten(&f.to_string_lossy()),
                source("etcd_password_file")
            )
        })?),
        (None, None) => None,
    };
    match (parts.username, password) {
        (None, None) => Ok(None),
        (Some(username), Some(password)) => Ok(Some(EtcdAuth { username, password })),
        (Some(u), None) => Err(anyhow!(
            "etcd_username {:?} ({}) needs etcd_password_file or etcd_password",
            shorten(&u),
            source("etcd_username")
        )),
        (None, Some(_)) => Err(anyhow!(
            "etcd_password_file or etcd_password is given without etcd_username"
        )),
    }
}

/// The password in `path`: its first line, without the line end (`echo pw > file` works).
/// A file its group or others may read is refused (issue 37): any of them could use fleetd's
/// etcd user.
pub fn read_password(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    let file = std::fs::File::open(path).map_err(|e| format!("cannot be read: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot be read: {e}"))?;
    if !meta.is_file() {
        return Err("is not a regular file".to_owned());
    }
    super::secrets::exposed_mode(&meta).map_or(Ok(()), |mode| {
        Err(format!(
            "may be read by its group or others (mode {mode:04o}): chmod 0600 {}",
            path.display()
        ))
    })?;
    file.take(MAX_PASSWORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot be read: {e}"))?;
    if bytes.len() as u64 > MAX_PASSWORD_BYTES {
        return Err(format!("is larger than {MAX_PASSWORD_BYTES} bytes"));
    }
    let text = String::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_owned())?;
    let line = text.lines().next().unwrap_or_default();
    if line.is_empty() {
        return Err("holds no password (its first line is empty)".to_owned());
    }
    Ok(line.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The etcd user and password the whole configuration gives.
    fn build(raw: &BTreeMap<String, Raw>) -> Result<Option<EtcdAuth>> {
        super::super::build(raw, &mut vec![]).map(|c| c.etcd_auth)
    }

    fn raw(pairs: &[(&str, &str)]) -> BTreeMap<String, Raw> {
        pairs
            .iter()
            .map(|(k, v)| {
                let source = format!("src-{k}");
                (
                    k.to_string(),
                    Raw {
                        value: v.to_string(),
                        source,
                    },
                )
            })
            .collect()
    }

    /// Writes `text` into `path`, mode 0600.
    fn private(path: &Path, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    fn scratch(test: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("fleetd-auth-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn no_username_and_no_password_is_anonymous() {
        assert_eq!(build(&raw(&[])).unwrap(), None);
        assert_eq!(build(&raw(&[("etcd_username", "")])).unwrap(), None);
    }

    #[test]
    fn a_password_file_gives_its_first_line_without_the_newline() {
        let dir = scratch("file");
        let path = dir.join("pw");
        private(&path, "s3cret\n");
        let given = raw(&[
            ("etcd_username", "fleet-host-m1"),
            ("etcd_password_file", path.to_str().unwrap()),
        ]);
        let auth = build(&given).unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(auth.username, "fleet-host-m1");
        assert_eq!(auth.password, "s3cret");
    }

    #[test]
    fn a_username_without_a_password_is_refused_naming_the_keys() {
        let e = build(&raw(&[("etcd_username", "u")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("etcd_username \"u\" (src-etcd_username) needs etcd_password_file"),
            "{e}"
        );
        let e = build(&raw(&[("etcd_password", "pw")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("without etcd_username"), "{e}");
        assert!(!e.contains("pw\""), "{e}");
    }

    #[test]
    fn both_password_keys_are_refused_without_showing_the_password() {
        let e = build(&raw(&[
            ("etcd_username", "u"),
            ("etcd_password", "hunter2"),
            ("etcd_password_file", "/nonexistent"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("etcd_password (src-etcd_password) and etcd_password_file"),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn an_unreadable_or_empty_password_file_is_refused_naming_it() {
        let e = build(&raw(&[
            ("etcd_username", "u"),
            ("etcd_password_file", "/nonexistent/pw"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("invalid etcd_password_file \"/nonexistent/pw\"") && e.contains("read"),
            "{e}"
        );
        let dir = scratch("empty");
        let path = dir.join("pw");
        private(&path, "\n");
        let e = build(&raw(&[
            ("etcd_username", "u"),
            ("etcd_password_file", path.to_str().unwrap()),
        ]))
        .unwrap_err()
        .to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(e.contains("holds no password"), "{e}");
    }
}
