//! The disruption rule on paused time: a lone machine's units move after the settle, a mass
//! vanishing holds them for the grace, a machine that returns keeps them, moves obey the rate.

use super::*;
use fleet_core::{DesiredState, MachineInfo, UnitFile};
use fleet_registry::ScheduleEntry;
use proptest::prelude::*;

const TTL: Duration = Duration::from_secs(3);

fn mid(s: &str) -> MachineId {
    s.parse().unwrap()
}

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// A cluster of `machines` machines (m0, m1, ...), `per` units on each (u<m>-<i>.service).
struct Cluster {
    snap: Snapshot,
    start: Instant,
    d: Disruption,
}

impl Cluster {
    fn new(machines: usize, per: usize, cfg: DisruptionConfig) -> Cluster {
        let start = Instant::now();
        let hash = UnitFile::parse(b"[Service]\nExecStart=/bin/true\n")
            .unwrap()
            .hash();
        let mut snap = Snapshot::default();
        for m in 0..machines {
            let id = mid(&format!("m{m}"));
            let info = MachineInfo {
                id: id.clone(),
                public_ip: String::new(),
                metadata: Default::default(),
                version: String::new(),
                disable_engine: false,
                api: String::new(),
                fence_at: None,
            };
            snap.machines.insert(id.clone(), info);
            for i in 0..per {
                let unit = name(&format!("u{m}-{i}.service"));
                let entry = ScheduleEntry {
                    name: unit.clone(),
                    machine: id.clone(),
                    hash,
                    desired: DesiredState::Launched,
                    restart: 0,
                    no_restart: false,
                    placement: 0,
                };
                snap.schedule
                    .entry(unit)
                    .or_default()
                    .insert(id.clone(), entry);
            }
        }
        let mut d = Disruption::new(cfg, start);
        d.assess(start, &snap);
        Cluster { snap, start, d }
    }

    fn at(&mut self, t: f64) -> Assessment {
        let now = self.start + secs(t);
        self.d.assess(now, &self.snap)
    }

    fn vanish(&mut self, m: &str) -> &mut Cluster {
        let info = self.snap.machines.remove(&mid(m));
        assert!(info.is_some(), "{m} was present");
        self
    }

    fn back(&mut self, m: &str) -> &mut Cluster {
        let info = MachineInfo {
            id: mid(m),
            public_ip: String::new(),
            metadata: Default::default(),
            version: String::new(),
            disable_engine: false,
            api: String::new(),
            fence_at: None,
        };
        self.snap.machines.insert(mid(m), info);
        self
    }

    /// What the engine's moves do: the units of `m` leave it (and their records go).
    fn moved_off(&mut self, m: &str) {
        for entries in self.snap.schedule.values_mut() {
            entries.remove(&mid(m));
        }
        self.snap.schedule.retain(|_, e| !e.is_empty());
        for records in self.snap.left.values_mut() {
            records.remove(&mid(m));
        }
        self.snap.left.retain(|_, r| !r.is_empty());
    }

    /// The registry records that `unit` left `m` while a copy may still run there.
    fn left(&mut self, unit: &str, m: &str) -> &mut Cluster {
        let records = self.snap.left.entry(name(unit)).or_default();
        records.insert(mid(m), fleet_registry::LeftCopy::Running);
        self
    }
}

fn held(a: &Assessment) -> Vec<String> {
    a.held.iter().map(ToString::to_string).collect()
}

/// The defaults with a settle of one second, a round number for the rule's tests.
fn cfg() -> DisruptionConfig {
    DisruptionConfig {
        settle: secs(1.0),
        ..DisruptionConfig::for_ttl(TTL)
    }
}

#[test]
fn defaults_hold_for_more_than_half_settle_for_the_fence_and_grace_two() {
    let c = DisruptionConfig::for_ttl(TTL);
    assert_eq!(c.threshold, 0.5);
    assert_eq!((c.window, c.settle, c.grace), (TTL, secs(2.03), secs(6.0)));
    assert_eq!(DisruptionConfig::for_ttl(secs(30.0)).settle, secs(2.3));
    assert_eq!(DisruptionConfig::for_ttl(secs(600.0)).settle, secs(8.0));
}

#[test]
fn a_lone_vanished_machine_keeps_its_units_only_for_the_settle() {
    let mut c = Cluster::new(3, 2, cfg());
    c.vanish("m1");
    let a = c.at(10.0);
    assert_eq!(held(&a), ["u1-0.service", "u1-1.service"]);
    assert_eq!(a.hold, None);
    assert_eq!(a.recheck, Some(c.start + secs(11.0)));
    let a = c.at(11.0);
    assert!(a.held.is_empty(), "{a:?}");
    assert_eq!(a.moving, 2);
}

