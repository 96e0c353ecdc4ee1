//! Events over the API (issue 41): `GET /fleet/v1/events` for a listing, and with
//! `follow=true` a held response of newline-delimited JSON, read here line by line as it
//! arrives. Nothing polls: the server follows etcd's watch.

use bytes::{Buf, Bytes, BytesMut};
use fleet_api_wire::events::{self as wire, EventEntity, EventPage};
use fleet_ops::{EventListing, EventStream, OpsError};
use fleet_registry::{Event, EventFilter};
use futures::StreamExt;
use http::Method;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::answer::{decode, error_of};
use super::http::HttpCluster;

/// The longest line of a followed stream (an event entity is far smaller).
pub(super) const MAX_LINE: usize = 1024 * 1024;

/// The error a stream's refusal carries (its body read up to [`MAX_LINE`]).
pub(super) async fn refused(status: http::StatusCode, body: Incoming) -> OpsError {
    let bytes = http_body_util::Limited::new(body, MAX_LINE)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    error_of(status, &bytes, None)
}

/// The query of `filter`: `since` goes as the seconds back from now it stands for.
fn query(filter: &EventFilter, since: Option<u64>) -> Vec<(&'static str, String)> {
    let mut q = Vec::new();
    if let Some(u) = &filter.unit {
        q.push((wire::UNIT, u.to_string()));
    }
    if let Some(m) = &filter.machine {
        q.push((wire::MACHINE, m.to_string()));
    }
    if let Some(secs) = since {
        q.push((wire::SINCE, format!("{secs}s")));
    }
    q
}

/// How many whole seconds before now `filter.since` is, rounded up (the server counts back
/// from its own clock).
fn seconds_back(filter: &EventFilter) -> Option<u64> {
    let since = filter.since?;
    let now = Event::now(fleet_registry::EventKind::Unknown, "").time;
    Some(now.saturating_sub(since).div_ceil(1_000_000))
}

impl HttpCluster {
    pub(super) async fn event_page(&self, filter: &EventFilter) -> Result<EventListing, OpsError> {
        let q = query(filter, seconds_back(filter));
        let answer = self.send(Method::GET, wire::PATH, &q, None).await?;
        let page: EventPage = decode(&answer, None)?;
        let events = page
            .events
            .iter()
            .map(wire::event_from_wire)
            .collect::<Result<_, _>>()?;
        Ok(EventListing {
            events,
            skipped: page.skipped,
            revision: 0,
        })
    }

    pub(super) async fn event_stream(&self, filter: EventFilter) -> Result<EventStream, OpsError> {
        let mut q = query(&filter, seconds_back(&filter));
        q.push((wire::FOLLOW, "true".to_owned()));
        let path = self.path_and_query(wire::PATH, &q);
        let (status, body) = self.transport().open(&path, wire::NDJSON).await?;
        if !status.is_success() {
            return Err(refused(status, body).await);
        }
        let shown = self.transport().shown().to_owned();
        let lines =
            futures::stream::unfold((BytesMut::new(), Some(body)), move |(mut buf, body)| {
                let shown = shown.clone();
                async move {
                    let mut body = body?;
                    let line = next_line(&mut buf, &mut body, &shown).await;
                    match line {
                        Ok(Some(line)) => Some((Ok(line), (buf, Some(body)))),
                        Ok(None) => None,
                        Err(e) => Some((Err(e), (buf, None))),
                    }
                }
            });
        let events = lines.filter_map(|line| async move {
            match line {
                Err(e) => Some(Err(e)),
                Ok(line) if line.iter().all(u8::is_ascii_whitespace) => None,
                Ok(line) => Some(
                    serde_json::from_slice::<EventEntity>(&line)
                        .map_err(|e| OpsError::Transport {
                            what: "the API streamed a line that is not an event".to_owned(),
                            cause: Box::new(e),
                        })
                        .and_then(|w| wire::event_from_wire(&w)),
                ),
            }
        });
        // Dropping the stream drops the body, which closes the connection.
        Ok(events.boxed())
    }
}

/// The next line of `body` (without its newline); `None` once the server ended the stream.
pub(super) async fn next_line(
    buf: &mut BytesMut,
    body: &mut Incoming,
    shown: &str,
) -> Result<Option<Bytes>, OpsError> {
    loop {
        if let Some(at) = buf.iter().position(|&b| b == b'\n') {
            let line = buf.split_to(at).freeze();
            buf.advance(1);
            return Ok(Some(line));
        }
        if buf.len() > MAX_LINE {
            return Err(OpsError::Api {
                code: 0,
                message: format!("{shown} streamed a line of more than {MAX_LINE} bytes"),
            });
        }
        match body.frame().await {
            None => return Ok(None),
            Some(Err(e)) => {
                return Err(OpsError::Transport {
                    what: format!("the event stream of {shown} was cut off"),
                    cause: Box::new(e),
                });
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
}
