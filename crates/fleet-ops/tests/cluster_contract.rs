//! Contract tests of `RegistryCluster`: every body runs over the in-memory `MemKv` (paused
//! time) and over a real etcd started by the test, and together they call every method of
//! `Cluster`. fleetctl's etcd driver and fleetd's API handlers both run this code.

use fleet_core::{DesiredState, MachineId, MachineInfo, UnitFile, UnitName};
use fleet_ops::etcd::page::PageLimit;
use fleet_ops::model::Changes;
use fleet_ops::{
    Cluster, Destroyed, Expect, OpsError, PutOutcome, PutRequest, RegistryCluster, ReplaceHow,
    Restarted, StateChange, StateFilter,
};
use fleet_registry::kv::{Hook, Hooked, Kv, KvError, MemKv, Request, Txn, TxnOp};
use fleet_registry::{MetadataChange, Registry, ScheduleEntry, UnitsRole};
use fleet_testing::{TestEtcd, machine_running};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const PREFIX: &str = "/ops-contract/";

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn machine(s: &str) -> MachineId {
    s.parse().unwrap()
}

fn file(exec: &str) -> UnitFile {
    UnitFile::parse(format!("[Service]\nExecStart={exec}\n").as_bytes()).unwrap()
}

fn global(exec: &str) -> UnitFile {
    UnitFile::parse(format!("[Service]\nExecStart={exec}\n\n[X-Fleet]\nGlobal=true\n").as_bytes())
        .unwrap()
}

fn create(n: &str, f: UnitFile, desired: Option<DesiredState>) -> PutRequest {
    PutRequest {
        name: name(n),
        file: Some(f),
        desired,
        how: ReplaceHow::default(),
    }
}

fn state_only(n: &str, desired: DesiredState) -> PutRequest {
    PutRequest {
        name: name(n),
        file: None,
        desired: Some(desired),
        how: ReplaceHow::default(),
    }
}

async fn keys<K: Kv>(reg: &Registry<K>) -> Vec<(String, Vec<u8>)> {
    let res = reg.raw_kv().range(PREFIX, true, None).await.unwrap();
    res.kvs.into_iter().map(|kv| (kv.key, kv.value)).collect()
}

/// Registers `id` and publishes `unit`'s state there (active or not), as an agent would.
async fn machine_runs<K: Kv>(reg: &Registry<K>, id: &str, unit: &str, f: &UnitFile, up: bool) {
    machine_runs_all(reg, id, &[(unit, up)], f).await;
}

/// Registers `id` and publishes the states of `units` (each active or not) there.
async fn machine_runs_all<K: Kv>(
    reg: &Registry<K>,
    id: &str,
    units: &[(&str, bool)],
    f: &UnitFile,
) {
    let info = MachineInfo {
        id: machine(id),
        public_ip: format!("10.0.0.{}", id.len() % 9),
        metadata: [("role".to_owned(), id.to_owned())].into(),
        version: "test".into(),
        disable_engine: false,
        api: String::new(),
        fence_at: None,
    };
    let units: Vec<_> = units
        .iter()
        .map(|&(u, up)| (name(u), f.hash(), up))
        .collect();
    machine_running(reg, &info, Duration::from_secs(60), &units).await;
}

async fn schedule<K: Kv>(reg: &Registry<K>, unit: &str, on: &str, f: &UnitFile) {
    let entry = ScheduleEntry {
        name: name(unit),
        machine: machine(on),
        hash: f.hash(),
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    reg.write_schedule(&[entry], &[]).await.unwrap();
}

async fn put_creates_replaces_sets_state_or_leaves_a_unit_alone<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    let out = c
        .put(create("a.service", file("/bin/a"), None))
        .await
        .unwrap();
    let PutOutcome::Created(view) = out else {
        panic!("expected Created, got {out:?}");
    };
    assert_eq!(view.status.desired, DesiredState::Inactive);
    assert_eq!(view.status.hash, file("/bin/a").hash());
    assert!(!view.global);
    // The same content again (fleetctl's submit of a unit already there): nothing written.
    let before = keys(&reg).await;
    let out = c
        .put(create("a.service", file("/bin/a"), None))
        .await
        .unwrap();
    assert!(matches!(out, PutOutcome::Unchanged(_)), "{out:?}");
    assert_eq!(keys(&reg).await, before);
    let out = c
        .put(state_only("a.service", DesiredState::Launched))
        .await
        .unwrap();
    assert!(
        matches!(&out, PutOutcome::StateChanged(v) if v.status.desired == DesiredState::Launched)
    );
    // A replace keeps the state it does not name.
    let out = c
        .put(create("a.service", file("/bin/b"), None))
        .await
        .unwrap();
    let PutOutcome::Replaced(view) = out else {
        panic!("expected Replaced, got {out:?}");
    };
    assert_eq!(view.status.desired, DesiredState::Launched);
    assert_eq!(view.file, file("/bin/b"));
    assert!(reg.file(&file("/bin/a").hash()).await.unwrap().is_none());
    // A state alone may lower (fleet's PUT).
    let out = c
        .put(state_only("a.service", DesiredState::Inactive))
        .await
        .unwrap();
    assert!(matches!(out, PutOutcome::StateChanged(_)), "{out:?}");
}

async fn refused_puts_write_nothing<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    c.put(create(
        "a.service",
        file("/bin/a"),
        Some(DesiredState::Launched),
    ))
    .await
    .unwrap();
    let before = keys(&reg).await;
    let lowers = c
        .put(create(
            "a.service",
            file("/bin/b"),
            Some(DesiredState::Loaded),
        ))
        .await
        .unwrap_err();
    assert!(matches!(lowers, OpsError::ReplaceLowers { .. }), "{lowers}");
    let no_options = c
        .put(state_only("new.service", DesiredState::Launched))
        .await
        .unwrap_err();
    assert!(matches!(no_options, OpsError::NoOptions(_)), "{no_options}");
    let template = c
        .put(create(
            "t@.service",
            file("/bin/t"),
            Some(DesiredState::Loaded),
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(template, OpsError::ActivateTemplate(_)),
        "{template}"
    );
    let bad = UnitFile::parse(
        b"[Service]\nExecStart=/bin/x\n[X-Fleet]\nConflicts=x.service\nReplaces=y.service\n",
    )
    .unwrap();
    let invalid = c.put(create("b.service", bad, None)).await.unwrap_err();
    assert_eq!(
        invalid.to_string(),
        "b.service: Conflicts cannot be used with Replaces"
    );
    assert_eq!(keys(&reg).await, before);
}

