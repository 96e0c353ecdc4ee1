//! One [`Mirror`] of the registry per process, shared by whoever plans or serves from
//! memory (the engine leader and the API's listings), on the model of kube-runtime's
//! reflector: one task applies the watch's batches to one snapshot, publishes the revision it
//! has reached, and gives each [`Subscription`] its own account of what changed.
//!
//! Why one and not one per user: a leader with the API on kept two whole copies of the
//! registry, each with its own prefix watch. Why a task of its own: each user applied the
//! watch to its own view when it asked, so a shared view would have given the wake-up of a
//! change to whichever user happened to apply it, and made one wait on the other's lock.
//! Here the applying task takes the write lock only for a batch; readers ([`Store::read`])
//! read together, and each subscriber is woken for every batch that touched something.
//!
//! - **No recorded writes.** A writer that must see its own writes before it reads again (the
//!   engine: a unit placed by the last pass must not look unplaced) waits for the revision its
//!   write landed at ([`Store::reached`]); nothing but the watch changes the snapshot.
//! - **Lives while held.** Every handle ([`Store`], [`Subscription`]) holds it; the last one
//!   dropped stops its task and cancels its watch. [`SharedStore`] keeps only a weak handle,
//!   so a process that holds none holds no copy of the registry.
//! - **Lost, not repaired.** A watch that breaks or falls behind a compaction ends the store:
//!   every waiter and subscriber hears it ([`RegistryError::ViewLost`]), and the next
//!   [`SharedStore::get`] reads a new one.

use fleet_core::{UnitFile, UnitHash, UnitName};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{Notify, RwLock, RwLockReadGuard, mpsc, oneshot, watch};
use tracing::{Instrument, debug};

use crate::error::{RegistryError, Result};
use crate::kv::{Kv, Revision, WatchMessage};
use crate::mirror::{Changed, Mirror, Touched};
use crate::read::Skipped;
use crate::registry::Registry;
use crate::snapshot::Snapshot;

/// A handle on a process's mirror of the registry (see the module's text).
#[derive(Debug, Clone)]
pub struct Store {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    mirror: RwLock<Mirror>,
    /// The revision applied, and why the store stopped following once it has.
    progress: watch::Sender<Progress>,
    /// Each subscriber's account, dropped with its subscription.
    subscribers: Mutex<Vec<Weak<Inbox>>>,
    /// Dropped with the last handle: the applying task then ends.
    _stop: oneshot::Sender<()>,
}

#[derive(Debug, Clone)]
struct Progress {
    revision: Revision,
    lost: Option<String>,
}

/// What changed for one subscriber since it last took it.
#[derive(Debug, Default)]
struct Inbox {
    pending: Mutex<Pending>,
    woken: Notify,
}

#[derive(Debug, Default)]
struct Pending {
    touched: Touched,
    changed: Changed,
    lost: Option<String>,
}

/// The store as one reader sees it: the applying task waits while this is held, so hold it
/// only to read (never across a write or a wait).
#[derive(Debug)]
pub struct StoreRead<'a> {
    mirror: RwLockReadGuard<'a, Mirror>,
}

/// One subscriber's share of a [`Store`]: the store, and what changed since it last asked.
#[derive(Debug)]
pub struct Subscription {
    store: Store,
    inbox: Arc<Inbox>,
}

/// What changed for a subscriber up to the revision of a [`StoreRead`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changes {
    pub touched: Touched,
    /// The units whose record or file changed; `None` when a change could not be traced to
    /// its units (a key that does not parse).
    pub units: Option<BTreeSet<UnitName>>,
}

impl Store {
    /// Reads everything, unit files included, at one revision, and follows the registry
    /// from the next in a task of its own.
    pub async fn start<K: Kv>(registry: &Registry<K>) -> Result<Store> {
        let (mirror, watch) = Mirror::read(registry, true).await?;
        let (stop, stopped) = oneshot::channel();
        let shared = Arc::new(Shared {
            progress: watch::Sender::new(Progress {
                revision: mirror.revision(),
                lost: None,
            }),
            mirror: RwLock::new(mirror),
            subscribers: Mutex::new(Vec::new()),
            _stop: stop,
        });
        let task = follow(Arc::downgrade(&shared), watch, stopped);
        // Under the span of the user that started it (the engine's names its machine).
        tokio::spawn(task.instrument(tracing::debug_span!("registry_store")));
        Ok(Store { shared })
    }

