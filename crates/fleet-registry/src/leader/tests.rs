use super::*;
use crate::kv::MemKv;
use fleet_core::{DesiredState, UnitFile};

const TTL: Duration = Duration::from_secs(10);

fn registry() -> Registry<MemKv> {
    Registry::new(MemKv::new(), "/leader-test/")
}

fn machine(s: &str) -> MachineId {
    s.parse().unwrap()
}

fn entry(unit: &str, m: &str) -> ScheduleEntry {
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/true\n").unwrap();
    ScheduleEntry {
        name: unit.parse().unwrap(),
        machine: machine(m),
        hash: file.hash(),
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    }
}

/// The leadership `id` wins on an empty key.
async fn lead<K: Kv>(reg: &Registry<K>, id: &str) -> Leadership<K> {
    EngineRole::new(reg.clone())
        .campaign(&machine(id), TTL)
        .await
        .unwrap()
        .expect("campaign won")
}

fn campaigner(reg: &Registry<MemKv>) -> EngineRole<MemKv> {
    EngineRole::new(reg.clone())
}

async fn keys_under(reg: &Registry<MemKv>, prefix: &str) -> Vec<String> {
    let res = reg.kv().range(prefix, true, None).await.unwrap();
    res.kvs.into_iter().map(|kv| kv.key).collect()
}

async fn schedule_keys(reg: &Registry<MemKv>) -> Vec<String> {
    keys_under(reg, &reg.keys().schedules()).await
}

