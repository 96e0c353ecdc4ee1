//! The benchmark's own eyes on the registry: three watches (schedule, states and machines'
//! presences) keep a view of which unit is scheduled where, where it runs and which machines
//! are present, so "every unit scheduled", "every unit reported launched" and "the lost
//! machines' leases expired" can be timed without polling etcd. Its requests are not counted with
//! the cluster's.

use anyhow::{Context, Result, bail};
use fleet_registry::kv::{EtcdKv, EventKind, Kv, WatchMessage};
use fleet_registry::{Key, Keys, UnitStateRecord};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

/// Which unit is scheduled where and where it is active.
#[derive(Debug, Default)]
pub struct View {
    /// unit -> machine.
    scheduled: HashMap<String, String>,
    /// unit -> machines where it is published active.
    active: HashMap<String, HashSet<String>>,
    launched: usize,
    /// Machines with a presence key (their lease alive).
    present: HashSet<String>,
    /// A watch ended: the view is stale.
    pub broken: bool,
}

impl View {
    fn ok(&self, unit: &str) -> bool {
        self.scheduled
            .get(unit)
            .is_some_and(|m| self.active.get(unit).is_some_and(|s| s.contains(m)))
    }

    fn update(&mut self, unit: &str, change: impl FnOnce(&mut View)) {
        let before = self.ok(unit);
        change(self);
        match (before, self.ok(unit)) {
            (false, true) => self.launched += 1,
            (true, false) => self.launched -= 1,
            _ => {}
        }
    }

    /// Units with a schedule entry.
    pub fn scheduled(&self) -> usize {
        self.scheduled.len()
    }

    /// Units published active on the machine they are scheduled to.
    pub fn launched(&self) -> usize {
        self.launched
    }

    /// The machine `unit` is scheduled to.
    pub fn machine_of(&self, unit: &str) -> Option<&str> {
        self.scheduled.get(unit).map(String::as_str)
    }

    /// Every unit's machine.
    pub fn placements(&self) -> HashMap<String, String> {
        self.scheduled.clone()
    }

    /// Units scheduled to one of `machines`.
    pub fn scheduled_on(&self, machines: &HashSet<String>) -> usize {
        self.scheduled
            .values()
            .filter(|m| machines.contains(*m))
            .count()
    }

    /// How many of `machines` are present.
    pub fn present_of(&self, machines: &HashSet<String>) -> usize {
        machines
            .iter()
            .filter(|m| self.present.contains(*m))
            .count()
    }

    fn apply(&mut self, key: &str, value: Option<&[u8]>, keys: &Keys) {
        match Key::parse(keys, key) {
            Some(Key::Machine(machine)) => {
                if value.is_some() {
                    self.present.insert(machine.to_string());
                } else {
                    self.present.remove(machine.as_str());
                }
            }
            Some(Key::Schedule { machine, unit }) => {
                let (unit, machine) = (unit.to_string(), machine.to_string());
                self.update(&unit.clone(), |v| match value {
                    Some(_) => {
                        v.scheduled.insert(unit, machine);
                    }
                    None if v.scheduled.get(&unit) == Some(&machine) => {
                        v.scheduled.remove(&unit);
                    }
                    None => {}
                });
            }
            Some(Key::State { machine, unit }) => {
                let active = value
                    .and_then(|v| serde_json::from_slice::<UnitStateRecord>(v).ok())
                    .is_some_and(|r| r.systemd.active_state().satisfies_launched());
                let (unit, machine) = (unit.to_string(), machine.to_string());
                self.update(&unit.clone(), |v| {
                    let set = v.active.entry(unit).or_default();
                    if active {
                        set.insert(machine);
                    } else {
                        set.remove(&machine);
                    }
                });
            }
            _ => {}
        }
    }
}

/// Watches the schedule and the states of one registry.
#[derive(Debug)]
pub struct Monitor {
    view: Arc<Mutex<View>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Monitor {
    pub async fn start(kv: EtcdKv, prefix: &str) -> Result<Monitor> {
        let view = Arc::new(Mutex::new(View::default()));
        let mut tasks = Vec::new();
        let keys = Keys::new(prefix);
        for key in [keys.schedules(), keys.states(), keys.machines()] {
            let current = kv.range(&key, true, None).await.context("monitor read")?;
            {
                let mut v = lock(&view);
                for kv in &current.kvs {
                    v.apply(&kv.key, Some(&kv.value), &keys);
                }
            }
            let watch = kv
                .watch(&key, true, current.revision + 1)
                .await
                .context("monitor watch")?;
            tasks.push(tokio::spawn(
                follow(watch, view.clone(), keys.clone()).in_current_span(),
            ));
        }
        Ok(Monitor { view, tasks })
    }

    /// Reads the view.
    pub fn with<T>(&self, f: impl FnOnce(&View) -> T) -> T {
        f(&lock(&self.view))
    }

    /// Waits until `done` holds; how long that took since `since`. Fails after `within`.
    pub async fn wait(
        &self,
        since: Instant,
        within: Duration,
        what: &str,
        done: impl Fn(&View) -> bool,
    ) -> Result<Duration> {
        loop {
            let (ok, broken) = self.with(|v| (done(v), v.broken));
            if ok {
                return Ok(since.elapsed());
            }
            if broken {
                bail!("the benchmark's watch broke while waiting for {what}");
            }
            if since.elapsed() > within {
                let (s, l) = self.with(|v| (v.scheduled(), v.launched()));
                bail!("{what}: not reached within {within:?} ({s} scheduled, {l} launched)");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn stop(&self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

fn lock(view: &Mutex<View>) -> MutexGuard<'_, View> {
    view.lock().unwrap_or_else(|e| e.into_inner())
}

async fn follow(mut watch: fleet_registry::kv::Watch, view: Arc<Mutex<View>>, keys: Keys) {
    while let Some(message) = watch.rx.recv().await {
        match message {
            WatchMessage::Events { events, .. } => {
                let mut v = lock(&view);
                for e in &events {
                    let value = (e.kind == EventKind::Put).then_some(e.kv.value.as_slice());
                    v.apply(&e.kv.key, value, &keys);
                }
            }
            WatchMessage::Compacted { .. } | WatchMessage::Broken => break,
        }
    }
    lock(&view).broken = true;
}
