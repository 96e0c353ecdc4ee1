//! [`Changes`] over the API: fleet's API has no watch, so a wait polls. Each poll reads the
//! watched units, their states and the machines, and returns once that view differs from the
//! last one, as the etcd side returns only on a change that matters to the wait.

use fleet_core::UnitName;
use fleet_ops::{Changes, Cluster, OpsError, StateFilter, WaitView};
use std::collections::{BTreeMap, BTreeSet};

use super::http::{HttpCluster, NAMES_PER_REQUEST};

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

/// The wait view of `names` now: the same shape the etcd side builds from a snapshot. Many
/// names (more than one request asks for) are read as whole listings and picked here: three
/// requests per poll instead of two per 500 units.
async fn read(cluster: &HttpCluster, names: &BTreeSet<UnitName>) -> Result<WaitView, OpsError> {
    let (units, states) = if names.len() > NAMES_PER_REQUEST {
        let units = cluster.units(None).await?.units;
        let states = cluster.states(&StateFilter::default()).await?.states;
        (units, states)
    } else {
        let units = cluster.units(Some(names)).await?.units;
        (units, cluster.states_of(names).await?)
    };
    let units = units
        .into_iter()
        .filter(|v| names.contains(v.name()))
        .map(|v| (v.name().clone(), v.status))
        .collect();
    let mut by_unit: BTreeMap<UnitName, BTreeMap<_, _>> = BTreeMap::new();
    for s in states.into_iter().filter(|s| names.contains(&s.name)) {
        by_unit
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
        states: by_unit,
        machines,
    })
}
