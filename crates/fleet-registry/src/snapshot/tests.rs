use super::*;
use crate::records::UnitRecord;
use fleet_core::{DesiredState, SystemdState, UnitFile};

fn kv(key: String, value: Vec<u8>) -> KeyValue {
    KeyValue {
        key,
        value,
        create_revision: 1,
        mod_revision: 1,
        version: 1,
        lease: 0,
    }
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap()
}

/// A unit, its machine, its schedule entry and its state, with `keys`' keys.
fn one_placed_unit(keys: &Keys) -> Vec<KeyValue> {
    let name: UnitName = "web@1.service".parse().unwrap();
    let machine: MachineId = "m1".parse().unwrap();
    let hash = UnitFile::parse(b"[Service]\nExecStart=/bin/true\n")
        .unwrap()
        .hash();
    let info = MachineInfo {
        id: machine.clone(),
        public_ip: "10.0.0.1".to_owned(),
        metadata: BTreeMap::new(),
        version: "1".to_owned(),
        disable_engine: false,
        api: String::new(),
        fence_at: None,
    };
    let record = UnitRecord {
        name: name.clone(),
        hash,
        desired: DesiredState::Launched,
        restart: 0,
        replace: Default::default(),
    };
    let entry = ScheduleEntry {
        name: name.clone(),
        machine: machine.clone(),
        hash,
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    let state = UnitStateRecord {
        name: name.clone(),
        machine: machine.clone(),
        hash: Some(hash),
        systemd: SystemdState::not_found(),
        drop_ins: Vec::new(),
        restart: 0,
        restart_pending: false,
        restarts: 0,
        since: None,
        exit: None,
    };
    [
        (keys.unit(&name), json(&record)),
        (keys.machine(&machine), json(&info)),
        (keys.schedule(&machine, &name), json(&entry)),
        (keys.state(&machine, &name), json(&state)),
    ]
    .into_iter()
    .map(|(key, value)| kv(key, value))
    .collect()
}

#[test]
fn schedule_and_states_share_the_text_of_names_and_machines() {
    let keys = Keys::new("/fleet/");
    let mut snap = Snapshot::default();
    for kv in one_placed_unit(&keys) {
        assert!(snap.insert(&keys, &kv).is_none());
    }
    assert_names_shared(&snap);
}

/// A snapshot read from the store decodes its prefixes apart, the states on a thread of
/// their own: the names are shared all the same.
#[tokio::test]
async fn a_snapshot_read_from_the_store_shares_names_too() {
    let registry = Registry::new(crate::kv::MemKv::new(), "/fleet/");
    let written = put_placed_unit(&registry).await;
    let snap = registry.snapshot().await.unwrap();
    assert_eq!(snap.revision, written);
    assert!(snap.skipped.is_empty(), "{:?}", snap.skipped);
    assert_names_shared(&snap);
}

/// Writes [`one_placed_unit`] into `registry`'s store; the revision it landed at.
async fn put_placed_unit<K: Kv>(registry: &Registry<K>) -> Revision {
    let ops = one_placed_unit(registry.keys())
        .into_iter()
        .map(|kv| crate::kv::TxnOp::Put {
            key: kv.key,
            value: kv.value,
            lease: None,
        })
        .collect();
    let txn = crate::kv::Txn {
        compares: Vec::new(),
        success: ops,
        failure: Vec::new(),
    };
    registry.kv().txn(txn).await.unwrap().revision
}

/// Compacts the store past what was written before the first prefix read, once.
#[derive(Clone)]
struct CompactOnce {
    store: crate::kv::MemKv,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl crate::kv::Hook for CompactOnce {
    async fn before(&self, request: crate::kv::Request<'_>) -> Result<(), KvError> {
        use std::sync::atomic::Ordering;
        if matches!(request, crate::kv::Request::Range { prefix: true, .. })
            && !self.done.swap(true, Ordering::SeqCst)
        {
            let txn = crate::kv::Txn {
                compares: Vec::new(),
                success: vec![crate::kv::TxnOp::Put {
                    key: "/elsewhere".to_owned(),
                    value: b"x".to_vec(),
                    lease: None,
                }],
                failure: Vec::new(),
            };
            let now = self.store.txn(txn).await.unwrap().revision;
            self.store.compact(now).unwrap();
        }
        Ok(())
    }
}

/// The revision a snapshot chose is compacted away before its prefixes are read: it
/// reads the present again, and whole.
#[tokio::test]
async fn a_snapshot_whose_revision_is_compacted_away_reads_again() {
    let store = crate::kv::MemKv::new();
    let hook = CompactOnce {
        store: store.clone(),
        done: Default::default(),
    };
    let registry = Registry::new(crate::kv::Hooked { inner: store, hook }, "/fleet/");
    let written = put_placed_unit(&registry).await;
    let snap = registry.snapshot().await.unwrap();
    assert_eq!(
        snap.revision,
        written + 1,
        "the present after the compaction"
    );
    assert_eq!((snap.units.len(), snap.states.len()), (1, 1));
    assert_names_shared(&snap);
}

/// A read that fails gives its error, and the decoding of what had arrived stops.
#[test]
fn an_abandoned_decoding_stops() {
    let keys = Keys::new("/fleet/");
    let abandoned = Arc::new(AtomicBool::new(false));
    let (pages, decoder) = Decoder::start(&keys, 3, &abandoned);
    let records = one_placed_unit(&keys);
    pages.send(Decode::Page(0, records[..1].to_vec())).unwrap();
    abandoned.store(true, Ordering::Relaxed);
    pages
        .send(Decode::Page(STATES, records[3..].to_vec()))
        .unwrap();
    drop(pages);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let snap = rt.block_on(async { decoder.finish(&keys) });
    assert!(snap.states.is_empty(), "decoded after it was abandoned");
}

fn assert_names_shared(snap: &Snapshot) {
    let machine: MachineId = "m1".parse().unwrap();
    let text = |n: &UnitName| n.as_str().as_ptr();
    let (unit_key, unit) = snap.units.first_key_value().unwrap();
    let (machine_key, _) = snap.machines.first_key_value().unwrap();
    let (schedule_key, on) = snap.schedule.first_key_value().unwrap();
    let (state_key, states) = snap.states.first_key_value().unwrap();
    let (entry, state) = (&on[&machine], &states[&machine]);
    for n in [
        unit.name(),
        schedule_key,
        &entry.name,
        state_key,
        &state.name,
    ] {
        assert_eq!(text(n), text(unit_key), "{n} has a copy of its own");
    }
    let (on_key, _) = on.iter().next().unwrap();
    for m in [on_key, &entry.machine, &state.machine] {
        assert_eq!(m.as_str().as_ptr(), machine_key.as_str().as_ptr());
    }
}
