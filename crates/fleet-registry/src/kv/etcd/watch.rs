//! etcd watch streams turned into [`Watch`] channels.
//!
//! One gRPC stream per watch, read by one spawned task that forwards events and ends after
//! the first `Compacted` or `Broken`: etcd-client does not resume a watch after the server is
//! gone, and resuming here would hide the gap from the caller, who relists instead. The task
//! also ends, cancelling the etcd watch, when the [`Watch`] is dropped.

use etcd_client::{Client, WatchOptions, WatchResponse, WatchStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{Instrument, debug};

use super::{Call, EtcdKv, Failure, Request, convert};
use crate::kv::{KvError, Revision, Watch, WatchMessage};

/// Messages buffered between the stream and a slow consumer; beyond that the task waits, and
/// etcd holds the rest server-side.
const CHANNEL_CAPACITY: usize = 64;

/// Opens the watch and waits for etcd's acknowledgement, both under the request deadline, so
/// `Ok` means the server has registered the watch and an unreachable cluster is an error now.
pub(super) async fn start(
    kv: &EtcdKv,
    key: &str,
    prefix: bool,
    from_revision: Revision,
) -> Result<Watch, KvError> {
    let mut options = WatchOptions::new().with_start_revision(from_revision);
    if prefix {
        options = options.with_prefix();
    }
    // On whichever member answers: a broken watch is re-created by the caller, through here,
    // so it moves to the next member with the calls.
    let setup = |client: Client| {
        let options = options.clone();
        async move {
            let open = || async {
                let mut stream = super::watch_client(&client)
                    .watch(key, Some(options.clone()))
                    .await?;
                let first = stream.message().await?;
                Ok::<_, etcd_client::Error>((stream, first))
            };
            let opened = open().await?;
            if !opened.1.as_ref().is_some_and(denied) {
                return Ok(opened);
            }
            // etcd checks a watch's permission with the token its stream was opened with,
            // and answers an expired token as a refusal (no "invalid auth token" for
            // etcd-client to refresh on): log in again and ask once more.
            client.refresh_token().await?;
            open().await
        }
    };
    let request = Request::Watch { key, prefix };
    let (stream, first) = kv
        .watch_on_any(setup)
        .await
        .map_err(|f| kv.error(f, request))?;
    let Some(first) = first else {
        return Err(KvError::Unavailable {
            endpoints: kv.endpoints.to_string(),
            detail: "the watch stream closed before etcd acknowledged it".to_owned(),
        });
    };
    if denied(&first) {
        // A refusal is final: no watch to forward, and a caller that re-watched after a
        // `Broken` would ask again forever.
        return Err(kv.error(Failure::PermissionDenied, request));
    }
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    debug!(
        key,
        prefix,
        from_revision,
        watch_id = first.watch_id(),
        "etcd watch created"
    );
    tokio::spawn(forward(stream, first, tx, key.to_owned()).in_current_span());
    Ok(Watch { rx })
}

/// Whether etcd refused to create the watch for lack of permission (it says so in a
/// `created` and `canceled` response, not in a gRPC status).
fn denied(resp: &WatchResponse) -> bool {
    resp.canceled() && resp.cancel_reason().contains("permission denied")
}

/// What to do with one response of the stream.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// The `created` ack, a progress notification: nothing for the caller.
    Skip,
    Forward(WatchMessage),
    /// Deliver this, then stop: etcd will send nothing more on this watch.
    End(WatchMessage),
}

fn step(resp: &WatchResponse) -> Step {
    if resp.compact_revision() > 0 {
        return Step::End(WatchMessage::Compacted {
            compact_revision: resp.compact_revision(),
        });
    }
    if resp.canceled() {
        debug!(reason = resp.cancel_reason(), "etcd cancelled the watch");
        return Step::End(WatchMessage::Broken);
    }
    let events: Vec<_> = resp.events().iter().filter_map(convert::event).collect();
    // The last event's revision, not the header's: the header carries the store's current
    // revision, which may be past events still to come on a watch that is catching up.
    match events.last() {
        None => Step::Skip,
        Some(last) => Step::Forward(WatchMessage::Events {
            revision: last.kv.mod_revision,
            events,
        }),
    }
}

async fn forward(
    mut stream: WatchStream,
    first: WatchResponse,
    tx: mpsc::Sender<WatchMessage>,
    key: String,
) {
    let watch_id = first.watch_id();
    let mut next = Some(first);
    loop {
        let received = match next.take() {
            Some(resp) => Ok(Some(resp)),
            None => tokio::select! {
                received = stream.message() => received,
                () = tx.closed() => break,
            },
        };
        let message = match received {
            Ok(Some(resp)) => match step(&resp) {
                Step::Skip => continue,
                Step::Forward(message) => message,
                Step::End(message) => {
                    debug!(key = %key, watch_id, ?message, "etcd watch ended");
                    // Nothing to cancel: etcd already dropped this watch.
                    let _ = tx.send(message).await;
                    return;
                }
            },
            Ok(None) => {
                debug!(key = %key, watch_id, "etcd watch stream closed");
                let _ = tx.send(WatchMessage::Broken).await;
                return;
            }
            Err(error) => {
                debug!(key = %key, watch_id, %error, "etcd watch stream failed");
                let _ = tx.send(WatchMessage::Broken).await;
                return;
            }
        };
        if tx.send(message).await.is_err() {
            break;
        }
    }
    // The receiver is gone. Cancel explicitly so etcd frees the watcher now; dropping the
    // stream then resets it.
    debug!(key = %key, watch_id, "etcd watch dropped by its receiver");
    let _ = stream.cancel(watch_id).await;
}

/// Where etcd's history starts: a watch from revision 1 is cancelled with that revision.
/// `None` if the probe fails or the history is not compacted after all.
pub(super) async fn compact_revision(
    kv: &EtcdKv,
    key: &str,
    deadline: Instant,
) -> Option<Revision> {
    let probe = |client: Client| async move {
        let options = WatchOptions::new().with_start_revision(1);
        let mut stream = super::watch_client(&client)
            .watch(key, Some(options))
            .await?;
        while let Some(resp) = stream.message().await? {
            if resp.compact_revision() > 0 {
                return Ok(Some(resp.compact_revision()));
            }
            if resp.canceled() || !resp.events().is_empty() {
                return Ok(None);
            }
        }
        Ok(None)
    };
    kv.with_failover(Call::Watch, deadline, probe)
        .await
        .ok()
        .flatten()
}
