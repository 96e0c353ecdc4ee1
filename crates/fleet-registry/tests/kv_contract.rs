//! The `Kv` contract: every body here runs against `MemKv` (on paused time) and against a
//! real throwaway etcd, so the in-memory model cannot drift from etcd. A last group of tests
//! covers what only a real server can show: unreachable endpoints, a killed server, a restart.
//!
//! Run with `cargo test -p fleet-registry --features test-etcd`.
#![cfg(feature = "test-etcd")]

use std::future::Future;
use std::time::Duration;

use fleet_registry::kv::{
    CmpOp, CmpTarget, Compare, EtcdKv, Event, EventKind, KeyValue, Kv, KvError, LeaseId,
    MAX_TXN_OPS, MemKv, RANGE_PAGE, Read, Revision, Txn, TxnOp, TxnOpResponse, TxnResult, Watch,
    WatchMessage,
};
use fleet_testing::TestEtcd;
use tokio::time::{Instant, sleep, timeout};

/// What a test body needs beyond the `Kv` itself: the test-only knobs of each side.
trait Harness {
    type K: Kv;
    fn kv(&self) -> Self::K;
    fn compact(&self, revision: Revision) -> impl Future<Output = ()>;
    /// Watches the store is serving right now.
    fn watchers(&self) -> impl Future<Output = u64>;
}

struct MemHarness(MemKv);

impl Harness for MemHarness {
    type K = MemKv;
    fn kv(&self) -> MemKv {
        self.0.clone()
    }
    async fn compact(&self, revision: Revision) {
        self.0.compact(revision).expect("compaction");
    }
    async fn watchers(&self) -> u64 {
        self.0.watcher_count() as u64
    }
}

/// What a page of a prefix read after the first aims at in these tests.
const TEST_PAGE_BYTES: usize = 4 << 20;

struct EtcdHarness {
    server: TestEtcd,
    kv: EtcdKv,
}

impl EtcdHarness {
    async fn start() -> EtcdHarness {
        let server = TestEtcd::start().await;
        // Pages of 4 MiB after the first, so that the few MiB these tests write take
        // several (this client's 5 s deadline would make them 16 MiB).
        let kv = server.kv().await.with_page_bytes(TEST_PAGE_BYTES);
        EtcdHarness { server, kv }
    }
}

impl Harness for EtcdHarness {
    type K = EtcdKv;
    fn kv(&self) -> EtcdKv {
        self.kv.clone()
    }
    async fn compact(&self, revision: Revision) {
        self.server.compact(revision).await;
    }
    async fn watchers(&self) -> u64 {
        self.server.watcher_count().await
    }
}

/// Generates `mem::<test>` and `etcd::<test>` for each body `async fn <test>(h, prefix)`.
macro_rules! contract_tests {
    ($($name:ident),* $(,)?) => {
        mod mem {
            $(
                #[tokio::test(start_paused = true)]
                async fn $name() {
                    let h = super::MemHarness(fleet_registry::kv::MemKv::new());
                    super::$name(&h, concat!(stringify!($name), "/")).await;
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test]
                async fn $name() {
                    let h = super::EtcdHarness::start().await;
                    super::$name(&h, concat!(stringify!($name), "/")).await;
                }
            )*
        }
    };
}

contract_tests!(
    reads_keys_under_a_prefix_sorted_by_key,
    reads_a_range_as_of_an_old_revision,
    refuses_reads_at_a_future_revision,
    reads_keys_and_bounded_intervals_at_one_revision,
    creates_if_absent_only_once,
    swaps_on_mod_revision_only_while_unchanged,
    compares_an_empty_prefix_as_an_absent_key,
    fails_a_value_compare_on_an_absent_key,
    returns_failure_branch_reads,
    deletes_a_prefix_and_counts_the_keys,
    bumps_the_revision_once_per_changing_write,
    refuses_a_transaction_that_writes_a_key_twice,
    refuses_a_put_on_an_unknown_lease,
    deletes_lease_keys_on_revoke,
    rewriting_a_key_without_its_lease_detaches_it,
    ignores_revoking_an_unknown_lease,
    deletes_lease_keys_on_expiry,
    keep_alive_keeps_a_key_alive,
    keep_alive_on_a_revoked_lease_is_lease_not_found,
    watch_replays_history_then_streams_live_events,
    watch_of_one_key_ignores_its_siblings,
    watch_from_a_compacted_revision_reports_compacted,
    dropping_a_watch_stops_it,
    reads_more_than_a_page_at_one_revision,
    reads_a_prefix_spread_over_its_key_space_in_key_order,
    hands_a_prefix_over_in_batches_at_one_revision,
    reads_more_than_4_mib_of_values,
    watches_a_revision_of_more_than_4_mib,
);

// ---- helpers ----

const WAIT: Duration = Duration::from_secs(10);

fn put_op(key: &str, value: &str, lease: Option<LeaseId>) -> TxnOp {
    TxnOp::Put {
        key: key.to_owned(),
        value: value.as_bytes().to_vec(),
        lease,
    }
}

fn writes(ops: Vec<TxnOp>) -> Txn {
    Txn {
        success: ops,
        ..Txn::default()
    }
}

async fn put(kv: &impl Kv, key: &str, value: &str) -> Revision {
    let result = kv.txn(writes(vec![put_op(key, value, None)])).await;
    result.expect("put").revision
}

async fn get(kv: &impl Kv, key: &str) -> Option<KeyValue> {
    let mut kvs = kv.range(key, false, None).await.expect("get").kvs;
    assert!(kvs.len() <= 1);
    kvs.pop()
}

async fn current_revision(kv: &impl Kv) -> Revision {
    kv.range("\u{1}nothing", false, None)
        .await
        .expect("range")
        .revision
}

fn keys(kvs: &[KeyValue]) -> Vec<&str> {
    kvs.iter().map(|kv| kv.key.as_str()).collect()
}

