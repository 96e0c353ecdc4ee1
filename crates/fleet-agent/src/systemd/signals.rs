//! The connection's signal pump: one task drains every systemd signal stream the adapter uses,
//! feeds `JobRemoved` results to their waiters and turns the rest into change hints.
//!
//! Draining is not optional: zbus stops reading the socket while a signal queue is full, which
//! would starve every method reply on the connection. Hints are filtered so the agent's own
//! status queries cannot feed themselves: `ListUnitsByNames` loads and garbage-collects units,
//! which makes systemd emit `UnitNew`/`UnitRemoved` and property changes without any state
//! change, so only changes of ActiveState/SubState count.

use super::jobs::JobWaiters;
use crate::manager::ChangeSender;
use fleet_core::UnitName;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use tracing::{debug, warn};
use zbus::message::Type;
use zbus::{Connection, MatchRule, MessageStream, OwnedVariant};
use zbus_systemd::systemd1::{JobRemoved, JobRemovedStream, ManagerProxy, ReloadingStream};

const UNIT_PATH_PREFIX: &str = "/org/freedesktop/systemd1/unit";

/// Past this many units tracked, forget them all (and hint a resync) rather than grow.
const MAX_TRACKED_UNITS: usize = 65_536;

/// Queue length of each signal stream; the pump drains them, this only absorbs bursts.
const SIGNAL_QUEUE: usize = 1024;

/// The streams, opened before `Subscribe` so no signal after it is missed.
pub(super) struct Signals {
    job_removed: JobRemovedStream,
    reloading: ReloadingStream,
    properties: MessageStream,
}

impl std::fmt::Debug for Signals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signals").finish_non_exhaustive()
    }
}

impl Signals {
    pub(super) async fn open(
        conn: &Connection,
        manager: &ManagerProxy<'_>,
    ) -> zbus::Result<Signals> {
        let job_removed = manager.receive_job_removed().await?;
        let reloading = manager.receive_reloading().await?;
        let rule = MatchRule::builder()
            .msg_type(Type::Signal)
            .sender("org.freedesktop.systemd1")
            .interface("org.freedesktop.DBus.Properties")
            .member("PropertiesChanged")
            .path_namespace(UNIT_PATH_PREFIX)
            .arg(0, "org.freedesktop.systemd1.Unit")
            .build()?;
        let queue = std::num::NonZeroUsize::new(SIGNAL_QUEUE);
        let properties = MessageStream::for_match_rule(rule, conn, queue).await?;
        Ok(Signals {
            job_removed,
            reloading,
            properties,
        })
    }
}

/// Runs until the connection closes, then tells job waiters and hint receivers.
pub(super) async fn pump(mut signals: Signals, jobs: Arc<JobWaiters>, changes: ChangeSender) {
    let mut last = LastStates::default();
    loop {
        tokio::select! {
            signal = signals.job_removed.next() => match signal {
                Some(signal) => on_job_removed(&signal, &jobs, &changes),
                None => break,
            },
            signal = signals.reloading.next() => match signal {
                Some(signal) => {
                    // Only the end of a reload matters: then every unit may have changed.
                    if signal.args().is_ok_and(|a| !*a.active()) {
                        changes.resync();
                    }
                }
                None => break,
            },
            message = signals.properties.next() => match message {
                Some(Ok(message)) => {
                    if let Some(name) = last.changed_unit(&message) {
                        changes.unit(&name);
                    }
                    if last.overflowed() {
                        changes.resync();
                    }
                }
                Some(Err(error)) => debug!(%error, "skipping undecodable systemd signal"),
                None => break,
            },
        }
    }
    warn!("systemd signal streams ended; the D-Bus connection is gone");
    jobs.close();
    changes.close();
}

fn on_job_removed(signal: &JobRemoved, jobs: &JobWaiters, changes: &ChangeSender) {
    let args = match signal.args() {
        Ok(args) => args,
        Err(error) => return debug!(%error, "skipping undecodable JobRemoved signal"),
    };
    jobs.finish(args.job().as_str(), args.result());
    if let Ok(name) = args.unit().parse::<UnitName>() {
        changes.unit(&name);
    }
}

/// The last ActiveState/SubState seen per unit, to hint only on real changes.
#[derive(Debug, Default)]
struct LastStates {
    states: HashMap<UnitName, (String, String)>,
    overflowed: bool,
}

impl LastStates {
    /// The unit whose state this `PropertiesChanged` changed, if it changed one.
    fn changed_unit(&mut self, message: &zbus::Message) -> Option<UnitName> {
        let header = message.header();
        let label = header.path()?.as_str().strip_prefix(UNIT_PATH_PREFIX)?;
        let name: UnitName = unescape_label(label.strip_prefix('/')?)?.parse().ok()?;
        type Body = (String, HashMap<String, OwnedVariant>, Vec<String>);
        let (_, changed, _) = message.body().deserialize::<Body>().ok()?;
        let text = |key: &str| changed.get(key).and_then(|v| String::try_from(&**v).ok());
        let (active, sub) = (text("ActiveState")?, text("SubState")?);
        if self.states.len() >= MAX_TRACKED_UNITS && !self.states.contains_key(&name) {
            self.states.clear();
            self.overflowed = true;
        }
        let state = (active, sub);
        match self.states.insert(name.clone(), state.clone()) {
            Some(previous) if previous == state => None,
            Some(_) | None => Some(name),
        }
    }

    fn overflowed(&mut self) -> bool {
        std::mem::take(&mut self.overflowed)
    }
}

/// Inverse of systemd's `bus_label_escape`: `_xx` is the byte 0xxx. Decodes bytes, not chars,
/// so escaped UTF-8 comes back whole; `None` for a malformed label.
pub(super) fn unescape_label(label: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(label.len());
    let mut rest = label.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'_' {
            let hex = tail.get(..2)?;
            let hex = std::str::from_utf8(hex).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_systemd_unit_path_labels() {
        assert_eq!(
            unescape_label("hello_2eservice").as_deref(),
            Some("hello.service")
        );
        assert_eq!(
            unescape_label("web_40_31_2eservice").as_deref(),
            Some("web@1.service")
        );
        assert_eq!(
            unescape_label("_31abc_2esocket").as_deref(),
            Some("1abc.socket")
        );
        assert_eq!(
            unescape_label("caf_c3_a9_2eservice").as_deref(),
            Some("café.service")
        );
        assert_eq!(unescape_label("bad_2"), None);
        assert_eq!(unescape_label("bad_zz"), None);
    }

    #[test]
    fn unescape_inverts_zbus_systemds_escape() {
        for name in ["a.service", "web@1.service", "0x-y_z.mount", "x:y.timer"] {
            let label = zbus_systemd::bus_label_escape(name);
            assert_eq!(unescape_label(&label).as_deref(), Some(name));
        }
    }
}
