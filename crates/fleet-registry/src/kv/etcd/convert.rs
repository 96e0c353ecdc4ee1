//! Translation between the [`Kv`](crate::kv::Kv) types and etcd-client's, and the sorting of
//! etcd-client's errors into the few kinds callers act on. Pure functions, no I/O.

use std::error::Error as _;

use etcd_client::{
    Compare as EtcdCompare, CompareOp, DeleteOptions, Error as EtcdError, EventType, GetOptions,
    GetResponse, PutOptions, Txn as EtcdTxn, TxnOp as EtcdTxnOp, TxnOpResponse as EtcdOpResponse,
    TxnResponse,
};

use crate::kv::{
    CmpOp, CmpTarget, Compare, Event, EventKind, KeyValue, LeaseId, RangeResult, Txn, TxnOp,
    TxnOpResponse, TxnResult,
};

/// gRPC status codes (the wire numbers, stable by the gRPC spec).
mod code {
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    pub const INTERNAL: i32 = 13;
    pub const OUT_OF_RANGE: i32 = 11;
    pub const UNAVAILABLE: i32 = 14;
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

pub(super) fn range_result(resp: GetResponse) -> RangeResult {
    RangeResult {
        revision: resp.header().map_or(0, |h| h.revision()),
        kvs: resp.kvs().iter().map(key_value).collect(),
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
            EtcdOpResponse::Get(g) => {
                Some(TxnOpResponse::Get(g.kvs().iter().map(key_value).collect()))
            }
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
