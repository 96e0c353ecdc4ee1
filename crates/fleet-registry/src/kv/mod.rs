//! The small slice of etcd v3 the registry uses, behind one trait with two sides:
//! [`EtcdKv`] (real etcd through etcd-client) and [`MemKv`] (an in-memory model for pure tests).
//!
//! The contract tests in `tests/kv_contract.rs` run the same bodies against both, so the fake
//! cannot drift from etcd. Nothing above this module names etcd-client.

use std::future::Future;
use std::time::Duration;

mod etcd;
mod hooked;
mod mem;
mod rbac;

pub(crate) use etcd::admin::Grant;
pub use etcd::{EtcdAuth, EtcdConfig, EtcdKv, TlsFiles};
pub use hooked::{Hook, Hooked, Outcome, Request};
pub use mem::MemKv;
pub use rbac::Rbac;

/// Keys in the first page of a prefix read on etcd; later pages ask for as many keys as make
/// about 4 MiB per second of the request deadline (at most 16 MiB) at the sizes seen so far.
/// Big reads come in pages so that no response holds a whole large prefix, but a page is
/// bounded in keys, not bytes (etcd 3.4 cannot limit by bytes): the first is up to 500 values
/// of up to etcd's request limit (1.5 MiB) each, and a later one may overshoot its size when
/// values grow. The result is still one revision (see
/// [`Kv::range`]). Public so the contract tests can read more than one page.
pub const RANGE_PAGE: usize = 500;

/// etcd's default `--max-txn-ops`: a transaction may hold at most this many operations.
pub const MAX_TXN_OPS: usize = 128;

/// The bytes of keys and values a transaction of many units carries at most. etcd 3.4's
/// default `--max-request-bytes` is 1.5 MiB (its gRPC limit 2 MiB) and a unit file is at
/// most [`fleet_core::unit_file::MAX_UNIT_FILE_BYTES`] (1 MiB), so a unit alone always fits; a batch
/// takes another only while the sum stays within this, so that any set of units that fit
/// one by one fit together (issue 38: 5 files of 965 KB were one 4.8 MB request).
pub const MAX_TXN_BYTES: usize = 1024 * 1024;

/// What one put of a batch costs beyond a unit file's bytes, at most: its key (the prefix,
/// a unit name of up to 256 bytes, a hash) and a unit record, with room to spare.
pub const TXN_OP_BYTES: usize = 1024;

/// An etcd revision (cluster-wide, monotonically increasing).
pub type Revision = i64;

/// An etcd lease ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(pub i64);

/// One key with its metadata, as etcd returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: Revision,
    pub mod_revision: Revision,
    pub version: i64,
    /// 0 when the key has no lease.
    pub lease: i64,
}

/// The result of a range read: every key at one revision, sorted by key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeResult {
    pub revision: Revision,
    pub kvs: Vec<KeyValue>,
}

/// One read of [`Kv::read`]: the key `start` alone (no `end`), or the keys in `[start, end)`,
/// at most `limit` of them (0: all of them; a read is one request, never paged, so a caller
/// bounds every interval that may be large).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub start: String,
    pub end: Option<String>,
    pub limit: usize,
}

impl Read {
    /// The key alone.
    pub fn key(key: impl Into<String>) -> Read {
        Read {
            start: key.into(),
            end: None,
            limit: 0,
        }
    }

    /// The first `limit` keys in `[start, end)` (0: all).
    pub fn interval(start: impl Into<String>, end: impl Into<String>, limit: usize) -> Read {
        Read {
            start: start.into(),
            end: Some(end.into()),
            limit,
        }
    }
}

/// What [`Kv::read`] found: for each read, in the order asked, its keys sorted by key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadResult {
    /// The store's revision when it answered (etcd's header): the revision read at when none
    /// was asked for.
    pub revision: Revision,
    pub found: Vec<Vec<KeyValue>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Equal,
    NotEqual,
    Less,
    Greater,
}

