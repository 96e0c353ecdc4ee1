//! The store on the in-memory registry, on paused time: each subscriber hears of every
//! change on its own, a waiter wakes once its revision is applied, the store lives exactly
//! as long as a handle, and a lost one is replaced. The same against real etcd:
//! `tests/registry_contract.rs`.

use super::*;
use crate::kv::MemKv;
use crate::units::{CreateOutcome, UnitsRole};
use fleet_core::{DesiredState, UnitFile};

fn registry() -> Registry<MemKv> {
    Registry::new(MemKv::new(), "/store-test/")
}

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

/// Creates `unit` and returns the revision it landed at.
async fn create(reg: &Registry<MemKv>, unit: &str) -> Revision {
    let file = UnitFile::parse(format!("[Service]\nExecStart=/bin/{unit}\n").as_bytes()).unwrap();
    let out = UnitsRole::new(reg.clone())
        .create_unit(&name(unit), &file, DesiredState::Launched)
        .await
        .unwrap();
    let CreateOutcome::Created(_) = out else {
        panic!("{unit} exists")
    };
    reg.present_revision("test").await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn every_subscriber_hears_of_a_change_and_takes_its_own_account() {
    let reg = registry();
    let store = Store::start(&reg).await.unwrap();
    let (engine, api) = (store.subscribe(), store.subscribe());
    let revision = create(&reg, "a.service").await;
    store.reached(revision).await.unwrap();

    let touched = engine.changed().await.unwrap();
    assert!(touched.units && touched.files, "{touched:?}");
    let read = store.read().await;
    assert!(read.snapshot().units.contains_key(&name("a.service")));
    assert_eq!(read.files().len(), 1);
    let taken = engine.take(&read);
    assert_eq!(taken.units, Some(BTreeSet::from([name("a.service")])));
    assert!(!taken.touched.any(), "taken by changed() already");
    assert_eq!(
        engine.take(&read).units,
        Some(BTreeSet::new()),
        "taken once"
    );
    let theirs = api.take(&read);
    assert!(
        theirs.touched.units,
        "the other subscriber's account is its own"
    );
    assert_eq!(theirs.units, Some(BTreeSet::from([name("a.service")])));
}

#[tokio::test(start_paused = true)]
async fn a_subscriber_is_told_only_what_changed_after_it_subscribed() {
    let reg = registry();
    let store = Store::start(&reg).await.unwrap();
    let revision = create(&reg, "a.service").await;
    store.reached(revision).await.unwrap();
    let late = store.subscribe();
    let revision = create(&reg, "b.service").await;
    store.reached(revision).await.unwrap();
    let read = store.read().await;
    assert_eq!(read.revision(), revision);
    assert_eq!(
        late.take(&read).units,
        Some(BTreeSet::from([name("b.service")]))
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_wakes_once_the_store_has_applied_its_revision() {
    let reg = registry();
    let store = Store::start(&reg).await.unwrap();
    let before = store.revision();
    let waiter = tokio::spawn({
        let store = store.clone();
        async move { store.reached(before + 1).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiter.is_finished(), "nothing written yet");
    let revision = create(&reg, "a.service").await;
    assert!(revision > before);
    tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("woken")
        .unwrap()
        .unwrap();
    assert!(store.revision() >= revision);
    store.reached(before).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_lost_store_tells_every_waiter_and_subscriber_and_a_new_one_is_read() {
    let kv = MemKv::new();
    let reg = Registry::new(kv.clone(), "/store-test/");
    let stores = SharedStore::new(reg.clone());
    let store = stores.get().await.unwrap();
    let sub = store.subscribe();
    let waiter = tokio::spawn({
        let store = store.clone();
        async move { store.reached(store.revision() + 100).await }
    });
    kv.set_unavailable(true);
    let lost = tokio::time::timeout(Duration::from_secs(1), sub.changed()).await;
    assert!(
        matches!(lost, Ok(Err(RegistryError::ViewLost(_)))),
        "{lost:?}"
    );
    let waited = waiter.await.unwrap();
    assert!(
        matches!(waited, Err(RegistryError::ViewLost(_))),
        "{waited:?}"
    );
    assert!(store.is_lost());
    assert!(
        store.subscribe().changed().await.is_err(),
        "a late subscriber hears it too"
    );

    kv.set_unavailable(false);
    let revision = create(&reg, "a.service").await;
    let again = stores.get().await.unwrap();
    assert!(!again.is_lost(), "a lost store is not handed out");
    again.reached(revision).await.unwrap();
    assert!(
        again
            .read()
            .await
            .snapshot()
            .units
            .contains_key(&name("a.service"))
    );
}

#[tokio::test(start_paused = true)]
async fn users_share_one_store_while_any_holds_it_and_none_after() {
    let reg = registry();
    let stores = SharedStore::new(reg.clone());
    assert!(!stores.is_held().await);
    let first = stores.get().await.unwrap();
    let second = stores.current(Duration::from_secs(1)).await.unwrap();
    assert!(Arc::ptr_eq(&first.shared, &second.shared), "one store");
    drop(first);
    let sub = second.subscribe();
    drop(second);
    assert!(stores.is_held().await, "a subscription holds it");
    drop(sub);
    assert!(!stores.is_held().await, "the last handle dropped it");
}

#[tokio::test(start_paused = true)]
async fn a_store_behind_the_present_is_given_up_for_a_new_one() {
    let kv = MemKv::new();
    let reg = Registry::new(kv.clone(), "/store-test/");
    let stores = SharedStore::new(reg.clone());
    let held = stores.get().await.unwrap();
    // A write outside the prefix moves the present where no event of the store's watch
    // will ever take it.
    let outside = Registry::new(kv, "/elsewhere/");
    create(&outside, "x.service").await;
    let current = stores.current(Duration::from_millis(100)).await.unwrap();
    assert!(!Arc::ptr_eq(&held.shared, &current.shared), "a new store");
    assert!(held.is_lost(), "its users move to the new one");
    assert!(!current.is_lost());
}
