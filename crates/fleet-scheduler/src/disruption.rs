//! When a vanished machine's units may move: the engine's rule for machines whose presence
//! is gone. Pure: it takes `now` and the registry as the engine sees it, keeps the history
//! of presence changes it has observed, and says which units the plan must leave where they
//! are ([`crate::plan_holding`]). It never talks to etcd, and it decides nothing else.
//!
//! A machine vanishes when its presence key goes, i.e. when its lease expires. That is what a
//! crashed machine looks like, and also what every machine looks like after etcd stalled or
//! was cut off from every host for longer than the TTL: then all leases run out together, and
//! moving their units would stop and start every unit of a healthy cluster. So, as
//! Kubernetes' node lifecycle controller does for a zone that looks wholly down:
//!
//! - **Settle.** A vanished machine's units stay for [`DisruptionConfig::settle`] first, so
//!   that machines vanishing together (leases etcd revokes in one sweep) are judged together,
//!   and so that the machine's fence (`fleet_core::fence`) has stopped its copies. A machine's
//!   units are those scheduled there and those that left it while a copy may still have run
//!   there (a `P/left` record, `scheduler/history.rs`): the fence stops a copy still stopping
//!   as it stops the others, and until then neither may run elsewhere.
//! - **Disruption.** When more than [`DisruptionConfig::threshold`] of the machines vanished
//!   within one [`DisruptionConfig::window`] (the agent TTL), the cause is etcd or the network,
//!   not the machines: every machine that vanished in that window is *held*, its units stay,
//!   for [`DisruptionConfig::grace`] after it vanished. A machine that registers again on a
//!   new lease within it finds its schedule untouched. One still gone after the grace is
//!   treated as lost.
//! - **Rate.** Units of lost machines move at most [`DisruptionConfig::move_rate`] per second
//!   (a token bucket holding one second's worth); the rest wait their turn. While units wait,
//!   what accrues during a pass longer than a second is kept (up to [`MAX_CARRY`]): a plan of
//!   100,000 units takes 2–3 s, and a bucket capped at one second moved 1,000 units per pass,
//!   a third of the rate asked for.
//!
//! An engine that starts leading has no history: a machine named by the schedule but absent
//! counts as having vanished at that moment.

use fleet_core::{MachineId, UnitName};
use fleet_registry::Snapshot;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;
use tokio::time::Instant;

/// The longest span whose tokens a throttled bucket keeps: what accrues while one slow pass
/// plans and writes. Bounded so that a stalled engine does not release a flood when it comes
/// back.
pub const MAX_CARRY: Duration = Duration::from_secs(5);

/// How the engine treats vanished machines (fleetd's `engine_disruption_*` and
/// `engine_move_rate` settings).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DisruptionConfig {
    /// Rescheduling is held while more than this share of the machines vanished within one
    /// `window` (0.5: more than half).
    pub threshold: f64,
    /// The span within which vanishings count together: the agent TTL.
    pub window: Duration,
    /// How long a vanished machine's units stay before they may move at all.
    pub settle: Duration,
    /// How long the units of a machine that vanished in a disruption stay, from the moment it
    /// vanished.
    pub grace: Duration,
    /// Units of lost machines moved per second at most; 0: no limit.
    pub move_rate: u32,
}

impl DisruptionConfig {
    /// fleetd's default `engine_move_rate`: units of lost machines moved per second. Chosen by
    /// measure (docs/benchmarks.md, "The move rate's default"): on the 2-core bench machine,
    /// where etcd shares the cores with 5,000 simulated agents, a loss of 10,000 units without
    /// a limit moved about 2,200 a second. 2,000 moves a tenth of 5,000 machines' 100,000 units
    /// within issue 19's 10 s in every run (1,500 missed it in one of five). A larger loss is
    /// still spread out: 100,000 units move over 50 s, not in one burst.
    pub const DEFAULT_MOVE_RATE: u32 = 2000;

    /// The defaults for an agent TTL of `ttl`: more than half, settle for the fence's margin
    /// ([`fleet_core::fence::engine_wait`]: a vanished machine's fence has stopped its copies
    /// by then; it was a third of the TTL, at most 2 s, before the fence), grace two TTLs,
    /// [`Self::DEFAULT_MOVE_RATE`] moves a second.
    pub fn for_ttl(ttl: Duration) -> DisruptionConfig {
        DisruptionConfig {
            threshold: 0.5,
            window: ttl,
            settle: fleet_core::fence::engine_wait(ttl),
            grace: ttl * 2,
            move_rate: Self::DEFAULT_MOVE_RATE,
        }
    }
}