/// What a comparison looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmpTarget {
    Value(Vec<u8>),
    Version(i64),
    CreateRevision(Revision),
    ModRevision(Revision),
    /// The key's lease ID (0: no lease).
    Lease(i64),
}

/// A transaction guard. With `prefix`, every key under `key` must satisfy it; an empty range
/// compares as a single absent key (version, create and mod revision 0), as in etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    pub key: String,
    pub prefix: bool,
    pub op: CmpOp,
    pub target: CmpTarget,
}

impl Compare {
    /// The key does not exist (create-if-absent).
    pub fn absent(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            prefix: false,
            op: CmpOp::Equal,
            target: CmpTarget::CreateRevision(0),
        }
    }

    /// No key exists under `prefix`.
    pub fn prefix_empty(prefix: impl Into<String>) -> Self {
        Self {
            prefix: true,
            ..Self::absent(prefix)
        }
    }

    /// The key was last modified at `rev` (compare-and-swap on a read).
    pub fn mod_revision(key: impl Into<String>, rev: Revision) -> Self {
        Self {
            key: key.into(),
            prefix: false,
            op: CmpOp::Equal,
            target: CmpTarget::ModRevision(rev),
        }
    }

    /// The key's value equals `value`.
    pub fn value(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Self {
            key: key.into(),
            prefix: false,
            op: CmpOp::Equal,
            target: CmpTarget::Value(value.into()),
        }
    }
}

/// A write (or read) inside a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    },
    Delete {
        key: String,
        prefix: bool,
    },
    Get {
        key: String,
        prefix: bool,
    },
}

/// `if compares then success else failure`, applied atomically at one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub success: Vec<TxnOp>,
    pub failure: Vec<TxnOp>,
}

/// What one op of the branch taken returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOpResponse {
    Put,
    /// How many keys were deleted.
    Delete(i64),
    Get(Vec<KeyValue>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResult {
    pub succeeded: bool,
    /// The store's revision after the transaction.
    pub revision: Revision,
    pub responses: Vec<TxnOpResponse>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// For deletes, only `key` and `mod_revision` are meaningful.
    pub kv: KeyValue,
}

/// What a watch delivers. Watches are hints: after `Compacted` or `Broken` the caller re-reads
/// and watches again from the revision it read at + 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchMessage {
    /// Events of one revision (or a batch of consecutive revisions), in order.
    Events {
        revision: Revision,
        events: Vec<Event>,
    },
    /// The requested start revision was compacted away; relist.
    Compacted { compact_revision: Revision },
    /// The stream ended (server gone, connection lost); resume from the last seen revision + 1.
    Broken,
}

/// A live watch. Dropping it cancels the watch.
#[derive(Debug)]
pub struct Watch {
    pub rx: tokio::sync::mpsc::Receiver<WatchMessage>,
}

/// Errors from the store. `Unavailable` is the one callers retry.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("etcd unreachable at {endpoints} ({detail})")]
    Unavailable { endpoints: String, detail: String },
    #[error("etcd request timed out after {0:?} (endpoints {1})")]
    Timeout(Duration, String),
    #[error("revision {requested} has been compacted (compacted up to {compacted})")]
    Compacted {
        requested: Revision,
        compacted: Revision,
    },
    #[error("lease {0:?} not found or expired")]
    LeaseNotFound(LeaseId),
    #[error("etcd refused the request: {0}")]
    Refused(String),
    /// etcd's RBAC refused the request (`etcdserver: permission denied`): `user` is the etcd
    /// user we authenticated as (empty when anonymous or by certificate), `what` the request
    /// in words with its first key ("write /_coreos.com/fleet/schedule/m1/a.service").
    #[error(
        "{} may not {what} (refused by etcd's RBAC: permission denied)",
        who(user)
    )]
    PermissionDenied { user: String, what: String },
    /// etcd refused the credentials (wrong username or password, or auth not enabled for a
    /// user that does not exist).
    #[error("{}", auth_failed(user, detail))]
    AuthFailed { user: String, detail: String },
    #[error("invalid etcd configuration: {0}")]
    Config(String),
}

