//! fleet's v1 entities with fleet's JSON names (`schema/v1.json`), and this API's extensions,
//! shared by the server (fleet-api) and fleetctl's HTTP client so the two cannot drift.
//!
//! Empty fields are left out, as fleet's generated Go types do (`omitempty`), and missing ones
//! read as empty, so fleet's clients and ours read each other's bodies. Every extension field
//! is empty unless the request asked for `?view=full` ([`VIEW_FULL`]): a default response is
//! fleet's, byte for byte. docs/api.md "Extensions" describes the wire; [`crate::convert`]
//! turns these into the model and back.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The query parameter and value that turn the extensions on (`?view=full`).
pub const VIEW: &str = "view";
pub const VIEW_FULL: &str = "full";
/// `PUT /units/<name>?op=...`: which operation a PUT is (absent: fleet's PUT).
pub const OP: &str = "op";
/// `PUT` flags of a replace (`--no-restart`, `--reschedule`, `--rolling`): `true` to set.
pub const NO_RESTART: &str = "noRestart";
pub const RESCHEDULE: &str = "reschedule";
pub const ROLLING: &str = "rolling";
/// `PUT /units/<name>?expect=absent` or `?expect=<hash>`: the put of
/// [`fleet_ops::Cluster::put_if`], refused with a 409 (`conflict`) unless the unit is absent, or
/// holds that content (full SHA-1), or already the content asked.
pub const EXPECT: &str = "expect";
pub const EXPECT_ABSENT: &str = "absent";
/// `GET /units?unitName=a&unitName=b` (full view): only those units. `GET /state` takes
/// several values too in the full view (any of them); fleet's takes the first.
pub const UNIT_NAME: &str = "unitName";
/// Full view of a listing: entries per page instead of the server's `token_limit` (1 to
/// 65535); a `nextPageToken` must come with the `pageSize` it was minted for.
pub const PAGE_SIZE: &str = "pageSize";
/// `GET /state`, `GET /machines` and `GET /units` with `pageSize=0` (full view): the whole
/// listing in one page at one revision, with no token.
pub const WHOLE_LISTING: &str = "0";
/// `GET /state?machineID=`; and the machines of `op=advanceRollout`, one value each.
pub const MACHINE_ID: &str = "machineID";
/// `PUT /drains/<machine>?parallel=N`: how many moves may be on their way at once.
pub const PARALLEL: &str = "parallel";

/// `GET /drains`: every drain mark (this API's extension; not paged, one per machine).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainList {
    #[serde(default)]
    pub drains: Vec<fleet_registry::DrainRecord>,
}

/// `DELETE /drains/<machine>`: whether there was a drain to remove.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Undrained {
    #[serde(default)]
    pub was_drained: bool,
}

fn is_empty(s: &str) -> bool {
    s.is_empty()
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One `Name=Value` line of a unit file's section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitOption {
    #[serde(default)]
    pub section: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub value: String,
}

/// A unit: its file as options, what the user wants, and where it runs.
///
/// States stay strings on the wire: an unknown `desiredState` must be a 400 naming it, not a
/// decoding error.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unit {
    #[serde(default, skip_serializing_if = "is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<UnitOption>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub desired_state: String,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub current_state: String,
    #[serde(rename = "machineID", default, skip_serializing_if = "is_empty")]
    pub machine_id: String,
    /// Full view: the file's hash (full SHA-1), as the registry has it.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub hash: String,
    /// Full view: every machine it is scheduled to, sorted (a global unit has several).
    #[serde(rename = "machineIDs", default, skip_serializing_if = "Vec::is_empty")]
    pub machine_ids: Vec<String>,
    /// Full view: why the engine could not place it.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub unscheduled_reason: String,
    /// Full view: the restart generation asked for.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restart_generation: u64,
}

/// What one machine's systemd says about a unit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitState {
    #[serde(default, skip_serializing_if = "is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub hash: String,
    #[serde(rename = "machineID", default, skip_serializing_if = "is_empty")]
    pub machine_id: String,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub systemd_load_state: String,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub systemd_active_state: String,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub systemd_sub_state: String,
    /// Full view: the restart generation the machine has carried out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restart_generation: u64,
    /// Full view: the running process started from an older file than the one in place.
    #[serde(default, skip_serializing_if = "is_false")]
    pub restart_pending: bool,
    /// Full view: restarts after failing on this machine (systemd's and the agent's).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u64,
    /// Full view: when it entered its current ActiveState, RFC 3339 in UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Full view: how its main process last ended (`exit status 3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<String>,
}