/// Polls `condition` until it holds; panics after `within`.
async fn wait_for<F, Fut>(what: &str, within: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        sleep(Duration::from_millis(50)).await;
    }
}

async fn next_message(watch: &mut Watch) -> Option<WatchMessage> {
    timeout(WAIT, watch.rx.recv())
        .await
        .expect("a watch message in time")
}

/// Collects `count` events, checking each message's revision is its last event's.
async fn next_events(watch: &mut Watch, count: usize) -> Vec<Event> {
    let mut events = Vec::new();
    while events.len() < count {
        match next_message(watch).await {
            Some(WatchMessage::Events {
                revision,
                events: batch,
            }) => {
                assert_eq!(revision, batch.last().expect("non-empty").kv.mod_revision);
                events.extend(batch);
            }
            other => panic!("expected events, got {other:?}"),
        }
    }
    assert_eq!(events.len(), count, "{events:?}");
    events
}

fn deletion(key: &str, revision: Revision) -> Event {
    Event {
        kind: EventKind::Delete,
        kv: KeyValue {
            key: key.to_owned(),
            value: Vec::new(),
            create_revision: 0,
            mod_revision: revision,
            version: 0,
            lease: 0,
        },
    }
}

// ---- bodies ----

async fn reads_keys_under_a_prefix_sorted_by_key(h: &impl Harness, p: &str) {
    let kv = h.kv();
    for k in ["b", "a/x", "c", "a"] {
        put(&kv, &format!("{p}{k}"), k).await;
    }
    put(&kv, &format!("{p}\u{7f}"), "z").await;
    put(&kv, &p[..p.len() - 1], "outside").await;
    let all = kv.range(p, true, None).await.unwrap();
    let expected: Vec<String> = ["a", "a/x", "b", "c", "\u{7f}"]
        .iter()
        .map(|k| format!("{p}{k}"))
        .collect();
    assert_eq!(keys(&all.kvs), expected);
    assert_eq!(all.revision, current_revision(&kv).await);
    let b = get(&kv, &format!("{p}b")).await.unwrap();
    assert_eq!(b.value, b"b");
    assert_eq!((b.version, b.lease), (1, 0));
    assert_eq!(b.create_revision, b.mod_revision);
    assert!(get(&kv, &format!("{p}missing")).await.is_none());
}

async fn reads_a_range_as_of_an_old_revision(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let (a, b) = (format!("{p}a"), format!("{p}b"));
    let first = put(&kv, &a, "1").await;
    put(&kv, &a, "2").await;
    put(&kv, &b, "1").await;
    let latest = kv.txn(writes(vec![TxnOp::Delete {
        key: a.clone(),
        prefix: false,
    }]));
    let latest = latest.await.unwrap().revision;

    let old = kv.range(p, true, Some(first)).await.unwrap();
    // The header is the store's current revision even for a read in the past.
    assert_eq!(old.revision, latest);
    assert_eq!(keys(&old.kvs), [a.as_str()]);
    assert_eq!(old.kvs[0].value, b"1");
    assert_eq!(old.kvs[0].mod_revision, first);
    let now = kv.range(p, true, Some(latest)).await.unwrap();
    assert_eq!(keys(&now.kvs), [b.as_str()]);
}

async fn refuses_reads_at_a_future_revision(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let rev = put(&kv, &format!("{p}a"), "1").await;
    let err = kv.range(p, true, Some(rev + 10)).await.unwrap_err();
    assert!(
        matches!(&err, KvError::Refused(m) if m.contains("future revision")),
        "{err}"
    );
}

async fn reads_keys_and_bounded_intervals_at_one_revision(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let key = |s: &str| format!("{p}{s}");
    let end = format!("{}0", p.trim_end_matches('/'));
    for k in ["a", "b", "c", "d"] {
        put(&kv, &key(k), "1").await;
    }
    let first = current_revision(&kv).await;
    put(&kv, &key("a"), "2").await;
    kv.txn(writes(vec![TxnOp::Delete {
        key: key("b"),
        prefix: false,
    }]))
    .await
    .unwrap();
    let latest = put(&kv, &key("e"), "1").await;

    let reads = [
        Read::key(key("a")),
        Read::key(key("missing")),
        // From just after `a`, two keys.
        Read::interval(format!("{}\0", key("a")), end.clone(), 2),
        Read::interval(key(""), end.clone(), 0),
        // An interval that ends before it starts holds nothing.
        Read::interval(key("c"), key("a"), 0),
    ];
    let old = kv.read(&reads, Some(first)).await.unwrap();
    // The header is the store's current revision even for a read in the past.
    assert_eq!(old.revision, latest);
    let found: Vec<Vec<&str>> = old.found.iter().map(|kvs| keys(kvs)).collect();
    assert_eq!(
        found,
        [
            vec![key("a").as_str()],
            vec![],
            vec![key("b").as_str(), key("c").as_str()],
            vec![&key("a"), &key("b"), &key("c"), &key("d")],
            vec![],
        ]
    );
    assert_eq!(old.found[0][0].value, b"1");

    let now = kv.read(&reads, None).await.unwrap();
    assert_eq!(now.revision, latest);
    assert_eq!(now.found[0][0].value, b"2");
    assert_eq!(keys(&now.found[2]), [key("c"), key("d")]);
    assert_eq!(now.found[3].len(), 4, "a, c, d, e");

    let too_many: Vec<Read> = (0..=MAX_TXN_OPS)
        .map(|i| Read::key(key(&i.to_string())))
        .collect();
    let err = kv.read(&too_many, None).await.unwrap_err();
    assert!(
        matches!(&err, KvError::Refused(m) if m.contains("too many operations")),
        "{err}"
    );

    h.compact(latest).await;
    let err = kv.read(&reads, Some(first)).await.unwrap_err();
    assert!(
        matches!(err, KvError::Compacted { requested, .. } if requested == first),
        "{err}"
    );
}

