//! Where fleet v1.0's own binaries are (`fleetd`, `fleetctl`, built unchanged from fleet's last
//! commit; see their README): `FLEET_REFERENCE_DIR`, else `../shared/reference-fleet/` beside
//! the project's root, as that README tells tests and CI to find them. A test that needs them
//! fails, naming both places, when they are not there: it never passes without the real thing.
//!
//! [`reference_fleetctl_run`] runs fleet's fleetctl against either side a test gives it (our
//! API, or etcd with `--driver=etcd`), killing it if it hangs.

use crate::cmd::OutputExt;
use anyhow::{Context, Result, bail, ensure};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long one command of fleet's fleetctl may take before it counts as hung.
const HUNG: Duration = Duration::from_secs(60);
/// How often a running command is looked at.
const POLL: Duration = Duration::from_millis(50);

/// The variable naming another directory holding fleet's `fleetd` and `fleetctl`.
pub const REFERENCE_DIR_VAR: &str = "FLEET_REFERENCE_DIR";

/// The directory of fleet v1.0's binaries.
pub fn reference_fleet_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os(REFERENCE_DIR_VAR) {
        Some(dir) => PathBuf::from(dir),
        None => crate::state::workspace_dir().join("../shared/reference-fleet"),
    };
    if !dir.join("fleetctl").is_file() || !dir.join("fleetd").is_file() {
        bail!(
            "fleet v1.0's fleetd and fleetctl are not in {} (set {REFERENCE_DIR_VAR} to their \
             directory)",
            dir.display()
        );
    }
    Ok(dir)
}

/// fleet v1.0's own fleetctl.
pub fn reference_fleetctl() -> Result<PathBuf> {
    Ok(reference_fleet_dir()?.join("fleetctl"))
}

/// fleet's fleetctl with `endpoint` (the arguments that say where the cluster is, e.g.
/// `--endpoint=<URL>`, or `--driver=etcd` and etcd's URL) before `args`, run in `dir` (where
/// the unit files are), killed if it hangs.
pub fn reference_fleetctl_run(endpoint: &[String], dir: &Path, args: &[&str]) -> Result<Output> {
    let mut child = Command::new(reference_fleetctl()?)
        .args(endpoint)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting fleet's fleetctl")?;
    let started = Instant::now();
    while child.try_wait()?.is_none() {
        if started.elapsed() > HUNG {
            child.kill()?;
            let out = child.wait_with_output()?;
            bail!(
                "fleet's fleetctl {} hung for {HUNG:?}: {}{}",
                args.join(" "),
                out.stdout_text(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(POLL);
    }
    Ok(child.wait_with_output()?)
}

/// [`reference_fleetctl_run`], which must succeed; its stdout.
pub fn reference_fleetctl_ok(endpoint: &[String], dir: &Path, args: &[&str]) -> Result<String> {
    let out = reference_fleetctl_run(endpoint, dir, args)?;
    ensure!(
        out.status.success(),
        "fleet's fleetctl {} failed: {}{}",
        args.join(" "),
        out.stdout_text(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout_text())
}