/// [`UnitState`] borrowed from the listing it is written from: the same JSON (tested in
/// `convert`), without two copies of every string of 100,000 states in fleetd's
/// `GET /state` (issue 19: malloc and free were a third of that listing's profile).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitStateOut<'a> {
    #[serde(skip_serializing_if = "is_empty")]
    pub name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "hash_text")]
    pub hash: Option<&'a fleet_core::UnitHash>,
    #[serde(rename = "machineID", skip_serializing_if = "is_empty")]
    pub machine_id: &'a str,
    #[serde(skip_serializing_if = "is_empty")]
    pub systemd_load_state: &'a str,
    #[serde(skip_serializing_if = "is_empty")]
    pub systemd_active_state: &'a str,
    #[serde(skip_serializing_if = "is_empty")]
    pub systemd_sub_state: &'a str,
    #[serde(skip_serializing_if = "is_zero")]
    pub restart_generation: u64,
    #[serde(skip_serializing_if = "is_false")]
    pub restart_pending: bool,
    #[serde(skip_serializing_if = "is_zero")]
    pub restarts: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit: Option<&'a str>,
}

fn hash_text<S: serde::Serializer>(
    hash: &Option<&fleet_core::UnitHash>,
    ser: S,
) -> Result<S::Ok, S::Error> {
    match hash {
        Some(h) => ser.collect_str(h),
        None => ser.serialize_none(),
    }
}

/// [`UnitStatePage`] of borrowed states ([`UnitStateOut`]).
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitStatePageOut<'a> {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<UnitStateOut<'a>>,
    #[serde(skip_serializing_if = "is_empty")]
    pub next_page_token: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

/// A live machine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    #[serde(default, skip_serializing_if = "is_empty")]
    pub id: String,
    #[serde(rename = "primaryIP", default, skip_serializing_if = "is_empty")]
    pub primary_ip: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Full view: the fleetd version it runs.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub version: String,
    /// Full view: it takes no part in leader election.
    #[serde(default, skip_serializing_if = "is_false")]
    pub disable_engine: bool,
    /// Full view: where its fleetd serves the API over the network (`MachineInfo::api`).
    #[serde(default, skip_serializing_if = "is_empty")]
    pub api: String,
    /// Both views, only when set: its fleetd stopped, and its fence stops its non-global
    /// units at this time (seconds since the epoch) unless fleetd returns
    /// (`MachineInfo::fence_at`).
    #[serde(rename = "fenceAt", default, skip_serializing_if = "Option::is_none")]
    pub fence_at: Option<u64>,
    /// Both views, only when true: this machine's engine leads (issue 41). fleet's clients
    /// ignore fields they do not know.
    #[serde(default, skip_serializing_if = "is_false")]
    pub leader: bool,
}

/// `GET /fleet/v1/units/<name>/status` (extension, issue 16), answered only by the fleetd of
/// the machine the unit is scheduled on, and only for fleet's units.
pub const STATUS_SUFFIX: &str = "/status";
/// `GET /fleet/v1/units/<name>/journal` (extension): journalctl's output for the unit, as
/// `text/plain; charset=utf-8`, streamed (chunked) while `follow` is true until the client
/// goes away. Query: [`LINES`], [`FOLLOW`], [`OUTPUT`].
pub const JOURNAL_SUFFIX: &str = "/journal";
/// How many of the last journal lines (status and journal); default 10 as in fleetctl.
pub const LINES: &str = "lines";
/// `true`: keep streaming new entries (`journalctl -f`).
pub const FOLLOW: &str = "follow";
/// One of journalctl's `--output` modes ([`JOURNAL_OUTPUTS`]); default `short`.
pub const OUTPUT: &str = "output";
/// The `--output` modes the journal route accepts; anything else is a 400.
pub const JOURNAL_OUTPUTS: &[&str] = &[
    "short",
    "short-full",
    "short-iso",
    "short-iso-precise",
    "short-precise",
    "short-monotonic",
    "short-unix",
    "verbose",
    "export",
    "json",
    "json-pretty",
    "json-sse",
    "json-seq",
    "cat",
    "with-unit",
];

/// The body of `GET /fleet/v1/units/<name>/status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitStatus {
    /// The machine that answered (the one the unit is scheduled on).
    #[serde(rename = "machineID")]
    pub machine_id: String,
    pub name: String,
    /// What `systemctl status <unit>` prints there, with its last [`LINES`] journal lines.
    pub text: String,
    /// The unit's D-Bus properties (org.freedesktop.systemd1.Unit, and .Service for a
    /// service), each as systemctl show prints it: `{"ActiveState": "active", "MainPID": "42",
    /// ...}`.
    pub properties: BTreeMap<String, String>,
}

/// A page of units. Full view: `skipped` names each registry value the page left out (the
/// first page also carries what the whole listing skipped).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitPage {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<Unit>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub next_page_token: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

/// A page of unit states. Full view, first page only: the state values the listing skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitStatePage {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<UnitState>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub next_page_token: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

/// A page of machines. Full view, first page only: what the listing skipped, and the
/// engine's disruption notice if one is held.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachinePage {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machines: Vec<Machine>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub next_page_token: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub disruption_notice: String,
    /// What is wrong with the engine leader key, when it leads nothing fleet knows of.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub engine_leader_notice: String,
}

