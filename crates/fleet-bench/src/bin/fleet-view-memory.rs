//! `fleet-view-memory --units N`: what the engine's view of a converged registry (the mirror
//! a [`Store`](fleet_registry::Store) keeps, read here as a [`LiveView`]) keeps on the heap,
//! in bytes per unit, as the `huge` scenario reports it.
//!
//! The registry is an in-memory store holding what a converged cluster holds: the machines'
//! records (their few KiB are counted in, spread over the units), N instances of
//! `--templates` templates, each with its unit record, its schedule entry on one of
//! `--machines` machines and the state its agent published there (loaded, active, running).
//! The view is read from it as the engine leader reads it; every byte it allocates and does
//! not free meanwhile is counted (this binary's allocator counts every call, which is why it
//! is not part of `fleet-bench`). A clone of each map of the view is counted the same way for
//! the breakdown (a clone is as large as the map, give or take a tree node's spare slots).
//!
//! Then what a leader whose API is listed keeps: before, the engine's view and the API's,
//! two of them (`two_views`); now the process's one [`Store`], which the engine's
//! subscription and the API's handle share (`shared_store`), per unit with malloc's headers.
//!
//! It prints one line of `key=value` pairs for the scenario to read.

use anyhow::{Context, Result};
use fleet_core::{DesiredState, MachineId, MachineInfo, SystemdState, UnitFile, UnitName};
use fleet_registry::kv::{Kv, MemKv, Txn, TxnOp};
use fleet_registry::{
    DEFAULT_PREFIX, Keys, LiveView, MAX_TXN_OPS, Registry, ReplaceState, ScheduleEntry,
    SharedStore, UnitRecord, UnitStateRecord,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;
use std::collections::BTreeMap;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// What one measured thing keeps: bytes asked for, and live allocations (glibc's malloc adds
/// ~16 bytes to each: its 8-byte header and rounding to 16).
#[derive(Debug, Clone, Copy)]
struct Kept {
    bytes: i64,
    allocations: i64,
}

impl Kept {
    fn of(region: &Region<'_, System>) -> Kept {
        let s = region.change();
        let signed = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        Kept {
            bytes: signed(s.bytes_allocated) - signed(s.bytes_deallocated)
                + i64::try_from(s.bytes_reallocated).unwrap_or(0),
            allocations: signed(s.allocations) - signed(s.deallocations),
        }
    }

    fn with_malloc(self) -> i64 {
        self.bytes + 16 * self.allocations
    }
}

fn arg(name: &str, default: usize) -> Result<usize> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .with_context(|| format!("{name} needs a number"))?
            .parse()
            .with_context(|| format!("{name} needs a number")),
        None => Ok(default),
    }
}

