//! Issue 19: what a blocking `fleetctl start` of one unit reads (the start's write, the wait's
//! read and watch, the API's `GET /units/<name>` and `GET /state?unitName=…`) does not grow
//! with the registry: the same requests and the same bytes at 10 units as at 10,000, counted
//! by a hook on the in-memory store.

use fleet_core::{DesiredState, MachineInfo, UnitFile, UnitName};
use fleet_ops::model::Changes;
use fleet_ops::{Cluster, RegistryCluster, StateChange, StateFilter};
use fleet_registry::kv::{Hook, Hooked, KvError, MemKv, Outcome, Request, TxnOpResponse};
use fleet_registry::{Registry, ScheduleEntry, UnitsRole};
use fleet_testing::machine_running;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const PREFIX: &str = "/few-reads/";
const MACHINES: usize = 10;

/// Counts requests, and the bytes of the keys and values they read.
#[derive(Debug, Clone, Default)]
struct Meter {
    requests: Arc<AtomicUsize>,
    bytes: Arc<AtomicUsize>,
}

impl Meter {
    fn take(&self) -> (usize, usize) {
        (
            self.requests.swap(0, Ordering::SeqCst),
            self.bytes.swap(0, Ordering::SeqCst),
        )
    }
}

impl Hook for Meter {
    async fn before(&self, _: Request<'_>) -> Result<(), KvError> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn after(&self, _: Request<'_>, outcome: Outcome<'_>, _: Duration) {
        let kvs: Vec<&fleet_registry::kv::KeyValue> = match outcome {
            Outcome::Range(r) => r.kvs.iter().collect(),
            Outcome::Read(r) => r.found.iter().flatten().collect(),
            Outcome::Txn(r) => r
                .responses
                .iter()
                .flat_map(|r| match r {
                    TxnOpResponse::Get(kvs) => kvs.iter().collect(),
                    TxnOpResponse::Put | TxnOpResponse::Delete(_) => Vec::new(),
                })
                .collect(),
            Outcome::Done | Outcome::Failed(_) => Vec::new(),
        };
        let bytes: usize = kvs.iter().map(|kv| kv.key.len() + kv.value.len()).sum();
        self.bytes.fetch_add(bytes, Ordering::SeqCst);
    }
}

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn target() -> UnitName {
    name("target.service")
}

/// `others` units and the target, scheduled round-robin on [`MACHINES`] machines that report
/// each of them running; the target is desired `loaded`, the others `launched`.
async fn registry_of(others: usize) -> Registry<Hooked<MemKv, Meter>> {
    let kv = Hooked {
        inner: MemKv::new(),
        hook: Meter::default(),
    };
    let reg = Registry::new(kv, PREFIX);
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/sleep 1000\n").unwrap();
    let units = UnitsRole::new(reg.clone());
    let mut names: Vec<UnitName> = (0..others)
        .map(|i| name(&format!("u{i:05}.service")))
        .collect();
    names.push(target());
    for n in &names {
        let desired = if *n == target() {
            DesiredState::Loaded
        } else {
            DesiredState::Launched
        };
        units.create_unit(n, &file, desired).await.unwrap();
    }
    let machine = |i: usize| format!("m{}", i % MACHINES).parse().unwrap();
    let entries: Vec<ScheduleEntry> = names
        .iter()
        .enumerate()
        .map(|(i, n)| ScheduleEntry {
            name: n.clone(),
            machine: machine(i),
            hash: file.hash(),
            desired: DesiredState::Launched,
            restart: 0,
            no_restart: false,
            placement: 0,
        })
        .collect();
    for chunk in entries.chunks(64) {
        reg.write_schedule(chunk, &[]).await.unwrap();
    }
    for m in 0..MACHINES {
        let info = MachineInfo {
            id: machine(m),
            public_ip: format!("10.0.0.{m}"),
            metadata: Default::default(),
            version: "test".into(),
            disable_engine: false,
            api: String::new(),
            fence_at: None,
        };
        let running: Vec<_> = entries
            .iter()
            .filter(|e| e.machine == info.id)
            .map(|e| (e.name.clone(), e.hash, true))
            .collect();
        machine_running(&reg, &info, Duration::from_secs(3600), &running).await;
    }
    reg
}

/// The requests and bytes of one blocking start of the target, and of the API's reads of it.
async fn blocking_start(reg: &Registry<Hooked<MemKv, Meter>>) -> (usize, usize) {
    let meter = reg.raw_kv().hook.clone();
    meter.take();
    let c = RegistryCluster::new(reg.clone());
    let names = BTreeSet::from([target()]);
    c.set_state(&target(), StateChange::Raise(DesiredState::Launched))
        .await
        .unwrap();
    let changes = c.watch(names.clone()).await.unwrap();
    let status = &changes.view().units[&target()];
    assert_eq!(status.desired, DesiredState::Launched);
    assert_eq!(
        status.machines.len(),
        1,
        "the target's machine, found by placement"
    );
    assert_eq!(changes.view().states[&target()].len(), 1);
    let view = c.unit(&target()).await.unwrap().unwrap();
    assert_eq!(view.current, DesiredState::Launched);
    let states = c
        .states(&StateFilter {
            machine: None,
            unit: Some(target()),
        })
        .await
        .unwrap();
    assert_eq!(states.states.len(), 1);
    assert_eq!(c.units(Some(&names)).await.unwrap().units.len(), 1);
    drop(changes);
    meter.take()
}

