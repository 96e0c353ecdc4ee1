//! Translation between the [`Kv`](crate::kv::Kv) types and etcd-client's, and the sorting of
//! etcd-client's errors into the few kinds callers act on. Pure functions, no I/O.

use std::error::Error as _;

use etcd_client::{
    Compare as EtcdCompare, CompareOp, DeleteOptions, Error as EtcdError, EventType, GetOptions,
    GetResponse, PutOptions, Txn as EtcdTxn, TxnOp as EtcdTxnOp, TxnOpResponse as EtcdOpResponse,
    TxnResponse,
};

use crate::kv::{
    CmpOp, CmpTarget, Compare, Event, EventKind, KeyValue, LeaseId, RangeResult, Read, ReadResult,
    Revision, Txn, TxnOp, TxnOpResponse, TxnResult,
};

/// gRPC status codes (the wire numbers, stable by the gRPC spec).
mod code {
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const INTERNAL: i32 = 13;
    pub const OUT_OF_RANGE: i32 = 11;
    pub const UNAVAILABLE: i32 = 14;
    pub const UNAUTHENTICATED: i32 = 16;
}

/// What went wrong with one call, before the caller adds its context (endpoints, revision,
/// lease) to make a [`KvError`](crate::kv::KvError).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    /// The request never left: no connection could be made to the member.
    NotSent(String),
    /// The member is up but has no leader (an election, or it is cut off from the others). It
    /// says so before handling the request, so the request was not applied.
    NoLeader(String),
    /// No answer from the member, or it is unavailable, after the request may have reached it:
    /// connection lost, leader changed, request timed out in raft.
    Unreachable(String),
    /// etcd-client's own deadline fired before ours.
    Timeout,
    /// "mvcc: required revision has been compacted".
    Compacted(String),
    /// "requested lease not found", or a keep-alive answered with TTL 0.
    LeaseNotFound(String),
    /// "etcdserver: permission denied": etcd's RBAC refused the request (before applying
    /// it). The request it refused is the caller's to name.
    PermissionDenied,
    /// etcd refused the credentials ("authentication failed"), or wants some and got none
    /// ("user name is empty", "invalid auth token" that a new login did not cure).
    AuthFailed(String),
    /// The server answered and said no.
    Refused(String),
}

impl Failure {
    pub(super) fn classify(err: &EtcdError) -> Failure {
        match err {
            EtcdError::GRpcStatus(status) => {
                let message = status.message();
                // Not `chain(status)`: a status's `Display` dumps its source in debug form.
                let detail = || chain_from(message.to_owned(), status.source());
                match i32::from(status.code()) {
                    code::UNAVAILABLE if message == NO_LEADER => Failure::NoLeader(detail()),
                    code::UNAVAILABLE if never_connected(status.source()) => {
                        Failure::NotSent(detail())
                    }
                    code::UNAVAILABLE => Failure::Unreachable(detail()),
                    code::DEADLINE_EXCEEDED => Failure::Timeout,
                    code::CANCELLED if message.contains("Timeout expired") => Failure::Timeout,
                    // A status with a source was made on this side from a transport error; one
                    // from the server carries only its message.
                    code::CANCELLED | code::UNKNOWN | code::INTERNAL
                        if status.source().is_some() =>
                    {
                        Failure::Unreachable(detail())
                    }
                    code::OUT_OF_RANGE if message.contains("compacted") => {
                        Failure::Compacted(message.to_owned())
                    }
                    code::NOT_FOUND if message.contains("lease not found") => {
                        Failure::LeaseNotFound(message.to_owned())
                    }
                    code::PERMISSION_DENIED => Failure::PermissionDenied,
                    // The election and lock services of etcd lose the status code of the
                    // refusals they pass on, not the message.
                    code::UNKNOWN if message == PERMISSION_DENIED => Failure::PermissionDenied,
                    code::UNAUTHENTICATED => Failure::AuthFailed(message.to_owned()),
                    code::INVALID_ARGUMENT | code::UNKNOWN if auth_refusal(message) => {
                        Failure::AuthFailed(message.to_owned())
                    }
                    _ => Failure::Refused(message.to_owned()),
                }
            }
            EtcdError::LeaseKeepAliveError(msg) if msg.contains("not found") => {
                Failure::LeaseNotFound(msg.clone())
            }
            EtcdError::TransportError(_)
            | EtcdError::IoError(_)
            | EtcdError::LeaseKeepAliveError(_)
            | EtcdError::WatchError(_) => Failure::Unreachable(chain(err)),
            other => Failure::Refused(other.to_string()),
        }
    }
}