#[tokio::test(start_paused = true)]
async fn the_first_campaign_wins_and_later_ones_lose() {
    let reg = registry();
    assert_eq!(reg.leader().await.unwrap(), None);
    let a = campaigner(&reg).campaign(&machine("a"), TTL).await.unwrap();
    assert!(a.is_some());
    assert!(
        campaigner(&reg)
            .campaign(&machine("b"), TTL)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(reg.leader().await.unwrap(), Some(machine("a")));
}

/// Issue 38, item 3: a leader key put by hand without a lease never expires; it no
/// longer stops every engine from leading forever.
#[tokio::test(start_paused = true)]
async fn a_leader_key_without_a_lease_or_a_machine_is_taken_over() {
    let reg = registry();
    let key = reg.keys().leader();
    for stray in ["ffffffffffffffffffffffffffffffff", "not a machine"] {
        let put = TxnOp::Put {
            key: key.clone(),
            value: stray.as_bytes().to_vec(),
            lease: None,
        };
        let txn = Txn {
            compares: vec![],
            success: vec![put],
            failure: vec![],
        };
        reg.kv().txn(txn).await.unwrap();
        let won = campaigner(&reg).campaign(&machine("a"), TTL).await.unwrap();
        assert!(won.is_some(), "{stray:?} held the key");
        assert_eq!(reg.leader().await.unwrap(), Some(machine("a")));
        let delete = Txn {
            compares: vec![],
            success: vec![TxnOp::Delete {
                key: key.clone(),
                prefix: false,
            }],
            failure: vec![],
        };
        reg.kv().txn(delete).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_restarted_leader_takes_its_own_key_over_and_fences_its_old_self() {
    let reg = registry();
    let old = lead(&reg, "a").await;
    let new = lead(&reg, "a").await;
    assert_ne!(old.lease, new.lease);
    let refused = old
        .write(&[EngineWrite::Schedule(entry("x.service", "a"))])
        .await;
    assert!(
        matches!(refused, Err(RegistryError::LostLeadership)),
        "{refused:?}"
    );
    assert!(matches!(
        old.check().await,
        Err(RegistryError::LostLeadership)
    ));
    new.refresh().await.unwrap();
    new.check().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn leadership_lapses_without_renewal_and_lasts_with_it() {
    let reg = registry();
    let a = lead(&reg, "a").await;
    for _ in 0..5 {
        tokio::time::sleep(TTL / 3).await;
        a.refresh().await.unwrap();
    }
    assert_eq!(reg.leader().await.unwrap(), Some(machine("a")));
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    assert_eq!(reg.leader().await.unwrap(), None);
    assert!(matches!(
        a.refresh().await,
        Err(RegistryError::LostLeadership)
    ));
    assert!(
        campaigner(&reg)
            .campaign(&machine("b"), TTL)
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(start_paused = true)]
async fn resigning_frees_the_key_at_once() {
    let reg = registry();
    let a = lead(&reg, "a").await;
    a.resign().await.unwrap();
    assert_eq!(reg.leader().await.unwrap(), None);
    assert!(
        campaigner(&reg)
            .campaign(&machine("b"), TTL)
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(start_paused = true)]
async fn a_deposed_leaders_write_is_refused_and_writes_nothing() {
    let reg = registry();
    let a = lead(&reg, "a").await;
    reg.kv().revoke(a.lease).await.unwrap();
    let b = lead(&reg, "b").await;
    let refused = a
        .write(&[EngineWrite::Schedule(entry("x.service", "a"))])
        .await;
    assert!(
        matches!(refused, Err(RegistryError::LostLeadership)),
        "{refused:?}"
    );
    assert!(schedule_keys(&reg).await.is_empty());
    b.write(&[EngineWrite::Schedule(entry("x.service", "b"))])
        .await
        .unwrap();
    assert_eq!(
        schedule_keys(&reg).await,
        ["/leader-test/schedule/b/x.service"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_key_was_deleted_loses_at_its_next_check() {
    let reg = registry();
    let a = lead(&reg, "a").await;
    let delete = Txn {
        compares: vec![],
        success: vec![TxnOp::Delete {
            key: reg.keys().leader(),
            prefix: false,
        }],
        failure: vec![],
    };
    reg.kv().txn(delete).await.unwrap();
    assert!(matches!(
        a.check().await,
        Err(RegistryError::LostLeadership)
    ));
}

/// Issue 19: the leader learns that its key was taken from a watch, not from a read
/// with every renewal; its renewals are lease calls only.
#[tokio::test(start_paused = true)]
async fn a_leader_watching_its_key_is_woken_when_the_key_is_taken() {
    let reg = registry();
    let a = lead(&reg, "a").await;
    let mut hints = a.watch().await.unwrap();
    a.refresh().await.unwrap();
    let take = Txn {
        compares: vec![],
        success: vec![TxnOp::Put {
            key: reg.keys().leader(),
            value: b"z".to_vec(),
            lease: None,
        }],
        failure: vec![],
    };
    reg.kv().txn(take).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), hints.changed())
        .await
        .expect("woken")
        .expect("watch alive");
    assert!(matches!(
        a.check().await,
        Err(RegistryError::LostLeadership)
    ));
    // The lease itself still lives: a renewal alone would not have told.
    a.refresh().await.unwrap();
}

/// Engine transactions in flight, and the order they started and ended in: `d` for a
/// transaction of deletes, `p` for one of puts (the campaign's small ones are left out).
#[derive(Debug, Clone, Default)]
struct Overlap {
    now: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    most: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(char, &'static str)>>>,
}

impl crate::kv::Hook for Overlap {
    async fn before(&self, request: crate::kv::Request<'_>) -> Result<(), KvError> {
        use std::sync::atomic::Ordering::SeqCst;
        let crate::kv::Request::Txn(txn) = request else {
            return Ok(());
        };
        if txn.success.len() < 10 {
            return Ok(());
        }
        let kind = match txn.success[0] {
            TxnOp::Delete { .. } => 'd',
            _ => 'p',
        };
        self.seen.lock().unwrap().push((kind, "start"));
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        // The round trip to etcd.
        tokio::time::sleep(Duration::from_millis(10)).await;
        self.now.fetch_sub(1, SeqCst);
        self.seen.lock().unwrap().push((kind, "end"));
        Ok(())
    }
}

/// Issue 19: a leader's writes of one kind go several at a time; a kind starts only
/// once every transaction of the kind before it (removals before placements) has landed.
#[tokio::test(start_paused = true)]
async fn writes_of_one_kind_go_several_at_once_and_kinds_in_order() {
    let kv = crate::kv::Hooked {
        inner: MemKv::new(),
        hook: Overlap::default(),
    };
    let reg = Registry::new(kv.clone(), "/leader-test/");
    let a = lead(&reg, "a").await;
    // More transactions of each kind (64 writes of two operations each) than go at once.
    let txns = WRITES_IN_FLIGHT + 2;
    let units = txns * 64;
    let mut writes: Vec<EngineWrite> = (0..units)
        .map(|i| EngineWrite::Unschedule {
            machine: machine("m0"),
            unit: format!("u{i}.service").parse().unwrap(),
        })
        .collect();
    writes.extend((0..units).map(|i| EngineWrite::Schedule(entry(&format!("u{i}.service"), "m1"))));
    a.write(&writes).await.unwrap();
    let seen = kv.hook.seen.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        2 * 2 * txns,
        "{txns} transactions of each kind: {seen:?}"
    );
    let last_delete_end = seen.iter().rposition(|e| *e == ('d', "end")).unwrap();
    let first_put_start = seen.iter().position(|e| *e == ('p', "start")).unwrap();
    assert!(last_delete_end < first_put_start, "{seen:?}");
    let most = kv.hook.most.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(most, WRITES_IN_FLIGHT, "transactions in flight at once");
    let keys = schedule_keys(&Registry::new(kv.inner.clone(), "/leader-test/")).await;
    assert_eq!(keys.len(), units);
}

#[tokio::test(start_paused = true)]
async fn writes_schedules_and_reasons_and_splits_large_batches() {
    let reg = registry();
    let a = lead(&reg, "a").await;
    let x: UnitName = "x.service".parse().unwrap();
    let mut writes: Vec<EngineWrite> = (0..300)
        .map(|i| EngineWrite::Schedule(entry(&format!("u{i}.service"), "m1")))
        .collect();
    writes.push(EngineWrite::Unschedulable {
        unit: x.clone(),
        reason: "zero machines available".into(),
    });
    let before = reg.kv().range("/", true, None).await.unwrap().revision;
    let last = a.write(&writes).await.unwrap().unwrap();
    assert_eq!(
        last - before,
        6,
        "300 schedule writes are 600 operations (a schedule and its placement each): five \
         transactions of at most 128, no schedule split from its placement; the reason, \
         of another kind, is a sixth"
    );
    assert_eq!(schedule_keys(&reg).await.len(), 300);
    let snap = reg.snapshot().await.unwrap();
    assert_eq!(snap.unscheduled[&x], "zero machines available");
    let clear = [
        EngineWrite::Unschedule {
            machine: machine("m1"),
            unit: "u0.service".parse().unwrap(),
        },
        EngineWrite::ClearUnschedulable { unit: x.clone() },
    ];
    a.write(&clear).await.unwrap();
    let snap = reg.snapshot().await.unwrap();
    assert!(snap.unscheduled.is_empty());
    assert_eq!(schedule_keys(&reg).await.len(), 299);
    assert_eq!(a.write(&[]).await.unwrap(), None);
}

/// Issue 43: a schedule entry carries its file's text when the engine passes it, and every
/// transaction stays within the bytes etcd takes even when every carried text is as long as
/// allowed and escapes at its worst (a control character is six bytes of JSON).
#[tokio::test(start_paused = true)]
async fn schedule_entries_carry_the_texts_given_within_a_transactions_bytes() {
    let reg = registry();
    let a = lead(&reg, "a").await;
    let e = entry("u.service", "m1");
    let texts: CarriedTexts = [(e.hash, "\u{1}".repeat(crate::MAX_CARRIED_TEXT))].into();
    let writes: Vec<EngineWrite> = (0..300)
        .map(|i| EngineWrite::Schedule(entry(&format!("u{i}.service"), "m1")))
        .collect();
    for txn in a.transactions(&writes, &texts) {
        let bytes: usize = txn
            .iter()
            .map(|op| match op {
                TxnOp::Put { key, value, .. } => key.len() + value.len(),
                TxnOp::Delete { key, .. } | TxnOp::Get { key, .. } => key.len(),
            })
            .sum();
        assert!(
            bytes <= crate::kv::MAX_TXN_BYTES,
            "{bytes} bytes in one transaction"
        );
    }
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/true\n").unwrap();
    let texts: CarriedTexts = [(e.hash, file.canonical())].into();
    a.write_carrying(&[EngineWrite::Schedule(e.clone())], &texts)
        .await
        .unwrap();
    let res = reg
        .kv()
        .range(&reg.keys().schedules(), true, None)
        .await
        .unwrap();
    let kv = &res.kvs[0];
    assert_eq!(crate::read::schedule_entry(reg.keys(), kv).unwrap(), e);
    assert_eq!(
        crate::carried::carried_file(&e, kv),
        crate::CarriedFile::File(file)
    );
}

async fn placement_keys(reg: &Registry<MemKv>) -> Vec<String> {
    keys_under(reg, &reg.keys().placements()).await
}

#[tokio::test(start_paused = true)]
async fn writes_and_deletes_a_placement_in_the_transaction_of_its_schedule_entry() {
    let reg = registry();
    let a = lead(&reg, "a").await;
    let before = reg.kv().range("/", true, None).await.unwrap().revision;
    let written = a
        .write(&[EngineWrite::Schedule(entry("x.service", "m1"))])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(written, before + 1, "one transaction");
    let placed = reg
        .kv()
        .range(
            &reg.keys().unit_placements(&"x.service".parse().unwrap()),
            true,
            None,
        )
        .await
        .unwrap();
    assert_eq!(placed.kvs.len(), 1);
    assert_eq!(placed.kvs[0].key, "/leader-test/placement/x.service/m1");
    assert!(placed.kvs[0].value.is_empty());
    assert_eq!(placed.kvs[0].mod_revision, written);
    a.write(&[EngineWrite::Unschedule {
        machine: machine("m1"),
        unit: "x.service".parse().unwrap(),
    }])
    .await
    .unwrap();
    assert!(placement_keys(&reg).await.is_empty());
    assert!(schedule_keys(&reg).await.is_empty());
}

/// Issue 36: the record that a unit left a machine lands with the deletion of its entry
/// there, so no leader ever sees the entry gone without the record; it says what the
/// machine had published of the copy, and is rewritten once the machine publishes it.
#[tokio::test(start_paused = true)]
async fn records_that_a_unit_left_in_the_transaction_that_unschedules_it() {
    let reg = registry();
    let a = lead(&reg, "a").await;
    let x: UnitName = "x.service".parse().unwrap();
    a.write(&[EngineWrite::Schedule(entry("x.service", "m1"))])
        .await
        .unwrap();
    let before = reg.kv().range("/", true, None).await.unwrap().revision;
    let leave = EngineWrite::Leave {
        machine: machine("m1"),
        unit: x.clone(),
        copy: LeftCopy::Unpublished,
    };
    let written = a.write(&[leave]).await.unwrap().unwrap();
    assert_eq!(written, before + 1, "one transaction");
    assert!(schedule_keys(&reg).await.is_empty());
    assert!(placement_keys(&reg).await.is_empty());
    let left = keys_under(&reg, &reg.keys().lefts()).await;
    assert_eq!(left, ["/leader-test/left/x.service/m1"]);
    let snap = reg.snapshot().await.unwrap();
    assert_eq!(snap.left[&x][&machine("m1")], LeftCopy::Unpublished);
    a.write(&[EngineWrite::Record {
        unit: x.clone(),
        machine: machine("m1"),
        copy: LeftCopy::Running,
    }])
    .await
    .unwrap();
    let snap = reg.snapshot().await.unwrap();
    assert_eq!(snap.left[&x][&machine("m1")], LeftCopy::Running);
    a.write(&[EngineWrite::Forget {
        unit: x.clone(),
        machine: machine("m1"),
    }])
    .await
    .unwrap();
    assert!(keys_under(&reg, &reg.keys().lefts()).await.is_empty());
    assert!(reg.snapshot().await.unwrap().left.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_new_leader_repairs_missing_and_stale_placements_and_then_writes_nothing() {
    let reg = registry();
    let a = lead(&reg, "a").await;
    a.write(&[
        EngineWrite::Schedule(entry("kept.service", "m1")),
        EngineWrite::Schedule(entry("lost.service", "m2")),
    ])
    .await
    .unwrap();
    // As a registry written before the mirror existed, and one edited by hand: a
    // schedule entry without its placement, a placement without its entry.
    let edit = Txn {
        compares: vec![],
        success: vec![
            TxnOp::Delete {
                key: reg
                    .keys()
                    .placement(&"lost.service".parse().unwrap(), &machine("m2")),
                prefix: false,
            },
            placement_put(
                reg.keys(),
                &"stale.service".parse().unwrap(),
                &machine("m3"),
            ),
        ],
        failure: vec![],
    };
    reg.kv().txn(edit).await.unwrap();
    let snap = reg.snapshot().await.unwrap();
    assert_eq!(a.repair_placements(&snap).await.unwrap(), 2);
    assert_eq!(
        placement_keys(&reg).await,
        [
            "/leader-test/placement/kept.service/m1",
            "/leader-test/placement/lost.service/m2"
        ]
    );
    let revision = reg.kv().range("/", true, None).await.unwrap().revision;
    assert_eq!(a.repair_placements(&snap).await.unwrap(), 0);
    let after = reg.kv().range("/", true, None).await.unwrap().revision;
    assert_eq!(after, revision, "nothing to repair writes nothing");
}

#[tokio::test(start_paused = true)]
async fn a_deposed_leader_repairs_nothing() {
    let reg = registry();
    let a = lead(&reg, "a").await;
    a.write(&[EngineWrite::Schedule(entry("x.service", "m1"))])
        .await
        .unwrap();
    let snap = reg.snapshot().await.unwrap();
    let stale = Txn {
        compares: vec![],
        success: vec![TxnOp::Delete {
            key: reg.keys().placements(),
            prefix: true,
        }],
        failure: vec![],
    };
    reg.kv().txn(stale).await.unwrap();
    a.clone().resign().await.unwrap();
    let refused = a.repair_placements(&snap).await;
    assert!(matches!(refused, Err(RegistryError::LostLeadership)));
    assert!(placement_keys(&reg).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn publishes_and_withdraws_the_disruption_notice_fenced() {
    let reg = registry();
    let a = lead(&reg, "a").await;
    assert_eq!(reg.disruption().await.unwrap(), None);
    let notice = "rescheduling held: 2 of 3 machines vanished".to_owned();
    a.write(&[EngineWrite::Disruption {
        notice: Some(notice.clone()),
    }])
    .await
    .unwrap();
    assert_eq!(reg.disruption().await.unwrap(), Some(notice));
    a.write(&[EngineWrite::Disruption { notice: None }])
        .await
        .unwrap();
    assert_eq!(reg.disruption().await.unwrap(), None);
    a.clone().resign().await.unwrap();
    let refused = a
        .write(&[EngineWrite::Disruption {
            notice: Some("x".into()),
        }])
        .await;
    assert!(matches!(refused, Err(RegistryError::LostLeadership)));
    assert_eq!(reg.disruption().await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn a_follower_is_woken_when_the_leader_key_changes() {
    let reg = registry();
    let a = lead(&reg, "a").await;
    let (leader, mut hints) = reg.watch_leader().await.unwrap();
    assert_eq!(leader, Some(machine("a")));
    a.resign().await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), hints.changed())
        .await
        .expect("woken")
        .expect("watch alive");
    assert_eq!(reg.leader().await.unwrap(), None);
}
