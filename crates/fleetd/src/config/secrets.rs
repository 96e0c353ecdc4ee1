//! Secrets fleetd reads (issue 37, item 2): the etcd password, and the private keys of etcd's
//! and the API's TLS. A file its group or others may read is refused, and so is a password
//! given as a flag (every local user sees it in `ps`): each refusal names the file or flag and
//! how to fix it. A password that goes over plain `http://` is warned of
//! (`super::Warning::PasswordInClear`).

use std::collections::BTreeMap;
use std::path::Path;

use super::{Config, Raw};

/// The mode of a secret file its group or others may read, if they may.
pub fn exposed_mode(meta: &std::fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o7777;
    (mode & 0o044 != 0).then_some(mode)
}

/// Why the etcd password is refused where it was given, if it is (issue 37): in a config
/// file its group or others may read (any of them could use fleetd's etcd user), or as a
/// flag (every local user sees it in `ps`).
pub fn exposed(
    file: &BTreeMap<String, Raw>,
    path: &Path,
    given: &BTreeMap<String, Raw>,
) -> Option<String> {
    if let Some(r) = given.get("etcd_password")
        && r.source.starts_with("flag")
    {
        return Some(format!(
            "etcd_password is given as a flag ({}), which every local user sees in ps: use \
             etcd_password_file (mode 0600) or the environment FLEET_ETCD_PASSWORD",
            r.source
        ));
    }
    file.get("etcd_password")?;
    let mode = exposed_mode(&std::fs::metadata(path).ok()?)?;
    Some(format!(
        "etcd_password is in {}, which its group or others may read (mode {mode:04o}): \
         chmod 0600 {}, or move the password to etcd_password_file (mode 0600)",
        path.display(),
        path.display()
    ))
}

/// The private key files of the configuration that their group or others may read, as a
/// refusal naming the first: anyone of them could act as this host.
pub fn exposed_keys(config: &Config) -> Option<String> {
    let keys = [
        ("etcd_keyfile", config.etcd_keyfile.as_deref()),
        (
            "api_keyfile",
            config.api.tls.as_ref().map(|t| t.key.as_path()),
        ),
    ];
    keys.into_iter().find_map(|(name, path)| {
        let path = path?;
        let mode = exposed_mode(&std::fs::metadata(path).ok()?)?;
        Some(format!(
            "{name} {} may be read by its group or others (mode {mode:04o}): chmod 0600 {}",
            path.display(),
            path.display()
        ))
    })
}

/// The environment file `dist/fleet.service` loads (`EnvironmentFile=-/etc/fleet/fleetd.env`):
/// where a packaged fleetd's `FLEET_ETCD_PASSWORD` comes from.
pub const ENV_FILE: &str = "/etc/fleet/fleetd.env";

/// Why a password taken from the environment is refused, if it is: `path` (the unit's
/// environment file) sets `FLEET_ETCD_PASSWORD` and its group or others may read it. fleetd
/// cannot see which file systemd read its environment from, so it checks the one its unit
/// names; a missing file, or one without the password, is none of its business.
pub fn exposed_env_file(path: &Path) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mode = exposed_mode(&file.metadata().ok()?)?;
    let mut text = String::new();
    file.take(1 << 20).read_to_string(&mut text).ok()?;
    let sets_password = text.lines().any(|l| {
        let l = l.trim_start();
        let l = l.strip_prefix("export ").unwrap_or(l).trim_start();
        l.starts_with("FLEET_ETCD_PASSWORD=")
    });
    sets_password.then(|| {
        format!(
            "FLEET_ETCD_PASSWORD is set in {}, which its group or others may read (mode \
             {mode:04o}): chmod 0600 {}, or use etcd_password_file (mode 0600)",
            path.display(),
            path.display()
        )
    })
}

