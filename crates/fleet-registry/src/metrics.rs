//! The registry's metrics: every etcd request, counted and timed by operation, its errors by
//! kind. Measured by [`Metered`], a store that passes every request on to another
//! ([`Metrics::meter`]), so neither the registry nor its callers change: fleetd wraps each of
//! its etcd connections once. Not a [`crate::kv::Hooked`] store: that one copies every
//! transaction to show it to its hook afterwards, and a batch of unit files can be megabytes.
//!
//! Names start from fleet's (`operation_count_total`, `operation_failed_count_total`,
//! `operation_duration_seconds`, with fleet's `type` label); docs/operating.md lists them. The
//! hot path allocates nothing: labels are enums, and every counter's series exist from the start,
//! at 0.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use std::fmt::{self, Write};
use std::time::Duration;

use crate::kv::{
    KeyValue, Kv, KvError, LeaseId, RangeResult, Read, ReadResult, Revision, Txn, TxnResult, Watch,
};
use tokio::time::Instant;

/// One kind of etcd request, as the store's trait names them.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Op {
    Range,
    /// A read of several keys or bounded intervals at one revision ([`Kv::read`]).
    Read,
    Txn,
    Grant,
    KeepAlive,
    Revoke,
    Watch,
}

impl Op {
    pub const ALL: [Op; 7] = [
        Op::Range,
        Op::Read,
        Op::Txn,
        Op::Grant,
        Op::KeepAlive,
        Op::Revoke,
        Op::Watch,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Range => "range",
            Op::Read => "read",
            Op::Txn => "txn",
            Op::Grant => "grant",
            Op::KeepAlive => "keep_alive",
            Op::Revoke => "revoke",
            Op::Watch => "watch",
        }
    }
}

impl EncodeLabelValue for Op {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> fmt::Result {
        encoder.write_str(self.as_str())
    }
}

/// How an etcd request failed ([`KvError`]'s variants).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum ErrorKind {
    Unavailable,
    Timeout,
    Compacted,
    LeaseNotFound,
    Refused,
    PermissionDenied,
    AuthFailed,
    Config,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::Unavailable,
        ErrorKind::Timeout,
        ErrorKind::Compacted,
        ErrorKind::LeaseNotFound,
        ErrorKind::Refused,
        ErrorKind::PermissionDenied,
        ErrorKind::AuthFailed,
        ErrorKind::Config,
    ];

    fn of(e: &KvError) -> ErrorKind {
        match e {
            KvError::Unavailable { .. } => ErrorKind::Unavailable,
            KvError::Timeout(..) => ErrorKind::Timeout,
            KvError::Compacted { .. } => ErrorKind::Compacted,
            KvError::LeaseNotFound(_) => ErrorKind::LeaseNotFound,
            KvError::Refused(_) => ErrorKind::Refused,
            KvError::PermissionDenied { .. } => ErrorKind::PermissionDenied,
            KvError::AuthFailed { .. } => ErrorKind::AuthFailed,
            KvError::Config(_) => ErrorKind::Config,
        }
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Compacted => "compacted",
            ErrorKind::LeaseNotFound => "lease_not_found",
            ErrorKind::Refused => "refused",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::AuthFailed => "auth_failed",
            ErrorKind::Config => "config",
        }
    }
}

impl EncodeLabelValue for ErrorKind {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> fmt::Result {
        encoder.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// fleet's label name.
    pub r#type: Op,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub r#type: Op,
    pub error: ErrorKind,
}

type Latency = Family<OpLabels, Histogram, fn() -> Histogram>;

/// Request latencies from 0.5 ms to about 16 s.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The registry's metric families; clones share them. [`Metrics::default`] is detached (for
/// tests and the bench): it counts, and nobody serves it.
#[derive(Debug, Clone)]
pub struct Metrics {
    operations: Family<OpLabels, Counter>,
    failures: Family<OpLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    duration: Latency,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            operations: Family::default(),
            failures: Family::default(),
            errors: Family::default(),
            duration: Latency::new_with_constructor(latency),
        }
    }
}