async fn a_reschedule_avoids_the_machine_a_unit_runs_on<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    c.put(create(
        "a.service",
        file("/bin/a"),
        Some(DesiredState::Launched),
    ))
    .await
    .unwrap();
    schedule(&reg, "a.service", "m1", &file("/bin/a")).await;
    let mut req = create("a.service", file("/bin/b"), None);
    req.how = ReplaceHow {
        no_restart: true,
        reschedule: true,
        ..ReplaceHow::default()
    };
    c.put(req).await.unwrap();
    let record = reg.unit(&name("a.service")).await.unwrap().unwrap().record;
    assert_eq!(record.replace.avoid, Some(machine("m1")));
    assert_eq!(record.replace.placement, 1);
    assert!(record.replace.no_restart);
}

/// fleet's form keeps the unit's machine for the launch that follows, only when it leaves the
/// unit inactive, and only until the unit is made inactive again.
async fn a_replace_in_fleets_form_keeps_the_machine_for_the_next_launch_only<K: Kv>(
    reg: Registry<K>,
) {
    let c = RegistryCluster::new(reg.clone());
    let a = name("a.service");
    c.put(create(
        "a.service",
        file("/bin/a"),
        Some(DesiredState::Launched),
    ))
    .await
    .unwrap();
    schedule(&reg, "a.service", "m1", &file("/bin/a")).await;
    let fleets = |exec: &str, desired| {
        let mut req = create("a.service", file(exec), desired);
        req.how.fleet_form = true;
        req
    };
    c.put(fleets("/bin/b", None)).await.unwrap();
    let record = reg.unit(&a).await.unwrap().unwrap().record;
    assert_eq!(record.desired, DesiredState::Inactive);
    assert_eq!(record.replace.prefer, Some(machine("m1")));
    c.set_state(&a, StateChange::Raise(DesiredState::Launched))
        .await
        .unwrap();
    let record = reg.unit(&a).await.unwrap().unwrap().record;
    assert_eq!(
        record.replace.prefer,
        Some(machine("m1")),
        "kept for the launch"
    );
    c.set_state(&a, StateChange::Unload).await.unwrap();
    let record = reg.unit(&a).await.unwrap().unwrap().record;
    assert_eq!(record.replace.prefer, None, "made inactive again");
    // A replace in fleet's form that asks for a placed state keeps no machine.
    c.put(fleets("/bin/c", Some(DesiredState::Launched)))
        .await
        .unwrap();
    let record = reg.unit(&a).await.unwrap().unwrap().record;
    assert_eq!(record.replace.prefer, None);
}

async fn listings_show_placement_current_state_and_only_named_units<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    for n in ["a.service", "b.service", "c.service"] {
        c.put(create(
            n,
            file(&format!("/bin/{n}")),
            Some(DesiredState::Launched),
        ))
        .await
        .unwrap();
    }
    c.put(create(
        "g.service",
        global("/bin/g"),
        Some(DesiredState::Launched),
    ))
    .await
    .unwrap();
    let fa = file("/bin/a.service");
    schedule(&reg, "a.service", "m2", &fa).await;
    machine_runs(&reg, "m2", "a.service", &fa, true).await;
    let listing = c.units(None).await.unwrap();
    let names: Vec<&str> = listing.units.iter().map(|u| u.name().as_str()).collect();
    assert_eq!(names, ["a.service", "b.service", "c.service", "g.service"]);
    let a = &listing.units[0];
    assert_eq!(a.status.machines, vec![machine("m2")]);
    assert_eq!(a.current, DesiredState::Launched);
    assert_eq!(listing.units[1].current, DesiredState::Inactive);
    assert!(listing.units[3].global);
    assert!(listing.skipped.is_empty());
    let wanted: BTreeSet<UnitName> = [name("c.service"), name("gone.service")].into();
    let named = c.units(Some(&wanted)).await.unwrap();
    assert_eq!(named.units.len(), 1);
    assert_eq!(named.units[0].name(), &name("c.service"));
    let one = c.unit(&name("a.service")).await.unwrap().unwrap();
    assert_eq!(&one, a);
    assert_eq!(c.unit(&name("gone.service")).await.unwrap(), None);
    // Pages: the same units, each once.
    let (first, more) = c.units_page(None, 0, 3).await.unwrap();
    assert!(more);
    let (second, more) = c.units_page(None, 3, 3).await.unwrap();
    assert!(!more);
    let paged: Vec<_> = first.units.into_iter().chain(second.units).collect();
    assert_eq!(paged, listing.units);
}