async fn creates_if_absent_only_once(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let key = format!("{p}k");
    let create = |value: &str| Txn {
        compares: vec![Compare::absent(&key)],
        success: vec![put_op(&key, value, None)],
        failure: vec![],
    };
    assert!(kv.txn(create("first")).await.unwrap().succeeded);
    let second = kv.txn(create("second")).await.unwrap();
    assert!(!second.succeeded);
    assert!(second.responses.is_empty());
    assert_eq!(get(&kv, &key).await.unwrap().value, b"first");
}

async fn swaps_on_mod_revision_only_while_unchanged(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let key = format!("{p}k");
    let read_at = put(&kv, &key, "1").await;
    let cas = |value: &str| Txn {
        compares: vec![Compare::mod_revision(&key, read_at)],
        success: vec![put_op(&key, value, None)],
        failure: vec![],
    };
    let swapped = kv.txn(cas("2")).await.unwrap();
    assert!(swapped.succeeded);
    assert_eq!(swapped.responses, [TxnOpResponse::Put]);
    assert!(!kv.txn(cas("3")).await.unwrap().succeeded);
    let now = get(&kv, &key).await.unwrap();
    assert_eq!((now.value.as_slice(), now.version), (&b"2"[..], 2));
    assert_eq!(now.create_revision, read_at);
    // An absent key has mod revision 0.
    let absent = Compare::mod_revision(format!("{p}none"), 0);
    let txn = Txn {
        compares: vec![absent],
        ..Txn::default()
    };
    assert!(kv.txn(txn).await.unwrap().succeeded);
}

async fn compares_an_empty_prefix_as_an_absent_key(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let dir = format!("{p}dir/");
    let check = |c: Compare| Txn {
        compares: vec![c],
        ..Txn::default()
    };
    assert!(
        kv.txn(check(Compare::prefix_empty(&dir)))
            .await
            .unwrap()
            .succeeded
    );
    let version_zero = Compare {
        key: dir.clone(),
        prefix: true,
        op: CmpOp::Equal,
        target: CmpTarget::Version(0),
    };
    assert!(kv.txn(check(version_zero.clone())).await.unwrap().succeeded);

    put(&kv, &format!("{dir}a"), "1").await;
    assert!(
        !kv.txn(check(Compare::prefix_empty(&dir)))
            .await
            .unwrap()
            .succeeded
    );
    assert!(!kv.txn(check(version_zero)).await.unwrap().succeeded);
    // Every key of a prefix must satisfy the compare.
    put(&kv, &format!("{dir}b"), "1").await;
    put(&kv, &format!("{dir}b"), "2").await;
    let all_version_one = |op| Compare {
        key: dir.clone(),
        prefix: true,
        op,
        target: CmpTarget::Version(1),
    };
    assert!(
        !kv.txn(check(all_version_one(CmpOp::Equal)))
            .await
            .unwrap()
            .succeeded
    );
    assert!(
        !kv.txn(check(all_version_one(CmpOp::Greater)))
            .await
            .unwrap()
            .succeeded
    );
    let below_three = Compare {
        op: CmpOp::Less,
        target: CmpTarget::Version(3),
        ..all_version_one(CmpOp::Less)
    };
    assert!(kv.txn(check(below_three)).await.unwrap().succeeded);
    // A key next to the prefix is not under it.
    assert!(
        kv.txn(check(Compare::prefix_empty(format!("{p}di/"))))
            .await
            .unwrap()
            .succeeded
    );
}

async fn fails_a_value_compare_on_an_absent_key(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let key = format!("{p}k");
    let check = |c: Compare| Txn {
        compares: vec![c],
        ..Txn::default()
    };
    assert!(
        !kv.txn(check(Compare::value(&key, "")))
            .await
            .unwrap()
            .succeeded
    );
    let not_equal = Compare {
        op: CmpOp::NotEqual,
        ..Compare::value(&key, "x")
    };
    assert!(!kv.txn(check(not_equal.clone())).await.unwrap().succeeded);
    put(&kv, &key, "v").await;
    assert!(
        kv.txn(check(Compare::value(&key, "v")))
            .await
            .unwrap()
            .succeeded
    );
    assert!(kv.txn(check(not_equal)).await.unwrap().succeeded);
    let greater = Compare {
        op: CmpOp::Greater,
        ..Compare::value(&key, "u")
    };
    assert!(kv.txn(check(greater)).await.unwrap().succeeded);
    let no_lease = Compare {
        key: key.clone(),
        prefix: false,
        op: CmpOp::Equal,
        target: CmpTarget::Lease(0),
    };
    assert!(kv.txn(check(no_lease)).await.unwrap().succeeded);
}

async fn returns_failure_branch_reads(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let key = format!("{p}k");
    put(&kv, &key, "held").await;
    put(&kv, &format!("{p}k2"), "also").await;
    let txn = Txn {
        compares: vec![Compare::absent(&key)],
        success: vec![put_op(&key, "mine", None)],
        failure: vec![
            TxnOp::Get {
                key: key.clone(),
                prefix: false,
            },
            TxnOp::Get {
                key: p.to_owned(),
                prefix: true,
            },
            TxnOp::Get {
                key: format!("{p}none"),
                prefix: false,
            },
        ],
    };
    let result = kv.txn(txn).await.unwrap();
    assert!(!result.succeeded);
    let [
        TxnOpResponse::Get(one),
        TxnOpResponse::Get(all),
        TxnOpResponse::Get(none),
    ] = result.responses.as_slice()
    else {
        panic!("three reads expected: {:?}", result.responses);
    };
    assert_eq!(one, &[get(&kv, &key).await.unwrap()]);
    assert_eq!(keys(all), [key.clone(), format!("{p}k2")]);
    assert!(none.is_empty());
}