/// Why rescheduling is held: what `fleetctl list-machines` shows and the engine logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// Machines that vanished within the window, and all machines counted.
    pub vanished: usize,
    pub machines: usize,
    pub window: Duration,
    /// The held machines that are still gone, in ID order.
    pub held: Vec<MachineId>,
    pub grace: Duration,
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held: Vec<&str> = self.held.iter().map(MachineId::as_str).collect();
        write!(
            f,
            "rescheduling held: {} of {} machines vanished within {:?}; units of {} stay for up to {:?} after each vanished",
            self.vanished,
            self.machines,
            self.window,
            held.join(", "),
            self.grace
        )
    }
}

/// What the plan must respect now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assessment {
    /// Units to leave exactly where they are.
    pub held: BTreeSet<UnitName>,
    /// Set while a disruption holds machines.
    pub hold: Option<Hold>,
    /// Units of lost machines allowed to move in this plan.
    pub moving: usize,
    /// Units of lost machines waiting for the rate limit.
    pub rate_limited: usize,
    /// When the assessment changes by itself (a settle, grace or rate wait ends).
    pub recheck: Option<Instant>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Absence {
    since: Instant,
    /// Set once the machine is held by a disruption: its units stay until then.
    held_until: Option<Instant>,
}

/// The presence history the engine has observed, and the move budget.
#[derive(Debug, Clone)]
pub struct Disruption {
    cfg: DisruptionConfig,
    /// Machines present at the last observation.
    present: BTreeSet<MachineId>,
    /// Gone machines that still have entries.
    absent: BTreeMap<MachineId, Absence>,
    /// When each machine last vanished (back or not), kept for one window.
    vanished: BTreeMap<MachineId, Instant>,
    tokens: f64,
    refilled: Instant,
    /// Whether units waited for the rate at the last assessment: then the tokens accrued
    /// since are theirs, up to [`MAX_CARRY`], not cut to one second.
    throttled: bool,
}

impl Disruption {
    pub fn new(cfg: DisruptionConfig, now: Instant) -> Disruption {
        Disruption {
            cfg,
            present: BTreeSet::new(),
            absent: BTreeMap::new(),
            vanished: BTreeMap::new(),
            tokens: burst(cfg.move_rate),
            refilled: now,
            throttled: false,
        }
    }

    /// Records the machines of `snapshot` at `now` and decides which units stay.
    pub fn assess(&mut self, now: Instant, snapshot: &Snapshot) -> Assessment {
        let on = units_by_machine(snapshot);
        self.observe(now, snapshot, &on);
        self.hold_if_disrupted();
        self.refill(now);
        let mut out = Assessment::default();
        let mut lost: BTreeSet<&UnitName> = BTreeSet::new();
        for (machine, absence) in &self.absent {
            let units = on.get(machine).into_iter().flatten().copied();
            let until = match absence.held_until {
                Some(until) if until > now => until,
                Some(_) | None if absence.since + self.cfg.settle > now => {
                    absence.since + self.cfg.settle
                }
                Some(_) | None => {
                    lost.extend(units);
                    continue;
                }
            };
            out.held.extend(units.cloned());
            out.recheck = earliest(out.recheck, until);
        }
        // A unit also on a held machine (a global one) stays with it.
        lost.retain(|u| !out.held.contains(*u));
        let budget = self.budget(lost.len());
        out.moving = budget;
        out.rate_limited = lost.len() - budget;
        if self.cfg.move_rate > 0 {
            self.tokens -= budget as f64;
        }
        out.held.extend(lost.into_iter().skip(budget).cloned());
        self.throttled = out.rate_limited > 0;
        if out.rate_limited > 0 {
            let wait = Duration::from_secs_f64((1.0 - self.tokens).max(0.0) / self.rate());
            out.recheck = earliest(out.recheck, now + wait);
        }
        out.hold = self.hold(now);
        out
    }

    /// Whether no machine is missing as of the last assessment: nothing is held or moving
    /// for a vanished machine, so a plan needs no assessment until machines change.
    pub fn quiet(&self) -> bool {
        self.absent.is_empty()
    }

