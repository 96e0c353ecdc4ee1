//! Where fleet v1.0's own binaries are (`fleetd`, `fleetctl`, built unchanged from fleet's last
//! commit; see their README): `FLEET_REFERENCE_DIR`, else `../shared/reference-fleet/` beside
//! the project's root, as that README tells tests and CI to find them. A test that needs them
//! fails, naming both places, when they are not there: it never passes without the real thing.

use anyhow::{Result, bail};
use std::path::PathBuf;

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
