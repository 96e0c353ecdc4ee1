//! etcd's authentication in a functional cluster (issue 17, [`FleetdSpec::etcd_auth`]): after
//! etcd starts and before any fleetd, `fleetctl auth setup --enable` creates fleet's roles,
//! an operator and a viewer user and etcd's root, and turns auth on; each machine is then
//! issued its own user with `fleetctl auth add-host` (engine-capable, its API may write) and
//! its fleetd is configured with it (`etcd_username`, `etcd_password_file` in its private
//! /run/fleet). The test's fleetctl runs as the operator over the etcd driver.
//!
//! The passwords are in `<run dir>/etcd-auth/<user>` (the run directory is the test's).

use crate::state::ClusterState;
use anyhow::{Context, Result, bail};
use fleet_core::MachineId;
use fleet_registry::kv::EtcdAuth;
use std::path::{Path, PathBuf};
use std::process::Command;

/// fleetctl's operator user (role fleet-operator).
pub const OPERATOR: &str = "fleet-ops";
/// A read-only user (role fleet-viewer).
pub const VIEWER: &str = "fleet-view";
/// etcd's superuser, which administers the others.
pub const ROOT: &str = "root";

/// Where fleetd reads its password inside a machine (the stage's `fleet/` is its /run/fleet).
pub const MACHINE_PASSWORD_FILE: &str = "/run/fleet/etcd-password";

/// The file holding `user`'s password in the run directory.
pub fn password_file(dir: &Path, user: &str) -> PathBuf {
    dir.join("etcd-auth").join(user)
}

/// `user`'s credentials (one of [`OPERATOR`], [`VIEWER`], [`ROOT`]).
pub fn credentials(dir: &Path, user: &str) -> Result<EtcdAuth> {
    let path = password_file(dir, user);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("no password for {user} at {}", path.display()))?;
    Ok(EtcdAuth {
        username: user.to_owned(),
        password: text.trim_end().to_owned(),
    })
}

/// Machine `id`'s own etcd credentials, as its fleetd holds them: what a test uses to act
/// with exactly one host's foothold.
pub fn host_credentials(id: &MachineId) -> EtcdAuth {
    EtcdAuth {
        username: fleet_registry::rbac::host_user_name(id),
        password: host_password(id),
    }
}

fn host_password(id: &MachineId) -> String {
    format!("host-{id}")
}

/// fleetctl's environment to run as `user` over the etcd driver.
pub fn fleetctl_env(dir: &Path, user: &str) -> [(&'static str, PathBuf); 2] {
    [
        ("FLEETCTL_USERNAME", PathBuf::from(user)),
        ("FLEETCTL_PASSWORD_FILE", password_file(dir, user)),
    ]
}

/// Writes a password file, readable by its owner only.
fn write_password(path: &Path, password: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, format!("{password}\n"))
        .with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// fleetctl as `user` (none: anonymously) over the etcd driver of `state`'s etcd.
fn fleetctl(state: &ClusterState, user: Option<&str>, args: &[&str]) -> Result<()> {
    let endpoint = state.etcd_endpoint().context("etcd has no endpoint")?;
    let mut cmd = Command::new(state.bin_dir.join("fleetctl"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FLEETCTL_")) {
        cmd.env_remove(k);
    }
    cmd.env("FLEETCTL_DRIVER", "etcd")
        .env("FLEETCTL_ENDPOINT", endpoint)
        .args(args);
    if let Some(user) = user {
        cmd.envs(fleetctl_env(&state.dir, user));
    }
    let out = cmd.output().context("cannot run fleetctl")?;
    if !out.status.success() {
        bail!(
            "fleetctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Creates the roles, the operator, the viewer and root, and turns etcd's auth on.
pub(crate) fn setup(state: &ClusterState) -> Result<()> {
    let run = state.run_id.as_str();
    for user in [ROOT, OPERATOR, VIEWER] {
        write_password(&password_file(&state.dir, user), &format!("{user}-{run}"))?;
    }
    let file = |user| password_file(&state.dir, user).display().to_string();
    let (root, operator, viewer) = (file(ROOT), file(OPERATOR), file(VIEWER));
    fleetctl(
        state,
        None,
        &[
            "auth",
            "setup",
            "--enable",
            "--root-password-file",
            &root,
            "--operator",
            OPERATOR,
            "--operator-password-file",
            &operator,
            "--viewer",
            VIEWER,
            "--viewer-password-file",
            &viewer,
        ],
    )
}

/// Issues machine `id` its user (when `full`, engine-capable and its API may write; else its
/// machine role only), with the password in `stage_fleet/etcd-password`; returns fleetd's
/// environment lines for it.
pub(crate) fn add_host(
    state: &ClusterState,
    id: &MachineId,
    stage_fleet: &Path,
    full: bool,
) -> Result<String> {
    let path = stage_fleet.join("etcd-password");
    write_password(&path, &host_password(id))?;
    grant(state, id, &path, full)?;
    let user = fleet_registry::rbac::host_user_name(id);
    Ok(format!(
        "FLEET_ETCD_USERNAME=\"{user}\"\nFLEET_ETCD_PASSWORD_FILE=\"{MACHINE_PASSWORD_FILE}\"\n"
    ))
}

/// Gives machine `id` the engine role and its API the operator's (`full`), or its machine
/// role only, keeping its password.
pub fn set_full_roles(state: &ClusterState, id: &MachineId, full: bool) -> Result<()> {
    let stage = crate::machine::stage_dir(state, &machine_name(state, id)?).join("fleet");
    grant(state, id, &stage.join("etcd-password"), full)
}

/// `fleetctl auth add-host` as root: the host's roles and user.
fn grant(state: &ClusterState, id: &MachineId, password: &Path, full: bool) -> Result<()> {
    let path = password.display().to_string();
    let id = id.to_string();
    let mut args = vec!["auth", "add-host", &id, "--host-password-file", &path];
    if full {
        args.extend(["--engine", "--api", "write"]);
    }
    fleetctl(state, Some(ROOT), &args)
}

fn machine_name(state: &ClusterState, id: &MachineId) -> Result<String> {
    state
        .machines
        .iter()
        .find(|m| &m.id == id)
        .map(|m| m.name.clone())
        .with_context(|| format!("no machine {id}"))
}