/// The etcd identity a refusal is about.
fn who(user: &str) -> String {
    if user.is_empty() {
        "this client (no etcd user configured; etcd may know it by its TLS certificate)".to_owned()
    } else {
        format!("etcd user '{user}'")
    }
}

fn auth_failed(user: &str, detail: &str) -> String {
    if user.is_empty() {
        format!("etcd requires a user and password and none is configured ({detail})")
    } else {
        format!("etcd refused the credentials of user '{user}' ({detail})")
    }
}

impl KvError {
    /// Whether retrying later may succeed (connectivity), as opposed to a refusal.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::Timeout(..))
    }
}

/// How long a renewal of a lease of `ttl`, sent `since_renewal` after the last one that
/// succeeded, may wait for etcd's answer ([`Kv::keep_alive_within`]): a third of the TTL, and
/// never past two thirds of the TTL after that success, which leaves the lease's last third
/// to retries (and to fleetd's asking its peers whether etcd is down for all). etcd's own
/// clients wait on a renewal as long as the lease lives; waiting only fleetd's request
/// deadline (1 s) gave up on renewals etcd answered in 1.3 s under a bulk start at 5,000
/// machines, and sent them again (docs/benchmarks.md, section 7).
pub fn renewal_window(ttl: Duration, since_renewal: Duration) -> Duration {
    (ttl / 3).min((ttl * 2 / 3).saturating_sub(since_renewal))
}

/// The pause before retrying a failed renewal. Waiting the regular TTL/3 instead cost a
/// machine its lease: with a 3 s TTL, one renewal that etcd 3.4 held for 1 s under a write
/// burst left no time for another, and the engine unscheduled all 1,000 units of the machine
/// (docs/benchmarks.md, "What the first run found", item 6). The engine's leader lost its
/// lease the same way in the million (section 7, item 9): two renewals failed, and the next
/// was due only when the lease had gone.
pub const RENEWAL_RETRY: Duration = Duration::from_millis(250);

/// How long to wait before the next renewal of a lease of `ttl`, `since_renewal` after the
/// start of the last one that succeeded (or of the grant). After a success: TTL/3. After a
/// failure: [`RENEWAL_RETRY`] while the lease may still be alive, then TTL/3 again, since the
/// lease is gone unless etcd itself is down (it renews every lease when it recovers, or
/// answers `LeaseNotFound`), and hammering it would not help.
pub fn next_renewal(ttl: Duration, last_failed: bool, since_renewal: Duration) -> Duration {
    let period = ttl / 3;
    if last_failed && since_renewal < ttl {
        RENEWAL_RETRY.min(period)
    } else {
        period
    }
}