async fn deletes_a_prefix_and_counts_the_keys(h: &impl Harness, p: &str) {
    let kv = h.kv();
    for k in ["d/a", "d/b", "d/c/d", "e"] {
        put(&kv, &format!("{p}{k}"), "v").await;
    }
    let delete = |key: String, prefix| {
        writes(vec![
            TxnOp::Delete { key, prefix },
            TxnOp::Get {
                key: p.to_owned(),
                prefix: true,
            },
        ])
    };
    let result = kv.txn(delete(format!("{p}d/"), true)).await.unwrap();
    // A read after a delete in the same transaction sees the delete.
    let [TxnOpResponse::Delete(3), TxnOpResponse::Get(left)] = result.responses.as_slice() else {
        panic!("unexpected responses {:?}", result.responses);
    };
    assert_eq!(keys(left), [format!("{p}e")]);
    let again = kv.txn(delete(format!("{p}d/"), true)).await.unwrap();
    assert_eq!(again.responses[0], TxnOpResponse::Delete(0));
    let single = kv.txn(delete(format!("{p}e"), false)).await.unwrap();
    assert_eq!(single.responses[0], TxnOpResponse::Delete(1));
}

async fn bumps_the_revision_once_per_changing_write(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let start = current_revision(&kv).await;
    let (a, b) = (format!("{p}a"), format!("{p}b"));
    assert_eq!(put(&kv, &a, "1").await, start + 1);

    let two = kv.txn(writes(vec![put_op(&a, "2", None), put_op(&b, "1", None)]));
    assert_eq!(two.await.unwrap().revision, start + 2);
    let (ka, kb) = (get(&kv, &a).await.unwrap(), get(&kv, &b).await.unwrap());
    assert_eq!((ka.mod_revision, kb.mod_revision), (start + 2, start + 2));

    let unchanged = [
        Txn::default(),
        writes(vec![TxnOp::Get {
            key: a.clone(),
            prefix: false,
        }]),
        Txn {
            compares: vec![Compare::absent(&a)],
            success: vec![put_op(&a, "3", None)],
            failure: vec![],
        },
        writes(vec![TxnOp::Delete {
            key: format!("{p}none"),
            prefix: true,
        }]),
    ];
    for txn in unchanged {
        let result: TxnResult = kv.txn(txn.clone()).await.unwrap();
        assert_eq!(result.revision, start + 2, "{txn:?}");
    }
    // Rewriting a value unchanged is still a write.
    assert_eq!(put(&kv, &b, "1").await, start + 3);
}

async fn refuses_a_transaction_that_writes_a_key_twice(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let key = format!("{p}k");
    let start = current_revision(&kv).await;
    let twice = writes(vec![put_op(&key, "1", None), put_op(&key, "2", None)]);
    let err = kv.txn(twice).await.unwrap_err();
    assert!(
        matches!(&err, KvError::Refused(m) if m.contains("duplicate key")),
        "{err}"
    );
    // Checked on both branches, whichever the compares pick.
    let in_deleted_range = Txn {
        compares: vec![],
        success: vec![],
        failure: vec![
            TxnOp::Delete {
                key: p.to_owned(),
                prefix: true,
            },
            put_op(&key, "1", None),
        ],
    };
    let err = kv.txn(in_deleted_range).await.unwrap_err();
    assert!(matches!(err, KvError::Refused(_)), "{err}");
    assert_eq!(current_revision(&kv).await, start);
}

async fn refuses_a_put_on_an_unknown_lease(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let lease = kv.grant(Duration::from_secs(30)).await.unwrap();
    kv.revoke(lease).await.unwrap();
    let err = kv
        .txn(writes(vec![put_op(&format!("{p}k"), "v", Some(lease))]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, KvError::LeaseNotFound(l) if l == lease),
        "{err}"
    );
}

async fn deletes_lease_keys_on_revoke(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let lease = kv.grant(Duration::from_secs(30)).await.unwrap();
    let (a, b, c) = (format!("{p}a"), format!("{p}b"), format!("{p}c"));
    kv.txn(writes(vec![
        put_op(&b, "1", Some(lease)),
        put_op(&a, "1", Some(lease)),
    ]))
    .await
    .unwrap();
    put(&kv, &c, "no lease").await;
    assert_eq!(get(&kv, &a).await.unwrap().lease, lease.0);
    let mut watch = kv.watch(p, true, 0).await.unwrap();
    let before = current_revision(&kv).await;

    kv.revoke(lease).await.unwrap();
    let events = next_events(&mut watch, 2).await;
    // One revision, keys in order.
    assert_eq!(events, [deletion(&a, before + 1), deletion(&b, before + 1)]);
    assert_eq!(
        keys(&kv.range(p, true, None).await.unwrap().kvs),
        [c.as_str()]
    );
    assert_eq!(current_revision(&kv).await, before + 1);
}

async fn rewriting_a_key_without_its_lease_detaches_it(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let (a, b) = (format!("{p}a"), format!("{p}b"));
    let lease = kv.grant(Duration::from_secs(30)).await.unwrap();
    let leased = writes(vec![
        put_op(&a, "1", Some(lease)),
        put_op(&b, "1", Some(lease)),
    ]);
    kv.txn(leased).await.unwrap();
    put(&kv, &a, "2").await;
    assert_eq!(get(&kv, &a).await.unwrap().lease, 0);
    kv.revoke(lease).await.unwrap();
    assert_eq!(
        keys(&kv.range(p, true, None).await.unwrap().kvs),
        [a.as_str()]
    );
}

async fn ignores_revoking_an_unknown_lease(h: &impl Harness, _p: &str) {
    let kv = h.kv();
    let lease = kv.grant(Duration::from_secs(30)).await.unwrap();
    kv.revoke(lease).await.unwrap();
    kv.revoke(lease).await.unwrap();
}