    /// The store at its present revision, for as long as the returned guard is held.
    pub async fn read(&self) -> StoreRead<'_> {
        StoreRead {
            mirror: self.shared.mirror.read().await,
        }
    }

    /// The revision of the last change applied.
    pub fn revision(&self) -> Revision {
        self.shared.progress.borrow().revision
    }

    /// Whether the store stopped following the registry.
    pub fn is_lost(&self) -> bool {
        self.shared.progress.borrow().lost.is_some()
    }

    /// Waits until every change up to `revision` is applied; `ViewLost` if the store stops
    /// following first.
    pub async fn reached(&self, revision: Revision) -> Result<()> {
        let mut progress = self.shared.progress.subscribe();
        let reached = progress
            .wait_for(|p| p.lost.is_some() || p.revision >= revision)
            .await
            .map_err(|_| RegistryError::ViewLost("the store was dropped".to_owned()))?;
        match &reached.lost {
            Some(why) => Err(RegistryError::ViewLost(why.clone())),
            None => Ok(()),
        }
    }

    /// Stops following the registry for `why`: a user that can no longer trust it (its
    /// own writes did not arrive) makes every user read a new one.
    pub fn give_up(&self, why: &str) {
        self.shared.lose(why.to_owned());
    }

    /// A new subscriber, to whom the changes applied from now on are told.
    pub fn subscribe(&self) -> Subscription {
        let inbox = Arc::new(Inbox::default());
        {
            let mut subscribers = lock(&self.shared.subscribers);
            subscribers.retain(|s| s.strong_count() > 0);
            subscribers.push(Arc::downgrade(&inbox));
        }
        // After joining: a store lost since is told to us by `lose` (which publishes the
        // loss before telling the subscribers), one lost before is seen here.
        if let Some(why) = &self.shared.progress.borrow().lost {
            lock(&inbox.pending).lost = Some(why.clone());
        }
        Subscription {
            store: self.clone(),
            inbox,
        }
    }
}

impl StoreRead<'_> {
    /// The registry as of [`revision`](Self::revision).
    pub fn snapshot(&self) -> &Snapshot {
        &self.mirror.snapshot
    }

    /// Every readable unit file in the registry, by hash.
    pub fn files(&self) -> &BTreeMap<UnitHash, UnitFile> {
        &self.mirror.files
    }

    /// The unit files kept that do not read, by key (their units have no file).
    pub fn unreadable_files(&self) -> impl Iterator<Item = &Skipped> {
        self.mirror.unreadable_files.values()
    }

    /// The revision of the last change applied.
    pub fn revision(&self) -> Revision {
        self.mirror.revision()
    }
}

impl Subscription {
    /// The store subscribed to.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Waits until a change touched something since the last call (at once if one did),
    /// and takes what it touched. `ViewLost` once the store stopped following.
    pub async fn changed(&self) -> Result<Touched> {
        loop {
            let woken = self.inbox.woken.notified();
            {
                let mut pending = lock(&self.inbox.pending);
                if let Some(why) = &pending.lost {
                    return Err(RegistryError::ViewLost(why.clone()));
                }
                if pending.touched.any() {
                    return Ok(std::mem::take(&mut pending.touched));
                }
            }
            woken.await;
        }
    }

    /// Takes everything that changed up to the revision `read` shows (the applying task
    /// waits while it is held, so nothing else can have been told): what was touched, and
    /// the units whose record or file changed.
    pub fn take(&self, read: &StoreRead<'_>) -> Changes {
        let mut pending = lock(&self.inbox.pending);
        let touched = std::mem::take(&mut pending.touched);
        let changed = std::mem::take(&mut pending.changed);
        Changes {
            touched,
            units: changed.units(read.snapshot()),
        }
    }
}

impl Shared {
    /// Applies a batch of messages under the write lock, tells every subscriber what it
    /// touched, and publishes the revision reached.
    async fn apply(&self, batch: Vec<Option<WatchMessage>>) -> Result<()> {
        let mut mirror = self.mirror.write().await;
        let mut touched = Touched::default();
        let mut changed = Changed::default();
        let mut applied = Ok(());
        for message in batch {
            match mirror.apply_message(message, &mut changed) {
                Ok(t) => touched.merge(t),
                Err(err) => {
                    applied = Err(err);
                    break;
                }
            }
        }
        if touched.any() {
            self.tell(|pending| {
                pending.touched.merge(touched);
                pending.changed.merge(&changed);
            });
        }
        let revision = mirror.revision();
        self.progress.send_if_modified(|p| {
            let moved = p.revision != revision;
            p.revision = revision;
            moved
        });
        applied
    }

