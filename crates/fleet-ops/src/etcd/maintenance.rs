//! What drain and explain read: the registry as the engine's scheduler sees it (one snapshot
//! and every unit file at its revision), so that [`fleet_scheduler::explain`] and
//! [`fleet_scheduler::drain_status`] answer with the engine's own rules.

use fleet_core::{UnitFile, UnitHash};
use fleet_registry::Snapshot;
use fleet_registry::kv::Kv;
use std::collections::BTreeMap;

use super::RegistryCluster;
use crate::OpsError;

impl<K: Kv> RegistryCluster<K> {
    /// One snapshot and every readable unit file at its revision (a file that cannot be read
    /// leaves its units as the engine leaves them: where they are).
    pub(super) async fn scheduler_view(
        &self,
    ) -> Result<(Snapshot, BTreeMap<UnitHash, UnitFile>), OpsError> {
        let snap = self.registry.snapshot().await?;
        let files = self.registry.files(Some(snap.revision)).await?;
        Ok((snap, files.items))
    }
}
