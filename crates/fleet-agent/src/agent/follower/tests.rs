//! The schedule follower on the in-memory registry, on paused time.

use super::*;
use fleet_core::{DesiredState, MachineId};
use fleet_registry::kv::MemKv;
use fleet_registry::{EngineRole, EngineWrite, Registry, UnitsRole};
use std::time::Duration;

fn m1() -> MachineId {
    "m1".parse().unwrap()
}

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn file(exec: &str) -> UnitFile {
    UnitFile::parse(format!("[Service]\nExecStart={exec}\n").as_bytes()).unwrap()
}

fn entry(unit: &str, f: &UnitFile) -> ScheduleEntry {
    ScheduleEntry {
        name: name(unit),
        machine: m1(),
        hash: f.hash(),
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    }
}

struct World {
    kv: MemKv,
    registry: Registry<MemKv>,
}

impl World {
    fn new() -> World {
        let kv = MemKv::new();
        World {
            registry: Registry::new(kv.clone(), "/t/"),
            kv,
        }
    }

    fn follower(&self, deny_units: &[&str]) -> ScheduleFollower<MemKv> {
        let role = MachineRole::new(self.registry.clone(), m1());
        ScheduleFollower::new(
            role,
            deny_units.iter().map(|g| (*g).to_owned()).collect(),
            Backoff::new(Duration::from_secs(1), Duration::from_secs(5)),
        )
    }

    /// Puts `unit` with `f` in the registry and schedules it here.
    async fn schedule(&self, unit: &str, f: &UnitFile) {
        UnitsRole::new(self.registry.clone())
            .create_unit(&name(unit), f, DesiredState::Launched)
            .await
            .unwrap();
        let entry = entry(unit, f);
        self.registry.write_schedule(&[entry], &[]).await.unwrap();
    }

