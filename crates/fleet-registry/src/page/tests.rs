use super::*;
use crate::kv::{MemKv, Txn, TxnOp};
use crate::records::UnitStateRecord;
use crate::registry::{encode, put};
use crate::{ScheduleEntry, UnitsRole};
use fleet_core::{DesiredState, SystemdState};

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn machine(i: usize) -> MachineId {
    format!("m{i}").parse().unwrap()
}

async fn write(reg: &Registry<MemKv>, ops: Vec<TxnOp>) {
    for chunk in ops.chunks(MAX_TXN_OPS) {
        let txn = Txn {
            compares: vec![],
            success: chunk.to_vec(),
            failure: vec![],
        };
        reg.kv().txn(txn).await.unwrap();
    }
}

/// `names`, each scheduled (with its placement) to one of 3 machines that reports it,
/// every third one also unschedulable on record; a global-looking one placed everywhere.
async fn registry(names: &[&str]) -> Registry<MemKv> {
    let reg = Registry::new(MemKv::new(), "/page-test/");
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/true\n").unwrap();
    let units = UnitsRole::new(reg.clone());
    let keys = reg.keys().clone();
    let mut ops = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let n = name(n);
        units
            .create_unit(&n, &file, DesiredState::Launched)
            .await
            .unwrap();
        let machines: Vec<MachineId> = if i == 1 {
            (0..3).map(machine).collect()
        } else {
            vec![machine(i % 3)]
        };
        for m in machines {
            let entry = ScheduleEntry {
                name: n.clone(),
                machine: m.clone(),
                hash: file.hash(),
                desired: DesiredState::Launched,
                restart: 0,
                no_restart: false,
                placement: 0,
            };
            ops.push(put(keys.schedule(&m, &n), encode(&entry)));
            ops.push(put(keys.placement(&n, &m), Vec::new()));
            let state = UnitStateRecord {
                name: n.clone(),
                machine: m.clone(),
                hash: Some(file.hash()),
                systemd: SystemdState {
                    load: "loaded".into(),
                    active: "active".into(),
                    sub: "running".into(),
                },
                drop_ins: vec![],
                restart: 0,
                restart_pending: false,
                restarts: 0,
                since: None,
                exit: None,
            };
            ops.push(put(keys.state(&m, &n), encode(&state)));
        }
        if i % 3 == 2 {
            ops.push(put(keys.unscheduled(&n), b"no machine".to_vec()));
        }
    }
    write(&reg, ops).await;
    reg
}

/// Every page of `limit` from the first, following `next`, at the first page's revision.
async fn all_pages(reg: &Registry<MemKv>, limit: usize) -> Vec<UnitsPage> {
    let mut pages: Vec<UnitsPage> = Vec::new();
    loop {
        let after = pages.last().and_then(|p| p.next.clone());
        let revision = pages.last().map(|p| p.snapshot.revision);
        let page = reg
            .units_page(after.as_deref(), limit, revision)
            .await
            .unwrap();
        let done = page.next.is_none();
        pages.push(page);
        if done {
            return pages;
        }
    }
}

const TRICKY: [&str; 7] = [
    "a.service",
    "a.service.d.service",
    "a-b.service",
    "a@1.service",
    "b.service",
    "ab.service",
    "z.service",
];

#[test]
fn placement_bounds_hold_every_names_placements() {
    let names: BTreeSet<UnitName> = TRICKY.iter().map(|n| name(n)).collect();
    let (from, to) = placement_bounds(&names);
    for n in &names {
        let key = format!("{n}/m1");
        assert!(
            from.as_str() <= key.as_str() && key.as_str() < to.as_str(),
            "{key}"
        );
    }
    // First and last by name would have missed `a.service/…`, which sorts after
    // `a.service.d.service/…` but before `z.service/…`: the bounds come from `<name>/`.
    let two = BTreeSet::from([name("a.service"), name("a.service.d.service")]);
    let (from, to) = placement_bounds(&two);
    assert_eq!(
        (from.as_str(), to.as_str()),
        ("a.service.d.service/", "a.service0")
    );
}

#[test]
fn a_page_starts_just_after_its_cursor() {
    assert_eq!(start_after("/p/unit/", None), "/p/unit/");
    assert_eq!(
        start_after("/p/unit/", Some("a.service")),
        "/p/unit/a.service\0"
    );
    assert!("/p/unit/a.service" < start_after("/p/unit/", Some("a.service")).as_str());
    assert!(start_after("/p/unit/", Some("a.service")).as_str() < "/p/unit/a.service.d.service");
    assert_eq!(dir_end("/p/unit/"), "/p/unit0");
}

