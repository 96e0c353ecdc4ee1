//! `GET /fleet/v1/changes` (issue 41): the registry's changes as they happen, one small
//! entity a line over a held response ([`fleet_api_wire::changes`] says what a line holds),
//! so that fleetctl's waits and `--watch` listings re-read only after a change, and nothing
//! polls. The stream is [`Cluster::changes`] of the etcd side (one watch of the registry,
//! coalesced), a keep-alive line when idle, and it ends when the watch does. A viewer may
//! read it (a listing); at most [`MAX_STREAMS`] are served at once, apart from the
//! dashboard's.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use fleet_api_wire::changes::{KEEP_ALIVE, change_to_wire, keep_alive};
use fleet_api_wire::events::NDJSON;
use fleet_ops::{ChangeStream, Cluster, RegistryCluster};
use fleet_registry::kv::Kv;
use futures::StreamExt;
use http::{HeaderValue, StatusCode, header};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::ApiError;

/// The most change streams served at once: each holds one watch of the registry. A client
/// past them gets a 503 (fleetctl's waits then poll).
pub const MAX_STREAMS: usize = 256;

/// The change streams being served (shared by the clones of the API's state).
#[derive(Debug, Default, Clone)]
pub struct Streams(Arc<AtomicUsize>);

impl Streams {
    /// A place among `most` streams, or `None` when they are all taken.
    fn enter(&self, most: usize) -> Option<Slot> {
        if self.0.fetch_add(1, Ordering::SeqCst) >= most {
            self.0.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Slot(self.0.clone()))
    }
}

/// One stream's place, given back when the stream ends (its body dropped).
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(super) async fn handle<K: Kv>(
    cluster: &RegistryCluster<K>,
    streams: &Streams,
) -> Result<Response, ApiError> {
    let slot = streams
        .enter(MAX_STREAMS)
        .ok_or(ApiError::TooManyChangeStreams(MAX_STREAMS))?;
    let changes = cluster.changes().await?;
    let lines = futures::stream::unfold(
        (changes, slot, 0),
        |(mut changes, slot, revision): (ChangeStream, Slot, i64)| async move {
            let (entity, revision) = match tokio::time::timeout(KEEP_ALIVE, changes.next()).await {
                Ok(None) => return None,
                Ok(Some(Err(error))) => {
                    return Some((Err(std::io::Error::other(error)), (changes, slot, revision)));
                }
                Ok(Some(Ok(change))) => (change_to_wire(&change), change.revision),
                Err(_) => (keep_alive(revision), revision),
            };
            let line = line_of(&entity);
            Some((line, (changes, slot, revision)))
        },
    );
    let mut resp = (StatusCode::OK, Body::from_stream(lines)).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(NDJSON));
    Ok(resp)
}

fn line_of(entity: &fleet_api_wire::changes::ChangeEntity) -> std::io::Result<Bytes> {
    let mut line = serde_json::to_vec(entity).map_err(std::io::Error::other)?;
    line.push(b'\n');
    Ok(Bytes::from(line))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_past_the_most_is_refused_and_an_ended_one_gives_its_place_back() {
        let streams = Streams::default();
        let first = streams.enter(2).expect("a place");
        let _second = streams.enter(2).expect("a place");
        assert!(streams.enter(2).is_none());
        drop(first);
        assert!(streams.enter(2).is_some());
    }
}