async fn listings_skip_unreadable_values_and_say_so<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    c.put(create("a.service", file("/bin/a"), None))
        .await
        .unwrap();
    c.put(create("b.service", file("/bin/b"), None))
        .await
        .unwrap();
    reg.put_raw(&reg.keys().unit(&name("b.service")), "not json")
        .await;
    reg.put_raw(&reg.keys().file(&file("/bin/a").hash()), "[Service\n")
        .await;
    let listing = c.units(None).await.unwrap();
    assert!(listing.units.is_empty(), "{listing:?}");
    // Asked for by name, an unreadable record is an error naming its key.
    let err = c.unit(&name("b.service")).await.unwrap_err();
    assert!(err.to_string().contains("/unit/b.service"), "{err}");
    assert_eq!(listing.skipped.len(), 2, "{:?}", listing.skipped);
    assert!(
        listing
            .skipped
            .iter()
            .any(|s| s.contains("/unit/b.service"))
    );
    assert!(listing.skipped.iter().any(|s| s.contains("/file/")));
    // The page path reads the page's files one by one: the same warnings.
    let (page, _) = c.units_page(None, 0, 10).await.unwrap();
    assert_eq!(page.skipped.len(), 2, "{:?}", page.skipped);
    let state = reg
        .keys()
        .state(&"m1".parse().unwrap(), &name("evil.service"));
    reg.put_raw(&state, "not json").await;
    let states = c.states(&StateFilter::default()).await.unwrap();
    assert!(states.states.is_empty());
    assert_eq!(states.skipped.len(), 1, "{:?}", states.skipped);
    assert!(states.skipped[0].contains(&state), "{:?}", states.skipped);
}

async fn states_are_filtered_and_machines_carry_metadata_and_notice<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    let f = file("/bin/a");
    machine_runs(&reg, "m1", "a.service", &f, true).await;
    machine_runs_all(&reg, "m2", &[("a.service", false), ("b.service", true)], &f).await;
    let all = c.states(&StateFilter::default()).await.unwrap();
    assert!(all.skipped.is_empty());
    let all = all.states;
    let pairs: Vec<(&str, &str)> = all
        .iter()
        .map(|s| (s.name.as_str(), s.machine.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("a.service", "m1"),
            ("a.service", "m2"),
            ("b.service", "m2")
        ]
    );
    assert_eq!(all[0].active, "active");
    assert_eq!(all[0].hash, Some(f.hash()));
    let filter = StateFilter {
        machine: Some(machine("m2")),
        unit: Some(name("a.service")),
    };
    let some = c.states(&filter).await.unwrap().states;
    assert_eq!(some.len(), 1);
    assert_eq!(some[0].sub, "dead");

    let changes = [MetadataChange::Set {
        machine: machine("m1"),
        key: "tier".parse().unwrap(),
        value: "api".into(),
    }];
    c.change_metadata(&changes).await.unwrap();
    c.change_metadata(&[]).await.unwrap();
    let listing = c.machines().await.unwrap();
    let ids: Vec<&str> = listing.machines.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["m1", "m2"]);
    assert_eq!(listing.machines[0].metadata["tier"], "api");
    assert_eq!(listing.notice, None);
    reg.put_raw(&reg.keys().disruption(), "rescheduling held")
        .await;
    let listing = c.machines().await.unwrap();
    assert_eq!(listing.notice.as_deref(), Some("rescheduling held"));
}

async fn state_changes_follow_fleetctls_rules<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    c.put(create("a.service", file("/bin/a"), None))
        .await
        .unwrap();
    let a = name("a.service");
    let err = c.set_state(&a, StateChange::Stop).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "Unable to stop unit a.service in state inactive"
    );
    let raised = c
        .set_state(&a, StateChange::Raise(DesiredState::Launched))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(raised.status.desired, DesiredState::Launched);
    assert_eq!(raised.file, file("/bin/a"));
    let before = keys(&reg).await;
    assert_eq!(
        c.set_state(&a, StateChange::Raise(DesiredState::Loaded))
            .await
            .unwrap(),
        None
    );
    assert_eq!(keys(&reg).await, before);
    let stopped = c.set_state(&a, StateChange::Stop).await.unwrap().unwrap();
    assert_eq!(stopped.status.desired, DesiredState::Loaded);
    assert_eq!(c.set_state(&a, StateChange::Stop).await.unwrap(), None);
    let unloaded = c.set_state(&a, StateChange::Unload).await.unwrap().unwrap();
    assert_eq!(unloaded.status.desired, DesiredState::Inactive);
    let missing = c
        .set_state(&name("gone.service"), StateChange::Unload)
        .await
        .unwrap_err();
    assert!(matches!(missing, OpsError::NoSuchUnit(_)), "{missing}");
}

async fn restart_bumps_the_generation_or_launches<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    let a = name("a.service");
    c.put(create("a.service", file("/bin/a"), None))
        .await
        .unwrap();
    let err = c.restart(&a).await.unwrap_err();
    assert!(matches!(err, OpsError::RestartInactive(_)), "{err}");
    c.put(state_only("a.service", DesiredState::Loaded))
        .await
        .unwrap();
    assert_eq!(c.restart(&a).await.unwrap(), Restarted::Launched);
    assert_eq!(c.restart(&a).await.unwrap(), Restarted::Generation(1));
    assert_eq!(c.restart(&a).await.unwrap(), Restarted::Generation(2));
    assert_eq!(c.unit(&a).await.unwrap().unwrap().status.restart, 2);
    let missing = c.restart(&name("gone.service")).await.unwrap_err();
    assert!(matches!(missing, OpsError::NoSuchUnit(_)), "{missing}");
}

async fn destroy_removes_units_and_unreadable_records<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    c.put(create("a.service", file("/bin/a"), None))
        .await
        .unwrap();
    c.put(create("b.service", file("/bin/b"), None))
        .await
        .unwrap();
    reg.put_raw(&reg.keys().unit(&name("b.service")), "not json")
        .await;
    assert_eq!(
        c.destroy(&name("a.service")).await.unwrap(),
        Destroyed::Unit
    );
    let out = c.destroy(&name("b.service")).await.unwrap();
    assert!(
        matches!(&out, Destroyed::Unreadable(why) if why.contains("b.service")),
        "{out:?}"
    );
    assert_eq!(
        c.destroy(&name("a.service")).await.unwrap(),
        Destroyed::Missing
    );
    assert!(keys(&reg).await.is_empty());
}

