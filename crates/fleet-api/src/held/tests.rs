//! The listing from a held view against the listing from etcd, over the same in-memory
//! registry: the same pages, every write before a listing in it, the view dropped when
//! nobody lists, and etcd read when the view is behind.

use axum::Router;
use axum::body::Body;
use fleet_core::{DesiredState, MachineInfo, UnitFile, UnitName};
use fleet_registry::kv::MemKv;
use fleet_registry::{Registry, ScheduleEntry, UnitsRole};
use fleet_testing::machine_running;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use std::time::Duration;
use tower::ServiceExt;

use super::*;
use crate::tests::file;
use crate::{Api, router};
use fleet_ops::etcd::page::PAGE_BYTES;

const IDLE: Duration = Duration::from_secs(60);

struct Both {
    registry: Registry<MemKv>,
    held: Arc<Api<MemKv>>,
    /// The same registry without a view: every page reads etcd.
    plain: Router,
    held_router: Router,
}

fn both(token_limit: u16) -> Both {
    let registry = Registry::new(MemKv::new(), "/fleet/");
    let held = Api::new(registry.clone(), token_limit, "9.9.9").with_held_view(IDLE);
    let held = Arc::new(held);
    Both {
        plain: router(Api::new(registry.clone(), token_limit, "9.9.9")),
        held_router: crate::routes::router_of(held.clone()),
        held,
        registry,
    }
}