/// `PUT /units/<name>?op=...`: the operations fleet's API has no method for. The body is a
/// Unit entity (`{}` when nothing else is needed); `Raise` takes its `desiredState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Op {
    /// fleetctl's `stop`: launched becomes loaded; inactive is an error.
    Stop,
    /// `unload`: anything becomes inactive.
    Unload,
    /// Raise to the body's `desiredState`, never lower.
    Raise,
    /// `restart`.
    Restart,
    /// A rolling replace lets the `machineID` machines take the new version.
    AdvanceRollout,
    /// A rolling replace is over.
    FinishRollout,
}

impl Op {
    pub const ALL: [Op; 6] = [
        Op::Stop,
        Op::Unload,
        Op::Raise,
        Op::Restart,
        Op::AdvanceRollout,
        Op::FinishRollout,
    ];

    /// The query value (`op=stop`).
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Stop => "stop",
            Op::Unload => "unload",
            Op::Raise => "raise",
            Op::Restart => "restart",
            Op::AdvanceRollout => "advanceRollout",
            Op::FinishRollout => "finishRollout",
        }
    }

    pub fn parse(s: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.as_str() == s)
    }
}

/// What a write did, in the full view of `PUT` and `DELETE` (status 200 with a
/// [`WriteResult`] body; the default view answers fleet's 201/204 with no body).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    Created,
    Replaced,
    StateChanged,
    /// Already as asked; nothing written.
    Unchanged,
    /// `op=restart` of a launched unit: `restartGeneration` is the one to wait for.
    Restarted,
    /// `op=restart` of a loaded unit: it was launched.
    Launched,
    /// `op=advanceRollout` (with the unit) or `op=finishRollout`.
    RolloutAdvanced,
    RolloutFinished,
    /// `DELETE`: destroyed; `Unreadable`: a record that could not be read was removed
    /// (`detail` says why); `Missing`: there was no such unit.
    Destroyed,
    Unreadable,
    Missing,
}

/// The body of a full-view write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteResult {
    pub outcome: Outcome,
    /// The unit as written (full view), for the outcomes that have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<Unit>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restart_generation: u64,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub detail: String,
}

/// `POST /units?view=full`: units created together, each as a `PUT /units/<name>?expect=absent`
/// with its options would create it (fleetctl's `start`/`load`/`submit` of units it found
/// missing). At most [`MAX_CREATES`] units, each named once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Creates {
    #[serde(default)]
    pub units: Vec<Unit>,
}

/// Most units one `POST /units` creates.
pub const MAX_CREATES: usize = 10_000;

/// The answer to a [`Creates`]: one result per unit, in the order asked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateResults {
    #[serde(default)]
    pub results: Vec<CreateResult>,
}

/// One unit's result: what a full-view `PUT` of it alone would have answered, a
/// [`WriteResult`]'s `outcome` and `unit`, or the `error` entity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<Unit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorEntity>,
}

/// One operation of a `PATCH /machines` body (JSON Patch on `/<machineID>/metadata/<key>`).
/// Field names match case-insensitively in fleet (Go's decoder): its own tests send `Value`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataOp {
    #[serde(default, alias = "Op", alias = "OP")]
    pub op: String,
    #[serde(default, alias = "Path")]
    pub path: String,
    #[serde(default, alias = "Value", skip_serializing_if = "Option::is_none")]
    pub value: Option<MetadataValue>,
}

/// The value of an `add` or `replace`: fleet's code and tests send `{"value": "…"}`; its
/// document shows a plain string, which fleet refused and is taken here too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MetadataValue {
    Wrapped {
        #[serde(default, alias = "Value")]
        value: String,
    },
    Plain(String),
}

impl MetadataValue {
    pub fn as_str(&self) -> &str {
        match self {
            Self::Wrapped { value } | Self::Plain(value) => value,
        }
    }
}

/// Every error body: `{"error":{"code":N,"message":"…"}}` (Google's error shape).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorEntity,
}

/// Full view: `reason` names the [`fleet_ops::OpsError`] variant ([`Reason`]) and `detail` is
/// its message as fleetctl prints it; fleet's `message` stays as it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorEntity {
    pub code: u16,
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub detail: String,
}

/// Which operation error an error entity carries (full view). The unit is the one the
/// request's URL names; the client rebuilds the variant from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Reason {
    NoSuchUnit,
    Conflict,
    StopInactive,
    RestartInactive,
    ActivateTemplate,
    NoOptions,
    ReplaceLowers,
    Invalid,
    /// etcd failed or is away (`code` 503 when it is away).
    Registry,
    /// One unit of a `POST /units` not written because the write of another unit of the same
    /// request failed (that unit's result says why).
    NotWritten,
}

#[cfg(test)]
mod tests;