    fn observe(
        &mut self,
        now: Instant,
        snap: &Snapshot,
        on: &BTreeMap<&MachineId, BTreeSet<&UnitName>>,
    ) {
        // A machine whose record cannot be read has not vanished: its key is there.
        let present = crate::unreadable::present_machines(snap);
        let newly_gone = self.present.difference(&present).cloned();
        let unseen = on
            .keys()
            .filter(|m| !present.contains(**m) && !self.absent.contains_key(**m))
            .map(|m| (*m).clone());
        for machine in newly_gone.chain(unseen).collect::<Vec<_>>() {
            self.vanished.insert(machine.clone(), now);
            let absence = Absence {
                since: now,
                held_until: None,
            };
            self.absent.entry(machine).or_insert(absence);
        }
        // Back on a new lease: whatever it kept is its own again. Gone with nothing left on
        // it: nothing to hold.
        self.absent
            .retain(|m, _| !present.contains(m) && on.contains_key(m));
        let window = self.cfg.window;
        self.vanished
            .retain(|_, at| now.saturating_duration_since(*at) < window);
        self.present = present;
    }

    /// Whether more than the threshold of the machines vanished within the window.
    fn disrupted(&self) -> Option<(usize, usize)> {
        let vanished = self.vanished.len();
        let machines = self
            .present
            .union(&self.vanished.keys().cloned().collect())
            .count();
        (vanished > 0 && vanished as f64 > self.cfg.threshold * machines as f64)
            .then_some((vanished, machines))
    }

    fn hold_if_disrupted(&mut self) {
        if self.disrupted().is_none() {
            return;
        }
        for (machine, absence) in &mut self.absent {
            if absence.held_until.is_none() && self.vanished.contains_key(machine) {
                absence.held_until = Some(absence.since + self.cfg.grace);
            }
        }
    }

    fn hold(&self, now: Instant) -> Option<Hold> {
        let held: Vec<MachineId> = self
            .absent
            .iter()
            .filter(|(_, a)| a.held_until.is_some_and(|until| until > now))
            .map(|(m, _)| m.clone())
            .collect();
        if held.is_empty() {
            return None;
        }
        let (vanished, machines) = self
            .disrupted()
            .unwrap_or((self.vanished.len(), self.count()));
        Some(Hold {
            vanished,
            machines,
            window: self.cfg.window,
            held,
            grace: self.cfg.grace,
        })
    }

    fn count(&self) -> usize {
        self.present.len() + self.absent.len()
    }

    fn rate(&self) -> f64 {
        f64::from(self.cfg.move_rate.max(1))
    }

    /// Adds what accrued since the last assessment. The bucket holds one second's worth, or,
    /// while units wait for it, what accrued over the pass just done (up to [`MAX_CARRY`]):
    /// moves then keep to the rate on average however long a pass takes, and never exceed it.
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled);
        let cap = if self.throttled {
            burst(self.cfg.move_rate).max(elapsed.min(MAX_CARRY).as_secs_f64() * self.rate())
        } else {
            burst(self.cfg.move_rate)
        };
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rate()).min(cap);
        self.refilled = now;
    }

    /// How many of `wanted` moves the bucket allows now.
    fn budget(&self, wanted: usize) -> usize {
        if self.cfg.move_rate == 0 {
            return wanted;
        }
        wanted.min(self.tokens.floor().max(0.0) as usize)
    }
}

fn burst(rate: u32) -> f64 {
    f64::from(rate.max(1))
}

fn earliest(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// The units of each machine: scheduled there, or recorded as having left it while a copy
/// may still run there (its record goes once that copy stopped, or once the machine is gone
/// and this rule lets its units move). Not those of a machine migrating from fleet v1: it has
/// not vanished, it has not joined yet, and the scheduler keeps its units where they are.
fn units_by_machine(snap: &Snapshot) -> BTreeMap<&MachineId, BTreeSet<&UnitName>> {
    let migrating = crate::unreadable::migrating_machines(snap);
    let mut on: BTreeMap<&MachineId, BTreeSet<&UnitName>> = BTreeMap::new();
    let mut add = |unit, machine| {
        if !migrating.contains(machine) {
            on.entry(machine).or_default().insert(unit);
        }
    };
    for (unit, machines) in &snap.schedule {
        machines.keys().for_each(|m| add(unit, m));
    }
    for (unit, machines) in &snap.left {
        machines.keys().for_each(|m| add(unit, m));
    }
    on
}

#[cfg(test)]
mod tests;