async fn get(router: &Router, path: &str) -> Value {
    let req = Request::builder().uri(path).body(Body::empty()).unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{path}");
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

/// Every page of `path`, the bodies in order.
async fn pages(router: &Router, path: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut url = path.to_owned();
    loop {
        let body = get(router, &url).await;
        let token = body["nextPageToken"].as_str().map(str::to_owned);
        out.push(body);
        let Some(token) = token else { return out };
        let sep = if path.contains('?') { '&' } else { '?' };
        url = format!("{path}{sep}nextPageToken={token}");
    }
}

fn units_of(pages: &[Value]) -> Vec<Value> {
    pages
        .iter()
        .flat_map(|p| p["units"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn names_of(pages: &[Value]) -> Vec<String> {
    units_of(pages)
        .iter()
        .map(|u| u["name"].as_str().unwrap().to_owned())
        .collect()
}

fn skipped_of(pages: &[Value]) -> Vec<Value> {
    let mut all: Vec<Value> = pages
        .iter()
        .flat_map(|p| p["skipped"].as_array().cloned().unwrap_or_default())
        .collect();
    all.sort_by_key(ToString::to_string);
    all.dedup();
    all
}

async fn create(registry: &Registry<MemKv>, name: &str, desired: DesiredState) {
    create_with(registry, name, desired, "/bin/true").await;
}

async fn create_with(registry: &Registry<MemKv>, name: &str, desired: DesiredState, exec: &str) {
    UnitsRole::new(registry.clone())
        .create_unit(&name.parse().unwrap(), &file(exec), desired)
        .await
        .unwrap();
}

/// 30 units, every third scheduled on m1 or m2 where it runs, one unschedulable, a corrupt
/// unit record, a corrupt state and a corrupt file.
async fn populate(registry: &Registry<MemKv>) {
    for i in 0..30 {
        create(
            registry,
            &format!("u{i:02}.service"),
            DesiredState::Launched,
        )
        .await;
    }
    let mut entries = Vec::new();
    for machine in ["m1", "m2"] {
        let info = MachineInfo {
            id: machine.parse().unwrap(),
            public_ip: "10.0.0.1".into(),
            metadata: Default::default(),
            version: "9.9.9".into(),
            disable_engine: false,
            api: String::new(),
            fence_at: None,
        };
        let hash = file("/bin/true").hash();
        let mut units = Vec::new();
        for i in (0..30).step_by(3) {
            let name: UnitName = format!("u{i:02}.service").parse().unwrap();
            if (i % 2 == 0) != (machine == "m1") {
                continue;
            }
            entries.push(ScheduleEntry {
                name: name.clone(),
                machine: info.id.clone(),
                hash,
                desired: DesiredState::Launched,
                restart: 0,
                no_restart: false,
                placement: 0,
            });
            units.push((name, hash, true));
        }
        machine_running(registry, &info, Duration::from_secs(600), &units).await;
    }
    registry.write_schedule(&entries, &[]).await.unwrap();
    let keys = registry.keys();
    registry
        .put_raw(
            &keys.unscheduled(&"u01.service".parse().unwrap()),
            "no machine",
        )
        .await;
    registry
        .put_raw(&keys.units().replace("unit/", "unit/bad.service"), "{")
        .await;
    registry
        .put_raw(
            &keys.state(&"m1".parse().unwrap(), &"u04.service".parse().unwrap()),
            "{",
        )
        .await;
    // A unit whose file is corrupt is left out, the file reported; a corrupt file no unit
    // names is not read by a listing from etcd, so not reported either.
    create_with(
        registry,
        "v.service",
        DesiredState::Inactive,
        "/bin/corrupt",
    )
    .await;
    registry
        .put_raw(&keys.file(&file("/bin/corrupt").hash()), "\u{0}not a unit")
        .await;
    registry
        .put_raw(&keys.file(&file("/bin/orphan").hash()), "\u{0}no unit")
        .await;
    // A unit whose file is gone from the registry is left out and reported (issue 38).
    create_with(registry, "w.service", DesiredState::Inactive, "/bin/gone").await;
    let delete = fleet_registry::kv::Txn {
        success: vec![fleet_registry::kv::TxnOp::Delete {
            key: keys.file(&file("/bin/gone").hash()),
            prefix: false,
        }],
        ..Default::default()
    };
    fleet_registry::kv::Kv::txn(registry.raw_kv(), delete)
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_held_listing_lists_what_pages_read_from_etcd_list() {
    for token_limit in [7, 100] {
        let b = both(token_limit);
        populate(&b.registry).await;
        for path in ["/fleet/v1/units", "/fleet/v1/units?view=full"] {
            let from_etcd = pages(&b.plain, path).await;
            let held = pages(&b.held_router, path).await;
            assert!(b.held.held_view().unwrap().is_held().await);
            assert_eq!(
                units_of(&held),
                units_of(&from_etcd),
                "{path} by {token_limit}"
            );
            assert_eq!(held.len(), from_etcd.len(), "{path} by {token_limit}");
            assert_eq!(skipped_of(&held), skipped_of(&from_etcd), "{path}");
            // Each value on one page only, as etcd's pages report their own keys.
            let reported: usize = held
                .iter()
                .map(|p| p["skipped"].as_array().map_or(0, Vec::len))
                .sum();
            assert_eq!(reported, skipped_of(&held).len(), "{path} by {token_limit}");
        }
        let full = skipped_of(&pages(&b.held_router, "/fleet/v1/units?view=full").await);
        let full: Vec<String> = full.iter().map(ToString::to_string).collect();
        assert_eq!(full.len(), 4, "{full:?}");
        assert!(full.iter().any(|s| s.contains("/fleet/file/")), "{full:?}");
        assert!(
            full.iter()
                .any(|s| s.contains("w.service") && s.contains("missing from the registry")),
            "{full:?}"
        );
        let whole = get(&b.held_router, "/fleet/v1/units?view=full&pageSize=0").await;
        let paged = pages(&b.plain, "/fleet/v1/units?view=full").await;
        assert_eq!(units_of(std::slice::from_ref(&whole)), units_of(&paged));
        assert_eq!(skipped_of(&[whole]), skipped_of(&paged));
    }
}

#[tokio::test(start_paused = true)]
async fn a_held_listing_shows_every_write_made_before_it() {
    let b = both(100);
    create(&b.registry, "a.service", DesiredState::Inactive).await;
    let first = pages(&b.held_router, "/fleet/v1/units").await;
    assert_eq!(names_of(&first), ["a.service"]);
    for name in ["b.service", "c.service"] {
        create(&b.registry, name, DesiredState::Inactive).await;
        let names = names_of(&pages(&b.held_router, "/fleet/v1/units").await);
        assert!(names.contains(&name.to_owned()), "{names:?}");
    }
    let a = b
        .registry
        .unit(&"a.service".parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    UnitsRole::new(b.registry.clone())
        .destroy_unit(&a)
        .await
        .unwrap();
    let names = names_of(&pages(&b.held_router, "/fleet/v1/units").await);
    assert_eq!(names, ["b.service", "c.service"]);
}

#[tokio::test(start_paused = true)]
async fn a_later_page_shows_the_registry_as_its_first_page_did() {
    let b = both(2);
    for name in ["a.service", "b.service", "c.service", "d.service"] {
        create(&b.registry, name, DesiredState::Inactive).await;
    }
    let first = get(&b.held_router, "/fleet/v1/units").await;
    let token = first["nextPageToken"].as_str().unwrap().to_owned();
    // Unchanged since: the next page comes from the view, at the same revision.
    let second = get(
        &b.held_router,
        &format!("/fleet/v1/units?nextPageToken={token}"),
    )
    .await;
    assert_eq!(names_of(&[second]), ["c.service", "d.service"]);
    create(&b.registry, "bb.service", DesiredState::Inactive).await;
    let again = get(
        &b.held_router,
        &format!("/fleet/v1/units?nextPageToken={token}"),
    )
    .await;
    assert_eq!(
        names_of(&[again]),
        ["c.service", "d.service"],
        "read at the first page's revision"
    );
}

#[tokio::test(start_paused = true)]
async fn a_view_nobody_lists_is_dropped_and_read_again_when_listed() {
    let b = both(100);
    create(&b.registry, "a.service", DesiredState::Inactive).await;
    let view = b.held.held_view().unwrap();
    assert!(!view.is_held().await, "read on the first listing only");
    get(&b.held_router, "/fleet/v1/units").await;
    assert!(view.is_held().await);
    tokio::time::sleep(IDLE / 2).await;
    get(&b.held_router, "/fleet/v1/units").await;
    tokio::time::sleep(IDLE / 2 + CHECK_IDLE_EVERY).await;
    assert!(view.is_held().await, "listed {:?} ago", IDLE / 2);
    tokio::time::sleep(IDLE).await;
    assert!(
        !view.is_held().await,
        "dropped after {IDLE:?} without a listing"
    );
    create(&b.registry, "b.service", DesiredState::Inactive).await;
    let names = names_of(&pages(&b.held_router, "/fleet/v1/units").await);
    assert_eq!(names, ["a.service", "b.service"]);
    assert!(view.is_held().await);
}

#[tokio::test(start_paused = true)]
async fn a_view_behind_the_present_is_not_used_and_etcd_is_read() {
    let b = both(100);
    create(&b.registry, "a.service", DesiredState::Inactive).await;
    get(&b.held_router, "/fleet/v1/units").await;
    // A write outside the registry's prefix (another user of a shared etcd) moves the
    // present revision on, and no event of the view's watch ever reaches it.
    b.registry.put_raw("/flannel/subnet", "10.1.0.0/16").await;
    let view = b.held.held_view().unwrap();
    let page = view
        .units_after(&b.registry, None, PageLimit::units(100), None, Report::Page)
        .await
        .unwrap();
    assert_eq!(page.err(), Some(Bypass::Behind));
    let names = names_of(&pages(&b.held_router, "/fleet/v1/units").await);
    assert_eq!(names, ["a.service"], "from etcd");
    let metrics = b.held.metrics();
    assert_eq!(
        (metrics.held_pages("view"), metrics.held_pages("behind")),
        (1, 1)
    );
    // Waited in vain once: until the view moves, a listing gives it only a moment.
    let t0 = tokio::time::Instant::now();
    let page = view
        .units_after(&b.registry, None, PageLimit::units(100), None, Report::Page)
        .await
        .unwrap();
    assert_eq!(page.err(), Some(Bypass::Behind));
    assert_eq!(t0.elapsed(), CATCH_UP_STALLED);
    // A change under the prefix brings the view past it again.
    create(&b.registry, "b.service", DesiredState::Inactive).await;
    let page = view
        .units_after(&b.registry, None, PageLimit::units(100), None, Report::Page)
        .await
        .unwrap();
    let (listing, _) = page.expect("from the view");
    assert_eq!(listing.units.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_view_is_read_to_the_end_when_the_listing_that_asked_gives_up() {
    let b = both(100);
    create(&b.registry, "a.service", DesiredState::Inactive).await;
    let view = b.held.held_view().unwrap();
    let gave_up = tokio::time::timeout(
        Duration::ZERO,
        view.units_after(&b.registry, None, PageLimit::units(100), None, Report::Page),
    )
    .await;
    assert!(gave_up.is_err(), "dropped before its answer");
    for _ in 0..100 {
        if view.is_held().await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(view.is_held().await, "read by its own task");
    let page = view
        .units_after(&b.registry, None, PageLimit::units(100), None, Report::Page)
        .await
        .unwrap();
    assert_eq!(page.map(|(l, _)| l.units.len()).ok(), Some(1));
}

#[tokio::test]
async fn large_files_come_in_pages_of_at_most_page_bytes_from_the_view_and_from_etcd() {
    let b = both(100);
    let names: Vec<String> = (0..24).map(|i| format!("u{i:02}.service")).collect();
    for (i, name) in names.iter().enumerate() {
        // 512 lines of 1 KiB (a unit file's line is at most 2 KiB).
        let mut text = format!("[Service]\nExecStart=/bin/echo {i}\n");
        for v in 0..512 {
            text.push_str(&format!("Environment=V{v}={}\n", "x".repeat(1000)));
        }
        UnitsRole::new(b.registry.clone())
            .create_unit(
                &name.parse().unwrap(),
                &UnitFile::parse(text.as_bytes()).unwrap(),
                DesiredState::Inactive,
            )
            .await
            .unwrap();
    }
    // fleetctl's page size: one page by count, 12 MiB of files by bytes.
    let path = "/fleet/v1/units?view=full&pageSize=65535";
    for router in [&b.plain, &b.held_router] {
        let listed = pages(router, path).await;
        assert_eq!(listed.len(), 2, "cut by bytes");
        for page in &listed {
            let size = page.to_string().len();
            assert!(size < PAGE_BYTES + 64 * 1024, "a page of {size} bytes");
        }
        assert_eq!(names_of(&listed), names, "every unit once, in order");
    }
    assert_eq!(
        b.held.metrics().held_pages("view"),
        2,
        "the view served both"
    );
}

/// Makes every watch take `delay` to be created: a view slow to read.
#[derive(Debug, Clone)]
struct SlowWatch {
    delay: Duration,
}

impl fleet_registry::kv::Hook for SlowWatch {
    async fn before(
        &self,
        request: fleet_registry::kv::Request<'_>,
    ) -> Result<(), fleet_registry::kv::KvError> {
        if matches!(request, fleet_registry::kv::Request::Watch { .. }) {
            tokio::time::sleep(self.delay).await;
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_listing_waits_for_a_slow_view_at_most_start_wait_and_reads_etcd() {
    let kv = fleet_registry::kv::Hooked {
        inner: MemKv::new(),
        hook: SlowWatch {
            delay: START_WAIT * 5,
        },
    };
    let registry = Registry::new(kv, "/fleet/");
    UnitsRole::new(registry.clone())
        .create_unit(
            &"a.service".parse().unwrap(),
            &file("/bin/true"),
            DesiredState::Inactive,
        )
        .await
        .unwrap();
    let api = Arc::new(Api::new(registry.clone(), 100, "9.9.9").with_held_view(IDLE));
    let router = crate::routes::router_of(api.clone());
    let t0 = tokio::time::Instant::now();
    let listed = pages(&router, "/fleet/v1/units").await;
    assert_eq!(names_of(&listed), ["a.service"], "read from etcd");
    assert_eq!(t0.elapsed(), START_WAIT);
    // Meanwhile listings read etcd without waiting.
    let t1 = tokio::time::Instant::now();
    assert_eq!(
        names_of(&pages(&router, "/fleet/v1/units").await),
        ["a.service"]
    );
    assert_eq!(t1.elapsed(), Duration::ZERO);
    let metrics = api.metrics();
    assert_eq!(
        (metrics.held_pages("starting"), metrics.held_pages("view")),
        (2, 0)
    );
    // The view's read went on: once it is in, listings come from it.
    tokio::time::sleep(START_WAIT * 5).await;
    assert!(api.held_view().unwrap().is_held().await);
    assert_eq!(
        names_of(&pages(&router, "/fleet/v1/units").await),
        ["a.service"]
    );
    assert_eq!(metrics.held_pages("view"), 1);
}