    /// Marks the store lost, and tells every waiter and subscriber.
    fn lose(&self, why: String) {
        debug!(reason = %why, "the registry's store stopped following");
        self.progress.send_modify(|p| {
            p.lost.get_or_insert_with(|| why.clone());
        });
        self.tell(|pending| {
            pending.lost.get_or_insert_with(|| why.clone());
        });
    }

    /// Changes each live subscriber's account with `f`, and wakes it.
    fn tell(&self, f: impl Fn(&mut Pending)) {
        let subscribers = lock(&self.subscribers);
        for inbox in subscribers.iter().filter_map(Weak::upgrade) {
            f(&mut lock(&inbox.pending));
            inbox.woken.notify_one();
        }
    }
}

/// Applies the watch's messages as they come, every message already arrived with the first
/// (a burst becomes one batch), until the store is lost or its last handle dropped.
async fn follow(
    shared: Weak<Shared>,
    mut watch: mpsc::UnboundedReceiver<WatchMessage>,
    mut stopped: oneshot::Receiver<()>,
) {
    loop {
        let first = tokio::select! {
            message = watch.recv() => message,
            _ = &mut stopped => return,
        };
        let mut batch = vec![first];
        while let Some(Some(_)) = batch.last() {
            match watch.try_recv() {
                Ok(message) => batch.push(Some(message)),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => batch.push(None),
            }
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if let Err(err) = shared.apply(batch).await {
            shared.lose(lost_reason(err));
            return;
        }
    }
}

fn lost_reason(err: RegistryError) -> String {
    match err {
        RegistryError::ViewLost(why) => why,
        other => other.to_string(),
    }
}

/// Locks `m`; a panic elsewhere while it was held leaves its data usable here.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A process's one [`Store`]: started by the first user that asks, shared by every user
/// while any holds it, started again once it was lost or dropped (see the module's text).
#[derive(Debug, Clone)]
pub struct SharedStore<K> {
    registry: Registry<K>,
    current: Arc<tokio::sync::Mutex<Weak<Shared>>>,
}

impl<K: Kv> SharedStore<K> {
    /// No store yet: the first [`get`](Self::get) reads one.
    pub fn new(registry: Registry<K>) -> SharedStore<K> {
        SharedStore {
            registry,
            current: Arc::new(tokio::sync::Mutex::new(Weak::new())),
        }
    }

    /// The registry the stores follow.
    pub fn registry(&self) -> &Registry<K> {
        &self.registry
    }

    /// The store another user holds, or a new one (read now; a user asking meanwhile waits
    /// for the same read).
    pub async fn get(&self) -> Result<Store> {
        let mut current = self.current.lock().await;
        if let Some(shared) = current.upgrade() {
            let store = Store { shared };
            if !store.is_lost() {
                return Ok(store);
            }
        }
        let store = Store::start(&self.registry).await?;
        *current = Arc::downgrade(&store.shared);
        Ok(store)
    }

    /// A store that has applied every change up to the present (one linearizable read
    /// says which): the one another user holds if it gets there `within`, else a new one
    /// (and the one held is given up, so that every user moves to the new one). What a user
    /// that must see every write finished before it asks (a new leader) takes.
    pub async fn current(&self, within: Duration) -> Result<Store> {
        let mut current = self.current.lock().await;
        if let Some(shared) = current.upgrade() {
            let store = Store { shared };
            let present = self
                .registry
                .present_revision("reading the present revision for the registry's store")
                .await?;
            match tokio::time::timeout(within, store.reached(present)).await {
                Ok(Ok(())) => return Ok(store),
                Ok(Err(_)) => {}
                Err(_) => {
                    debug!(
                        store = store.revision(),
                        present, "the registry's store is behind the present; reading a new one"
                    );
                    store.give_up("behind the present revision");
                }
            }
        }
        let store = Store::start(&self.registry).await?;
        *current = Arc::downgrade(&store.shared);
        Ok(store)
    }

    /// Whether a store is held by some user now.
    pub async fn is_held(&self) -> bool {
        self.current.lock().await.strong_count() > 0
    }
}

#[cfg(test)]
mod tests;