/// What etcd says when its RBAC refuses a request.
const PERMISSION_DENIED: &str = "etcdserver: permission denied";

/// Whether etcd's message refuses the credentials, or their absence.
fn auth_refusal(message: &str) -> bool {
    [
        "authentication failed",
        "user name is empty",
        "invalid auth token",
    ]
    .iter()
    .any(|s| message.contains(s))
}

/// The request a call made, in words for a refusal of etcd's RBAC ("write
/// /_coreos.com/fleet/schedule/m1/a.service"), and the lease a "lease not found" is about.
#[derive(Debug, Clone, Copy)]
pub(super) enum Request<'a> {
    Range {
        key: &'a str,
        prefix: bool,
    },
    Txn(&'a Txn),
    Grant,
    KeepAlive(LeaseId),
    Revoke(LeaseId),
    Watch {
        key: &'a str,
        prefix: bool,
    },
    #[cfg(feature = "test-etcd")]
    Compact,
    /// User and role administration: what it was doing ("add role fleet-viewer").
    Admin(&'a str),
}

impl Request<'_> {
    /// What the request asked for, with its first key.
    pub(super) fn describe(&self) -> String {
        match *self {
            Request::Range { key, prefix: false } => format!("read {key}"),
            Request::Range { key, prefix: true } => format!("read prefix {key}"),
            Request::Watch { key, prefix: false } => format!("watch {key}"),
            Request::Watch { key, prefix: true } => format!("watch prefix {key}"),
            Request::Txn(txn) => describe_txn(txn),
            Request::Grant => "grant a lease".to_owned(),
            Request::KeepAlive(lease) => format!("keep lease {} alive", lease.0),
            Request::Revoke(lease) => format!("revoke lease {}", lease.0),
            #[cfg(feature = "test-etcd")]
            Request::Compact => "compact the history".to_owned(),
            Request::Admin(what) => what.to_owned(),
        }
    }

    /// The lease a "lease not found" refers to, if any.
    pub(super) fn lease(&self) -> Option<LeaseId> {
        match *self {
            Request::KeepAlive(lease) => Some(lease),
            Request::Txn(txn) => first_lease(txn),
            Request::Range { .. }
            | Request::Grant
            | Request::Revoke(_)
            | Request::Watch { .. }
            | Request::Admin(_) => None,
            #[cfg(feature = "test-etcd")]
            Request::Compact => None,
        }
    }
}

/// A transaction by its first written key (etcd refuses it whole if any key is denied, and
/// does not say which), or its first read one. The words are those of the fake RBAC store
/// (`kv::Rbac`), which knows the refused key: the same for a transaction of one key.
fn describe_txn(txn: &Txn) -> String {
    let ops = || txn.success.iter().chain(&txn.failure);
    let writes: Vec<String> = ops()
        .filter_map(|op| match op {
            TxnOp::Put { key, .. } => Some(format!("write {key}")),
            TxnOp::Delete { key, prefix: false } => Some(format!("delete {key}")),
            TxnOp::Delete { key, prefix: true } => Some(format!("delete prefix {key}")),
            TxnOp::Get { .. } => None,
        })
        .collect();
    let reads = ops()
        .filter_map(|op| match op {
            TxnOp::Get { key, .. } => Some(key.as_str()),
            TxnOp::Put { .. } | TxnOp::Delete { .. } => None,
        })
        .chain(txn.compares.iter().map(|c| c.key.as_str()));
    match writes.as_slice() {
        [] => reads.into_iter().next().map_or_else(
            || "run a transaction".to_owned(),
            |key| format!("read {key}"),
        ),
        [write] => write.clone(),
        [write, rest @ ..] => format!(
            "{write} (or one of {} other key{} in the same transaction)",
            rest.len(),
            if rest.len() == 1 { "" } else { "s" }
        ),
    }
}

/// What a member without a leader answers a request that requires one (every request of
/// this client: `with_require_leader`), before handling it.
const NO_LEADER: &str = "etcdserver: no leader";

/// Whether a status was made on this side because no connection could be established (a
/// refused or unreachable address, a failed name lookup): the request was never written.
fn never_connected(mut source: Option<&(dyn std::error::Error + 'static)>) -> bool {
    while let Some(s) = source {
        let refused = s.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::HostUnreachable
                    | std::io::ErrorKind::NetworkUnreachable
                    | std::io::ErrorKind::AddrNotAvailable
            )
        });
        if refused {
            return true;
        }
        let text = s.to_string();
        if text.contains("tcp connect error") || text.contains("dns error") {
            return true;
        }
        source = s.source();
    }
    false
}