fn main() -> Result<()> {
    let units = arg("--units", 100_000)?;
    let machines = arg("--machines", 5_000)?.max(1);
    let templates = arg("--templates", 100)?.max(1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(measure(units, machines, templates))
}

/// Machine `i`'s ID, as the scale simulation makes them (32 hex digits).
fn machine_id(i: usize) -> MachineId {
    let mut x = (i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    format!("{:08x}{:024x}", (x >> 32) as u32, i)
        .parse()
        .expect("hex digits make a machine ID")
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("records serialize")
}

fn put(key: String, value: Vec<u8>) -> TxnOp {
    TxnOp::Put {
        key,
        value,
        lease: None,
    }
}

/// Fills `kv` with a converged registry of `units` instances.
async fn fill(kv: &MemKv, units: usize, machines: usize, templates: usize) -> Result<()> {
    let keys = Keys::new(DEFAULT_PREFIX);
    let mut ops = Vec::new();
    let files: Vec<UnitFile> = (0..templates)
        .map(|t| {
            let text = huge_template_text(t);
            UnitFile::parse(text.as_bytes()).expect("a valid unit file")
        })
        .collect();
    for file in &files {
        ops.push(put(keys.file(&file.hash()), file.canonical().into_bytes()));
    }
    for i in 0..machines {
        let info = MachineInfo {
            id: machine_id(i),
            public_ip: format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
            metadata: BTreeMap::from([("sim".to_owned(), "yes".to_owned())]),
            version: "bench".to_owned(),
            disable_engine: false,
            api: String::new(),
            fence_at: None,
        };
        ops.push(put(keys.machine(&info.id), json(&info)));
        if ops.len() >= MAX_TXN_OPS {
            write(kv, std::mem::take(&mut ops)).await?;
        }
    }
    for i in 0..units {
        let name = huge_unit(i, templates);
        let file = &files[i % templates];
        let hash = file.hash();
        let machine = machine_id(i % machines);
        let record = UnitRecord {
            name: name.clone(),
            hash,
            desired: DesiredState::Launched,
            restart: 0,
            replace: ReplaceState::default(),
        };
        ops.push(put(keys.unit(&name), json(&record)));
        ops.push(put(keys.file_ref(&hash, &name), Vec::new()));
        let entry = ScheduleEntry {
            name: name.clone(),
            machine: machine.clone(),
            hash,
            desired: DesiredState::Launched,
            restart: 0,
            no_restart: false,
            placement: 0,
        };
        ops.push(put(keys.schedule(&machine, &name), json(&entry)));
        let state = UnitStateRecord {
            name: name.clone(),
            machine: machine.clone(),
            hash: Some(hash),
            systemd: SystemdState {
                load: "loaded".to_owned(),
                active: "active".to_owned(),
                sub: "running".to_owned(),
            },
            drop_ins: Vec::new(),
            restart: 0,
            restart_pending: false,
            restarts: 0,
            since: None,
            exit: None,
        };
        ops.push(put(keys.state(&machine, &name), json(&state)));
        if ops.len() + 4 > MAX_TXN_OPS {
            write(kv, std::mem::take(&mut ops)).await?;
        }
    }
    write(kv, ops).await
}

async fn write(kv: &MemKv, ops: Vec<TxnOp>) -> Result<()> {
    if ops.is_empty() {
        return Ok(());
    }
    let txn = Txn {
        success: ops,
        ..Txn::default()
    };
    kv.txn(txn).await.context("filling the store")?;
    Ok(())
}

/// Instance `i` of the `huge` scenario: `huge-TT@N.service`, of template `i % templates`.
fn huge_unit(i: usize, templates: usize) -> UnitName {
    format!("huge-{:02}@{}.service", i % templates, i / templates)
        .parse()
        .expect("a valid unit name")
}

/// The text of template `t`, as the `huge` scenario writes it.
fn huge_template_text(t: usize) -> String {
    format!(
        "[Unit]\nDescription=fleet huge bench template {t}, instance %i\n\n\
         [Service]\nExecStart=/bin/sleep infinity\n"
    )
}

/// What the value `make` returns keeps allocated (counted before it is dropped).
fn kept_by<T>(make: impl FnOnce() -> T) -> Kept {
    let region = Region::new(GLOBAL);
    let value = std::hint::black_box(make());
    let kept = Kept::of(&region);
    drop(value);
    kept
}

async fn measure(units: usize, machines: usize, templates: usize) -> Result<()> {
    let kv = MemKv::new();
    fill(&kv, units, machines, templates).await?;
    let registry = Registry::new(kv.clone(), DEFAULT_PREFIX);
    let kept = registry.clone();
    let region = Region::new(GLOBAL);
    let view = LiveView::start(kept).await.context("reading the view")?;
    let total = Kept::of(&region);
    let snap = view.snapshot();
    anyhow::ensure!(
        snap.units.len() == units && snap.states.len() == units,
        "the view holds {} units and {} states, not {units}",
        snap.units.len(),
        snap.states.len()
    );
    anyhow::ensure!(
        snap.machines.len() == machines,
        "the view holds {} machines, not {machines}",
        snap.machines.len()
    );
    let parts = [
        ("units_map", kept_by(|| snap.units.clone())),
        ("schedule_map", kept_by(|| snap.schedule.clone())),
        ("states_map", kept_by(|| snap.states.clone())),
        ("snapshot_clone", kept_by(|| snap.clone())),
    ]
    .map(|(name, kept)| {
        let per_unit = kept.with_malloc() as f64 / units.max(1) as f64;
        format!("{name}={per_unit:.0}")
    });
    drop(view);
    let (two, shared) = listed_leader(&registry).await?;
    let per = |n: i64| n as f64 / units.max(1) as f64;
    println!(
        "units={units} machines={machines} templates={templates} bytes={} allocations={} \
         bytes_per_unit={:.0} with_malloc_per_unit={:.0} allocations_per_unit={:.1} {} \
         two_views={:.0} shared_store={:.0}",
        total.bytes,
        total.allocations,
        per(total.bytes),
        per(total.with_malloc()),
        per(total.allocations),
        parts.join(" "),
        per(two.with_malloc()),
        per(shared.with_malloc()),
    );
    Ok(())
}

/// What a listed leader keeps: the engine's and the API's own views as before, then one
/// store held by the engine's subscription and the API's handle.
async fn listed_leader(registry: &Registry<MemKv>) -> Result<(Kept, Kept)> {
    let region = Region::new(GLOBAL);
    let engine = LiveView::start(registry.clone()).await?;
    let api = LiveView::start(registry.clone()).await?;
    let two = Kept::of(&region);
    drop((engine, api));
    let region = Region::new(GLOBAL);
    let stores = SharedStore::new(registry.clone());
    let engine = stores.get().await?.subscribe();
    let api = stores.get().await?;
    let shared = Kept::of(&region);
    drop((engine, api));
    Ok((two, shared))
}