#[test]
fn more_than_half_vanishing_together_holds_their_units_for_the_grace() {
    let mut c = Cluster::new(3, 2, cfg());
    c.vanish("m0").vanish("m2");
    let a = c.at(10.0);
    assert_eq!(
        held(&a),
        [
            "u0-0.service",
            "u0-1.service",
            "u2-0.service",
            "u2-1.service"
        ]
    );
    let hold = a.hold.expect("a hold");
    assert_eq!((hold.vanished, hold.machines), (2, 3));
    assert_eq!(hold.held, [mid("m0"), mid("m2")]);
    assert_eq!(
        hold.to_string(),
        "rescheduling held: 2 of 3 machines vanished within 3s; units of m0, m2 stay for up to 6s after each vanished"
    );
    assert_eq!(c.at(15.9).held.len(), 4);
    let a = c.at(16.0);
    assert!(a.held.is_empty(), "{a:?}");
    assert_eq!((a.moving, a.hold), (4, None));
}

#[test]
fn machines_vanishing_one_after_another_within_the_ttl_are_judged_together() {
    let mut c = Cluster::new(3, 1, cfg());
    c.vanish("m0");
    assert_eq!(held(&c.at(10.0)), ["u0-0.service"]);
    c.vanish("m1");
    let a = c.at(10.8);
    assert_eq!(held(&a), ["u0-0.service", "u1-0.service"]);
    assert!(a.hold.is_some());
    // m0 is held from the moment it vanished: 10 s + 6 s.
    assert_eq!(held(&c.at(16.0)), ["u1-0.service"]);
}

#[test]
fn a_machine_back_within_the_grace_keeps_its_units_and_the_others_stay_held() {
    let mut c = Cluster::new(3, 1, cfg());
    c.vanish("m0").vanish("m1").vanish("m2");
    assert_eq!(c.at(10.0).held.len(), 3);
    c.back("m1");
    let a = c.at(11.0);
    // The vanishings still count: m0 and m2 are not judged alone now that m1 is back.
    assert_eq!(held(&a), ["u0-0.service", "u2-0.service"]);
    c.back("m0").back("m2");
    let a = c.at(12.0);
    assert_eq!(a, Assessment::default());
}

#[test]
fn a_lone_loss_after_a_disruption_moves_after_the_settle() {
    let mut c = Cluster::new(3, 1, cfg());
    c.vanish("m0").vanish("m1");
    c.at(10.0);
    c.back("m0").back("m1");
    c.at(11.0);
    c.vanish("m2");
    assert!(c.at(20.0).hold.is_none());
    assert_eq!(c.at(21.0).moving, 1);
}

#[test]
fn a_machine_the_schedule_names_but_never_seen_counts_as_just_vanished() {
    let mut c = Cluster::new(3, 1, cfg());
    // A new leader: no history, m1 and m2 absent already.
    c.vanish("m1").vanish("m2");
    let mut fresh = Disruption::new(cfg(), c.start + secs(5.0));
    let a = fresh.assess(c.start + secs(5.0), &c.snap);
    assert_eq!(held(&a), ["u1-0.service", "u2-0.service"]);
    assert!(a.hold.is_some());
}

/// Issue 36: a unit that left a machine whose copy may still be stopping there stays off every
/// other machine until that machine's fence has stopped it, like the machine's own units.
#[test]
fn a_unit_that_left_a_vanished_machine_is_held_like_its_units() {
    let mut c = Cluster::new(3, 1, cfg());
    c.left("x.service", "m1").left("y.service", "m2");
    c.vanish("m1");
    let a = c.at(10.0);
    assert_eq!(held(&a), ["u1-0.service", "x.service"]);
    assert_eq!(a.recheck, Some(c.start + secs(11.0)));
    let a = c.at(11.0);
    assert!(a.held.is_empty(), "{a:?}");
    assert_eq!(a.moving, 2);
}

#[test]
fn a_unit_that_left_a_machine_held_in_a_disruption_stays_for_the_grace() {
    let mut c = Cluster::new(3, 0, cfg());
    c.left("x.service", "m0");
    c.vanish("m0").vanish("m1");
    let a = c.at(10.0);
    assert_eq!(held(&a), ["x.service"]);
    assert_eq!(a.hold.expect("a hold").held, [mid("m0")]);
    assert_eq!(held(&c.at(15.9)), ["x.service"]);
    assert!(c.at(16.0).held.is_empty());
    // Its record forgotten, the machine is no longer waited for.
    c.moved_off("m0");
    assert_eq!(c.at(17.0), Assessment::default());
    assert!(c.d.quiet());
}

#[test]
fn a_gone_machine_with_nothing_left_on_it_is_forgotten() {
    let mut c = Cluster::new(3, 1, cfg());
    c.vanish("m1");
    c.at(1.0);
    c.moved_off("m1");
    let a = c.at(2.0);
    assert_eq!(a, Assessment::default());
    assert!(c.d.absent.is_empty());
}

#[test]
fn moves_are_limited_to_the_rate_with_one_second_of_burst() {
    let cfg = DisruptionConfig {
        move_rate: 4,
        ..cfg()
    };
    let mut c = Cluster::new(3, 10, cfg);
    c.vanish("m1");
    assert_eq!(c.at(1.0).moving, 0);
    let a = c.at(2.0);
    assert_eq!((a.moving, a.rate_limited), (4, 6));
    assert_eq!(a.held.len(), 6);
    assert_eq!(a.recheck, Some(c.start + secs(2.25)));
    c.snap.schedule.retain(|u, _| {
        ![
            "u1-0.service",
            "u1-1.service",
            "u1-2.service",
            "u1-3.service",
        ]
        .contains(&u.as_str())
    });
    let a = c.at(2.5);
    assert_eq!((a.moving, a.rate_limited), (2, 4));
}