async fn a_rolling_replace_advances_then_finishes<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    let g = name("g.service");
    c.put(create(
        "g.service",
        global("/bin/old"),
        Some(DesiredState::Launched),
    ))
    .await
    .unwrap();
    let mut req = create("g.service", global("/bin/new"), None);
    req.how.rolling = true;
    c.put(req).await.unwrap();
    let rollout = |reg: Registry<K>| async move {
        let unit = reg.unit(&name("g.service")).await.unwrap().unwrap();
        unit.record.replace.rollout
    };
    let started = rollout(reg.clone()).await.unwrap();
    assert_eq!(started.previous, global("/bin/old").hash());
    assert!(started.updated.is_empty());
    let view = c.advance_rollout(&g, &[machine("m1")]).await.unwrap();
    assert_eq!(view.status.hash, global("/bin/new").hash());
    let advanced = rollout(reg.clone()).await.unwrap();
    assert_eq!(advanced.updated, [machine("m1")].into());
    c.finish_rollout(&g).await.unwrap();
    assert_eq!(rollout(reg.clone()).await, None);
    assert!(
        reg.file(&global("/bin/old").hash())
            .await
            .unwrap()
            .is_none()
    );
    // Finishing a unit that is gone is nothing to do; advancing one is an error.
    c.destroy(&g).await.unwrap();
    c.finish_rollout(&g).await.unwrap();
    let err = c.advance_rollout(&g, &[machine("m1")]).await.unwrap_err();
    assert!(matches!(err, OpsError::NoSuchUnit(_)), "{err}");
}

async fn a_watch_sees_its_units_states_and_machines_change<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    let a = name("a.service");
    c.put(create("a.service", file("/bin/a"), None))
        .await
        .unwrap();
    let mut changes = c
        .watch([a.clone(), name("b.service")].into())
        .await
        .unwrap();
    assert_eq!(changes.names().len(), 2);
    assert_eq!(changes.view().units[&a].desired, DesiredState::Inactive);
    assert!(!changes.view().units.contains_key(&name("b.service")));
    c.set_state(&a, StateChange::Raise(DesiredState::Launched))
        .await
        .unwrap();
    changes.changed().await.unwrap();
    assert_eq!(changes.view().units[&a].desired, DesiredState::Launched);
    schedule(&reg, "a.service", "m1", &file("/bin/a")).await;
    machine_runs(&reg, "m1", "a.service", &file("/bin/a"), true).await;
    while changes
        .view()
        .states
        .get(&a)
        .is_none_or(|s| !s.contains_key(&machine("m1")))
    {
        changes.changed().await.unwrap();
    }
    let view = changes.view();
    assert_eq!(view.units[&a].machines, vec![machine("m1")]);
    assert_eq!(view.states[&a][&machine("m1")].active, "active");
    assert!(view.machines.contains_key(&machine("m1")));
}

/// Another client that writes `a.service` just before each of our first `times`
/// transactions on it: creates it with `file` at `desired`, replaces it with `file` when it
/// holds other content, or else bumps its restart generation.
#[derive(Clone)]
struct Meddler<K> {
    other: Registry<K>,
    file: UnitFile,
    desired: DesiredState,
    left: Arc<AtomicUsize>,
}

impl<K: Kv> Hook for Meddler<K> {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        let key = self.other.keys().unit(&name("a.service"));
        let ours =
            matches!(request, Request::Txn(txn) if txn.compares.iter().any(|c| c.key == key));
        let fire = ours
            && self
                .left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if fire {
            let units = UnitsRole::new(self.other.clone());
            match self.other.unit(&name("a.service")).await.unwrap() {
                None => {
                    units
                        .create_unit(&name("a.service"), &self.file, self.desired)
                        .await
                        .unwrap();
                }
                Some(unit) if unit.hash() != self.file.hash() => {
                    units
                        .replace_unit(&unit, &self.file, unit.desired())
                        .await
                        .unwrap();
                }
                Some(unit) => {
                    units.request_restart(&unit).await.unwrap();
                }
            }
        }
        Ok(())
    }
}

fn meddled<K: Kv>(
    reg: &Registry<K>,
    file: UnitFile,
    desired: DesiredState,
    times: usize,
) -> RegistryCluster<Hooked<K, Meddler<K>>> {
    let hook = Meddler {
        other: reg.clone(),
        file,
        desired,
        left: Arc::new(AtomicUsize::new(times)),
    };
    let kv = Hooked {
        inner: reg.raw_kv().clone(),
        hook,
    };
    RegistryCluster::new(Registry::new(kv, PREFIX))
}

async fn a_create_that_loses_a_race_to_the_same_content_is_unchanged<K: Kv>(reg: Registry<K>) {
    let c = meddled(&reg, file("/bin/a"), DesiredState::Launched, 1);
    let out = c
        .put(create(
            "a.service",
            file("/bin/a"),
            Some(DesiredState::Loaded),
        ))
        .await
        .unwrap();
    assert!(
        matches!(&out, PutOutcome::Unchanged(v) if v.status.desired == DesiredState::Launched),
        "{out:?}"
    );
}

async fn a_create_that_loses_a_race_below_its_state_raises_it<K: Kv>(reg: Registry<K>) {
    let c = meddled(&reg, file("/bin/a"), DesiredState::Inactive, 1);
    let out = c
        .put(create(
            "a.service",
            file("/bin/a"),
            Some(DesiredState::Launched),
        ))
        .await
        .unwrap();
    assert!(
        matches!(&out, PutOutcome::StateChanged(v) if v.status.desired == DesiredState::Launched),
        "{out:?}"
    );
}

async fn a_create_that_loses_a_race_to_other_content_is_a_conflict<K: Kv>(reg: Registry<K>) {
    let c = meddled(&reg, file("/bin/theirs"), DesiredState::Inactive, 1);
    let err = c
        .put(create("a.service", file("/bin/a"), None))
        .await
        .unwrap_err();
    assert!(matches!(err, OpsError::Conflict(_)), "{err}");
    let unit = reg.unit(&name("a.service")).await.unwrap().unwrap();
    assert_eq!(unit.hash(), file("/bin/theirs").hash());
}

