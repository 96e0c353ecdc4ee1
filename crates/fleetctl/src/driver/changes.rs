//! The registry's changes over the API (issue 41): `GET /fleet/v1/changes`, a held response
//! of newline-delimited JSON read here line by line as it arrives (fleet-api-wire's
//! `changes` says what a line holds). Keep-alive lines are not passed on, but a stream that
//! says nothing for [`SILENT_LIMIT`] is taken for lost: fleetd says something every
//! [`KEEP_ALIVE`] while idle.

use bytes::BytesMut;
use fleet_api_wire::changes::{self as wire, ChangeEntity, KEEP_ALIVE};
use fleet_api_wire::events::NDJSON;
use fleet_ops::{ChangeStream, OpsError};
use futures::StreamExt;
use hyper::body::Incoming;
use std::time::Duration;

use super::events::{next_line, refused};
use super::http::HttpCluster;

/// How long a stream may say nothing before it counts as lost.
pub const SILENT_LIMIT: Duration = Duration::from_secs(KEEP_ALIVE.as_secs() * 3);

/// Why no stream was opened.
#[derive(Debug)]
pub(super) enum Unopened {
    /// The API has no such route (a fleetd older than the stream, or fleet's own): 404 or
    /// 405 (fleet v1.0 answers 405 under some paths).
    NotServed(OpsError),
    /// Anything else: refused (403), too many streams (503), unreachable.
    Failed(OpsError),
}

impl Unopened {
    pub(super) fn into_error(self) -> OpsError {
        match self {
            Unopened::NotServed(e) | Unopened::Failed(e) => e,
        }
    }
}

impl HttpCluster {
    /// Opens the stream: its first item names every part.
    pub(super) async fn open_changes(&self) -> Result<ChangeStream, Unopened> {
        let (status, body) = self
            .transport()
            .open(wire::PATH, NDJSON)
            .await
            .map_err(Unopened::Failed)?;
        if !status.is_success() {
            let error = refused(status, body).await;
            return Err(match status.as_u16() {
                404 | 405 => Unopened::NotServed(OpsError::Api {
                    code: status.as_u16(),
                    message: format!(
                        "{} serves no change stream (GET /fleet/v1{} answered {status}: a \
                         fleetd older than this fleetctl, or fleet's own)",
                        self.transport().shown(),
                        wire::PATH
                    ),
                }),
                _ => Unopened::Failed(error),
            });
        }
        Ok(changes_of(body, self.transport().shown().to_owned()))
    }
}

/// The changes `body` streams, keep-alives left out.
fn changes_of(body: Incoming, shown: String) -> ChangeStream {
    let lines = futures::stream::unfold((BytesMut::new(), Some(body)), move |(mut buf, body)| {
        let shown = shown.clone();
        async move {
            let mut body = body?;
            let line = tokio::time::timeout(SILENT_LIMIT, next_line(&mut buf, &mut body, &shown));
            match line.await {
                Ok(Ok(Some(line))) => Some((Ok(line), (buf, Some(body)))),
                Ok(Ok(None)) => None,
                Ok(Err(e)) => Some((Err(e), (buf, None))),
                Err(_) => Some((
                    Err(OpsError::Api {
                        code: 0,
                        message: format!(
                            "the change stream of {shown} said nothing for {SILENT_LIMIT:?}"
                        ),
                    }),
                    (buf, None),
                )),
            }
        }
    });
    lines
        .filter_map(|line| async move {
            let line = match line {
                Err(e) => return Some(Err(e)),
                Ok(line) if line.iter().all(u8::is_ascii_whitespace) => return None,
                Ok(line) => line,
            };
            match serde_json::from_slice::<ChangeEntity>(&line) {
                Err(e) => Some(Err(OpsError::Transport {
                    what: "the API streamed a line that is not a change".to_owned(),
                    cause: Box::new(e),
                })),
                Ok(entity) => {
                    let change = wire::change_from_wire(&entity);
                    (!change.parts.is_empty()).then_some(Ok(change))
                }
            }
        })
        .boxed()
}