/// An error and its sources on one line, skipping sources that repeat what is already said.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    chain_from(err.to_string(), err.source())
}

fn chain_from(mut line: String, mut source: Option<&(dyn std::error::Error + 'static)>) -> String {
    while let Some(s) = source {
        let text = s.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = s.source();
    }
    line
}

pub(super) fn key_value(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    }
}

/// A key taken out of etcd's answer without copying its key or value: a listing of 100,000
/// states copied 200,000 buffers only to free the originals (issue 19, memmove and free in
/// the profile of fleetd serving `list-units`).
fn owned_key_value(kv: etcd_client::KeyValue) -> KeyValue {
    let (create_revision, mod_revision) = (kv.create_revision(), kv.mod_revision());
    let (version, lease) = (kv.version(), kv.lease());
    let (key, value) = kv.into_key_value();
    let key = String::from_utf8(key)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    KeyValue {
        key,
        value,
        create_revision,
        mod_revision,
        version,
        lease,
    }
}

fn owned_kvs(mut resp: GetResponse) -> Vec<KeyValue> {
    resp.take_kvs().into_iter().map(owned_key_value).collect()
}

pub(super) fn range_result(resp: GetResponse) -> RangeResult {
    RangeResult {
        revision: resp.header().map_or(0, |h| h.revision()),
        kvs: owned_kvs(resp),
    }
}

pub(super) fn event(event: &etcd_client::Event) -> Option<Event> {
    let kind = match event.event_type() {
        EventType::Put => EventKind::Put,
        EventType::Delete => EventKind::Delete,
    };
    Some(Event {
        kind,
        kv: key_value(event.kv()?),
    })
}

fn compare(c: Compare) -> EtcdCompare {
    let op = match c.op {
        CmpOp::Equal => CompareOp::Equal,
        CmpOp::NotEqual => CompareOp::NotEqual,
        CmpOp::Less => CompareOp::Less,
        CmpOp::Greater => CompareOp::Greater,
    };
    let cmp = match c.target {
        CmpTarget::Value(value) => EtcdCompare::value(c.key, op, value),
        CmpTarget::Version(version) => EtcdCompare::version(c.key, op, version),
        CmpTarget::CreateRevision(rev) => EtcdCompare::create_revision(c.key, op, rev),
        CmpTarget::ModRevision(rev) => EtcdCompare::mod_revision(c.key, op, rev),
        CmpTarget::Lease(lease) => EtcdCompare::lease(c.key, op, lease),
    };
    if c.prefix { cmp.with_prefix() } else { cmp }
}

fn op(op: TxnOp) -> EtcdTxnOp {
    match op {
        TxnOp::Put { key, value, lease } => {
            EtcdTxnOp::put(key, value, lease.map(|l| PutOptions::new().with_lease(l.0)))
        }
        TxnOp::Delete { key, prefix } => {
            EtcdTxnOp::delete(key, prefix.then(|| DeleteOptions::new().with_prefix()))
        }
        TxnOp::Get { key, prefix } => {
            EtcdTxnOp::get(key, prefix.then(|| GetOptions::new().with_prefix()))
        }
    }
}

/// [`Kv::read`](crate::kv::Kv::read)'s reads as a transaction of ranges without compares,
/// each at `revision` (0 is etcd's present).
pub(super) fn reads(reads: &[Read], revision: Option<Revision>) -> EtcdTxn {
    let ops: Vec<EtcdTxnOp> = reads
        .iter()
        .map(|read| {
            let mut options = GetOptions::new().with_revision(revision.unwrap_or(0));
            if let Some(end) = &read.end {
                options = options
                    .with_range(end.as_bytes())
                    .with_limit(i64::try_from(read.limit).unwrap_or(i64::MAX));
            }
            EtcdTxnOp::get(read.start.as_bytes(), Some(options))
        })
        .collect();
    EtcdTxn::new().and_then(ops)
}

/// What a transaction of reads found, read by read.
pub(super) fn read_result(resp: &TxnResponse) -> ReadResult {
    ReadResult {
        revision: resp.header().map_or(0, |h| h.revision()),
        found: resp
            .op_responses()
            .into_iter()
            .map(|r| match r {
                EtcdOpResponse::Get(g) => owned_kvs(g),
                EtcdOpResponse::Put(_) | EtcdOpResponse::Delete(_) | EtcdOpResponse::Txn(_) => {
                    Vec::new()
                }
            })
            .collect(),
    }
}

