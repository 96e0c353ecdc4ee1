//! [`Changes`] over the registry: a [`LiveView`] without files follows every change under the
//! prefix, and the wait view of the watched units is rebuilt from it after each one. A watch
//! that ends (etcd away for a moment, a compaction) is started again, reading everything.

use fleet_core::UnitName;
use fleet_registry::LiveView;
use fleet_registry::Registry;
use fleet_registry::kv::Kv;
use std::collections::BTreeSet;
use tracing::debug;

use super::views;
use crate::OpsError;
use crate::model::{Changes, WaitView};

#[derive(Debug)]
pub struct RegistryChanges<K> {
    registry: Registry<K>,
    live: LiveView<K>,
    names: BTreeSet<UnitName>,
    view: WaitView,
}

impl<K: Kv> RegistryChanges<K> {
    pub(super) async fn start(
        registry: Registry<K>,
        names: BTreeSet<UnitName>,
    ) -> Result<RegistryChanges<K>, OpsError> {
        let live = LiveView::start_without_files(registry.clone()).await?;
        let view = views::wait_view(live.snapshot(), &names);
        Ok(RegistryChanges {
            registry,
            live,
            names,
            view,
        })
    }
}

impl<K: Kv> Changes for RegistryChanges<K> {
    fn view(&self) -> &WaitView {
        &self.view
    }

    /// Returns once the watched units, their states or the machines changed: changes to
    /// other units wake nothing.
    async fn changed(&mut self) -> Result<(), OpsError> {
        loop {
            if let Err(e) = self.live.changed().await {
                debug!(error = %e, "registry watch ended; reading the registry again");
                self.live = LiveView::start_without_files(self.registry.clone()).await?;
            }
            let next = views::wait_view(self.live.snapshot(), &self.names);
            if next != self.view {
                self.view = next;
                return Ok(());
            }
        }
    }

    fn names(&self) -> &BTreeSet<UnitName> {
        &self.names
    }
}
