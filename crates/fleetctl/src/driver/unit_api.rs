//! The API of the fleetd that runs a unit, for that unit's `status` and `journal` (issue 16):
//! `GET /fleet/v1/units/<name>/status` and `.../journal` of `fleet_api_wire::wire`, answered only by
//! the fleetd of the machine the unit is scheduled on. fleetctl finds that fleetd at the
//! address the machine publishes (`MachineInfo::api`), or at its own driver's unix socket when
//! the unit's machine is this one.
//!
//! Nothing is decided here: [`UnitApi`] sends one request and hands back the document or the
//! stream; which machine to ask is `commands::remote`'s choice.

use bytes::Bytes;
use fleet_api_wire::wire::{self, UnitStatus};
use fleet_core::UnitName;
use fleet_ops::OpsError;
use fleet_registry::kv::TlsFiles;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use std::time::Duration;

use super::answer::error_of;
use super::http::unit_path;
use super::transport::{EndpointError, Transport};

/// A client of one machine's fleetd, for the units scheduled there.
#[derive(Debug)]
pub struct UnitApi {
    transport: Transport,
}

/// What `journal` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalQuery {
    pub lines: u32,
    pub follow: bool,
    /// One of [`wire::JOURNAL_OUTPUTS`].
    pub output: String,
}

/// A journal as fleetd streams it: chunks of journalctl's output, until fleetd ends it (the
/// last lines were sent, or with `follow` the unit's fleetd went away). Dropping it closes the
/// connection, which ends a followed journal on the server side too.
#[derive(Debug)]
pub struct JournalStream {
    body: Incoming,
    shown: String,
}

impl UnitApi {
    /// A client of the fleetd at `endpoint` (`https://` with `tls`; `http://` and `unix://`
    /// take no TLS files, whatever the driver was given). Connects to nothing yet.
    pub fn new(
        endpoint: &str,
        tls: &TlsFiles,
        request_timeout: Duration,
    ) -> Result<UnitApi, EndpointError> {
        let tls = if endpoint.trim_start().starts_with("https://") {
            tls.clone()
        } else {
            TlsFiles::default()
        };
        Ok(UnitApi {
            transport: Transport::new(endpoint, &tls, request_timeout)?,
        })
    }

    /// The endpoint, for messages.
    pub fn endpoint(&self) -> &str {
        self.transport.shown()
    }

    /// `GET /units/<name>/status`.
    pub async fn status(&self, name: &UnitName) -> Result<UnitStatus, OpsError> {
        let path = format!("{}{}", unit_path(name), wire::STATUS_SUFFIX);
        let (status, body) = self.transport.open(&path, "application/json").await?;
        let body = self.whole(body).await?;
        if !status.is_success() {
            return Err(error_of(status, &body, None));
        }
        serde_json::from_slice(&body).map_err(|e| OpsError::Transport {
            what: format!(
                "{} answered {status} to the status of {name} with a body that is not a UnitStatus",
                self.endpoint()
            ),
            cause: Box::new(e),
        })
    }

    /// `GET /units/<name>/journal?lines=N&follow=..&output=..`: the stream once fleetd has
    /// accepted the request, or the error it answered.
    pub async fn journal(
        &self,
        name: &UnitName,
        query: &JournalQuery,
    ) -> Result<JournalStream, OpsError> {
        let path = format!(
            "{}{}?{}={}&{}={}&{}={}",
            unit_path(name),
            wire::JOURNAL_SUFFIX,
            wire::LINES,
            query.lines,
            wire::FOLLOW,
            query.follow,
            wire::OUTPUT,
            query.output,
        );
        let (status, body) = self.transport.open(&path, "text/plain").await?;
        if !status.is_success() {
            let body = self.whole(body).await?;
            return Err(error_of(status, &body, None));
        }
        Ok(JournalStream {
            body,
            shown: self.endpoint().to_owned(),
        })
    }

    /// A whole (short) body, at most [`MAX_STATUS_BODY`], within the request timeout: a
    /// machine's fleetd is another host, and may lie (issue 37).
    async fn whole(&self, body: Incoming) -> Result<Bytes, OpsError> {
        let timeout = self.transport.timeout();
        let limited = http_body_util::Limited::new(body, MAX_STATUS_BODY);
        match tokio::time::timeout(timeout, limited.collect()).await {
            Ok(Ok(collected)) => Ok(collected.to_bytes()),
            Ok(Err(e)) => Err(OpsError::Transport {
                what: format!(
                    "the answer of {} was cut off, or larger than {MAX_STATUS_BODY} bytes",
                    self.endpoint()
                ),
                cause: e,
            }),
            Err(elapsed) => Err(OpsError::Transport {
                what: format!(
                    "reading the answer of {} (request timeout {timeout:?})",
                    self.endpoint()
                ),
                cause: Box::new(elapsed),
            }),
        }
    }
}

impl JournalStream {
    /// The next piece of output; `None` once fleetd ended the stream.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, OpsError> {
        loop {
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(cut(&self.shown, e)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }
}

/// The largest status (or error) answer read from a unit's fleetd.
pub const MAX_STATUS_BODY: usize = 8 * 1024 * 1024;

fn cut(endpoint: &str, e: hyper::Error) -> OpsError {
    OpsError::Transport {
        what: format!("the answer of {endpoint} was cut off"),
        cause: Box::new(e),
    }
}

/// Whether journalctl's `--output` `mode` is one fleetd's journal route takes.
pub fn known_output(mode: &str) -> bool {
    wire::JOURNAL_OUTPUTS.contains(&mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Issue 37, item 8: a unit's machine is another host and may lie; a status answer
    /// larger than [`MAX_STATUS_BODY`] is refused, read no further, not held in memory.
    #[tokio::test]
    async fn a_status_answer_past_its_cap_is_refused_not_read_whole() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let liar = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 4096];
            let _ = s.read(&mut head).await;
            let len = MAX_STATUS_BODY + 1024 * 1024;
            let reply = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
            );
            s.write_all(reply.as_bytes()).await.unwrap();
            let chunk = vec![b' '; 64 * 1024];
            let mut sent = 0;
            // Until the client hangs up.
            while sent < len && s.write_all(&chunk).await.is_ok() {
                sent += chunk.len();
            }
        });
        let api = UnitApi::new(
            &format!("http://{addr}"),
            &TlsFiles::default(),
            Duration::from_secs(20),
        )
        .unwrap();
        let e = api
            .status(&"a.service".parse().unwrap())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("larger than {MAX_STATUS_BODY} bytes")),
            "{e}"
        );
        liar.abort();
    }
}