async fn writes_retry_a_concurrent_change_five_times_then_conflict<K: Kv>(reg: Registry<K>) {
    RegistryCluster::new(reg.clone())
        .put(create(
            "a.service",
            file("/bin/a"),
            Some(DesiredState::Launched),
        ))
        .await
        .unwrap();
    // Four changes in between: the fifth attempt writes.
    let c = meddled(&reg, file("/bin/a"), DesiredState::Launched, 4);
    let stopped = c
        .set_state(&name("a.service"), StateChange::Stop)
        .await
        .unwrap();
    assert_eq!(stopped.unwrap().status.desired, DesiredState::Loaded);
    // Five: nothing of ours is written.
    let c = meddled(&reg, file("/bin/a"), DesiredState::Launched, 5);
    let err = c
        .set_state(&name("a.service"), StateChange::Unload)
        .await
        .unwrap_err();
    assert!(matches!(err, OpsError::Conflict(_)), "{err}");
    let unit = reg.unit(&name("a.service")).await.unwrap().unwrap();
    assert_eq!(unit.desired(), DesiredState::Loaded);
    let c = meddled(&reg, file("/bin/a"), DesiredState::Launched, 5);
    assert!(matches!(
        c.destroy(&name("a.service")).await,
        Err(OpsError::Conflict(_))
    ));
    assert!(reg.unit(&name("a.service")).await.unwrap().is_some());
}

async fn put_if_refuses_to_write_over_another_clients_write<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    let hash = |exec: &str| file(exec).hash();
    let out = c
        .put_if(create("a.service", file("/bin/a"), None), Expect::Absent)
        .await
        .unwrap();
    assert!(matches!(out, PutOutcome::Created(_)), "{out:?}");
    // Another client put the very content asked: fine.
    let out = c
        .put_if(create("a.service", file("/bin/a"), None), Expect::Absent)
        .await
        .unwrap();
    assert!(matches!(out, PutOutcome::Unchanged(_)), "{out:?}");
    let err = c
        .put_if(create("a.service", file("/bin/x"), None), Expect::Absent)
        .await
        .unwrap_err();
    assert!(matches!(err, OpsError::Conflict(_)), "{err}");
    let out = c
        .put_if(
            create("a.service", file("/bin/b"), None),
            Expect::Content(hash("/bin/a")),
        )
        .await
        .unwrap();
    assert!(matches!(out, PutOutcome::Replaced(_)), "{out:?}");
    let before = keys(&reg).await;
    let err = c
        .put_if(
            create("a.service", file("/bin/c"), None),
            Expect::Content(hash("/bin/a")),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, OpsError::Conflict(_)), "{err}");
    assert_eq!(keys(&reg).await, before);
    // A replace by another client between our read and our write: ours fails, theirs stays.
    let c = meddled(&reg, file("/bin/theirs"), DesiredState::Inactive, 1);
    let err = c
        .put_if(
            create("a.service", file("/bin/d"), None),
            Expect::Content(hash("/bin/b")),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, OpsError::Conflict(_)), "{err}");
    let unit = reg.unit(&name("a.service")).await.unwrap().unwrap();
    assert_eq!(unit.hash(), hash("/bin/theirs"));
}

/// A put decided from what the caller read fails, writing nothing, once another client changed
/// the unit (two `start --replace` at once: one wins, the other is told); the same content
/// put by both is no conflict. (Helper B's test of the same put_if.)
async fn put_if_refuses_a_unit_changed_since_the_caller_read_it<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    let (v0, va, vb) = (file("/bin/v0"), file("/bin/va"), file("/bin/vb"));
    let absent = Expect::Absent;
    c.put_if(create("r.service", v0.clone(), None), absent)
        .await
        .unwrap();
    let from_v0 = Expect::Content(v0.hash());
    let winner = c.put_if(create("r.service", va.clone(), None), from_v0);
    assert!(matches!(winner.await.unwrap(), PutOutcome::Replaced(_)));
    let before = keys(&reg).await;
    let loser = c
        .put_if(create("r.service", vb.clone(), None), from_v0)
        .await;
    assert!(matches!(loser, Err(OpsError::Conflict(_))), "{loser:?}");
    assert!(
        loser
            .unwrap_err()
            .to_string()
            .contains("nothing was written"),
        "the loser is told nothing was written"
    );
    let created = c.put_if(create("r.service", vb, None), absent).await;
    assert!(matches!(created, Err(OpsError::Conflict(_))), "{created:?}");
    assert_eq!(keys(&reg).await, before, "a refused put_if wrote");
    let same = c.put_if(create("r.service", va, None), from_v0).await;
    assert!(matches!(same, Ok(PutOutcome::Unchanged(_))), "{same:?}");
}

/// Counts the transactions that write several units, fails the `fail_at`th of them (from 1)
/// as an unreachable etcd would, and records the largest compare and branch counts seen.
#[derive(Clone, Default)]
struct Batches {
    seen: Arc<AtomicUsize>,
    most_ops: Arc<AtomicUsize>,
    /// The batch transaction (counted from 1) that fails, every time it is sent: a batch
    /// whose answer is lost once is read back and sent again, so a failure must last.
    fail_at: usize,
    failing: Arc<std::sync::Mutex<Option<fleet_registry::kv::Txn>>>,
}

impl Hook for Batches {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        let Request::Txn(txn) = request else {
            return Ok(());
        };
        let ops = txn
            .compares
            .len()
            .max(txn.success.len())
            .max(txn.failure.len());
        self.most_ops.fetch_max(ops, Ordering::SeqCst);
        let mut failing = self.failing.lock().unwrap();
        let again = failing.as_ref() == Some(txn);
        if again
            || (txn.compares.len() > 1
                && self.seen.fetch_add(1, Ordering::SeqCst) + 1 == self.fail_at)
        {
            *failing = Some(txn.clone());
            return Err(KvError::Unavailable {
                endpoints: "test".into(),
                detail: "down for this one".into(),
            });
        }
        Ok(())
    }
}