/// A warning for each plain `http://` etcd endpoint the password would travel to.
pub fn passwords_in_clear(config: &Config) -> Vec<super::Warning> {
    if config.etcd_auth.is_none() {
        return Vec::new();
    }
    config
        .etcd_servers
        .iter()
        .filter(|e| e.starts_with("http://"))
        .map(|e| super::Warning::PasswordInClear {
            endpoint: e.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::etcd_auth::read_password;
    use std::os::unix::fs::PermissionsExt;

    fn raw(pairs: &[(&str, &str)]) -> BTreeMap<String, Raw> {
        pairs
            .iter()
            .map(|(k, v)| {
                let raw = Raw {
                    value: v.to_string(),
                    source: format!("src-{k}"),
                };
                (k.to_string(), raw)
            })
            .collect()
    }

    fn scratch(test: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("fleetd-secrets-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Issue 37, item 2: a password its host's other users can read is refused where it is
    /// given, saying how to fix it.
    #[test]
    fn a_password_others_can_read_or_see_in_ps_is_refused_saying_how_to_fix_it() {
        let dir = scratch("exposed");
        let path = dir.join("fleet.conf");
        std::fs::write(&path, "etcd_password=x\n").unwrap();
        let file = raw(&[("etcd_password", "x")]);
        let none = BTreeMap::new();
        let mode = |m| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m));
        mode(0o644).unwrap();
        let open = exposed(&file, &path, &none).unwrap();
        assert!(open.contains("(mode 0644): chmod 0600"), "{open}");
        mode(0o640).unwrap();
        assert!(
            exposed(&file, &path, &none).is_some(),
            "its group may read it"
        );
        mode(0o600).unwrap();
        assert_eq!(exposed(&file, &path, &none), None);
        assert_eq!(exposed(&raw(&[("etcd_username", "u")]), &path, &none), None);
        let flag = BTreeMap::from([(
            "etcd_password".to_owned(),
            Raw {
                value: "x".into(),
                source: "flag --etcd-password".into(),
            },
        )]);
        let seen = exposed(&none, &path, &flag).unwrap();
        assert!(seen.contains("which every local user sees in ps"), "{seen}");
        let env = BTreeMap::from([(
            "etcd_password".to_owned(),
            Raw {
                value: "x".into(),
                source: "environment FLEET_ETCD_PASSWORD".into(),
            },
        )]);
        assert_eq!(exposed(&none, &path, &env), None);
        // A password file likewise.
        let pw = dir.join("etcd-password");
        std::fs::write(&pw, "s3cret\n").unwrap();
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_password(&pw).unwrap_err();
        assert!(e.contains("chmod 0600"), "{e}");
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_password(&pw).unwrap(), "s3cret");
        assert!(read_password(Path::new("/dev/null")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_private_key_others_can_read_is_refused_naming_its_key() {
        let dir = scratch("keys");
        let key = dir.join("api.key");
        std::fs::write(&key, "k").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut config = Config {
            etcd_keyfile: Some(dir.join("missing.key")),
            ..Config::default()
        };
        config.api.tls = Some(crate::config::ApiTlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("api.pem"),
            key: key.clone(),
            crl: None,
        });
        let e = exposed_keys(&config).unwrap();
        assert!(e.starts_with("api_keyfile "), "{e}");
        assert!(e.contains("(mode 0644): chmod 0600"), "{e}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(exposed_keys(&config), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue 37, item 2: the unit's environment file holding the password is a secret file.
    #[test]
    fn an_environment_file_others_can_read_holding_the_password_is_refused() {
        let dir = scratch("envfile");
        let env = dir.join("fleetd.env");
        std::fs::write(
            &env,
            "FLEET_METADATA=role=web\nexport FLEET_ETCD_PASSWORD=x\n",
        )
        .unwrap();
        std::fs::set_permissions(&env, std::fs::Permissions::from_mode(0o644)).unwrap();
        let why = exposed_env_file(&env).unwrap();
        assert!(why.contains("(mode 0644): chmod 0600"), "{why}");
        std::fs::set_permissions(&env, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(exposed_env_file(&env), None);
        std::fs::write(&env, "FLEET_METADATA=role=web\n").unwrap();
        std::fs::set_permissions(&env, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(exposed_env_file(&env), None, "no password in it");
        assert_eq!(exposed_env_file(&dir.join("missing")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue 37, item 2: credentials over plain http are warned of, one endpoint each.
    #[test]
    fn a_password_going_over_plain_http_is_warned_of_per_endpoint() {
        let mut config = Config {
            etcd_servers: vec!["http://e1:2379".into(), "https://e2:2379".into()],
            ..Config::default()
        };
        assert!(passwords_in_clear(&config).is_empty(), "no credentials");
        config.etcd_auth = Some(fleet_registry::kv::EtcdAuth {
            username: "u".into(),
            password: "p".into(),
        });
        let warned: Vec<_> = passwords_in_clear(&config)
            .into_iter()
            .map(|w| match w {
                crate::config::Warning::PasswordInClear { endpoint } => endpoint,
                crate::config::Warning::Ignored(i) => panic!("{i:?}"),
            })
            .collect();
        assert_eq!(warned, ["http://e1:2379"]);
    }
}