async fn deletes_lease_keys_on_expiry(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let key = format!("{p}k");
    let lease = kv.grant(Duration::from_secs(2)).await.unwrap();
    kv.txn(writes(vec![put_op(&key, "v", Some(lease))]))
        .await
        .unwrap();
    let mut watch = kv.watch(p, true, 0).await.unwrap();
    let granted = Instant::now();

    // etcd checks for expired leases every 500 ms and revokes through raft.
    wait_for(
        "the leased key to expire",
        Duration::from_secs(5),
        || async { get(&kv, &key).await.is_none() },
    )
    .await;
    assert!(granted.elapsed() >= Duration::from_millis(1500));
    let events = next_events(&mut watch, 1).await;
    assert_eq!(events[0].kind, EventKind::Delete);
    assert_eq!(events[0].kv.key, key);
    let err = kv.keep_alive(lease).await.unwrap_err();
    assert!(
        matches!(err, KvError::LeaseNotFound(l) if l == lease),
        "{err}"
    );
}

async fn keep_alive_keeps_a_key_alive(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let key = format!("{p}k");
    let lease = kv.grant(Duration::from_secs(2)).await.unwrap();
    kv.txn(writes(vec![put_op(&key, "v", Some(lease))]))
        .await
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        sleep(Duration::from_millis(500)).await;
        kv.keep_alive(lease).await.unwrap();
    }
    assert!(get(&kv, &key).await.is_some());
}

async fn keep_alive_on_a_revoked_lease_is_lease_not_found(h: &impl Harness, _p: &str) {
    let kv = h.kv();
    let lease = kv.grant(Duration::from_secs(30)).await.unwrap();
    kv.keep_alive(lease).await.unwrap();
    kv.revoke(lease).await.unwrap();
    let err = kv.keep_alive(lease).await.unwrap_err();
    assert!(
        matches!(err, KvError::LeaseNotFound(l) if l == lease),
        "{err}"
    );
}

async fn watch_replays_history_then_streams_live_events(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let (a, b) = (format!("{p}a"), format!("{p}b"));
    put(&kv, &format!("{p}before"), "ignored").await;
    let from = put(&kv, &a, "1").await;
    put(&kv, "elsewhere", "ignored").await;
    put(&kv, &b, "1").await;

    let mut watch = kv.watch(p, true, from).await.unwrap();
    let replayed = next_events(&mut watch, 2).await;
    assert_eq!(
        keys(&[replayed[0].kv.clone(), replayed[1].kv.clone()]),
        [&a, &b]
    );
    assert_eq!(replayed[0].kv.mod_revision, from);
    assert!(replayed.iter().all(|e| e.kind == EventKind::Put));

    put(&kv, &a, "2").await;
    let deleted = kv.txn(writes(vec![TxnOp::Delete {
        key: b.clone(),
        prefix: false,
    }]));
    let deleted = deleted.await.unwrap().revision;
    let live = next_events(&mut watch, 2).await;
    assert_eq!(live[0].kind, EventKind::Put);
    assert_eq!(live[0].kv, get(&kv, &a).await.unwrap());
    assert_eq!(live[1], deletion(&b, deleted));
}

async fn watch_of_one_key_ignores_its_siblings(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let key = format!("{p}k");
    let mut watch = kv.watch(&key, false, 0).await.unwrap();
    put(&kv, &format!("{p}k2"), "sibling").await;
    put(&kv, &format!("{p}j"), "sibling").await;
    let rev = put(&kv, &key, "mine").await;
    let events = next_events(&mut watch, 1).await;
    assert_eq!(
        (events[0].kv.key.as_str(), events[0].kv.mod_revision),
        (key.as_str(), rev)
    );
}

async fn watch_from_a_compacted_revision_reports_compacted(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let key = format!("{p}k");
    let first = put(&kv, &key, "1").await;
    put(&kv, &key, "2").await;
    let compacted = put(&kv, &key, "3").await;
    h.compact(compacted).await;

    let mut watch = kv.watch(&key, false, first).await.unwrap();
    assert_eq!(
        next_message(&mut watch).await,
        Some(WatchMessage::Compacted {
            compact_revision: compacted
        })
    );
    assert_eq!(next_message(&mut watch).await, None);

    let err = kv.range(&key, false, Some(first)).await.unwrap_err();
    assert!(
        matches!(err, KvError::Compacted { requested, compacted: c } if requested == first && c == compacted),
        "{err}"
    );
    // The compaction point itself is still readable, and watchable.
    let at = kv.range(&key, false, Some(compacted)).await.unwrap();
    assert_eq!(at.kvs[0].value, b"3");
    let mut watch = kv.watch(&key, false, compacted).await.unwrap();
    assert_eq!(
        next_events(&mut watch, 1).await[0].kv.mod_revision,
        compacted
    );
}

async fn dropping_a_watch_stops_it(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let before = h.watchers().await;
    let mut watch = kv.watch(p, true, 0).await.unwrap();
    put(&kv, &format!("{p}a"), "1").await;
    next_events(&mut watch, 1).await;
    wait_for("the watch to be served", WAIT, || async {
        h.watchers().await == before + 1
    })
    .await;
    drop(watch);
    wait_for("the watch to be cancelled", WAIT, || async {
        h.watchers().await == before
    })
    .await;
    // The store goes on as before.
    put(&kv, &format!("{p}a"), "2").await;
}

/// Writes `count` keys `<p><i:05>` with value `v<i>`, as many per transaction as etcd takes.
async fn put_many(kv: &impl Kv, p: &str, count: usize) -> Revision {
    let mut revision = 0;
    let keys: Vec<usize> = (0..count).collect();
    for chunk in keys.chunks(100) {
        let ops = chunk
            .iter()
            .map(|i| put_op(&format!("{p}{i:05}"), &format!("v{i}"), None))
            .collect();
        revision = kv.txn(writes(ops)).await.expect("put many").revision;
    }
    revision
}

/// Just under 1 MiB (fleet's largest unit file), with `tag` in it so values differ.
fn big_value(tag: usize) -> String {
    let mut value = format!("{tag:08}");
    value.push_str(&"x".repeat((1 << 20) - 64));
    value
}

