//! Issue 19: a page of the unit listing (the API's `GET /units` after its first page) reads
//! only its own units' keys and files, so its cost does not grow with the registry: page 2 of
//! 100 reads the very same keys, in the same number of requests, at 1,000 units and at
//! 10,000, counted by a hook on the in-memory store.

use fleet_core::{DesiredState, MachineInfo, UnitFile, UnitName};
use fleet_ops::etcd::page::PageLimit;
use fleet_ops::{Cluster, RegistryCluster, UnitsCursor};
use fleet_registry::kv::{Hook, Hooked, KvError, MemKv, Outcome, Request};
use fleet_registry::{Registry, ScheduleEntry, UnitsRole};
use fleet_testing::machine_running;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PREFIX: &str = "/page-reads/";
const MACHINES: usize = 10;
const PAGE: usize = 100;

/// Counts requests, and records every key they read.
#[derive(Debug, Clone, Default)]
struct Meter {
    requests: Arc<Mutex<usize>>,
    keys: Arc<Mutex<Vec<String>>>,
}

impl Meter {
    fn take(&self) -> (usize, Vec<String>) {
        let requests = std::mem::take(&mut *self.requests.lock().unwrap());
        let mut keys = std::mem::take(&mut *self.keys.lock().unwrap());
        keys.sort();
        (requests, keys)
    }
}

impl Hook for Meter {
    async fn before(&self, _: Request<'_>) -> Result<(), KvError> {
        *self.requests.lock().unwrap() += 1;
        Ok(())
    }

    fn after(&self, _: Request<'_>, outcome: Outcome<'_>, _: Duration) {
        let keys: Vec<String> = match outcome {
            Outcome::Range(r) => r.kvs.iter().map(|kv| kv.key.clone()).collect(),
            Outcome::Read(r) => r.found.iter().flatten().map(|kv| kv.key.clone()).collect(),
            Outcome::Txn(_) | Outcome::Done | Outcome::Failed(_) => Vec::new(),
        };
        self.keys.lock().unwrap().extend(keys);
    }
}

fn name(i: usize) -> UnitName {
    format!("u{i:05}.service").parse().unwrap()
}

/// `count` units with 7 different files, scheduled round-robin on [`MACHINES`] machines
/// that report each of them running.
async fn registry_of(count: usize) -> Registry<Hooked<MemKv, Meter>> {
    let kv = Hooked {
        inner: MemKv::new(),
        hook: Meter::default(),
    };
    let reg = Registry::new(kv, PREFIX);
    let units = UnitsRole::new(reg.clone());
    let files: Vec<UnitFile> = (0..7)
        .map(|i| UnitFile::parse(format!("[Service]\nExecStart=/bin/sleep {i}\n").as_bytes()))
        .collect::<Result<_, _>>()
        .unwrap();
    let machine = |i: usize| format!("m{}", i % MACHINES).parse().unwrap();
    let mut entries = Vec::new();
    for i in 0..count {
        let file = &files[i % files.len()];
        units
            .create_unit(&name(i), file, DesiredState::Launched)
            .await
            .unwrap();
        entries.push(ScheduleEntry {
            name: name(i),
            machine: machine(i),
            hash: file.hash(),
            desired: DesiredState::Launched,
            restart: 0,
            no_restart: false,
            placement: 0,
        });
    }
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

/// The requests and keys of page 2 (of [`PAGE`]), after reading page 1.
async fn second_page(reg: &Registry<Hooked<MemKv, Meter>>) -> (usize, Vec<String>) {
    let meter = reg.raw_kv().hook.clone();
    let c = RegistryCluster::new(reg.clone());
    let (_, next) = c.units_after(None, PageLimit::units(PAGE)).await.unwrap();
    let next: UnitsCursor = next.expect("more than one page");
    meter.take();
    let (page, _) = c
        .units_after(Some(&next), PageLimit::units(PAGE))
        .await
        .unwrap();
    let names: Vec<UnitName> = page.units.iter().map(|u| u.status.name.clone()).collect();
    assert_eq!(names, (PAGE..2 * PAGE).map(name).collect::<Vec<_>>());
    assert!(
        page.units
            .iter()
            .all(|u| u.current == DesiredState::Launched)
    );
    meter.take()
}

#[tokio::test(start_paused = true)]
async fn a_page_reads_the_same_keys_at_1000_and_at_10000_units() {
    let (small_requests, small_keys) = second_page(&registry_of(1_000).await).await;
    let (large_requests, large_keys) = second_page(&registry_of(10_000).await).await;
    println!(
        "page 2 of {PAGE}: {small_requests} requests, {} keys at 1,000 units; \
         {large_requests} requests, {} keys at 10,000",
        small_keys.len(),
        large_keys.len()
    );
    assert_eq!(small_requests, large_requests, "requests");
    assert_eq!(small_keys, large_keys, "keys read");
    // One unit record beyond the page (to know more follow); per unit of the page its
    // placement, schedule entry and state; its 7 files.
    assert_eq!(small_keys.len(), (PAGE + 1) + 3 * PAGE + 7);
    // The unit records; placements and reasons; the schedule and states of the 10 machines
    // (20 intervals); the files.
    assert_eq!(small_requests, 4);
}

#[tokio::test(start_paused = true)]
async fn pages_after_cursors_list_what_one_listing_lists() {
    let reg = registry_of(250).await;
    let c = RegistryCluster::new(reg.clone());
    let whole = c.units(None).await.unwrap();
    let mut paged = Vec::new();
    let mut cursor: Option<UnitsCursor> = None;
    let mut seen = BTreeSet::new();
    loop {
        let (page, next) = c
            .units_after(cursor.as_ref(), PageLimit::units(PAGE))
            .await
            .unwrap();
        assert!(page.units.len() <= PAGE);
        paged.extend(page.units);
        if let Some(next) = &next {
            assert!(seen.insert(next.after.clone()), "a cursor repeats");
        }
        match next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(paged, whole.units);
}

#[tokio::test(start_paused = true)]
async fn a_page_cut_by_its_files_bytes_reads_the_files_only_until_then() {
    let kv = Hooked {
        inner: MemKv::new(),
        hook: Meter::default(),
    };
    let reg = Registry::new(kv, PREFIX);
    let units = UnitsRole::new(reg.clone());
    let mut size = 0;
    for i in 0..2_100 {
        let file =
            UnitFile::parse(format!("[Service]\nExecStart=/bin/sleep {i}\n").as_bytes()).unwrap();
        size = file.api_form_len();
        units
            .create_unit(&name(i), &file, DesiredState::Launched)
            .await
            .unwrap();
    }
    let c = RegistryCluster::new(reg.clone());
    let meter = reg.raw_kv().hook.clone();
    meter.take();
    // About 50 units' files a page, and every unit by count.
    let limit = PageLimit {
        units: 5_000,
        bytes: 50 * size,
    };
    let (page, next) = c.units_after(None, limit).await.unwrap();
    let files_read = meter
        .take()
        .1
        .iter()
        .filter(|k| k.starts_with(&format!("{PREFIX}file/")))
        .count();
    assert!(
        (45..=55).contains(&page.units.len()),
        "{} units",
        page.units.len()
    );
    assert!(files_read <= 1_024, "read {files_read} files for one page");
    let mut paged = page.units;
    let mut cursor = next;
    while let Some(at) = cursor {
        let (page, next) = c.units_after(Some(&at), limit).await.unwrap();
        assert!(!page.units.is_empty(), "a page after {}", at.after);
        paged.extend(page.units);
        cursor = next;
    }
    assert_eq!(paged, c.units(None).await.unwrap().units, "every unit once");
}
