//! `GET /fleet/v1/events` (issue 41): the events a query matches, oldest first, as one page;
//! with `follow=true`, those and then each new one as it is written, one JSON entity a line
//! over a response held open (etcd's watch underneath: nothing polls). A viewer may read
//! them. The query and the entity are fleet-api-wire's ([`fleet_api_wire::events`]).

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use fleet_api_wire::events::{self as wire, EventPage, event_to_wire};
use fleet_ops::{Cluster, RegistryCluster};
use fleet_registry::kv::Kv;
use fleet_registry::{Event, EventFilter, EventKind};
use futures::StreamExt;
use http::{HeaderValue, StatusCode, header};

use super::{Query, first};
use crate::error::{ApiError, json_response};

/// The filter of the query; an unknown unit or machine name matches nothing, as fleet's
/// exact filters do.
fn filter(query: &Query) -> Result<Option<EventFilter>, ApiError> {
    let mut filter = EventFilter::default();
    if let Some(u) = first(&query.raw, wire::UNIT) {
        let Ok(u) = u.parse() else { return Ok(None) };
        filter.unit = Some(u);
    }
    if let Some(m) = first(&query.raw, wire::MACHINE) {
        let Ok(m) = m.parse() else { return Ok(None) };
        filter.machine = Some(m);
    }
    if let Some(s) = first(&query.raw, wire::SINCE) {
        let back = wire::parse_since(&s).ok_or(ApiError::BadSince(s))?;
        let now = Event::now(EventKind::Unknown, "").time;
        filter.since =
            Some(now.saturating_sub(u64::try_from(back.as_micros()).unwrap_or(u64::MAX)));
    }
    Ok(Some(filter))
}

pub(super) async fn handle<K: Kv>(
    cluster: &RegistryCluster<K>,
    query: &Query,
) -> Result<Response, ApiError> {
    let follow = super::inspect::follow(query)?;
    let filter = filter(query)?;
    if follow {
        return stream(cluster, filter).await;
    }
    let page = match filter {
        Some(filter) => {
            let listing = cluster.events(&filter).await?;
            EventPage {
                events: listing.events.iter().map(event_to_wire).collect(),
                skipped: listing.skipped,
            }
        }
        None => EventPage::default(),
    };
    Ok(json_response(StatusCode::OK, &page))
}

/// The held response: a line per event, until the client goes away (dropping the body drops
/// the watch).
async fn stream<K: Kv>(
    cluster: &RegistryCluster<K>,
    filter: Option<EventFilter>,
) -> Result<Response, ApiError> {
    let events = match filter {
        Some(filter) => cluster.follow_events(filter).await?,
        // Nothing can match: held open all the same, as a follow of a quiet unit is.
        None => futures::stream::pending().boxed(),
    };
    let lines = events.map(|event| {
        let event = event.map_err(std::io::Error::other)?;
        let mut line = serde_json::to_vec(&event_to_wire(&event)).map_err(std::io::Error::other)?;
        line.push(b'\n');
        Ok::<_, std::io::Error>(Bytes::from(line))
    });
    let mut resp = (StatusCode::OK, Body::from_stream(lines)).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(wire::NDJSON));
    Ok(resp)
}
