//! [`Cluster::changes`](crate::Cluster::changes) over the registry: its [`ChangeFeed`] as a
//! stream, opened by a change that names every part.

use fleet_registry::kv::Kv;
use fleet_registry::{ChangeFeed, Changed, Part};
use futures::StreamExt;
use std::time::Duration;

use super::RegistryCluster;
use crate::OpsError;
use crate::model::ChangeStream;

/// The least time between two changes of a stream: the first after a quiet spell comes at
/// once (a blocking start sees its unit active as soon as over etcd), a burst (100,000
/// units launching) makes at most 20 a second, each a re-read for every reader.
pub const CHANGE_EVERY: Duration = Duration::from_millis(50);

impl<K: Kv> RegistryCluster<K> {
    pub(super) async fn change_stream(&self) -> Result<ChangeStream, OpsError> {
        let (now, feed) = self.registry.changes(CHANGE_EVERY).await?;
        let open = Changed {
            revision: now,
            parts: Part::ALL.into_iter().collect(),
        };
        let later = futures::stream::unfold(feed, |mut feed: ChangeFeed| async move {
            let change = feed.next().await?;
            Some((Ok(change), feed))
        });
        Ok(futures::stream::once(async move { Ok(open) })
            .chain(later)
            .boxed())
    }
}