fn instances(count: usize) -> Vec<PutRequest> {
    (0..count)
        .map(|i| {
            create(
                &format!("t@{i}.service"),
                file("/bin/t"),
                Some(DesiredState::Launched),
            )
        })
        .collect()
}

async fn create_many_writes_many_units_per_transaction_within_128_ops<K: Kv>(reg: Registry<K>) {
    let hook = Batches::default();
    let kv = Hooked {
        inner: reg.raw_kv().clone(),
        hook: hook.clone(),
    };
    let c = RegistryCluster::new(Registry::new(kv, PREFIX));
    let mut reqs = instances(1000);
    // One bad request is refused on its own, as a single put refuses it.
    reqs.insert(
        10,
        create("t@.service", file("/bin/t"), Some(DesiredState::Launched)),
    );
    let created = c.create_many(reqs).await;

    assert_eq!(created.len(), 1001);
    assert!(
        matches!(created[10].1, Err(OpsError::ActivateTemplate(_))),
        "{:?}",
        created[10]
    );
    for (name, res) in created.iter().filter(|(n, _)| n.as_str() != "t@.service") {
        assert!(matches!(res, Ok(PutOutcome::Created(_))), "{name}: {res:?}");
        let unit = reg.unit(name).await.unwrap().unwrap();
        assert_eq!(unit.desired(), DesiredState::Launched);
    }
    assert_eq!(hook.seen.load(Ordering::SeqCst), 1000_usize.div_ceil(63));
    assert!(hook.most_ops.load(Ordering::SeqCst) <= fleet_registry::MAX_TXN_OPS);

    // Again, with one unit replaced meanwhile by other content: the rest are unchanged, it
    // is a conflict (another client's content is theirs to keep).
    let other = reg.unit(&name("t@500.service")).await.unwrap().unwrap();
    UnitsRole::new(reg.clone())
        .replace_unit(&other, &file("/bin/other"), DesiredState::Launched)
        .await
        .unwrap();
    let again = c.create_many(instances(1000)).await;
    for (name, res) in &again {
        if name.as_str() == "t@500.service" {
            assert!(matches!(res, Err(OpsError::Conflict(_))), "{res:?}");
        } else {
            assert!(
                matches!(res, Ok(PutOutcome::Unchanged(_))),
                "{name}: {res:?}"
            );
        }
    }
}

async fn create_many_stops_at_a_failed_transaction_and_again_writes_the_rest<K: Kv>(
    reg: Registry<K>,
) {
    let hook = Batches {
        fail_at: 3,
        ..Batches::default()
    };
    let kv = Hooked {
        inner: reg.raw_kv().clone(),
        hook,
    };
    let c = RegistryCluster::new(Registry::new(kv, PREFIX));
    let created = c.create_many(instances(1000)).await;

    let mut written = 0;
    let mut failed = Vec::new();
    for (name, res) in &created {
        let there = reg.unit(name).await.unwrap().is_some();
        match res {
            Ok(PutOutcome::Created(_)) => {
                assert!(there, "{name} said created");
                written += 1;
            }
            Err(OpsError::NotWritten { .. }) => assert!(!there, "{name} said not written"),
            Err(e) => {
                assert!(!there, "{name} failed but was written");
                failed.push(e.to_string());
            }
            Ok(other) => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].contains("down for this one"), "{failed:?}");
    // The batches before the failed one are written; no new batch starts after it.
    assert!(written >= 2 * 63, "{written}");
    let in_flight = fleet_ops::etcd::BATCHES_IN_FLIGHT;
    assert!(written <= (2 + in_flight) * 63, "{written}");

    // Once etcd takes that batch again, the same command writes the rest.
    let again = RegistryCluster::new(reg.clone())
        .create_many(instances(1000))
        .await;
    assert!(again.iter().all(|(_, res)| res.is_ok()), "{again:?}");
    for (name, _) in &again {
        assert!(reg.unit(name).await.unwrap().is_some(), "{name}");
    }
}

/// Rewrites (with the same value) the unit record that the first many-unit transaction
/// compares first, just before that transaction reaches the store, as another client's
/// write between a command's read and its write would.
#[derive(Clone)]
struct TouchFirst<K> {
    kv: K,
    done: Arc<std::sync::atomic::AtomicBool>,
}

impl<K: Kv> Hook for TouchFirst<K> {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        let Request::Txn(txn) = request else {
            return Ok(());
        };
        if txn.compares.len() < 2 || self.done.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let key = txn.compares[0].key.clone();
        let value = self.kv.range(&key, false, None).await?.kvs[0].value.clone();
        let put = TxnOp::Put {
            key,
            value,
            lease: None,
        };
        let txn = Txn {
            success: vec![put],
            ..Txn::default()
        };
        self.kv.txn(txn).await?;
        Ok(())
    }
}

/// Both hooks: the meddling one first.
#[derive(Clone)]
struct Both<A, B>(A, B);

impl<A: Hook, B: Hook> Hook for Both<A, B> {
    async fn before(&self, request: Request<'_>) -> Result<(), KvError> {
        self.0.before(request).await?;
        self.1.before(request).await
    }
}

fn touching_first<K: Kv>(
    reg: &Registry<K>,
    batches: Batches,
) -> RegistryCluster<Hooked<K, Both<TouchFirst<K>, Batches>>> {
    let meddle = TouchFirst {
        kv: reg.raw_kv().clone(),
        done: Arc::default(),
    };
    let kv = Hooked {
        inner: reg.raw_kv().clone(),
        hook: Both(meddle, batches),
    };
    RegistryCluster::new(Registry::new(kv, PREFIX))
}

