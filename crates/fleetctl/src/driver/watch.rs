//! [`Changes`] over the API: fleet's API has no watch, so a wait polls. Each poll reads the
//! watched units, their states and the machines (three listings, only the watched units'),
//! and returns once that view differs from the last one, as the etcd side returns only on a
//! change that matters to the wait.

use fleet_core::UnitName;
use fleet_ops::{Changes, Cluster, OpsError, WaitView};
use std::collections::{BTreeMap, BTreeSet};

use super::http::HttpCluster;

#[derive(Debug)]
pub struct HttpChanges {
    cluster: HttpCluster,
    names: BTreeSet<UnitName>,
    view: WaitView,
}

impl HttpChanges {
    pub(super) async fn start(
        cluster: HttpCluster,
        names: BTreeSet<UnitName>,
    ) -> Result<HttpChanges, OpsError> {
        let view = read(&cluster, &names).await?;
        Ok(HttpChanges {
            cluster,
            names,
            view,
        })
    }
}

impl Changes for HttpChanges {
    fn view(&self) -> &WaitView {
        &self.view
    }

    async fn changed(&mut self) -> Result<(), OpsError> {
        loop {
            tokio::time::sleep(self.cluster.poll_interval()).await;
            let next = read(&self.cluster, &self.names).await?;
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

/// The wait view of `names` now: the same shape the etcd side builds from a snapshot.
async fn read(cluster: &HttpCluster, names: &BTreeSet<UnitName>) -> Result<WaitView, OpsError> {
    let units = cluster
        .units(Some(names))
        .await?
        .units
        .into_iter()
        .map(|v| (v.name().clone(), v.status))
        .collect();
    let mut states: BTreeMap<UnitName, BTreeMap<_, _>> = BTreeMap::new();
    for s in cluster.states_of(names).await? {
        states
            .entry(s.name.clone())
            .or_default()
            .insert(s.machine.clone(), s);
    }
    let machines = cluster
        .machines()
        .await?
        .machines
        .into_iter()
        .map(|m| (m.id.clone(), m))
        .collect();
    Ok(WaitView {
        units,
        states,
        machines,
    })
}