async fn reads_more_than_a_page_at_one_revision(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let count = 2 * RANGE_PAGE + 7;
    let written = put_many(&kv, p, count).await;
    // Changed after the read's revision: invisible to a read at `written`.
    let later = put(&kv, &format!("{p}00000"), "changed").await;
    put(&kv, &format!("{p}99999"), "added").await;

    let old = kv.range(p, true, Some(written)).await.unwrap();
    assert_eq!(old.kvs.len(), count);
    let expected: Vec<String> = (0..count).map(|i| format!("{p}{i:05}")).collect();
    assert_eq!(keys(&old.kvs), expected);
    assert_eq!(old.kvs[0].value, b"v0");
    assert!(old.kvs.iter().all(|kv| kv.mod_revision <= written));

    let now = kv.range(p, true, None).await.unwrap();
    assert_eq!(now.kvs.len(), count + 1);
    assert_eq!(now.revision, later + 1);
    assert_eq!(now.kvs[0].value, b"changed");
    assert_eq!(now.kvs[count].key, format!("{p}99999"));
    // A neighbouring prefix is not read into this one.
    put(&kv, &format!("{}0", &p[..p.len() - 1]), "outside").await;
    assert_eq!(kv.range(p, true, None).await.unwrap().kvs.len(), count + 1);
}

/// The keys of [`reads_a_prefix_spread_over_its_key_space_in_key_order`], after the prefix:
/// a first page's worth below "4", then keys on both sides of, and exactly at, every cut
/// `EtcdKv` makes in the rest of a prefix read ("4", "8", "c", "i", "p"), hex machine IDs,
/// unit names, upper case, punctuation, and more than a page of 16 KiB values in one interval.
fn spread_keys() -> Vec<String> {
    let mut keys: Vec<String> = (0..RANGE_PAGE + 20).map(|i| format!("0{i:05}")).collect();
    for first in "123456789ABCXZ_abcdhijopqz~".chars() {
        keys.extend((0..15).map(|i| format!("{first}{i:03}")));
    }
    keys.extend(["4", "8", "c", "i", "p"].map(String::from));
    keys.extend((0..300).map(|i| format!("a{i:05}.service")));
    keys.sort();
    keys
}

/// The value [`put_spread`] writes at `key`: the key, then `len` bytes.
fn spread_value(key: &str, len: usize) -> String {
    format!("{key}:{}", "x".repeat(len))
}

/// Writes every key of [`spread_keys`] under `p`, each with its [`spread_value`] of `len`
/// bytes, `per_txn` a transaction (etcd takes at most 1.5 MiB a request); the revision of
/// the last write.
async fn put_spread(kv: &impl Kv, p: &str, len: usize, per_txn: usize) -> Revision {
    let mut written = 0;
    for chunk in spread_keys().chunks(per_txn) {
        let ops = chunk
            .iter()
            .map(|k| put_op(&format!("{p}{k}"), &spread_value(k, len), None))
            .collect();
        written = kv.txn(writes(ops)).await.expect("put spread keys").revision;
    }
    written
}

async fn reads_a_prefix_spread_over_its_key_space_in_key_order(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let names = spread_keys();
    let value = |key: &str| spread_value(key, 16 << 10);
    let written = put_spread(&kv, p, 16 << 10, 50).await;
    // After the read's revision, in the middle of an interval and at a cut.
    put(&kv, &format!("{p}a00150.service"), "changed").await;
    kv.txn(writes(vec![TxnOp::Delete {
        key: format!("{p}i"),
        prefix: false,
    }]))
    .await
    .unwrap();
    put(&kv, &format!("{}0", &p[..p.len() - 1]), "outside").await;

    let old = kv.range(p, true, Some(written)).await.unwrap();
    let expected: Vec<String> = names.iter().map(|k| format!("{p}{k}")).collect();
    assert_eq!(keys(&old.kvs), expected, "every key once, in key order");
    for (read, key) in old.kvs.iter().zip(&names) {
        assert_eq!(read.value, value(key).as_bytes(), "{key}");
    }

    let now = kv.range(p, true, None).await.unwrap();
    assert_eq!(now.kvs.len(), names.len() - 1);
    let changed = now
        .kvs
        .iter()
        .find(|kv| kv.key == format!("{p}a00150.service"))
        .unwrap();
    assert_eq!(changed.value, b"changed");
    assert!(!now.kvs.iter().any(|kv| kv.key == format!("{p}i")));
}

/// `range_each`: the keys of `range` at the same revision, each once, in batches sorted
/// within themselves; a compacted revision is refused as `range` refuses it.
async fn hands_a_prefix_over_in_batches_at_one_revision(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let names = spread_keys();
    let value = |key: &str| spread_value(key, 4 << 10);
    let written = put_spread(&kv, p, 4 << 10, 100).await;
    put(&kv, &format!("{p}a00150.service"), "changed").await;
    put(&kv, &format!("{p}zz"), "added").await;

    let mut batches: Vec<Vec<KeyValue>> = Vec::new();
    kv.range_each(p, written, |kvs| batches.push(kvs))
        .await
        .unwrap();
    for batch in &batches {
        assert!(keys(batch).is_sorted(), "a batch is in key order");
    }
    let mut read: Vec<KeyValue> = batches.into_iter().flatten().collect();
    read.sort_by(|a, b| a.key.cmp(&b.key));
    let expected: Vec<String> = names.iter().map(|k| format!("{p}{k}")).collect();
    assert_eq!(
        keys(&read),
        expected,
        "every key once, at the revision asked"
    );
    for (read, key) in read.iter().zip(&names) {
        assert_eq!(read.value, value(key).as_bytes(), "{key}");
    }
    assert_eq!(read, kv.range(p, true, Some(written)).await.unwrap().kvs);

    let now = current_revision(&kv).await;
    h.compact(now).await;
    let refused = kv.range_each(p, written, |_| {}).await;
    assert!(
        matches!(refused, Err(KvError::Compacted { requested, .. }) if requested == written),
        "{refused:?}"
    );
}

