//! [`CountingKv`]: a [`Kv`] that counts every etcd request it passes on, by method and by the
//! part of the key schema it touches, plus the write operations inside transactions and the
//! events its watches deliver. It changes nothing about the requests themselves: it is the
//! registry's [`Hooked`] store, with a hook that counts.
//!
//! One request can be counted into several [`Counters`] (e.g. "this agent" and "all agents").

use fleet_registry::kv::{
    Hook, Hooked, Kv, KvError, Outcome, Request, Txn, TxnOp, Watch, WatchMessage,
};
use fleet_registry::{Keys, Kind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::Instrument;

/// The etcd calls of the [`Kv`] trait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Method {
    Range,
    Txn,
    Grant,
    KeepAlive,
    Revoke,
    Watch,
}

impl Method {
    pub const ALL: [Method; 6] = [
        Method::Range,
        Method::Txn,
        Method::Grant,
        Method::KeepAlive,
        Method::Revoke,
        Method::Watch,
    ];

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    pub fn label(self) -> &'static str {
        match self {
            Method::Range => "range",
            Method::Txn => "txn",
            Method::Grant => "lease-grant",
            Method::KeepAlive => "lease-keepalive",
            Method::Revoke => "lease-revoke",
            Method::Watch => "watch-create",
        }
    }
}

/// The part of the key schema a request is about (`docs/registry.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    Unit,
    Schedule,
    State,
    Machine,
    Engine,
    Unscheduled,
    File,
    FileRef,
    Other,
}

impl Class {
    /// In the order a transaction is classified by: the first class it writes, in this order.
    pub const ALL: [Class; 9] = [
        Class::Unit,
        Class::Schedule,
        Class::State,
        Class::Machine,
        Class::Engine,
        Class::Unscheduled,
        Class::File,
        Class::FileRef,
        Class::Other,
    ];

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    pub fn label(self) -> &'static str {
        match self {
            Class::Unit => "unit",
            Class::Schedule => "schedule",
            Class::State => "state",
            Class::Machine => "machine",
            Class::Engine => "engine",
            Class::Unscheduled => "unscheduled",
            Class::File => "file",
            Class::FileRef => "file-ref",
            Class::Other => "other",
        }
    }

    /// The class of `key`, from the registry's own parser of the schema.
    fn of(key: &str, prefix: &str) -> Class {
        match Keys::new(prefix).kind(key) {
            Some(Kind::Unit) => Class::Unit,
            Some(Kind::Schedule | Kind::Placement | Kind::Left) => Class::Schedule,
            Some(Kind::State) => Class::State,
            Some(Kind::Machine) => Class::Machine,
            Some(Kind::Engine) => Class::Engine,
            Some(Kind::Unscheduled) => Class::Unscheduled,
            Some(Kind::File) => Class::File,
            Some(Kind::FileRef) => Class::FileRef,
            Some(Kind::Metadata | Kind::Drain | Kind::Moving | Kind::Migrating | Kind::Event)
            | None => Class::Other,
        }
    }
}

mod tally;

pub use tally::Tally;

const METHODS: usize = Method::ALL.len();
const CLASSES: usize = Class::ALL.len();

/// Live counters, shared by every [`CountingKv`] that counts into them.
#[derive(Debug, Default)]
pub struct Counters {
    requests: [[AtomicU64; CLASSES]; METHODS],
    puts: [AtomicU64; CLASSES],
    deletes: [AtomicU64; CLASSES],
    errors: AtomicU64,
    /// Requests that failed on their deadline (the client's `request_timeout`).
    timeouts: AtomicU64,
    /// The same, per method.
    method_timeouts: [AtomicU64; METHODS],
    /// Keep-alives etcd answered with "lease not found": a machine's lease had expired.
    leases_lost: AtomicU64,
    read_bytes: AtomicU64,
    watch_messages: AtomicU64,
    watch_events: AtomicU64,
    /// Per method: the slowest request and the sum of all, in microseconds.
    latency_max_us: [AtomicU64; METHODS],
    latency_sum_us: [AtomicU64; METHODS],
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    pub fn new() -> Arc<Counters> {
        Arc::default()
    }

