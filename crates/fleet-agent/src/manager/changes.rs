//! Change hints from a unit manager to the agent's loop.
//!
//! Hints are coalesced per receiver into a set of unit names (or "resync everything"), so a
//! sender never waits and memory stays bounded however slowly the loop reads. This matters for
//! the real adapter: zbus blocks its socket reader when a signal stream is not drained, which
//! would stall every method reply on the connection.

use fleet_core::UnitName;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use tokio::sync::Notify;

/// Past this many distinct pending names a receiver's hints collapse into [`Change::Resync`].
pub const MAX_PENDING_UNITS: usize = 4096;

/// A hint: something changed, re-read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Anything may have changed (first hint, daemon-reload, too many names, lost signals).
    Resync,
    /// These units changed.
    Units(BTreeSet<UnitName>),
}

#[derive(Debug, Default)]
struct Pending {
    units: BTreeSet<UnitName>,
    resync: bool,
    closed: bool,
}

impl Pending {
    fn take(&mut self) -> Option<Change> {
        if self.resync {
            self.resync = false;
            self.units.clear();
            return Some(Change::Resync);
        }
        if self.units.is_empty() {
            return None;
        }
        Some(Change::Units(std::mem::take(&mut self.units)))
    }
}

#[derive(Debug, Default)]
struct Slot {
    pending: Mutex<Pending>,
    notify: Notify,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // A panic while holding this lock cannot leave `Pending` inconsistent: keep going.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Debug, Default)]
struct Slots(Mutex<Vec<Weak<Slot>>>);

impl Slots {
    fn each(&self, mut f: impl FnMut(&mut Pending)) {
        let mut slots = self.0.lock().unwrap_or_else(|e| e.into_inner());
        slots.retain(|weak| {
            let Some(slot) = weak.upgrade() else {
                return false;
            };
            f(&mut slot.lock());
            slot.notify.notify_one();
            true
        });
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        self.each(|pending| pending.closed = true);
    }
}

/// The sending side, held by a unit manager; clones share receivers. When the last clone is
/// dropped, receivers drain what is pending and then end.
#[derive(Debug, Clone, Default)]
pub struct ChangeSender {
    slots: Arc<Slots>,
}

impl ChangeSender {
    pub fn new() -> ChangeSender {
        ChangeSender::default()
    }

    /// A new receiver; its first hint is [`Change::Resync`], so whoever subscribes re-reads
    /// everything once and cannot miss a change that happened before it subscribed.
    pub fn subscribe(&self) -> ChangeReceiver {
        let slot = Arc::new(Slot::default());
        slot.lock().resync = true;
        let mut slots = self.slots.0.lock().unwrap_or_else(|e| e.into_inner());
        slots.push(Arc::downgrade(&slot));
        ChangeReceiver { slot }
    }

    /// `name` changed.
    pub fn unit(&self, name: &UnitName) {
        self.slots.each(|pending| {
            if pending.resync {
                return;
            }
            pending.units.insert(name.clone());
            if pending.units.len() > MAX_PENDING_UNITS {
                pending.resync = true;
                pending.units.clear();
            }
        });
    }

    /// Anything may have changed.
    pub fn resync(&self) {
        self.slots.each(|pending| {
            pending.resync = true;
            pending.units.clear();
        });
    }

    /// Ends every receiver after it drained its pending hints, e.g. when the source of the
    /// hints is gone for good.
    pub fn close(&self) {
        self.slots.each(|pending| pending.closed = true);
    }
}

/// The receiving side, held by the agent's loop.
#[derive(Debug)]
pub struct ChangeReceiver {
    slot: Arc<Slot>,
}

impl ChangeReceiver {
    /// The next coalesced hint; `None` once the sender closed or is gone and nothing is
    /// pending. Cancel-safe.
    pub async fn recv(&mut self) -> Option<Change> {
        loop {
            {
                let mut pending = self.slot.lock();
                if let Some(change) = pending.take() {
                    return Some(change);
                }
                if pending.closed {
                    return None;
                }
            }
            self.slot.notify.notified().await;
        }
    }

    /// The pending hint, without waiting.
    pub fn try_recv(&mut self) -> Option<Change> {
        self.slot.lock().take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> UnitName {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn first_hint_is_a_resync() {
        let sender = ChangeSender::new();
        let mut rx = sender.subscribe();
        sender.unit(&name("a.service"));
        assert_eq!(rx.recv().await, Some(Change::Resync));
        assert_eq!(rx.try_recv(), None);
    }

    #[tokio::test]
    async fn coalesces_unit_hints_into_one_set() {
        let sender = ChangeSender::new();
        let mut rx = sender.subscribe();
        rx.try_recv();
        sender.unit(&name("b.service"));
        sender.unit(&name("a.service"));
        sender.unit(&name("b.service"));
        let expected = [name("a.service"), name("b.service")].into();
        assert_eq!(rx.recv().await, Some(Change::Units(expected)));
        assert_eq!(rx.try_recv(), None);
    }

    #[tokio::test]
    async fn collapses_too_many_names_into_a_resync() {
        let sender = ChangeSender::new();
        let mut rx = sender.subscribe();
        rx.try_recv();
        for i in 0..=MAX_PENDING_UNITS {
            sender.unit(&name(&format!("u{i}.service")));
        }
        assert_eq!(rx.try_recv(), Some(Change::Resync));
        assert_eq!(rx.try_recv(), None);
    }

    #[tokio::test]
    async fn ends_after_draining_when_the_last_sender_is_dropped() {
        let sender = ChangeSender::new();
        let mut rx = sender.subscribe();
        let clone = sender.clone();
        drop(sender);
        clone.unit(&name("a.service"));
        drop(clone);
        assert_eq!(rx.recv().await, Some(Change::Resync));
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test]
    async fn wakes_a_waiting_receiver() {
        let sender = ChangeSender::new();
        let mut rx = sender.subscribe();
        rx.try_recv();
        let waiter = tokio::spawn(async move { rx.recv().await });
        tokio::task::yield_now().await;
        sender.unit(&name("a.service"));
        let got = waiter.await.unwrap();
        assert_eq!(got, Some(Change::Units([name("a.service")].into())));
    }

    #[test]
    fn forgets_dropped_receivers() {
        let sender = ChangeSender::new();
        let rx = sender.subscribe();
        drop(rx);
        sender.resync();
        assert!(sender.slots.0.lock().unwrap().is_empty());
    }
}