async fn reads_more_than_4_mib_of_values(h: &impl Harness, p: &str) {
    let kv = h.kv();
    // One put per transaction: etcd takes at most 1.5 MiB per request.
    for i in 0..5 {
        put(&kv, &format!("{p}big{i}"), &big_value(i)).await;
    }
    let all = kv.range(p, true, None).await.unwrap();
    assert_eq!(all.kvs.len(), 5);
    for (i, kv) in all.kvs.iter().enumerate() {
        assert_eq!(kv.value, big_value(i).as_bytes());
    }
    // The same values through a transaction's reads.
    let gets = (0..5)
        .map(|i| TxnOp::Get {
            key: format!("{p}big{i}"),
            prefix: false,
        })
        .collect();
    let res = kv.txn(writes(gets)).await.unwrap();
    assert_eq!(res.responses.len(), 5);
    for (i, response) in res.responses.iter().enumerate() {
        let TxnOpResponse::Get(kvs) = response else {
            panic!("expected a read, got {response:?}");
        };
        assert_eq!(kvs[0].value, big_value(i).as_bytes());
    }
}

async fn watches_a_revision_of_more_than_4_mib(h: &impl Harness, p: &str) {
    let kv = h.kv();
    let lease = kv.grant(Duration::from_secs(60)).await.unwrap();
    // Long keys: a revoke deletes every key in one revision, and a delete event carries its key.
    let names: Vec<String> = (0..4)
        .map(|i| format!("{p}{i}{}", "k".repeat((1 << 20) + (1 << 19) - 1024)))
        .collect();
    for name in &names {
        let put = kv.txn(writes(vec![put_op(name, "", Some(lease))])).await;
        put.expect("put a long key");
    }
    let from = current_revision(&kv).await + 1;
    let mut watch = kv.watch(p, true, from).await.unwrap();
    kv.revoke(lease).await.unwrap();
    let events = next_events(&mut watch, names.len()).await;
    assert!(events.iter().all(|e| e.kind == EventKind::Delete));
    assert!(events.iter().all(|e| e.kv.mod_revision == from));
    let deleted: Vec<&str> = events.iter().map(|e| e.kv.key.as_str()).collect();
    assert_eq!(
        deleted,
        names.iter().map(String::as_str).collect::<Vec<_>>()
    );
}

// ---- real etcd only ----

mod etcd_only {
    use std::cell::{Cell, RefCell};
    use std::collections::BTreeMap;
    use std::net::TcpListener;

    use fleet_registry::kv::{EtcdConfig, TlsFiles};

    use super::*;

    const SHORT: Duration = Duration::from_secs(1);
    /// Scheduling slack on a loaded 2-core machine.
    const MARGIN: Duration = Duration::from_millis(700);

    async fn client(endpoint: &str) -> EtcdKv {
        let cfg = EtcdConfig {
            endpoints: vec![endpoint.to_owned()],
            request_timeout: SHORT,
            tls: TlsFiles::default(),
            auth: None,
        };
        EtcdKv::connect(&cfg).await.unwrap()
    }

    /// Fails within the request timeout (plus margin), naming the endpoint.
    async fn assert_fails_fast<T: std::fmt::Debug>(
        endpoint: &str,
        call: impl Future<Output = Result<T, KvError>>,
    ) -> KvError {
        let start = Instant::now();
        let err = call.await.unwrap_err();
        let took = start.elapsed();
        assert!(took < SHORT + MARGIN, "took {took:?}: {err}");
        assert!(err.is_transient(), "{err}");
        assert!(err.to_string().contains(endpoint), "{err}");
        err
    }