    /// A copy of the counts now.
    pub fn tally(&self) -> Tally {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Tally {
            requests: self.requests.each_ref().map(|row| row.each_ref().map(load)),
            puts: self.puts.each_ref().map(load),
            deletes: self.deletes.each_ref().map(load),
            errors: load(&self.errors),
            timeouts: load(&self.timeouts),
            method_timeouts: self.method_timeouts.each_ref().map(load),
            leases_lost: load(&self.leases_lost),
            read_bytes: load(&self.read_bytes),
            watch_messages: load(&self.watch_messages),
            watch_events: load(&self.watch_events),
            latency_max_us: self.latency_max_us.each_ref().map(load),
            latency_sum_us: self.latency_sum_us.each_ref().map(load),
        }
    }
}

/// A [`Kv`] that counts what passes through it into every one of its sinks: the registry's
/// [`Hooked`] store with a [`Counting`] hook.
pub type CountingKv<K> = Hooked<K, Counting>;

/// Counts `inner`'s requests; keys are classified relative to the registry `prefix`.
pub fn counting<K: Kv>(inner: K, prefix: &str, sinks: Vec<Arc<Counters>>) -> CountingKv<K> {
    Hooked {
        inner,
        hook: Counting {
            prefix: prefix.into(),
            sinks: sinks.into(),
        },
    }
}

/// The [`Hook`] of a [`CountingKv`]: it counts and passes everything on unchanged.
#[derive(Debug, Clone)]
pub struct Counting {
    prefix: Arc<str>,
    sinks: Arc<[Arc<Counters>]>,
}

impl Counting {
    fn each(&self, f: impl Fn(&Counters)) {
        self.sinks.iter().for_each(|c| f(c));
    }

    fn classify(&self, request: Request<'_>) -> (Method, Class) {
        match request {
            Request::Range { key, .. } => (Method::Range, Class::of(key, &self.prefix)),
            // Reads at one revision (a page of a listing) count with the ranges: both read.
            Request::Read(reads) => {
                let key = reads.first().map_or("", |r| r.start.as_str());
                (Method::Range, Class::of(key, &self.prefix))
            }
            Request::Txn(txn) => (Method::Txn, self.txn_class(txn)),
            Request::Grant => (Method::Grant, Class::Other),
            Request::KeepAlive { .. } => (Method::KeepAlive, Class::Other),
            Request::Revoke(_) => (Method::Revoke, Class::Other),
            Request::Watch { key, .. } => (Method::Watch, Class::of(key, &self.prefix)),
        }
    }

    /// The first class (in [`Class::ALL`] order) a transaction's success branch touches.
    fn txn_class(&self, txn: &Txn) -> Class {
        let keys = txn.success.iter().map(op_key);
        let classes: Vec<Class> = keys
            .chain(txn.compares.iter().map(|c| c.key.as_str()))
            .map(|k| Class::of(k, &self.prefix))
            .collect();
        Class::ALL
            .into_iter()
            .find(|c| classes.contains(c))
            .unwrap_or(Class::Other)
    }

    fn count_ops(&self, ops: &[TxnOp]) {
        for op in ops {
            let class = Class::of(op_key(op), &self.prefix).index();
            match op {
                TxnOp::Put { .. } => self.each(|c| add(&c.puts[class], 1)),
                TxnOp::Delete { .. } => self.each(|c| add(&c.deletes[class], 1)),
                TxnOp::Get { .. } => {}
            }
        }
    }
}

fn op_key(op: &TxnOp) -> &str {
    match op {
        TxnOp::Put { key, .. } | TxnOp::Delete { key, .. } | TxnOp::Get { key, .. } => key,
    }
}