async fn destroy_many_deletes_many_units_per_transaction_and_collects_their_files<K: Kv>(
    reg: Registry<K>,
) {
    let c = RegistryCluster::new(reg.clone());
    c.put(create("solo.service", file("/bin/solo"), None))
        .await
        .unwrap();
    let solo = keys(&reg).await;
    let created = c.create_many(instances(300)).await;
    assert!(created.iter().all(|(_, res)| res.is_ok()));
    let batches = Batches::default();
    let meddling = touching_first(&reg, batches.clone());
    let mut names: Vec<UnitName> = (0..300).map(|i| name(&format!("t@{i}.service"))).collect();
    names.push(name("missing.service"));
    names.push(name("t@1.service"));
    let destroyed = meddling.destroy_many(names.clone()).await;

    assert_eq!(destroyed.len(), 302);
    for ((asked, (got, res)), i) in names.iter().zip(&destroyed).zip(0..) {
        assert_eq!(asked, got);
        let expect = if i < 300 {
            Destroyed::Unit
        } else {
            Destroyed::Missing
        };
        assert_eq!(res.as_ref().unwrap(), &expect, "{got}");
    }
    // 64 to a transaction (a compare, the record's delete and its reference's); the batch
    // whose first unit another client changed meanwhile wrote nothing and its units went one
    // by one. Nothing of the 300 is left, not even their file.
    assert_eq!(batches.seen.load(Ordering::SeqCst), 300_usize.div_ceil(64));
    assert!(batches.most_ops.load(Ordering::SeqCst) <= fleet_registry::MAX_TXN_OPS);
    assert_eq!(keys(&reg).await, solo);
}

async fn destroy_many_stops_at_a_failed_transaction<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    c.create_many(instances(1000)).await;
    let hook = Batches {
        fail_at: 3,
        ..Batches::default()
    };
    let kv = Hooked {
        inner: reg.raw_kv().clone(),
        hook,
    };
    let failing = RegistryCluster::new(Registry::new(kv, PREFIX));
    let names: Vec<UnitName> = instances(1000).into_iter().map(|r| r.name).collect();
    let destroyed = failing.destroy_many(names.clone()).await;

    let mut gone = 0;
    let mut failed = Vec::new();
    for (name, res) in &destroyed {
        let there = reg.unit(name).await.unwrap().is_some();
        match res {
            Ok(Destroyed::Unit) => {
                assert!(!there, "{name} said destroyed");
                gone += 1;
            }
            Err(OpsError::NotWritten { .. }) => assert!(there, "{name} said not written"),
            Err(e) => {
                assert!(there, "{name} failed but was destroyed");
                failed.push(e.to_string());
            }
            Ok(other) => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].contains("down for this one"), "{failed:?}");
    let in_flight = fleet_ops::etcd::BATCHES_IN_FLIGHT;
    assert!(gone >= 2 * 64 && gone <= (2 + in_flight) * 64, "{gone}");

    // Again, once etcd takes it: the rest go, the ones gone already are missing.
    let again = c.destroy_many(names).await;
    assert!(again.iter().all(|(_, res)| res.is_ok()), "{again:?}");
    assert!(keys(&reg).await.is_empty());
}

async fn put_many_if_replaces_many_units_per_transaction<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    c.create_many(instances(100)).await;
    let old = file("/bin/t").hash();
    let new = file("/bin/new");
    let replace = |i: usize, expect: Expect| {
        let req = create(
            &format!("t@{i}.service"),
            new.clone(),
            Some(DesiredState::Launched),
        );
        (req, expect)
    };
    let mut reqs: Vec<(PutRequest, Expect)> =
        (0..100).map(|i| replace(i, Expect::Content(old))).collect();
    // Another client's content since the caller read it: refused, as by put_if.
    reqs[50].1 = Expect::Content(new.hash());
    // Not a replace: the single put decides it.
    let solo = c
        .put(create("solo.service", file("/bin/solo"), None))
        .await
        .unwrap();
    let PutOutcome::Created(solo) = solo else {
        panic!("{solo:?}")
    };
    reqs.push((
        state_only("solo.service", DesiredState::Launched),
        Expect::Content(solo.status.hash),
    ));
    let batches = Batches::default();
    let put = touching_first(&reg, batches.clone())
        .put_many_if(reqs)
        .await;

    assert_eq!(put.len(), 101);
    for (i, (name, res)) in put.iter().enumerate() {
        match i {
            50 => assert!(matches!(res, Err(OpsError::Conflict(_))), "{res:?}"),
            100 => assert!(matches!(res, Ok(PutOutcome::StateChanged(_))), "{res:?}"),
            _ => {
                assert!(
                    matches!(res, Ok(PutOutcome::Replaced(_))),
                    "{name}: {res:?}"
                );
                let unit = reg.unit(name).await.unwrap().unwrap();
                assert_eq!(unit.hash(), new.hash(), "{name}");
                assert_eq!(unit.desired(), DesiredState::Launched, "{name}");
            }
        }
    }
    // The file once, then a record put and a reference put and delete each: 42 a
    // transaction, 99 replaces in 3 (one of them meddled with, its units then one by one).
    assert_eq!(batches.seen.load(Ordering::SeqCst), 3);
    // t@50 still refers to the old file: it stays until that unit is replaced too.
    assert!(reg.file(&old).await.unwrap().is_some());
    let last = c.put_many_if(vec![replace(50, Expect::Content(old))]).await;
    assert!(matches!(last[0].1, Ok(PutOutcome::Replaced(_))), "{last:?}");
    assert!(
        reg.file(&old).await.unwrap().is_none(),
        "the old file is collected"
    );
    let refs: Vec<_> = keys(&reg)
        .await
        .into_iter()
        .filter(|(k, _)| k.contains(&old.to_string()))
        .collect();
    assert!(refs.is_empty(), "{refs:?}");
}