/// The store. Every method is one etcd round trip, except a prefix read of more than
/// [`RANGE_PAGE`] keys.
pub trait Kv: Clone + Send + Sync + 'static {
    /// Reads `key` (or every key under it with `prefix`), at `revision` or the latest. Every
    /// key comes from one revision however many there are and however big their values: etcd
    /// serves a prefix in pages (the first of [`RANGE_PAGE`] keys), each page after the first
    /// read at the first one's revision (a read of the present that loses that revision to a
    /// compaction starts again).
    fn range(
        &self,
        key: &str,
        prefix: bool,
        revision: Option<Revision>,
    ) -> impl Future<Output = Result<RangeResult, KvError>> + Send;

    /// Reads every key under `prefix` at `revision`, as [`range`](Kv::range) does, but
    /// hands the keys to `page` in batches as they arrive instead of in one result, so a
    /// caller decodes one batch while etcd serves the next (issue 19: a listing of 100,000
    /// units decoded 300,000 keys after the last arrived, on one core, the other idle).
    /// Keys are in order within a batch, not across batches. On an error, the batches
    /// already handed over belong to a read that failed: the caller drops what it built.
    /// A pinned revision only: a read of the present may start again after a compaction.
    fn range_each<F>(
        &self,
        prefix: &str,
        revision: Revision,
        mut page: F,
    ) -> impl Future<Output = Result<(), KvError>> + Send
    where
        F: FnMut(Vec<KeyValue>) + Send,
    {
        async move {
            page(self.range(prefix, true, Some(revision)).await?.kvs);
            Ok(())
        }
    }

    /// Reads `reads` (at most [`MAX_TXN_OPS`]) in one request, every one at `revision` (the
    /// present when None): a key, or an interval of keys with a limit. `Compacted` when
    /// `revision` was compacted away. How a reader reads a bounded part of the registry (a
    /// page of a listing) at one revision across many requests.
    fn read(
        &self,
        reads: &[Read],
        revision: Option<Revision>,
    ) -> impl Future<Output = Result<ReadResult, KvError>> + Send;

    /// Applies `txn` atomically.
    fn txn(&self, txn: Txn) -> impl Future<Output = Result<TxnResult, KvError>> + Send;

    /// Grants a lease of `ttl` (etcd may round it up to its minimum).
    fn grant(&self, ttl: Duration) -> impl Future<Output = Result<LeaseId, KvError>> + Send;

    /// Refreshes a lease once; `LeaseNotFound` when it has expired.
    fn keep_alive(&self, lease: LeaseId) -> impl Future<Output = Result<(), KvError>> + Send;

    /// [`keep_alive`](Self::keep_alive), waiting up to `within` for etcd's answer instead of
    /// the request deadline, and never less than it. A renewal is worth waiting for as long
    /// as the lease may live: one given up at fleetd's 1 s while etcd was answering in 1.3 s
    /// under a bulk start was sent again, and the retries of 5,000 machines added to the load
    /// that slowed etcd (docs/benchmarks.md, section 7). Stores without deadlines ignore it.
    fn keep_alive_within(
        &self,
        lease: LeaseId,
        within: Duration,
    ) -> impl Future<Output = Result<(), KvError>> + Send {
        let _ = within;
        self.keep_alive(lease)
    }

    /// Revokes a lease, deleting its keys. Revoking an unknown lease is not an error.
    fn revoke(&self, lease: LeaseId) -> impl Future<Output = Result<(), KvError>> + Send;

    /// Watches `key` (or everything under it) from `from_revision` inclusive.
    fn watch(
        &self,
        key: &str,
        prefix: bool,
        from_revision: Revision,
    ) -> impl Future<Output = Result<Watch, KvError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn a_renewal_waits_a_third_of_the_ttl_and_never_into_the_leases_last_third() {
        let ttl = Duration::from_secs(3);
        assert_eq!(renewal_window(ttl, ms(1000)), ms(1000));
        assert_eq!(renewal_window(ttl, ms(1500)), ms(500));
        assert_eq!(renewal_window(ttl, ms(2250)), Duration::ZERO);
        assert_eq!(renewal_window(ttl, ms(9000)), Duration::ZERO);
        assert_eq!(
            renewal_window(Duration::from_secs(30), ms(10_000)),
            ms(10_000)
        );
    }

    #[test]
    fn a_renewal_comes_a_third_of_the_ttl_after_a_success_and_quickly_after_a_failure() {
        let ttl = Duration::from_secs(3);
        assert_eq!(next_renewal(ttl, false, ms(100)), ms(1000));
        assert_eq!(next_renewal(ttl, true, ms(2000)), RENEWAL_RETRY);
        // Past the TTL the lease is gone unless etcd is down: back to the regular pace.
        assert_eq!(next_renewal(ttl, true, ms(3000)), ms(1000));
        // A TTL so short that TTL/3 is below the retry pause keeps TTL/3.
        assert_eq!(next_renewal(ms(600), true, ms(100)), ms(200));
    }
}