impl Hook for Counting {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        let (method, class) = self.classify(request);
        self.each(|c| add(&c.requests[method.index()][class.index()], 1));
        Ok(())
    }

    fn after(&self, request: Request<'_>, outcome: Outcome<'_>, took: Duration) {
        let (method, _) = self.classify(request);
        let us = took.as_micros() as u64;
        self.each(|c| {
            add(&c.latency_sum_us[method.index()], us);
            c.latency_max_us[method.index()].fetch_max(us, Ordering::Relaxed);
        });
        match (request, outcome) {
            (_, Outcome::Failed(e)) => self.each(|c| {
                add(&c.errors, 1);
                match e {
                    KvError::Timeout(..) => {
                        add(&c.timeouts, 1);
                        add(&c.method_timeouts[method.index()], 1);
                    }
                    KvError::LeaseNotFound(_) => add(&c.leases_lost, 1),
                    _ => {}
                }
            }),
            (_, Outcome::Range(res)) => {
                let bytes: usize = res.kvs.iter().map(|kv| kv.key.len() + kv.value.len()).sum();
                self.each(|c| add(&c.read_bytes, bytes as u64));
            }
            (_, Outcome::Read(res)) => {
                let bytes: usize = res
                    .found
                    .iter()
                    .flatten()
                    .map(|kv| kv.key.len() + kv.value.len())
                    .sum();
                self.each(|c| add(&c.read_bytes, bytes as u64));
            }
            (Request::Txn(txn), Outcome::Txn(res)) => {
                self.count_ops(if res.succeeded {
                    &txn.success
                } else {
                    &txn.failure
                });
            }
            (_, Outcome::Txn(_) | Outcome::Done) => {}
        }
    }

    fn watched(&self, mut inner: Watch) -> Watch {
        // Same capacity as the real adapter's channel, so back-pressure is unchanged.
        let (tx, rx) = mpsc::channel(64);
        let sinks = self.sinks.clone();
        tokio::spawn(
            async move {
                while let Some(message) = inner.rx.recv().await {
                    if let WatchMessage::Events { events, .. } = &message {
                        let n = events.len() as u64;
                        sinks.iter().for_each(|c| {
                            add(&c.watch_messages, 1);
                            add(&c.watch_events, n);
                        });
                    }
                    if tx.send(message).await.is_err() {
                        return;
                    }
                }
            }
            .in_current_span(),
        );
        Watch { rx }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_registry::kv::{MemKv, TxnOp};

    const PREFIX: &str = "/p/";

    fn put(key: &str) -> TxnOp {
        TxnOp::Put {
            key: key.to_owned(),
            value: b"v".to_vec(),
            lease: None,
        }
    }

    #[tokio::test]
    async fn counts_requests_by_method_and_class_and_writes_by_op() {
        let counters = Counters::new();
        let kv = counting(MemKv::new(), PREFIX, vec![counters.clone()]);
        let txn = Txn {
            compares: vec![],
            success: vec![put("/p/file/abc"), put("/p/unit/a.service")],
            failure: vec![],
        };
        kv.txn(txn).await.unwrap();
        kv.range("/p/schedule/m1/", true, None).await.unwrap();
        let t = counters.tally();
        assert_eq!(t.requests(Method::Txn, Class::Unit), 1);
        assert_eq!(t.requests(Method::Range, Class::Schedule), 1);
        assert_eq!(t.writes(Class::File), 1);
        assert_eq!(t.writes(Class::Unit), 1);
        assert_eq!(t.total(), 2);
        assert_eq!(t.all_writes(), 2);
    }

    #[tokio::test]
    async fn counts_the_events_its_watches_deliver() {
        let counters = Counters::new();
        let kv = counting(MemKv::new(), PREFIX, vec![counters.clone()]);
        let mut watch = kv.watch("/p/unit-state/", true, 1).await.unwrap();
        let txn = Txn {
            compares: vec![],
            success: vec![put("/p/unit-state/m1/a"), put("/p/unit-state/m1/b")],
            failure: vec![],
        };
        kv.txn(txn).await.unwrap();
        let msg = watch.rx.recv().await.unwrap();
        assert!(matches!(msg, WatchMessage::Events { ref events, .. } if events.len() == 2));
        assert_eq!(counters.tally().watch_events, 2);
        assert_eq!(counters.tally().method(Method::Watch), 1);
    }

    #[tokio::test]
    async fn counts_a_keep_alive_of_an_expired_lease_as_a_lease_lost() {
        let counters = Counters::new();
        let kv = counting(MemKv::new(), PREFIX, vec![counters.clone()]);
        let lease = kv.grant(Duration::from_secs(5)).await.unwrap();
        kv.revoke(lease).await.unwrap();
        assert!(kv.keep_alive(lease).await.is_err());
        let t = counters.tally();
        assert_eq!((t.errors, t.leases_lost, t.timeouts), (1, 1, 0));
    }

    #[test]
    fn a_difference_of_tallies_is_what_happened_in_between() {
        let counters = Counters::new();
        let before = counters.tally();
        add(&counters.requests[0][0], 3);
        let diff = counters.tally() - before;
        assert_eq!(diff.total(), 3);
    }
}