#[tokio::test(start_paused = true)]
async fn pages_hold_what_the_whole_snapshot_has_of_their_units() {
    let reg = registry(&TRICKY).await;
    let full = reg.snapshot().await.unwrap();
    for limit in [1, 2, 3, 100] {
        let pages = all_pages(&reg, limit).await;
        let listed: Vec<&UnitName> = pages.iter().flat_map(|p| p.snapshot.units.keys()).collect();
        let all: Vec<&UnitName> = full.units.keys().collect();
        assert_eq!(listed, all, "pages of {limit}");
        assert_eq!(
            pages.len(),
            TRICKY.len().div_ceil(limit),
            "pages of {limit}"
        );
        for page in &pages {
            assert!(page.snapshot.units.len() <= limit);
            assert_eq!(page.snapshot.revision, pages[0].snapshot.revision);
            for n in page.snapshot.units.keys() {
                assert_eq!(page.snapshot.schedule.get(n), full.schedule.get(n), "{n}");
                assert_eq!(page.snapshot.states.get(n), full.states.get(n), "{n}");
                assert_eq!(
                    page.snapshot.unscheduled.get(n),
                    full.unscheduled.get(n),
                    "{n}"
                );
            }
            // Nothing of another page's units.
            for n in page
                .snapshot
                .schedule
                .keys()
                .chain(page.snapshot.states.keys())
            {
                assert!(page.snapshot.units.contains_key(n), "{n}");
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn later_pages_read_the_listing_as_it_was_at_its_first() {
    let reg = registry(&["a.service", "b.service", "c.service", "d.service"]).await;
    let first = reg.units_page(None, 2, None).await.unwrap();
    assert_eq!(first.next.as_deref(), Some("b.service"));
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/false\n").unwrap();
    UnitsRole::new(reg.clone())
        .create_unit(&name("bb.service"), &file, DesiredState::Loaded)
        .await
        .unwrap();
    let second = reg
        .units_page(first.next.as_deref(), 2, Some(first.snapshot.revision))
        .await
        .unwrap();
    let names: Vec<&str> = second.snapshot.units.keys().map(UnitName::as_str).collect();
    assert_eq!(names, ["c.service", "d.service"]);
    assert_eq!(second.next, None);
    assert!(!second.restarted);
}

#[tokio::test(start_paused = true)]
async fn a_compacted_revision_goes_on_from_the_cursor_at_the_present() {
    let reg = registry(&["a.service", "b.service", "c.service"]).await;
    let first = reg.units_page(None, 1, None).await.unwrap();
    let file = UnitFile::parse(b"[Service]\nExecStart=/bin/false\n").unwrap();
    UnitsRole::new(reg.clone())
        .create_unit(&name("bb.service"), &file, DesiredState::Loaded)
        .await
        .unwrap();
    let now = reg.snapshot().await.unwrap().revision;
    reg.kv().compact(now).unwrap();
    let second = reg
        .units_page(first.next.as_deref(), 1, Some(first.snapshot.revision))
        .await
        .unwrap();
    assert!(second.restarted);
    assert_eq!(second.snapshot.revision, now);
    let names: Vec<&str> = second.snapshot.units.keys().map(UnitName::as_str).collect();
    assert_eq!(names, ["b.service"]);
    assert_eq!(second.next.as_deref(), Some("b.service"));
}

#[tokio::test(start_paused = true)]
async fn a_revision_ahead_of_the_store_reads_the_present() {
    let reg = registry(&["a.service", "b.service"]).await;
    let now = reg.snapshot().await.unwrap().revision;
    let page = reg
        .units_page(Some("a.service"), 1, Some(now + 1_000))
        .await
        .unwrap();
    assert!(page.restarted);
    assert_eq!(page.snapshot.revision, now);
    assert_eq!(
        page.snapshot
            .units
            .keys()
            .map(UnitName::as_str)
            .collect::<Vec<_>>(),
        ["b.service"]
    );
}

#[tokio::test(start_paused = true)]
async fn files_are_read_at_the_pages_revision() {
    let reg = registry(&["a.service"]).await;
    let unit = reg.unit(&name("a.service")).await.unwrap().unwrap();
    let rev = reg.snapshot().await.unwrap().revision;
    UnitsRole::new(reg.clone())
        .destroy_unit(&unit)
        .await
        .unwrap();
    let files = reg
        .files_at(&BTreeSet::from([unit.hash()]), rev)
        .await
        .unwrap();
    assert!(files.items.contains_key(&unit.hash()), "collected since");
    assert!(files.skipped.is_empty());
}

/// Issue 37: a host writes more states than its bound between two names of a page. The
/// page reads at most the bound and one more of that machine's states, takes the states a
/// whole snapshot takes of its units, and reports the machine as past its bound.
#[tokio::test(start_paused = true)]
async fn a_page_reads_no_more_of_a_machines_states_than_its_bound() {
    use crate::read::MAX_STATES_PER_MACHINE as MAX;
    let reg = registry(&["a.service", "z.service"]).await;
    let keys = reg.keys().clone();
    let m0 = machine(0);
    let ops = (0..MAX + 3)
        .map(|i| {
            let state = UnitStateRecord {
                name: name(&format!("b{i:05}.service")),
                machine: m0.clone(),
                hash: None,
                systemd: SystemdState::not_found(),
                drop_ins: vec![],
                restart: 0,
                restart_pending: false,
                restarts: 0,
                since: None,
                exit: None,
            };
            put(keys.state(&m0, &state.name), encode(&state))
        })
        .collect();
    write(&reg, ops).await;
    let full = reg.snapshot().await.unwrap();
    let page = reg.units_page(None, 100, None).await.unwrap();
    let (a, z) = (name("a.service"), name("z.service"));
    assert!(page.snapshot.states[&a].get(&m0).is_some());
    // z.service sorts after the host's 10,003 keys: past the bound, in a page as in a
    // snapshot.
    assert!(page.snapshot.states[&z].get(&m0).is_none());
    assert_eq!(page.snapshot.states.get(&z), full.states.get(&z));
    assert_eq!(page.snapshot.states.len(), 2);
    let report = &page.snapshot.skipped[&keys.machine_states(&m0)];
    assert!(report.detail.contains("(10000); at least 1 past the bound"));
}