    async fn unschedule(&self, unit: &str) {
        self.registry
            .write_schedule(&[], &[(m1(), name(unit))])
            .await
            .unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn there_is_no_schedule_to_act_on_until_it_is_read_once() {
    let world = World::new();
    world.schedule("a.service", &file("/bin/a")).await;
    let mut follower = world.follower(&[]);
    assert!(follower.trusted(Instant::now()).is_none());
    assert!(follower.scheduled().is_empty());
    follower.read().await.unwrap();
    let (schedule, files) = follower.trusted(Instant::now()).expect("read");
    assert!(schedule.contains_key(&name("a.service")));
    assert!(files.contains_key(&file("/bin/a").hash()));
    assert!(
        follower.take_changed().is_empty(),
        "the first read is no change"
    );
}

#[tokio::test(start_paused = true)]
async fn the_watchs_events_are_applied_and_name_the_units_that_changed() {
    let world = World::new();
    world.schedule("a.service", &file("/bin/a")).await;
    let mut follower = world.follower(&[]);
    follower.read().await.unwrap();
    follower.watch();
    world.schedule("b.service", &file("/bin/b")).await;
    world.unschedule("a.service").await;
    let mut changed = BTreeSet::new();
    while changed.len() < 2 {
        follower.hinted().await.expect("the watch runs");
        let delta = follower.take_delta();
        match follower.follow(delta).await.unwrap() {
            Followed::Units(units) => changed.extend(units),
            Followed::Whole => panic!("the events were all there"),
        }
    }
    assert_eq!(
        changed,
        BTreeSet::from([name("a.service"), name("b.service")])
    );
    assert_eq!(follower.take_changed(), changed);
    assert_eq!(follower.scheduled(), BTreeSet::from([name("b.service")]));
    assert!(follower.files().contains_key(&file("/bin/b").hash()));
}

#[tokio::test(start_paused = true)]
async fn after_a_lease_change_the_next_change_reads_the_whole_schedule() {
    let world = World::new();
    let mut follower = world.follower(&[]);
    follower.read().await.unwrap();
    follower.watch();
    world.schedule("a.service", &file("/bin/a")).await;
    follower.hinted().await.expect("the watch runs");
    follower.distrust_events();
    let delta = follower.take_delta();
    assert!(matches!(delta, Delta::Events(_)));
    assert_eq!(follower.follow(delta).await.unwrap(), Followed::Whole);
    assert_eq!(follower.take_changed(), BTreeSet::from([name("a.service")]));
    // Trusted again: the next events are applied.
    world.unschedule("a.service").await;
    follower.hinted().await.expect("the watch runs");
    let delta = follower.take_delta();
    let followed = follower.follow(delta).await.unwrap();
    assert_eq!(
        followed,
        Followed::Units(BTreeSet::from([name("a.service")]))
    );
}

#[tokio::test(start_paused = true)]
async fn a_whole_read_names_the_entries_that_differ_from_the_schedule_held() {
    let world = World::new();
    world.schedule("a.service", &file("/bin/a")).await;
    world.schedule("b.service", &file("/bin/b")).await;
    let mut follower = world.follower(&[]);
    follower.read().await.unwrap();
    world.schedule("a.service", &file("/bin/a2")).await;
    world.unschedule("b.service").await;
    world.schedule("c.service", &file("/bin/c")).await;
    assert_eq!(follower.follow(Delta::Gap).await.unwrap(), Followed::Whole);
    assert_eq!(
        follower.take_changed(),
        BTreeSet::from([name("a.service"), name("b.service"), name("c.service")])
    );
    assert!(
        !follower.files().contains_key(&file("/bin/b").hash()),
        "a file no entry names is dropped"
    );
}

#[tokio::test(start_paused = true)]
async fn a_unit_of_deny_units_is_never_in_the_schedule_held() {
    let world = World::new();
    world.schedule("sshd.service", &file("/bin/sshd")).await;
    world.schedule("web.service", &file("/bin/web")).await;
    let mut follower = world.follower(&["ssh*"]);
    follower.read().await.unwrap();
    assert_eq!(follower.scheduled(), BTreeSet::from([name("web.service")]));
    follower.watch();
    world.schedule("sshd.service", &file("/bin/sshd2")).await;
    follower.hinted().await.expect("the watch runs");
    let delta = follower.take_delta();
    follower.follow(delta).await.unwrap();
    assert!(!follower.is_scheduled(&name("sshd.service")));
}

#[tokio::test(start_paused = true)]
async fn a_failed_read_is_due_again_after_a_pause_and_a_good_one_ends_the_retries() {
    let world = World::new();
    world.schedule("a.service", &file("/bin/a")).await;
    let mut follower = world.follower(&[]);
    follower.follow(Delta::Gap).await.unwrap();
    assert_eq!(follower.retry_at(), None);
    world.kv.set_unavailable(true);
    assert!(follower.follow(Delta::Gap).await.is_err());
    let at = follower.retry_at().expect("a failed read is retried");
    let now = Instant::now();
    assert!(
        at > now && at <= now + Duration::from_secs(5),
        "{:?}",
        at - now
    );
    assert!(!follower.wants_read(now), "not before its pause");
    assert!(follower.wants_read(at));
    // Failing again, it waits no longer than the backoff's most.
    tokio::time::sleep_until(at).await;
    assert!(follower.follow(Delta::Gap).await.is_err());
    let again = follower.retry_at().unwrap();
    assert!(again <= Instant::now() + Duration::from_secs(5));
    world.kv.set_unavailable(false);
    follower.follow(Delta::Gap).await.unwrap();
    assert_eq!(follower.retry_at(), None);
    assert!(!follower.wants_read(Instant::now() + Duration::from_secs(60)));
}

async fn leader(world: &World) -> fleet_registry::Leadership<MemKv> {
    EngineRole::new(world.registry.clone())
        .campaign(&"m9".parse().unwrap(), Duration::from_secs(10))
        .await
        .unwrap()
        .expect("leads")
}

/// Issue 43, with `trust_engine_files`: the file an entry carries, as the engine writes it,
/// is taken from a whole read and from the watch's events, so the registry need not hold it;
/// a text that does not hash to the entry is not taken, and the file is read instead.
#[tokio::test(start_paused = true)]
async fn the_file_an_entry_carries_is_taken_and_one_of_another_hash_is_not() {
    let world = World::new();
    let leader = leader(&world).await;
    let write = |unit: &str, f: &UnitFile, text: &UnitFile| {
        let texts = [(f.hash(), text.canonical())].into();
        let writes = [EngineWrite::Schedule(entry(unit, f))];
        let leader = leader.clone();
        async move { leader.write_carrying(&writes, &texts).await.unwrap() }
    };
    let (a, b, c, d) = (
        file("/bin/a"),
        file("/bin/b"),
        file("/bin/c"),
        file("/bin/d"),
    );
    write("a.service", &a, &a).await;
    let mut follower = world.follower(&[]).trusting_carried_files(true);
    follower.read().await.unwrap();
    assert_eq!(
        follower.files().get(&a.hash()),
        Some(&a),
        "from a whole read"
    );
    follower.watch();
    write("b.service", &b, &b).await;
    UnitsRole::new(world.registry.clone())
        .create_unit(&name("c.service"), &c, DesiredState::Launched)
        .await
        .unwrap();
    write("c.service", &c, &d).await;
    while !follower.is_scheduled(&name("c.service")) {
        follower.hinted().await.expect("the watch runs");
        let delta = follower.take_delta();
        let followed = follower.follow(delta).await.unwrap();
        assert!(matches!(followed, Followed::Units(_)), "{followed:?}");
    }
    assert_eq!(follower.files().get(&b.hash()), Some(&b), "from the watch");
    assert_eq!(
        follower.files().get(&c.hash()),
        Some(&c),
        "read from the registry"
    );
    assert!(!follower.files().contains_key(&d.hash()));
}

/// Without `trust_engine_files` (fleetd's default) a carried file is never taken: an engine
/// host cannot write a file, and must not run one no operator stored (docs/security.md).
#[tokio::test(start_paused = true)]
async fn without_trust_a_carried_file_is_not_taken_and_only_the_registrys_is_run() {
    let world = World::new();
    let leader = leader(&world).await;
    let (stored, forged) = (file("/bin/stored"), file("/bin/forged"));
    world.schedule("stored.service", &stored).await;
    for (unit, f) in [("stored.service", &stored), ("forged.service", &forged)] {
        let texts = [(f.hash(), f.canonical())].into();
        let writes = [EngineWrite::Schedule(entry(unit, f))];
        leader.write_carrying(&writes, &texts).await.unwrap();
    }
    let mut follower = world.follower(&[]);
    follower.read().await.unwrap();
    assert!(follower.is_scheduled(&name("forged.service")));
    assert_eq!(follower.files().get(&stored.hash()), Some(&stored));
    assert!(
        !follower.files().contains_key(&forged.hash()),
        "a file no operator stored is not taken from its entry"
    );
}

#[tokio::test(start_paused = true)]
async fn a_file_not_read_after_the_events_is_read_again_alone_not_the_whole_schedule() {
    let world = World::new();
    world.schedule("a.service", &file("/bin/a")).await;
    let mut follower = world.follower(&[]);
    follower.read().await.unwrap();
    follower.watch();
    world.schedule("b.service", &file("/bin/b")).await;
    follower.hinted().await.expect("the watch runs");
    let delta = follower.take_delta();
    world.kv.set_unavailable(true);
    assert!(follower.follow(delta).await.is_err(), "b's file not read");
    assert!(
        follower.is_scheduled(&name("b.service")),
        "its entry applied"
    );
    assert!(!follower.files().contains_key(&file("/bin/b").hash()));
    let at = follower.retry_at().expect("retried");
    assert!(follower.wants_read(at));
    let due = follower.due(at);
    assert!(
        matches!(&due, Delta::Events(e) if e.is_empty()),
        "the files alone: {due:?}"
    );
    tokio::time::sleep_until(at).await;
    world.kv.set_unavailable(false);
    // Its unit gets a pass like any unit after a whole read.
    assert_eq!(follower.follow(due).await.unwrap(), Followed::Whole);
    assert!(follower.files().contains_key(&file("/bin/b").hash()));
    assert_eq!(follower.retry_at(), None);
    // Done: a later retry would read the whole schedule again.
    assert!(matches!(follower.due(Instant::now()), Delta::Gap));
}

#[tokio::test(start_paused = true)]
async fn a_failed_file_read_under_lease_doubt_is_retried_by_a_whole_read() {
    let world = World::new();
    let mut follower = world.follower(&[]);
    follower.read().await.unwrap();
    follower.watch();
    world.schedule("a.service", &file("/bin/a")).await;
    follower.hinted().await.expect("the watch runs");
    let delta = follower.take_delta();
    world.kv.set_unavailable(true);
    assert!(follower.follow(delta).await.is_err());
    follower.distrust_events();
    assert!(
        matches!(follower.due(Instant::now()), Delta::Gap),
        "stale: all of it"
    );
}