    #[tokio::test]
    async fn unreachable_endpoint_fails_within_the_request_timeout() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let endpoint = format!("http://127.0.0.1:{port}");
        let kv = client(&endpoint).await;
        assert_fails_fast(&endpoint, kv.range("k", false, None)).await;
        assert_fails_fast(&endpoint, kv.txn(Txn::default())).await;
        assert_fails_fast(&endpoint, kv.grant(SHORT)).await;
        assert_fails_fast(&endpoint, kv.watch("k", true, 0)).await;
    }

    #[tokio::test]
    async fn silent_endpoint_times_out_within_the_request_timeout() {
        // Accepts connections (the kernel does) but never speaks HTTP/2.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let kv = client(&endpoint).await;
        let err = assert_fails_fast(&endpoint, kv.range("k", false, None)).await;
        assert!(matches!(
            err,
            KvError::Timeout(..) | KvError::Unavailable { .. }
        ));
        assert_fails_fast(&endpoint, kv.watch("k", true, 0)).await;
        drop(listener);
    }

    #[tokio::test]
    async fn watch_outlives_the_request_timeout() {
        let server = TestEtcd::start().await;
        let kv = client(&server.endpoint()).await;
        let mut watch = kv.watch("w/", true, 0).await.unwrap();
        sleep(SHORT * 2).await;
        let rev = put(&kv, "w/a", "1").await;
        assert_eq!(next_events(&mut watch, 1).await[0].kv.mod_revision, rev);
    }

    #[tokio::test]
    async fn killing_the_server_breaks_watches() {
        let mut server = TestEtcd::start().await;
        let kv = server.kv().await;
        let mut watch = kv.watch("w/", true, 0).await.unwrap();
        put(&kv, "w/a", "1").await;
        next_events(&mut watch, 1).await;
        server.stop();
        assert_eq!(next_message(&mut watch).await, Some(WatchMessage::Broken));
        assert_eq!(next_message(&mut watch).await, None);
    }

    #[tokio::test]
    async fn unary_calls_work_again_after_restart() {
        let mut server = TestEtcd::start().await;
        let kv = server.kv().await;
        let written = put(&kv, "r/a", "1").await;
        server.stop();
        let err = kv.range("r/a", false, None).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(err.to_string().contains(&server.endpoint()), "{err}");

        server.restart().await;
        wait_for("the client to reconnect", WAIT, || async {
            kv.range("r/a", false, None).await.is_ok()
        })
        .await;
        let kv_a = get(&kv, "r/a").await.unwrap();
        assert_eq!(kv_a.mod_revision, written);
        // Watches are not resumed by etcd-client, but new ones work.
        let mut watch = kv.watch("r/", true, written).await.unwrap();
        assert_eq!(next_events(&mut watch, 1).await[0].kv, kv_a);
    }

    /// Keys a multi-page read holds in these tests: a first page of [`RANGE_PAGE`] and, at
    /// 16 KiB a value, later pages of 256 keys, so a read takes several pages.
    const PAGED_KEYS: usize = RANGE_PAGE + 300;
    const PAGED_VALUE: usize = 16 << 10;
    /// Reads made while the writer writes.
    const PAGED_READS: usize = 20;

    fn paged_value(tag: &str) -> String {
        format!("{tag}:{}", "x".repeat(PAGED_VALUE))
    }

    /// What a concurrent writer did, in order: `(revision, key, value)`.
    type Log = RefCell<Vec<(Revision, String, String)>>;

    /// The keys under the prefix at `revision`: the initial ones, then the log up to it.
    fn state_at(
        initial: &BTreeMap<String, String>,
        log: &[(Revision, String, String)],
        revision: Revision,
    ) -> BTreeMap<String, String> {
        let mut state = initial.clone();
        for (_, key, value) in log.iter().filter(|(r, _, _)| *r <= revision) {
            state.insert(key.clone(), value.clone());
        }
        state
    }

    /// One write at a time until `done`: rewrites keys spread over every page and adds keys
    /// between them. With `compact`, each `compaction` request is served by one write and a
    /// compaction of history up to it, landing under the read in flight.
    async fn write_under_reads(
        h: &EtcdHarness,
        p: &str,
        done: &Cell<bool>,
        compaction: &Cell<bool>,
        log: &Log,
    ) {
        let kv = h.kv();
        let mut n = 0usize;
        while !done.get() {
            n += 1;
            let i = (n * 389) % PAGED_KEYS;
            let key = if n.is_multiple_of(2) {
                format!("{p}{i:05}")
            } else {
                format!("{p}{i:05}+{n}")
            };
            let value = paged_value(&format!("w{n}"));
            let revision = put(&kv, &key, &value).await;
            log.borrow_mut().push((revision, key, value));
            if compaction.replace(false) {
                h.compact(revision).await;
            }
            // Let the reader's pages interleave with the writes.
            tokio::task::yield_now().await;
        }
    }

    /// Reads the prefix [`PAGED_READS`] times while `write_under_reads` writes, and checks
    /// each result is exactly the prefix at its revision. Returns how many reads saw writes
    /// land while they were in flight.
    async fn read_under_writes(
        kv: &EtcdKv,
        p: &str,
        initial: &BTreeMap<String, String>,
        done: &Cell<bool>,
        compaction: Option<&Cell<bool>>,
        log: &Log,
    ) -> usize {
        let mut overlapped = 0;
        for _ in 0..PAGED_READS {
            let before = log.borrow().len();
            if let Some(c) = compaction {
                c.set(true);
            }
            let res = kv
                .range(p, true, None)
                .await
                .expect("a read of the present succeeds, compacted under it or not");
            let log = log.borrow();
            assert!(
                res.kvs.iter().all(|kv| kv.mod_revision <= res.revision),
                "a key newer than the read's revision {}",
                res.revision
            );
            let got: BTreeMap<String, String> = res
                .kvs
                .iter()
                .map(|kv| {
                    (
                        kv.key.clone(),
                        String::from_utf8_lossy(&kv.value).into_owned(),
                    )
                })
                .collect();
            let want = state_at(initial, &log, res.revision);
            assert!(
                got == want,
                "the read at {} is not the prefix at that revision ({} keys, want {})",
                res.revision,
                got.len(),
                want.len()
            );
            overlapped += usize::from(log[before..].iter().any(|(r, _, _)| *r > res.revision));
        }
        done.set(true);
        overlapped
    }

    async fn paged_keys(h: &EtcdHarness, p: &str) -> BTreeMap<String, String> {
        let kv = h.kv();
        let initial: BTreeMap<String, String> = (0..PAGED_KEYS)
            .map(|i| (format!("{p}{i:05}"), paged_value(&format!("v{i}"))))
            .collect();
        let all: Vec<(&String, &String)> = initial.iter().collect();
        // etcd takes at most 1.5 MiB a request.
        for chunk in all.chunks(64) {
            let ops = chunk.iter().map(|(k, v)| put_op(k, v, None)).collect();
            kv.txn(writes(ops)).await.expect("put many");
        }
        initial
    }

    #[tokio::test]
    async fn a_multi_page_read_is_one_revision_while_a_writer_rewrites_and_adds_keys() {
        let h = EtcdHarness::start().await;
        let p = "paged-writer/";
        let initial = paged_keys(&h, p).await;
        let (done, never, log) = (Cell::new(false), Cell::new(false), Log::default());
        let kv = h.kv();
        let ((), overlapped) = tokio::join!(
            write_under_reads(&h, p, &done, &never, &log),
            read_under_writes(&kv, p, &initial, &done, None, &log)
        );
        assert!(overlapped > 0, "no write landed while a read was in flight");
    }

    #[tokio::test]
    async fn a_read_of_the_present_starts_again_when_history_is_compacted_between_pages() {
        let h = EtcdHarness::start().await;
        let p = "paged-compacted/";
        let initial = paged_keys(&h, p).await;
        let (done, compaction, log) = (Cell::new(false), Cell::new(false), Log::default());
        let kv = h.kv();
        let ((), overlapped) = tokio::join!(
            write_under_reads(&h, p, &done, &compaction, &log),
            read_under_writes(&kv, p, &initial, &done, Some(&compaction), &log)
        );
        assert!(
            overlapped > 0,
            "no compaction landed while a read was in flight"
        );
    }
}