impl Metrics {
    /// New families, registered in `registry` (fleetd gives the `fleet_registry` one).
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics::default();
        registry.register(
            "operation_count",
            "etcd requests made, by type",
            m.operations.clone(),
        );
        registry.register(
            "operation_failed_count",
            "etcd requests that failed, by type",
            m.failures.clone(),
        );
        registry.register(
            "etcd_errors",
            "etcd requests that failed, by type and error",
            m.errors.clone(),
        );
        registry.register_with_unit(
            "operation_duration",
            "Latency of etcd requests, by type (failed ones included)",
            Unit::Seconds,
            m.duration.clone(),
        );
        m.zeroed();
        m
    }

    /// Every series of the counters at 0, so that a scrape shows them before the first
    /// request of their kind: an alert on `rate(fleet_registry_etcd_errors_total[5m])` sees
    /// nothing of a series that does not exist yet, and the first failure would go unnoticed.
    fn zeroed(&self) {
        for op in Op::ALL {
            let labels = OpLabels { r#type: op };
            self.operations.get_or_create_owned(&labels);
            self.failures.get_or_create_owned(&labels);
            for error in ErrorKind::ALL {
                self.errors
                    .get_or_create_owned(&ErrorLabels { r#type: op, error });
            }
        }
    }

    /// `kv`, with every request counted and timed here.
    pub fn meter<K: Kv>(&self, kv: K) -> Metered<K> {
        Metered {
            inner: kv,
            metrics: self.clone(),
        }
    }

    fn record<T>(&self, op: Op, sent: Instant, res: &Result<T, KvError>) {
        let labels = OpLabels { r#type: op };
        self.operations.get_or_create(&labels).inc();
        self.duration
            .get_or_create(&labels)
            .observe(sent.elapsed().as_secs_f64());
        if let Err(e) = res {
            self.failures.get_or_create(&labels).inc();
            self.errors
                .get_or_create(&ErrorLabels {
                    r#type: op,
                    error: ErrorKind::of(e),
                })
                .inc();
        }
    }

    /// Requests of `op` made so far (for tests).
    pub fn operations(&self, op: Op) -> u64 {
        self.operations
            .get_or_create(&OpLabels { r#type: op })
            .get()
    }

    /// Requests of `op` that failed with `error` so far (for tests).
    pub fn errors(&self, op: Op, error: ErrorKind) -> u64 {
        self.errors
            .get_or_create(&ErrorLabels { r#type: op, error })
            .get()
    }
}

/// A store that counts and times every request of `inner`.
#[derive(Debug, Clone)]
pub struct Metered<K> {
    inner: K,
    metrics: Metrics,
}

impl<K: Kv> Kv for Metered<K> {
    async fn range(
        &self,
        key: &str,
        prefix: bool,
        revision: Option<Revision>,
    ) -> Result<RangeResult, KvError> {
        let sent = Instant::now();
        let res = self.inner.range(key, prefix, revision).await;
        self.metrics.record(Op::Range, sent, &res);
        res
    }

    async fn range_each<F>(&self, prefix: &str, revision: Revision, page: F) -> Result<(), KvError>
    where
        F: FnMut(Vec<KeyValue>) + Send,
    {
        let sent = Instant::now();
        let res = self.inner.range_each(prefix, revision, page).await;
        self.metrics.record(Op::Range, sent, &res);
        res
    }

    async fn read(
        &self,
        reads: &[Read],
        revision: Option<Revision>,
    ) -> Result<ReadResult, KvError> {
        let sent = Instant::now();
        let res = self.inner.read(reads, revision).await;
        self.metrics.record(Op::Read, sent, &res);
        res
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult, KvError> {
        let sent = Instant::now();
        let res = self.inner.txn(txn).await;
        self.metrics.record(Op::Txn, sent, &res);
        res
    }

    async fn grant(&self, ttl: Duration) -> Result<LeaseId, KvError> {
        let sent = Instant::now();
        let res = self.inner.grant(ttl).await;
        self.metrics.record(Op::Grant, sent, &res);
        res
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<(), KvError> {
        let sent = Instant::now();
        let res = self.inner.keep_alive(lease).await;
        self.metrics.record(Op::KeepAlive, sent, &res);
        res
    }

    async fn keep_alive_within(&self, lease: LeaseId, within: Duration) -> Result<(), KvError> {
        let sent = Instant::now();
        let res = self.inner.keep_alive_within(lease, within).await;
        self.metrics.record(Op::KeepAlive, sent, &res);
        res
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), KvError> {
        let sent = Instant::now();
        let res = self.inner.revoke(lease).await;
        self.metrics.record(Op::Revoke, sent, &res);
        res
    }

    async fn watch(
        &self,
        key: &str,
        prefix: bool,
        from_revision: Revision,
    ) -> Result<Watch, KvError> {
        let sent = Instant::now();
        let res = self.inner.watch(key, prefix, from_revision).await;
        self.metrics.record(Op::Watch, sent, &res);
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{MemKv, TxnOp};
    use prometheus_client::encoding::text::encode;

    fn put(key: &str) -> Txn {
        Txn {
            success: vec![TxnOp::Put {
                key: key.into(),
                value: b"v".to_vec(),
                lease: None,
            }],
            ..Txn::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn counts_every_request_by_type_and_each_failure_by_its_error() {
        let mem = MemKv::new();
        let metrics = Metrics::default();
        let kv = metrics.meter(mem.clone());
        kv.txn(put("/a")).await.unwrap();
        kv.range("/", true, None).await.unwrap();
        kv.range("/a", false, None).await.unwrap();
        mem.set_unavailable(true);
        assert!(kv.range("/a", false, None).await.is_err());
        assert_eq!(metrics.operations(Op::Txn), 1);
        assert_eq!(metrics.operations(Op::Range), 3);
        assert_eq!(metrics.errors(Op::Range, ErrorKind::Unavailable), 1);
        assert_eq!(metrics.errors(Op::Txn, ErrorKind::Unavailable), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn registered_families_carry_fleets_names_under_the_prefix() {
        let mut registry = Registry::with_prefix("fleet");
        let metrics = Metrics::register(registry.sub_registry_with_prefix("registry"));
        let kv = metrics.meter(MemKv::new());
        kv.txn(put("/a")).await.unwrap();
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("fleet_registry_operation_count_total{type=\"txn\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("fleet_registry_operation_duration_seconds_count{type=\"txn\"} 1"),
            "{text}"
        );
    }
}