/// Issue 38, item 4: a unit record whose file is gone from the registry was left out of
/// `list-unit-files` and `GET /units` without a word. Every listing (whole, a page, a page
/// after a cursor, a few named, and past the size that reads every file at once) reports it
/// as it reports a corrupt record, naming the fix, and `destroy` removes it.
async fn a_unit_whose_file_is_missing_is_reported_by_every_listing_and_destroyed<K: Kv>(
    reg: Registry<K>,
) {
    let c = RegistryCluster::new(reg.clone());
    for i in 0..70 {
        let n = format!("a{i:02}.service");
        c.put(create(&n, file(&format!("/bin/{n}")), None))
            .await
            .unwrap();
    }
    c.put(create("b.service", file("/bin/b"), None))
        .await
        .unwrap();
    let delete = Txn {
        success: vec![TxnOp::Delete {
            key: reg.keys().file(&file("/bin/b").hash()),
            prefix: false,
        }],
        ..Txn::default()
    };
    reg.raw_kv().txn(delete).await.unwrap();
    let reported = |skipped: &[String]| {
        skipped.iter().any(|s| {
            s.contains("b.service")
                && s.contains("is missing from the registry")
                && s.contains("fleetctl destroy b.service")
        })
    };
    let listing = c.units(None).await.unwrap();
    assert_eq!(listing.units.len(), 70);
    assert!(reported(&listing.skipped), "{:?}", listing.skipped);
    let (page, _) = c.units_page(None, 0, 100).await.unwrap();
    assert!(reported(&page.skipped), "{:?}", page.skipped);
    let (page, _) = c.units_after(None, PageLimit::units(100)).await.unwrap();
    assert!(reported(&page.skipped), "{:?}", page.skipped);
    let few = BTreeSet::from([name("b.service")]);
    let named = c.units(Some(&few)).await.unwrap();
    assert!(named.units.is_empty());
    assert!(reported(&named.skipped), "{:?}", named.skipped);
    assert_eq!(
        c.destroy(&name("b.service")).await.unwrap(),
        Destroyed::Unit
    );
    let listing = c.units(None).await.unwrap();
    assert!(listing.skipped.is_empty(), "{:?}", listing.skipped);
}

/// Issue 38, item 3: `list-machines` says when the engine leader key leads nothing fleet
/// knows of (no unit is scheduled meanwhile), and nothing while a registered machine leads
/// or during an election.
async fn machines_say_when_the_leader_key_leads_nothing<K: Kv>(reg: Registry<K>) {
    let c = RegistryCluster::new(reg.clone());
    let leader = reg.keys().leader();
    assert_eq!(c.machines().await.unwrap().leader_notice, None);
    reg.put_raw(&leader, "ffff").await;
    let notice = c
        .machines()
        .await
        .unwrap()
        .leader_notice
        .unwrap_or_default();
    assert!(
        notice.contains("leads nothing (it has no lease)"),
        "{notice}"
    );
    let lease = reg.raw_kv().grant(Duration::from_secs(600)).await.unwrap();
    let on_lease = Txn {
        success: vec![TxnOp::Put {
            key: leader.clone(),
            value: b"ghost".to_vec(),
            lease: Some(lease),
        }],
        ..Txn::default()
    };
    reg.raw_kv().txn(on_lease).await.unwrap();
    let notice = c
        .machines()
        .await
        .unwrap()
        .leader_notice
        .unwrap_or_default();
    assert!(
        notice.contains("names machine ghost, which is not registered"),
        "{notice}"
    );
    // explain does not promise a next pass that no engine makes.
    c.put(create(
        "a.service",
        file("/bin/a"),
        Some(DesiredState::Launched),
    ))
    .await
    .unwrap();
    let why = c.explain(&name("a.service")).await.unwrap().summary;
    assert!(why.ends_with(&format!("; but {notice}")), "{why}");
    let ghost = MachineInfo {
        id: machine("ghost"),
        public_ip: String::new(),
        metadata: Default::default(),
        version: "test".into(),
        disable_engine: false,
        api: String::new(),
        fence_at: None,
    };
    reg.put_raw(
        &reg.keys().machine(&ghost.id),
        &serde_json::to_string(&ghost).unwrap(),
    )
    .await;
    assert_eq!(c.machines().await.unwrap().leader_notice, None);
}

macro_rules! contract {
    ($($test:ident),* $(,)?) => {
        mod mem {
            $(
                #[tokio::test(start_paused = true)]
                async fn $test() {
                    let reg = fleet_registry::Registry::new(super::MemKv::new(), super::PREFIX);
                    super::$test(reg).await;
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test]
                async fn $test() {
                    let etcd = super::TestEtcd::start().await;
                    let reg = fleet_registry::Registry::new(etcd.kv().await, super::PREFIX);
                    super::$test(reg).await;
                }
            )*
        }
    };
}

contract!(
    put_creates_replaces_sets_state_or_leaves_a_unit_alone,
    refused_puts_write_nothing,
    a_reschedule_avoids_the_machine_a_unit_runs_on,
    a_replace_in_fleets_form_keeps_the_machine_for_the_next_launch_only,
    listings_show_placement_current_state_and_only_named_units,
    listings_skip_unreadable_values_and_say_so,
    states_are_filtered_and_machines_carry_metadata_and_notice,
    state_changes_follow_fleetctls_rules,
    restart_bumps_the_generation_or_launches,
    destroy_removes_units_and_unreadable_records,
    a_unit_whose_file_is_missing_is_reported_by_every_listing_and_destroyed,
    machines_say_when_the_leader_key_leads_nothing,
    a_rolling_replace_advances_then_finishes,
    a_watch_sees_its_units_states_and_machines_change,
    a_create_that_loses_a_race_to_the_same_content_is_unchanged,
    a_create_that_loses_a_race_below_its_state_raises_it,
    a_create_that_loses_a_race_to_other_content_is_a_conflict,
    writes_retry_a_concurrent_change_five_times_then_conflict,
    put_if_refuses_to_write_over_another_clients_write,
    put_if_refuses_a_unit_changed_since_the_caller_read_it,
    create_many_writes_many_units_per_transaction_within_128_ops,
    create_many_stops_at_a_failed_transaction_and_again_writes_the_rest,
    destroy_many_deletes_many_units_per_transaction_and_collects_their_files,
    destroy_many_stops_at_a_failed_transaction,
    put_many_if_replaces_many_units_per_transaction,
);