pub(super) fn txn(txn: Txn) -> EtcdTxn {
    EtcdTxn::new()
        .when(txn.compares.into_iter().map(compare).collect::<Vec<_>>())
        .and_then(txn.success.into_iter().map(op).collect::<Vec<_>>())
        .or_else(txn.failure.into_iter().map(op).collect::<Vec<_>>())
}

/// The lease a "lease not found" refusal of `txn` is about: the first one it puts with.
pub(super) fn first_lease(txn: &Txn) -> Option<LeaseId> {
    txn.success
        .iter()
        .chain(&txn.failure)
        .find_map(|op| match op {
            TxnOp::Put { lease, .. } => *lease,
            TxnOp::Delete { .. } | TxnOp::Get { .. } => None,
        })
}

pub(super) fn txn_result(resp: &TxnResponse) -> TxnResult {
    let responses = resp
        .op_responses()
        .into_iter()
        .filter_map(|r| match r {
            EtcdOpResponse::Put(_) => Some(TxnOpResponse::Put),
            EtcdOpResponse::Delete(d) => Some(TxnOpResponse::Delete(d.deleted())),
            EtcdOpResponse::Get(g) => Some(TxnOpResponse::Get(owned_kvs(g))),
            // Never sent: `op` builds no nested transactions.
            EtcdOpResponse::Txn(_) => None,
        })
        .collect();
    TxnResult {
        succeeded: resp.succeeded(),
        revision: resp.header().map_or(0, |h| h.revision()),
        responses,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_lease_of_the_first_put() {
        let txn = Txn {
            compares: vec![],
            success: vec![
                TxnOp::Delete {
                    key: "a".into(),
                    prefix: false,
                },
                TxnOp::Put {
                    key: "b".into(),
                    value: vec![],
                    lease: Some(LeaseId(7)),
                },
            ],
            failure: vec![],
        };
        assert_eq!(first_lease(&txn), Some(LeaseId(7)));
        assert_eq!(first_lease(&Txn::default()), None);
    }

    fn status(code: tonic::Code, message: &str) -> EtcdError {
        EtcdError::GRpcStatus(tonic::Status::new(code, message))
    }

    #[test]
    fn sorts_refusals_of_rbac_and_of_credentials() {
        use tonic::Code;
        let denied = status(Code::PermissionDenied, "etcdserver: permission denied");
        assert_eq!(Failure::classify(&denied), Failure::PermissionDenied);
        let via_election = status(Code::Unknown, "etcdserver: permission denied");
        assert_eq!(Failure::classify(&via_election), Failure::PermissionDenied);
        for (code, message) in [
            (
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            (Code::InvalidArgument, "etcdserver: user name is empty"),
            (Code::Unauthenticated, "etcdserver: invalid auth token"),
        ] {
            let failure = Failure::classify(&status(code, message));
            assert_eq!(
                failure,
                Failure::AuthFailed(message.to_owned()),
                "{message}"
            );
        }
    }

    #[test]
    fn names_a_transaction_by_its_first_written_key() {
        let put = |key: &str| TxnOp::Put {
            key: key.into(),
            value: vec![],
            lease: None,
        };
        let one = Txn {
            compares: vec![Compare::absent("/p/engine/leader")],
            success: vec![put("/p/schedule/m2/a.service")],
            failure: vec![],
        };
        assert_eq!(
            Request::Txn(&one).describe(),
            "write /p/schedule/m2/a.service"
        );
        let three = Txn {
            success: vec![put("/p/unit/a"), put("/p/unit/b"), put("/p/unit/c")],
            ..Txn::default()
        };
        assert_eq!(
            Request::Txn(&three).describe(),
            "write /p/unit/a (or one of 2 other keys in the same transaction)"
        );
        let read = Txn {
            compares: vec![Compare::absent("/p/x")],
            ..Txn::default()
        };
        assert_eq!(Request::Txn(&read).describe(), "read /p/x");
    }

    #[test]
    fn sorts_keep_alive_errors() {
        let gone = EtcdError::LeaseKeepAliveError("lease not found".into());
        assert!(matches!(
            Failure::classify(&gone),
            Failure::LeaseNotFound(_)
        ));
        let closed = EtcdError::WatchError("failed to create lease keeper".into());
        assert!(matches!(
            Failure::classify(&closed),
            Failure::Unreachable(_)
        ));
    }
}
