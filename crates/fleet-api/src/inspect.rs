//! The seam behind `GET /units/<name>/status` and `/journal` (issue 16, fleet#1123): what a
//! machine's systemd and journald say about one of fleet's units, without ssh.
//!
//! An [`Inspector`] only runs what it is asked on its own machine; it decides nothing. The
//! routes (`routes/inspect.rs`) decide first: the query is checked, the unit must be in the
//! registry and scheduled on this machine, and only then is the inspector called, so a bad
//! request runs nothing. The real side is fleetd's (`systemctl status`, the unit's D-Bus
//! properties, `journalctl` with a fixed argv); [`fake::FakeInspector`] is the tests'.
//!
//! A journal is a stream: while the client reads a followed journal the stream stays open,
//! and when the client goes away the body, and with it the stream, is dropped. The real side
//! ties its child process to the stream, so dropping it ends the process.

use bytes::Bytes;
use fleet_core::UnitName;
use futures::Stream;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

#[cfg(any(test, feature = "fake"))]
pub mod fake;

/// Journal lines when the query names none (fleetctl's default).
pub const DEFAULT_LINES: u32 = 10;
/// The most journal lines a request may ask for: enough for any reading, small enough that
/// no request makes journalctl read a whole journal into memory.
pub const MAX_LINES: u32 = 100_000;
/// journalctl's output mode when the query names none.
pub const DEFAULT_OUTPUT: &str = "short";
/// Journal streams served at once by one fleetd: each is a journalctl process.
pub const MAX_JOURNALS: usize = 64;

/// Status requests answered at once by one fleetd: each runs `systemctl status` (issue 37: a
/// client asking thousands at once must not fork thousands of processes).
pub const MAX_STATUSES: usize = 16;

/// What `GET /units/<name>/journal` asks of journalctl.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalRequest {
    /// `--lines`, at most [`MAX_LINES`].
    pub lines: u32,
    /// `--follow`: keep streaming until the client goes away.
    pub follow: bool,
    /// `--output`, one of [`fleet_api_wire::wire::JOURNAL_OUTPUTS`].
    pub output: &'static str,
}

/// What `systemctl status` and systemd's D-Bus properties say of a unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusReport {
    /// `systemctl status --no-pager --full --lines N -- <unit>`'s output.
    pub text: String,
    /// The unit's properties (`org.freedesktop.systemd1.Unit`, and `.Service` for a
    /// service), each as `systemctl show` prints it.
    pub properties: BTreeMap<String, String>,
}

/// A journal's bytes as journalctl writes them; an error ends the response early.
pub type JournalStream = Pin<Box<dyn Stream<Item = Result<Bytes, InspectError>> + Send>>;

/// What an inspector's calls return.
pub type InspectFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, InspectError>> + Send + 'a>>;

/// A machine's view of its own units. The unit is already known to be fleet's and scheduled
/// here; an implementation runs programs with a fixed argv (never a shell).
pub trait Inspector: std::fmt::Debug + Send + Sync + 'static {
    /// The unit's status text with its last `lines` journal lines, and its properties.
    fn status<'a>(&'a self, unit: &'a UnitName, lines: u32) -> InspectFuture<'a, StatusReport>;

    /// The unit's journal, as asked. Dropping the stream ends whatever produces it.
    fn journal<'a>(
        &'a self,
        unit: &'a UnitName,
        request: JournalRequest,
    ) -> InspectFuture<'a, JournalStream>;
}

/// How inspecting a unit failed on this machine.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("running {program}")]
    Spawn {
        program: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The program ran and failed (an exit code it does not use for a unit's state).
    #[error("{program} failed ({status}): {stderr}")]
    Failed {
        program: &'static str,
        status: String,
        stderr: String,
    },
    #[error("{program} took longer than {waited:?}")]
    Timeout {
        program: &'static str,
        waited: std::time::Duration,
    },
    #[error("reading the properties of {unit} from systemd")]
    Properties {
        unit: UnitName,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("reading journalctl's output")]
    Read(#[source] std::io::Error),
}