#[test]
fn a_pass_longer_than_a_second_keeps_what_accrued_while_units_wait() {
    let cfg = DisruptionConfig {
        move_rate: 4,
        ..cfg()
    };
    let mut c = Cluster::new(3, 30, cfg);
    c.vanish("m1");
    c.at(1.0);
    let a = c.at(2.0);
    assert_eq!((a.moving, a.rate_limited), (4, 26));
    let first: Vec<UnitName> = c
        .snap
        .schedule
        .keys()
        .filter(|u| u.as_str().starts_with("u1-") && !a.held.contains(*u))
        .cloned()
        .collect();
    c.snap.schedule.retain(|u, _| !first.contains(u));
    // A pass of 2.5 s: 10 tokens accrued, all of them usable, not one second's 4.
    let a = c.at(4.5);
    assert_eq!((a.moving, a.rate_limited), (10, 16));
}

#[test]
fn an_idle_bucket_holds_one_second_however_long_it_idled() {
    let cfg = DisruptionConfig {
        move_rate: 4,
        ..cfg()
    };
    let mut c = Cluster::new(3, 30, cfg);
    c.at(100.0);
    c.vanish("m1");
    c.at(101.0);
    let a = c.at(102.0);
    assert_eq!((a.moving, a.rate_limited), (4, 26));
}

#[test]
fn a_stalled_engine_releases_at_most_the_carry() {
    let cfg = DisruptionConfig {
        move_rate: 4,
        ..cfg()
    };
    let mut c = Cluster::new(3, 30, cfg);
    c.vanish("m1");
    c.at(1.0);
    let a = c.at(2.0);
    assert_eq!((a.moving, a.rate_limited), (4, 26));
    let held = a.held.clone();
    c.snap
        .schedule
        .retain(|u, _| !u.as_str().starts_with("u1-") || held.contains(u));
    let a = c.at(62.0);
    let carry = (MAX_CARRY.as_secs() * 4) as usize;
    assert_eq!((a.moving, a.rate_limited), (carry, 26 - carry));
}

#[test]
fn no_rate_limit_when_the_rate_is_zero() {
    let cfg = DisruptionConfig {
        move_rate: 0,
        ..cfg()
    };
    let mut c = Cluster::new(2, 5000, cfg);
    c.vanish("m1");
    c.at(1.0);
    let a = c.at(2.0);
    assert_eq!((a.moving, a.rate_limited), (5000, 0));
}

proptest! {
    /// Whatever vanishes and returns, a machine present now never has a unit held, and a
    /// unit is held only while its machine is absent.
    #[test]
    fn holds_only_units_of_absent_machines(
        steps in proptest::collection::vec((0usize..5, any::<bool>(), 0u64..3000), 1..30)
    ) {
        let mut c = Cluster::new(5, 2, cfg());
        let mut t = 0.0;
        for (m, present, dt) in steps {
            t += dt as f64 / 1000.0;
            let id = format!("m{m}");
            if present { c.back(&id); } else { c.snap.machines.remove(&mid(&id)); }
            let a = c.at(t);
            for unit in &a.held {
                let on = c.snap.schedule[unit].keys().next().unwrap().clone();
                prop_assert!(!c.snap.machines.contains_key(&on), "{unit} held on present {on}");
            }
            if let Some(hold) = &a.hold {
                prop_assert!(hold.held.iter().all(|m| !c.snap.machines.contains_key(m)));
            }
        }
    }

    /// At most half of the machines vanishing (once each, at any pace): no disruption hold,
    /// and each one's units move once its settle is over.
    #[test]
    fn a_minority_loss_always_moves_after_the_settle(gone in proptest::collection::btree_set(0usize..5, 1..3), gap in 0u64..2000) {
        let mut c = Cluster::new(5, 1, cfg());
        let mut t = 1.0;
        for m in &gone {
            c.vanish(&format!("m{m}"));
            let a = c.at(t);
            prop_assert!(a.hold.is_none());
            t += gap as f64 / 1000.0;
        }
        let a = c.at(t + 1.0);
        prop_assert!(a.held.is_empty(), "{:?}", a);
        prop_assert_eq!(a.moving, gone.len());
    }
}

#[test]
fn a_machine_whose_record_becomes_unreadable_has_not_vanished() {
    let mut c = Cluster::new(2, 1, cfg());
    c.vanish("m0").vanish("m1");
    for m in ["m0", "m1"] {
        let key = fleet_registry::Keys::default().machine(&mid(m));
        let skipped = fleet_registry::Skipped {
            key: key.clone(),
            mod_revision: 7,
            detail: "not json".to_owned(),
            named: Some(Box::new(fleet_registry::Key::Machine(mid(m)))),
        };
        c.snap.skipped.insert(key, skipped);
    }
    let a = c.at(10.0);
    assert_eq!(a, Assessment::default());
}
