//! The real [`Inspector`] behind the API's status and journal routes (issue 16): `systemctl
//! status` and the unit's D-Bus properties (through the agent's [`SystemdManager`]), and
//! `journalctl` streamed. Programs run with a fixed argv, never through a shell; the unit
//! name was parsed as a [`UnitName`] and checked to be one of fleet's units scheduled here
//! before anything reaches this module.
//!
//! A journal's `journalctl` belongs to its stream (`kill_on_drop`): when the client goes away
//! hyper drops the body, the stream and the child, and the child is killed.

use bytes::{Bytes, BytesMut};
use fleet_agent::SystemdManager;
use fleet_api::inspect::{
    InspectError, InspectFuture, Inspector, JournalRequest, JournalStream, StatusReport,
};
use fleet_core::UnitName;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tracing::{Instrument, debug, warn};

const SYSTEMCTL: &str = "systemctl";
const JOURNALCTL: &str = "journalctl";

/// How long `systemctl status` may take.
const STATUS_TIMEOUT: Duration = Duration::from_secs(30);

/// The most of journalctl's stderr kept for the log.
const STDERR_KEPT: usize = 4096;

/// systemctl status's exit codes that describe the unit, not a failure: 0 active, 3 not
/// active (inactive or failed), 4 no such unit (not loaded yet).
const STATUS_OK_CODES: [i32; 3] = [0, 3, 4];

#[derive(Debug, Clone)]
pub struct SystemInspector {
    manager: SystemdManager,
}

impl SystemInspector {
    pub fn new(manager: SystemdManager) -> SystemInspector {
        SystemInspector { manager }
    }
}

/// `systemctl status`'s argv for `unit`.
fn status_args(unit: &UnitName, lines: u32) -> Vec<String> {
    vec![
        "status".into(),
        "--no-pager".into(),
        "--full".into(),
        format!("--lines={lines}"),
        "--".into(),
        unit.to_string(),
    ]
}

/// `journalctl`'s argv for `unit`.
fn journal_args(unit: &UnitName, request: &JournalRequest) -> Vec<String> {
    let mut args = vec![
        format!("--unit={unit}"),
        "--no-pager".into(),
        format!("--lines={}", request.lines),
        format!("--output={}", request.output),
    ];
    if request.follow {
        args.push("--follow".into());
    }
    args
}

async fn systemctl_status(unit: &UnitName, lines: u32) -> Result<String, InspectError> {
    let run = Command::new(SYSTEMCTL)
        .args(status_args(unit, lines))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(STATUS_TIMEOUT, run).await {
        Ok(Ok(out)) => out,
        Ok(Err(source)) => {
            return Err(InspectError::Spawn {
                program: SYSTEMCTL,
                source,
            });
        }
        Err(_) => {
            return Err(InspectError::Timeout {
                program: SYSTEMCTL,
                waited: STATUS_TIMEOUT,
            });
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    match out.status.code() {
        Some(code) if STATUS_OK_CODES.contains(&code) => {
            // A unit systemd does not know prints only to stderr ("could not be found").
            Ok(if stdout.is_empty() { stderr } else { stdout })
        }
        _ => Err(InspectError::Failed {
            program: SYSTEMCTL,
            status: out.status.to_string(),
            stderr: stderr.trim().to_owned(),
        }),
    }
}

/// `reader`'s bytes as they come.
fn chunks<R: AsyncRead + Unpin + Send + 'static>(
    reader: R,
) -> impl futures::Stream<Item = Result<Bytes, InspectError>> + Send {
    futures::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        let mut buf = BytesMut::with_capacity(8192);
        match reader.read_buf(&mut buf).await {
            Ok(0) => None,
            Ok(_) => Some((Ok(buf.freeze()), Some(reader))),
            Err(e) => Some((Err(InspectError::Read(e)), None)),
        }
    })
}

/// Logs what journalctl wrote to stderr once it closes it (when it exits or is killed): the
/// body is journalctl's stdout alone, so that `--output=json` stays JSON.
async fn log_stderr(unit: UnitName, mut stderr: tokio::process::ChildStderr) {
    let mut kept = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = STDERR_KEPT.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    let text = String::from_utf8_lossy(&kept);
    let text = text.trim();
    if !text.is_empty() {
        warn!(unit = %unit, stderr = text, "journalctl wrote an error");
    }
}

impl Inspector for SystemInspector {
    fn status<'a>(&'a self, unit: &'a UnitName, lines: u32) -> InspectFuture<'a, StatusReport> {
        Box::pin(async move {
            let text = systemctl_status(unit, lines).await?;
            let properties =
                self.manager
                    .properties(unit)
                    .await
                    .map_err(|e| InspectError::Properties {
                        unit: unit.clone(),
                        source: Box::new(e),
                    })?;
            Ok(StatusReport { text, properties })
        })
    }

    fn journal<'a>(
        &'a self,
        unit: &'a UnitName,
        request: JournalRequest,
    ) -> InspectFuture<'a, JournalStream> {
        Box::pin(async move {
            let mut child = Command::new(JOURNALCTL)
                .args(journal_args(unit, &request))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|source| InspectError::Spawn {
                    program: JOURNALCTL,
                    source,
                })?;
            debug!(unit = %unit, follow = request.follow, pid = child.id(), "journalctl started");
            let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
                unreachable!("both were asked piped");
            };
            tokio::spawn(log_stderr(unit.clone(), stderr).in_current_span());
            // The child lives as long as the stream: dropping the stream kills it.
            let stream = futures::StreamExt::map(chunks(stdout), move |chunk| {
                let _owned = &child;
                chunk
            });
            Ok(Box::pin(stream) as JournalStream)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(s: &str) -> UnitName {
        s.parse().unwrap()
    }

    #[test]
    fn status_runs_systemctl_with_a_fixed_argv_ending_in_the_unit() {
        assert_eq!(
            status_args(&unit("web@1.service"), 25),
            [
                "status",
                "--no-pager",
                "--full",
                "--lines=25",
                "--",
                "web@1.service"
            ]
        );
    }

    #[test]
    fn journal_runs_journalctl_with_a_fixed_argv() {
        let request = JournalRequest {
            lines: 3,
            follow: false,
            output: "json",
        };
        assert_eq!(
            journal_args(&unit("-x.service"), &request),
            [
                "--unit=-x.service",
                "--no-pager",
                "--lines=3",
                "--output=json"
            ]
        );
        let follow = JournalRequest {
            follow: true,
            ..request
        };
        assert_eq!(
            journal_args(&unit("a.service"), &follow).last().unwrap(),
            "--follow"
        );
    }

    #[tokio::test]
    async fn a_stream_of_a_readers_bytes_ends_with_it() {
        use futures::StreamExt;
        let (mut tx, rx) = tokio::io::duplex(64);
        let reading = tokio::spawn(async move {
            chunks(rx)
                .map(|c| c.unwrap())
                .collect::<Vec<Bytes>>()
                .await
                .concat()
        });
        tokio::io::AsyncWriteExt::write_all(&mut tx, b"one\ntwo\n")
            .await
            .unwrap();
        drop(tx);
        assert_eq!(reading.await.unwrap(), b"one\ntwo\n");
    }
}