#[tokio::test(start_paused = true)]
async fn a_blocking_start_of_one_unit_reads_the_same_at_10_and_at_10000_units() {
    let small = blocking_start(&registry_of(10).await).await;
    let large = blocking_start(&registry_of(10_000).await).await;
    println!("(requests, bytes read): {small:?} at 10 units, {large:?} at 10,000");
    assert_eq!(
        small, large,
        "(requests, bytes read) at 10 and at 10,000 units"
    );
}

/// Units that do not exist yet (what `fleetctl start` of new units reads first, to decide
/// create or keep) cost their first round of reads only, however many machines are
/// registered: 1,000 new units on 5,000 machines read 5,000,000 state keys in 39,063
/// transactions before (issue 19, `fleet-bench scale --machines 5000 --units 1000`).
#[tokio::test(start_paused = true)]
async fn reading_units_that_do_not_exist_reads_no_machines_states() {
    let reg = registry_of(10).await;
    let meter = reg.raw_kv().hook.clone();
    let c = RegistryCluster::new(reg.clone());
    meter.take();
    assert!(c.unit(&name("absent.service")).await.unwrap().is_none());
    assert_eq!(meter.take().0, 1, "one transaction: the unit's own keys");
    let absent: BTreeSet<UnitName> = (0..100)
        .map(|i| name(&format!("new@{i}.service")))
        .collect();
    assert!(c.units(Some(&absent)).await.unwrap().units.is_empty());
    // 42 units (3 keys each) to a transaction of at most 128 reads.
    assert_eq!(meter.take().0, 100_usize.div_ceil(42));
}

/// `names`: `n` units that do not exist yet.
fn new_names(n: usize) -> BTreeSet<UnitName> {
    (0..n)
        .map(|i| name(&format!("new-{i:05}.service")))
        .collect()
}

/// A start of more than a thousand units (a listing of their names) reads them by name,
/// however large the registry: the names' records, then the other keys of those that exist,
/// none of the other units' (issue 43: a start of 50,000 units into a registry of 950,000
/// read the whole registry, and failed past fleetctl's 3 s deadline).
#[tokio::test(start_paused = true)]
async fn many_names_are_read_by_name_not_with_the_registry() {
    let reg = registry_of(2_500).await;
    let meter = reg.raw_kv().hook.clone();
    let c = RegistryCluster::new(reg.clone());
    let new = new_names(1_001);
    meter.take();
    assert!(c.units(Some(&new)).await.unwrap().units.is_empty());
    let (requests, bytes) = meter.take();
    assert_eq!(
        requests,
        1_001_usize.div_ceil(128),
        "the names' records, 128 to a transaction (none exists: nothing more)"
    );
    assert_eq!(bytes, 0, "nothing of the units not named");
    let mut mixed = new;
    mixed.insert(name("u00007.service"));
    let listing = c.units(Some(&mixed)).await.unwrap();
    let found: Vec<&UnitName> = listing.units.iter().map(|u| u.name()).collect();
    assert_eq!(found, [&name("u00007.service")], "a named unit that exists");
    assert_eq!(
        listing.units[0].status.machines.len(),
        1,
        "with its machine"
    );
}

/// Many existing units named, each with a file of its own: every one listed with its own
/// file, the files read many to a request, not one request each.
#[tokio::test(start_paused = true)]
async fn many_named_units_come_with_their_files_read_many_to_a_request() {
    let kv = Hooked {
        inner: MemKv::new(),
        hook: Meter::default(),
    };
    let reg = Registry::new(kv, PREFIX);
    let units = UnitsRole::new(reg.clone());
    let count = 1_100;
    let names: BTreeSet<UnitName> = (0..count)
        .map(|i| name(&format!("own-{i:05}.service")))
        .collect();
    for (i, n) in names.iter().enumerate() {
        let text = format!("[Unit]\nDescription=unit {i}\n[Service]\nExecStart=/bin/true\n");
        let file = UnitFile::parse(text.as_bytes()).unwrap();
        units
            .create_unit(n, &file, DesiredState::Launched)
            .await
            .unwrap();
    }
    let meter = reg.raw_kv().hook.clone();
    let c = RegistryCluster::new(reg.clone());
    meter.take();
    let listing = c.units(Some(&names)).await.unwrap();
    let (requests, _) = meter.take();
    assert_eq!(listing.units.len(), count);
    assert!(listing.skipped.is_empty(), "{:?}", listing.skipped);
    for (i, unit) in listing.units.iter().enumerate() {
        assert_eq!(unit.name(), &name(&format!("own-{i:05}.service")));
        let text = unit.file.canonical().to_string();
        assert!(text.contains(&format!("unit {i}\n")), "{text}");
    }
    let records = count.div_ceil(128);
    let first_round = (count * 3).div_ceil(126);
    let files = count.div_ceil(128);
    assert_eq!(requests, records + first_round + files);
}
